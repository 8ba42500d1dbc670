"""Seeded runs give the same metrics and the same final weights, bit for bit, as when
tests/golden_runs.json was written: the guard for refactors that must not change behaviour.

Four runs, each through its CLI command as a user starts it, one thread, seeded:
- single-turn RL: configs/rl/single_turn_tiny.yaml, 3 steps;
- agentic RL, local runner: configs/rl/agentic_tiny.yaml, 2 steps, synchronous (max_staleness
  0), one rollout worker and one engine slot (the engine's logprobs are only bit-exact at a
  fixed batch composition; its sampled tokens are seeded per request either way);
- pretraining: the tiny MoE+MTP model, 6 main steps and 2 context-extension steps, on a corpus
  this test writes (so the figures do not depend on the machine's Python installation);
- SFT: configs/sft/tiny.yaml's optimiser and MTP loss, 6 steps over three epochs of 10 examples
  with 2 held out, from a tiny random MoE+MTP model and read-edit trajectories this test writes
  (no sandbox, so nothing depends on the machine's tools).

Timing metrics are left out. A change that is meant to move these figures must say why in
its commit and rewrite the file: OPENCOMPOSER_WRITE_GOLDEN=1 pytest tests/test_golden_runs.py
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.numpy import load_file

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).with_name("golden_runs.json")
WRITE = os.environ.get("OPENCOMPOSER_WRITE_GOLDEN") == "1"
_TIMING = ("time", "seconds", "per_s", "tokens/s", "step_s")

pytestmark = pytest.mark.slow


def cli(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "opencomposer.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]


def weights_hash(run_dir: Path) -> str:
    """sha256 over every tensor of the newest checkpoint's model (names, dtypes, shapes, bytes)."""
    ckpt = sorted((run_dir / "checkpoints").glob("step_*[0-9]"))[-1] / "model"
    h = hashlib.sha256()
    for path in sorted(ckpt.glob("*.safetensors")):
        tensors = load_file(path)
        for name in sorted(tensors):
            t = tensors[name]
            h.update(f"{name}:{t.dtype}:{t.shape}".encode())
            h.update(t.tobytes())
    return h.hexdigest()


def metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return [{k: v for k, v in row.items() if not any(t in k for t in _TIMING)} for row in rows]


def corpus(root: Path) -> Path:
    """~300 small, seeded Python files: the pretraining run's data."""
    rng = random.Random(0)
    words = ["value", "items", "count", "total", "index", "name", "result", "data", "key", "node"]
    for i in range(300):
        lines = [f'"""Module {i}."""', ""]
        for j in range(rng.randint(3, 8)):
            a, b = rng.sample(words, 2)
            lines += [f"def {a}_{b}_{j}({a}, {b}={rng.randint(0, 99)}):",
                      f"    {a} = {a} + {b} * {rng.randint(1, 9)}",
                      f"    if {a} > {rng.randint(10, 500)}:",
                      f"        return [{a}, {b}]",
                      f"    return {{'{a}': {a}, '{b}': {b}}}", ""]
        (root / f"mod_{i:03d}.py").write_text("\n".join(lines))
    return root


SFT_MODEL = {"vocab_size": 4096, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 64,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True, "max_position_embeddings": 1024,
             "num_mtp_modules": 1}
SFT_TOOLS = [{"name": name, "description": f"{name} a file", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}}, "required": ["path"]}} for name in ("read_file", "edit_file")]


def sft_model(path: Path) -> Path:
    """A tiny random MoE+MTP model (seeded) with the bundled tokenizer: the SFT run's init_from."""
    import torch

    from opencomposer.model import ModelConfig, Transformer, save_pretrained
    from opencomposer.model.tokenizer import bundled_tokenizer

    torch.manual_seed(0)
    save_pretrained(Transformer(ModelConfig.from_dict(SFT_MODEL)), path)
    bundled_tokenizer().save(path)
    return path


