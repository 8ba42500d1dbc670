"""The grader: apply a patch to a fresh fork of the task, restore the hidden tests, run them.

    fresh workspace of the task image
      -> git apply PATCH (inside the sandbox; a patch that does not apply, or is over
         MAX_PATCH_BYTES, scores nothing; binary files apply whole, see sandbox/diff.py)
      -> undo every change the patch made to test infrastructure (list below)
      -> write hidden_tests/ over the workspace, with canary tests planted in each test module
      -> a runner (holding a secret) starts pytest in a child process on the named node ids,
         hardened, JUnit XML to a random private path; it seals report + the child's
         per-phase record with a MAC when the child is done
      -> a test passes iff the sealed JUnit report and the per-phase record both say "passed"
         and every canary reported what it must
    resolved = every fail-to-pass and every pass-to-pass test passed

Reward hacks that score nothing, each with a test in tests/tasks/test_grade.py or
tests/tasks/test_grade_tamper.py:

- editing or deleting tests: every path the patch touches (per `git apply --numstat`) that
  is test infrastructure is put back as it was in the task image (or removed if the patch
  created it), then the hidden tests are written over the workspace. Test infrastructure:
  any file under a directory that holds the task's tests, test_*.py / *_test.py,
  conftest.py, pytest/tox/setup.cfg/pyproject configuration files.
- a conftest.py that skips or passes everything: new conftest files anywhere are removed,
  changed ones restored (same rule).
- pytest plugins and hooks: plugin autoload is off (PYTEST_DISABLE_PLUGIN_AUTOLOAD=1, so
  entry points in *.egg-info / *.dist-info do nothing), `-o addopts=` drops ini addopts,
  `-c` names the task's own (restored) config, `-p no:cacheprovider`; *.egg-info,
  *.dist-info, *.pth, sitecustomize.py / usercustomize.py, pytest.py, py.py, pluggy.py,
  _pytest/, pytest/, pluggy/, __pycache__ and *.pyc files the patch adds are removed.
- python path tricks and start-up code: both the runner and pytest's process start with
  `-I -S`: no cwd or script dir on sys.path, no PYTHON* variables, no user site, and no
  `site` at start-up, so no sitecustomize/usercustomize runs (Debian's sitecustomize imports
  `apport_python_hook`, a name any directory on the task's sys.path could provide). The
  pytest process then adds the venv's site-packages as `site` would (its .pth files, which
  the patch cannot touch: a patch touching `.venv/` is rejected outright), so nothing the
  patch wrote runs before pytest imports the code under test.
- sys.exit / os._exit in package code or in a test: SystemExit in a test is a failure; an
  exit during collection is a collection error; a process that exits before pytest writes
  its report leaves no sealed report, and every test counts as failed.
- tests marked skip / xfail by the patch: only "passed" counts; skipped, xfailed and errors
  do not; `-o xfail_strict=true` turns an xpass into a failure, and the per-phase record
  notes any report carrying `wasxfail`, which never counts as passed.
- a fake JUnit report or seal: the report path is random; the secret goes to the runner on
  stdin, is read before anything else runs, and never reaches the pytest process: that
  process is a fresh interpreter (not a fork) and the runner makes itself non-dumpable, so
  /proc/PID/mem and ptrace are closed to it. A seal written by anyone but the runner, or a
  report changed after it sealed it, fails the MAC; the report must name each requested
  node id exactly once.
- package code that rigs the framework from inside the pytest process (a no-op
  `Function.runtest` or `unittest.TestCase.run`, reports forced to "passed", a plugin
  registered at run time, a passing report written at exit, any of these only when it
  detects the grader): canary tests with fresh random names, planted in every test module
  that holds requested tests, must fail, error or pass in known ways (canary.py). A canary
  reported otherwise, or a module whose tests pass while its canaries did not run, means the
  run was tampered with: reason set, nothing counts.

Not covered (the sandbox bounds the damage, the trajectory shows the attempt): code in the
pytest process that reads the hidden test files at run time, tells the canaries from the
real tests by their source and rigs only the real ones (everything the pytest process
reports is, in the end, that process's word; canaries make a generic rig show itself, a
targeted one has to see the hidden tests first), and code that special-cases the hidden
tests' inputs (hidden tests are the defence against that: the agent never sees them).
Canary failures appear in the log tail like any other failing test.
"""

