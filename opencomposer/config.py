"""Config helpers every command shares: one strict base class, one YAML loader, the shared sections.

Every command (`opencomposer rl | pretrain | sft | eval | demo`) reads one YAML file into a
pydantic model with `load_config(Model, path, overrides)`:

- `--set key.sub=value` (repeatable) overrides a field; the value is parsed as a YAML scalar
  (`--set train.max_steps=3`, `--set log.tensorboard=false`, `--set train.frozen=[lm_head]`).
- An unknown key or a bad value stops the run before anything starts, with a message naming the
  field (`train.optim.lr: Input should be greater than 0 (got -1)`).
- A key that was renamed or removed stops with a message naming the key to use now
  (`run_dir was renamed: use run.out_dir`); each command passes its table of such keys.
- `dump_config` gives the resolved config (every default filled in) as YAML: what
  `--print-config` prints and what every run saves beside its outputs and checkpoints.

The shared sections carry the ideas every command has under one name each: `run` (out_dir,
seed, num_threads, device), `optim`, `checkpoint` (every_steps, keep_last) and `log`
(tensorboard, progress, every_steps). Each class is written once here with the RL run's
defaults; a command whose defaults differ (pretraining's Adam beta2 0.95) or that does not use
a field (pretraining has no progress bar) takes a `variant` of it: the same fields, docstrings
and bounds, other defaults, the unused fields left out (so setting one is an unknown-key error).

This module is the bottom layer (ARCHITECTURE.md, "Layers"): it imports errors, device,
pydantic and yaml only. Command-specific configs live with their command (rl/config.py,
pretrain/config.py, pretrain/sft.py, pipeline.py, eval/run.py).
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator
from pydantic_core import PydanticUndefined

from opencomposer.device import DeviceName
from opencomposer.errors import ConfigError

M = TypeVar("M", bound=BaseModel)
REQUIRED: Any = ...
"""As a default in `variant`: the field has no default in this command (it must be given)."""
TENSORBOARD_EXTRA = "rl"
"""The pyproject extra that installs tensorboard (`pip install 'opencomposer[rl]'`)."""


class Section(BaseModel):
    """The one strict base of every config model: unknown keys are errors, fields documented in place."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


def variant(base: type[M], name: str, *, drop: tuple[str, ...] = (), doc: str | None = None,
            describe: Mapping[str, str] | None = None, **defaults: Any) -> type[M]:
    """`base` for one command: fields in `drop` left out (that command does not read them),
    `defaults` replacing the defaults of others (`REQUIRED`: none), `describe` the docstrings of
    fields whose meaning the command narrows. Each field keeps its type and bounds, so a shared
    section stays one definition. Assign the result to `name` in the calling module."""
    describe = describe or {}
    unknown = set(drop) | set(defaults) | set(describe)
    unknown -= set(base.model_fields)
    if unknown:
        raise TypeError(f"variant({base.__name__}): no fields {sorted(unknown)}")
    fields: dict[str, Any] = {}
    for key, info in base.model_fields.items():
        if key in drop:
            continue
        if key in defaults:
            info = copy.copy(info)
            info.default = PydanticUndefined if defaults[key] is REQUIRED else defaults[key]
            info.default_factory = None
        if key in describe:
            info = copy.copy(info)
            info.description = describe[key]
        fields[key] = (info.annotation, info)
    # field validators travel with their fields (model validators stay with the base: none of
    # the shared sections has one)
    validators = {name_: field_validator(*dec.info.fields, mode=dec.info.mode)(dec.func.__func__)
                  for name_, dec in base.__pydantic_decorators__.field_validators.items()
                  if all(f in fields for f in dec.info.fields)}
    # the caller's module: instances pickle by reference to `name` there (Ray, multiprocessing)
    module = sys._getframe(1).f_globals["__name__"]
    return create_model(name, __base__=Section, __doc__=doc or base.__doc__, __validators__=validators,
                        __module__=module, **fields)  # type: ignore[return-value]


# ----------------------------------------------------------------------------- shared sections

class RunConfig(Section):
    """Where the run writes and how it is seeded."""

    out_dir: str = "runs/rl"
    """Run directory (metrics.jsonl, config.yaml, checkpoints/, ...); relative to the working directory."""
    seed: int = 0
    """Seeds the random model init, the data order and every sampling request."""
    num_threads: int | None = Field(None, ge=1)
    """torch intra-op threads (None: torch's default). On the CPU, the most: each RL trainer and SFT
    step, and each region of the engine's kernels, runs on fewer when other processes keep
    CPUs busy (training/threads.py, engine/csrc/pool.h)."""
    device: DeviceName = "auto"
    """Where the model computes: auto (a GPU if torch sees one), cpu, cuda (opencomposer/device.py)."""


class OptimConfig(Section):
    """AdamW (the report: Adam, full-parameter updates), with a linear warm-up and an optional cosine decay."""

    lr: float = Field(1e-6, gt=0)
    """Peak learning rate; RL fine-tuning of a pretrained model wants ~1e-6, a tiny random model ~1e-3."""
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
    updates are sign-like (every parameter moves by about lr), which noisy gradients make costly."""
    min_lr_ratio: float | None = Field(None, gt=0, le=1)
    """Cosine decay from lr (after the warm-up) to lr x this at the last step; None: constant. A
    decaying lr lowers the noise floor that constant-lr steps on noisy gradients settle at."""


class CheckpointConfig(Section):
    """Resumable checkpoints: atomic, keep-last-N."""

    every_steps: int = Field(10, ge=1)
    """Save after every this many steps (and at the end)."""
    keep_last: int = Field(3, ge=1)
    """Checkpoints kept; older ones are deleted after a new one is complete."""


def tensorboard_available() -> bool:
    """Whether torch.utils.tensorboard's SummaryWriter can be imported (it needs the tensorboard package)."""
    try:
        return importlib.util.find_spec("tensorboard") is not None
    except (ImportError, ValueError):
        return False


