"""One RL run's assembly: the pieces every mode and runner sets up the same way, written once.

    Run.open(cfg, resume)     the run directory (a finished run is never overwritten), the
                              checkpoint resumed from, config.yaml, torch's thread count
    build_trainer(cfg, ...)   the policy, its frozen reference (the initial weights, also on
                              resume), the Trainer; on resume the checkpoint's weights,
                              optimizer, version and RNG states
    build_engine(cfg, model)  the embedded engine serving `model` in engine.dtype
    INFERENCE[kind]           inference_kind(cfg) -> where the policy generates and how new weights
                              reach it (the embedded engine, in place; a server, over disk; a
                              vLLM server the run starts, verified by a probe: rl/vllm_sync.py)
    Run.end_step / finish     after each step: the metrics row, the caller's on_step, a
                              checkpoint every checkpoint.every_steps; at the end, the last one

What a mode keeps is its own: its data (prompts and reward functions in single_turn.py; tasks
and the Orchestrator in orchestrator.py), its loop, what its checkpoints hold beside the model
(`Run.snapshot`) and its summary. The Ray runner builds the trainer and the engine inside its
actors (load_models, build_engine) and uses Run for the directory, metrics and checkpoints.
Left out: choosing the runner (rl/cli.py's table), serving a model on opencomposer's own server
(start it yourself: weight_sync.mode "disk").
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from opencomposer.device import resolve_device
from opencomposer.model import Transformer
from opencomposer.model.export import check_tokenizer
from opencomposer.model.tokenizer import Tokenizer, load_tokenizer
from opencomposer.rl import checkpoint
from opencomposer.rl.checkpoint import Checkpointer, CheckpointState, set_rng_state
from opencomposer.rl.config import RLConfig
from opencomposer.rl.trainer import DTYPES, Trainer, load_policy, needs_reference
from opencomposer.rl.weight_sync import DiskSync, InPlaceSync, WeightSync
from opencomposer.training.metrics import MetricsWriter

# Changing these between a checkpoint and its resume does not change what is trained.
RESUMABLE_CHANGES = ("train.max_steps", "log.", "run.num_threads", "run.device", "checkpoint.", "agentic.ray.")

StepHook = Callable[[int, dict[str, float]], None]


@dataclass
class Run:
    """An opened run directory: its checkpoints, the state resumed from, its metrics.

    snapshot(step) -> the keyword arguments of Checkpointer.save beside the step and the config
    (model, trainer_state, version, cursor, buffer, extra): set by the mode once its data side
    exists. on_step(step, metrics): the caller's hook, run after the metrics row is written and
    before that step's checkpoint.
    """

    cfg: RLConfig
    dir: Path
    ckpt: Checkpointer
    state: CheckpointState | None
    saved_step: int  # the newest step with a checkpoint on disk (0: none needed yet)
    on_step: StepHook | None = None
    snapshot: Callable[[int], dict[str, Any]] | None = None
    metrics: MetricsWriter | None = None
    tokenizer: Tokenizer | None = None  # saved into every checkpoint's model directory


    @classmethod
    def open(cls, cfg: RLConfig, resume: bool, on_step: StepHook | None = None) -> "Run":
        """Prepare run.out_dir (rl/checkpoint.py open_run) and set torch's thread count."""
        run_dir = Path(cfg.run.out_dir)
        ckpt, state = checkpoint.open_run(cfg, run_dir, resume, RESUMABLE_CHANGES)
        if cfg.run.num_threads:
            torch.set_num_threads(cfg.run.num_threads)
        return cls(cfg, run_dir, ckpt, state, state.step if state is not None else 0, on_step,
                   tokenizer=run_tokenizer(cfg))

    @property
    def start_step(self) -> int:
        return self.state.step if self.state is not None else 0

    def open_metrics(self) -> MetricsWriter:
        """metrics.jsonl and TensorBoard, truncated to the resumed checkpoint's step."""
        self.metrics = MetricsWriter(self.dir, tensorboard=self.cfg.log.tensorboard,
                                     resume_step=self.state.step if self.state is not None else None)
        return self.metrics

    def save(self, step: int) -> None:
        self.ckpt.save(step, config=self.cfg.model_dump(mode="json"), tokenizer=self.tokenizer, **self.snapshot(step))
        self.saved_step = step

    def end_step(self, step: int, metrics: dict[str, float]) -> None:
        """Write the step's metrics, call on_step, checkpoint every checkpoint.every_steps."""
        self.metrics.write(step, metrics)
        if self.on_step is not None:
            self.on_step(step, metrics)
        if step % self.cfg.checkpoint.every_steps == 0:
            self.save(step)

    def finish(self, step: int) -> None:
        """Checkpoint the last step unless it already is (a run that trained nothing saves nothing)."""
        if step != self.saved_step:
            self.save(step)

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()


def run_tokenizer(cfg: RLConfig) -> Tokenizer:
    """model.tokenizer when set, else the checkpoint's own (model.path), else the bundled one."""
    return load_tokenizer(cfg.model.tokenizer, checkpoint=cfg.model.path)


# ---- the trained side ---------------------------------------------------------------------------

