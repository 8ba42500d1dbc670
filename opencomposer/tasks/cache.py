"""The cache of built task layers (sources, venvs, wheels) and the lock around each entry.

Shared by the builders of an image's layers (build.py for sdists, local.py for a local project
directory): one entry is built by one builder at a time, across threads and processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from pathlib import Path

_thread_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()


def cache_dir() -> Path:
    """Where built layers live: $OPENCOMPOSER_CACHE or ~/.cache/opencomposer."""
    return Path(os.environ.get("OPENCOMPOSER_CACHE") or "~/.cache/opencomposer").expanduser()


@contextlib.contextmanager
def locked(key: str):
    """Serialize builders of one cache entry: a thread lock (flock is per process) + a file lock."""
    with _guard:
        tlock = _thread_locks.setdefault(key, threading.Lock())
    lock_dir = cache_dir() / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with tlock, open(lock_dir / f"{key}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
