"""Task images from an sdist: source layer (sha256-checked), env layer (venv + setup), break.patch.

The sdist is a tiny package written here with fixed timestamps, so its sha256 (and thus the
cached layers) are the same on every run.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile

import pytest

from opencomposer.errors import TaskError
from opencomposer.tasks.build import env_layer, source_layer, task_image
from opencomposer.tasks.grade import grade
from opencomposer.tasks.task import Environment, Source, Stats, Task, TaskSpec, TaskTests, patch_stats, tree_diff

CORE = '''def add(a, b):
    """Sum of a and b."""
    return a + b


def sub(a, b):
    """a minus b."""
    return a - b
'''
TESTS = '''from mini.core import add, sub


def test_add():
    assert add(2, 3) == 5


def test_sub():
    assert sub(2, 3) == -1
'''
FILES = {
    "pyproject.toml": '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n\n'
                      '[project]\nname = "mini"\nversion = "0.1"\n\n[tool.setuptools]\npackages = ["mini"]\n',
    "mini/__init__.py": "",
    "mini/core.py": CORE,
    "tests/test_core.py": TESTS,
}


def make_sdist(path) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel, text in sorted(FILES.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"mini-0.1/{rel}")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    with gzip.GzipFile(path, "wb", mtime=0) as gz:
        gz.write(buf.getvalue())
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def mini_task(tmp_path_factory, backend):
    root = tmp_path_factory.mktemp("mini")
    sha = make_sdist(root / "mini-0.1.tar.gz")
    source_layer("mini", "0.1", sha, sdist=root / "mini-0.1.tar.gz")  # later calls hit the cache
    broken = {"mini/core.py": CORE.replace("    return a + b\n", "    raise NotImplementedError\n"),
              "tests/test_core.py": TESTS.split("\n\ndef test_add")[0] + "\n\n\ndef test_sub" + TESTS.split("def test_sub")[1]}
    path = root / "task"
    (path / "hidden_tests/tests").mkdir(parents=True)
    (path / "hidden_tests/tests/test_core.py").write_text(TESTS)
    (path / "break.patch").write_text(tree_diff({k: FILES[k] for k in broken}, broken))
    gold = tree_diff({"mini/core.py": broken["mini/core.py"]}, {"mini/core.py": CORE})
    (path / "gold.patch").write_text(gold)
    lines, files = patch_stats(gold)
    Task(path, TaskSpec(
        id="mini-add", instruction="Implement add.",
        source=Source(kind="pypi", package="mini", version="0.1", sha256=sha),
        tests=TaskTests(fail_to_pass=["tests/test_core.py::test_add"], pass_to_pass=["tests/test_core.py::test_sub"]),
        environment=Environment(requirements=["pytest==9.2.0"], setup=[".venv/bin/pip install --no-deps -e ."]),
        stats=Stats(gold_lines_changed=lines, gold_files_changed=files, instruction_chars=14))).save()
    return Task.load(path)


def test_sdist_task_image_and_grading(mini_task, backend):
    image = task_image(mini_task, backend)
    ws = image.workspace()
    try:
        assert "raise NotImplementedError" in (ws.root / "mini/core.py").read_text()
        assert "test_add" not in (ws.root / "tests/test_core.py").read_text()  # hidden
        assert (ws.root / ".venv/bin/python").exists()
        assert ws.exec(".venv/bin/python -c 'import mini.core, pytest'").ok  # editable install from setup
    finally:
        ws.close()
    assert grade(mini_task, mini_task.gold_patch, backend=backend).resolved
    r = grade(mini_task, "", backend=backend)
    assert not r.resolved and r.p2p_passed == 1


def test_env_layer_is_cached_with_a_lock_file(mini_task):
    src = source_layer("mini", "0.1", mini_task.spec.source.sha256)
    env = mini_task.spec.environment
    layer = env_layer(env.requirements, setup=env.setup, source=src)
    assert layer == env_layer(env.requirements, setup=env.setup, source=src)
    lock = (layer.parent / "lock.txt").read_text()
    assert "pytest==9.2.0" in lock and "mini" in lock.lower()


def test_sdist_checksum_mismatch(tmp_path):
    make_sdist(tmp_path / "mini-0.1.tar.gz")
    with pytest.raises(TaskError, match="does not match"):
        source_layer("mini", "0.1", "0" * 64, sdist=tmp_path / "mini-0.1.tar.gz")


def test_sdist_task_exports_its_break_patch(mini_task, backend):
    from opencomposer.tasks.export import swebench_record

    rec = swebench_record(mini_task, backend)
    assert rec["repo"] == "pypi/mini" and rec["base_commit"] == "mini==0.1"
    assert rec["base_patch"] == mini_task.break_patch and rec["sdist_sha256"] == mini_task.spec.source.sha256
    assert "+def test_add():" in rec["test_patch"] and "test_sub" not in rec["test_patch"].split("@@")[0]


def test_cli_build_prints_each_tasks_layers():
    from tasks_util import SMOKE
    from typer.testing import CliRunner

    from opencomposer.cli import app
    from opencomposer.tasks.task import Suite

    res = CliRunner().invoke(app, ["tasks", "build", str(SMOKE)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [t.id for t in Suite.load(SMOKE).tasks]
    assert all(line.split()[-1].endswith("/workspace") for line in lines)
