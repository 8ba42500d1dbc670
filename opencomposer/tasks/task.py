"""The task format: one human-readable directory per task, and suites of tasks.

A task directory holds:

    task.toml        id, source, instruction, test ids, environment, stats (models below)
    gold.patch       the reference solution: a git-style unified diff against the task's
                     broken workspace (apply with `git apply`, paths a/ b/)
    hidden_tests/    files the agent never sees, at their repo-relative paths
                     (hidden_tests/tests/test_core.py is restored to tests/test_core.py
                     before grading); they overwrite the workspace's visible versions
    workspace/       source.kind == "generated": the broken project tree as the agent sees it
    break.patch      source.kind == "pypi": a diff that turns the unpacked sdist into the
                     broken workspace (bodies removed, hidden tests deleted or trimmed)

The agent's workspace is therefore either `workspace/` (small generated tasks, readable
as is) or sdist + `break.patch` (real packages: the sdist is fetched and checked against its
sha256, never committed). Either way the hidden tests are absent from it, and the venv with
the pinned test requirements lives at /workspace/.venv as its own layer (see build.py).

A suite directory holds `suite.toml` (name, version, description, task globs) and the task
directories. Loading validates every field; a malformed file raises `TaskError` naming the
file and the field.

Not covered here: building images (build.py), grading (grade.py), mining tasks from real
packages (later work).
"""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path
from typing import Literal, TypeVar

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from opencomposer.errors import TaskError
from opencomposer.sandbox.diff import DIFF_EXCLUDE, file_diff

TASK_FILE = "task.toml"
SUITE_FILE = "suite.toml"
GOLD_PATCH = "gold.patch"
BREAK_PATCH = "break.patch"
HIDDEN_DIR = "hidden_tests"
WORKSPACE_DIR = "workspace"
VENV_DIR = ".venv"
"""The venv lives at /workspace/.venv in every task image; diffs and patches exclude it."""


M = TypeVar("M", bound=BaseModel)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Source(_Strict):
    """Where the task's code comes from."""

    kind: Literal["pypi", "generated", "local"]
    """"pypi": an sdist from PyPI plus break.patch; "generated": a workspace/ tree in the task;
    "local": a project directory on this machine (`path`) plus break.patch."""
    package: str
    """Distribution name on PyPI (or the generated project's package name)."""
    version: str
    """Exact version (pypi) or the generator's version (generated)."""
    sha256: str
    """sha256 of the sdist file, "generated", or the local tree's hash (local.tree_hash)."""
    path: str | None = None
    """local: the project directory the task was mined from."""
    commit: str | None = None
    """local: its git HEAD when mined, if it is a git checkout."""

    @model_validator(mode="after")
    def _check_sha(self) -> "Source":
        if self.kind == "local" and not self.path:
            raise ValueError("a local source needs path (the project directory)")
        if self.kind in ("pypi", "local") and (len(self.sha256) != 64 or not all(c in "0123456789abcdef" for c in self.sha256)):
            raise ValueError("sha256 must be the 64 lowercase hex digits of the sdist for a pypi source")
        if self.kind == "generated" and self.sha256 != "generated":
            raise ValueError('sha256 must be "generated" for a generated source')
        return self


class TaskTests(_Strict):
    """The tests that decide the task: pytest node ids relative to the workspace root."""

    fail_to_pass: list[str] = Field(min_length=1)
    """Fail on the broken workspace, pass with the gold patch."""
    pass_to_pass: list[str] = []
    """Pass on both (regression guard)."""
    timeout_s: float = 120.0
    """Wall-clock limit for one grading run of all the named tests."""

    @model_validator(mode="after")
    def _check_ids(self) -> "TaskTests":
        for nid in self.fail_to_pass + self.pass_to_pass:
            if "::" not in nid or nid.startswith("/") or ".." in nid.split("::")[0].split("/"):
                raise ValueError(f"{nid!r} is not a pytest node id relative to the workspace (path.py::test)")
        both = set(self.fail_to_pass) & set(self.pass_to_pass)
        if both:
            raise ValueError(f"tests listed as both fail_to_pass and pass_to_pass: {sorted(both)}")
        return self


