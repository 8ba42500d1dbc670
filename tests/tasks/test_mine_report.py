"""The mining report, and telling why a package's tests fail in the sandbox (mine_report.py).

The error strings are the ones pytest records for real failures in the sandbox (no network,
nothing listening on localhost, a module not installed, a C extension not built).
"""

from __future__ import annotations

import json

from opencomposer.tasks.mine_report import MineReport, compiled_sources, failure_reasons, sandbox_blocker

ERRORS = {
    "tests/test_http.py::test_get": "ConnectionError: HTTPSConnectionPool(host='httpbin.org', port=443): Max retries "
                                    "exceeded with url: /get (Caused by NameResolutionError(\"Failed to resolve "
                                    "'httpbin.org' ([Errno -3] Temporary failure in name resolution)\"))",
    "tests/test_http.py::test_dns": "gaierror: [Errno -3] Temporary failure in name resolution",
    "tests/test_db.py::test_query": "OperationalError: connection to server at \"localhost\" (127.0.0.1), port 5432 "
                                    "failed: Connection refused",
    "tests/test_yaml.py::test_load": "ModuleNotFoundError: No module named 'yaml'",
    "tests/test_fast.py::test_speedups": "ImportError: cannot import name '_speedups' from 'fastpkg' (unknown location)",
    "tests/test_math.py::test_add": "AssertionError: assert 3 == 4",
    "tests/test_ext.py": "ImportError while importing test module '/workspace/tests/test_ext.py'.\nE   "
                         "ModuleNotFoundError: No module named 'fastpkg._core'",
}
OUTCOMES = {nid: "failed" for nid in ERRORS if "::" in nid} | {f"tests/test_ok.py::test_{i}": "passed" for i in range(4)}


def test_failure_reasons_group_failing_tests_by_what_they_lack():
    reasons = failure_reasons(ERRORS, OUTCOMES, "fastpkg", compiled=["fastpkg/_core.c"])
    assert reasons == {"network": 2, "service on localhost": 1, "missing module yaml": 1,
                       "import error (_speedups)": 1, "assertion or other": 1,
                       "file does not collect: compiled extension fastpkg._core (not built)": 1}
    # without compiled sources, a missing submodule of the package is just a missing module
    assert failure_reasons(ERRORS, OUTCOMES, "fastpkg", compiled=[])[
        "file does not collect: missing module fastpkg"] == 1


def test_a_package_most_of_whose_tests_need_the_network_is_not_mined():
    reasons = failure_reasons(ERRORS, OUTCOMES, "fastpkg", compiled=[])
    why = sandbox_blocker(reasons, total=7)
    assert why and why.startswith("6 of 7 tests fail") and "network (2)" in why
    assert sandbox_blocker(reasons, total=40) is None  # 6 of 40: mine the rest
    # plain assertion failures are the package's own business, never a blocker
    assert sandbox_blocker(failure_reasons({"t.py::a": "AssertionError"}, {"t.py::a": "failed"}, "p", []), 1) is None


def test_compiled_sources_outside_the_tests(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "_speedups.c").write_text("int x;\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "helper.c").write_text("int y;\n")
    (tmp_path / "setup.py").write_text("from setuptools import Extension, setup\n"
                                       "setup(ext_modules=[Extension('pkg._speedups', ['pkg/_speedups.c'])])\n")
    assert compiled_sources(tmp_path, ["tests"]) == ["pkg/_speedups.c", "setup.py ext_modules"]


def test_report_summary_and_json(tmp_path):
    r = MineReport("demo", "1.0", tests_total=50, tests_passing=48, tasks=["demo-feat-a-1"], new=["demo-feat-a-1"],
                   tried={"demo-feat-a-1": "valid", "demo-feat-b-2": "57 of 48 tests fail (more than 35%)",
                          "demo-feat-c-3": "61 of 48 tests fail (more than 35%)"},
                   failing={"network": 2}, duration_s=12.3)
    text = r.summary()
    assert text.startswith("demo==1.0: 1 tasks (1 new); tried 3 candidates, 1 valid, 2 rejected")
    assert "2 x N of N tests fail (more than N%)" in text and "network 2" in text
    saved = json.loads(r.write(tmp_path).read_text())
    assert saved["tried"] == r.tried and (tmp_path / "mining" / "demo-1.0.json").is_file()
    stopped = MineReport("demo", "1.0", error="demo==1.0: not mined: 6 of 7 tests fail ...")
    assert stopped.summary() == "demo==1.0: not mined: 6 of 7 tests fail ..."
