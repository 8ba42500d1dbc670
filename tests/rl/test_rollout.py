"""Rollouts on the smoke suite: token records, grading, rewards, G forks per task, retries on a
crashed sandbox, malformed-call floods, and samples with the advantage on every segment."""

from pathlib import Path

import numpy as np
import pytest

from opencomposer.engine.fake import assistant_reply
from opencomposer.harness.agent import AgentConfig
from opencomposer.model.tokenizer import bundled_tokenizer
import torch

from opencomposer.rl.advantages import compute_advantages
from opencomposer.rl.rewards import RewardConfig
from opencomposer.rl.rollout import RolloutConfig, run_group, to_group
from opencomposer.tasks.build import task_image
from opencomposer.tasks.policies import OraclePolicy, ScriptedTokenPolicy
from opencomposer.tasks.task import Suite

SMOKE = Path(__file__).resolve().parents[2] / "tasks" / "suites" / "smoke"
TOK = bundled_tokenizer()
CFG = RolloutConfig(group_size=2, agent=AgentConfig(max_turns=4, max_new_tokens=4096, summarize_at=None))
GARBAGE = '<|tool_call|>{"name": "read_file", "arguments": {oops<|/tool_call|>'


@pytest.fixture(scope="module")
def task():
    return next(t for t in Suite.load(SMOKE).tasks if t.id.startswith("dates"))


def oracle(task):
    """A token-level policy that writes the gold patch with one turn of edit calls."""
    edits = [c["function"] for c in OraclePolicy(task).edits()]
    return ScriptedTokenPolicy(TOK, [assistant_reply(TOK, "Fixing it.", tool_calls=edits)])


def noop(task):
    return ScriptedTokenPolicy(TOK, ["Nothing to change."])


async def test_oracle_rollouts_resolve_with_exact_token_records(task):
    g = await run_group(task, oracle, CFG, RewardConfig(), start_version=3)
    assert len(g.rollouts) == 2 and g.failed == 0 and not g.errors
    for r in g.rollouts:
        t = r.trajectory
        assert t.grade["resolved"] and t.patch == task.gold_patch and t.stop_reason == "final"
        assert 0.9 < r.reward.total < 1.0  # correctness 1 minus a small length penalty
        assert r.reward.correctness == 1.0 and r.reward.length_penalty < 0
        seg = t.segments[0]
        assert len(seg.token_ids) == len(seg.loss_mask) == len(seg.logprobs) == len(seg.policy_versions)
        assert seg.routed_experts.shape[0] == len(seg.token_ids)
        sampled = [i for i, m in enumerate(seg.loss_mask) if m]
        assert sampled and all(seg.policy_versions[i] == 0 for i in sampled)
    assert g.oldest_version() == 0 and g.start_version == 3


async def test_a_group_of_oracle_and_noop_gives_opposite_advantages(task):
    policies = iter([oracle, noop])
    g = await run_group(task, lambda t: next(policies)(t), CFG, RewardConfig())
    resolved = {r.trajectory.grade["resolved"] for r in g.rollouts}
    assert resolved == {True, False}
    noop_traj = next(r.trajectory for r in g.rollouts if not r.trajectory.grade["resolved"])
    assert noop_traj.grade["reason"] == "empty patch (not run)" and noop_traj.patch == ""
    group = to_group(g, "g0")
    assert len(group.samples) == 2 and {s.task_id for s in group.samples} == {task.id}
    adv = compute_advantages(torch.tensor([[s.reward for s in group.samples]]))[0]
    a = {s.info["resolved"]: float(x) for s, x in zip(group.samples, adv)}
    assert a[True] == pytest.approx(-a[False]) and a[True] > 0.4  # Dr. GRPO: r − mean of the group
    for s, r in zip(group.samples, g.rollouts):  # the exact record, as arrays
        seg = r.trajectory.segments[0]
        assert s.token_ids.tolist() == seg.token_ids and s.loss_mask.tolist() == [bool(m) for m in seg.loss_mask]
        assert s.routed_experts.shape == seg.routed_experts.shape and s.oldest_version() == 0
        # Sample row t = the forward at input position t, which produced token t + 1
        expected = ScriptedTokenPolicy(TOK, []).experts(s.token_ids[1:])
        produced = s.loss_mask[1:]
        assert np.array_equal(s.routed_experts[:-1][produced], expected[produced])
        assert (s.routed_experts[:-1][~produced] == -1).all() and (s.routed_experts[-1] == -1).all()


async def test_a_flood_of_malformed_calls_is_penalised_not_fatal(task):
    flood = lambda t: ScriptedTokenPolicy(TOK, [GARBAGE * 3] * 3 + ["I give up."])
    g = await run_group(task, flood, CFG.model_copy(update={"group_size": 1, "min_group_size": 1}), RewardConfig())
    (r,) = g.rollouts
    c = r.trajectory.counts
    assert c.malformed_calls == 9 and c.tool_errors == 9 and r.trajectory.stop_reason == "final"
    assert r.reward.malformed_tool_calls == pytest.approx(-0.45) and r.reward.total < -0.4
    tool_msgs = [m for m in r.trajectory.messages if m["role"] == "tool"]
    assert len(tool_msgs) == 9 and all("malformed tool call" in m["content"] for m in tool_msgs)


