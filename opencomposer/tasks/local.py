"""A local project directory as a task's source: its files, their hash, and its source layer.

    tree_files(root)   the files that make the project: `git ls-files` (tracked and untracked,
                       not ignored) in a git checkout, else every file but caches and venvs
    tree_hash(root)    sha256 over (path, executable bit, sha256 of content) of those files:
                       what a task records as source.sha256, so it can be rebuilt and checked
    git_commit(root)   HEAD's commit, or None outside git (recorded beside the hash; a dirty
                       tree still hashes to what was mined)
    local_source_layer(path, package, version, sha256)
                       a copy of those files in the cache, checked against sha256

Symlinks are left out (a link could point anywhere on the host). git runs with hooks and
fsmonitor off: listing files must not run the project's configuration.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from opencomposer.errors import TaskError
from opencomposer.tasks.cache import cache_dir, locked

SKIP_DIRS = {".git", ".hg", ".svn", ".venv", "venv", "__pycache__", ".tox", ".nox", ".mypy_cache",
             ".pytest_cache", ".ruff_cache", "build", "dist", "node_modules", ".eggs"}
_GIT = ["git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null"]


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*_GIT, "-C", str(root), *args], capture_output=True, text=True)


def git_commit(root: Path) -> str | None:
    res = _git(root, "rev-parse", "--verify", "-q", "HEAD")
    if res.returncode != 0 or _git(root, "rev-parse", "--show-toplevel").stdout.strip() == "":
        return None
    return res.stdout.strip() or None


def tree_files(root: Path) -> list[str]:
    """Relative paths of the project's regular files, sorted; see the module docstring."""
    root = Path(root)
    inside = _git(root, "rev-parse", "--is-inside-work-tree")
    if inside.returncode == 0 and inside.stdout.strip() == "true":
        res = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", ".")
        names = [n for n in res.stdout.split("\0") if n]
    else:
        names = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info"))
            rel = Path(dirpath).relative_to(root)
            names += [(rel / f).as_posix() for f in filenames]
    out = []
    for n in names:
        p = root / n
        if p.is_symlink() or not p.is_file() or any(part in SKIP_DIRS for part in Path(n).parts[:-1]) \
                or n.endswith((".pyc", ".pyo")):
            continue
        out.append(n)
    return sorted(out)


def tree_hash(root: Path, files: list[str] | None = None) -> str:
    h = hashlib.sha256()
    for rel in files if files is not None else tree_files(root):
        p = Path(root) / rel
        mode = "x" if os.access(p, os.X_OK) else "-"
        h.update(f"{rel}\0{mode}\0".encode() + hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def local_source_layer(path: Path, package: str, version: str, sha256: str) -> Path:
    """The project at `path` copied into the cache as a source layer, once (checked against sha256)."""
    key = f"{package}-{version}-local-{sha256[:16]}"
    dest = cache_dir() / "sources" / key / "layer"
    if dest.is_dir():
        return dest
    path = Path(path)
    if not path.is_dir():
        raise TaskError(f"{path}: the task's local source directory is gone (and not in the cache); "
                        f"restore it at that path")
    with locked(f"source-{key}"):
        if dest.is_dir():
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        files = tree_files(path)
        got = tree_hash(path, files)
        if got != sha256:
            raise TaskError(f"{path}: its files hash to {got}, not the task's source.sha256 {sha256}: the tree "
                            f"changed since the task was mined (check out the recorded commit, or re-mine)")
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=dest.parent))
        try:
            for rel in files:
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path / rel, tmp / rel)
            tmp.rename(dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return dest
