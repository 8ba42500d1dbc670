"""The miner: coverage map in the sandbox, feature grouping, clear errors, and (slow) mining a real package.

The end-to-end test fetches cachetools 8.0.2's sdist from PyPI once (cached under
$OPENCOMPOSER_CACHE/mine/sdists), builds its venv layer once, mines two tasks, then
validates and grades them.
"""

from __future__ import annotations

import gzip
import io
import random
import tarfile

import pytest
from typer.testing import CliRunner

from opencomposer.errors import TaskError
from opencomposer.tasks.build import env_layer, task_image
from opencomposer.tasks.coverage_map import FunctionCoverage, coverage_map, run_tests
from opencomposer.tasks.grade import grade
from opencomposer.tasks.mine import BASE_REQUIREMENTS, Settings, feature_candidates, mine
from opencomposer.tasks.task import Suite, Task, patch_stats
from opencomposer.tasks.transform import Unit
from opencomposer.tasks.validate import validate_task

PROJECT = {
    "pytest.ini": "[pytest]\npythonpath = .\n",
    "pkg/__init__.py": "",
    "pkg/a.py": 'def double(x):\n    """Twice x."""\n    y = x * 2\n    return y\n\n\n'
                "def setup_value():\n    z = 1\n    return z\n\n\nCONST = setup_value()\n",
    "pkg/b.py": "from pkg.a import double\n\n\ndef quad(x):\n    y = double(x)\n    return double(y)\n\n\n"
                "def unused(x):\n    y = x\n    return y\n",
    "tests/test_ab.py": "from pkg.a import double\nfrom pkg.b import quad\n\n\n"
                        "def test_double():\n    assert double(2) == 4\n\n\n"
                        "def test_quad():\n    assert quad(1) == 4\n\n\n"
                        "def test_broken():\n    assert quad(1) == 5\n",
}


def test_coverage_map_from_a_sandboxed_run(tmp_path, backend):
    for rel, text in PROJECT.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    ws = backend.image([env_layer(BASE_REQUIREMENTS, backend=backend), tmp_path]).workspace()
    try:
        run = run_tests(ws, ["tests"], [], cover=True)
    finally:
        ws.close()
    assert run.outcomes == {"tests/test_ab.py::test_double": "passed", "tests/test_ab.py::test_quad": "passed",
                            "tests/test_ab.py::test_broken": "failed"}
    cov = coverage_map(run, {p: PROJECT[p] for p in ("pkg/a.py", "pkg/b.py")})
    by_name = {k[1][0]: fc for k, fc in cov.items()}
    # failing tests never count: only passing tests can become fail-to-pass
    assert by_name["double"].tests == {"tests/test_ab.py::test_double", "tests/test_ab.py::test_quad"}
    assert by_name["quad"].tests == {"tests/test_ab.py::test_quad"}
    assert by_name["unused"].tests == set()
    assert by_name["setup_value"].import_time and not by_name["double"].import_time


def _fc(path: str, name: str, lines: int, tests: set[str], import_time: bool = False) -> FunctionCoverage:
    return FunctionCoverage(path, Unit(name, 0, 1, 2, 1 + lines, "", False), frozenset(tests), import_time)


def test_feature_candidates_span_files_and_follow_shared_tests():
    cov = {}
    for fc in [
        _fc("p/a.py", "parse", 30, {"t1", "t2"}), _fc("p/b.py", "render", 25, {"t1", "t2", "t3"}),
        _fc("p/a.py", "lex", 20, {"t1"}), _fc("p/c.py", "other", 30, {"t7", "t8"}),
        _fc("p/c.py", "boot", 40, {"t1"}, import_time=True),  # runs at import: never removed
        _fc("p/c.py", "everywhere", 40, {f"t{i}" for i in range(9)}),  # breaks most tests
    ]:
        cov[fc.key] = fc
    settings = Settings(lines=(40, 50), min_lines=30, max_f2p_frac=0.35)
    cands = feature_candidates(cov, 20, settings, random.Random(0))
    assert cands
    for c in cands:
        names = {fc.unit.qualname for fc in c.functions}
        assert len({fc.path for fc in c.functions}) >= 2
        assert not names & {"boot", "everywhere"}
        assert len(set().union(*(fc.tests for fc in c.functions))) <= 7
    first = {fc.unit.qualname for fc in cands[0].functions}
    assert first == {"parse", "render"}  # the seed's closest neighbour by shared tests, in another file


