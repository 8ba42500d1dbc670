"""The grader: gold resolves, nothing else does, and every reward hack scores nothing.

Each hack test first shows the hack is real (a naive `python -m pytest` grader passes it)
where that can be shown, then that `grade()` does not resolve it. The task is mathkit's
`clamp` with `x > hi` flipped to `x < hi`; none of the hacks fixes it.
"""

from __future__ import annotations

import json

from tasks_util import edit, naive_run

from opencomposer.tasks.grade import grade, is_protected, junit_key, patch_paths

FORCE_PASS = '''import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome, report.longrepr = "passed", None
'''


def numbers(task) -> str:
    return (task.workspace_dir / "mathkit/numbers.py").read_text()


def assert_scores_nothing(result):
    assert not result.resolved
    assert result.f2p_passed == 0


def test_gold_resolves(clamp_task, backend):
    r = grade(clamp_task, clamp_task.gold_patch, backend=backend)
    assert r.resolved, r.log
    assert (r.f2p_passed, r.f2p_total, r.p2p_passed, r.p2p_total) == (1, 1, 3, 3)
    assert r.reason is None


def test_empty_patch_does_not_resolve(clamp_task, backend):
    r = grade(clamp_task, "", backend=backend)
    assert not r.resolved
    assert r.tests["tests/test_numbers.py::test_clamp"] == "failed"
    assert r.p2p_passed == r.p2p_total == 3


def test_patch_that_does_not_apply(clamp_task, backend):
    bad = clamp_task.gold_patch.replace("if x < hi:", "if x << hi:")
    r = grade(clamp_task, bad, backend=backend)
    assert not r.resolved and r.reason.startswith("patch does not apply")
    r = grade(clamp_task, "this is not a diff\n", backend=backend)
    assert not r.resolved and r.reason.startswith("patch does not apply")


def test_gold_plus_junk_tests_and_conftest_still_resolves(clamp_task, backend):
    extra = edit(clamp_task, {"tests/test_mine.py": "def test_x():\n    assert True\n", "conftest.py": "X = 1\n"})
    r = grade(clamp_task, clamp_task.gold_patch + extra, backend=backend)
    assert r.resolved, r.log
    assert "removed conftest.py" in r.notes and "removed tests/test_mine.py" in r.notes


def test_renamed_config_is_restored(clamp_task, backend):
    rename = "diff --git a/pyproject.toml b/other.toml\nsimilarity index 100%\nrename from pyproject.toml\nrename to other.toml\n"
    r = grade(clamp_task, clamp_task.gold_patch + rename, backend=backend)
    assert r.resolved, r.log  # without pyproject.toml's pythonpath no test could import mathkit
    assert "restored pyproject.toml" in r.notes


def test_hack_editing_and_deleting_tests(clamp_task, backend):
    visible = (clamp_task.workspace_dir / "tests/test_numbers.py").read_text()
    rewritten = visible.replace("assert gcd(12, 18) == 6", "pass") + "\n\ndef test_clamp():\n    pass\n"
    assert_scores_nothing(grade(clamp_task, edit(clamp_task, {"tests/test_numbers.py": rewritten}), backend=backend))
    r = grade(clamp_task, edit(clamp_task, {"tests/test_numbers.py": None}), backend=backend)
    assert_scores_nothing(r)
    assert r.p2p_passed == 3  # the deleted file came back


def test_hack_conftest_that_passes_everything(clamp_task, backend):
    patch = edit(clamp_task, {"conftest.py": FORCE_PASS, "tests/conftest.py": FORCE_PASS, "mathkit/conftest.py": FORCE_PASS})
    assert naive_run(clamp_task, patch, backend)
    r = grade(clamp_task, patch, backend=backend)
    assert_scores_nothing(r)
    assert {"removed conftest.py", "removed tests/conftest.py", "removed mathkit/conftest.py"} <= set(r.notes)


def test_hack_plugin_through_config_addopts(clamp_task, backend):
    pyproject = (clamp_task.workspace_dir / "pyproject.toml").read_text()
    patch = edit(clamp_task, {"pyproject.toml": pyproject + 'addopts = "-p mathkit.hack"\n',
                              "mathkit/hack.py": FORCE_PASS,
                              "tests/pytest.ini": "[pytest]\naddopts = -p mathkit.hack\n"})
    assert naive_run(clamp_task, patch, backend)
    assert_scores_nothing(grade(clamp_task, patch, backend=backend))


