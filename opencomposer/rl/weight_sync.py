"""Weight sync: the trainer's new weights reach the inference engine, whole or as a delta.

Two transports behind one Protocol (`WeightSync.sync(model, version) -> SyncStats`):

- `InPlaceSync(engine)`: the embedded engine in the same process. `Engine.update_weights`
  copies the tensors into the engine's own model between two decode steps; requests in flight
  continue under the new weights, with the version recorded per token (PipelineRL-style).
- `DiskSync(server_url)`: a separate inference server (opencomposer serve; SGLang and vLLM
  expose the same route). Each sync writes an HF checkpoint directory `<sync_dir>/v<version>`
  with one safetensors shard per parameter, POSTs `/update_weights_from_disk` {model_path,
  weight_version}, and returns once the server answers with that version.

Delta compression (`delta=True`, the default): a `DeltaTracker` keeps a CPU copy of the
weights as last synced and compares each tensor with it (torch.equal, exact); only tensors that
changed are sent. In place, only those are copied (Engine.update_weights takes a subset). On
disk, only their shards are written; the shards of unchanged tensors are hard links to the
previous sync's files, so the bytes written are the delta's while the directory stays a
complete checkpoint any server can load. SyncStats reports bytes sent against the full size.
With full-parameter RL every tensor changes each step (Adam moves every weight that has ever
had a gradient); the delta pays off when parts are frozen (embeddings, experts, MTP heads),
when a step skips parameters (grad None), or for LoRA-style training.

Left out: NCCL broadcast to GPU inference workers (torch.distributed would replace the
transport, not the tracker), element-level sparse/xor encoding of a changed tensor, and a
server-side delta route (the server still reads the full directory, from the page cache).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import save_file

from opencomposer.errors import InferenceError
from opencomposer.model import Transformer
from opencomposer.model.hf import INDEX, to_hf_tensors


@dataclass
class SyncStats:
    """What one sync moved."""

    version: int
    bytes_sent: int
    bytes_full: int
    tensors_sent: int
    tensors_total: int
    seconds: float

    def as_metrics(self, prefix: str = "sync/") -> dict[str, float]:
        return {prefix + k: float(v) for k, v in asdict(self).items() if k != "version"}


class WeightSync(Protocol):
    """Make the inference side serve `model`'s current weights as policy `version`."""

    def sync(self, model: Transformer, version: int) -> SyncStats: ...


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class DeltaTracker:
    """Which tensors differ from what was last synced (None: nothing synced yet, so all)."""

    def __init__(self) -> None:
        self.last: dict[str, torch.Tensor] | None = None

    def changed(self, state: dict[str, torch.Tensor]) -> list[str]:
        if self.last is None:
            return list(state)
        return [n for n, t in state.items() if not torch.equal(t.detach().cpu(), self.last[n])]

    def commit(self, state: dict[str, torch.Tensor], names: list[str]) -> None:
        """Record `names` as synced (call only after the receiver has them)."""
        if self.last is None:
            self.last = {}
        for n in names:
            self.last[n] = state[n].detach().to("cpu", copy=True)


class InPlaceSync:
    """Copy the trainer's weights into an embedded `Engine` (module docstring)."""

    def __init__(self, engine: Any, delta: bool = True):
        self.engine = engine
        self.tracker = DeltaTracker() if delta else None

    def sync(self, model: Transformer, version: int) -> SyncStats:
        t0 = time.perf_counter()
        state = {n: t.detach() for n, t in model.state_dict().items()}
        names = self.tracker.changed(state) if self.tracker is not None else list(state)
        self.engine.update_weights({n: state[n] for n in names}, version)
        if self.tracker is not None:
            self.tracker.commit(state, names)
        return SyncStats(version, sum(_nbytes(state[n]) for n in names), sum(map(_nbytes, state.values())),
                         len(names), len(state), time.perf_counter() - t0)


_EXPERT = re.compile(r"model\.(layers\.\d+\.mlp\.experts)\.\d+\.(gate_proj|up_proj|down_proj)\.weight")


def _param_of(hf_name: str) -> str:
    """The model.state_dict() name an on-disk HF tensor belongs to (hf.py's naming, inverted)."""
    m = _EXPERT.fullmatch(hf_name)
    if m is not None:
        return f"{m[1]}.{'down_proj' if m[2] == 'down_proj' else 'gate_up_proj'}"
    return hf_name.removeprefix("model.")


def _shard_name(param: str) -> str:
    return f"{param}.safetensors"


