"""Suite validation: the committed smoke suite is valid; broken tasks and flaky tests are caught."""

from __future__ import annotations

import json
import shutil

import pytest
from tasks_util import SMOKE

from opencomposer.tasks.grade import GradeResult
from opencomposer.tasks.task import Suite, SuiteSpec, Task
from opencomposer.tasks.validate import flaky_tests, validate_suite, validate_task


@pytest.mark.slow
def test_smoke_suite_is_valid_end_to_end(backend):
    report = validate_suite(SMOKE, jobs=2, backend=backend, progress=False)
    assert report["tasks"] >= 12
    assert report["valid"] == report["tasks"], [r for r in report["results"] if not r["valid"]]
    stats = report["stats"]
    assert set(stats) == {"median_lines_changed", "median_files_changed", "median_instruction_chars", "packages"}
    assert stats["packages"] >= 10 and stats["median_instruction_chars"] < 120


def test_cli_validate_json_on_a_two_task_suite(tmp_path):
    from typer.testing import CliRunner

    from opencomposer.cli import app

    for task in Suite.load(SMOKE).tasks[:2]:
        shutil.copytree(task.path, tmp_path / task.id)
    Suite(tmp_path, SuiteSpec(name="two", version="1"), []).save()
    res = CliRunner().invoke(app, ["tasks", "validate", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert (report["tasks"], report["valid"]) == (2, 2)
    assert {"median_lines_changed", "median_files_changed", "median_instruction_chars", "packages"} == set(report["stats"])
    assert all(r["broken_s"] > 0 and r["gold_s"] > 0 for r in report["results"])


def test_invalid_task_is_reported(clamp_task, tmp_path, backend):
    path = tmp_path / clamp_task.id
    shutil.copytree(clamp_task.path, path)
    task = Task.load(path)
    task.spec.tests.fail_to_pass.append("tests/test_numbers.py::test_gcd")  # passes on the broken code
    task.spec.tests.pass_to_pass.remove("tests/test_numbers.py::test_gcd")
    task.spec.stats.gold_lines_changed += 1
    task.save()
    v = validate_task(Task.load(path), backend=backend)
    assert not v.valid
    assert any("fail-to-pass tests/test_numbers.py::test_gcd passed (must fail)" in p for p in v.problems)
    assert any("stats" in p for p in v.problems)


def test_flaky_tests_are_those_that_change_between_runs():
    def run(**tests):
        return GradeResult(False, 0, 0, 0, 0, tests={k.replace("_", "::", 1): v for k, v in tests.items()})
    runs = [run(a_x="passed", a_y="failed"), run(a_x="passed", a_y="passed")]
    assert flaky_tests(runs) == {"a::y"}
    assert flaky_tests(runs[:1]) == set()