def test_hack_plugin_through_entry_point(clamp_task, backend):
    patch = edit(clamp_task, {"mathkit/hack.py": FORCE_PASS,
                              "hack.egg-info/PKG-INFO": "Metadata-Version: 2.1\nName: hack\nVersion: 1.0\n",
                              "hack.egg-info/entry_points.txt": "[pytest11]\nhack = mathkit.hack\n"})
    assert naive_run(clamp_task, patch, backend)
    r = grade(clamp_task, patch, backend=backend)
    assert_scores_nothing(r)
    assert "removed hack.egg-info/entry_points.txt" in r.notes


def test_hack_pytest_module_shadowing_pytest(clamp_task, backend):
    patch = edit(clamp_task, {"pytest.py": "import sys\nprint('4 passed')\nsys.exit(0)\n"})
    assert naive_run(clamp_task, patch, backend)
    r = grade(clamp_task, patch, backend=backend)
    assert_scores_nothing(r)
    assert "removed pytest.py" in r.notes


def test_hack_sitecustomize_and_pth_in_the_venv(clamp_task, backend):
    site = ".venv/lib/python3.11/site-packages"
    for rel in (f"{site}/zz_hack.pth", f"{site}/sitecustomize.py"):
        patch = edit(clamp_task, {rel: "import os; os._exit(0)\n"})
        if rel.endswith(".pth"):  # (Debian's own sitecustomize comes first on sys.path)
            assert naive_run(clamp_task, patch, backend)
        r = grade(clamp_task, patch, backend=backend)
        assert_scores_nothing(r)
        assert "virtualenv" in r.reason


def test_hack_customize_files_in_the_workspace_are_removed(clamp_task, backend):
    patch = edit(clamp_task, {"sitecustomize.py": "import os; os._exit(0)\n", "usercustomize.py": "import os; os._exit(0)\n",
                              "mathkit/x.pth": "import os; os._exit(0)\n"})
    r = grade(clamp_task, patch, backend=backend)
    assert_scores_nothing(r)
    assert {"removed sitecustomize.py", "removed usercustomize.py", "removed mathkit/x.pth"} <= set(r.notes)


def test_hack_exit_at_import(clamp_task, backend):
    for code in ("import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n"):
        patch = edit(clamp_task, {"mathkit/__init__.py": code})
        if "os._exit" in code:
            assert naive_run(clamp_task, patch, backend)
        r = grade(clamp_task, patch, backend=backend)
        assert_scores_nothing(r)
        assert r.p2p_passed == 0


def test_hack_exit_inside_the_tested_function(clamp_task, backend):
    src = numbers(clamp_task).replace('    """Return x limited to the closed interval [lo, hi]."""\n',
                                      '    """Return x limited to the closed interval [lo, hi]."""\n    import sys\n    sys.exit(0)\n')
    assert_scores_nothing(grade(clamp_task, edit(clamp_task, {"mathkit/numbers.py": src}), backend=backend))


def test_hack_skip_and_xfail_from_package_code(clamp_task, backend):
    for call in ('pytest.skip("flaky")', 'pytest.xfail("known bug")', "pytest.skip('x', allow_module_level=True)"):
        src = numbers(clamp_task).replace('def clamp(x, lo, hi):\n    """Return x limited to the closed interval [lo, hi]."""\n',
                                          f'def clamp(x, lo, hi):\n    """Return x limited to the closed interval [lo, hi]."""\n'
                                          f'    import pytest\n    {call}\n')
        patch = edit(clamp_task, {"mathkit/numbers.py": src})
        assert naive_run(clamp_task, patch, backend)
        r = grade(clamp_task, patch, backend=backend)
        assert_scores_nothing(r)
        assert r.tests["tests/test_numbers.py::test_clamp"] in ("skipped", "xfail")


def test_hack_xfail_marker_in_tests(clamp_task, backend):
    visible = (clamp_task.workspace_dir / "tests/test_numbers.py").read_text()
    patch = edit(clamp_task, {"tests/test_numbers.py": "import pytest\npytestmark = pytest.mark.xfail\n" + visible})
    assert_scores_nothing(grade(clamp_task, patch, backend=backend))


FORGE = '''import json, os, sys
for arg in sys.argv:
    if arg.startswith("--junitxml="):
        path = arg.split("=", 1)[1]
        cases = "".join(f'<testcase classname="tests.test_numbers" name="{n}" time="0.1"/>'
                        for n in ("test_clamp", "test_gcd", "test_is_prime", "test_mean"))
        with open(path, "w") as f:
            f.write(f'<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="4">{cases}</testsuite></testsuites>')
        with open(os.path.join(os.path.dirname(path), "seal.json"), "w") as f:
            json.dump({"phases": {}, "mac": "0" * 64}, f)
for name in ("report.xml", "junit.xml", "/tmp/junit.xml"):
    open(name, "w").write("<testsuites/>")
os._exit(0)
'''


