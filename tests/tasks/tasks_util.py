"""Helpers for the tasks tests (kept out of conftest.py: tests/*/conftest.py share one module name)."""

from __future__ import annotations

import base64
import hashlib
import zipfile
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


def wheel(dest, name: str, version: str, files: dict[str, str]):
    """A minimal pure-Python wheel (PEP 427), written directly: no build backend, no network."""
    dist = f"{name.replace('-', '_')}-{version}"
    contents = dict(files)
    contents[f"{dist}.dist-info/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    contents[f"{dist}.dist-info/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for rel, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{rel},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    contents[f"{dist}.dist-info/RECORD"] = "\n".join(record) + "\n"
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for rel, text in contents.items():
            z.writestr(rel, text)
    return path
