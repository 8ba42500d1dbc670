"""The GPU examples for real checkpoints (Qwen3-0.6B dense, Qwen3-30B-A3B MoE) load with the config
loader as their command reads them (they are not run: the paths are placeholders)."""

from pathlib import Path

import pytest

from opencomposer.pretrain.sft import load_config as load_sft
from opencomposer.rl.config import load_rl_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("name", ["qwen3_0.6b_1gpu.yaml", "qwen3_30b_a3b.yaml"])
def test_sft_examples_validate(name):
    cfg = load_sft(CONFIGS / "sft" / name)
    assert cfg.tokenizer is None and cfg.mtp is None  # the checkpoint's own tokenizer; no MTP modules on the Hub
    assert cfg.run.device == "cuda" and "Qwen3" in cfg.init_from


@pytest.mark.parametrize("name, runner, replay", [("agentic_qwen3_0.6b_1gpu.yaml", "local", False),
                                                  ("agentic_qwen3_0.6b_vllm_1gpu.yaml", "local", False),
                                                  ("agentic_qwen3_30b_a3b_ray.yaml", "ray", True)])
def test_rl_examples_validate(name, runner, replay):
    cfg = load_rl_config(CONFIGS / "rl" / name)
    assert cfg.mode == "agentic" and cfg.agentic.runner == runner and cfg.train.router_replay is replay
    assert cfg.model.tokenizer is None and cfg.model.path  # the tokenizer and format come with the checkpoint


def test_the_vllm_example_runs_its_rollouts_on_vllm():
    cfg = load_rl_config(CONFIGS / "rl" / "agentic_qwen3_0.6b_vllm_1gpu.yaml")
    assert cfg.engine.backend == "vllm" and cfg.weight_sync.vllm_update == "auto"
    assert not cfg.engine.vllm.enforce_eager and not cfg.engine.vllm.single_process
