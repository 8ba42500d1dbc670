"""The one configuration style: one loader with --set, old keys named, no field ignored or
overwritten, --print-config for every command, a docstring on every field, and a base install
without tensorboard stopping at once with the extra to install."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from opencomposer.cli import app
from opencomposer.config import Section, dump_config, load_config
from opencomposer.errors import ConfigError
from opencomposer.eval.run import EvalConfig
from opencomposer.model.config import ModelConfig
from opencomposer.pipeline import PipelineConfig
from opencomposer.pipeline import load_config as load_pipeline
from opencomposer.pretrain.config import PretrainConfig
from opencomposer.pretrain.config import load_config as load_pretrain
from opencomposer.pretrain.sft import SFTConfig
from opencomposer.pretrain.sft import load_config as load_sft
from opencomposer.rl.config import RLConfig, load_rl_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def write(path: Path, d: dict) -> Path:
    path.write_text(yaml.safe_dump(d))
    return path


# ----------------------------------------------------------------------------- the loader

class Small(Section):
    """A model for the loader's tests."""

    class Inner(Section):
        """A nested section."""

        n: int = 1
        """A number."""
        names: list[str] = []
        """Some names."""

    inner: Inner = Inner()
    """The nested section."""
    flag: bool = True
    """A switch."""


def test_set_overrides_nested_fields_with_yaml_scalars(tmp_path):
    path = write(tmp_path / "c.yaml", {"inner": {"n": 2}})
    cfg = load_config(Small, path, ["inner.n=5", "flag=false", "inner.names=[a, b]"])
    assert cfg.inner.n == 5 and cfg.flag is False and cfg.inner.names == ["a", "b"]
    assert load_config(Small).inner.n == 1  # no file: the defaults
    with pytest.raises(ConfigError, match="expected key.sub=value"):
        load_config(Small, path, ["inner.n"])
    with pytest.raises(ConfigError, match="flag is not a section"):
        load_config(Small, path, ["flag=true", "flag.x=1"])
    with pytest.raises(ConfigError, match=r"inner\.m: unknown key"):
        load_config(Small, path, ["inner.m=1"])
    with pytest.raises(ConfigError, match=r"inner\.n: Input should be a valid integer"):
        load_config(Small, path, ["inner.n=many"])