class LogConfig(Section):
    """Metrics outputs (metrics.jsonl is always written)."""

    tensorboard: bool = True
    """Also write TensorBoard event files under <out_dir>/tb."""
    progress: bool = True
    """Show a rich progress bar."""
    every_steps: int = Field(10, ge=1)
    """Print a progress line every this many steps (metrics.jsonl gets every step)."""


def require_tensorboard(enabled: bool, key: str = "log.tensorboard") -> None:
    """ValueError naming the extra to install when `enabled` and tensorboard is not importable.

    The top-level configs call it from a validator, so a base install (no extras) stops while
    the config is read, before any model is loaded, not at the first metrics write."""
    if enabled and not tensorboard_available():
        raise ValueError(f"{key} is true but tensorboard is not installed: pip install "
                         f"'opencomposer[{TENSORBOARD_EXTRA}]', or set {key}: false")


# ----------------------------------------------------------------------------- loading

Renamed = Mapping[str, str]
"""Old dotted key -> what to write now (a dotted key, or a sentence for a removed key)."""


def format_errors(source: str, err: ValidationError) -> str:
    """One line per bad field, by its dotted path."""
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        # a section's own check (a model validator) would print the whole section as its input
        whole = not e["loc"] or isinstance(e.get("input"), dict)
        got = "" if e["type"] in ("missing", "extra_forbidden") or whole else f" (got {e.get('input')!r})"
        msg = "unknown key; check the spelling against the documented fields" if e["type"] == "extra_forbidden" else e["msg"]
        lines.append(f"  {where}: {msg}{got}")
    return f"{source}: invalid config\n" + "\n".join(lines)


def set_dotted(d: dict, dotted: str, value: Any) -> None:
    """d[a][b][c] = value for dotted "a.b.c", creating sections as needed."""
    keys = dotted.split(".")
    for k in keys[:-1]:
        nxt = d.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {dotted}: {k} is not a section")
        d = nxt
    d[keys[-1]] = value


def _has_dotted(d: Any, dotted: str) -> bool:
    for k in dotted.split("."):
        if not isinstance(d, dict) or k not in d:
            return False
        d = d[k]
    return True


def check_renamed(raw: dict, renamed: Renamed, source: str = "config") -> None:
    """ConfigError naming every old key in `raw` and what replaces it."""
    found = [(old, new) for old, new in renamed.items() if _has_dotted(raw, old)]
    if found:
        lines = [f"  {old} was renamed: use {new}" if _looks_like_key(new) else f"  {old} was removed: {new}"
                 for old, new in found]
        raise ConfigError(f"{source}: keys from an older config\n" + "\n".join(lines))


def _looks_like_key(s: str) -> bool:
    return " " not in s


def read_yaml(path: str | Path) -> dict:
    """A YAML file's top-level mapping; ConfigError if it is missing, invalid or not a mapping."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return raw


def apply_overrides(raw: dict, overrides: list[str] | tuple[str, ...]) -> None:
    """Apply `key.sub=value` items to `raw` in place; values are parsed as YAML scalars."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key.sub=value")
        key, value = item.split("=", 1)
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML: {e}") from None
        set_dotted(raw, key.strip(), parsed)


def load_config(model: type[M], path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                data: dict | None = None, *, renamed: Renamed | None = None,
                resolve_paths: Callable[[dict, Path], None] | None = None) -> M:
    """Read a YAML file and/or take `data` (over the file's values; neither: the defaults), apply
    `--set` overrides, validate.

    `renamed`: the command's old keys (a file or an override holding one stops with the new
    name). `resolve_paths(raw, base)` makes the paths a file names relative to its directory
    (before the overrides: a path given on the command line is relative to the working
    directory). Raises ConfigError naming every bad field.
    """
    source = str(path) if path is not None else "config"
    raw: dict = {}
    if path is not None:
        raw = read_yaml(path)
        if renamed:
            check_renamed(raw, renamed, source)
        if resolve_paths is not None:
            resolve_paths(raw, Path(path).parent.resolve())
    if data:  # on top of the file, section by section (a command's flags over its --config)
        if renamed:
            check_renamed(data, renamed, source)
        for key, value in data.items():
            raw[key] = {**raw[key], **value} if isinstance(value, dict) and isinstance(raw.get(key), dict) else value
    if renamed:
        keys: dict = {}
        for item in overrides:
            if "=" in item:
                set_dotted(keys, item.split("=", 1)[0].strip(), None)
        check_renamed(keys, renamed, "--set")
    apply_overrides(raw, overrides)
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(format_errors(source, e)) from None


def resolve_relative(raw: dict, base: Path, keys: tuple[str, ...], keep: Callable[[str], bool] = lambda s: False) -> None:
    """Make the string (or list-of-strings) values at dotted `keys` absolute, relative to `base`;
    values for which `keep` is true (e.g. "bundled:..." names) are left as they are."""

    def fix(p: Any) -> Any:
        if not isinstance(p, str) or keep(p):
            return p
        q = Path(p).expanduser()
        return str(q if q.is_absolute() else (base / q).resolve())

    for dotted in keys:
        *parents, last = dotted.split(".")
        d: Any = raw
        for k in parents:
            d = d.get(k) if isinstance(d, dict) else None
        if isinstance(d, dict) and last in d:
            v = d[last]
            d[last] = [fix(x) for x in v] if isinstance(v, list) else fix(v)


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
