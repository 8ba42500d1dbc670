"""Run a package's tests in a sandbox, optionally under coverage with one context per test.

    run_tests(ws, paths, pytest_args, cover=True) -> TestRun
        outcomes  {node id: passed|failed|error|skipped|xfail}
        lines     {file: {line: {test index, or -1 for code run outside any test}}}
        failures  {node id: failed reports} (more than one: failing subtests)

The runner is a small script written into the workspace (like the grader's) that starts
`coverage.Coverage` before pytest imports anything, and switches the dynamic context to the
test's node id around each `pytest_runtest_protocol` (what pytest-cov's `--cov-context=test`
does, without the plugin). pytest runs with the grader's settings (no plugin autoload,
`-o addopts=`, the task's own config file, rootdir /workspace, `python -I`), so the node ids
and outcomes seen here are the ones the grader will see.

    coverage_map(run, sources) -> {(file, unit key): FunctionCoverage}

maps each function (transform.function_units) to the tests that execute a line of its body,
and flags functions whose body runs at import or collection time (context -1): removing
those would break every test, not a feature.

Left out: branch coverage and per-line weights (a test that touches a function at all
counts), and tests that spawn subprocesses (their coverage is not collected).
"""

from __future__ import annotations

import contextlib
import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from opencomposer.errors import SandboxError, TaskError
from opencomposer.sandbox.base import Limits
from opencomposer.sandbox.trees import remove_tree
from opencomposer.tasks.grade import pytest_config
from opencomposer.tasks.task import VENV_DIR
from opencomposer.tasks.transform import Key, Unit, function_units

_RUNNER = r'''
import json, os, sys


def outcome(phases):
    if any(p.endswith(":xfail") for p in phases):
        return "xfail"
    if any(p.endswith(":failed") and not p.startswith("call:") for p in phases):
        return "error"
    if any(p.endswith(":failed") for p in phases):
        return "failed"
    if any(p.endswith(":skipped") for p in phases):
        return "skipped"
    return "passed" if "call:passed" in phases else "error"


def main():
    out, cover, args = sys.argv[1], sys.argv[2] == "1", sys.argv[3:]
    cov = None
    if cover:
        import coverage
        cov = coverage.Coverage(data_file=None, include=["/workspace/*"],
                                omit=["/workspace/.venv/*", os.path.dirname(out) + "/*"])
        cov.start()
    import pytest

    class Recorder:
        def __init__(self):
            self.phases = {}
            self.errors = {}  # node id -> the exception, for telling why the untouched sdist fails

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(self, item, call):
            yield
            if call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception):
                self.errors.setdefault(item.nodeid, f"{call.excinfo.typename}: {call.excinfo.value}"[:300])

        def pytest_collectreport(self, report):
            if report.failed:
                self.errors.setdefault(report.nodeid, str(report.longrepr)[-300:])

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_protocol(self, item, nextitem):
            if cov:
                cov.switch_context(item.nodeid)
            yield
            if cov:
                cov.switch_context("")

        def pytest_runtest_logreport(self, report):
            kind = "xfail" if hasattr(report, "wasxfail") else report.outcome
            self.phases.setdefault(report.nodeid, []).append(report.when + ":" + kind)

    rec = Recorder()
    code = pytest.main(args, plugins=[rec])
    result = {"exit_code": int(code), "outcomes": {n: outcome(p) for n, p in rec.phases.items()},
              "failures": {n: sum(x.endswith(":failed") for x in p) for n, p in rec.phases.items()},
              "errors": rec.errors}
    if cov:
        cov.stop()
        data = cov.get_data()
        tests = sorted(rec.phases)
        index = {t: i for i, t in enumerate(tests)}
        files = {}
        for path in data.measured_files():
            rel = os.path.relpath(path, "/workspace")
            files[rel] = {ln: sorted({index.get(c, -1) for c in ctxs})
                          for ln, ctxs in data.contexts_by_lineno(path).items()}
        result["tests"], result["files"] = tests, files
    with open(out, "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    os._exit(0)


main()
'''


