"""Rollouts: the agent loop in a forked sandbox, graded, rewarded; G of them per task form a group.

    task image (snapshot: venv + broken workspace, no hidden tests)
      └─ fresh copy-on-write workspace × G (forks of the same snapshot)
           └─ agent loop (harness/agent.py), the engine as token-level policy:
              exact output ids, loss mask, behaviour logprobs, routed experts and the
              policy version of every sampled token, per self-summarization segment
           └─ the workspace's diff -> grader on a fresh fork + hidden tests (tasks/grade.py)
           └─ RewardInputs (trajectory counts + grade) -> compute_reward (rl/rewards.py)
      └─ RolloutGroup: the successful rollouts, their rewards, the policy versions they span
    -> the trainer's `Group` (rl/buffer.py, `to_group`): one `Sample` per self-summarization
    segment, every segment carrying its trajectory's final reward [R §4].

This is the same agent loop and the same grader `opencomposer eval` uses (eval/run.py), so a
policy trains in the harness it is evaluated (and shipped) in.

Failures: bad model output is data (malformed tool calls become tool errors and reward
penalties, never exceptions). A rollout whose *infrastructure* fails (its sandbox vanished,
an exec that cannot start, the policy endpoint down, the grader crashing) raises out of the
attempt; it is retried on a fresh fork up to `max_attempts` times in all, then counted as
failed. A group keeps its successful rollouts (advantages handle ragged groups) and is
dropped, with its task reported back, when fewer than `min_group_size` succeeded.

An empty patch is scored unresolved without running the tests (when correctness is
"resolved"): task validation guarantees the fail-to-pass tests fail on the unchanged
workspace, and a random or early policy mostly submits nothing, so this saves a pytest run
per such rollout. Rollouts of a group with byte-identical patches share one grading run
(`share_grades`): a sharp policy writes the same fix in most of a group, and pytest per
rollout was ~60% of an RL step's CPU in the demo.

The KL-in-reward term (−β·Σ k1) needs the reference policy's logprobs, which only the
trainer computes; rewards here use kl_sum = 0 and the trainer adds the term if configured.

Left out: sharing one sandbox between rollouts, partial credit beyond the grader's counts,
and stopping a rollout early when its group is already decided.
"""

from __future__ import annotations

import asyncio
import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from pydantic import Field

from opencomposer.config import Section
from opencomposer.harness.agent import Agent, AgentConfig, derive_seed
from opencomposer.harness.trajectory import Trajectory
from opencomposer.rl.buffer import Group, Sample
from opencomposer.rl.rewards import RewardBreakdown, RewardConfig, RewardInputs, compute_reward
from opencomposer.tasks.task import Task

PolicyFactory = Callable[[Task], object]
"""Makes the policy of one rollout attempt (a shared engine client, or a fresh scripted policy)."""


class RolloutConfig(Section):
    """How one task becomes a group of graded rollouts."""

    group_size: int = Field(4, ge=1)
    """G: rollouts per task, each in its own fork of the task's snapshot."""
    min_group_size: int = Field(2, ge=1)
    """A group with fewer successful rollouts is dropped (Dr. GRPO needs ≥ 2 to compare)."""
    max_attempts: int = Field(2, ge=1)
    """Tries per rollout (first + retries) when its infrastructure fails; each on a fresh fork."""
    task_timeout_s: float = Field(600.0, gt=0)
    """Wall-clock limit of one episode (the agent's max_wall_s); the patch so far is still graded."""
    agent: AgentConfig = AgentConfig(max_turns=30, max_total_tokens=32_000, max_new_tokens=1024,
                                     summarize_at=None)
    """The agent loop's limits and sampling (token mode); max_wall_s is replaced by task_timeout_s."""
    skip_empty_patch: bool = True
    """Score an empty patch unresolved without running the tests (correctness "resolved" only)."""
    share_grades: bool = True
    """Rollouts of one group whose patches are byte-identical share one grading run: the tests run
    once per distinct patch (the demo's groups write ~4 identical patches in 8, and grading was
    ~60% of an RL step's CPU). Exact for deterministic tests; turn it off for flaky suites, where
    every rollout should draw its own result."""


@dataclass
class Rollout:
    """One finished rollout: its trajectory (patch, grade and reward filled in) and reward terms."""

    trajectory: Trajectory
    reward: RewardBreakdown
    attempts: int


