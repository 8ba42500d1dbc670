"""The pretraining config: one YAML file describes a whole run (data, model, phases, MTP, optimiser).

`load_config(path)` reads it; unknown keys and bad values stop the run before any work with a
message that names the field (`phases.1.seq_len: ...`). As in opencomposer/config.py (the RL
config), the files a config reads (`model`, `init_from`, `data.tokenizer`, directories in
`data.sources`) are relative to the YAML file's directory, and what a run writes (`run_dir`,
`data.cache_dir`) is relative to the working directory. The resolved config, with those paths
made absolute, is written to `<run_dir>/config.yaml` and into every checkpoint.

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
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from opencomposer.device import DeviceName
from opencomposer.errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class DataConfig(_Strict):
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


class PhaseConfig(_Strict):
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


class MTPConfig(_Strict):
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


class OptimConfig(_Strict):
    """AdamW; decoupled weight decay on matrices only (not norms or biases)."""

    betas: tuple[float, float] = (0.9, 0.95)
    """Adam's beta1, beta2."""
    eps: float = Field(1e-8, gt=0)
    """Adam's epsilon."""
    weight_decay: float = Field(0.1, ge=0)
    """Decoupled weight decay on parameters with 2 or more dimensions."""
    grad_clip: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm to this; null: no clipping."""


class PretrainConfig(_Strict):
    """A pretraining run."""

    run_dir: str
    """Checkpoints, metrics.jsonl, TensorBoard events and the final model go here."""
    model: str | dict[str, Any]
    """A ModelConfig YAML file (relative to this config file) or its keys inline; ignored when init_from is set."""
    init_from: str | None = None
    """An HF checkpoint directory to continue pretraining from (continued pretraining); null: from scratch."""
    seed: int = 0
    """Seeds the initial weights and the order of training sequences."""
    data: DataConfig = DataConfig()
    """The corpus."""
    phases: list[PhaseConfig] = Field(min_length=1)
    """Trained in order; a later phase with yarn_factor extends the context."""
    mtp: MTPConfig = MTPConfig()
    """Multi-token-prediction training."""
    optim: OptimConfig = OptimConfig()
    """The optimiser."""
    checkpoint_every: int = Field(100, gt=0)
    """Save a resumable checkpoint every N steps (and always at the end)."""
    keep_checkpoints: int = Field(2, gt=0)
    """Older checkpoints beyond this many are deleted."""
    eval_every: int = Field(100, gt=0)
    """Evaluate on the held-out split every N steps (and at the end of every phase)."""
    eval_sequences: int = Field(16, gt=0)
    """Held-out sequences per evaluation (at the current phase's seq_len)."""
    log_every: int = Field(10, gt=0)
    """Print a progress line every N steps (metrics.jsonl gets every step)."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """Under torchrun (WORLD_SIZE > 1): DistributedDataParallel, or FSDP2 fully_shard per block."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype: bfloat16 autocasts matmuls (weights and optimizer stay float32)."""
    device: DeviceName = "auto"
    """auto: a GPU if torch sees one (under torchrun, rank r takes cuda:LOCAL_RANK), cpu, or cuda."""
    deterministic: bool = True
    """torch.use_deterministic_algorithms: a resumed run repeats the uninterrupted one exactly."""
    threads: int | None = Field(None, gt=0)
    """torch.set_num_threads per process; null: torch's default (divided by the local world size)."""
    tensorboard: bool = True
    """Also write TensorBoard events to <run_dir>/tb."""

    @model_validator(mode="after")
    def _check(self) -> "PretrainConfig":
        names = [p.name for p in self.phases]
        if len(set(names)) != len(names):
            raise ValueError(f"phase names must be unique, got {names}")
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
    """Validate a dict; a ConfigError listing every bad field by its dotted path."""
    try:
        return PretrainConfig.model_validate(d)
    except ValidationError as e:
        lines = [f"  {'.'.join(str(x) for x in err['loc']) or '(top level)'}: {err['msg']}" for err in e.errors()]
        raise ConfigError(f"{source}: invalid pretraining config:\n" + "\n".join(lines)) from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> PretrainConfig:
    """Read a YAML file; `overrides` (e.g. {"run_dir": ...}) replace top-level keys."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        d = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys at the top level")
    cfg = parse_config({**d, **(overrides or {})}, str(path))
    return _resolve_inputs(cfg, path.parent)


def _resolve_inputs(cfg: PretrainConfig, base: Path) -> PretrainConfig:
    """Make the paths of files the run reads absolute, relative to the config file's directory."""

    def rel(p: str | None) -> str | None:
        return p if p is None or Path(p).expanduser().is_absolute() else str((base / p).resolve())

    data = cfg.data.model_copy(update={
        "tokenizer": rel(cfg.data.tokenizer),
        "sources": [s if s in ("stdlib", "site-packages") else rel(s) for s in cfg.data.sources]})
    return cfg.model_copy(update={"model": rel(cfg.model) if isinstance(cfg.model, str) else cfg.model,
                                  "init_from": rel(cfg.init_from), "data": data})


def dump_config(cfg: PretrainConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
