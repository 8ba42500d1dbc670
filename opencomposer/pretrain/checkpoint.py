"""Pretraining checkpoints: an HF model directory plus the trainer state, written atomically.

    <run_dir>/checkpoints/step_0000300/
        model/          config.json + safetensors + tokenizer files with the chat template,
                        generation_config.json (save_pretrained(tokenizer=...)): servable as is
        trainer.pt      step, optimizer state, data cursor, RNG states, the model config before extension
        config.yaml     the resolved run config

A checkpoint is assembled in a hidden `.tmp-step_N` directory and renamed into place, so a
run killed while saving leaves the previous checkpoint intact and `latest_checkpoint` never
sees a half-written one. Under FSDP2 the full model and optimizer state are gathered to
rank 0 (torch.distributed.checkpoint.state_dict, offloaded to CPU); rank 0 writes. Left out:
sharded (per-rank) checkpoints for models too large to gather on one host.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from opencomposer.errors import CheckpointError
from opencomposer.model import Transformer, save_pretrained
from opencomposer.model.tokenizer import Tokenizer

_STEP_DIR = re.compile(r"step_(\d+)")
TRAINER_STATE = "trainer.pt"


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The complete checkpoint with the highest step, or None."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return None
    done = [(int(m[1]), p) for p in root.iterdir()
            if (m := _STEP_DIR.fullmatch(p.name)) and (p / TRAINER_STATE).is_file()]
    return max(done)[1] if done else None


def full_state(runner: nn.Module, optimizer: torch.optim.Optimizer,
               sharded: bool) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
    """(gathered model state dict with Transformer names, or None when not sharded; optimizer state
    dict). A collective under FSDP: every rank calls it."""
    if not sharded:
        return None, optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd = get_model_state_dict(runner, options=opts)
    osd = get_optimizer_state_dict(runner, optimizer, options=opts)
    return {k.removeprefix("model."): v for k, v in msd.items()}, osd


def load_optimizer_state(runner: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any],
                         sharded: bool) -> None:
    if not sharded:
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(runner, optimizer, state, options=StateDictOptions(full_state_dict=True))


def save_checkpoint(run_dir: str | Path, step: int, model: Transformer, gathered: dict[str, torch.Tensor] | None,
                    trainer_state: dict[str, Any], config_yaml: str, tokenizer: Tokenizer, keep: int) -> Path:
    """Write checkpoint `step` (rank 0 only) and delete all but the `keep` newest. `gathered`: the
    full state dict when `model` is sharded (FSDP), else None."""
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:07d}"
    tmp = root / f".tmp-{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if gathered is not None:  # FSDP: save the gathered copy through a plain, unsharded model
        with torch.device("meta"):
            plain = Transformer(model.config)
        plain.load_state_dict(gathered, assign=True)
        plain.inv_freq, plain.rope_scale = model.inv_freq, model.rope_scale
        model = plain
    save_pretrained(model, tmp / "model", tokenizer=tokenizer)  # + chat template, generation config
    torch.save(trainer_state, tmp / TRAINER_STATE)
    (tmp / "config.yaml").write_text(config_yaml)
    if final.exists():  # only when a run is asked to save the same step twice
        shutil.rmtree(final)
    os.replace(tmp, final)
    steps = sorted((int(m[1]), p) for p in root.iterdir() if (m := _STEP_DIR.fullmatch(p.name)))
    for _, old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    try:
        return torch.load(checkpoint / TRAINER_STATE, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError) as e:
        raise CheckpointError(f"{checkpoint / TRAINER_STATE} cannot be read ({e}); delete {checkpoint} "
                              f"to resume from the checkpoint before it") from e


def publish_model(checkpoint: Path, dest: Path) -> None:
    """Copy the checkpoint's model directory to `dest` (the run's final model), replacing it atomically."""
    tmp = dest.with_name(f".tmp-{dest.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(checkpoint / "model", tmp)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