@dataclass
class RolloutGroup:
    """The G rollouts of one task. `rollouts` holds the successful ones only."""

    task_id: str
    rollouts: list[Rollout] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """One line per failed attempt (retried or not)."""
    failed: int = 0
    """Rollouts that failed every attempt."""
    start_version: int = 0
    """The engine's policy version when the group started."""
    wall_s: float = 0.0

    def ok(self, min_size: int) -> bool:
        return len(self.rollouts) >= min_size

    @property
    def rewards(self) -> list[float]:
        return [r.reward.total for r in self.rollouts]

    def versions(self) -> np.ndarray:
        """Policy versions of every sampled token of the group (1-D, may be empty)."""
        parts = [np.asarray(s.policy_versions, dtype=np.int64)[np.asarray(s.loss_mask, dtype=bool)]
                 for r in self.rollouts for s in r.trajectory.segments if s.token_ids is not None]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def oldest_version(self) -> int:
        """The oldest policy that sampled any token of the group: what staleness is measured from."""
        v = self.versions()
        return int(v.min()) if v.size else self.start_version


# ----------------------------------------------------------------------------- one rollout

def reward_inputs(traj: Trajectory, grade: dict) -> RewardInputs:
    """The reward's inputs from the loop's counts and the grader's result (`GradeResult.to_json()`)."""
    c = traj.counts
    total = grade["f2p_total"] + grade["p2p_total"]
    return RewardInputs(
        thinking_tokens=c.thinking_tokens, tool_call_tokens=c.tool_call_tokens,
        tool_output_tokens=c.tool_output_tokens, final_message_tokens=c.final_message_tokens,
        tool_calls=c.tool_calls, turns=c.turns,
        failed_tool_calls=c.tool_errors - c.malformed_calls,  # tool_errors counts malformed calls too
        malformed_tool_calls=c.malformed_calls, unfinished_todos=c.unfinished_todos,
        resolved=bool(grade["resolved"]),
        tests_passed_fraction=(grade["f2p_passed"] + grade["p2p_passed"]) / total if total else 0.0)


def _unresolved_without_tests(task: Task) -> dict:
    from opencomposer.tasks.grade import GradeResult

    f2p, p2p = task.spec.tests.fail_to_pass, task.spec.tests.pass_to_pass
    return GradeResult(False, 0, len(f2p), 0, len(p2p), reason="empty patch (not run)").to_json()


GradeCache = dict[str, "asyncio.Future[dict]"]
"""A group's gradings by patch (RolloutConfig.share_grades); a failed grading leaves no entry."""


async def _grade_once(task: Task, patch: str, image, backend, cache: GradeCache | None) -> dict:
    """The grader's result for `patch`; with a cache, concurrent and later identical patches of
    the group wait for the first one's run instead of running the tests again (their copy says
    duration_s 0)."""
    from opencomposer.tasks.grade import grade

    async def run() -> dict:
        return (await asyncio.to_thread(grade, task, patch, backend=backend, image=image)).to_json()

    if cache is None:
        return await run()
    while True:
        fut = cache.get(patch)
        if fut is None:
            fut = cache[patch] = asyncio.get_running_loop().create_future()
            try:
                result = await run()
            except asyncio.CancelledError:
                del cache[patch]
                fut.cancel()  # a waiter that is not itself cancelled grades afresh
                raise
            except Exception as e:  # infrastructure: every waiter's attempt fails too, and retries afresh
                del cache[patch]
                fut.set_exception(e)
                fut.exception()  # retrieved: no "never retrieved" warning when no one waits
                raise
            fut.set_result(result)
            return copy.deepcopy(result)
        try:
            shared = copy.deepcopy(await asyncio.shield(fut))
            shared["duration_s"] = 0.0  # this rollout ran no tests
            return shared
        except asyncio.CancelledError:
            if not fut.cancelled():  # this rollout itself was cancelled
                raise


async def _attempt(task: Task, image, make_policy: PolicyFactory, cfg: RolloutConfig, reward_cfg: RewardConfig,
                   traj_id: str, backend, save_dir: Path | None, grades: GradeCache | None = None,
                   seed: int | None = None) -> Rollout:
    """One try: fresh fork, agent, diff, grade, reward. Raises on infrastructure failure."""
    from opencomposer.tasks.grade import workspace_patch

    ws = await asyncio.to_thread(image.workspace)
    try:
        agent = Agent(make_policy(task), ws, cfg.agent.model_copy(update={"max_wall_s": cfg.task_timeout_s}),
                      trajectory_id=traj_id, task_id=task.id,
                      save_path=save_dir / f"{traj_id}.json" if save_dir else None,
                      sampling_seed=None if seed is None else derive_seed(seed, traj_id))
        traj = await agent.run(task.spec.instruction)
        traj.patch = await asyncio.to_thread(workspace_patch, ws)
    finally:
        await asyncio.to_thread(ws.close)
    if not traj.patch.strip() and cfg.skip_empty_patch and reward_cfg.correctness == "resolved":
        traj.grade = _unresolved_without_tests(task)
    else:
        traj.grade = await _grade_once(task, traj.patch, image, backend, grades)
    breakdown = compute_reward(reward_inputs(traj, traj.grade), reward_cfg)
    traj.reward = breakdown.total
    traj.meta["reward"] = breakdown.as_dict(prefix="")
    return Rollout(traj, breakdown, attempts=0)