from __future__ import annotations

import codecs
import errno
import fnmatch
import hashlib
import hmac
import json
import os
import random
import re
import secrets
import stat
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from opencomposer.sandbox.base import Backend, Image, Limits
from opencomposer.sandbox.trees import remove_tree
from opencomposer.tasks import canary
from opencomposer.tasks.build import default_backend, task_image
from opencomposer.tasks.task import VENV_DIR, Task

CONFIG_FILES = ("pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "pyproject.toml", "tox.ini", "setup.cfg")
"""pytest's own discovery order within one directory."""
PROTECTED_NAMES = {"conftest.py", *CONFIG_FILES, "sitecustomize.py", "usercustomize.py",
                   "pytest.py", "py.py", "pluggy.py", "_pytest.py"}
PROTECTED_PARTS = ("__pycache__", "_pytest", "pytest", "pluggy", "*.egg-info", "*.dist-info")
PROTECTED_GLOBS = ("test_*.py", "*_test.py", "*.pth", "*.pyc", "*.pyo")
MAX_PATCH_BYTES = 8 << 20
"""Larger patches score nothing unread: a fix is kilobytes; this bounds the grader's work and memory."""

_RUNNER = r'''
"""The grader's runner: started with -I -S, so nothing but the standard library has run yet."""
import ctypes, hashlib, hmac, json, os, select, subprocess, sys

PR_SET_DUMPABLE = 4
MAX_RECORD = 64 << 20


def read_record(fd, child):
    """The child's per-phase lines, until it closes the pipe or exits (a grandchild may hold the pipe)."""
    data = bytearray()
    while len(data) < MAX_RECORD:
        if select.select([fd], [], [], 0.2)[0]:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            data += chunk
        elif child.poll() is not None:
            break
    os.close(fd)
    phases = {}
    for line in bytes(data).decode("utf-8", "replace").splitlines():
        try:
            nodeid, when, kind = json.loads(line)
        except (ValueError, TypeError):
            continue
        phases.setdefault(str(nodeid), []).append(f"{when}:{kind}")
    return phases


def main():
    secret = sys.stdin.buffer.readline().strip()
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    # The tests run in a child that must not read the secret from this process's memory
    # (/proc/PID/mem, ptrace): a non-dumpable process is closed to both without CAP_SYS_PTRACE.
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        sys.exit("grader: prctl(PR_SET_DUMPABLE) failed")
    report, seal, tests = sys.argv[1:4]
    r, w = os.pipe()
    child = subprocess.Popen([sys.executable, "-I", "-S", tests, str(w), *sys.argv[4:]],
                             pass_fds=(w,), stdin=subprocess.DEVNULL)
    os.close(w)
    phases = read_record(r, child)
    code = child.wait()
    try:
        fd = os.open(report, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            data = f.read()
    except OSError:
        os._exit(code if code else 1)
    body = json.dumps(phases, sort_keys=True)
    mac = hmac.new(secret, data + b"\0" + body.encode(), hashlib.sha256).hexdigest()
    try:
        os.unlink(seal)
    except FileNotFoundError:
        pass
    fd = os.open(seal, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump({"phases": phases, "mac": mac}, f)
    os._exit(code)


main()
'''

_TESTS = r'''
"""pytest in the runner's child: site-packages as `python -I` would set them up, but no
sitecustomize/usercustomize (module names the workspace could provide); each phase's outcome
goes to the runner over the pipe whose fd is argv[1]."""
import json, os, site, sys


def main():
    out = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    os.set_inheritable(out.fileno(), False)
    site.addsitepackages(site.venv(site.removeduppaths()))
    import pytest

    class Record:
        def pytest_runtest_logreport(self, report):
            kind = "xfail" if hasattr(report, "wasxfail") else report.outcome
            out.write(json.dumps([report.nodeid, report.when, kind]) + "\n")

    code = pytest.main(sys.argv[2:], plugins=[Record()])
    sys.stdout.flush()
    sys.stderr.flush()
    out.close()
    os._exit(int(code))


main()
'''


@dataclass
class GradeResult:
    """The outcome of one grading run. `tests` maps node id -> passed|failed|error|skipped|xfail|missing."""

    resolved: bool
    f2p_passed: int
    f2p_total: int
    p2p_passed: int
    p2p_total: int
    tests: dict[str, str] = field(default_factory=dict)
    reason: str | None = None
    """Why nothing was run or counted (patch did not apply, report missing or tampered), else None."""
    notes: list[str] = field(default_factory=list)
    """Changes the grader undid (restored or removed paths)."""
    duration_s: float = 0.0
    log: str = ""
    """The tail of pytest's output."""

    def to_json(self) -> dict:
        return asdict(self)


def grade(task: Task, patch: str, *, backend: Backend | None = None, image: Image | None = None) -> GradeResult:
    """Grade `patch` (a git-style diff against the task's workspace) on the task's tests."""
    start = time.monotonic()
    result = _grade(task, patch, backend or default_backend(), image)
    result.duration_s = round(time.monotonic() - start, 3)
    return result


def _grade(task: Task, patch: str, backend: Backend, image: Image | None) -> GradeResult:
    f2p, p2p = task.spec.tests.fail_to_pass, task.spec.tests.pass_to_pass
    outcomes = {nid: "failed" for nid in f2p + p2p}
    size = len(patch.encode("utf-8", "surrogateescape"))
    if size > MAX_PATCH_BYTES:
        return _result(task, outcomes, reason=f"patch is {size / 2**20:.1f} MiB, over the grader's limit of "
                                               f"{MAX_PATCH_BYTES >> 20} MiB")
    try:
        touched = patch_paths(patch)
    except ValueError as e:
        return _result(task, outcomes, reason=f"patch does not apply: {e}")
    venv = [p for p in touched if PurePosixPath(p).parts[:1] == (VENV_DIR,)]
    if venv:
        return _result(task, outcomes, reason=f"patch modifies the virtualenv ({venv[0]}); "
                                               "diffs must exclude .venv/")
    image = image or task_image(task, backend)
    ws, pristine = image.workspace(), image.workspace()
    try:
        if patch.strip():
            res = ws.exec(["git", "apply", "--whitespace=nowarn", "-"], stdin=patch.encode(),
                          limits=Limits(timeout_s=60))
            if not res.ok:
                return _result(task, outcomes, reason=f"patch does not apply: {(res.stderr or res.stdout).strip()[-2000:]}")
        test_dirs = task.test_dirs()
        hidden = task.hidden_tests()
        notes = []
        for rel in sorted(touched):
            if rel not in hidden and is_protected(rel, test_dirs):
                notes.append(f"{'restored' if _restore(ws.root, pristine.root, rel) else 'removed'} {rel}")
        for rel, data in hidden.items():
            _write_at(ws.root, rel, data)
        outcomes, reason, log = _run_pytest(task, ws, pristine.root)
        return _result(task, outcomes, reason=reason, notes=notes, log=log)
    finally:
        ws.close()
        pristine.close()


def _result(task: Task, outcomes: dict[str, str], **kw) -> GradeResult:
    f2p, p2p = task.spec.tests.fail_to_pass, task.spec.tests.pass_to_pass
    f2p_passed = sum(outcomes.get(t) == "passed" for t in f2p)
    p2p_passed = sum(outcomes.get(t) == "passed" for t in p2p)
    resolved = kw.get("reason") is None and f2p_passed == len(f2p) and p2p_passed == len(p2p)
    return GradeResult(resolved, f2p_passed, len(f2p), p2p_passed, len(p2p), outcomes, **kw)


# ---------------------------------------------------------------- the patch


def patch_paths(patch: str) -> set[str]:
    """Every path a patch creates, modifies, deletes or renames, as `git apply` reads it."""
    if not patch.strip():
        return set()
    with tempfile.TemporaryDirectory() as tmp:  # parse only: nothing is applied
        proc = subprocess.run(["git", "apply", "--numstat", "-z", "-"], input=patch.encode(),
                              capture_output=True, cwd=tmp)
    if proc.returncode != 0:
        raise ValueError(proc.stderr.decode(errors="replace").strip() or "git apply could not parse it")
    paths: set[str] = set()
    fields = proc.stdout.decode(errors="surrogateescape").split("\0")
    i = 0
    while i < len(fields) and fields[i]:
        added, deleted, path = fields[i].split("\t", 2)
        if path:
            paths.add(path)
            i += 1
        else:  # rename or copy inside a repository: "a\td\t" NUL old NUL new
            paths.update(fields[i + 1:i + 3])
            i += 3
    # outside a repository numstat names only the new side of a rename: add the old one
    # (extended header lines cannot be confused with hunk lines, which start with " +-\\")
    for line in patch.splitlines():
        if line.startswith("rename from "):
            paths.add(_unquote(line[len("rename from "):]))
    return paths


def _unquote(path: str) -> str:
    """git's C-style quoting of unusual path names ("a\\tb" with octal escapes for bytes)."""
    if len(path) > 1 and path[0] == path[-1] == '"':
        return codecs.escape_decode(path[1:-1].encode())[0].decode("utf-8", "surrogateescape")
    return path


def workspace_patch(ws) -> str:
    """The agent's patch: `ws.diff()` without the venv (a patch touching .venv/ is rejected)."""
    sections = re.split(r"(?m)^(?=diff --git )", ws.diff())
    return "".join(s for s in sections if not s.startswith(f"diff --git a/{VENV_DIR}/"))


def is_protected(rel: str, test_dirs: set[str]) -> bool:
    """Whether a path is test infrastructure that a patch may not change."""
    parts = PurePosixPath(rel).parts
    name = parts[-1]
    if name in PROTECTED_NAMES or any(fnmatch.fnmatch(name, g) for g in PROTECTED_GLOBS):
        return True
    if any(fnmatch.fnmatch(p, g) for p in parts for g in PROTECTED_PARTS):
        return True
    return any(rel == d or rel.startswith(d + "/") for d in test_dirs)


# ---------------------------------------------------------------- host-side file surgery
# The workspace root is writable from the host, and the patch may have planted symlinks:
# every path is walked one component at a time with O_NOFOLLOW, relative to a directory fd.


def _open_parent(root: Path, rel: str) -> tuple[int, str]:
    """A dir fd for rel's parent, replacing any symlink or file on the way with a real dir."""
    parts = PurePosixPath(rel).parts
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for part in parts[:-1]:
        try:
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                os.close(fd)
                raise
            _remove_at(fd, part)
            os.mkdir(part, 0o755, dir_fd=fd)
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        os.close(fd)
        fd = nfd
    return fd, parts[-1]


def _remove_at(dfd: int, name: str) -> None:
    try:
        st = os.lstat(name, dir_fd=dfd)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        remove_tree(name, dir_fd=dfd)
    else:
        os.unlink(name, dir_fd=dfd)


def _write_at(root: Path, rel: str, data: bytes, mode: int = 0o644) -> None:
    dfd, name = _open_parent(root, rel)
    try:
        _remove_at(dfd, name)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dfd)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    finally:
        os.close(dfd)


