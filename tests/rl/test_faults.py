"""Faults in agentic RL: a rollout worker killed mid-group, the trainer process killed and resumed
from its checkpoint, sandboxes that crash, a flood of malformed tool calls. Afterwards no task is
lost, none is trained twice, and the run goes on."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from opencomposer.rl.config import TrainConfig
from opencomposer.harness.trajectory import read_jsonl
from opencomposer.model import ModelConfig, Transformer
from opencomposer.rl.orchestrator import Orchestrator
from opencomposer.rl.rewards import RewardConfig
from opencomposer.rl.rollout import run_group
from opencomposer.rl.trainer import Trainer
from opencomposer.tasks.build import task_image
from opencomposer.tasks.policies import ScriptedTokenPolicy

from agentic_util import MICRO_MODEL, ROOT, TOK, SleepyTrainer, agentic, engine_sync, fake_policy, smoke_tasks, write_rl_config

GARBAGE = '<|tool_call|>{"name": "edit_file", "arguments": {"path": <|/tool_call|>'


class BlockOnce:
    """The first rollout of `task_id` blocks in its first turn (until its worker is killed)."""

    def __init__(self, policy, task_id):
        self.policy, self.task_id, self.blocked = policy, task_id, asyncio.Event()

    def __call__(self, task):
        if task.id != self.task_id or self.blocked.is_set():
            return self.policy
        outer = self

        class Blocking:
            name, tokenizer = "blocking", TOK

            async def generate(self, input_ids, sampling):
                outer.blocked.set()
                await asyncio.Event().wait()  # forever: only a kill gets it out
        return Blocking()


async def test_a_killed_rollout_worker_requeues_its_task_which_is_trained_once():
    engine, policy = fake_policy()
    trainer = SleepyTrainer(delay_s=0.05)
    tasks = smoke_tasks(6)
    victim = tasks[2].id
    factory = BlockOnce(policy, victim)
    orch = Orchestrator(tasks, trainer, engine_sync(engine), agentic(rollout_workers=3), RewardConfig(),
                        make_policy=factory)
    run = asyncio.create_task(orch.run())
    await asyncio.wait_for(factory.blocked.wait(), 30)
    assert orch.kill_worker(victim) == victim
    history = await asyncio.wait_for(run, 60)
    trained = trainer.trained_task_ids()
    assert sorted(trained) == sorted(t.id for t in tasks) and trained.count(victim) == 1
    assert sum(m["workers/restarts"] for m in history) == 1 and sum(m["groups/killed"] for m in history) == 1
    assert orch.retries[victim] == 1 and not orch.given_up


class VanishingImage:
    """The task image, except that its first `n` workspaces vanish (closed) as soon as they are made."""

    def __init__(self, image, n):
        self.image, self.n, self.layers = image, n, image.layers

    def workspace(self):
        ws = self.image.workspace()
        if self.n > 0:
            self.n -= 1
            ws.close()
        return ws


async def test_crashing_sandboxes_are_retried_or_given_up_and_the_run_goes_on():
    engine, policy = fake_policy()
    trainer = SleepyTrainer()
    tasks = smoke_tasks(6)
    always, once = tasks[0].id, tasks[1].id
    cfg = agentic(rollout_workers=2, max_task_retries=1)
    crashes = {always: 10**6, once: 1}

    async def group_fn(task, version, group_id):
        image = VanishingImage(task_image(task), crashes.pop(task.id, 0) if task.id != always else 10**6)
        return await run_group(task, lambda t: policy, cfg.rollout, RewardConfig(), image=image,
                               group_id=group_id, start_version=version)

    orch = Orchestrator(tasks, trainer, engine_sync(engine), cfg, RewardConfig(), run_group_fn=group_fn)
    history = await orch.run()
    trained = trainer.trained_task_ids()
    assert orch.given_up == [always] and always not in trained  # 1 + max_task_retries groups, all crashed
    assert sorted(trained) == sorted(t.id for t in tasks if t.id != always) and len(set(trained)) == len(trained)
    assert sum(m["groups/failed"] for m in history) == 2
    assert sum(m["rollouts/failed_attempts"] for m in history) >= 2 * 2 * cfg.rollout.max_attempts + 1
    assert orch.cursor.exhausted or not orch.cursor.in_flight


@pytest.mark.slow
async def test_a_flood_of_malformed_tool_calls_is_trained_on_with_penalties(tmp_path):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**MICRO_MODEL))
    trainer = Trainer(model, TrainConfig(micro_batch_size=8), reward=RewardConfig(kl_coef=0.0))
    flood = lambda task: ScriptedTokenPolicy(TOK, [GARBAGE * 4, GARBAGE * 4, "Done."])  # noqa: E731
    cfg = agentic()
    cfg.rollout.agent = cfg.rollout.agent.model_copy(update={"max_turns": 3, "max_new_tokens": 512})
    orch = Orchestrator(smoke_tasks(4), trainer, lambda v: {}, cfg, RewardConfig(), make_policy=flood,
                        out_dir=tmp_path)
    history = await orch.run()
    assert trainer.version == 2 and len(history) == 2
    for m in history:
        assert m["reward/mean"] < -0.39 and torch.isfinite(torch.tensor(m["loss"]))
        assert m["groups/failed"] == 0 and m["rollouts/errors"] == 0 and m["tokens/generated"] > 0
    trajs = read_jsonl(tmp_path / "trajectories.jsonl")
    assert len(trajs) == 8
    for t in trajs:
        assert t.counts.malformed_calls == 8 and t.stop_reason == "final"
        assert t.meta["reward"]["malformed_tool_calls"] == pytest.approx(-0.4)
        assert sum("malformed tool call" in m["content"] for m in t.messages if m["role"] == "tool") == 8


@pytest.mark.slow
def test_the_trainer_killed_mid_run_resumes_with_no_task_lost_or_trained_twice(tmp_path):
    tasks = [t.id for t in smoke_tasks(8)]
    cfg = write_rl_config(tmp_path, train__max_steps=None, agentic__tasks=tasks)
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "opencomposer.cli", "rl", "--config", str(cfg)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not list((run / "checkpoints").glob("step_*[0-9]")) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)  # no chance to clean up or save
        proc.wait()
    saved = sorted((run / "checkpoints").glob("step_*[0-9]"))[-1]
    before = json.loads((saved / "state.json").read_text())["cursor"]["trained"]
    assert before and len(before) < len(tasks)
    resumed = subprocess.run([sys.executable, "-m", "opencomposer.cli", "rl", "--config", str(cfg), "--resume"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = json.loads(sorted((run / "checkpoints").glob("step_*[0-9]"))[-1].joinpath("state.json").read_text())
    trained = final["cursor"]["trained"]
    assert sorted(trained) == sorted(tasks) and trained[:len(before)] == before  # none lost, none twice
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, len(tasks) // 2 + 1))  # the metrics log continues from the checkpoint

