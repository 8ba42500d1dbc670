"""benchmarks/reward21_seeds.py at a miniature size: one SFT checkpoint per seed, two RL arms from
copies of it (correctness-only and the full reward), and the comparison the issue asks for."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_pipeline import MINI

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_both_arms_start_from_the_same_sft_checkpoint_and_are_compared(tmp_path):
    sets = [x for o in [*MINI, "run.train_threads=1"] for x in ("--set", o)]
    # the penalty charged to every rollout (the default: successes only): a miniature run may have no success
    out = subprocess.run([sys.executable, "benchmarks/reward21_seeds.py", "--seeds", "3", "--out", str(tmp_path),
                          "--jobs", "2", *sets, "--full", "rl.length_scope=all", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    (run,) = result["runs"]
    a, f = run["correctness"], run["full"]
    assert a["sft_success"] == f["sft_success"]  # one SFT checkpoint, evaluated once
    base = tmp_path / "seed3" / "base" / "sft" / "model" / "model-00001-of-00001.safetensors"
    for arm in ("correctness", "full"):
        assert (tmp_path / "seed3" / arm / "sft" / "model" / "model-00001-of-00001.safetensors").read_bytes() == base.read_bytes()
        assert (tmp_path / "seed3" / arm / "report" / "efficiency.png").is_file()
    cfg = {arm: (tmp_path / "seed3" / arm / "pipeline.yaml").read_text() for arm in ("correctness", "full")}
    assert "length_coef: 0.0\n" in cfg["correctness"] and "length_coef: 0.0015\n" in cfg["full"]
    assert "zero_failed_groups: true" in cfg["full"] and "two_file_rate: 0.5" in cfg["correctness"]
    assert a["penalty_share"]["first"] == 0 and f["penalty_share"]["first"] > 0
    c = run["compare"]
    assert c["full_minus_correctness_points"] == pytest.approx(100 * (f["rl_success"] - a["rl_success"]))
    assert set(result["summary"]) >= {"full_lift_points", "turns_reduction", "parallel_read_full",
                                      "parallel_solved_of_two_file_full", "effort_saved_share_easy"}
    hard = f["efficiency"]["rl"]["hard"]
    if hard["parallel_read_frac"] is not None:  # over every two-file task, not only the solved ones
        assert c["parallel_solved_of_two_file"]["full"] == pytest.approx(
            hard["parallel_read_frac"] * hard["solved"] / hard["episodes"])


def test_the_full_reward_config_file_is_the_benchmarks_full_arm():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from reward21_seeds import FULL, MIX

    from opencomposer.pipeline import load_config

    path = ROOT / "configs" / "demo" / "pipeline_full_reward.yaml"
    assert load_config(path) == load_config(None, [*MIX, *FULL, "run.out_dir=runs/demo-full-reward"])
