"""Helpers for the tasks tests (kept out of conftest.py: tests/*/conftest.py share one module name)."""

from __future__ import annotations

from pathlib import Path

from opencomposer.sandbox.base import Limits
from opencomposer.tasks.build import task_image
from opencomposer.tasks.task import Task, text_file_diff

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "tasks" / "suites" / "smoke"


def edit(task: Task, changes: dict[str, str | None]) -> str:
    """A patch against the task's workspace: {relative path: new text, or None to delete}."""
    out = []
    for rel, new in changes.items():
        path = task.workspace_dir / rel
        old = path.read_text() if path.is_file() else None
        out.append(text_file_diff(rel, old, new))
    return "".join(out)


def naive_run(task: Task, patch: str, backend) -> bool:
    """How a naive grader would score the patch: apply it, write the hidden tests, `python -m
    pytest` everything, exit code 0 = pass. Used to show that each hack is real."""
    ws = task_image(task, backend).workspace()
    try:
        assert ws.exec(["git", "apply", "-"], stdin=patch.encode()).ok
        for rel, data in task.hidden_tests().items():
            (ws.root / rel).parent.mkdir(parents=True, exist_ok=True)
            (ws.root / rel).write_bytes(data)
        return ws.exec(".venv/bin/python -m pytest -q -p no:cacheprovider tests", limits=Limits(timeout_s=60)).ok
    finally:
        ws.close()
