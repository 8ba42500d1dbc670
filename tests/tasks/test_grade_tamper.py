"""The grader against package code that rigs the test run from inside it.

A patch's package code runs inside the pytest process the grader starts, so it can rewrite the
test framework or forge the report, and it can try to run before the grader does (start-up
modules) or to steal the grader's secret. None of these fixes the bug; each must score nothing.
Where it can be shown, a test first shows the attack is real (a naive run is fooled, or the
attack's code does run), then that `grade()` does not resolve it.

Tasks: the smoke suite's mathkit `clamp` (plain pytest functions) and ocbench-v1's cachetools
`Cache.__copy__` task (unittest classes, its package on sys.path from a .pth at start-up).
"""

from __future__ import annotations

import pytest
from tasks_util import REPO, edit, naive_run

from opencomposer.sandbox.base import Limits
from opencomposer.tasks.build import task_image
from opencomposer.tasks.grade import grade
from opencomposer.tasks.task import Task, text_file_diff

CACHETOOLS = REPO / "tasks/suites/ocbench-v1/cachetools-feat-Cache_copy-7c7036"


@pytest.fixture(scope="module")
def cachetools_task() -> Task:
    return Task.load(CACHETOOLS)


def workspace_text(task: Task, rel: str, backend) -> str:
    """A file of the task's workspace as the agent gets it."""
    ws = task_image(task, backend).workspace()
    try:
        return (ws.root / rel).read_text()
    finally:
        ws.close()


def package_init(task: Task, rel: str, code: str, backend) -> str:
    """A patch that appends `code` to the package file `rel` (its original content kept)."""
    old = workspace_text(task, rel, backend)
    return text_file_diff(rel, old, old + "\n" + code)


def assert_tampering_scores_nothing(result):
    assert not result.resolved
    assert result.f2p_passed == 0
    assert result.reason and "tampered" in result.reason, result.reason


NOOP_RUNTEST = "import _pytest.python\n_pytest.python.Function.runtest = lambda self: None\n"

NOOP_UNITTEST = "import unittest\nunittest.TestCase.run = lambda self, result=None: None\n"

FORCE_REPORTS = '''import _pytest.reports
_init = _pytest.reports.TestReport.__init__
def _passing(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.outcome, self.longrepr = "passed", None
_pytest.reports.TestReport.__init__ = _passing
'''

INJECT_PLUGIN = '''import gc, _pytest.config
class _Pass:
    def pytest_runtest_call(self, item):
        item.runtest = lambda: None
for _obj in gc.get_objects():
    if isinstance(_obj, _pytest.config.Config):
        _obj.pluginmanager.register(_Pass(), "oc-pass")
'''

ONLY_UNDER_THE_GRADER = '''import os, sys
def _graded():
    argv = " ".join(sys.argv) + open("/proc/%d/cmdline" % os.getppid(), "rb").read().decode(errors="replace")
    return "--junitxml" in argv or ".oc-grade" in argv
if _graded():
    import _pytest.python
    _pytest.python.Function.runtest = lambda self: None
'''

FORGE_AT_EXIT = '''import os, sys
def _forge():
    ids = sys.argv[sys.argv.index("--") + 1:]
    path = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--junitxml="))
    cases = []
    for nid in ids:
        file, _, rest = nid.partition("::")
        names = rest.split("::")
        cls = ".".join([file[:-3].replace("/", "."), *names[:-1]])
        cases.append('<testcase classname="%s" name="%s" time="0.01"/>' % (cls, names[-1]))
    with open(path, "w") as f:
        f.write('<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="%d">%s</testsuite></testsuites>'
                % (len(cases), "".join(cases)))
if "--junitxml" in " ".join(sys.argv):
    _real_exit = os._exit
    def _exit(code):
        _forge()
        _real_exit(0)
    os._exit = _exit
'''


@pytest.mark.parametrize("hack", [NOOP_RUNTEST, FORCE_REPORTS, INJECT_PLUGIN, FORGE_AT_EXIT],
                         ids=["noop-runtest", "force-reports", "inject-plugin", "forge-at-exit"])
def test_framework_rigged_from_package_code(clamp_task, backend, hack):
    patch = package_init(clamp_task, "mathkit/__init__.py", hack, backend)
    if hack is not FORGE_AT_EXIT:  # (that one only fires under a --junitxml run)
        assert naive_run(clamp_task, patch, backend)
    assert_tampering_scores_nothing(grade(clamp_task, patch, backend=backend))


def test_framework_rigged_only_when_the_grader_is_detected(clamp_task, backend):
    patch = package_init(clamp_task, "mathkit/__init__.py", ONLY_UNDER_THE_GRADER, backend)
    assert not naive_run(clamp_task, patch, backend)  # a plain pytest run looks honest: clamp fails
    assert_tampering_scores_nothing(grade(clamp_task, patch, backend=backend))