class Environment(_Strict):
    """How the venv layer is built and how tests are run."""

    requirements: list[str] = Field(min_length=1)
    """Pinned requirements (`name==version`) installed into /workspace/.venv; must include pytest."""
    setup: list[str] = []
    """Shell commands run in /workspace after the install (e.g. `.venv/bin/pip install --no-deps -e .`)."""
    test: str = ".venv/bin/python -m pytest -q"
    """How a person (or the agent) runs the visible tests; the grader uses its own hardened command."""
    pytest_args: list[str] = []
    """Extra arguments the grader passes to pytest (e.g. ["-p", "pytester"]); plugin autoload is off."""
    find_links: str | None = None
    """A directory of wheels/sdists pip may install requirements from besides PyPI (a local project's)."""

    @model_validator(mode="after")
    def _check_pins(self) -> "Environment":
        loose = [r for r in self.requirements if "==" not in r]
        if loose:
            raise ValueError(f"requirements must be pinned with ==: {loose}")
        if not any(r.split("==")[0].strip().lower() == "pytest" for r in self.requirements):
            raise ValueError("requirements must pin pytest (the grader runs it)")
        return self


class Stats(_Strict):
    """Size of the task, for suite statistics."""

    gold_lines_changed: int
    """Added plus removed lines in gold.patch."""
    gold_files_changed: int
    """Files touched by gold.patch."""
    instruction_chars: int
    """len(instruction)."""


class TaskSpec(_Strict):
    """Contents of task.toml."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    """Unique id; also the directory name."""
    instruction: str = Field(min_length=1)
    """What the agent is asked to do: terse, like a real request."""
    created: str = "1970-01-01T00:00:00Z"
    """ISO timestamp of the task's creation (exported as created_at)."""
    source: Source
    tests: TaskTests
    environment: Environment
    stats: Stats


class Task:
    """A loaded task directory: its spec plus accessors for the files beside it."""

    def __init__(self, path: Path, spec: TaskSpec):
        self.path = path
        self.spec = spec

    @property
    def id(self) -> str:
        return self.spec.id

    @classmethod
    def load(cls, path: Path | str) -> "Task":
        path = Path(path)
        spec = _read_toml(path / TASK_FILE, TaskSpec)
        task = cls(path, spec)
        for name in (GOLD_PATCH, HIDDEN_DIR):
            if not (path / name).exists():
                raise TaskError(f"{path}: missing {name} (every task needs a gold patch and hidden tests)")
        need = WORKSPACE_DIR if spec.source.kind == "generated" else BREAK_PATCH
        if not (path / need).exists():
            raise TaskError(f"{path}: missing {need} (required for source.kind = {spec.source.kind!r})")
        return task

    def save(self, path: Path | str | None = None) -> Path:
        """Write task.toml (other files are written by whoever creates the task)."""
        path = Path(path or self.path)
        path.mkdir(parents=True, exist_ok=True)
        data = self.spec.model_dump(mode="json", exclude_none=True)  # TOML has no null
        (path / TASK_FILE).write_text(tomli_w.dumps(data, multiline_strings=True))
        self.path = path
        return path

    @property
    def gold_patch(self) -> str:
        return (self.path / GOLD_PATCH).read_text()

    @property
    def break_patch(self) -> str:
        return (self.path / BREAK_PATCH).read_text()

    @property
    def workspace_dir(self) -> Path:
        return self.path / WORKSPACE_DIR

    def hidden_tests(self) -> dict[str, bytes]:
        """Repo-relative path -> content of every hidden test file."""
        root = self.path / HIDDEN_DIR
        return {p.relative_to(root).as_posix(): p.read_bytes()
                for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}

    @property
    def test_ids(self) -> list[str]:
        return self.spec.tests.fail_to_pass + self.spec.tests.pass_to_pass

    def test_dirs(self) -> set[str]:
        """Directories holding the task's tests: any change the patch makes under them is undone."""
        files = {nid.split("::")[0] for nid in self.test_ids} | set(self.hidden_tests())
        return {str(Path(f).parent.as_posix()) for f in files if Path(f).parent.as_posix() != "."}


