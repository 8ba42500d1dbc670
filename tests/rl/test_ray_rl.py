"""The agentic RL run through a local Ray instance: rollout actors with their sandboxes, the
engine in an inference actor, a 2-rank FSDP2 trainer on gloo, the same config as the local run;
and a rollout actor killed mid-group."""

import json

import pytest
import ray

from opencomposer.rl.config import load_rl_config
from opencomposer.harness.trajectory import read_jsonl
from opencomposer.rl.launch import run_rl

from agentic_util import write_rl_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


def test_smoke_rl_run_on_ray_with_a_two_rank_fsdp_trainer(tmp_path, local_ray):
    path = write_rl_config(tmp_path, agentic__runner="ray",
                           agentic__ray={"rollout_actors": 2, "trainer_world_size": 2})
    cfg = load_rl_config(path)
    summary = run_rl(cfg)
    assert summary["steps"] == 2 and summary["policy_version"] == 2 and summary["engine_version"] == 2
    assert len(summary["trained"]) == len(set(summary["trained"])) == 4
    run = tmp_path / "run"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["trainer/world_size"] == 2 and m["tokens/generated"] > 0
        # a delta sync sends bytes whenever the step changed weights; a step whose groups all
        # tied (zero advantages: a random model fails every task alike) changes none
        assert "groups/degenerate_frac" in m and (m["sync/bytes_sent"] > 0 or m["groups/degenerate_frac"] == 1.0)
    trajs = read_jsonl(run / "trajectories.jsonl")
    assert len(trajs) == 8 and all(t.reward is not None and any(t.segments[0].loss_mask) for t in trajs)
    ckpts = sorted((run / "checkpoints").glob("step_*[0-9]"))
    assert ckpts and (ckpts[-1] / "model" / "config.json").is_file()


def test_a_killed_rollout_actor_is_replaced_and_its_task_rolled_out_again(tmp_path, local_ray):
    tasks = ["bank-*", "dates-*", "grades-*", "intervals-merge*", "intervals-overlaps*", "inventory-*"]
    path = write_rl_config(tmp_path, agentic__runner="ray", agentic__tasks=tasks,
                           agentic__ray={"rollout_actors": 2, "trainer_world_size": 1},
                           train={"max_steps": None, "micro_batch_size": 4, "optim": {"lr": 1e-3}})
    killed = []

    def kill_one(step, metrics):
        if step == 1:
            actor = ray.get_actor("opencomposer-rollout-run-0", namespace="opencomposer")
            ray.kill(actor, no_restart=True)
            killed.append(step)

    summary = run_rl(load_rl_config(path), on_step=kill_one)
    assert killed == [1]
    assert sorted(summary["trained"]) == sorted(set(summary["trained"])) and len(summary["trained"]) == 6
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["workers/actors_replaced"] >= 1
    assert sum(m["groups/failed"] for m in metrics) >= 1  # the group(s) it was running, released and redone