def test_missing_and_malformed_files_are_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Small, tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("inner: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(Small, tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(Small, tmp_path / "list.yaml")


def test_each_command_keeps_its_own_defaults_of_a_shared_section():
    rl = load_rl_config(CONFIGS / "rl" / "single_turn_tiny.yaml")
    pretrain = load_pretrain(CONFIGS / "pretrain" / "tiny.yaml")
    sft = load_sft(CONFIGS / "sft" / "tiny.yaml")
    assert rl.train.optim.betas == (0.9, 0.999) and pretrain.optim.betas == (0.9, 0.95) == sft.optim.betas
    assert pretrain.optim.weight_decay == 0.1 and sft.optim.weight_decay == 0.0
    # a field a command does not read is not there to be set
    with pytest.raises(ConfigError, match=r"optim\.lr: unknown key"):
        load_pretrain(CONFIGS / "pretrain" / "tiny.yaml", ["optim.lr=1e-3"])  # the lr is each phase's
    with pytest.raises(ConfigError, match=r"log\.tensorboard: unknown key"):
        load_sft(CONFIGS / "sft" / "tiny.yaml", ["log.tensorboard=true"])


# ----------------------------------------------------------------------------- renamed keys

@pytest.mark.parametrize("load, file, old, new", [
    (load_pretrain, "pretrain/tiny.yaml", "run_dir", "run.out_dir"),
    (load_pretrain, "pretrain/tiny.yaml", "checkpoint_every", "checkpoint.every_steps"),
    (load_pretrain, "pretrain/tiny.yaml", "threads", "run.num_threads"),
    (load_sft, "sft/tiny.yaml", "lr", "optim.lr"),
    (load_sft, "sft/tiny.yaml", "keep_checkpoints", "checkpoint.keep_last"),
    (load_pipeline, "demo/pipeline.yaml", "train_threads", "run.train_threads"),
    (load_pipeline, "demo/pipeline.yaml", "out_dir", "run.out_dir"),
])
def test_an_old_key_stops_naming_the_new_one(load, file, old, new, tmp_path):
    raw = yaml.safe_load((CONFIGS / file).read_text())
    raw[old] = 1
    with pytest.raises(ConfigError, match=rf"{old} was renamed: use {new}"):
        load(write(tmp_path / "old.yaml", raw))
    with pytest.raises(ConfigError, match=rf"{old} was renamed: use {new}"):
        load(CONFIGS / file, [f"{old}=1"])


# ----------------------------------------------------------------------------- unused fields (RL)

AGENTIC = CONFIGS / "rl" / "agentic_tiny.yaml"
SINGLE = CONFIGS / "rl" / "single_turn_tiny.yaml"


@pytest.mark.parametrize("path, override, named, instead", [
    (AGENTIC, "data={prompts: [hi], rewards: ['m:f'], group_size: 4}", "data", "agentic.rollout.group_size"),
    (AGENTIC, "agentic.rollout.agent.temperature=0.5", "agentic.rollout.agent.temperature", "sampling.temperature"),
    (AGENTIC, "agentic.rollout.agent.max_new_tokens=8", "agentic.rollout.agent.max_new_tokens", "sampling.max_new_tokens"),
    (AGENTIC, "agentic.rollout.agent.context_window=512", "agentic.rollout.agent.context_window", "engine.max_len"),
    (AGENTIC, "sampling.stop_at_eos=false", "sampling.stop_at_eos", "single-turn mode only"),
    (AGENTIC, "log.progress=true", "log.progress", "single-turn mode only"),
    (AGENTIC, "agentic.ray.rollout_actors=3", "agentic.ray", "runner 'ray' only"),
    (AGENTIC, "weight_sync.sync_dir=/tmp/x", "weight_sync.sync_dir", "mode 'disk' only"),
    (SINGLE, "agentic.suite=x", "agentic", "mode: agentic"),
    (SINGLE, "reward.length_coef=0.1", "reward.length_coef", "data.rewards"),
])
def test_a_field_the_run_does_not_use_is_an_error(path, override, named, instead):
    with pytest.raises(ConfigError) as err:
        load_rl_config(path, [override])
    assert f"{named}: " in str(err.value) and instead in str(err.value)


def test_the_ray_runner_refuses_what_its_actors_set_themselves():
    ray = CONFIGS / "rl" / "agentic_tiny_ray.yaml"
    for override in ("run.device=cpu", "run.num_threads=2", "train.pack_prefixes=false"):
        with pytest.raises(ConfigError, match=override.split("=")[0].replace(".", r"\.")):
            load_rl_config(ray, [override])
    with pytest.raises(ConfigError, match="weight_sync.mode 'disk'"):
        load_rl_config(SINGLE, ["weight_sync.mode=disk", "weight_sync.server_url=http://x"])


def test_the_resolved_config_leaves_out_what_the_mode_does_not_read_and_loads_again():
    cfg = load_rl_config(AGENTIC, ["agentic.rollout.agent.max_turns=3"])
    d = yaml.safe_load(dump_config(cfg))
    assert "data" not in d and "stop_at_eos" not in d["sampling"] and "progress" not in d["log"]
    assert "temperature" not in d["agentic"]["rollout"]["agent"] and d["agentic"]["rollout"]["agent"]["max_turns"] == 3
    assert "ray" not in d["agentic"] and "server_url" not in d["weight_sync"]
    assert RLConfig.model_validate(d) == cfg  # what a resumed run validates
    single = yaml.safe_load(dump_config(load_rl_config(SINGLE)))
    assert "agentic" not in single and set(single["reward"]) == {"kl_coef", "kl_estimator"}


def test_the_rollout_agent_keeps_the_limits_it_does_not_share_with_the_run():
    cfg = load_rl_config(AGENTIC, ["agentic.rollout.agent.max_total_tokens=999"])
    assert cfg.agentic.rollout.agent.max_total_tokens == 999


# ----------------------------------------------------------------------------- --print-config

def _printed(args: list[str]) -> dict:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return yaml.safe_load(result.stdout)


def test_every_command_prints_its_resolved_config(tmp_path):
    rl = _printed(["rl", "--config", str(SINGLE), "--set", "train.max_steps=7", "--print-config"])
    assert rl["train"]["max_steps"] == 7 and rl["train"]["optim"]["betas"] == [0.9, 0.999]
    pre = _printed(["pretrain", "--config", str(CONFIGS / "pretrain/tiny.yaml"), "--set", "run.out_dir=x",
                    "--print-config"])
    assert pre["run"]["out_dir"] == "x" and pre["checkpoint"]["keep_last"] == 2 and pre["optim"]["betas"] == [0.9, 0.95]
    sft = _printed(["sft", "--config", str(CONFIGS / "sft/tiny.yaml"), "--set", "optim.lr=0.01", "--print-config"])
    assert sft["optim"] == {**sft["optim"], "lr": 0.01, "warmup_steps": 5} and sft["checkpoint"]["every_steps"] == 20
    demo = _printed(["demo", "--config", str(CONFIGS / "demo/pipeline.yaml"), "--set", "rl.steps=8", "--print-config"])
    assert demo["rl"]["steps"] == 8 and demo["run"]["train_threads"] == 2
    eval_cfg = write(tmp_path / "eval.yaml", {"suite": "suite", "policy": "oracle", "run": {"out_dir": "out"}})
    ev = _printed(["eval", "--config", str(eval_cfg), "--set", "passes=3", "--passes", "2", "--print-config"])
    assert ev["passes"] == 3 and ev["suite"] == str(tmp_path / "suite") and ev["run"] == {"out_dir": "out", "device": "auto"}
    assert not (tmp_path / "out").exists()


def test_eval_flags_alone_still_make_a_run_config():
    ev = _printed(["eval", "--suite", "s", "--policy", "noop", "--out", "o", "--tasks", "a*,b", "--print-config"])
    assert ev["tasks"] == ["a*", "b"] and ev["run"]["out_dir"] == "o"
    bad = CliRunner().invoke(app, ["eval", "--suite", "s", "--policy", "noop", "--print-config"])
    assert bad.exit_code == 2 and "run: Field required" in bad.output


def test_a_bad_config_stops_each_command_naming_the_field():
    for args in (["rl", "--config", str(SINGLE)], ["pretrain", "--config", str(CONFIGS / "pretrain/tiny.yaml")],
                 ["sft", "--config", str(CONFIGS / "sft/tiny.yaml")], ["demo"]):
        result = CliRunner().invoke(app, [*args, "--set", "run.seeed=1", "--print-config"])
        assert result.exit_code != 0 and "run.seeed: unknown key" in result.output, args


# ----------------------------------------------------------------------------- docstrings

TOP = (RLConfig, PretrainConfig, SFTConfig, PipelineConfig, EvalConfig)


def _models(annotation) -> list[type]:
    if isinstance(annotation, type) and (issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation)):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _dataclass_docstrings(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass (the string right under a field), as pydantic reads them."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body, out = tree.body[0].body, {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            out[node.target.id] = nxt.value.value
    return out


def undocumented(roots) -> list[str]:
    seen, missing, todo = set(), [], list(roots)
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        if dataclasses.is_dataclass(model):
            docs = _dataclass_docstrings(model)
            missing += [f"{model.__name__}.{f.name}" for f in dataclasses.fields(model) if not docs.get(f.name)]
            continue
        for name, field in model.model_fields.items():
            if not (field.description or "").strip():
                missing.append(f"{model.__module__}.{model.__name__}.{name}")
            todo += _models(field.annotation)
    return missing


def test_every_config_field_has_a_docstring():
    assert undocumented([*TOP, ModelConfig]) == []


def test_the_docstring_walker_finds_an_undocumented_field():
    class Bare(Section):
        """A section with one field left undocumented."""

        documented: int = 0
        """Has one."""
        bare: int = 0

    class Top(Section):
        """Holds it two levels down."""

        inner: list[Bare] | None = None
        """The sections."""

    assert undocumented([Top]) == [f"{__name__}.Bare.bare"]


# ----------------------------------------------------------------------------- layering, base install

def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_the_config_helpers_import_nothing_above_them():
    proc = _python("import sys, opencomposer.config; "
                   "print(sorted(m for m in sys.modules if m.startswith('opencomposer.')))")
    assert proc.returncode == 0, proc.stderr
    assert set(eval(proc.stdout)) <= {"opencomposer.config", "opencomposer.device", "opencomposer.errors"}


NO_TENSORBOARD = """
import sys
class Missing:  # a base install: no tensorboard package
    def find_spec(self, name, path=None, target=None):
        if name == "tensorboard" or name.startswith("tensorboard."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Missing())
sys.argv = ["opencomposer", *ARGS]
from opencomposer.cli import app
app()
"""


@pytest.mark.parametrize("args", [["rl", "--config", "configs/rl/single_turn_tiny.yaml"],
                                  ["pretrain", "--config", "configs/pretrain/tiny.yaml"]])
def test_without_tensorboard_a_run_stops_at_once_naming_the_extra(args, tmp_path):
    out = tmp_path / "run"
    proc = _python(NO_TENSORBOARD.replace("ARGS", repr([*args, "--set", f"run.out_dir={out}"])))
    assert proc.returncode != 0 and "pip install 'opencomposer[rl]'" in proc.stderr, proc.stderr[-2000:]
    assert not out.exists()  # stopped while reading the config: nothing written, no model loaded
    import tomllib

    from opencomposer.config import TENSORBOARD_EXTRA

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("tensorboard") for dep in extras[TENSORBOARD_EXTRA])  # the extra the message names
    ok = _python(NO_TENSORBOARD.replace("ARGS", repr([*args, "--set", "log.tensorboard=false", "--print-config"])))
    assert ok.returncode == 0, ok.stderr[-2000:]


def test_configs_pickle_for_ray_and_subprocesses(tmp_path):
    import pickle

    eval_cfg = write(tmp_path / "eval.yaml", {"suite": "s", "policy": "noop", "run": {"out_dir": "o"}})
    for cfg in (load_rl_config(AGENTIC), load_pretrain(CONFIGS / "pretrain/tiny.yaml"), load_sft(CONFIGS / "sft/tiny.yaml"),
                load_pipeline(None), load_config(EvalConfig, eval_cfg)):
        assert pickle.loads(pickle.dumps(cfg)) == cfg


def test_pretraining_and_sft_refuse_fields_they_would_ignore():
    with pytest.raises(ConfigError, match="exactly one of model"):
        load_pretrain(CONFIGS / "pretrain/tiny.yaml", ["init_from=/some/checkpoint"])  # model would be ignored
    with pytest.raises(ConfigError, match=r"data\.generate, data\.agent: used only when collecting on data\.suite"):
        load_sft(CONFIGS / "sft/tiny.yaml", ["data.suite=null"])
    assert load_sft(CONFIGS / "sft/tiny.yaml", ["data.suite=null", "data.generate=null", "data.agent=null"]).data.suite is None