class SuiteSpec(_Strict):
    """Contents of suite.toml."""

    name: str
    version: str
    description: str = ""
    tasks: list[str] = ["*"]
    """Task directory names or globs, relative to the suite directory."""
    miner: dict[str, str | int | float | list[str]] = {}
    """Settings of the miner that made the suite (mine.py), so it can be regenerated; {} if hand-made."""


class Suite:
    """A loaded suite directory: its spec and its tasks, sorted by id."""

    def __init__(self, path: Path, spec: SuiteSpec, tasks: list[Task]):
        self.path, self.spec, self.tasks = path, spec, tasks

    @classmethod
    def load(cls, path: Path | str) -> "Suite":
        path = Path(path)
        spec = _read_toml(path / SUITE_FILE, SuiteSpec)
        dirs = sorted(d for d in path.iterdir() if (d / TASK_FILE).is_file())
        chosen = [d for d in dirs if any(fnmatch.fnmatch(d.name, g) for g in spec.tasks)]
        tasks = [Task.load(d) for d in chosen]
        ids = [t.id for t in tasks]
        if len(set(ids)) != len(ids):
            raise TaskError(f"{path}: duplicate task ids {sorted({i for i in ids if ids.count(i) > 1})}")
        if not tasks:
            raise TaskError(f"{path}: suite.toml's tasks {spec.tasks} match no task directory")
        return cls(path, spec, sorted(tasks, key=lambda t: t.id))

    def save(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        spec = self.spec.model_dump(mode="json")
        if not spec["miner"]:  # hand-made and generated suites have no miner settings
            del spec["miner"]
        (self.path / SUITE_FILE).write_text(tomli_w.dumps(spec, multiline_strings=True))


def _read_toml(file: Path, model: type[M]) -> M:
    """Parse and validate a TOML file, turning every failure into a TaskError naming the field."""
    if not file.is_file():
        raise TaskError(f"{file}: not found (a task directory needs {TASK_FILE}, a suite {SUITE_FILE})")
    try:
        data = tomllib.loads(file.read_text())
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"{file}: invalid TOML: {e}") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        lines = [f"  field '{'.'.join(str(x) for x in err['loc']) or '(top level)'}': {err['msg']}"
                 for err in e.errors()]
        raise TaskError(f"{file}: malformed {model.__name__}:\n" + "\n".join(lines)) from None


# --- diffs ------------------------------------------------------------------------------


def _text_side(text: str | None) -> tuple[str, bytes] | None:
    return None if text is None else ("100644", text.encode())


def text_file_diff(rel: str, old: str | None, new: str | None) -> str:
    """A git-style diff of one text file (old None: created; new None: deleted): sandbox/diff.py's
    writer, the one an agent's workspace patch comes from, over a regular file's text."""
    return file_diff(rel, _text_side(old), _text_side(new))


def diff_excludes() -> tuple[str, ...]:
    """What a workspace's patch leaves out: the venv layer and what test runs leave behind."""
    return (*DIFF_EXCLUDE, VENV_DIR)


def tree_diff(old: dict[str, str], new: dict[str, str]) -> str:
    """A git-style diff between two {relpath: text} trees, files in sorted order."""
    return "".join(text_file_diff(p, old.get(p), new.get(p)) for p in sorted(set(old) | set(new)))


def patch_stats(patch: str) -> tuple[int, int]:
    """(lines changed = added + removed, files changed) of a unified diff."""
    lines = files = 0
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            files += 1
        elif line.startswith(("+++", "---")):
            continue
        elif line.startswith(("+", "-")):
            lines += 1
    if files == 0:  # a plain (non-git) unified diff
        files = sum(1 for line in patch.splitlines() if line.startswith("+++ "))
    return lines, files
