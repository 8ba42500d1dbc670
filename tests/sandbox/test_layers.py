"""Layers: workspaces, snapshot, fork, diff and close over overlayfs (bwrap backend)."""

from __future__ import annotations

import asyncio
import gc as pygc
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from sandbox_util import tree_state

from opencomposer.errors import SandboxError
from opencomposer.sandbox import Image, Workspace, get_backend
from opencomposer.sandbox.layers import gc, mounts_under


def test_workspace_is_copy_on_write_and_exec_sees_tool_edits(backend, project):
    before = tree_state(project)
    ws = backend.image_from_dir(project).workspace()
    assert isinstance(ws, Workspace) and isinstance(ws.image, Image)
    (ws.root / "pkg" / "core.py").write_text("edited by a tool\n")
    r = ws.exec(["sh", "-c", "cat pkg/core.py; echo new > made.txt; rm README.md"])
    assert r.ok and r.stdout == "edited by a tool\n"
    assert (ws.root / "made.txt").read_text() == "new\n"
    assert not (ws.root / "README.md").exists()
    ws.close()
    assert tree_state(project) == before


def test_snapshot_keeps_edits_and_deletions_and_the_workspace_goes_on(backend, project):
    ws = backend.image_from_dir(project).workspace()
    (ws.root / "pkg" / "core.py").write_text("v2\n")
    (ws.root / "README.md").unlink()
    shutil.rmtree(ws.root / "pkg" / "sub")
    image = ws.snapshot()
    assert len(image.layers) == 2
    (ws.root / "after.txt").write_text("only in ws\n")
    child = image.workspace()
    assert (child.root / "pkg" / "core.py").read_text() == "v2\n"
    assert not (child.root / "README.md").exists()
    assert not (child.root / "pkg" / "sub").exists()
    assert not (child.root / "after.txt").exists()
    assert (ws.root / "pkg" / "core.py").read_text() == "v2\n"
    # a directory deleted and re-created in a later layer must not resurrect old files
    (ws.root / "pkg" / "sub").mkdir()
    (ws.root / "pkg" / "sub" / "fresh.py").write_text("x = 1\n")
    again = ws.snapshot().workspace()
    assert sorted(os.listdir(again.root / "pkg" / "sub")) == ["fresh.py"]
    for w in (ws, child, again):
        w.close()


def test_fork_gives_independent_workspaces_without_copying(backend, project):
    ws = backend.image_from_dir(project).workspace()
    (ws.root / "state.txt").write_text("parent\n")
    forks = ws.fork(3)
    for i, f in enumerate(forks):
        assert (f.root / "state.txt").read_text() == "parent\n"
        assert not any((f.root.parent / "upper").iterdir()), "a fresh fork must not hold copies"
        f.exec(["sh", "-c", f"echo {i} > state.txt"])
    assert [(f.root / "state.txt").read_text() for f in forks] == ["0\n", "1\n", "2\n"]
    assert (ws.root / "state.txt").read_text() == "parent\n"
    for w in (ws, *forks):
        w.close()


def test_diff_is_a_git_patch_that_reproduces_the_workspace(backend, project, tmp_path):
    ws = backend.image_from_dir(project).workspace()
    r = ws.exec(["sh", "-c", textwrap.dedent("""
        sed -i 's/a + b/a + b + 0/' pkg/core.py
        printf 'no newline' > added.txt
        rm pkg/sub/other.py
        chmod +x README.md
        printf '\\000\\001\\002' > blob.bin
        printf 'caf\\351\\n' > latin1.txt
        ln -s pkg/core.py newlink
        mkdir -p pkg/__pycache__ && echo junk > pkg/__pycache__/core.cpython-311.pyc
    """)])
    assert r.ok, r.stderr
    patch = ws.diff()
    assert "diff --git a/pkg/core.py b/pkg/core.py\n--- a/pkg/core.py\n+++ b/pkg/core.py\n" in patch
    assert "-    return a + b\n+    return a + b + 0\n" in patch
    assert "new file mode 100644\n--- /dev/null\n+++ b/added.txt\n" in patch
    assert "+no newline\n\\ No newline at end of file\n" in patch
    assert "deleted file mode 100644\n--- a/pkg/sub/other.py\n+++ /dev/null\n" in patch
    assert "old mode 100644\nnew mode 100755\n" in patch
    assert "diff --git a/blob.bin b/blob.bin\nnew file mode 100644\nindex 0000000000000000000000000000000000000000.." in patch
    assert "GIT binary patch\nliteral 3\n" in patch
    assert "new file mode 120000\n" in patch
    assert "__pycache__" not in patch
    # replay the whole patch, binary files included, on a pristine copy with git: same tree
    replay = tmp_path / "replay"
    shutil.copytree(project, replay, symlinks=True)
    subprocess.run(["git", "apply", "-"], cwd=replay, input=patch.encode(), check=True)
    expected = tree_state(ws.root)
    for rel in [k for k in expected if "__pycache__" in k]:
        del expected[rel]
    assert tree_state(replay) == expected
    ws.close()


