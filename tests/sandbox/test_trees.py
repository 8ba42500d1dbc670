"""Cleanup of what a sandbox wrote, attacked from inside the sandbox: trees built to break
removal (depth, permissions, odd file types, links out, mounts), and the store after them."""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from opencomposer.errors import SandboxError
from opencomposer.sandbox.bwrap import BwrapBackend
from opencomposer.sandbox.layers import gc, mounts_under, umount

DEEP = """
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
for _ in range(int(sys.argv[2])):  # fd-relative: as deep as we like, past PATH_MAX
    os.mkdir(sys.argv[3], dir_fd=fd)
    sub = os.open(sys.argv[3], os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = sub
open(os.open("bottom", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd), "w").write("x")
"""


def _make_deep(root: Path, levels: int, name: str = "a") -> None:
    subprocess.run(["python3", "-c", DEEP, str(root), str(levels), name], check=True)


def _store_entries(store: Path) -> list[str]:
    return sorted(str(p.relative_to(store)) for sub in ("ws", "l", "run") if (store / sub).is_dir()
                  for p in (store / sub).iterdir())


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Host files beside the store that a removal must never touch."""
    d = tmp_path / "outside"
    (d / "sub").mkdir(parents=True)
    (d / "keep.txt").write_text("keep")
    (d / "sub" / "keep.txt").write_text("keep")
    return d


def test_a_tree_deeper_than_the_recursion_limit_and_path_max_is_removed_on_close(backend, project, store):
    ws = backend.image_from_dir(project).workspace()
    r = ws.exec(["python3", "-c", DEEP, ".", "1100", "a"])  # 1,100 levels: 2,200 bytes of path
    r2 = ws.exec(["python3", "-c", DEEP, ".", "40", "b" * 200])  # 40 levels of 200-byte names: 8 kB
    assert r.ok and r2.ok, r.stderr + r2.stderr
    ws.close()
    assert _store_entries(store) == [] and mounts_under(store) == []
    again = backend.image_from_dir(project).workspace()  # the store still works
    assert again.exec(["cat", "README.md"]).stdout.startswith("# demo")
    again.close()


def test_mode_000_dirs_fifos_sockets_and_immutable_files_do_not_survive_close(backend, project, store):
    ws = backend.image_from_dir(project).workspace()
    r = ws.exec(["sh", "-c", """
        mkdir -p locked/inner/deeper && touch locked/inner/f locked/inner/deeper/g
        chmod 000 locked/inner/deeper locked/inner locked
        mkfifo pipe && python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind("sock")'
        mkdir ro && touch ro/f && chmod 500 ro && chmod 000 ro/f
        chattr +i README.md 2>/dev/null && echo CHATTR  # no CAP_LINUX_IMMUTABLE in here
        echo ok"""])
    assert r.stdout.strip() == "ok", r.stdout + r.stderr
    upper = ws.root.parent / "upper"  # the host can set what the sandbox cannot: flags in the upper dir
    (upper / "frozen").write_text("i")
    (upper / "appendonly").mkdir()
    (upper / "appendonly" / "f").write_text("a")
    subprocess.run(["chattr", "+i", str(upper / "frozen")], check=True)
    subprocess.run(["chattr", "+a", str(upper / "appendonly")], check=True)
    ws.close()
    assert _store_entries(store) == [] and mounts_under(store) == []


def test_symlinks_out_of_the_tree_are_removed_not_followed(backend, project, store, outside):
    ws = backend.image_from_dir(project).workspace()
    r = ws.exec(["sh", "-c", f"""
        ln -s {outside} dirlink && ln -s {outside}/keep.txt filelink && ln -s {outside}/sub/ slashlink
        mkdir -p deep/er && ln -s {outside} deep/er/out && ln -s ../../.. deep/er/up
        ln -s /proc/1/root/{outside} viaproc && ln -s {outside}/sub deep/sub && echo ok"""])
    assert r.ok, r.stderr
    ws.close()
    assert _store_entries(store) == []
    assert sorted(p.name for p in outside.rglob("*")) == ["keep.txt", "keep.txt", "sub"]


def test_remove_tree_leaves_mounts_and_what_is_behind_them(tmp_path, outside):
    from opencomposer.sandbox.trees import remove_tree  # here: the other tests also run on older code
    tree = tmp_path / "tree"
    (tree / "a" / "mnt").mkdir(parents=True)
    (tree / "a" / "file").write_text("x")
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mount(str(outside).encode(), str(tree / "a" / "mnt").encode(), None, 4096, None) == 0  # MS_BIND
    try:
        with pytest.raises(SandboxError, match="mount point"):
            remove_tree(tree)
        assert not (tree / "a" / "file").exists()  # everything else went
        assert (outside / "keep.txt").read_text() == "keep" and (outside / "sub" / "keep.txt").exists()
    finally:
        umount(tree / "a" / "mnt")
    remove_tree(tree)  # once unmounted, a second try finishes the job
    assert not tree.exists() and (outside / "keep.txt").exists()


def test_gc_survives_what_a_sandbox_left_and_retries_later(store, project, outside):
    BwrapBackend(store)  # creates the store
    dead = "4194305"  # above any pid_max: never a live process
    deep, stuck, plain = (store / "ws" / f"{dead}.0", store / "l" / f"{dead}.1", store / "l" / f"{dead}.2")
    for d in (deep, stuck, plain):
        d.mkdir()
    _make_deep(deep, 1100)  # what made shutil.rmtree raise RecursionError in every backend start
    (stuck / "mnt").mkdir()
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mount(str(outside).encode(), str(stuck / "mnt").encode(), None, 4096, None) == 0  # MS_BIND
    os.mkfifo(plain / "fifo")
    socket.socket(socket.AF_UNIX).bind(str(plain / "sock"))
    start = (f"from opencomposer.sandbox.bwrap import BwrapBackend; "
             f"BwrapBackend({str(store)!r}).image_from_dir({str(project)!r}).workspace().close()")
    try:
        # a new process's first backend collects the store: it must start, whatever it finds
        p = subprocess.run([sys.executable, "-c", start], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert "mount point" in p.stderr  # logged, not raised
        assert _store_entries(store) == [f"l/{dead}.1"]
        assert sorted(p.name for p in outside.rglob("*")) == ["keep.txt", "keep.txt", "sub"]  # not through the mount
    finally:
        umount(stuck / "mnt")
    assert gc(store)["dirs"] == [str(stuck)] and _store_entries(store) == []  # the next gc finishes


def test_diff_of_a_workspace_with_a_tree_past_path_max_keeps_the_rest(backend, project):
    """The agent's patch (and so its grade) survives a tree too deep to open by path."""
    ws = backend.image_from_dir(project).workspace()
    try:
        assert ws.exec(["python3", "-c", DEEP, ".", "40", "b" * 200]).ok
        assert ws.exec(["sh", "-c", "echo changed >> README.md"]).ok
        patch = ws.diff()
    finally:
        ws.close()
    assert "diff --git a/README.md b/README.md" in patch and "+changed" in patch
