"""Issue 21: the quitting collapse, on the real reward and advantage code (benchmarks/reward21_collapse.py)."""

import torch

from benchmarks.reward21_collapse import QUIT, old_penalty_config, simulate, work
from opencomposer.rl.advantages import compute_advantages
from opencomposer.rl.rewards import RewardConfig, compute_reward


def test_all_failing_group_ranks_the_tool_free_failure_best():
    cfg = old_penalty_config()
    rollouts = [work(False), QUIT, work(False), work(False)]
    rewards = torch.tensor([[compute_reward(r, cfg).total for r in rollouts]])
    adv = compute_advantages(rewards)[0]
    assert int(adv.argmax()) == 1 and adv[1] > 0 > adv[0]
    # correctness alone gives such a group no signal at all
    plain = RewardConfig(length_coef=0, failed_tool_call_coef=0, malformed_tool_call_coef=0, kl_coef=0)
    flat = torch.tensor([[compute_reward(r, plain).total for r in rollouts]])
    assert torch.equal(compute_advantages(flat), torch.zeros_like(flat))


def test_penalty_in_every_group_collapses_and_gating_it_does_not():
    cfg = old_penalty_config()  # penalty gap quit vs. failed work ~0.19 > p_solve = 0.1
    collapsed = simulate("all", cfg, p_solve=0.1, steps=200)
    gated = simulate("gated", cfg, p_solve=0.1, steps=200)
    assert collapsed["p_work_end"] < 0.5 < 0.85 < gated["p_work_end"]


def test_the_penalty_on_successes_only_does_not_collapse_either():
    """reward.length_scope "correct": failures are not ranked by length, so the penalty in every
    group (no gating) leaves working as likely as correctness alone does."""
    scoped = old_penalty_config().model_copy(update={"length_scope": "correct"})
    assert compute_reward(QUIT, scoped).length_penalty == compute_reward(work(False), scoped).length_penalty == 0
    assert simulate("all", scoped, p_solve=0.1, steps=200)["p_work_end"] > 0.85


def _sample(reward, group, traj, correct):
    import numpy as np
    from opencomposer.rl.buffer import Sample
    n = 4
    return Sample(token_ids=np.arange(n), loss_mask=np.arange(n) > 0, behav_logprobs=np.zeros(n, np.float32),
                  reward=reward, group_id=group, task_id=group,
                  info={"trajectory_id": traj, "reward/correctness": correct})


def test_trainer_zero_failed_groups_zeroes_only_groups_without_a_success():
    from opencomposer.rl.advantages import AdvantageConfig
    from opencomposer.rl.trainer import trajectory_advantages
    # group a: all fail, the quitter (-0.01) beats the workers (-0.2); group b: one success
    # split into two segments (one trajectory), one failure
    samples = [_sample(-0.2, "a", "a0", 0.0), _sample(-0.01, "a", "a1", 0.0), _sample(-0.2, "a", "a2", 0.0),
               _sample(0.8, "b", "b0", 1.0), _sample(0.8, "b", "b0", 1.0), _sample(-0.2, "b", "b1", 0.0)]
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float64)
    gid = torch.tensor([0, 0, 0, 1, 1, 1])
    plain = trajectory_advantages(samples, rewards, gid, AdvantageConfig())
    gated = trajectory_advantages(samples, rewards, gid, AdvantageConfig(zero_failed_groups=True))
    assert plain[1] > 0 and torch.all(gated[:3] == 0)
    assert torch.equal(gated[3:], plain[3:]) and torch.allclose(gated[3:], torch.tensor([0.5, 0.5, -0.5], dtype=torch.float64))
