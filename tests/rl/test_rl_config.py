"""RL config: the shipped YAML files load, bad keys and values stop early naming the field,
overrides apply, paths resolve against the YAML file, the resolved config round-trips."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from opencomposer.config import config_diff, dump_config
from opencomposer.rl.config import RLConfig, load_rl_config
from opencomposer.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "rl"


@pytest.mark.parametrize("name", ["single_turn_tiny.yaml", "single_turn_1gpu.yaml"])
def test_shipped_single_turn_configs_validate(name):
    cfg = load_rl_config(CONFIGS / name)
    assert cfg.mode == "single_turn" and cfg.data.rewards


def test_cluster_example_validates_as_an_agentic_ray_run():
    cfg = load_rl_config(CONFIGS / "agentic_ray_cluster.yaml")
    assert cfg.mode == "agentic" and cfg.agentic.runner == "ray" and cfg.agentic.ray.trainer_world_size == 8


def test_tiny_config_paths_resolve_against_the_yaml_file():
    cfg = load_rl_config(CONFIGS / "single_turn_tiny.yaml")
    assert Path(cfg.model.config) == (CONFIGS.parent / "model" / "tiny.yaml").resolve()
    assert Path(cfg.data.prompts).is_file()
    assert cfg.model.tokenizer == "bundled:tokenizer-4k"  # not a path: left alone
    assert cfg.run.out_dir == "runs/single_turn_tiny"  # relative to the working directory


def write(tmp_path, d) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


BASE = {"model": {"config": "m.yaml"}, "data": {"prompts": ["a", "b"], "rewards": ["m:f"]}}


def test_unknown_key_is_refused_with_its_dotted_name(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.optim\.lrr: unknown key"):
        load_rl_config(write(tmp_path, {**BASE, "train": {"optim": {"lrr": 1e-3}}}))


def test_bad_value_names_the_field_and_the_value(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_rl_config(write(tmp_path, {**BASE, "train": {"optim": {"lr": -1}}, "data": {**BASE["data"], "group_size": 1}}))
    msg = str(e.value)
    assert "train.optim.lr" in msg and "-1" in msg
    assert "data.group_size" in msg  # every bad field at once, not only the first


def test_nested_formula_configs_are_checked_too(tmp_path):
    with pytest.raises(ConfigError, match=r"loss\.aggregation"):
        load_rl_config(write(tmp_path, {**BASE, "loss": {"aggregation": "sum"}}))
    with pytest.raises(ConfigError, match=r"reward\.kl_estimator"):
        load_rl_config(write(tmp_path, {**BASE, "reward": {"kl_estimator": "k4"}}))


def test_cross_field_rules(tmp_path):
    with pytest.raises(ConfigError, match="exactly one of model.path"):
        load_rl_config(data={"model": {}, "data": BASE["data"]})
    with pytest.raises(ConfigError, match="needs a data section"):
        load_rl_config(data={"model": {"config": "m.yaml"}})
    with pytest.raises(ConfigError, match="server_url"):
        load_rl_config(data={**BASE, "weight_sync": {"mode": "disk"}})


def test_missing_file_and_non_mapping_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_rl_config(tmp_path / "nope.yaml")
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_rl_config(p)


def test_set_overrides_parse_values_as_yaml(tmp_path):
    cfg = load_rl_config(write(tmp_path, BASE), ["train.optim.lr=3e-4", "train.max_steps=7", "sampling.stop_at_eos=false"])
    assert cfg.train.optim.lr == 3e-4 and cfg.train.max_steps == 7 and cfg.sampling.stop_at_eos is False
    with pytest.raises(ConfigError, match="train.max_steps"):
        load_rl_config(write(tmp_path, BASE), ["train.max_steps=zero"])
    with pytest.raises(ConfigError, match="expected key.sub=value"):
        load_rl_config(write(tmp_path, BASE), ["train.max_steps"])


def test_resolved_config_round_trips_and_diffs(tmp_path):
    cfg = load_rl_config(write(tmp_path, BASE))
    again = RLConfig.model_validate(yaml.safe_load(dump_config(cfg)))
    assert again == cfg
    assert "loss:" in dump_config(cfg) and "clip_eps_high: 0.28" in dump_config(cfg)  # defaults written out
    other = again.model_copy(update={"train": again.train.model_copy(update={"max_steps": 9})})
    assert config_diff(cfg, other) == {"train.max_steps": (None, 9)}