async def run_rollout(task: Task, image, make_policy: PolicyFactory, cfg: RolloutConfig, reward_cfg: RewardConfig,
                      *, rollout_id: str, backend=None, save_dir: Path | None = None,
                      errors: list[str] | None = None, grades: GradeCache | None = None,
                      seed: int | None = None) -> Rollout | None:
    """Up to `cfg.max_attempts` tries; None if every one failed (their errors appended to `errors`).
    Cancellation (a killed worker) is never swallowed."""
    for attempt in range(1, cfg.max_attempts + 1):
        try:
            rollout = await _attempt(task, image, make_policy, cfg, reward_cfg, f"{rollout_id}_a{attempt}",
                                     backend, save_dir, grades, seed)
            rollout.attempts = attempt
            return rollout
        except Exception as e:  # infrastructure, not the model: retried on a fresh fork
            if errors is not None:
                errors.append(f"{rollout_id} attempt {attempt}: {type(e).__name__}: {e}")
    return None


async def run_group(task: Task, make_policy: PolicyFactory, cfg: RolloutConfig, reward_cfg: RewardConfig, *,
                    backend=None, image=None, group_id: str | None = None, start_version: int = 0,
                    save_dir: Path | None = None, seed: int | None = None) -> RolloutGroup:
    """G concurrent rollouts of `task` from forks of the task image (built/cached on first use).

    seed: each rollout's sampling is seeded from it and the rollout's id (group id, index,
    attempt), so a seeded run samples the same episodes whatever runs beside them."""
    from opencomposer.tasks.build import task_image

    t0 = time.monotonic()
    if image is None:
        image = await asyncio.to_thread(task_image, task, backend)
    group = RolloutGroup(task.id, start_version=start_version)
    gid = group_id or task.id
    grades: GradeCache | None = {} if cfg.share_grades else None
    done = await asyncio.gather(*(
        run_rollout(task, image, make_policy, cfg, reward_cfg, rollout_id=f"{gid}_r{i}", backend=backend,
                    save_dir=save_dir, errors=group.errors, grades=grades, seed=seed)
        for i in range(cfg.group_size)))
    group.rollouts = [r for r in done if r is not None]
    group.failed = sum(r is None for r in done)
    group.wall_s = round(time.monotonic() - t0, 3)
    return group


# ----------------------------------------------------------------------------- to the trainer

def input_position_experts(routed_TYK: np.ndarray | None) -> np.ndarray | None:
    """Trajectory rows -> Sample rows. A trajectory keeps, at a sampled token's position p, the
    experts of the forward that *produced* it (input position p − 1, the engine's convention);
    a Sample keeps at row t the experts of input position t. So row t ← row t + 1, and the last
    row (no forward of it is trained) is −1."""
    if routed_TYK is None:
        return None
    out_TYK = np.full_like(routed_TYK, -1)
    out_TYK[:-1] = routed_TYK[1:]
    return out_TYK


def to_group(group: RolloutGroup, group_id: str) -> Group:
    """The trainer's view of a group (rl/buffer.py): one `Sample` per segment of every successful
    rollout that sampled anything, each carrying its trajectory's final reward [R §4] and, in
    `info`, the trajectory id (so advantages can be taken per trajectory, then broadcast)."""
    samples = []
    for r in group.rollouts:
        t = r.trajectory
        for k, seg in enumerate(t.segments):
            if seg.token_ids is None:
                raise ValueError(f"trajectory {t.id} is chat-level: RL needs a token-level policy "
                                 "(TokenClientPolicy over the engine) so the exact sampled ids are kept")
            if not any(seg.loss_mask):
                continue  # nothing sampled in this segment: no gradient
            samples.append(Sample(
                token_ids=seg.token_ids, loss_mask=seg.loss_mask, behav_logprobs=seg.logprobs,
                reward=r.reward.total, group_id=group_id, task_id=group.task_id,
                routed_experts=input_position_experts(seg.routed_experts), policy_versions=seg.policy_versions,
                info={"trajectory_id": t.id, "segment": k, "stop_reason": t.stop_reason,
                      "resolved": bool(t.grade and t.grade["resolved"]), **r.reward.as_dict()}))
    return Group(group_id, group.task_id, samples)
