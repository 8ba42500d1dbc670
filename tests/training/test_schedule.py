"""The shared lr schedule: what pretraining, SFT and the RL trainer log as `lr` step by step."""

import math

import pytest

from opencomposer.training.schedule import warmup_cosine_lr


def test_warm_up_is_linear_and_reaches_the_peak_on_its_last_step():
    assert [warmup_cosine_lr(1.0, s, 4, 10, 0.1) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]


def test_cosine_starts_at_the_peak_and_ends_at_the_floor_on_the_last_step():
    lrs = [warmup_cosine_lr(2.0, s, 2, 12, 0.1) for s in range(12)]
    assert lrs[2] == 2.0 and lrs[-1] == pytest.approx(0.2)
    assert all(a > b for a, b in zip(lrs[2:], lrs[3:]))  # strictly decreasing after the warm-up
    assert lrs[7] == pytest.approx(0.2 + 1.8 * 0.5 * (1 + math.cos(math.pi * 5 / 9)))


def test_steps_past_the_end_stay_at_the_floor():
    assert warmup_cosine_lr(1.0, 50, 0, 10, 0.25) == pytest.approx(0.25)