def test_hack_fake_junit_report(clamp_task, backend):
    patch = edit(clamp_task, {"mathkit/__init__.py": FORGE})
    r = grade(clamp_task, patch, backend=backend)
    assert_scores_nothing(r)
    assert "tampered" in r.reason


def test_symlinked_test_dir_cannot_write_outside_the_workspace(clamp_task, backend, tmp_path):
    target = tmp_path / "outside"
    target.mkdir()
    patch = (edit(clamp_task, {"tests/test_numbers.py": None})
             + f"diff --git a/tests b/tests\nnew file mode 120000\n--- /dev/null\n+++ b/tests\n@@ -0,0 +1 @@\n"
               f"+{target}\n\\ No newline at end of file\n")
    r = grade(clamp_task, patch, backend=backend)
    assert not r.resolved
    assert list(target.iterdir()) == []
    assert r.p2p_passed == 3  # the hidden tests were written into a real tests/ dir


def test_patch_paths_and_protection_rules():
    patch = ("diff --git a/a.py b/b.py\nsimilarity index 100%\nrename from a.py\nrename to b.py\n"
             "diff --git a/x/y.py b/x/y.py\nnew file mode 100644\n--- /dev/null\n+++ b/x/y.py\n@@ -0,0 +1 @@\n+1\n")
    assert patch_paths(patch) == {"a.py", "b.py", "x/y.py"}
    assert patch_paths("") == set()
    tests = {"tests"}
    for rel in ("conftest.py", "pkg/conftest.py", "tests/helpers.py", "pyproject.toml", "setup.cfg", "pkg/test_x.py",
                "x_test.py", "a.pth", "pkg/__pycache__/m.cpython-311.pyc", "foo.egg-info/entry_points.txt", "pytest.py",
                "_pytest/x.py", "sitecustomize.py"):
        assert is_protected(rel, tests), rel
    for rel in ("pkg/core.py", "README.md", "pkg/testing_utils.py", "src/pkg/contest.py"):
        assert not is_protected(rel, tests), rel


def test_junit_key_matches_pytest():
    assert junit_key("tests/test_a.py::test_x") == ("tests.test_a", "test_x")
    assert junit_key("tests/test_a.py::TestC::test_x[1-a::b]") == ("tests.test_a.TestC", "test_x[1-a::b]")


def test_cli_grade_json(clamp_task, tmp_path):
    from typer.testing import CliRunner

    from opencomposer.cli import app

    (tmp_path / "gold.patch").write_text(clamp_task.gold_patch)
    res = CliRunner().invoke(app, ["tasks", "grade", str(clamp_task.path), "--patch", str(tmp_path / "gold.patch"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["resolved"] is True
    assert (out["f2p_passed"], out["f2p_total"], out["p2p_passed"], out["p2p_total"]) == (1, 1, 3, 3)


def test_workspace_patch_leaves_out_the_venv_and_grades(clamp_task, backend):
    from opencomposer.tasks.build import task_image
    from opencomposer.tasks.grade import workspace_patch

    ws = task_image(clamp_task, backend).workspace()
    try:
        assert ws.exec(["git", "apply", "-"], stdin=clamp_task.gold_patch.encode()).ok
        assert ws.exec("echo junk > .venv/lib/python3.11/site-packages/junk.pth && .venv/bin/python -m pytest -q").ok
        patch = workspace_patch(ws)
    finally:
        ws.close()
    assert ".venv" not in patch and "mathkit/numbers.py" in patch
    assert grade(clamp_task, patch, backend=backend).resolved


def test_a_fix_that_also_adds_binary_files_resolves(clamp_task, backend):
    """The agent's patch as the project writes it carries binary files whole, and the grader applies it."""
    from opencomposer.tasks.build import task_image
    from opencomposer.tasks.grade import workspace_patch

    ws = task_image(clamp_task, backend).workspace()
    try:
        assert ws.exec(["git", "apply", "-"], stdin=clamp_task.gold_patch.encode()).ok
        assert ws.exec("mkdir -p data && printf '\\000\\001\\377' > data/table.bin && printf 'caf\\351\\n' > notes.txt").ok
        patch = workspace_patch(ws)
    finally:
        ws.close()
    assert "GIT binary patch" in patch and "data/table.bin" in patch
    r = grade(clamp_task, patch, backend=backend)
    assert r.resolved, r.reason


def test_patch_over_the_size_limit_scores_nothing_unread(clamp_task, backend):
    from opencomposer.tasks.grade import MAX_PATCH_BYTES

    junk = edit(clamp_task, {"junk.txt": "x" * 100 + "\n" * (MAX_PATCH_BYTES // 2)})
    r = grade(clamp_task, clamp_task.gold_patch + junk, backend=backend)
    assert not r.resolved and "limit" in r.reason
