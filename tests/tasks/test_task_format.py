"""task.toml / suite.toml: round trips, and malformed files fail with the field named."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from tasks_util import SMOKE

from opencomposer.errors import TaskError
from opencomposer.tasks.task import Suite, Task, patch_stats, text_file_diff, tree_diff


def copy_task(tmp_path, name: str | None = None):
    src = sorted(p for p in SMOKE.iterdir() if (p / "task.toml").is_file())[0] if name is None else SMOKE / name
    dest = tmp_path / src.name
    shutil.copytree(src, dest)
    return dest


def test_load_save_round_trip(tmp_path):
    path = copy_task(tmp_path)
    task = Task.load(path)
    assert task.id == path.name
    assert task.spec.tests.fail_to_pass and task.spec.instruction
    assert task.hidden_tests()  # every smoke task hides at least one test file
    task.spec.instruction = "Do the thing.\nOn two lines."
    task.save()
    again = Task.load(path)
    assert again.spec == task.spec
    assert '"""' in (path / "task.toml").read_text()  # multi-line strings stay readable


@pytest.mark.parametrize("edit, field", [
    (lambda t: t.replace("[tests]\nfail_to_pass", "[tests]\nfail_to_passs"), "tests.fail_to_pass"),
    (lambda t: t.replace('sha256 = "generated"', 'sha256 = "abc"'), "source"),
    (lambda t: t.replace('"pytest==9.2.0"', '"pytest>=9"'), "environment"),
    (lambda t: t.replace("gold_lines_changed = ", "gold_lines_changed = 'many' #"), "stats.gold_lines_changed"),
    (lambda t: t.replace('kind = "generated"', 'kind = "git"'), "source.kind"),
    (lambda t: t.replace("[tests]\n", "[tests]\nunknown_key = 1\n"), "tests.unknown_key"),
])
def test_malformed_task_toml_names_the_field(tmp_path, edit, field):
    path = copy_task(tmp_path)
    toml = path / "task.toml"
    toml.write_text(edit(toml.read_text()))
    with pytest.raises(TaskError) as e:
        Task.load(path)
    assert f"field '{field}" in str(e.value)
    assert str(toml) in str(e.value)


def test_invalid_toml_and_missing_files(tmp_path):
    path = copy_task(tmp_path)
    (path / "task.toml").write_text((path / "task.toml").read_text() + "\n[[broken\n")
    with pytest.raises(TaskError, match="invalid TOML"):
        Task.load(path)
    path = copy_task(tmp_path / "b")
    (path / "gold.patch").unlink()
    with pytest.raises(TaskError, match="missing gold.patch"):
        Task.load(path)


def test_test_ids_must_be_node_ids(tmp_path):
    path = copy_task(tmp_path)
    toml = path / "task.toml"
    toml.write_text(toml.read_text().replace("fail_to_pass = [\n", 'fail_to_pass = [\n    "test_clamp",\n'))
    with pytest.raises(TaskError, match="not a pytest node id"):
        Task.load(path)


def test_suite_globs_and_errors(tmp_path):
    suite = Suite.load(SMOKE)
    assert len(suite.tasks) >= 12 and [t.id for t in suite.tasks] == sorted(t.id for t in suite.tasks)
    shutil.copytree(SMOKE, tmp_path / "s")
    (tmp_path / "s" / "suite.toml").write_text('name = "x"\nversion = "1"\ntasks = ["mathkit-*", "roman-*"]\n')
    ids = [t.id for t in Suite.load(tmp_path / "s").tasks]
    assert ids and all(i.startswith(("mathkit-", "roman-")) for i in ids)
    (tmp_path / "s" / "suite.toml").write_text('name = "x"\nversion = "1"\ntasks = ["nothing-*"]\n')
    with pytest.raises(TaskError, match="match no task"):
        Suite.load(tmp_path / "s")
    (tmp_path / "s" / "suite.toml").write_text('version = "1"\n')
    with pytest.raises(TaskError, match="field 'name'"):
        Suite.load(tmp_path / "s")


def test_tree_diff_applies_with_git_and_patch_stats(tmp_path):
    old = {"a.py": "x = 1\ny = 2\n", "gone.py": "bye\n", "same.py": "s\n"}
    new = {"a.py": "x = 1\ny = 3\n", "new/b.py": "print('hi')", "same.py": "s\n"}
    patch = tree_diff(old, new)
    assert text_file_diff("same.py", "s\n", "s\n") == ""
    for rel, text in old.items():
        (tmp_path / rel).write_text(text)
    subprocess.run(["git", "apply", "-"], input=patch.encode(), cwd=tmp_path, check=True)
    assert (tmp_path / "a.py").read_text() == new["a.py"]
    assert (tmp_path / "new/b.py").read_text() == "print('hi')"
    assert not (tmp_path / "gone.py").exists()
    assert patch_stats(patch) == (2 + 1 + 1, 3)
