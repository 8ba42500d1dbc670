"""RL checkpoints: everything a killed run needs to resume with no task lost and none trained twice.

A checkpoint is a directory `<run>/checkpoints/step_<N>` holding

    model/          the policy as an HF checkpoint with its tokenizer, chat template and generation
                    config (opencomposer.model.save_pretrained: servable as is)
    trainer.pt      optimizer state, policy version, step count (Trainer.state_dict)
    rng.pt          python `random`, numpy's global and torch's CPU (and CUDA) generator states
    buffer.pt       finished groups not yet trained (buffer.GroupBuffer.state_dict: tensors only)
    state.json      step, policy version, data cursor (buffer.DataCursor.state_dict), extras
    config.yaml     the resolved run config

Writes are atomic: everything goes into `step_<N>.tmp`, which is renamed to `step_<N>` once
complete (rename is atomic on POSIX), so a run killed while saving leaves the previous
checkpoint intact and a `.tmp` directory that the next save or load ignores and removes.
After a successful save only the newest `keep_last` checkpoints are kept.

Why this is enough for exactly-once training: the cursor, the buffer and the weights in one
checkpoint describe the same instant (taken between trainer steps). Tasks trained after it are
not in its `trained` list and their effect is not in its weights, so a resumed run redoes them
once; tasks whose rollouts were in flight are re-issued (DataCursor.load_state_dict).

Left out: sharded (FSDP) optimizer state, and asynchronous saving in a background thread.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from opencomposer.errors import CheckpointError
from opencomposer.model import Transformer, load_pretrained, save_pretrained
from opencomposer.model.tokenizer import Tokenizer

_STEP_DIR = re.compile(r"step_(\d+)")


def rng_state() -> dict[str, Any]:
    """The global RNG states as tensors and plain values (torch.load(weights_only=True) reads them)."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": [version, list(internal), gauss], "torch": torch.get_rng_state(),
             "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached": float(cached)}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class CheckpointState:
    """What `load` returns; the model is loaded separately (`load_model`) in the dtype you need."""

    path: Path
    step: int
    version: int
    trainer: dict[str, Any]
    rng: dict[str, Any]
    buffer: list[dict[str, Any]]
    cursor: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)


class Checkpointer:
    """Save, list, load and prune the checkpoints under `root` (module docstring)."""

    def __init__(self, root: str | Path, keep_last: int = 3):
        self.root = Path(root)
        self.keep_last = keep_last

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        done = [p for p in self.root.iterdir() if p.is_dir() and _STEP_DIR.fullmatch(p.name)]
        return sorted(done, key=lambda p: int(p.name[5:]))

    def latest(self) -> Path | None:
        found = self.checkpoints()
        return found[-1] if found else None

    def save(self, step: int, *, model: Transformer, trainer_state: dict[str, Any], version: int,
             cursor: dict[str, Any], buffer: list[dict[str, Any]] = (), config: dict[str, Any] | None = None,
             extra: dict[str, Any] | None = None, tokenizer: Tokenizer | None = None) -> Path:
        """Write step_<step> atomically and prune old ones; returns its path. With `tokenizer`, the
        model directory carries it, its chat template and generation config (model/export.py)."""
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob("*.tmp"):  # left by a run killed mid-save
            shutil.rmtree(stale, ignore_errors=True)
        final = self.root / f"step_{step:08d}"
        tmp = self.root / f"step_{step:08d}.tmp"
        tmp.mkdir()
        save_pretrained(model, tmp / "model", tokenizer=tokenizer)
        torch.save(trainer_state, tmp / "trainer.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        torch.save(list(buffer), tmp / "buffer.pt")
        state = {"step": step, "version": version, "cursor": cursor, "extra": extra or {}}
        (tmp / "state.json").write_text(json.dumps(state))
        (tmp / "config.yaml").write_text(yaml.safe_dump(config or {}, sort_keys=False))
        if final.exists():  # a previous run reached this step and was killed before pruning
            shutil.rmtree(final)
        tmp.rename(final)
        for old in self.checkpoints()[:-self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def load(self, path: str | Path | None = None) -> CheckpointState:
        """Load a checkpoint (default: the latest). Raises CheckpointError if there is none or it is broken."""
        path = Path(path) if path is not None else self.latest()
        if path is None:
            raise CheckpointError(f"no checkpoint under {self.root}: nothing to resume (run without --resume)")
        try:
            state = json.loads((path / "state.json").read_text())
            return CheckpointState(
                path=path, step=int(state["step"]), version=int(state["version"]),
                trainer=torch.load(path / "trainer.pt", weights_only=True),
                rng=torch.load(path / "rng.pt", weights_only=True),
                buffer=torch.load(path / "buffer.pt", weights_only=True),
                cursor=state["cursor"], extra=state.get("extra", {}),
                config=yaml.safe_load((path / "config.yaml").read_text()) or {})
        except (OSError, KeyError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{path} is not a complete RL checkpoint: {e}") from e

    @staticmethod
    def load_model(state: CheckpointState, dtype: torch.dtype | None = None) -> Transformer:
        return load_pretrained(state.path / "model", dtype=dtype)


def open_run(cfg, run_dir: Path, resume: bool, resumable: tuple[str, ...]) -> tuple[Checkpointer, CheckpointState | None]:
    """Prepare `run_dir` for an RL run: its Checkpointer and, with `resume`, the latest state.

    A directory that already holds checkpoints is refused without `resume` (a finished run is
    never overwritten); resuming with a config that differs from the checkpoint's, outside the
    `resumable` key prefixes, is refused too. The resolved config is saved as config.yaml.
    """
    from opencomposer.config import config_diff, save_config
    from opencomposer.rl.config import RLConfig
    from opencomposer.errors import ConfigError

    ckpt = Checkpointer(run_dir / "checkpoints", cfg.checkpoint.keep_last)
    state = None
    if resume and ckpt.latest() is not None:
        state = ckpt.load()
        changed = {k: v for k, v in config_diff(RLConfig.model_validate(state.config), cfg).items()
                   if not k.startswith(resumable)}
        if changed:
            raise ConfigError(f"--resume with a different config than the checkpoint's ({state.path}); "
                              f"differences (checkpoint, now): {changed}")
    elif not resume and ckpt.latest() is not None:
        raise ConfigError(f"{run_dir} already holds checkpoints: pass --resume to continue, or set run.out_dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    return ckpt, state
