"""Length penalty and reward breakdown against hand-computed values."""

import math

import numpy as np
import pytest
import torch

from opencomposer.rl.rewards import (EffortWeights, RewardConfig, RewardInputs, broadcast_to_segments,
                                     compute_reward, length_penalty)


@pytest.mark.parametrize("x, k, q, expected", [
    (123.0, 0.01, 0.0, 123.0),                  # q = 0: ((1+kx) − 1)/k = x, linear
    (3.0, 1.0, 0.5, 2.0),                       # (√4 − 1)/0.5
    (16.0, 0.5, 0.5, 8.0),                      # (√9 − 1)/(0.5·0.5)
    (3.0, 1.0, 1.0, 1.3862943611198906),        # q = 1: log(4)/1
    (1.0, 1.0, 2.0, 0.5),                       # (2^−1 − 1)/(1·(−1))
    (2.0, 0.5, 2.0, 1.0),                       # (2^−1 − 1)/(0.5·(−1))
    (1.0, 1.0, 3.0, 0.375),                     # (2^−2 − 1)/(−2)
    (0.0, 0.3, 0.7, 0.0),                       # C(0) = 0
    (0.0, 2.0, 1.0, 0.0),
])
def test_length_penalty_hand_values(x, k, q, expected):
    assert length_penalty(x, k, q) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_length_penalty_is_continuous_through_q_equal_one():
    # The textbook form ((1+kx)^(1−q) − 1)/(k(1−q)) loses ~3 digits at |1−q| = 1e-13; ours does not.
    for q in (1 - 1e-13, 1 + 1e-13, 1 - 1e-9, 1 + 1e-9):
        assert length_penalty(3.0, 1.0, q) == pytest.approx(math.log(4), rel=1e-8)


def test_length_penalty_above_one_is_bounded_by_one_over_k_q_minus_one():
    assert length_penalty(1e12, 1.0, 2.0) == pytest.approx(1.0, rel=1e-9)  # 1/(k(q−1))
    assert length_penalty(100.0, 0.5, 3.0) == pytest.approx(2600 / 2601)   # (51^−2 − 1)/(0.5·(−2)) < 1/(0.5·2)


@pytest.mark.parametrize("q", [0.0, 0.3, 1.0, 2.0])
def test_length_penalty_is_increasing_and_concave_for_positive_q(q):
    x = np.linspace(0.0, 5000.0, 201)
    c = length_penalty(x, 1e-3, q)
    d1 = np.diff(c)
    assert np.all(d1 > 0)
    if q > 0:
        assert np.all(np.diff(d1) < 0)
    else:
        np.testing.assert_allclose(c, x, rtol=1e-12)


def test_length_penalty_derivative_is_one_plus_kx_to_minus_q():
    x = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    length_penalty(x, 1.0, 0.5).backward()
    assert x.grad.item() == pytest.approx(0.5)  # 4^−0.5


def test_length_penalty_returns_the_input_kind():
    assert type(length_penalty(3.0, 1.0, 0.5)) is float
    assert type(length_penalty(3, 1.0, 0.5)) is float
    a = length_penalty(np.array([[0.0, 3.0]]), 1.0, 0.5)
    assert isinstance(a, np.ndarray) and a.shape == (1, 2)
    np.testing.assert_allclose(a, [[0.0, 2.0]])
    ai = length_penalty(np.array([0, 3]), 1.0, 1.0)
    assert ai.dtype == np.float64 and ai[1] == pytest.approx(math.log(4))
    t = length_penalty(torch.tensor([0.0, 3.0]), 1.0, 0.5)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
    torch.testing.assert_close(t, torch.tensor([0.0, 2.0]))
    ti = length_penalty(torch.tensor([0, 16]), 0.5, 0.5)
    assert ti.is_floating_point() and ti[1].item() == pytest.approx(8.0)


@pytest.mark.parametrize("x, k, q, match", [
    (1.0, 0.0, 0.5, "k must be"),
    (1.0, -1.0, 0.5, "k must be"),
    (1.0, 1.0, -0.1, "q must be"),
    (-1.0, 1.0, 0.5, "x must be"),
    (np.array([1.0, -0.5]), 1.0, 0.5, "x must be"),
    (torch.tensor([1.0, -0.5]), 1.0, 1.0, "x must be"),
])
def test_length_penalty_rejects_bad_arguments(x, k, q, match):
    with pytest.raises(ValueError, match=match):
        length_penalty(x, k, q)


