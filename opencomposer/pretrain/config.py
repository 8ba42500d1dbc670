"""The pretraining config: one YAML file describes a whole run (data, model, phases, MTP, optimiser).

`load_config(path, overrides)` reads it with the one loader (opencomposer/config.py: `--set
key.sub=value`, unknown keys and bad values stop the run before any work with a message that
names the field, `phases.1.seq_len: ...`, and a key of an older config names its new one).
The sections every command has are the shared ones: `run` (out_dir, seed, num_threads,
device), `optim`, `checkpoint`, `log`. As in the RL config, the files a config reads (`model`,
`init_from`, `data.tokenizer`, directories in `data.sources`) are relative to the YAML file's
directory, and what a run writes (`run.out_dir`, `data.cache_dir`) is relative to the working
directory. The resolved config, with those paths made absolute, is written to
`<run.out_dir>/config.yaml` and into every checkpoint.

A run is a list of phases trained one after the other with one optimiser (Composer 2 §3:
most compute at one sequence length, then a shorter context-extension phase at a longer
one); each phase has its own length, batch, learning-rate schedule and, for extension, a
YaRN factor. Left out: data mixtures with weights (one corpus per run), and schedules other
than linear warmup + cosine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from opencomposer.config import (REQUIRED, CheckpointConfig, LogConfig, OptimConfig, RunConfig, Section,
                                 check_renamed, format_errors, require_tensorboard, resolve_relative, variant)
from opencomposer.config import load_config as _load
from opencomposer.device import ComputeDtype
from opencomposer.errors import ConfigError


class DataConfig(Section):
    """Where the training text comes from and how documents are filtered."""

    sources: list[str] = ["stdlib"]
    """Source roots: "stdlib" (this Python's standard library and its tests), "site-packages" (the venv's), or directories (relative to the config file)."""
    max_file_bytes: int = Field(256_000, gt=0)
    """Skip files larger than this (mostly generated tables)."""
    max_total_bytes: int = Field(64_000_000, gt=0)
    """Stop collecting once the corpus would pass this many bytes of source."""
    max_line_chars: int = Field(1000, gt=0)
    """Skip files with a longer line: minified code, embedded data blobs."""
    near_dedup: bool = True
    """Also drop files equal to an earlier one after removing comments, blank lines and indentation."""
    val_fraction: float = Field(0.02, gt=0, lt=1)
    """Fraction of documents (chosen by content hash, so stable across runs) held out for eval."""
    tokenizer: str | None = None
    """A tokenizer.json (or a directory holding one); null: the bundled 4k code tokenizer."""
    cache_dir: str = "~/.cache/opencomposer/pretrain"
    """Where tokenized corpora are kept as .npy files, keyed by content, tokenizer and filters."""


class PhaseConfig(Section):
    """One stage of training: a sequence length, a batch and a learning-rate schedule."""

    name: str
    """Shown in logs and metrics ("main", "extend", ...)."""
    steps: int = Field(gt=0)
    """Optimizer steps in this phase."""
    seq_len: int = Field(gt=1)
    """Tokens per training sequence (packed, no padding)."""
    batch_size: int = Field(gt=0)
    """Sequences per optimizer step, over all ranks and micro-batches."""
    micro_batch_size: int | None = Field(None, gt=0)
    """Sequences per forward on one rank; null: batch_size / world size (no accumulation)."""
    lr: float = Field(gt=0)
    """Peak learning rate."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warmup from 0 to lr over this many steps of the phase."""
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    """Cosine decay ends at lr * min_lr_ratio on the phase's last step."""
    yarn_factor: float | None = Field(None, ge=1)
    """Context extension: RoPE YaRN factor s; the model's max_position_embeddings L0 becomes s * L0."""

    def accumulation(self, world_size: int) -> tuple[int, int]:
        """(micro-batch size, micro-batches per rank per step); a ConfigError if they do not divide."""
        if self.batch_size % world_size:
            raise ConfigError(f"phase {self.name!r}: batch_size {self.batch_size} is not divisible by "
                              f"the world size {world_size}")
        per_rank = self.batch_size // world_size
        micro = self.micro_batch_size or per_rank
        if per_rank % micro:
            raise ConfigError(f"phase {self.name!r}: batch_size / world size = {per_rank} is not a multiple of "
                              f"micro_batch_size {micro}")
        return micro, per_rank // micro


class MTPConfig(Section):
    """How the multi-token-prediction modules are trained (they exist iff the model has num_mtp_modules > 0)."""

    mode: Literal["ce", "distill"] = "distill"
    """"ce": cross-entropy on future tokens (DeepSeek-V3); "distill": KL to the main head's detached logits (Composer 2)."""
    weight: float = Field(0.3, ge=0)
    """lambda in L = L_main + (lambda / D) * sum_k L_k (DeepSeek-V3 used 0.3, then 0.1)."""
    start_step: int = Field(0, ge=0)
    """Global step from which MTP is trained (Composer 2: from a mid-pretraining checkpoint on)."""
    detach_trunk: bool | None = None
    """Keep MTP gradients out of the main model; null: true for "distill", false for "ce"."""

    @property
    def detach(self) -> bool:
        return self.mode == "distill" if self.detach_trunk is None else self.detach_trunk


PretrainRunConfig = variant(RunConfig, "PretrainRunConfig", out_dir=REQUIRED,
                            doc="Where the run writes (checkpoints, metrics.jsonl, tb/, model/) and how it is seeded.")
