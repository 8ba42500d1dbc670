"""The metrics writer on resume: rows logged before the checkpoint survive, rows of the steps a
resumed run takes again are replaced, in metrics.jsonl and in TensorBoard (event files read back)."""

from __future__ import annotations

import json

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from opencomposer.training.metrics import MetricsWriter


def tb_scalars(run_dir, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_resumed_run_keeps_the_checkpointed_steps_and_replaces_the_rest(tmp_path):
    first = MetricsWriter(tmp_path, tensorboard=True)
    for step in (1, 2, 3):  # killed after logging step 3, its last checkpoint taken after step 2
        first.write(step, {"loss": float(step), "phase": "main"})
    first.close()

    resumed = MetricsWriter(tmp_path, tensorboard=True, resume_step=2)
    for step in (3, 4):  # the resumed run takes step 3 again, with other figures
        resumed.write(step, {"loss": 10.0 * step, "phase": "main"})
    resumed.close()

    expected = [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]
    assert [(r["step"], r["loss"]) for r in rows(tmp_path)] == expected
    assert tb_scalars(tmp_path, "loss") == expected
    assert list(rows(tmp_path)[0]) == ["step", "loss", "phase"]  # the row's layout: step first


def test_a_fresh_run_in_an_old_directory_keeps_nothing_of_it(tmp_path):
    old = MetricsWriter(tmp_path, tensorboard=True)
    for step in (1, 2):
        old.write(step, {"loss": 1.0})
    old.close()
    new = MetricsWriter(tmp_path, tensorboard=True)  # no checkpoint was resumed: start over
    new.write(1, {"loss": 5.0})
    new.close()
    assert [(r["step"], r["loss"]) for r in rows(tmp_path)] == [(1, 5.0)]
    assert tb_scalars(tmp_path, "loss") == [(1, 5.0)]