def _read_at(root: Path, rel: str) -> bytes | None:
    """A regular file's content, never through a symlink; None if absent or not a file."""
    try:
        dfd, name = _open_parent_readonly(root, rel)
    except OSError:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    except OSError:
        return None
    finally:
        os.close(dfd)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        return f.read()


def _open_parent_readonly(root: Path, rel: str) -> tuple[int, str]:
    parts = PurePosixPath(rel).parts
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for part in parts[:-1]:
        try:
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        finally:
            os.close(fd)
        fd = nfd
    return fd, parts[-1]


def _restore(root: Path, pristine: Path, rel: str) -> bool:
    """Make root/rel what pristine/rel is (removed if it does not exist there). True if restored."""
    src = pristine / rel
    try:
        st = src.lstat()
    except (FileNotFoundError, NotADirectoryError):
        st = None
    dfd, name = _open_parent(root, rel)
    try:
        _remove_at(dfd, name)
        if st is None:
            return False
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(src), name, dir_fd=dfd)
        elif stat.S_ISDIR(st.st_mode):
            os.mkdir(name, 0o755, dir_fd=dfd)
        else:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         stat.S_IMODE(st.st_mode), dir_fd=dfd)
            with os.fdopen(fd, "wb") as f:
                f.write(src.read_bytes())
        return True
    finally:
        os.close(dfd)


