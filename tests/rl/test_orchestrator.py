"""The asynchronous orchestrator: synchronous mode (s = 0), the staleness bound with wait and drop,
in-flight weight updates recorded per token, single-epoch bookkeeping, and a smoke RL run of the
real pipeline (micro MoE policy, embedded engine, smoke suite, trainer, weight sync, checkpoints)."""

import asyncio
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from opencomposer.cli import app
from opencomposer.harness.trajectory import read_jsonl
from opencomposer.rl.orchestrator import Orchestrator
from opencomposer.rl.rewards import RewardConfig

from agentic_util import SleepyTrainer, agentic, engine_sync, fake_policy, smoke_tasks, write_rl_config


def sampled_versions(group):
    return np.concatenate([s.policy_versions[s.loss_mask] for s in group.samples])


async def test_synchronous_mode_trains_only_fresh_groups_and_each_task_once():
    engine, policy = fake_policy()
    trainer = SleepyTrainer(delay_s=0.2)
    tasks = smoke_tasks(6)
    orch = Orchestrator(tasks, trainer, engine_sync(engine), agentic(max_staleness=0), RewardConfig(),
                        make_policy=lambda t: policy)
    history = await orch.run()
    assert len(history) == 3 and engine.policy_version == trainer.version == 3
    assert sorted(trainer.trained_task_ids()) == sorted(t.id for t in tasks)  # each task once
    assert sorted(orch.cursor.trained) == sorted(t.id for t in tasks) and not orch.cursor.in_flight
    for k, batch in enumerate(trainer.batches):  # generated entirely by the weights being trained
        for g in batch:
            assert set(sampled_versions(g).tolist()) == {k}
    assert all(m["staleness/hist_0"] == 2 and m["staleness/group_max"] == 0 for m in history)
    for m in history:
        assert m["groups/trained"] == 2 and m["rollouts/resolved_frac"] == 0.0 and m["sync/version"] == m["step"]


class WaitForNewWeights:
    """Wraps a policy: its second turn waits until the engine serves newer weights than its first,
    so the rollout is certain to continue under a new policy mid-episode."""

    def __init__(self, policy, engine):
        self.policy, self.engine, self.name, self.tokenizer = policy, engine, "gated", policy.tokenizer
        self.first_version = None

    async def generate(self, input_ids, sampling):
        if self.first_version is None:
            self.first_version = self.engine.policy_version
        else:
            while self.engine.policy_version == self.first_version:
                await asyncio.sleep(0.01)
        return await self.policy.generate(input_ids, sampling)


async def test_async_mode_keeps_generating_during_training_within_the_bound():
    engine, policy = fake_policy()
    trainer = SleepyTrainer(delay_s=0.2)
    tasks = smoke_tasks(8)
    gated = tasks[0].id
    # The gated rollout waits for step 1's weights: on a loaded machine that can take longer than
    # the default task timeout, which would retry it from scratch (not what this test is about).
    orch = Orchestrator(tasks, trainer, engine_sync(engine),
                        agentic(max_staleness=1, rollout_workers=4, task_timeout_s=600),
                        RewardConfig(), make_policy=lambda t: WaitForNewWeights(policy, engine) if t.id == gated else policy)
    history = await orch.run()
    assert sorted(trainer.trained_task_ids()) == sorted(t.id for t in tasks)
    stale = [trainer_v - int(sampled_versions(g).min()) for trainer_v, b in enumerate(trainer.batches) for g in b]
    assert max(stale) <= 1 and 1 in stale  # rollouts ran ahead of training, never more than s = 1
    # the gated task's rollouts continued under the new weights: versions recorded per token
    g = next(g for b in trainer.batches for g in b if g.task_id == gated)
    for s in g.samples:
        v = s.policy_versions[s.loss_mask]
        assert v.max() == v.min() + 1 and np.all(np.diff(v) >= 0)
    assert sum(m["inflight/multi_version_frac"] for m in history) > 0
    assert sum(m.get("staleness/hist_1", 0) for m in history) == stale.count(1)


