"""The RL run's config: `opencomposer rl --config FILE` reads one YAML file into `RLConfig`.

Every field has a one-line docstring and a documented default; the shared sections (`run`,
`train.optim`, `checkpoint`, `log`) are opencomposer/config.py's, loading and `--set` too. The
resolved config (every default filled in) is written into the run directory and into each
checkpoint, so a run is reproducible from that one file.

Paths inside a config (model.config, model.path, model.tokenizer, data.prompts, agentic.suite)
are relative to the YAML file's directory, so a config and its data can live together;
run.out_dir is relative to the working directory (where runs go is the caller's choice).

No field is ignored or overwritten: a field that the chosen mode (single-turn or agentic, the
local or the Ray runner, in-place or disk weight sync) does not read is an error when set to
anything but its default, with the reason and, where there is one, the field to set instead
(`unused_fields`). The same fields are left out of the resolved config, so a saved config
shows what the run used and validates again. In particular `group_size` and `groups_per_step`
exist once per run: `data.*` in single-turn mode, `agentic.rollout.group_size` and
`agentic.groups_per_step` in agentic mode; and the rollout agent's sampling fields are the
`sampling` section's (agentic.rollout.agent.temperature etc. are refused).

Covered: the RL run (single-turn mode: prompts + Python reward functions; agentic mode: the
`agentic` section: tasks in sandboxes, rollouts, asynchrony, runner). The section classes of
the formula modules (rewards.py, advantages.py, losses.py) and of rollouts (rollout.py) stay
beside their code; none of those modules imports this one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_serializer, model_validator

from opencomposer.config import LogConfig as SharedLogConfig
from opencomposer.config import (CheckpointConfig, OptimConfig, RunConfig, Section, load_config,
                                 require_tensorboard, resolve_relative, variant)
from opencomposer.device import ComputeDtype
from opencomposer.engine.vllm_server import VLLMConfig
from opencomposer.rl.advantages import AdvantageConfig
from opencomposer.rl.losses import PolicyLossConfig
from opencomposer.rl.rewards import RewardConfig
from opencomposer.rl.rollout import RolloutConfig

LogConfig = variant(SharedLogConfig, "LogConfig", drop=("every_steps",),
                    doc="RL's metrics outputs: TensorBoard and the progress bar (metrics.jsonl is always written).")


class ModelSourceConfig(Section):
    """Which policy to train: an HF checkpoint directory, or a ModelConfig YAML initialised at random."""

    path: str | None = None
    """HF-format checkpoint directory (opencomposer.model.save_pretrained's layout)."""
    config: str | None = None
    """ModelConfig YAML (e.g. configs/model/tiny.yaml) for a randomly initialised model (seeded by run.seed)."""
    tokenizer: str | None = None
    """"bundled:NAME" for a packaged tokenizer, or a tokenizer.json file / directory; None: model.path's own
    tokenizer.json when it has one, else the bundled tokenizer-4k."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Trainer parameter dtype (float32 keeps Adam exact on CPU)."""

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSourceConfig":
        if (self.path is None) == (self.config is None):
            raise ValueError("give exactly one of model.path (a checkpoint directory) or model.config "
                             "(a ModelConfig YAML for a random init)")
        return self


class EngineConfig(Section):
    """The inference engine that samples rollouts: the embedded one (opencomposer.engine.Engine) or vLLM."""

    backend: Literal["embedded", "vllm"] = "embedded"
    """embedded: opencomposer's engine in this process; vllm: a vLLM server the run starts (or attaches to:
    engine.vllm.url), agentic mode with the local runner (rl/vllm_sync.py, docs/vllm.md)."""
    vllm: VLLMConfig = VLLMConfig()
    """The vLLM server (backend vllm); its dtype, batch and context come from engine.dtype, max_slots, max_len."""
    max_slots: int = Field(64, ge=1)
    """Sequences decoded together; G × groups_per_step fit in one batch when this is at least that."""
    max_len: int = Field(1024, ge=2)
    """Context of one sequence, prompt + completion (in agentic mode also the agent's context window)."""
    speculative_depth: int = Field(0, ge=0)
    """MTP draft tokens per decode step (0: plain decoding; at most the model's num_mtp_modules)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Engine weights and KV cache dtype; bfloat16 adds train–inference mismatch (see the metrics)."""


class SamplingConfig(Section):
    """How completions (agentic mode: every turn of a rollout) are sampled for training."""

    temperature: float = Field(1.0, gt=0)
    """Sampling temperature (> 0: RL needs a stochastic policy); the trainer divides its logits by it too."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling; < 1 makes the behaviour logprobs those of the truncated distribution
    (the off-policy corrections then see the difference)."""
    top_k: int = Field(-1, ge=-1)
    """Top-k sampling; -1 off (same caveat as top_p)."""
    max_new_tokens: int = Field(64, ge=1)
    """Completion budget per sample (agentic mode: per turn)."""
    stop_at_eos: bool = True
    """Single-turn mode: stop a completion at the tokenizer's end-of-sequence token."""


class RewardFunctionConfig(Section):
    """One Python reward function f(prompt, completion, **kw) -> float (TRL/verifiers style)."""

    fn: str
    """"module:function", imported at start-up."""
    weight: float = 1.0
    """The reward is Σ weight·f(...)."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments passed to every call."""


class DataConfig(Section):
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


class TrainConfig(Section):
    """The trainer step."""

    max_steps: int | None = Field(None, ge=1)
    """Stop after this many steps (None: when the prompts or tasks run out; single epoch)."""
    micro_batch_size: int = Field(16, ge=1)
    """Sequences per forward/backward; gradients accumulate with the loss normalised over the whole batch."""
    frozen: list[str] = []
    """Parameter-name prefixes kept fixed (e.g. ["embed_tokens", "lm_head"]); [] trains every parameter
    (the report's full-parameter updates)."""
    skip_zero_advantage: bool = True
    """Leave samples whose advantage is 0 out of the forward (the same gradients for less compute).
    The Ray trainer's FSDP ranks turn it off: every rank must run the same forwards and backwards."""
    pack_prefixes: bool = True
    """Run each group's shared prefix once (training/packing.py): the same loss and gradients for less
    compute. Micro-batches then hold whole groups (>= micro_batch_size samples). The Ray trainer's
    FSDP ranks turn it off (the number of model calls per step must match across ranks)."""
    router_replay: bool = True
    """Replay the engine's routed experts in the trainer's forward (R3; Composer 2 §6.2)."""
    replay_min_ratio: float | None = Field(0.1, ge=0, le=1)
    """Plausibility threshold: a replayed expert with p < ratio × the router's k-th probability is
    replaced by the router's choice (None: replay everything). 0.1 is OURS (the report gives none)."""
    dtype: ComputeDtype = "float32"
    """Compute dtype of the trainer's forward and backward: bfloat16 autocasts the matmuls and attention
    (weights, optimizer, norms, the router's softmax and the output head with its log-softmax stay float32;
    on a CPU attention's kernel computes in float32, its bfloat16 backward being ~4x slower). The trainer's
    log-probabilities then differ from a float32 engine's by bfloat16's rounding (mismatch/abs_logp_diff
    shows how much)."""
    optim: OptimConfig = OptimConfig()
    """The optimiser (opencomposer/config.py's shared section, with its RL defaults)."""


class WeightSyncConfig(Section):
    """How new weights reach the inference engine after each step."""

    mode: Literal["in_place", "disk"] = "in_place"
    """in_place: the embedded engine, same process; disk: an HF checkpoint + POST /update_weights_from_disk."""
    delta: bool = True
    """Send only tensors that changed since the last sync (bytes per sync are logged either way)."""
    server_url: str | None = None
    """Inference server for mode "disk" (e.g. http://127.0.0.1:30000)."""
    sync_dir: str | None = None
    """Directory for mode "disk" and vLLM checkpoints (default: <out_dir>/weight_sync); must be visible to the server."""
    vllm_update: Literal["auto", "api", "restart"] = "auto"
    """engine.backend vllm: api (vLLM's reload_weights), restart (a restart on the new checkpoint), or auto:
    the API until a probe shows it serving other weights, then restarts (rl/vllm_sync.py)."""
    probe_tokens: int = Field(64, ge=2)
    """engine.backend vllm: length of the fixed token sequence whose logprobs verify each weight update."""
    probe_tolerance: float | None = Field(None, gt=0)
    """engine.backend vllm: mean |logp_vllm - logp_trainer| allowed on the probe (None: 1e-3 for float32, 0.1 for bfloat16)."""

    @model_validator(mode="after")
    def _disk_needs_url(self) -> "WeightSyncConfig":
        if self.mode == "disk" and not self.server_url:
            raise ValueError("weight_sync.mode 'disk' needs weight_sync.server_url")
        return self


class RayRunnerConfig(Section):
    """Where the pieces run when `runner: ray` (ray_runner.py)."""

    address: str | None = None
    """Ray cluster address (None: start a local instance with `num_cpus`)."""
    num_cpus: int | None = Field(None, ge=1)
    """CPUs of the local instance Ray starts when address is None (None: all)."""
    rollout_actors: int = Field(2, ge=1)
    """Rollout worker actors (each runs groups with its own sandbox pool, on any node)."""
    trainer_world_size: int = Field(1, ge=1)
    """Trainer processes (torch.distributed, FSDP2 via fully_shard; gloo on CPU, nccl on GPU)."""
    trainer_gpus: float = Field(0.0, ge=0)
    """GPUs per trainer rank (0 on CPU)."""
    inference_gpus: float = Field(0.0, ge=0)
    """GPUs of the inference actor (0 on CPU)."""


class AgenticConfig(Section):
    """`mode: agentic`: tasks in sandboxes, asynchronous rollouts and training (rl/orchestrator.py)."""

    suite: str
    """Suite directory (tasks/suites/...); relative paths are relative to the YAML file."""
    tasks: list[str] = ["*"]
    """Globs of task ids to train on (single epoch: each at most once)."""
    shuffle: bool = True
    """Visit tasks in a seeded order (run.seed)."""
    runner: Literal["local", "ray"] = "local"
    """local: one process, asyncio; ray: rollout workers, the engine and the trainer as Ray actors."""
    rollout: RolloutConfig = RolloutConfig()
    """Group size, retries, agent limits (the agent samples with the `sampling` section, in engine.max_len)."""
    groups_per_step: int = Field(2, ge=1)
    """B: tasks (groups of G rollouts) per trainer step."""
    rollout_workers: int = Field(4, ge=1)
    """Groups generated at once (each runs its G rollouts concurrently)."""
    max_staleness: int = Field(1, ge=0)
    """s: a group is trained at most s policy versions after its oldest token was sampled (0: synchronous)."""
    staleness_policy: Literal["wait", "drop"] = "wait"
    """wait: hold new rollouts back so the bound holds (AReaL); drop: roll freely, drop stale groups."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling (Yu et al. 2503.14476): a group whose rollouts all got the same reward
    has advantage 0 under group-relative estimators, so it does not count toward groups_per_step
    (nor toward the staleness bound's in-flight groups). It still rides along in the next step's
    batch (its task used once, its trajectories saved; the trainer skips it), so every step trains
    groups_per_step informative groups."""
    max_task_retries: int = Field(2, ge=0)
    """Times a task whose group failed or went stale is rolled out again before it is given up."""
    backend: str = "bwrap"
    """Sandbox backend (opencomposer.sandbox.get_backend)."""
    save_trajectories: bool = True
    """Append every trained rollout to <out_dir>/trajectories.jsonl (routed experts left out)."""
    ray: RayRunnerConfig = RayRunnerConfig()
    """Used when runner is "ray"."""


# The rollout agent's fields that an RL run sets from its own sections (orchestrator.agent_config).
AGENT_FROM_RUN = {"temperature": "sampling.temperature", "top_p": "sampling.top_p", "top_k": "sampling.top_k",
                  "max_new_tokens": "sampling.max_new_tokens", "context_window": "engine.max_len",
                  "max_wall_s": "agentic.rollout.task_timeout_s"}
_SINGLE_TURN_REWARD = ("kl_coef", "kl_estimator")  # the reward fields single-turn mode reads


class RLConfig(Section):
    """`opencomposer rl --config FILE`: one RL run."""

    mode: Literal["single_turn", "agentic"] = "single_turn"
    """single_turn: prompts + Python reward functions; agentic: tasks in sandboxes (the `agentic` section)."""
    run: RunConfig = RunConfig()
    """Run directory, seed, threads, device."""
    model: ModelSourceConfig
    """The policy to train (and the reference model's source)."""
    engine: EngineConfig = EngineConfig()
    """The embedded inference engine that samples rollouts."""
    sampling: SamplingConfig = SamplingConfig()
    """Sampling of training completions."""
    data: DataConfig | None = None
    """Single-turn data (required when mode is single_turn; an error in agentic mode)."""
    train: TrainConfig = TrainConfig()
    """The trainer step and its optimiser."""
    loss: PolicyLossConfig = PolicyLossConfig()
    """The clipped, off-policy-corrected token loss (rl/losses.py)."""
    advantage: AdvantageConfig = AdvantageConfig()
    """Group-relative advantages (rl/advantages.py)."""
    reward: RewardConfig = RewardConfig()
    """Reward terms of agentic rollouts and the KL-in-reward coefficient (rl/rewards.py)."""
    weight_sync: WeightSyncConfig = WeightSyncConfig()
    """How new weights reach the engine."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """Resumable checkpoints under <out_dir>/checkpoints."""
    log: LogConfig = LogConfig()
    """Metrics outputs."""
    agentic: AgenticConfig | None = None
    """Agentic data, rollouts, asynchrony and runner (required when mode is agentic; an error in single-turn mode)."""

    @model_validator(mode="after")
    def _mode_needs_data(self) -> "RLConfig":
        if self.mode == "single_turn" and self.data is None:
            raise ValueError("mode 'single_turn' needs a data section (prompts and rewards)")
        if self.mode == "agentic" and self.agentic is None:
            raise ValueError("mode 'agentic' needs an agentic section (suite, rollout, staleness)")
        if self.weight_sync.mode == "disk" and not (self.mode == "agentic" and self.agentic.runner == "local"):
            raise ValueError("weight_sync.mode 'disk' (a remote inference server) works with mode 'agentic' and "
                             "agentic.runner 'local' only; single-turn mode and the Ray runner sync in place")
        if self.engine.backend == "vllm":
            if not (self.mode == "agentic" and self.agentic.runner == "local"):
                raise ValueError("engine.backend 'vllm' works with mode 'agentic' and agentic.runner 'local' "
                                 "(the Ray runner's inference actor is the embedded engine; docs/vllm.md says how to run "
                                 "vLLM on one node)")
            if self.weight_sync.mode != "in_place":
                raise ValueError("weight_sync.mode: leave it out with engine.backend 'vllm' (the vLLM backend "
                                 "updates its server itself; weight_sync.vllm_update chooses how)")
        return self

    @model_validator(mode="after")
    def _no_unused_fields(self) -> "RLConfig":
        errors = [f"{key}: {why}" for key, why in unused_fields(self).items() if _is_set(self, key)]
        if errors:
            raise ValueError("fields this run would not use (leave them out):\n    " + "\n    ".join(errors))
        return self

    @model_validator(mode="after")
    def _tensorboard_installed(self) -> "RLConfig":
        require_tensorboard(self.log.tensorboard)
        return self

    @model_serializer(mode="wrap")
    def _without_unused(self, handler) -> dict:
        # the resolved config shows what the run uses, and validates again when read back
        out = handler(self)
        for key in unused_fields(self):
            _pop_dotted(out, key)
        return out


def unused_fields(cfg: RLConfig) -> dict[str, str]:
    """Dotted field -> why this run does not read it (and what to set instead)."""
    out: dict[str, str] = {}
    if cfg.mode == "single_turn":
        out["agentic"] = "agentic mode only (mode: agentic); single-turn data is the data section"
        for f in RewardConfig.model_fields:
            if f not in _SINGLE_TURN_REWARD:
                out[f"reward.{f}"] = ("agentic rollouts only; single-turn rewards are data.rewards' functions "
                                      "(reward.kl_coef and reward.kl_estimator apply to both modes)")
    else:
        out["data"] = ("single-turn mode only; agentic tasks are agentic.suite and agentic.tasks, G is "
                       "agentic.rollout.group_size, B is agentic.groups_per_step")
        out["sampling.stop_at_eos"] = "single-turn mode only; an agent's turn ends at its chat format's end of turn"
        out["log.progress"] = "single-turn mode only; agentic runs print no progress bar"
        for f, instead in AGENT_FROM_RUN.items():
            out[f"agentic.rollout.agent.{f}"] = f"an RL run sets it from {instead}: set that instead"
        if cfg.agentic is not None and cfg.agentic.runner == "ray":
            why = "the Ray runner's actors choose their own (agentic.ray's GPUs, Ray's CPUs)"
            out["run.device"], out["run.num_threads"] = why, why
            for f in ("skip_zero_advantage", "pack_prefixes"):
                out[f"train.{f}"] = "the Ray trainer's FSDP ranks turn it off (every rank runs the same model calls)"
        else:
            out["agentic.ray"] = "agentic.runner 'ray' only"
    vllm = cfg.engine.backend == "vllm"
    if vllm:
        out["engine.speculative_depth"] = "the embedded engine's MTP drafts; vLLM decodes without them here"
        out["weight_sync.server_url"] = "weight_sync.mode 'disk' only; to attach to a running vLLM set engine.vllm.url"
        for f, instead in (("dtype", "engine.dtype"), ("max_num_seqs", "engine.max_slots"),
                           ("max_model_len", "engine.max_len")):
            out[f"engine.vllm.{f}"] = f"an RL run sets it from {instead}: set that instead"
    else:
        out["engine.vllm"] = "engine.backend 'vllm' only"
        for f in ("vllm_update", "probe_tokens", "probe_tolerance"):
            out[f"weight_sync.{f}"] = "engine.backend 'vllm' only"
    if cfg.weight_sync.mode == "in_place":
        if not vllm:
            for f in ("server_url", "sync_dir"):
                out[f"weight_sync.{f}"] = "weight_sync.mode 'disk' only"
    else:
        for f in ("max_slots", "speculative_depth", "dtype"):
            out[f"engine.{f}"] = "the embedded engine's; with weight_sync.mode 'disk' the server at server_url decodes"
    return out


def _is_set(model: BaseModel, dotted: str) -> bool:
    """Whether the config's author gave `dotted` a value (every parent given too: a section left at its
    default sets nothing, whatever its default instance holds); None for a field whose default is
    None counts as not given (`data: null` in an agentic run)."""
    *parents, last = dotted.split(".")
    m: Any = model
    for k in parents:
        if not isinstance(m, BaseModel) or k not in m.model_fields_set:
            return False
        m = getattr(m, k)
    if not isinstance(m, BaseModel) or last not in m.model_fields_set:
        return False
    value, field = getattr(m, last), type(m).model_fields[last]
    return value is not None if field.default is None else True


def _pop_dotted(d: dict, dotted: str) -> None:
    *parents, last = dotted.split(".")
    for k in parents:
        d = d.get(k) if isinstance(d, dict) else None
    if isinstance(d, dict):
        d.pop(last, None)


RENAMED: dict[str, str] = {}
"""Keys of older RL configs and their replacements (none yet: the RL names are the canonical ones)."""


def _resolve_paths(raw: dict, base: Path) -> None:
    resolve_relative(raw, base, ("model.path", "model.config", "model.tokenizer", "data.prompts", "agentic.suite"),
                     keep=lambda s: s.startswith("bundled:"))


def load_rl_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                   data: dict | None = None) -> RLConfig:
    """Read a YAML file (or a dict), apply `key.sub=value` overrides (values parsed as YAML), validate.

    Raises ConfigError naming every bad field. Paths in the file are made absolute.
    """
    return load_config(RLConfig, path, overrides, data, renamed=RENAMED, resolve_paths=_resolve_paths)