# ---------------------------------------------------------------- running pytest


def pytest_config(pristine: Path) -> str | None:
    """The task's own pytest config file at the workspace root, as pytest would pick it."""
    for name in CONFIG_FILES:
        path = pristine / name
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if name == "pyproject.toml" and "[tool.pytest" not in text:
            continue
        if name == "tox.ini" and "[pytest]" not in text:
            continue
        if name == "setup.cfg" and "[tool:pytest]" not in text:
            continue
        return name
    return None


def _run_pytest(task: Task, ws, pristine: Path) -> tuple[dict[str, str], str | None, str]:
    """Run the task's tests in `ws`; (outcome per node id, reason if nothing counts, log tail)."""
    test_ids = task.test_ids
    rng = random.Random(secrets.randbits(64))
    planted = _plant_canaries(ws.root, test_ids, set(task.hidden_tests()), rng)
    run_ids = canary.interleave(test_ids, planted, rng)
    private = f".oc-grade-{secrets.token_hex(8)}"
    os.mkdir(ws.root / private, 0o755)
    (ws.root / private / "run.py").write_text(_RUNNER)
    (ws.root / private / "tests.py").write_text(_TESTS)
    config = pytest_config(pristine)
    if config is None:
        (ws.root / private / "pytest.ini").write_text("[pytest]\n")
        config = f"{private}/pytest.ini"
    key = secrets.token_bytes(32)
    args = [f"/workspace/{private}/report.xml", f"/workspace/{private}/seal.json", f"/workspace/{private}/tests.py",
            "-c", f"/workspace/{config}", "--rootdir=/workspace", "--confcutdir=/workspace",
            "-p", "no:cacheprovider", "-o", "addopts=", "-o", "xfail_strict=true",
            "-o", "junit_family=xunit1", f"--junitxml=/workspace/{private}/report.xml",
            "--continue-on-collection-errors", "-q", "--tb=short", "-rN",
            *task.spec.environment.pytest_args, "--maxfail=0", "--", *run_ids]
    env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
           "PATH": f"/workspace/{VENV_DIR}/bin:/usr/bin:/bin"}
    res = ws.exec([f"{VENV_DIR}/bin/python", "-I", "-S", f"/workspace/{private}/run.py", *args],
                  stdin=key.hex().encode() + b"\n", env=env,
                  limits=Limits(timeout_s=task.spec.tests.timeout_s, output_bytes=200_000))
    log = (res.stdout + res.stderr)[-4000:]
    failed = {nid: "failed" for nid in test_ids}
    if res.timed_out:
        return failed, f"tests timed out after {task.spec.tests.timeout_s:.0f} s", log
    report = _read_at(ws.root, f"{private}/report.xml")
    seal = _read_at(ws.root, f"{private}/seal.json")
    if report is None or seal is None:
        return failed, f"pytest exited (code {res.exit_code}) without a sealed report", log
    phases = _unseal(report, seal, key.hex().encode())
    if phases is None:
        return failed, "the test report was not written by this grader's pytest run (seal mismatch)", log
    junit = junit_outcomes(report, run_ids)
    verdict = canary.check(planted, junit, phases, junit_texts(report, [c.nodeid for c in planted]))
    outcomes = {nid: _agree(junit[nid], phases.get(nid, [])) for nid in test_ids}
    # An honest run that could not run a file's canaries (an import error) cannot pass its tests.
    contradicted = sorted(f"{path} (its tests passed, its canaries did not run as they must)"
                          for path in verdict.untrusted_files
                          if any("passed" in (outcomes[nid], junit[nid]) for nid in test_ids
                                 if nid.split("::", 1)[0] == path))
    if verdict.tampered or contradicted:
        return failed, ("the test run was tampered with: planted canary tests were not reported as they must be: "
                        + "; ".join([*verdict.tampered, *contradicted][:3])), log
    return outcomes, None, log


