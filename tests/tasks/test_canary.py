"""Canary tests: planted into real test files, an honest pytest run gives exactly the outcomes they must have."""

from __future__ import annotations

import random
import subprocess
import sys

from opencomposer.tasks import canary
from opencomposer.tasks.grade import junit_outcomes, junit_texts

SOURCE = '''import unittest


def test_clamp_low():
    assert min(max(-1, 0), 10) == 0


class TestRange(unittest.TestCase):
    def test_clamp_high(self):
        self.assertEqual(min(max(11, 0), 10), 10)
'''


def run_pytest(tmp_path, source: str, ids: list[str]) -> tuple[dict, dict, dict]:
    (tmp_path / "test_mod.py").write_text(source)
    report = tmp_path / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
                    f"--junitxml={report}", "--rootdir", str(tmp_path), *ids], cwd=tmp_path, capture_output=True)
    xml = report.read_bytes()
    junit = junit_outcomes(xml, ids)
    # what the grader's per-phase record would hold for an honest run
    phases = {nid: {"passed": ["setup:passed", "call:passed"], "failed": ["setup:passed", "call:failed"],
                    "error": ["setup:failed"]}.get(out, []) for nid, out in junit.items()}
    return junit, phases, junit_texts(xml, ids)


def test_an_honest_run_gives_every_canary_its_outcome(tmp_path):
    rng = random.Random(1)
    source, planted = canary.plant("test_mod.py", SOURCE, rng)
    compile(source, "test_mod.py", "exec")
    assert len({c.nodeid for c in planted}) == len(planted) == 7
    assert {c.expect for c in planted} == {"failed", "error", "passed"}
    real = ["test_mod.py::test_clamp_low", "test_mod.py::TestRange::test_clamp_high"]
    ids = canary.interleave(real, planted, rng)
    assert [i for i in ids if i in real] == real  # the real tests keep their order
    junit, phases, texts = run_pytest(tmp_path, source, ids)
    assert junit[real[0]] == junit[real[1]] == "passed"
    verdict = canary.check(planted, junit, phases, texts)
    assert verdict.tampered == [] and verdict.untrusted_files == set()


def test_rigged_outcomes_are_caught(tmp_path):
    rng = random.Random(2)
    source, planted = canary.plant("test_mod.py", SOURCE, rng)
    ids = [c.nodeid for c in planted]
    junit, phases, texts = run_pytest(tmp_path, source, ids)
    all_passed = {nid: "passed" for nid in ids}
    passed_phases = {nid: ["setup:passed", "call:passed"] for nid in ids}
    # every test reported passed (a no-op framework or a forged report)
    assert len(canary.check(planted, all_passed, passed_phases, {}).tampered) == 5
    # the right outcomes, but failures without their tokens (forged failures)
    assert len(canary.check(planted, junit, phases, {}).tampered) == 5
    # only the per-phase record rigged: JUnit honest
    assert canary.check(planted, junit, passed_phases, texts).tampered
    # a file that could not be imported: nothing ran, which is a failure, not tampering
    missing = canary.check(planted, {}, {}, {})
    assert missing.tampered == [] and missing.untrusted_files == {"test_mod.py"}


def test_names_are_fresh_and_look_like_the_files_own():
    source = "def test_cache_copy():\n    pass\n\ndef test_cache_clear():\n    pass\n"
    for seed in range(20):
        planted_source, planted = canary.plant("t/test_c.py", source, random.Random(seed))
        names = [c.nodeid.split("::")[-1] for c in planted]
        assert all(n.startswith("test_") for n in names)
        assert not {"test_cache_copy", "test_cache_clear"} & set(names)
        fn = [n for n in names if n.count("_") >= 2][0]
        assert set(fn[len("test_"):].split("_")) <= {"cache", "copy", "clear", *canary._FALLBACK_WORDS}


def test_a_file_with_one_short_test_name_still_gets_fresh_names():
    """(A file with one test `test_x` once made the name draw loop for ever.)"""
    for source in ("def test_x():\n    pass\n", "def test_x_x():\n    pass\n", ""):
        for seed in range(10):
            _, planted = canary.plant("test_one.py", source, random.Random(seed))
            assert len({c.nodeid for c in planted}) == 7


def test_canaries_do_not_depend_on_builtins_the_module_shadows(tmp_path):
    """toolz's tests import a curried `sorted`; a module may rebind any builtin name."""
    shadowing = "sorted = sum = len = list = range = RuntimeError = None\n\n" + SOURCE
    source, planted = canary.plant("test_mod.py", shadowing, random.Random(3))
    junit, phases, texts = run_pytest(tmp_path, source, [c.nodeid for c in planted])
    verdict = canary.check(planted, junit, phases, texts)
    assert verdict.tampered == [] and verdict.untrusted_files == set(), (junit, verdict)
