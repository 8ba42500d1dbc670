"""benchmarks/engines.py: its statistics (mismatch, k3), its trainer logprobs and embedded-engine
run on a tiny model, its argument checks, and (vllm) the whole script against a live float32 vLLM
server on a tiny checkpoint, whose mismatch must pass the issue's bar (exit status 0)."""

import asyncio
import json
import math

import pytest
import torch

from engine_util import load_benchmark, prompts, tiny_model
from opencomposer.engine.types import GenerationResult, SamplingParams
from tests.vllm_util import require_vllm



@pytest.fixture(scope="module")
def bench():
    return load_benchmark("engines")


def test_mismatch_figures(bench):
    m = bench.mismatch([-1.0, -2.0, -3.0], [-1.0, -2.5, -3.0])  # d = 0, 0.5, 0
    assert m["tokens"] == 3
    assert m["mean_abs"] == pytest.approx(0.5 / 3)
    assert m["p99_abs"] == pytest.approx(0.49)  # linear between the sorted |d| 0 and 0.5 at rank 1.98
    assert m["max_abs"] == 0.5 and m["mean"] == pytest.approx(0.5 / 3)
    assert m["k3"] == pytest.approx((math.exp(0.5) - 1.5) / 3)


def test_k3_is_zero_only_for_equal_logprobs_and_near_half_d_squared(bench):
    assert bench.mismatch([-1.2, -0.3], [-1.2, -0.3])["k3"] == 0.0
    for d in (1e-3, -1e-3, 0.7, -0.7):
        k3 = bench.mismatch([-1.0 + d], [-1.0])["k3"]
        assert k3 > 0
    assert bench.mismatch([-1.0 + 1e-3], [-1.0])["k3"] == pytest.approx(0.5e-6, rel=1e-2)


def test_mismatch_refuses_bad_input(bench):
    with pytest.raises(ValueError, match="3 trainer logprobs against 2"):
        bench.mismatch([0.0, 0.0, 0.0], [0.0, 0.0])
    with pytest.raises(ValueError, match="no tokens"):
        bench.mismatch([], [])
    with pytest.raises(ValueError, match="not finite"):
        bench.mismatch([float("-inf")], [-1.0])


def test_trainer_logprobs_are_the_generated_tokens_under_the_model(bench):
    model = tiny_model()
    r = GenerationResult("x", prompt_ids=[3, 5, 7], output_ids=[11, 2], finish_reason="length")
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([[3, 5, 7, 11]])).logits[0].float(), -1)
    assert bench.trainer_logprobs(model, [r, r]) == pytest.approx([logp[2, 11].item(), logp[3, 2].item()] * 2)


def test_engine_run_matches_the_trainer_in_float32_not_in_bfloat16(bench):
    """The script's own embedded-engine phase: float32 rollouts agree with the trainer to float
    rounding, bfloat16 ones visibly less; fresh prompts per batch, every timed token counted."""
    model = tiny_model()
    args = bench.parse_args(["--batch", "1,3", "--new-tokens", "6", "--prompt-len", "5", "--repeats", "2"])
    ps = prompts(3 + 4 * 2, seed=2, min_len=5, max_len=5)
    rounds = [{1: [3], 3: [4, 5, 6]}, {1: [7], 3: [8, 9, 10]}]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6)
    found = {}
    for dtype in ("float32", "bfloat16"):
        figures, results = asyncio.run(bench.run_engine(model, dtype, args, rounds, [0, 1, 2], ps, sampling))
        assert len(results) == 8 and figures["generated_tokens"] == 8 * 6
        assert [r.prompt_ids for r in results] == [ps[i] for i in (3, 4, 5, 6, 7, 8, 9, 10)]
        assert figures["tps_b1"] > 0 and figures["tps_b3"] > 0
        found[dtype] = bench.mismatch(bench.trainer_logprobs(model, results), [lp for r in results for lp in r.logprobs])
    assert found["float32"]["mean_abs"] < 1e-5
    assert found["bfloat16"]["mean_abs"] > 10 * found["float32"]["mean_abs"]


@pytest.mark.parametrize("argv, message", [
    (["--dtypes", "float16"], "--dtypes"),
    (["--batch", "1,0"], "--batch sizes must be >= 1"),
    (["--batch", "1,x"], "comma-separated integers"),
    (["--new-tokens", "0"], "--new-tokens must be >= 1"),
    (["--model", "/nowhere", "--set", "hidden_size=64"], "--set shapes the model the script makes"),
])
def test_bad_arguments_stop_with_the_cause(bench, capsys, argv, message):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    assert message in capsys.readouterr().err


def test_a_model_vllm_cannot_run_is_refused_before_any_server_starts(bench, tmp_path):
    with pytest.raises(SystemExit, match="not a checkpoint directory"):
        asyncio.run(bench.run(bench.parse_args(["--model", str(tmp_path)])))
    with pytest.raises(SystemExit, match="head_dim >= 32"):
        asyncio.run(bench.run(bench.parse_args(["--set", "head_dim=16", "--set", "hidden_size=64",
                                                "--set", "num_hidden_layers=1", "--dtypes", "float32"])))


@pytest.mark.vllm
@pytest.mark.slow
def test_the_script_against_live_float32_vllm(bench, capsys):
    require_vllm()
    code = bench.main(["--json", "--set", "hidden_size=64", "--set", "num_hidden_layers=2", "--set", "head_dim=32",
                       "--set", "intermediate_size=192", "--set", "moe_intermediate_size=32", "--dtypes", "float32",
                       "--batch", "1,2", "--new-tokens", "8", "--repeats", "1"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["float32_check"] == "ok"
    run = out["dtypes"]["float32"]
    for name in ("engine", "vllm"):
        assert run[name]["mismatch"]["tokens"] > 0 and run[name]["mismatch"]["mean_abs"] < bench.FLOAT32_BAR
        assert run[name]["tps_b1"] > 0 and run[name]["tps_b2"] > 0
    assert run["vllm"]["start_s"] > 0 and set(run["vllm_vs_engine"]) == {"b1", "b2"}
    text = bench.report(out)
    assert "float32 vLLM mean |d|" in text and text.rstrip().endswith("ok")
