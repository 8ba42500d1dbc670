"""The demo report's split of held-out episodes: resolved, the decoy fix, another failure."""

from __future__ import annotations

from opencomposer.harness.trajectory import Trajectory, write_jsonl
from opencomposer.pipeline_report import outcomes
from opencomposer.tasks.demo_family import DECOY_PATCH, generate_tasks
from opencomposer.tasks.task import Task


def test_outcomes_tell_the_decoy_fix_from_other_failures(tmp_path):
    paths = generate_tasks(4, 0, tmp_path / "suite", difficulty=0)
    gold, decoy, other, nothing = (Task.load(p) for p in paths)
    trajs = [Trajectory(id="a", task_id=gold.id, patch=gold.gold_patch, reward=1.0),
             Trajectory(id="b", task_id=decoy.id, patch=(decoy.path / DECOY_PATCH).read_text(), reward=0.0),
             Trajectory(id="c", task_id=other.id, patch=decoy.gold_patch, reward=0.0),  # another task's fix
             Trajectory(id="d", task_id=nothing.id, patch="", reward=0.0)]
    (tmp_path / "eval").mkdir()
    write_jsonl(trajs, tmp_path / "eval" / "trajectories.jsonl")
    assert outcomes(tmp_path / "eval", tmp_path / "suite") == {"resolved": 1, "decoy": 1, "other": 2}


def test_the_report_states_the_demonstrators_habits_when_it_has_them():
    from opencomposer.pipeline import load_config
    from opencomposer.pipeline_report import _habits

    assert _habits(load_config().sft) == ""  # the plain oracle: nothing to state
    cfg = load_config(None, ["sft.parallel_rate=0.5", "sft.parallel_choice_rate=0.08", "sft.verify_rate=0.5",
                             "tasks.two_file_rate=0.5", "tasks.max_turns=7"])
    text = _habits(cfg.sft)
    assert "batches its calls on 50%" in text and "choice to batch the reads from 8%" in text and "again on 50%" in text
    assert "__init__" not in text
    surveying = _habits(load_config(None, ["sft.survey_rate=0.3", "tasks.max_turns=5"]).sft)
    assert "again on 0%, and first reads the package's __init__.py in a turn of its own on 30%" in surveying
    assert "choice" not in _habits(load_config(None, ["sft.parallel_rate=0.3", "tasks.two_file_rate=0.5",
                                                      "tasks.max_turns=7"]).sft)
