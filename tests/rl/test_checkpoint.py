"""Checkpoints: round trip of model, optimizer, RNG, cursor and buffer; atomic saves and
keep-last-N; the data cursor's exactly-once bookkeeping; and a run killed with SIGKILL in the
middle resumes with no prompt lost, none trained twice, and the weights of an uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from opencomposer.rl.config import TrainConfig
from opencomposer.errors import CheckpointError
from opencomposer.rl.buffer import DataCursor, GroupBuffer
from opencomposer.rl.checkpoint import Checkpointer, set_rng_state
from opencomposer.rl.rewards import RewardConfig
from opencomposer.rl.trainer import Trainer

from trainer_util import random_groups, tiny_model, tiny_run_config, write_tiny_model_yaml

ROOT = Path(__file__).resolve().parents[2]


def save_one(ck: Checkpointer, step: int, trainer: Trainer, cursor=None, buffer=()):
    cursor = cursor or DataCursor(["a", "b"])
    return ck.save(step, model=trainer.model, trainer_state=trainer.state_dict(), version=trainer.version,
                   cursor=cursor.state_dict(), buffer=list(buffer), config={"train": {"max_steps": 3}})


def test_round_trip_restores_weights_optimizer_rng_cursor_and_buffer(tmp_path):
    trainer = Trainer(tiny_model(), TrainConfig(router_replay=False), reward=RewardConfig(kl_coef=0))
    trainer.step(random_groups())
    cursor = DataCursor([f"t{i}" for i in range(6)], seed=1)
    issued = cursor.next(3)
    cursor.mark_trained(issued[:1])
    buffer = GroupBuffer()
    group = random_groups(n_groups=1)[0]
    group.task_id = issued[1]
    buffer.put(group)
    random.seed(5); np.random.seed(5); torch.manual_seed(5)
    ck = Checkpointer(tmp_path)
    path = ck.save(1, model=trainer.model, trainer_state=trainer.state_dict(), version=trainer.version,
                   cursor=cursor.state_dict(), buffer=buffer.state_dict(), config={"a": 1}, extra={"note": "x"})
    want = (random.random(), np.random.rand(), torch.rand(1))

    state = ck.load()
    assert state.path == path and state.step == 1 and state.version == 1 and state.config == {"a": 1}
    model = Checkpointer.load_model(state)
    for (n, p), q in zip(trainer.model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(p, q), n
    fresh = Trainer(model.train(), TrainConfig(router_replay=False), reward=RewardConfig(kl_coef=0))
    fresh.load_state_dict(state.trainer)
    assert fresh.version == 1 and fresh.steps == 1
    for a, b in zip(trainer.optimizer.state.values(), fresh.optimizer.state.values()):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
    set_rng_state(state.rng)
    got = (random.random(), np.random.rand(), torch.rand(1))
    assert got[0] == want[0] and got[1] == want[1] and torch.equal(got[2], want[2])
    restored = GroupBuffer()
    restored.load_state_dict(state.buffer)
    g = restored.take(1)[0]
    assert g.task_id == issued[1] and len(g.samples) == len(group.samples)
    np.testing.assert_array_equal(g.samples[0].token_ids, group.samples[0].token_ids)
    np.testing.assert_array_equal(g.samples[0].behav_logprobs, group.samples[0].behav_logprobs)
    # the in-flight id whose group was not saved (its rollout died) is issued again first
    back = DataCursor([f"t{i}" for i in range(6)], seed=1)
    back.load_state_dict(state.cursor, buffered_ids=[issued[1]])
    assert back.trained == issued[:1] and back.next(1) == [issued[2]] and list(back.in_flight)[0] == issued[1]


def test_keep_last_and_a_save_killed_midway_is_ignored(tmp_path):
    trainer = Trainer(tiny_model(), reward=RewardConfig(kl_coef=0))
    ck = Checkpointer(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        save_one(ck, step, trainer)
    assert [p.name for p in ck.checkpoints()] == ["step_00000002", "step_00000003"]
    half = tmp_path / "step_00000004.tmp"  # a run killed while writing step 4
    (half / "model").mkdir(parents=True)
    assert ck.latest().name == "step_00000003" and ck.load().step == 3
    save_one(ck, 5, trainer)
    assert not half.exists() and [p.name for p in ck.checkpoints()] == ["step_00000003", "step_00000005"]


def test_missing_or_broken_checkpoints_raise_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="nothing to resume"):
        Checkpointer(tmp_path).load()
    (tmp_path / "step_00000001").mkdir()
    with pytest.raises(CheckpointError, match="not a complete RL checkpoint"):
        Checkpointer(tmp_path).load()


def test_cursor_issues_each_task_once_and_requeues_released_ones():
    c = DataCursor([str(i) for i in range(5)], shuffle=False)
    assert c.next(2) == ["0", "1"]
    c.release(["1"])  # e.g. its rollouts were dropped as too stale
    assert c.next(2) == ["1", "2"]
    c.mark_trained(["0", "1", "2"])
    with pytest.raises(ValueError, match="not in flight"):
        c.mark_trained(["0"])  # never twice
    assert c.next(10) == ["3", "4"] and c.next(1) == [] and not c.exhausted
    c.mark_trained(["3", "4"])
    assert c.exhausted and c.trained == ["0", "1", "2", "3", "4"]
    with pytest.raises(ValueError, match="unique"):
        DataCursor(["a", "a"])
    other = DataCursor(["x", "y"])
    with pytest.raises(ValueError, match="differ"):
        other.load_state_dict(c.state_dict())


def cli(config: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "opencomposer.cli", "rl", "--config", str(config), *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def final_state(run: Path):
    ck = Checkpointer(run / "checkpoints")
    state = ck.load()
    return state, Checkpointer.load_model(state).state_dict()


@pytest.mark.slow
def test_sigkill_midway_then_resume_loses_nothing_and_repeats_nothing(tmp_path):
    model_yaml = write_tiny_model_yaml(tmp_path)
    steps = 10

    def config(name):
        d = tiny_run_config(tmp_path / name, model_yaml, train={"max_steps": steps, "optim": {"lr": 1e-2}},
                            checkpoint={"every_steps": 3, "keep_last": 2}, reward={"kl_coef": 0.001})
        p = tmp_path / f"{name}.yaml"
        p.write_text(yaml.safe_dump(d))
        return p

    whole = cli(config("whole"))
    assert whole.wait(timeout=300) == 0, whole.stderr.read()

    killed = cli(config("killed"))
    metrics = tmp_path / "killed" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 5):
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)  # after step 5: checkpoint 3 exists, steps 4-5 are lost work
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    assert Checkpointer(tmp_path / "killed" / "checkpoints").load().step < steps

    resumed = cli(config("killed"), "--resume")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()

    s_whole, w_whole = final_state(tmp_path / "whole")
    s_resumed, w_resumed = final_state(tmp_path / "killed")
    trained = s_resumed.cursor["trained"]
    assert len(trained) == len(set(trained)) == steps * 2  # none lost, none twice
    assert trained == s_whole.cursor["trained"]            # and in the same order
    assert s_resumed.version == s_whole.version == steps
    lines = [json.loads(l)["step"] for l in metrics.read_text().splitlines()]
    assert lines == list(range(1, steps + 1))               # metrics of the lost steps were dropped
    for name in w_whole:                                     # seeded sampling: the same run, bit for bit
        assert torch.equal(w_whole[name], w_resumed[name]), name
