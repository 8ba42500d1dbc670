"""Session-wide hooks for the whole suite.

Ray's native threads outlive `ray.shutdown()`. A few tests start Ray in the pytest process
itself (tests/rl/test_ray_rl.py, tests/sandbox/test_ray_pool.py, the Ray runner's pipeline
test), and after them the process keeps the core worker's threads (`gcs_client_io_service`,
`worker.io`, gRPC's event engine and timers: seen in /proc/self/task after the last
`ray.shutdown()`). At exit the C++ static destructors then run beside those threads; CI's
run of 2026-12-07 ended with SIGSEGV after "1078 passed" (make's exit status 2), and Ray
itself ends its worker processes with os._exit for the same reason (ray-project/ray#18899).

So: when Ray's threads are still there at exit, the process ends with pytest's own exit
status through os._exit, after every Python-level exit handler has run (this one is
registered before any test module is imported, and atexit runs its handlers last-in,
first-out, so the workspaces' finalizers and Ray's own shutdown hook come first). Only the
native teardown is skipped. A test failure still fails the run: the status is pytest's.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys

_RAY_THREADS = ("gcs_client_io_s", "worker.io")  # /proc/<pid>/task/*/comm keeps 15 characters
_exit_status: list[int] = []


def pytest_sessionfinish(session, exitstatus) -> None:
    _exit_status[:] = [int(exitstatus)]


def _ray_threads_alive() -> bool:
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() in _RAY_THREADS:
                    return True
        except OSError:
            continue
    return False


def _exit_before_native_teardown() -> None:
    if not _exit_status or "ray" not in sys.modules or not _ray_threads_alive():
        return
    logging.shutdown()
    sys.stderr.write(f"tests/conftest.py: Ray's threads outlived ray.shutdown(); exit status {_exit_status[0]} "
                     f"(pytest's), without the native teardown\n")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(_exit_status[0])


atexit.register(_exit_before_native_teardown)
