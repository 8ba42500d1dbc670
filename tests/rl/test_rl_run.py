"""The run assembly every RL mode shares (rl/run.py) and the runner table (rl/cli.py): a run
killed after a step it had not checkpointed resumes with each step logged once, in
metrics.jsonl and in TensorBoard; each (mode, runner) finds its run function."""

from __future__ import annotations

import json
import shutil

import numpy as np

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from opencomposer.rl.config import load_rl_config
from opencomposer.rl.launch import RUNNERS, runner_for
from opencomposer.rl.single_turn import run_single_turn

from agentic_util import write_rl_config
from trainer_util import tiny_run_config, write_tiny_model_yaml


def test_a_run_killed_past_its_checkpoint_logs_each_step_once_after_resume(tmp_path):
    run = tmp_path / "run"
    cfg = tiny_run_config(run, write_tiny_model_yaml(tmp_path), train={"max_steps": 3},
                          checkpoint={"every_steps": 2, "keep_last": 3}, log={"tensorboard": True})
    run_single_turn(load_rl_config(data=cfg))
    # as if killed after step 3 was logged and before its checkpoint: the latest is step 2's
    shutil.rmtree(run / "checkpoints" / "step_00000003")
    summary = run_single_turn(load_rl_config(data={**cfg, "train": {**cfg["train"], "max_steps": 4}}), resume=True)
    assert summary["steps"] == 4

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("reward/mean")] == [
        (r["step"], float(np.float32(r["reward/mean"]))) for r in rows]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000002", "step_00000004"]


def test_every_mode_and_runner_has_a_run_function(tmp_path):
    import opencomposer.rl.orchestrator as orchestrator
    import opencomposer.rl.ray_runner as ray_runner

    agentic = {}
    for runner in ("local", "ray"):
        (tmp_path / runner).mkdir()
        agentic[runner] = load_rl_config(write_rl_config(tmp_path / runner, agentic__runner=runner))
    assert runner_for(agentic["local"]) is orchestrator.run_agentic
    assert runner_for(agentic["ray"]) is ray_runner.run_ray
    single = load_rl_config(data=tiny_run_config(tmp_path / "st", write_tiny_model_yaml(tmp_path)))
    assert runner_for(single) is run_single_turn
    assert set(RUNNERS) == {("single_turn", "local"), ("agentic", "local"), ("agentic", "ray")}
