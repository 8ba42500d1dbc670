"""SWE-bench-style export: the fields, and that the patches rebuild the task."""

from __future__ import annotations

import json
import subprocess

from tasks_util import SMOKE

from opencomposer.tasks.export import export_suite
from opencomposer.tasks.task import Suite

FIELDS = {"instance_id", "repo", "base_commit", "environment_setup_commit", "version", "patch", "test_patch",
          "problem_statement", "hints_text", "created_at", "FAIL_TO_PASS", "PASS_TO_PASS"}


def git_apply(patch: str, cwd) -> None:
    subprocess.run(["git", "apply", "-"], input=patch.encode(), cwd=cwd, check=True, capture_output=True)


def test_export_fields_and_patches_rebuild_the_task(tmp_path):
    out = tmp_path / "smoke.jsonl"
    records = export_suite(SMOKE, out)
    tasks = {t.id: t for t in Suite.load(SMOKE).tasks}
    lines = out.read_text().splitlines()
    assert len(lines) == len(records) == len(tasks)
    for line in lines:
        rec = json.loads(line)
        assert FIELDS <= set(rec)
        task = tasks[rec["instance_id"]]
        assert json.loads(rec["FAIL_TO_PASS"]) == task.spec.tests.fail_to_pass
        assert json.loads(rec["PASS_TO_PASS"]) == task.spec.tests.pass_to_pass
        assert rec["base_commit"] == f"{task.spec.source.package}=={task.spec.source.version}"
        assert rec["problem_statement"] == task.spec.instruction and rec["patch"] == task.gold_patch
    rec = json.loads(lines[0])
    task = tasks[rec["instance_id"]]
    work = tmp_path / "w"
    work.mkdir()
    git_apply(rec["base_patch"], work)  # empty dir -> the starting workspace
    files = {p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file()}
    assert files == {p.relative_to(task.workspace_dir).as_posix() for p in task.workspace_dir.rglob("*") if p.is_file()}
    git_apply(rec["test_patch"], work)
    for rel, data in task.hidden_tests().items():
        assert (work / rel).read_bytes() == data
    git_apply(rec["patch"], work)


def test_cli_export_to_stdout():
    from typer.testing import CliRunner

    from opencomposer.cli import app

    res = CliRunner().invoke(app, ["tasks", "export", str(SMOKE)])
    assert res.exit_code == 0, res.output
    ids = [json.loads(line)["instance_id"] for line in res.stdout.splitlines()]
    assert ids == [t.id for t in Suite.load(SMOKE).tasks]
