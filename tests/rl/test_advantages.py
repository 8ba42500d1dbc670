"""Dr. GRPO and GRPO advantages on small groups, computed by hand."""

import pytest
import torch

from opencomposer.rl.advantages import AdvantageConfig, compute_advantages, degenerate_groups

GRPO = AdvantageConfig(estimator="grpo")


def test_dr_grpo_is_reward_minus_group_mean():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.2, 0.4, 0.6, 0.8]])
    a = compute_advantages(r)  # default estimator
    torch.testing.assert_close(a, torch.tensor([[0.5, -0.5, -0.5, 0.5], [-0.3, -0.1, 0.1, 0.3]]))


def test_grpo_divides_by_sample_std_plus_eps():
    # group 1: mean 0.5, Σ(dev²) = 1, sample var 1/3, std 0.57735; 0.5/(0.57735 + 1e-4) = 0.86588
    # group 2: mean 0.5, Σ(dev²) = 0.2, sample var 0.0667, std 0.258199; 0.3/(std+1e-4) = 1.161445
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.2, 0.4, 0.6, 0.8]], dtype=torch.float64)
    a = compute_advantages(r, GRPO)
    expected = torch.tensor([[0.86587581, -0.86587581, -0.86587581, 0.86587581],
                             [-1.16144518, -0.38714839, 0.38714839, 1.16144518]], dtype=torch.float64)
    torch.testing.assert_close(a, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("cfg", [AdvantageConfig(), GRPO])
def test_all_equal_group_gives_exactly_zero(cfg):
    r = torch.tensor([[0.1, 0.1, 0.1], [1.0, 0.0, 0.0]])
    a = compute_advantages(r, cfg)
    assert torch.equal(a[0], torch.zeros(3))
    assert a[1, 0] > 0
    torch.testing.assert_close(degenerate_groups(r), torch.tensor([[True] * 3, [False] * 3]))


def test_flat_rewards_with_ragged_groups():
    r = torch.tensor([1.0, 0.0, 5.0, 3.0, 7.0, 2.0])
    ids = torch.tensor([10, 10, 3, 3, 3, 99])  # group 99 has one member: zero advantage
    torch.testing.assert_close(compute_advantages(r, group_ids=ids), torch.tensor([0.5, -0.5, 0.0, -2.0, 2.0, 0.0]))
    # GRPO: group 10 std √0.5 → 0.5/(0.707107+1e-4) = 0.707007; group 3 std 2 → 2/2.0001 = 0.999950
    torch.testing.assert_close(compute_advantages(r, GRPO, ids),
                               torch.tensor([0.707007, -0.707007, 0.0, -0.999950, 0.999950, 0.0]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(degenerate_groups(r, ids), torch.tensor([False] * 5 + [True]))


def test_integer_rewards_are_promoted_and_shapes_checked():
    a = compute_advantages(torch.tensor([[1, 0]]))
    assert a.is_floating_point()
    torch.testing.assert_close(a, torch.tensor([[0.5, -0.5]]))
    with pytest.raises(ValueError, match="n_groups, G"):
        compute_advantages(torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="group_ids"):
        compute_advantages(torch.tensor([1.0, 0.0]), group_ids=torch.tensor([0]))
