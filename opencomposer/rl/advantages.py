"""Group-relative advantages: Dr. GRPO (the default, as in Composer 2) and GRPO.

G rollouts of the same task form a group; each rollout's advantage compares its reward with
the group's, so no value network is needed.

    Dr. GRPO [Liu et al. 2025, arXiv 2503.20783]:  A_i = r_i − mean_j r_j
    GRPO     [Shao et al. 2024, arXiv 2402.03300]: A_i = (r_i − mean_j r_j) / (std_j r_j + eps)

Composer 2 [R §4] uses Dr. GRPO: no division by the std (which up-weights groups that are
nearly all right or all wrong, a difficulty bias) and no length normalisation (that half of
Dr. GRPO lives in the loss aggregation, losses.aggregate). GRPO's paper does not say which
std; we use the sample std (Bessel, n − 1) and eps = 1e-4, as TRL's GRPOTrainer does
(`rewards.view(-1, G).std(dim=1)`, i.e. torch's default unbiased std).

A group whose rewards are all equal carries no signal: its advantages are exactly zero (set
explicitly, so rounding in the mean cannot leave ±1e-8 residues that GRPO's 1/eps would blow
up). Such groups are kept by default: the report filters nothing, they add no policy gradient,
and with the length penalty in the reward they are rare (rewards almost never tie exactly).
`degenerate_groups` finds them, for a metric or for a buffer that wants to drop them to save
trainer compute.

Covered: equal-size groups as an [n_groups, G] tensor, and ragged groups (e.g. after a
crashed rollout) as flat rewards + group ids. Left out: leave-one-out baselines (RLOO),
per-token advantages (rewards here are per trajectory; broadcast them over tokens).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from opencomposer.config import Section


class AdvantageConfig(Section):
    """How rewards become advantages."""

    estimator: Literal["dr_grpo", "grpo"] = "dr_grpo"
    """"dr_grpo": r − group mean (Composer 2); "grpo": (r − mean)/(sample std + eps)."""
    std_eps: float = Field(1e-4, gt=0)
    """eps added to the group std for "grpo" (TRL's value)."""
    zero_failed_groups: bool = False
    """True: a group in which no rollout earned any correctness gets advantage 0 for all its
    rollouts (rl.trainer.trajectory_advantages). In such a group the length and tool-error
    penalties are the only differences, and they rank the cheapest failure (answering without
    a tool call) best: the quitting collapse of issue 21 (benchmarks/reward21_collapse.py).
    The reward itself is unchanged; only where the penalty may move the policy. OURS."""


def _group_index(rewards: torch.Tensor, group_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten to rewards_N and a dense group index gid_N in [0, n_groups)."""
    if group_ids is None:
        if rewards.dim() != 2:
            raise ValueError(f"rewards must be [n_groups, G] when group_ids is not given, got shape {tuple(rewards.shape)}")
        n, g = rewards.shape
        return rewards.reshape(-1), torch.arange(n, device=rewards.device).repeat_interleave(g)
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(f"flat rewards [N] need group_ids [N], got {tuple(rewards.shape)} and {tuple(group_ids.shape)}")
    _, gid_N = torch.unique(group_ids.to(rewards.device), return_inverse=True)
    return rewards, gid_N


def degenerate_groups(rewards: torch.Tensor, group_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Bool mask, shaped like `rewards`: True where the rollout's group has all-equal rewards (or one member)."""
    r_N, gid_N = _group_index(rewards, group_ids)
    n = int(gid_N.max()) + 1 if gid_N.numel() else 0
    hi = torch.full((n,), -torch.inf, dtype=r_N.dtype, device=r_N.device).scatter_reduce(0, gid_N, r_N, "amax")
    lo = torch.full((n,), torch.inf, dtype=r_N.dtype, device=r_N.device).scatter_reduce(0, gid_N, r_N, "amin")
    return (hi == lo)[gid_N].reshape(rewards.shape)


def compute_advantages(rewards: torch.Tensor, cfg: AdvantageConfig = AdvantageConfig(),
                       group_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Advantages shaped like `rewards`: [n_groups, G], or [N] with group_ids [N] (any ids, ragged sizes).

    Dr. GRPO: A_i = r_i − mean(group). GRPO: A_i = (r_i − mean)/(std + eps), std with n − 1.
    Exactly 0 for every member of a group with all-equal rewards (including groups of one).
    """
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    r_N, gid_N = _group_index(rewards, group_ids)
    n = int(gid_N.max()) + 1 if gid_N.numel() else 0
    zeros_n = torch.zeros(n, dtype=r_N.dtype, device=r_N.device)
    count_n = zeros_n.index_add(0, gid_N, torch.ones_like(r_N))
    mean_n = zeros_n.index_add(0, gid_N, r_N) / count_n
    adv_N = r_N - mean_n[gid_N]
    if cfg.estimator == "grpo":
        var_n = zeros_n.index_add(0, gid_N, adv_N**2) / (count_n - 1).clamp(min=1)
        adv_N = adv_N / (var_n.sqrt()[gid_N] + cfg.std_eps)
    adv_N = adv_N.masked_fill(degenerate_groups(r_N, gid_N), 0.0)
    return adv_N.reshape(rewards.shape)
