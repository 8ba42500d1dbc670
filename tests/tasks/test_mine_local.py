"""Mining a local project directory (`tasks mine --source DIR`) whose code needs a dependency.

The project and its dependency are built here: `ocproj` (a git checkout) imports
`octinydep`, a second tiny project shipped as a wheel written by this test and given to the
miner with --find-links, so the dependency installs without PyPI (pytest and coverage, the
miner's own pins, still come from PyPI or the cache, as for every mined task).
"""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
from typer.testing import CliRunner

from opencomposer.errors import TaskError
from opencomposer.tasks.grade import grade
from opencomposer.tasks.local import local_source_layer, tree_files, tree_hash
from opencomposer.tasks.mine import Settings, mine
from opencomposer.tasks.task import Suite
from opencomposer.tasks.validate import validate_task

from tasks_util import wheel as _wheel

DEP = {"octinydep/__init__.py": 'def shout(s):\n    return s.upper() + "!"\n\n\n'
                                "def clamp(x, lo, hi):\n    return max(lo, min(hi, x))\n"}

PROJECT = {
    "pyproject.toml": '[project]\nname = "ocproj"\nversion = "0.3.0"\ndependencies = ["octinydep-local>=0.1"]\n',
    ".gitignore": "scratch/\n",
    "scratch/notes.txt": "ignored by git: not part of the tree\n",
    "ocproj/__init__.py": "",
    "ocproj/text.py": '''
        from octinydep import shout


        def greet(name):
            """Greet someone loudly."""
            words = ["hello", name]
            return shout(" ".join(words))


        def count_vowels(s):
            """How many vowels s has."""
            n = 0
            for ch in s.lower():
                if ch in "aeiou":
                    n += 1
            return n
        ''',
    "ocproj/nums.py": '''
        from octinydep import clamp


        def scale(xs, k):
            """Each x times k, clamped to [0, 100]."""
            out = []
            for x in xs:
                out.append(clamp(x * k, 0, 100))
            return out


        def running_max(xs):
            """The largest value so far, at each position."""
            best = None
            out = []
            for x in xs:
                if best is None or x > best:
                    best = x
                out.append(best)
            return out
        ''',
    "tests/test_text.py": '''
        import pytest
        from ocproj.text import count_vowels, greet


        @pytest.mark.parametrize("name", ["ann", "bo", "cy", "di"])
        def test_greet(name):
            assert greet(name) == f"HELLO {name.upper()}!"


        @pytest.mark.parametrize("s,n", [("abc", 1), ("AEIOU", 5), ("xyz", 0), ("banana", 3)])
        def test_count_vowels(s, n):
            assert count_vowels(s) == n
        ''',
    "tests/test_nums.py": '''
        import pytest
        from ocproj.nums import running_max, scale


        @pytest.mark.parametrize("xs,k,want", [([1, 2], 2, [2, 4]), ([50, 60], 2, [100, 100]), ([-1], 3, [0]),
                                               ([10, 20, 30], 1, [10, 20, 30])])
        def test_scale(xs, k, want):
            assert scale(xs, k) == want


        @pytest.mark.parametrize("xs,want", [([1, 3, 2], [1, 3, 3]), ([], []), ([2, 2, 1], [2, 2, 2]),
                                             ([0, 9, 4, 10], [0, 9, 9, 10])])
        def test_running_max(xs, want):
            assert running_max(xs) == want
        ''',
    # the dependency itself: tests no feature breaks (a feature may break at most 35% of them all)
    "tests/test_dep.py": '''
        import pytest
        from octinydep import clamp, shout


        @pytest.mark.parametrize("s", ["a", "b", "c", "d"])
        def test_shout(s):
            assert shout(s) == s.upper() + "!"


        @pytest.mark.parametrize("x,want", [(-1, 0), (5, 5), (11, 10), (0, 0)])
        def test_clamp(x, want):
            assert clamp(x, 0, 10) == want
        ''',
}


def _write(root, files):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text).lstrip())
    return root


def _git(root, *args):
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_tree_files_follow_git_and_the_hash_follows_the_files(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENCOMPOSER_CACHE", str(tmp_path / "cache"))  # a layer already cached is never re-checked
    root = _write(tmp_path / "p", PROJECT)
    _git(root, "init", "-q")
    files = tree_files(root)
    assert "scratch/notes.txt" not in files and "ocproj/text.py" in files and ".gitignore" in files
    before = tree_hash(root)
    (root / "scratch" / "notes.txt").write_text("changed, but git-ignored\n")
    assert tree_hash(root) == before
    (root / "ocproj" / "text.py").write_text("X = 1\n")
    assert tree_hash(root) != before
    with pytest.raises(TaskError, match="changed since the task was mined"):
        local_source_layer(root, "ocproj", "0.3.0", before)
    layer = local_source_layer(root, "ocproj", "0.3.0", tree_hash(root))
    assert (layer / "ocproj" / "text.py").read_text() == "X = 1\n" and not (layer / "scratch").exists()


@pytest.mark.slow
def test_mine_a_local_project_with_a_dependency_and_grade_its_gold_patch(tmp_path, backend):
    wheels = tmp_path / "wheels"
    _wheel(wheels, "octinydep-local", "0.1", DEP)
    root = _write(tmp_path / "ocproj", PROJECT)
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "init")
    commit = _git(root, "rev-parse", "HEAD")
    out = tmp_path / "suite"
    settings = Settings(max_tasks=2, variants=1, lines=(3, 4), min_lines=4)
    report = mine(out, source=root, find_links=wheels, settings=settings, backend=backend, progress=False)
    assert report.tests_passing == report.tests_total == 24
    assert "octinydep-local>=0.1" in report.requirements["runtime"]
    assert "octinydep-local==0.1" in report.requirements["pins"]
    assert len(report.tasks) == 2 and set(report.tried.values()) == {"valid"}
    saved = json.loads((out / "mining" / "ocproj-0.3.0.json").read_text())
    assert saved["tasks"] == report.tasks and saved["source"]["commit"] == commit
    for task in Suite.load(out).tasks:
        src = task.spec.source
        assert (src.kind, src.package, src.version, src.path, src.commit) == ("local", "ocproj", "0.3.0", str(root), commit)
        assert src.sha256 == tree_hash(root)
        assert "octinydep-local==0.1" in task.spec.environment.requirements
        assert validate_task(task, runs=1, backend=backend).valid
        gold = grade(task, task.gold_patch, backend=backend)
        assert gold.resolved and gold.f2p_passed == gold.f2p_total > 0
        empty = grade(task, "", backend=backend)
        assert not empty.resolved and empty.f2p_passed == 0
    feature = next(t for t in Suite.load(out).tasks if "-feat-" in t.id)
    assert "-    raise NotImplementedError" in feature.gold_patch and feature.spec.stats.gold_files_changed == 2
    again = mine(out, source=root, find_links=wheels, settings=settings, backend=backend, progress=False)
    assert sorted(again.tasks) == sorted(report.tasks) and again.new == []
    from opencomposer.cli import app

    res = CliRunner().invoke(app, ["tasks", "mine", "--source", str(tmp_path / "nowhere"), "--out", str(out)])
    assert res.exit_code == 2 and "not a directory" in res.output