async def test_dynamic_sampling_fills_each_step_with_informative_groups():
    """Tasks whose G rollouts tie ride along (used once, trained at zero cost) and do not count
    toward groups_per_step; without dynamic sampling every group counts."""
    import dataclasses

    tasks = smoke_tasks(8)
    mixed = {t.id for t in tasks[::3]}  # 3 of the 8 tasks give their two rollouts different rewards
    for dynamic, want_steps in ((True, 2), (False, 4)):
        engine, policy = fake_policy()
        trainer = SleepyTrainer()
        orch = Orchestrator(tasks, trainer, engine_sync(engine), agentic(max_staleness=0, dynamic_sampling=dynamic),
                            RewardConfig(), make_policy=lambda t: policy)
        plain = orch.run_group_fn

        async def rewarded(task, start_version, group_id):
            group = await plain(task, start_version, group_id)
            if task.id in mixed:
                for i, r in enumerate(group.rollouts):
                    r.reward = dataclasses.replace(r.reward, total=float(i % 2))
            return group

        orch.run_group_fn = rewarded
        history = await orch.run()
        assert len(history) == want_steps
        assert sorted(trainer.trained_task_ids()) == sorted(t.id for t in tasks)  # each task once, all saved
        informative = [sum(g.task_id in mixed for g in b) for b in trainer.batches]
        if dynamic:  # 2 informative groups per step, then the last one with what is left
            assert informative == [2, 1] and sum(len(b) for b in trainer.batches) == 8
        else:
            assert [len(b) for b in trainer.batches] == [2, 2, 2, 2]


async def test_drop_policy_drops_stale_groups_and_rolls_their_tasks_out_again():
    engine, policy = fake_policy(step_delay_s=0.005)
    trainer = SleepyTrainer(delay_s=0.3)
    tasks = smoke_tasks(6)
    cfg = agentic(max_staleness=0, staleness_policy="drop", rollout_workers=4, max_task_retries=5)
    orch = Orchestrator(tasks, trainer, engine_sync(engine), cfg, RewardConfig(), make_policy=lambda t: policy)
    history = await orch.run()
    dropped = sum(m["groups/dropped_stale"] for m in history)
    assert dropped > 0
    trained = trainer.trained_task_ids()
    assert len(trained) == len(set(trained))  # never twice
    assert sorted(trained + orch.given_up) == sorted(t.id for t in tasks)  # never lost
    for k, batch in enumerate(trainer.batches):
        for g in batch:
            assert int(sampled_versions(g).min()) == k  # s = 0 held for everything trained


async def test_max_steps_stops_early_and_leaves_the_rest_resumable():
    engine, policy = fake_policy()
    trainer = SleepyTrainer()
    tasks = smoke_tasks(8)
    orch = Orchestrator(tasks, trainer, engine_sync(engine), agentic(), RewardConfig(),
                        make_policy=lambda t: policy, max_steps=2)
    await orch.run()
    state = orch.state_dict()
    done = set(state["cursor"]["trained"])
    assert len(done) == 4 and orch.step == 2
    orch2 = Orchestrator(tasks, SleepyTrainer(), engine_sync(engine), agentic(), RewardConfig(),
                         make_policy=lambda t: policy)
    orch2.trainer.version = 2
    orch2.load_state_dict(state["cursor"], state["buffer"], state["extra"])
    await orch2.run()
    rest = orch2.trainer.trained_task_ids()
    assert not done & set(rest) and done | set(rest) == {t.id for t in tasks}


@pytest.mark.slow
def test_smoke_rl_run_through_the_cli(tmp_path):
    """`opencomposer rl --config` in agentic mode, local runner: 2 steps of the real pipeline."""
    cfg = write_rl_config(tmp_path)
    r = CliRunner().invoke(app, ["rl", "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["policy_version"] == 2 and summary["engine_version"] == 2
    assert summary["trained"] == 4  # 2 groups per step, distinct tasks
    run = tmp_path / "run"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["tokens/generated"] > 0 and np.isfinite(m["loss"]) and m["groups/trained"] == 2
        assert m["staleness/group_max"] <= 1
        # a delta sync sends bytes whenever the step changed weights; a step whose groups all
        # tied (zero advantages: a random model fails every task alike) changes none
        assert "groups/degenerate_frac" in m and (m["sync/bytes_sent"] > 0 or m["groups/degenerate_frac"] == 1.0)
    trajs = read_jsonl(run / "trajectories.jsonl")
    assert len(trajs) == 8 and len({t.task_id for t in trajs}) == 4
    for t in trajs:
        seg = t.segments[0]
        assert t.reward is not None and t.grade is not None and t.meta["reward"]["total"] == t.reward
        assert len(seg.token_ids) == len(seg.loss_mask) == len(seg.logprobs) == len(seg.policy_versions)
        assert any(seg.loss_mask) and all(v >= 0 for v, m in zip(seg.policy_versions, seg.loss_mask) if m)
    assert (run / "checkpoints").is_dir() and list((run / "tb").iterdir())
    state = json.loads(sorted((run / "checkpoints").iterdir())[-1].joinpath("state.json").read_text())
    assert len(state["cursor"]["trained"]) == len(set(state["cursor"]["trained"])) == 4