def test_diff_spans_snapshots_and_ignores_unchanged_copy_ups(backend, project):
    ws = backend.image_from_dir(project).workspace()
    (ws.root / "one.txt").write_text("1\n")
    ws.snapshot()
    (ws.root / "two.txt").write_text("2\n")
    os.utime(ws.root / "README.md")  # a metadata-only touch copies the file up, content unchanged
    patch = ws.diff()
    assert "b/one.txt" in patch and "b/two.txt" in patch and "README" not in patch
    fork = ws.fork(1)[0]
    assert fork.diff() == ""  # a fork's base is the snapshot it was made from
    (fork.root / "one.txt").unlink()
    assert "deleted file mode 100644\n--- a/one.txt\n" in fork.diff()
    ws.close()
    fork.close()


def test_close_leaves_no_mounts_dirs_or_layers_and_is_idempotent(backend, project, store):
    ws = backend.image_from_dir(project).workspace()
    (ws.root / "x").write_text("x")
    forks = ws.fork(2)
    (forks[0].root / "y").write_text("y")
    assert len(mounts_under(store)) == 3
    for w in (ws, *forks):
        w.close()
        w.close()
    del ws, forks, w  # snapshot layers live as long as an Image or open Workspace uses them
    pygc.collect()
    assert mounts_under(store) == []
    assert list((store / "ws").iterdir()) == []
    assert list((store / "l").iterdir()) == []
    assert tree_state(project)  # the in-place layer is the user's dir: never deleted


def test_closed_workspace_refuses_work(backend, project):
    ws = backend.image_from_dir(project).workspace()
    ws.close()
    for op in (ws.snapshot, ws.diff, lambda: ws.exec(["true"])):
        with pytest.raises(SandboxError, match="closed"):
            op()


def test_gc_cleans_up_after_a_crashed_process(store, project):
    crash = textwrap.dedent(f"""
        import os
        from opencomposer.sandbox.bwrap import BwrapBackend
        ws = BwrapBackend({str(store)!r}).image_from_dir({str(project)!r}).workspace()
        (ws.root / "f").write_text("x")
        ws.snapshot()
        os._exit(0)  # no finalizers, no atexit: what a crash leaves
    """)
    subprocess.run([sys.executable, "-c", crash], check=True)
    assert len(mounts_under(store)) == 1
    removed = gc(store)
    assert len(removed["mounts"]) == 1 and len(removed["dirs"]) == 2
    assert mounts_under(store) == []
    assert list((store / "ws").iterdir()) == [] and list((store / "l").iterdir()) == []
    # the first backend a process opens on a store collects too
    subprocess.run([sys.executable, "-c", crash], check=True)
    check = f"from opencomposer.sandbox.bwrap import BwrapBackend; BwrapBackend({str(store)!r})"
    subprocess.run([sys.executable, "-c", check], check=True)
    assert mounts_under(store) == [] and list((store / "ws").iterdir()) == []


def test_in_place_workspace_edits_the_host_dir_and_refuses_layer_ops(backend, project):
    ws = backend.workspace_in_place(project)
    assert ws.root == project.resolve()
    assert ws.exec(["sh", "-c", "echo hi > /workspace/from_sandbox.txt"]).ok
    assert (project / "from_sandbox.txt").read_text() == "hi\n"
    for op in (ws.snapshot, ws.diff, lambda: ws.fork(2)):
        with pytest.raises(SandboxError, match="in place"):
            op()
    ws.close()


def test_copied_image_is_independent_of_its_source(backend, project):
    image = backend.image_from_dir(project, copy=True)
    (project / "README.md").write_text("changed on the host\n")
    ws = image.workspace()
    assert (ws.root / "README.md").read_text() == "# demo\n\nA small project.\n"
    ws.close()


def test_bad_inputs_raise_clear_errors(backend, tmp_path):
    with pytest.raises(SandboxError, match="not a directory"):
        backend.image_from_dir(tmp_path / "missing")
    with pytest.raises(SandboxError, match="missing"):
        backend.image([tmp_path / "missing"])
    from opencomposer.errors import ConfigError
    with pytest.raises(ConfigError, match="bwrap, gvisor"):
        get_backend("docker")


async def test_aexec_runs_concurrently_without_blocking_the_loop(backend, project):
    ws = backend.image_from_dir(project).workspace()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    t = asyncio.create_task(ticker())
    results = await asyncio.gather(*(ws.aexec(["sh", "-c", f"sleep 0.5; echo {i}"]) for i in range(4)))
    t.cancel()
    assert [r.stdout for r in results] == ["0\n", "1\n", "2\n", "3\n"]
    assert ticks >= 10, "the event loop was blocked while commands ran"
    ws.close()