def load_models(cfg: RLConfig, state: CheckpointState | None,
                device: torch.device) -> tuple[Transformer, Transformer | None]:
    """The policy (the checkpoint's weights on resume) and the frozen reference, when KL needs
    one: always the initial weights, rebuilt from the config, also on resume."""
    model = load_policy(cfg.model, cfg.run.seed).to(device)
    ref = load_policy(cfg.model, cfg.run.seed).to(device) if needs_reference(cfg.reward, cfg.loss) else None
    if state is not None:
        model.load_state_dict(Checkpointer.load_model(state, dtype=next(model.parameters()).dtype).state_dict())
    return model, ref


def build_trainer(cfg: RLConfig, state: CheckpointState | None, tokenizer: Tokenizer) -> Trainer:
    """The Trainer of a local run on run.device; on resume with the checkpoint's weights,
    optimizer, version and the global RNG states as they were saved."""
    device = resolve_device(cfg.run.device, "run.device")  # the trainer's, the reference's and the engine's
    model, ref = load_models(cfg, state, device)
    check_tokenizer(tokenizer, model.config, cfg.model.path or cfg.model.config)
    trainer = Trainer.from_config(cfg, model, ref)
    if state is not None:
        trainer.load_state_dict(state.trainer)
        set_rng_state(state.rng)
    return trainer


# ---- the inference side -------------------------------------------------------------------------

def build_engine(cfg: RLConfig, model: Transformer):
    """The embedded engine over `model` (which it then owns: pass a copy of a trained model)."""
    from opencomposer.engine.engine import Engine

    return Engine(model, max_slots=cfg.engine.max_slots, max_len=cfg.engine.max_len,
                  speculative_depth=cfg.engine.speculative_depth, dtype=DTYPES[cfg.engine.dtype])


@dataclass
class Inference:
    """Where the policy generates (a client of token ids) and how the trainer's weights get there."""

    sync: WeightSync
    client: Any                # an engine client (engine/client.py): InProcessClient or SGLangClient
    engine: Any | None = None  # the embedded engine, stopped by the run; None for a server
    server: Any | None = None  # a vLLM server the run started (engine/vllm_server.py), stopped by the run
    routed_experts: bool = True  # the client can return routed experts (router replay is possible)

    def close(self) -> None:
        """Stop what the run started (the embedded engine, a vLLM server's processes)."""
        if self.engine is not None:
            self.engine.stop()
        if self.server is not None:
            self.server.stop()


def embedded_inference(cfg: RLConfig, trainer: Trainer, tokenizer: Tokenizer, run_dir: Path) -> Inference:
    """weight_sync.mode "in_place": the embedded engine over a copy of the policy, synced in place."""
    from opencomposer.engine.client import InProcessClient

    engine = build_engine(cfg, copy.deepcopy(trainer.model).requires_grad_(False))
    inference = Inference(InPlaceSync(engine, delta=cfg.weight_sync.delta), InProcessClient(engine, tokenizer), engine)
    inference.sync.sync(trainer.model, trainer.version)  # the engine serves exactly the trainer's weights and version
    return inference


def server_inference(cfg: RLConfig, trainer: Trainer, tokenizer: Tokenizer, run_dir: Path) -> Inference:
    """weight_sync.mode "disk": a running server at weight_sync.server_url, synced through checkpoints."""
    from opencomposer.engine.client import SGLangClient

    w = cfg.weight_sync
    inference = Inference(DiskSync.from_config(w, run_dir), SGLangClient(w.server_url, tokenizer=tokenizer))
    inference.sync.sync(trainer.model, trainer.version)
    return inference


def vllm_inference(cfg: RLConfig, trainer: Trainer, tokenizer: Tokenizer, run_dir: Path) -> Inference:
    """engine.backend "vllm": a vLLM server the run starts on the trainer's weights, updated and
    verified after each step (rl/vllm_sync.py). Routed experts come back only from vLLM's GPU
    runner: elsewhere the run says so and the trainer routes itself."""
    import logging

    from opencomposer.rl.vllm_sync import build_vllm

    model = trainer.model
    moe = bool(model.config.moe_layers)
    routed = cfg.train.router_replay and moe and torch.cuda.is_available()
    if cfg.train.router_replay and moe and not routed:
        logging.getLogger("opencomposer.rl").warning(
            "router replay: vLLM returns routed experts only on GPUs (Model Runner V2 needs Triton); on this "
            "machine the trainer routes itself (train.router_replay has no rollout experts to replay)")
    if routed:
        cfg = cfg.model_copy(deep=True)
        cfg.engine.vllm.extra_args = [*cfg.engine.vllm.extra_args, "--enable-return-routed-experts"]
    server, sync = build_vllm(cfg, model, tokenizer, run_dir)
    client = server.resilient_client(tokenizer)
    sync.client = client
    inference = Inference(sync, client, server=server, routed_experts=routed)
    try:
        sync.start(model, trainer.version)  # the server serves exactly the trainer's weights and version
    except BaseException:
        server.stop()
        raise
    return inference


INFERENCE: dict[str, Callable[[RLConfig, Trainer, Tokenizer, Path], Inference]] = {
    "in_place": embedded_inference,
    "disk": server_inference,
    "vllm": vllm_inference,
}


def inference_kind(cfg: RLConfig) -> str:
    """The INFERENCE entry of a run: "vllm" for engine.backend vllm, else weight_sync.mode."""
    return "vllm" if cfg.engine.backend == "vllm" else cfg.weight_sync.mode