def sft_trajectories(path: Path) -> Path:
    """12 seeded read-edit episodes in the oracle's shape (system, task, read_file, edit_file, answer),
    chat-level, sharing their system turn."""
    rng = random.Random(0)
    lines = []
    for i in range(12):
        name, old, new = f"f{i}", f"a + {rng.randint(1, 9)}", f"a - {rng.randint(1, 9)}"
        source = f"def {name}(a):\n    return {old}\n" + "".join(
            f"\n\ndef g{j}(b):\n    return b * {rng.randint(2, 99)}\n" for j in range(rng.randint(1, 4)))
        messages = [
            {"role": "system", "content": "You fix one bug in a Python module. Read the file, then edit it."},
            {"role": "user", "content": f"{name} in mod_{i}.py returns the wrong value; fix it."},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "read_file",
                                                              "arguments": json.dumps({"path": f"mod_{i}.py"})}}]},
            {"role": "tool", "tool_call_id": "c0", "name": "read_file", "content": source},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "edit_file", "arguments": json.dumps(
                    {"path": f"mod_{i}.py", "old": old, "new": new})}}]},
            {"role": "tool", "tool_call_id": "c1", "name": "edit_file", "content": "ok"},
            {"role": "assistant", "content": "Done."}]
        lines.append(json.dumps({"id": f"t{i}", "task_id": f"task-{i}", "tools": SFT_TOOLS,
                                 "segments": [{"messages": messages}], "stop_reason": "final"}))
    path.write_text("\n".join(lines) + "\n")
    return path


def run_single_turn(tmp: Path) -> dict:
    out = tmp / "single_turn"
    cli("rl", "--config", "configs/rl/single_turn_tiny.yaml", "--set", f"run.out_dir={out}",
        "--set", "train.max_steps=3", "--set", "run.num_threads=1", "--set", "log.progress=false",
        "--set", "log.tensorboard=false")
    return {"weights": weights_hash(out), "metrics": metrics(out)}


def run_agentic(tmp: Path) -> dict:
    out = tmp / "agentic"
    cli("rl", "--config", "configs/rl/agentic_tiny.yaml", "--set", f"run.out_dir={out}",
        "--set", "train.max_steps=2", "--set", "run.num_threads=1", "--set", "log.tensorboard=false",
        "--set", "agentic.max_staleness=0", "--set", "agentic.rollout_workers=1", "--set", "engine.max_slots=1")
    return {"weights": weights_hash(out), "metrics": metrics(out)}


def run_pretrain(tmp: Path) -> dict:
    cfg = yaml.safe_load((ROOT / "configs/pretrain/tiny.yaml").read_text())
    data = corpus(tmp / "corpus")
    cfg["run"].update(out_dir=str(tmp / "pretrain"), num_threads=1)
    cfg.update(checkpoint={"every_steps": 4}, log={"tensorboard": False, "every_steps": 1}, eval_every=4,
               eval_sequences=2)
    cfg["data"] = {"sources": [str(data)], "max_total_bytes": 2_000_000, "val_fraction": 0.05,
                   "cache_dir": str(tmp / "cache")}
    cfg["phases"][0].update(steps=6, batch_size=4)
    cfg["phases"][1].update(steps=2, batch_size=1, seq_len=512)
    cfg["mtp"]["start_step"] = 2
    (tmp / "pretrain.yaml").write_text(yaml.safe_dump(cfg))
    cli("pretrain", "--config", str(tmp / "pretrain.yaml"))
    return {"weights": weights_hash(tmp / "pretrain"), "metrics": metrics(tmp / "pretrain")}


def run_sft(tmp: Path) -> dict:
    out = tmp / "sft"
    cfg = yaml.safe_load((ROOT / "configs/sft/tiny.yaml").read_text())
    cfg["data"] = {"trajectories": [str(sft_trajectories(tmp / "trajectories.jsonl"))], "val_examples": 2,
                   "cache_dir": str(tmp / "sft-cache")}
    cfg.update(steps=6, batch_size=4, eval_every=3, checkpoint={"every_steps": 4}, log={"every_steps": 2})
    cfg["optim"]["warmup_steps"] = 2
    (tmp / "sft.yaml").write_text(yaml.safe_dump(cfg))
    cli("sft", "--config", str(tmp / "sft.yaml"), "--set", f"run.out_dir={out}", "--set", "run.num_threads=1",
        "--set", f"init_from={sft_model(tmp / 'base')}")
    return {"weights": weights_hash(out), "metrics": metrics(out)}


RUNS = {"single_turn": run_single_turn, "agentic": run_agentic, "pretrain": run_pretrain, "sft": run_sft}


@pytest.mark.parametrize("name", list(RUNS))
def test_seeded_run_is_bit_for_bit_what_it_was(name, tmp_path):
    (tmp_path / "corpus").mkdir()
    got = RUNS[name](tmp_path)
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if WRITE:
        golden[name] = got
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    assert name in golden, f"no golden figures for {name}: run with OPENCOMPOSER_WRITE_GOLDEN=1"
    assert got["metrics"] == golden[name]["metrics"]
    assert got["weights"] == golden[name]["weights"]
