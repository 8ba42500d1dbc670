"""benchmarks/gpu_check.sh, issue 20's GPU check, run small on the CPU (GPU_CHECK_DEVICE=cpu):
--prepare-model casts a model with MTP modules to bfloat16 beside its tokenizer and prompts, and
the check runs every step (decode.py at batch 16 and 64, speculative decoding on that model,
pretrain.py) to JSON files and a summary. The GPU itself is never reached here: what this
proves is the plumbing a session with a GPU would otherwise debug on its few device minutes."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import torch

from opencomposer.model import load_pretrained, save_pretrained
from opencomposer.model.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "engine"))
from engine_util import draftable_model  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def cpu_env(tmp_path: Path, decode_args: str) -> dict:
    """The script's environment for a small CPU run: its folders under tmp_path, the tiny pretraining config."""
    return {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_DIR": str(tmp_path / "gpu"), "OUT": str(tmp_path / "out"),
            "GPU_CHECK_DEVICE": "cpu", "GPU_CHECK_PRETRAIN_CONFIG": "configs/pretrain/tiny.yaml",
            "GPU_CHECK_DECODE_ARGS": decode_args}


def test_the_gpu_check_runs_every_step_on_a_cpu(tmp_path):
    tok = Tokenizer.load(ROOT / "opencomposer" / "model" / "assets" / "tokenizer-4k.json")
    model_dir = tmp_path / "model"
    save_pretrained(draftable_model(0, vocab_size=tok.vocab_size), model_dir, tokenizer=tok)
    rng = random.Random(0)
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([[rng.randrange(tok.vocab_size) for _ in range(24)] for _ in range(64)]))
    env = cpu_env(tmp_path, "--new-tokens 6 --repeats 1 --prompt-len 24 --random-config "
                            '{"hidden_size":64,"moe_intermediate_size":64,"num_hidden_layers":2}')

    prep = subprocess.run(["bash", SCRIPT, "--prepare-model", model_dir, prompts], env=env, capture_output=True,
                          text=True, timeout=120)
    assert prep.returncode == 0, prep.stderr
    deep = tmp_path / "gpu" / "deep"
    carried = load_pretrained(deep)
    assert next(carried.parameters()).dtype == torch.bfloat16 and carried.config.num_mtp_modules == 2
    assert Tokenizer.load(deep).vocab_size == tok.vocab_size and (deep / "prompts.json").is_file()

    run = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    out = tmp_path / "out"
    decode = {b: json.loads((out / f"decode_b{b}.json").read_text()) for b in (16, 64)}
    # Batch 64 on this CPU: one row of 64 parts from transformers at its 6th token, where float64
    # picks the engine's token (logit margin 0.045); so the count is checked, not all 64.
    for b, d in decode.items():
        same, rows = map(int, d[f"same_outputs_b{b}"].split("/"))
        assert d["batch"] == b == rows and same >= b - 2 and d["same_outputs_b1"] == "1/1"
    for b in (16, 64):
        d = json.loads((out / f"deep_b{b}.json").read_text())
        assert d["spec_depth"] == 2 and d["oracle_acceptance"] > 0.5
        assert all(d[f"{tag}_same_as_plain_b{x}"] for tag in ("spec", "oracle", "turns_spec") for x in (1, b))
    pretrain = json.loads((out / "pretrain.json").read_text())
    assert pretrain["config"] == "configs/pretrain/tiny.yaml" and pretrain["tokens_per_s"] > 0
    summary = run.stdout
    for line in ("decode_b16: cpu: engine", "decode_b64: cpu: engine", "deep_b16 oracle (depth 2)",
                 "deep_b64 turns_spec (depth 2)", "pretrain: configs/pretrain/tiny.yaml on cpu"):
        assert line in summary, summary


def test_a_failing_step_is_reported_and_the_others_still_run(tmp_path):
    run = subprocess.run(["bash", SCRIPT], env=cpu_env(tmp_path, "--batch 0"), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 1
    assert "decode_b16: FAILED" in run.stdout and "decode_b64: FAILED" in run.stdout
    assert "deep model: none in" in run.stdout and "pretrain: done" in run.stdout
    assert run.stdout.rstrip().endswith("failed: decode_b16 decode_b64")
