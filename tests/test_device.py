"""The `device` field: auto is the CPU on a machine without a GPU, cuda there is refused by name;
on a GPU the engine, the RL trainer step and the SFT loss give what they give on the CPU (up to
float rounding). The project's machines have no GPU: the GPU test is skipped there."""

import copy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from opencomposer.device import resolve_device
from opencomposer.errors import ConfigError

sys.path[:0] = [str(Path(__file__).parent / "engine"), str(Path(__file__).parent / "rl")]

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_cpu_is_always_the_cpu_and_auto_is_a_gpu_only_where_torch_sees_one():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match="run.device: 'cuda', but torch sees no CUDA device"):
        resolve_device("cuda", "run.device")


@gpu
def test_engine_on_a_gpu_generates_what_it_generates_on_the_cpu():
    from engine_util import draftable_model

    from opencomposer.engine.engine import Engine
    from opencomposer.engine.types import GenerationRequest, SamplingParams

    def run(device, k):
        engine = Engine(copy.deepcopy(draftable_model(0)).to(device), max_slots=4, max_len=48, speculative_depth=k)
        reqs = [GenerationRequest([1, 2, 3 + i], SamplingParams(temperature=0.0, max_new_tokens=16), return_logprob=True,
                                  return_routed_experts=True) for i in range(3)]
        try:
            return engine.generate_batch(reqs)
        finally:
            engine.stop()

    for k in (0, 2):  # plain (fused) decoding and MTP speculation
        for cpu, cuda in zip(run("cpu", k), run("cuda", k)):
            assert cuda.output_ids == cpu.output_ids
            np.testing.assert_allclose(cuda.logprobs, cpu.logprobs, atol=1e-4)
            np.testing.assert_array_equal(cuda.routed_experts, cpu.routed_experts)


@gpu
def test_trainer_step_and_sft_loss_on_a_gpu_match_the_cpu():
    from trainer_util import random_groups, tiny_model

    from opencomposer.rl.config import TrainConfig
    from opencomposer.pretrain.config import MTPConfig
    from opencomposer.pretrain.sft import collate, sft_loss
    from opencomposer.rl.rewards import RewardConfig
    from opencomposer.rl.trainer import Trainer

    def step(device):
        model = tiny_model(0).to(device)
        metrics = Trainer(model, TrainConfig(micro_batch_size=2), reward=RewardConfig(kl_coef=0.1)).step(
            random_groups(3, 4, seed=1))
        return metrics, {n: p.detach().cpu() for n, p in model.named_parameters()}

    (m_cpu, w_cpu), (m_gpu, w_gpu) = step("cpu"), step("cuda")
    for key in ("loss", "grad_norm", "reward/kl", "entropy"):
        assert m_gpu[key] == pytest.approx(m_cpu[key], rel=1e-4, abs=1e-6), key
    for name in w_cpu:
        torch.testing.assert_close(w_gpu[name], w_cpu[name], rtol=1e-4, atol=1e-5)

    ids, mask = collate([(np.arange(1, 30) % 50, np.r_[np.zeros(20), np.ones(9)].astype(np.uint8)),
                         (np.arange(1, 25) % 50, np.r_[np.zeros(20), np.ones(4)].astype(np.uint8))], 0)
    from engine_util import tiny_model as small

    losses = [float(sft_loss(small(0).to(d), ids, mask, MTPConfig(mode="distill", weight=0.3), [29, 24])[0])
              for d in ("cpu", "cuda")]
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)