def _plant_canaries(root: Path, test_ids: list[str], hidden: set[str], rng: random.Random) -> list[canary.Canary]:
    """Append canary tests to every test module that holds requested tests (see canary.py).

    Only test modules (hidden test files, or named as pytest finds tests): a doctest's node id
    names a package module, which must stay as the patch left it."""
    planted: list[canary.Canary] = []
    for rel in sorted({nid.split("::", 1)[0] for nid in test_ids}):
        name = PurePosixPath(rel).name
        if rel not in hidden and not fnmatch.fnmatch(name, "test_*.py") and not fnmatch.fnmatch(name, "*_test.py"):
            continue
        data = _read_at(root, rel)
        if data is None:
            continue
        source, canaries = canary.plant(rel, data.decode("utf-8", "surrogateescape"), rng)
        _write_at(root, rel, source.encode("utf-8", "surrogateescape"))
        planted += canaries
    return planted


def _unseal(report: bytes, seal: bytes, key: bytes) -> dict[str, list[str]] | None:
    """The runner's per-phase record if the seal's MAC over report + record checks out, else None."""
    try:
        sealed = json.loads(seal)
        phases = sealed["phases"]
        body = json.dumps(phases, sort_keys=True).encode()
        good = hmac.compare_digest(sealed["mac"], hmac.new(key, report + b"\0" + body, hashlib.sha256).hexdigest())
    except (ValueError, KeyError, TypeError):
        return None
    return phases if good else None


