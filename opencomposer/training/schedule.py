"""The learning-rate schedule of every trainer: linear warm-up, then a cosine decay to a floor.

Pretraining phases, SFT and the RL trainer (when `train.max_steps` is set) all use it, so a
step's lr is one formula wherever it is logged. Left out: schedules with restarts or a
constant plateau before the decay (the RL trainer's constant-after-warm-up case is its own
choice, made before calling this).
"""

from __future__ import annotations

import math


def warmup_cosine_lr(lr: float, step: int, warmup_steps: int, steps: int, min_lr_ratio: float) -> float:
    """The lr of step `step` (0-based) of `steps`: linear warm-up, then cosine to lr * min_lr_ratio
    at the last step."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    span = max(steps - 1 - warmup_steps, 1)
    progress = min((step - warmup_steps) / span, 1.0)
    floor = lr * min_lr_ratio
    return floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))
