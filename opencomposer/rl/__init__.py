"""Asynchronous RL as in Composer 2: rewards, advantages and losses (the formula layer).

rewards.py (correctness + auxiliary − λ·C(effort) − β·KL), advantages.py (Dr. GRPO, GRPO),
losses.py (KL estimators, clipped token loss with off-policy correction, aggregation).
Rollouts, the buffer, the orchestrator, the trainer and weight sync build on these.
See docs/rl-algorithm.md for each formula, its source and our defaults.
"""

from opencomposer.rl.advantages import AdvantageConfig, compute_advantages, degenerate_groups
from opencomposer.rl.losses import PolicyLossConfig, aggregate, kl, kl_in_loss, kl_in_reward, policy_loss
from opencomposer.rl.rewards import (EffortWeights, RewardBreakdown, RewardConfig, RewardInputs,
                                     broadcast_to_segments, compute_reward, length_penalty)

__all__ = [
    "AdvantageConfig", "compute_advantages", "degenerate_groups",
    "PolicyLossConfig", "aggregate", "kl", "kl_in_loss", "kl_in_reward", "policy_loss",
    "EffortWeights", "RewardBreakdown", "RewardConfig", "RewardInputs", "broadcast_to_segments",
    "compute_reward", "length_penalty",
]
