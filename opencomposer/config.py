"""Run configs: pydantic models, YAML loading with early, named errors, the resolved config saved per run.

`opencomposer rl --config FILE` reads one YAML file into `RLConfig`. Every field has a
one-line docstring and a documented default; an unknown key or a bad value stops the run
before anything starts, with a message naming the field (`train.lr: Input should be greater
than 0 (got -1)`). The resolved config (every default filled in) is written into the run
directory and into each checkpoint, so a run is reproducible from that one file.

Paths inside a config (model.config, model.path, model.tokenizer, data.prompts) are relative
to the YAML file's directory, so a config and its data can live together; run.out_dir is
relative to the working directory (where runs go is the caller's choice).

Covered: the RL run (single-turn mode: prompts + Python reward functions; agentic mode: the
`agentic` section, defined next to its orchestrator in rl/orchestrator.py), overrides
(`--set train.lr=1e-4`), saving/loading the resolved config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from opencomposer.device import DeviceName
from opencomposer.errors import ConfigError
from opencomposer.rl.advantages import AdvantageConfig
from opencomposer.rl.losses import PolicyLossConfig
from opencomposer.rl.orchestrator import AgenticConfig
from opencomposer.rl.rewards import RewardConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


class RunConfig(_Section):
    """Where the run writes and how it is seeded."""

    out_dir: str = "runs/rl"
    """Run directory (metrics.jsonl, tb/, config.yaml, checkpoints/); relative to the working directory."""
    seed: int = 0
    """Seeds the random model init, the prompt order and every sampling request."""
    num_threads: int | None = Field(None, ge=1)
    """torch intra-op threads (None: torch's default)."""
    device: DeviceName = "auto"
    """Trainer, reference model and embedded engine of a local run: auto (a GPU if torch sees one), cpu,
    cuda (opencomposer/device.py). Ray actors ignore it: they use a GPU when agentic.ray gives them one."""


class ModelSourceConfig(_Section):
    """Which policy to train: an HF checkpoint directory, or a ModelConfig YAML initialised at random."""

    path: str | None = None
    """HF-format checkpoint directory (opencomposer.model.save_pretrained's layout)."""
    config: str | None = None
    """ModelConfig YAML (e.g. configs/model/tiny.yaml) for a randomly initialised model (seeded by run.seed)."""
    tokenizer: str = "bundled:tokenizer-4k"
    """"bundled:NAME" for a packaged tokenizer, or a tokenizer.json file / directory."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Trainer parameter dtype (float32 keeps Adam exact on CPU)."""

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSourceConfig":
        if (self.path is None) == (self.config is None):
            raise ValueError("give exactly one of model.path (a checkpoint directory) or model.config "
                             "(a ModelConfig YAML for a random init)")
        return self


class EngineConfig(_Section):
    """The embedded inference engine (opencomposer.engine.Engine)."""

    max_slots: int = Field(64, ge=1)
    """Sequences decoded together; G × groups_per_step fit in one batch when this is at least that."""
    max_len: int = Field(1024, ge=2)
    """Context of one sequence, prompt + completion."""
    speculative_depth: int = Field(0, ge=0)
    """MTP draft tokens per decode step (0: plain decoding; at most the model's num_mtp_modules)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Engine weights and KV cache dtype; bfloat16 adds train–inference mismatch (see the metrics)."""


class SamplingConfig(_Section):
    """How completions are sampled for training."""

    temperature: float = Field(1.0, gt=0)
    """Sampling temperature (> 0: RL needs a stochastic policy); the trainer divides its logits by it too."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling; < 1 makes the behaviour logprobs those of the truncated distribution
    (the off-policy corrections then see the difference)."""
    top_k: int = Field(-1, ge=-1)
    """Top-k sampling; -1 off (same caveat as top_p)."""
    max_new_tokens: int = Field(64, ge=1)
    """Completion budget per sample."""
    stop_at_eos: bool = True
    """Stop a completion at the tokenizer's end-of-sequence token."""


class RewardFunctionConfig(_Section):
    """One Python reward function f(prompt, completion, **kw) -> float (TRL/verifiers style)."""

    fn: str
    """"module:function", imported at start-up."""
    weight: float = 1.0
    """The reward is Σ weight·f(...)."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments passed to every call."""


class DataConfig(_Section):
    """Single-turn mode: a dataset of prompts and the reward functions that score completions."""

    prompts: str | list[str | dict[str, Any]]
    """A JSONL file (one object per line, relative to the YAML file) or an inline list of strings/objects."""
    prompt_field: str = "prompt"
    """Field holding the prompt text; every other field is passed to the reward functions as a keyword."""
    id_field: str = "id"
    """Field holding a unique prompt id (default: the line number)."""
    rewards: list[RewardFunctionConfig | str] = Field(min_length=1)
    """Reward functions ("module:function" or {fn, weight, kwargs})."""
    group_size: int = Field(8, ge=2)
    """G: completions per prompt (Dr. GRPO needs ≥ 2 to compare)."""
    groups_per_step: int = Field(4, ge=1)
    """Prompts (groups) per trainer step."""
    shuffle: bool = True
    """Visit prompts in a seeded random order (single epoch either way)."""
    add_bos: bool = True
    """Prepend the tokenizer's <|bos|> to each prompt."""


class OptimConfig(_Section):
    """AdamW (the report: Adam, full-parameter updates)."""

    lr: float = Field(1e-6, gt=0)
    """Learning rate; RL fine-tuning of a pretrained model wants ~1e-6, a tiny random model ~1e-3."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam β1, β2."""
    eps: float = Field(1e-8, gt=0)
    """Adam ε."""
    weight_decay: float = Field(0.0, ge=0)
    """Decoupled weight decay (0: plain Adam as in the report)."""
    grad_clip: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm to this (None: no clipping; the norm is still logged)."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up of the learning rate over the first steps (lr x step/warmup_steps): Adam's first
    updates are sign-like (every parameter moves by about lr), which noisy RL gradients make costly."""
    min_lr_ratio: float | None = Field(None, gt=0, le=1)
    """Cosine decay from lr (after the warm-up) to lr x this at train.max_steps; None: constant. A
    decaying lr lowers the noise floor that constant-lr steps on noisy gradients settle at."""


class TrainConfig(_Section):
    """The trainer step."""

    max_steps: int | None = Field(None, ge=1)
    """Stop after this many steps (None: when the prompts run out; single epoch)."""
    micro_batch_size: int = Field(16, ge=1)
    """Sequences per forward/backward; gradients accumulate with the loss normalised over the whole batch."""
    frozen: list[str] = []
    """Parameter-name prefixes kept fixed (e.g. ["embed_tokens", "lm_head"]); [] trains every parameter
    (the report's full-parameter updates)."""
    skip_zero_advantage: bool = True
    """Leave samples whose advantage is 0 out of the forward (the same gradients for less compute).
    The Ray trainer's FSDP ranks turn it off: every rank must run the same forwards and backwards."""
    pack_prefixes: bool = True
    """Run each group's shared prefix once (rl/packing.py): the same loss and gradients for less
    compute. Micro-batches then hold whole groups (>= micro_batch_size samples). The Ray trainer's
    FSDP ranks turn it off (the number of model calls per step must match across ranks)."""
    router_replay: bool = True
    """Replay the engine's routed experts in the trainer's forward (R3; Composer 2 §6.2)."""
    replay_min_ratio: float | None = Field(0.1, ge=0, le=1)
    """Plausibility threshold: a replayed expert with p < ratio × the router's k-th probability is
    replaced by the router's choice (None: replay everything). 0.1 is OURS (the report gives none)."""
    optim: OptimConfig = OptimConfig()
    """The optimiser."""


class WeightSyncConfig(_Section):
    """How new weights reach the inference engine after each step."""

    mode: Literal["in_place", "disk"] = "in_place"
    """in_place: the embedded engine, same process; disk: an HF checkpoint + POST /update_weights_from_disk."""
    delta: bool = True
    """Send only tensors that changed since the last sync (bytes per sync are logged either way)."""
    server_url: str | None = None
    """Inference server for mode "disk" (e.g. http://127.0.0.1:30000)."""
    sync_dir: str | None = None
    """Directory for mode "disk" checkpoints (default: <out_dir>/weight_sync); must be visible to the server."""

    @model_validator(mode="after")
    def _disk_needs_url(self) -> "WeightSyncConfig":
        if self.mode == "disk" and not self.server_url:
            raise ValueError("weight_sync.mode 'disk' needs weight_sync.server_url")
        return self


class CheckpointConfig(_Section):
    """Checkpoints: model, optimizer, RNG, data cursor, buffered groups; atomic, keep-last-N."""

    every_steps: int = Field(10, ge=1)
    """Save after every this many steps (and at the end)."""
    keep_last: int = Field(3, ge=1)
    """Checkpoints kept; older ones are deleted after a new one is complete."""


class LogConfig(_Section):
    """Metrics outputs."""

    tensorboard: bool = True
    """Also write TensorBoard event files under <out_dir>/tb."""
    progress: bool = True
    """Show a rich progress bar."""


class RLConfig(_Section):
    """`opencomposer rl --config FILE`: one RL run."""

    mode: Literal["single_turn", "agentic"] = "single_turn"
    """single_turn: prompts + Python reward functions; agentic: tasks in sandboxes (the `agentic` section)."""
    run: RunConfig = RunConfig()
    model: ModelSourceConfig
    engine: EngineConfig = EngineConfig()
    sampling: SamplingConfig = SamplingConfig()
    data: DataConfig | None = None
    """Single-turn data (required when mode is single_turn)."""
    train: TrainConfig = TrainConfig()
    loss: PolicyLossConfig = PolicyLossConfig()
    advantage: AdvantageConfig = AdvantageConfig()
    reward: RewardConfig = RewardConfig()
    weight_sync: WeightSyncConfig = WeightSyncConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    log: LogConfig = LogConfig()
    # -- agentic mode (rl/orchestrator.py) --
    agentic: AgenticConfig | None = None
    """Agentic data, rollouts, asynchrony and runner (required when mode is agentic)."""

    @model_validator(mode="after")
    def _mode_needs_data(self) -> "RLConfig":
        if self.mode == "single_turn" and self.data is None:
            raise ValueError("mode 'single_turn' needs a data section (prompts and rewards)")
        if self.mode == "agentic" and self.agentic is None:
            raise ValueError("mode 'agentic' needs an agentic section (suite, rollout, staleness)")
        return self


def _format_errors(source: str, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        got = "" if e["type"] in ("missing", "extra_forbidden") else f" (got {e.get('input')!r})"
        msg = "unknown key; check the spelling against the documented fields" if e["type"] == "extra_forbidden" else e["msg"]
        lines.append(f"  {where}: {msg}{got}")
    return f"{source}: invalid config\n" + "\n".join(lines)


def _set_dotted(d: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        nxt = d.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {dotted}: {k} is not a section")
        d = nxt
    d[keys[-1]] = value


def _resolve_paths(raw: dict, base: Path) -> None:
    """Make input paths relative to the YAML file absolute (see the module docstring)."""
    def fix(section: str, key: str) -> None:
        sec = raw.get(section)
        if isinstance(sec, dict) and isinstance(sec.get(key), str) and not sec[key].startswith("bundled:"):
            p = Path(sec[key]).expanduser()
            sec[key] = str(p if p.is_absolute() else (base / p).resolve())

    for section, key in (("model", "path"), ("model", "config"), ("model", "tokenizer"), ("data", "prompts"),
                         ("agentic", "suite")):
        fix(section, key)


def load_rl_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                   data: dict | None = None) -> RLConfig:
    """Read a YAML file (or a dict), apply `key.sub=value` overrides (values parsed as YAML), validate.

    Raises ConfigError naming every bad field. Paths in the file are made absolute.
    """
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from e
        raw = {} if raw is None else raw
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping of sections (run, model, data, train, ...)")
        _resolve_paths(raw, path.parent.resolve())
    else:
        raw = dict(data or {})
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key.sub=value")
        key, value = item.split("=", 1)
        _set_dotted(raw, key.strip(), yaml.safe_load(value))
    try:
        return RLConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_errors(str(path or "config"), e)) from None


def dump_config(cfg: BaseModel) -> str:
    """The resolved config as YAML (every default filled in)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def save_config(cfg: BaseModel, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_config(cfg))
    return path


def config_diff(a: BaseModel, b: BaseModel) -> dict[str, tuple[Any, Any]]:
    """Dotted field -> (a's value, b's value) for every leaf that differs."""
    out: dict[str, tuple[Any, Any]] = {}

    def walk(x: Any, y: Any, prefix: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                walk(x.get(k), y.get(k), f"{prefix}{k}.")
        elif x != y:
            out[prefix.rstrip(".")] = (x, y)

    walk(a.model_dump(mode="json"), b.model_dump(mode="json"), "")
    return out