@dataclass
class TestRun:
    """What one run of the test suite gave."""

    outcomes: dict[str, str]
    tests: list[str] = field(default_factory=list)
    """Node ids by index (coverage runs only)."""
    lines: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    """file -> line -> test indices that ran it (-1: outside any test)."""
    failures: dict[str, int] = field(default_factory=dict)
    """node id -> failed reports (more than one: failing subtests, each graded with a traceback)."""
    log: str = ""
    errors: dict[str, str] = field(default_factory=dict)
    """node id (a test, or a file that failed to collect) -> "ExceptionType: message"."""

    def passed(self) -> set[str]:
        return {t for t, o in self.outcomes.items() if o == "passed"}

    def to_json(self) -> dict:
        return {"outcomes": self.outcomes, "tests": self.tests, "errors": self.errors,
                "lines": {f: {str(k): v for k, v in ls.items()} for f, ls in self.lines.items()}}

    @classmethod
    def from_json(cls, data: dict) -> "TestRun":
        return cls(data["outcomes"], data["tests"],
                   {f: {int(k): v for k, v in ls.items()} for f, ls in data["lines"].items()},
                   errors=data.get("errors", {}))


def run_tests(ws, paths: list[str], pytest_args: list[str], *, cover: bool = False,
              timeout_s: float = 900) -> TestRun:
    """Run pytest on `paths` in workspace `ws` with the grader's settings; see the module docstring."""
    private = f".oc-mine-{secrets.token_hex(6)}"
    (ws.root / private).mkdir()
    try:
        (ws.root / private / "run.py").write_text(_RUNNER)
        config = pytest_config(ws.root)
        if config is None:
            (ws.root / private / "pytest.ini").write_text("[pytest]\n")
            config = f"{private}/pytest.ini"
        args = [f"/workspace/{private}/out.json", "1" if cover else "0",
                "-c", f"/workspace/{config}", "--rootdir=/workspace", "--confcutdir=/workspace",
                "-p", "no:cacheprovider", "-o", "addopts=", "--continue-on-collection-errors",
                "-q", "--tb=no", "-rN", *pytest_args, "--", *paths]
        env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
               "PATH": f"/workspace/{VENV_DIR}/bin:/usr/bin:/bin"}
        res = ws.exec([f"{VENV_DIR}/bin/python", "-I", f"/workspace/{private}/run.py", *args], env=env,
                      limits=Limits(timeout_s=timeout_s, memory_mb=4096, output_bytes=200_000))
        log = (res.stdout + res.stderr)[-3000:]
        out = ws.root / private / "out.json"
        if res.timed_out or not out.is_file():
            why = "timed out" if res.timed_out else f"exited with code {res.exit_code} before writing results"
            raise TaskError(f"running the tests ({' '.join(paths)}) {why}:\n{log}")
        data = json.loads(out.read_text())
    finally:
        with contextlib.suppress(SandboxError):
            remove_tree(ws.root / private)
    lines = {f: {int(k): v for k, v in ls.items()} for f, ls in data.get("files", {}).items()}
    return TestRun(data["outcomes"], data.get("tests", []), lines, data.get("failures", {}), log,
                   data.get("errors", {}))


@dataclass(frozen=True)
class FunctionCoverage:
    """One function of a source file and the tests that run its body."""

    path: str
    unit: Unit
    tests: frozenset[str]
    """Passing tests that execute at least one line of the body."""
    import_time: bool
    """Some body line runs outside any test (import, collection, fixtures at session start)."""

    @property
    def key(self) -> tuple[str, Key]:
        return (self.path, self.unit.key)


def coverage_map(run: TestRun, sources: dict[str, str]) -> dict[tuple[str, Key], FunctionCoverage]:
    """Per function of `sources` ({path: text}, the non-test files), the passing tests covering it."""
    passed = run.passed()
    out = {}
    for path, text in sources.items():
        lines = run.lines.get(path, {})
        for unit in function_units(text):
            if not unit.body_start:
                continue
            hits: set[int] = set()
            for ln in range(unit.body_start, unit.end_line + 1):
                hits.update(lines.get(ln, ()))
            tests = frozenset(run.tests[i] for i in hits if i >= 0 and run.tests[i] in passed)
            fc = FunctionCoverage(path, unit, tests, -1 in hits)
            out[fc.key] = fc
    return out