def _agree(junit: str, phases: list[str]) -> str:
    """Passed only if JUnit and our own record agree; otherwise the worse of the two."""
    if any(p.endswith(":xfail") for p in phases):
        return "xfail"
    mine = ("error" if any(p.endswith(":failed") and not p.startswith("call:") for p in phases) else
            "failed" if any(p.endswith(":failed") for p in phases) else
            "skipped" if any(p.endswith(":skipped") for p in phases) else
            "passed" if "call:passed" in phases else "missing")
    return junit if junit != "passed" else mine


def junit_key(nodeid: str) -> tuple[str, str]:
    """(classname, name) that pytest's JUnit XML gives a node id (see _pytest.junitxml)."""
    path, _, rest = nodeid.partition("::")
    params = ""
    if "[" in rest:
        rest, params = rest[:rest.index("[")], rest[rest.index("["):]
    names = rest.split("::")
    module = path.replace("/", ".")
    module = module[:-3] if module.endswith(".py") else module
    return ".".join([module, *names[:-1]]), names[-1] + params


def _cases(xml: bytes) -> dict[tuple[str, str], list[ET.Element]] | None:
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return None
    cases: dict[tuple[str, str], list[ET.Element]] = {}
    for case in root.iter("testcase"):
        cases.setdefault((case.get("classname", ""), case.get("name", "")), []).append(case)
    return cases


def junit_texts(xml: bytes, test_ids: list[str]) -> dict[str, str]:
    """The failure/error messages and tracebacks JUnit gives each node id (only ids it names once)."""
    cases = _cases(xml) or {}
    out = {}
    for nid in test_ids:
        found = cases.get(junit_key(nid), [])
        if len(found) == 1:
            out[nid] = "\n".join((child.get("message") or "") + "\n" + (child.text or "") for child in found[0])
    return out


def junit_outcomes(xml: bytes, test_ids: list[str]) -> dict[str, str]:
    """Outcome per requested node id: passed|failed|error|skipped|xfail|missing|duplicate."""
    cases = _cases(xml)
    if cases is None:
        return {nid: "missing" for nid in test_ids}
    out = {}
    for nid in test_ids:
        found = cases.get(junit_key(nid), [])
        if len(found) != 1:
            out[nid] = "missing" if not found else "duplicate"
            continue
        tags = {child.tag: child for child in found[0]}
        if "error" in tags:
            out[nid] = "error"
        elif "failure" in tags:
            out[nid] = "failed"
        elif "skipped" in tags:
            out[nid] = "xfail" if tags["skipped"].get("type") == "pytest.xfail" else "skipped"
        else:
            out[nid] = "passed"
    return out