class VanishingImage:
    """The task image, except that the first `n` workspaces vanish (closed) as soon as they are made."""

    def __init__(self, image, n):
        self.image, self.n, self.layers = image, n, image.layers

    def workspace(self):
        ws = self.image.workspace()
        if self.n > 0:
            self.n -= 1
            ws.close()
        return ws


async def test_a_crashed_sandbox_is_retried_on_a_fresh_fork(task):
    image = VanishingImage(task_image(task), 1)
    g = await run_group(task, oracle, CFG, RewardConfig(), image=image)
    assert len(g.rollouts) == 2 and g.failed == 0
    assert len(g.errors) == 1 and "SandboxError" in g.errors[0]
    assert sorted(r.attempts for r in g.rollouts) == [1, 2]
    assert all(r.trajectory.grade["resolved"] for r in g.rollouts)


async def test_a_sandbox_that_always_crashes_fails_the_group_cleanly(task):
    image = VanishingImage(task_image(task), 100)
    g = await run_group(task, oracle, CFG, RewardConfig(), image=image)
    assert g.rollouts == [] and g.failed == 2 and len(g.errors) == 2 * CFG.max_attempts
    assert not g.ok(CFG.min_group_size) and to_group(g, "g").samples == []


async def test_every_segment_of_a_summarized_rollout_is_a_sample_with_the_final_reward(task):
    cfg = CFG.model_copy(update={"agent": AgentConfig(max_turns=6, summarize_at=50, max_new_tokens=4096)})
    policies = iter([
        lambda t: ScriptedTokenPolicy(TOK, ['<|tool_call|>{"name": "list_dir", "arguments": {}}<|/tool_call|>',
                                            "Summary: looked around.", "Done."]),
        noop])
    g = await run_group(task, lambda t: next(policies)(t), cfg, RewardConfig())
    long = next(r for r in g.rollouts if len(r.trajectory.segments) > 1)
    samples = [s for s in to_group(g, "g").samples if s.info["trajectory_id"] == long.trajectory.id]
    assert len(samples) == len(long.trajectory.segments) == 2 and [s.info["segment"] for s in samples] == [0, 1]
    assert samples[0].reward == samples[1].reward == long.trajectory.reward == long.reward.total


@pytest.fixture
def counted_grades(monkeypatch):
    """Every real grading run of the test, by patch; `fail_first` makes the first one raise."""
    import opencomposer.tasks.grade as grade_mod

    real, calls, state = grade_mod.grade, [], {"fail_first": False}

    def grade(task, patch, **kw):
        calls.append(patch)
        if state.pop("fail_first", False):
            raise OSError("grader's sandbox vanished")
        return real(task, patch, **kw)

    monkeypatch.setattr(grade_mod, "grade", grade)
    return calls, state


async def test_identical_patches_of_a_group_share_one_grading(task, counted_grades):
    calls, _ = counted_grades
    policies = iter([oracle, oracle, oracle, noop])
    cfg = CFG.model_copy(update={"group_size": 4})
    g = await run_group(task, lambda t: next(policies)(t), cfg, RewardConfig())
    assert calls == [task.gold_patch]  # three identical patches, one run of the tests; the empty one none
    resolved = [r for r in g.rollouts if r.trajectory.grade["resolved"]]
    assert len(resolved) == 3 and len({r.reward.total for r in resolved}) == 1
    assert sorted(r.trajectory.grade["duration_s"] > 0 for r in resolved) == [False, False, True]
    resolved[0].trajectory.grade["tests"].clear()  # each rollout owns its copy
    assert all(r.trajectory.grade["tests"] for r in resolved[1:])

    calls.clear()
    policies = iter([oracle] * 3)
    g = await run_group(task, lambda t: next(policies)(t), cfg.model_copy(update={"group_size": 3, "share_grades": False}),
                        RewardConfig())
    assert calls == [task.gold_patch] * 3 and all(r.trajectory.grade["resolved"] for r in g.rollouts)


async def test_a_failed_shared_grading_is_retried_afresh(task, counted_grades):
    calls, state = counted_grades
    state["fail_first"] = True
    g = await run_group(task, oracle, CFG.model_copy(update={"group_size": 3}), RewardConfig())
    assert len(g.rollouts) == 3 and g.failed == 0 and all(r.trajectory.grade["resolved"] for r in g.rollouts)
    assert g.errors and all("grader's sandbox vanished" in e for e in g.errors)
    assert 2 <= len(calls) <= 3  # the failed run and at least one fresh one; never the failure shared as a result