def _sdist_without_tests(path) -> None:
    buf = io.BytesIO()
    files = {"PKG-INFO": "Metadata-Version: 2.1\nName: notests\nVersion: 0.1\n", "notests/__init__.py": "X = 1\n"}
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel, text in files.items():
            info = tarfile.TarInfo(f"notests-0.1/{rel}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    path.write_bytes(gzip.compress(buf.getvalue(), mtime=0))


def test_sdist_without_tests_is_a_clear_error(tmp_path):
    _sdist_without_tests(tmp_path / "notests-0.1.tar.gz")
    with pytest.raises(TaskError, match="ships no test suite"):
        mine(tmp_path / "out", sdist=tmp_path / "notests-0.1.tar.gz")
    from opencomposer.cli import app

    res = CliRunner().invoke(app, ["tasks", "mine", "--sdist", str(tmp_path / "notests-0.1.tar.gz"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "ships no test suite" in res.output
    res = CliRunner().invoke(app, ["tasks", "mine", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "exactly one of --package" in res.output
    res = CliRunner().invoke(app, ["tasks", "mine", "--package", "cachetools", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "pin an exact version" in res.output


@pytest.mark.slow
def test_mine_a_real_package_then_validate_and_grade(tmp_path_factory, backend):
    out = tmp_path_factory.mktemp("mined") / "suite"
    report = mine(out, package="cachetools==8.0.2", settings=Settings(max_tasks=2, variants=1), backend=backend,
                  progress=False)
    assert len(report.tasks) == 2 and report.tests_passing > 100
    suite = Suite.load(out)
    assert [t.id for t in suite.tasks] == sorted(report.tasks)
    assert suite.spec.miner["packages"] == ["cachetools==8.0.2"] and suite.spec.miner["seed"] == 0
    feature = next(t for t in suite.tasks if "-feat-" in t.id)
    lines, files = patch_stats(feature.gold_patch)
    assert files >= 2 and lines >= 100 and len(feature.spec.instruction) <= 400
    assert feature.spec.source.package == "cachetools" and len(feature.spec.source.sha256) == 64
    # the agent's workspace: bodies stubbed, fail-to-pass tests absent, hidden tests restore them
    ws = task_image(feature, backend).workspace()
    try:
        assert ws.exec(["grep", "-rq", "raise NotImplementedError", "src/cachetools"]).ok
        for nid in feature.spec.tests.fail_to_pass:
            file, name = nid.split("::")[0], nid.split("::")[-1].split("[")[0]
            visible = (ws.root / file).read_text() if (ws.root / file).exists() else ""
            assert f"def {name}(" not in visible and f"def {name}(" in feature.hidden_tests()[file].decode()
    finally:
        ws.close()
    for task in suite.tasks:
        assert validate_task(task, runs=1, backend=backend).valid
        gold = grade(task, task.gold_patch, backend=backend)
        assert gold.resolved and gold.f2p_passed == gold.f2p_total > 0
        empty = grade(task, "", backend=backend)
        assert not empty.resolved and empty.f2p_passed == 0 and empty.p2p_passed == empty.p2p_total
    # resumable: a second run finds the tasks and mines nothing new
    again = mine(out, package="cachetools==8.0.2", settings=Settings(max_tasks=2, variants=1), backend=backend,
                 progress=False)
    assert sorted(again.tasks) == sorted(report.tasks) and again.new == []
    assert Task.load(out / report.tasks[0]).spec == Task.load(out / report.tasks[0]).spec