PretrainOptimConfig = variant(OptimConfig, "PretrainOptimConfig", drop=("lr", "warmup_steps", "min_lr_ratio"),
                              betas=(0.9, 0.95), weight_decay=0.1,
                              doc="AdamW; decoupled weight decay on matrices only (the schedule is each phase's).")
PretrainCheckpointConfig = variant(CheckpointConfig, "PretrainCheckpointConfig", every_steps=100, keep_last=2)
PretrainLogConfig = variant(LogConfig, "PretrainLogConfig", drop=("progress",),
                            doc="Metrics outputs: TensorBoard and a printed line every log.every_steps steps.")

RENAMED = {"run_dir": "run.out_dir", "seed": "run.seed", "threads": "run.num_threads", "device": "run.device",
           "checkpoint_every": "checkpoint.every_steps", "keep_checkpoints": "checkpoint.keep_last",
           "log_every": "log.every_steps", "tensorboard": "log.tensorboard"}
"""Keys of older pretraining configs and their replacements (a config holding one stops, naming it)."""


class PretrainConfig(Section):
    """A pretraining run."""

    run: PretrainRunConfig
    """Run directory (required), seed (initial weights, order of training sequences), threads
    (null: torch's default divided by the local world size), device (under torchrun, rank r takes
    cuda:LOCAL_RANK)."""
    model: str | dict[str, Any] | None = None
    """A ModelConfig YAML file (relative to this config file) or its keys inline: a model trained from scratch."""
    init_from: str | None = None
    """An HF checkpoint directory to continue pretraining from (its config.json is the model); give it or `model`."""
    data: DataConfig = DataConfig()
    """The corpus."""
    phases: list[PhaseConfig] = Field(min_length=1)
    """Trained in order; a later phase with yarn_factor extends the context."""
    mtp: MTPConfig = MTPConfig()
    """Multi-token-prediction training."""
    optim: PretrainOptimConfig = PretrainOptimConfig()
    """The optimiser (the learning-rate schedule is each phase's)."""
    checkpoint: PretrainCheckpointConfig = PretrainCheckpointConfig()
    """A resumable checkpoint every checkpoint.every_steps steps (and always at the end); keep_last kept."""
    log: PretrainLogConfig = PretrainLogConfig()
    """TensorBoard events under <out_dir>/tb, a printed line every log.every_steps steps."""
    eval_every: int = Field(100, gt=0)
    """Evaluate on the held-out split every N steps (and at the end of every phase)."""
    eval_sequences: int = Field(16, gt=0)
    """Held-out sequences per evaluation (at the current phase's seq_len)."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """Under torchrun (WORLD_SIZE > 1): DistributedDataParallel, or FSDP2 fully_shard per block."""
    dtype: ComputeDtype = "float32"
    """Compute dtype: bfloat16 autocasts matmuls (weights and optimizer stay float32)."""
    deterministic: bool = True
    """torch.use_deterministic_algorithms: a resumed run repeats the uninterrupted one exactly."""

    @model_validator(mode="after")
    def _check(self) -> "PretrainConfig":
        names = [p.name for p in self.phases]
        if len(set(names)) != len(names):
            raise ValueError(f"phase names must be unique, got {names}")
        if (self.model is None) == (self.init_from is None):
            raise ValueError("give exactly one of model (a ModelConfig, trained from scratch) or init_from "
                             "(a checkpoint to continue from, whose config.json is the model)")
        require_tensorboard(self.log.tensorboard)
        return self

    @property
    def total_steps(self) -> int:
        return sum(p.steps for p in self.phases)

    def locate(self, step: int) -> tuple[int, int]:
        """(phase index, step within that phase) of global step `step` (0-based)."""
        for i, p in enumerate(self.phases):
            if step < p.steps:
                return i, step
            step -= p.steps
        raise ValueError(f"step is past the last phase ({self.total_steps} steps)")

    def model_dict(self) -> dict[str, Any]:
        """The ModelConfig keys, read from the YAML file `model` names when it is a path."""
        if self.model is None:
            raise ConfigError("model: not set; with init_from the checkpoint's config.json is the model")
        if isinstance(self.model, dict):
            return self.model
        path = Path(self.model)
        if not path.is_file():
            raise ConfigError(f"model: {path} does not exist; give a ModelConfig YAML file "
                              f"(e.g. configs/model/tiny.yaml) or the keys inline")
        d = yaml.safe_load(path.read_text())
        if not isinstance(d, dict):
            raise ConfigError(f"model: {path} must hold a mapping of ModelConfig keys")
        return d


def parse_config(d: dict[str, Any], source: str = "config") -> PretrainConfig:
    """Validate a dict (keys of older configs refused by name); a ConfigError listing every bad field."""
    check_renamed(d, RENAMED, source)
    try:
        return PretrainConfig.model_validate(d)
    except ValidationError as e:
        raise ConfigError(format_errors(f"{source} (pretraining)", e)) from None


def _resolve_paths(raw: dict, base: Path) -> None:
    """The files a run reads, relative to the config file's directory (module docstring)."""
    if isinstance(raw.get("model"), str):
        resolve_relative(raw, base, ("model",))
    resolve_relative(raw, base, ("init_from", "data.tokenizer"))
    resolve_relative(raw, base, ("data.sources",), keep=lambda s: s in ("stdlib", "site-packages"))


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = (),
                data: dict[str, Any] | None = None) -> PretrainConfig:
    """Read a YAML file (or take `data`), apply `--set key.sub=value` overrides, validate."""
    return _load(PretrainConfig, path, overrides, data, renamed=RENAMED, resolve_paths=_resolve_paths)
