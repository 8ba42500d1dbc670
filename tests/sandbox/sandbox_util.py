"""Helpers shared by the sandbox tests (importable because pytest puts this dir on sys.path)."""

from __future__ import annotations

import os
from pathlib import Path


def tree_state(root: Path) -> dict[str, tuple]:
    """Everything observable about a tree: kinds, modes, contents, link targets."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = p.lstat()
            if p.is_symlink():
                state[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                state[rel] = ("dir", st.st_mode)
            else:
                state[rel] = ("file", st.st_mode, p.read_bytes())
    return state


def host_processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains `marker` (a /proc scan, no psutil)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry))
    return found