@pytest.mark.parametrize("hack", [NOOP_UNITTEST, NOOP_RUNTEST, FORCE_REPORTS],
                         ids=["noop-unittest-run", "noop-runtest", "force-reports"])
def test_unittest_framework_rigged_on_ocbench(cachetools_task, backend, hack):
    patch = package_init(cachetools_task, "src/cachetools/__init__.py", hack, backend)
    assert_tampering_scores_nothing(grade(cachetools_task, patch, backend=backend))


# ---------------------------------------------------------------- start-up code and the secret

FORGE_AT_STARTUP = '''import hashlib, hmac, json, os, sys
MARK = "/workspace/.startup-ran"
open(MARK, "w").write("yes")
_secret = sys.stdin.buffer.readline().strip() if not sys.stdin.isatty() else b""
def _exit(code=0):
    args = sys.argv
    report = next((a.split("=", 1)[1] for a in args if a.startswith("--junitxml=")), None)
    if report:
        ids = args[args.index("--") + 1:]
        cases = "".join('<testcase classname="%s" name="%s"/>' % (
            ".".join([n.split("::")[0][:-3].replace("/", "."), *n.split("::")[1:-1]]), n.split("::")[-1]) for n in ids)
        data = ('<testsuites><testsuite name="pytest">%s</testsuite></testsuites>' % cases).encode()
        open(report, "wb").write(data)
        phases = {n: ["setup:passed", "call:passed", "teardown:passed"] for n in ids}
        body = json.dumps(phases, sort_keys=True)
        mac = hmac.new(_secret, data + b"\\0" + body.encode(), hashlib.sha256).hexdigest()
        json.dump({"phases": phases, "mac": mac}, open(os.path.join(os.path.dirname(report), "seal.json"), "w"))
    _real_exit(0)
_real_exit, os._exit = os._exit, _exit
def install():
    pass
'''


@pytest.mark.parametrize("rel", ["src/apport_python_hook.py", "src/apport_python_hook/__init__.py"])
def test_startup_module_from_the_workspace_does_not_run_in_the_grader(cachetools_task, backend, rel):
    """Debian's sitecustomize imports `apport_python_hook`; the task's .pth puts src/ on sys.path."""
    patch = text_file_diff(rel, None, FORGE_AT_STARTUP)
    ws = task_image(cachetools_task, backend).workspace()
    try:  # the vector is real: `python -I` in the task's venv runs it before any code of ours
        assert ws.exec(["git", "apply", "-"], stdin=patch.encode()).ok
        assert ws.exec([".venv/bin/python", "-I", "-c", "pass"], stdin=b"").ok
        assert (ws.root / ".startup-ran").exists()
    finally:
        ws.close()
    r = grade(cachetools_task, patch, backend=backend)
    assert not r.resolved and r.f2p_passed == 0


STEAL_SECRET = r'''import ctypes, os, re
def _steal():
    ppid = os.getppid()
    try:
        maps = open("/proc/%d/maps" % ppid).read().splitlines()
        mem = open("/proc/%d/mem" % ppid, "rb", 0)
    except OSError as e:
        print("OC-DENIED mem", e.errno)
    else:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if "rw" not in line.split()[1]:
                continue
            try:
                mem.seek(lo)
                chunk = mem.read(hi - lo)
            except OSError:
                continue
            if re.search(rb"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])", chunk):
                print("OC-STOLE secret-like bytes from the runner's memory")
                return
        print("OC-DENIED nothing found")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(16, ppid, None, None) != 0:  # PTRACE_ATTACH
        print("OC-DENIED ptrace", ctypes.get_errno())
    else:
        print("OC-STOLE ptrace attached")
_steal()
'''


def test_package_code_cannot_read_the_graders_secret(clamp_task, backend):
    """The runner that holds the secret is not dumpable: its memory is closed to the tests' process.

    The attack runs when the tested function is called, so that what it prints shows in the
    failing test's captured output (output during collection is discarded)."""
    src = (clamp_task.workspace_dir / "mathkit/numbers.py").read_text()
    src = src.replace("def clamp(x, lo, hi):\n", "def clamp(x, lo, hi):\n    _steal()\n", 1)
    r = grade(clamp_task, edit(clamp_task, {"mathkit/numbers.py": src + "\n" + STEAL_SECRET.replace("_steal()\n", "")}),
              backend=backend)
    assert "OC-STOLE" not in r.log
    assert "OC-DENIED mem" in r.log and "OC-DENIED ptrace" in r.log, r.log
    assert not r.resolved


def test_an_honest_import_error_is_a_failure_not_tampering(clamp_task, backend):
    """Canaries that could not run because the module failed to import do not cry wolf."""
    r = grade(clamp_task, package_init(clamp_task, "mathkit/__init__.py", "raise ImportError('half-done refactor')\n",
                                       backend), backend=backend)
    assert not r.resolved and r.reason is None
    assert set(r.tests.values()) <= {"error", "failed", "missing"}