class VersionWriter:
    """`<sync_dir>/v<version>` checkpoint directories, delta-written (module docstring): used by
    DiskSync and by rl/vllm_sync.py. `write` makes the directory; `commit` records it as the one
    the server now has (later writes hard-link its unchanged shards) and removes old ones."""

    def __init__(self, sync_dir: str | Path, delta: bool = True, keep: int = 2):
        self.dir = Path(sync_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.tracker = DeltaTracker() if delta else None
        self.keep = keep
        self._prev: Path | None = None

    def write(self, model: Transformer, version: int) -> tuple[Path, list[str], dict[str, torch.Tensor]]:
        """Write the version directory; returns it, the parameters written, and the state."""
        state = {n: t.detach() for n, t in model.state_dict().items()}
        changed = set(self.tracker.changed(state) if self.tracker is not None and self._prev is not None else state)
        hf = to_hf_tensors(model)
        by_param: dict[str, list[str]] = {}  # our parameter -> its on-disk HF tensors
        for name in hf:
            by_param.setdefault(_param_of(name), []).append(name)
        out = self.dir / f"v{version}"
        tmp = self.dir / f".v{version}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        weight_map, total, written = {}, 0, []
        for param, names in by_param.items():
            fname = _shard_name(param)
            weight_map.update(dict.fromkeys(names, fname))
            total += sum(_nbytes(hf[n]) for n in names)
            if param in changed or self._prev is None:
                save_file({n: hf[n].detach().cpu().contiguous().clone() for n in names}, str(tmp / fname),
                          metadata={"format": "pt"})
                written.append(param)
            else:
                os.link(self._prev / fname, tmp / fname)
        (tmp / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        cfg = model.config.to_hf_dict()
        cfg["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        return out, written, state

    def commit(self, path: Path, written: list[str], state: dict[str, torch.Tensor]) -> None:
        if self.tracker is not None:
            self.tracker.commit(state, written)
        self._prev = path
        dirs = sorted((p for p in self.dir.glob("v*") if p.is_dir() and p.name[1:].isdigit()),
                      key=lambda p: int(p.name[1:]))
        for old in dirs[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    @staticmethod
    def sizes(path: Path, written: list[str]) -> tuple[int, int]:
        """(bytes written for this version, bytes of the whole directory's shards)."""
        sent = sum((path / _shard_name(p)).stat().st_size for p in written)
        return sent, sum(f.stat().st_size for f in path.glob("*.safetensors"))


class DiskSync:
    """Write `<sync_dir>/v<version>` and POST /update_weights_from_disk (module docstring).

    client: anything with httpx.Client's `post(url, json=..., timeout=...)` (a starlette
    TestClient in tests); default an httpx.Client. keep: sync directories kept on disk (the
    newest one the server loaded, plus one in case it is still reading).
    """

    def __init__(self, server_url: str, sync_dir: str | Path, delta: bool = True, *, client: Any = None,
                 timeout_s: float = 600.0, keep: int = 2):
        self.url = server_url.rstrip("/")
        self.writer = VersionWriter(sync_dir, delta, keep)
        self.timeout_s = timeout_s
        if client is None:
            import httpx

            client = httpx.Client()
        self.client = client

    @classmethod
    def from_config(cls, cfg, run_dir: str | Path) -> "DiskSync":
        """From the `weight_sync` section: the server at server_url, versions under sync_dir
        (default <run_dir>/weight_sync)."""
        return cls(cfg.server_url, cfg.sync_dir or Path(run_dir) / "weight_sync", delta=cfg.delta)

    def write(self, model: Transformer, version: int) -> tuple[Path, list[str], dict[str, torch.Tensor]]:
        return self.writer.write(model, version)

    def sync(self, model: Transformer, version: int) -> SyncStats:
        t0 = time.perf_counter()
        path, written, state = self.write(model, version)
        try:
            r = self.client.post(f"{self.url}/update_weights_from_disk",
                                 json={"model_path": str(path.resolve()), "weight_version": str(version)},
                                 timeout=self.timeout_s)
        except Exception as e:
            raise InferenceError(f"weight sync to {self.url} failed: {e!r}; is the server running and "
                                 f"can it read {path}?") from e
        body = r.json() if r.content else {}
        if r.status_code != 200 or not body.get("success"):
            raise InferenceError(f"{self.url}/update_weights_from_disk refused {path}: "
                                 f"{body.get('message', r.text)}", status=r.status_code)
        if int(body.get("version", -1)) != version:
            raise InferenceError(f"{self.url} reports policy version {body.get('version')} after loading "
                                 f"{path}, expected {version}")
        self.writer.commit(path, written, state)
        sent, full = self.writer.sizes(path, written)
        return SyncStats(version, sent, full, len(written), len(state), time.perf_counter() - t0)
