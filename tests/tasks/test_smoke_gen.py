"""The smoke task generator: deterministic, its mutations are sound, the committed suite is its output."""

from __future__ import annotations

import ast

import pytest
from tasks_util import SMOKE

from opencomposer.errors import TaskError
from opencomposer.tasks.smoke import (MUTATIONS, Mutation, body_removals, catalog, drop_tests, generate_tasks,
                                      mutate, project_files, task_id)


def tree(path):
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_every_mutation_applies_and_changes_its_function():
    singles, pairs = catalog()
    assert len(singles) >= 90 and len(pairs) >= 200  # hundreds of distinct tasks for RL
    assert len({task_id(c) for c in singles + pairs}) == len(singles) + len(pairs)
    for (m,) in singles:
        src = project_files(m.project)[m.path]
        broken = mutate(src, m)
        assert broken != src
        ast.parse(broken)


def test_remove_body_keeps_signature_and_docstring():
    m = next(m for m in body_removals("bank") if m.qualname == "Account.withdraw")
    broken = mutate(project_files("bank")["bank/account.py"], m)
    assert "    def withdraw(self, amount):\n        \"\"\"Take out a positive amount;" in broken
    assert "InsufficientFunds(f" not in broken
    assert "        raise NotImplementedError\n" in broken
    assert "def deposit(self, amount):" in broken and 'raise ValueError("deposit must be positive")' in broken


def test_textual_mutation_must_match_once():
    bad = Mutation("mathkit", "mathkit/numbers.py", "clamp", "flip_operator", old="no such text", new="x")
    with pytest.raises(TaskError, match="occurs 0 times"):
        mutate(project_files("mathkit")["mathkit/numbers.py"], bad)


def test_drop_tests():
    src = project_files("mathkit")["tests/test_numbers.py"]
    out = drop_tests(src, {"test_clamp", "test_mean"})
    names = [n.name for n in ast.parse(out).body if isinstance(n, ast.FunctionDef)]
    assert names == ["test_gcd", "test_is_prime"]
    assert drop_tests(src, {"test_clamp", "test_gcd", "test_is_prime", "test_mean"}) == ""


def test_generation_is_deterministic(tmp_path, backend):
    a = generate_tasks(3, 7, tmp_path / "a", backend=backend)
    b = generate_tasks(3, 7, tmp_path / "b", backend=backend)
    assert [p.name for p in a] == [p.name for p in b]
    assert tree(tmp_path / "a") == tree(tmp_path / "b")
    assert len({p.name.split("-")[0] for p in a}) == 3  # round-robin across projects


@pytest.mark.slow
def test_committed_smoke_suite_is_the_generators_output(tmp_path, backend):
    generate_tasks(16, 0, tmp_path / "smoke", backend=backend)
    assert tree(tmp_path / "smoke") == tree(SMOKE), "regenerate: python -m opencomposer.tasks.smoke --n 16 --seed 0"


def test_mutations_table_names_real_functions():
    for m in MUTATIONS:
        assert m.says and "{f}" in m.says, m


def test_pair_task_spans_two_files_and_validates(tmp_path, backend):
    from opencomposer.tasks.smoke import make_task
    from opencomposer.tasks.task import Task
    from opencomposer.tasks.validate import validate_task

    _, pairs = catalog()
    pair = next(p for p in pairs if p[0].path != p[1].path and p[0].kind == p[1].kind == "remove_body")
    task = Task.load(make_task(pair, tmp_path, backend))
    assert task.spec.stats.gold_files_changed == 2
    assert task.spec.instruction.count("Implement") == 2
    v = validate_task(task, backend=backend, runs=1)
    assert v.valid, v.problems