def _inputs(**kw):
    base = dict(thinking_tokens=4, tool_call_tokens=2, tool_output_tokens=4, final_message_tokens=1,
                tool_calls=2, turns=1, failed_tool_calls=2, malformed_tool_calls=1, unfinished_todos=1, resolved=True)
    base.update(kw)
    return RewardInputs(**base)


def _cfg(**kw):
    base = dict(length_coef=0.01, length_k=0.5, length_q=0.5, kl_coef=0.001,
                effort=EffortWeights(thinking_tokens=1, tool_call_tokens=1, tool_output_tokens=0.5,
                                     final_message_tokens=1, tool_calls=2, turns=3))
    base.update(kw)
    return RewardConfig(**base)


def test_compute_reward_itemises_every_term():
    # x = 4 + 2 + 0.5·4 + 1 + 2·2 + 3·1 = 16; C(16; k=0.5, q=0.5) = 8; −λ·C = −0.08
    # aux = −0.01·2 − 0.05·1 − 0.05·1 = −0.12; KL: −0.001·20 = −0.02
    b = compute_reward(_inputs(), _cfg(), kl_sum=20.0)
    assert b.effort == pytest.approx(16.0)
    assert b.correctness == 1.0
    assert b.failed_tool_calls == pytest.approx(-0.02)
    assert b.malformed_tool_calls == pytest.approx(-0.05)
    assert b.unfinished_todos == pytest.approx(-0.05)
    assert b.auxiliary == pytest.approx(-0.12)
    assert b.length_penalty == pytest.approx(-0.08)
    assert b.kl == pytest.approx(-0.02)
    assert b.total == pytest.approx(0.78)
    d = b.as_dict()
    assert d["reward/total"] == b.total and d["reward/length_penalty"] == b.length_penalty


def test_unresolved_rollout_gets_no_correctness_and_more_effort_costs_more():
    short = compute_reward(_inputs(resolved=False), _cfg())
    long = compute_reward(_inputs(resolved=False, thinking_tokens=400), _cfg())
    assert short.correctness == 0.0
    assert long.total < short.total


def test_auxiliary_penalty_is_capped():
    b = compute_reward(_inputs(malformed_tool_calls=100), _cfg(max_auxiliary_penalty=0.5))
    assert b.malformed_tool_calls == pytest.approx(-5.0)
    assert b.auxiliary == pytest.approx(-0.5)


def test_tests_passed_correctness_uses_the_fraction():
    b = compute_reward(_inputs(resolved=False, tests_passed_fraction=0.25),
                       _cfg(correctness="tests_passed", correctness_weight=2.0))
    assert b.correctness == pytest.approx(0.5)
    with pytest.raises(ValueError, match="tests_passed_fraction"):
        compute_reward(_inputs(), _cfg(correctness="tests_passed"))


def test_reward_config_rejects_bad_values_and_unknown_fields():
    with pytest.raises(ValueError):
        RewardConfig(length_k=0.0)
    with pytest.raises(ValueError):
        RewardConfig(lenght_coef=0.1)
    assert "OURS" in RewardConfig.model_fields["length_coef"].description


def test_broadcast_to_segments_gives_each_segment_its_trajectory_value():
    assert broadcast_to_segments([1.0, -0.5], [0, 0, 1, 0]) == [1.0, 1.0, -0.5, 1.0]
    out = broadcast_to_segments(torch.tensor([1.0, -0.5]), torch.tensor([1, 0, 1]))
    torch.testing.assert_close(out, torch.tensor([-0.5, 1.0, -0.5]))


def test_length_scope_correct_charges_successes_only_and_never_below_a_failure():
    """length_scope "correct": −c·min(λ·C(x), w_c). A failure has no length term whatever its
    effort; a success keeps the whole term until it would reach w_c, where it is capped."""
    all_ = _cfg()
    scoped = _cfg(length_scope="correct")
    win = compute_reward(_inputs(), scoped)
    assert win.length_penalty == pytest.approx(compute_reward(_inputs(), all_).length_penalty) == pytest.approx(-0.08)
    short, long = (compute_reward(_inputs(resolved=False, thinking_tokens=n), scoped) for n in (4, 400))
    assert short.length_penalty == long.length_penalty == 0.0 and short.total == long.total
    huge = compute_reward(_inputs(thinking_tokens=10**9), _cfg(length_scope="correct", length_coef=1.0))
    assert huge.length_penalty == pytest.approx(-1.0)
    assert huge.correctness + huge.length_penalty >= short.correctness + short.length_penalty
    half = compute_reward(_inputs(tests_passed_fraction=0.5), _cfg(length_scope="correct", correctness="tests_passed"))
    assert half.length_penalty == pytest.approx(-0.04)
