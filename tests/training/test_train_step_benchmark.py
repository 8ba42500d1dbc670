"""benchmarks/train_step.py runs against today's trainer and SFT step (its SFT path once broke
unnoticed when the step began to read the run's device)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_sft_step_figure_comes_back_in_each_dtype(dtype):
    out = subprocess.run([sys.executable, "benchmarks/train_step.py", "--only", "sft", "--repeats", "1",
                          "--sft-threads", "1", "--dtype", dtype, "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["dtype"] == dtype and "rl" not in result
    sft = result["sft"]
    assert sft["threads"] == 1 and len(sft["steps_s"]) == 1 and sft["step_s"] > 0
    assert sft["tokens"] > sft["targets"] > 0   # the batch's examples, of which the trained tokens a part
