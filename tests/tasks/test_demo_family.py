"""The demo family: deterministic generation, held-out instances that are new, tasks that the real
grader validates (gold resolves, no change fails), and the read-then-edit oracle through the agent loop."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from opencomposer.errors import TaskError
from opencomposer.harness.agent import Agent
from opencomposer.tasks.build import task_image
from opencomposer.tasks.demo_family import (DEMO_AGENT, ReadEditOracle, generate_tasks, instance_hash, make_instance,
                                            minimal_edits)
from opencomposer.tasks.grade import grade
from opencomposer.tasks.policies import parse_patch
from opencomposer.tasks.task import Suite, Task, tree_diff


def tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_generation_is_deterministic_and_seeds_differ(tmp_path):
    generate_tasks(12, 3, tmp_path / "a", difficulty=2)
    generate_tasks(12, 3, tmp_path / "b", difficulty=2)
    generate_tasks(12, 4, tmp_path / "c", difficulty=2)
    assert tree(tmp_path / "a") == tree(tmp_path / "b")
    assert {t.id for t in Suite.load(tmp_path / "a").tasks} != {t.id for t in Suite.load(tmp_path / "c").tasks}


def test_held_out_suite_shares_no_instance_with_the_training_suite(tmp_path):
    train = generate_tasks(40, 0, tmp_path / "train", difficulty=0)
    held = generate_tasks(40, 1, tmp_path / "held", difficulty=0, exclude={p.name for p in train})
    assert len(held) == 40
    assert not {instance_hash(p.name) for p in train} & {instance_hash(p.name) for p in held}


@pytest.mark.parametrize("difficulty", [0, 1, 3])
def test_difficulty_is_the_number_of_distractor_functions(difficulty):
    rng = random.Random(0)
    for _ in range(20):
        inst = make_instance(rng, difficulty)
        module = inst.broken[inst.module_path]
        assert module.count("def ") == 1 + difficulty
        assert len(inst.tests) == 1 + difficulty
        # exactly one line differs between the broken and the gold module
        diff = [(a, b) for a, b in zip(module.splitlines(), inst.gold[inst.module_path].splitlines()) if a != b]
        assert len(diff) == 1


def test_bad_difficulty_is_refused():
    with pytest.raises(TaskError, match="difficulty"):
        make_instance(random.Random(0), 9)


def test_tasks_validate_through_the_real_grader(tmp_path, backend):
    paths = generate_tasks(4, 7, tmp_path, difficulty=2)
    for p in paths:
        task = Task.load(p)
        test_file, f2p_name = task.spec.tests.fail_to_pass[0].split("::")
        assert f"def {f2p_name}(" not in (task.workspace_dir / test_file).read_text()  # hidden from the agent
        assert f"def {f2p_name}(" in task.hidden_tests()[test_file].decode()
        gold = grade(task, task.gold_patch, backend=backend)
        assert gold.resolved, (task.id, gold.tests, gold.log)
        assert gold.p2p_total == 2
        none = grade(task, "", backend=backend)
        assert not none.resolved and none.f2p_passed == 0 and none.p2p_passed == none.p2p_total


def test_minimal_edits_widen_only_when_the_line_is_not_unique():
    text = "def f(a, b):\n    return a - b\n\n\ndef g(a, b):\n    return a - b\n"
    gold = "def f(a, b):\n    return a - b\n\n\ndef g(a, b):\n    return a + b\n"
    (hunks,) = [fp.hunks for fp in parse_patch(tree_diff({"m.py": text}, {"m.py": gold}))]
    ((old, new),) = minimal_edits("m.py", text, hunks)
    assert text.count(old) == 1 and text.replace(old, new) == gold
    assert "def g" in old  # "return a - b" alone occurs twice

    unique = "def f(x):\n    return x * 3\n"
    (hunks,) = [fp.hunks for fp in parse_patch(tree_diff({"m.py": unique}, {"m.py": "def f(x):\n    return x * 4\n"}))]
    assert minimal_edits("m.py", unique, hunks) == [("return x * 3", "return x * 4")]


def test_read_edit_oracle_resolves_in_two_tool_calls_through_the_agent_loop(tmp_path, backend):
    (path,) = generate_tasks(1, 11, tmp_path, difficulty=1)
    task = Task.load(path)
    ws = task_image(task, backend).workspace()
    try:
        traj = asyncio.run(Agent(ReadEditOracle(task), ws, DEMO_AGENT, task_id=task.id).run(task.spec.instruction))
        patch = ws.diff((".venv", "__pycache__", ".pytest_cache"))
    finally:
        ws.close()
    assert traj.stop_reason == "final"
    assert [r.name for r in traj.tool_calls] == ["read_file", "edit_file"] and all(r.ok for r in traj.tool_calls)
    assert [t["function"]["name"] for t in traj.tools] == ["read_file", "edit_file"]
    assert grade(task, patch, backend=backend).resolved
