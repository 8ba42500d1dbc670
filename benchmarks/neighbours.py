"""Neighbours for benchmarks that measure the engine on a busy machine (decode.py
--background-load, --sandbox-load): processes started before the measurement, paused for the
quiet passes, resumed for the loaded ones, and always stopped after.

- `BusyCores(n)`: n pure-Python busy loops, each pinned to one CPU of this process's affinity
  set (the first n), paused with SIGSTOP and resumed with SIGCONT: what a compile job or a
  CPU-bound test occupies.
- `SandboxTests(suite)`: the grader in a loop, as the RL and eval stages run it beside the
  engine: `opencomposer.tasks.grade.grade(task, gold patch)` on every task of the suite in
  turn (a fresh sandbox workspace, the hidden tests written over it, pytest in the real
  sandbox), paused between two grades. Its load comes and goes: process starts, imports,
  pytest, short gaps.

Each neighbour runs in a session of its own and exits when its parent does (the busy loops
watch their parent pid, the grader loop its stdin), so an interrupted benchmark leaves
nothing running. `python benchmarks/neighbours.py sandbox SUITE` is the grader loop itself
(it reads "run" / "pause" lines on stdin and answers "paused" once idle).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUSY = """import os
os.sched_setaffinity(0, {{{cpu}}})
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(10**6):
        pass
"""


class BusyCores:
    """n busy processes, one pinned to each of the first n CPUs this process may use."""

    def __init__(self, n: int):
        cpus = sorted(os.sched_getaffinity(0))
        if not 1 <= n <= len(cpus):
            raise ValueError(f"--background-load must be between 1 and the {len(cpus)} CPUs this process may use, "
                             f"got {n}")
        self.cpus = cpus[:n]
        self.procs = [subprocess.Popen([sys.executable, "-c", BUSY.format(cpu=c)], start_new_session=True)
                      for c in self.cpus]
        self.pause()

    def pause(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()

    def describe(self) -> str:
        return f"{len(self.cpus)} busy process(es) pinned to CPU(s) {self.cpus}"


class SandboxTests:
    """The grader on every task of `suite`, in a loop, in a child process (module docstring)."""

    def __init__(self, suite: Path | str):
        self.suite = Path(suite)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, __file__, "sandbox", str(self.suite)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True, env=env)
        self._expect("paused")  # the suite is loaded and its images are built

    def _send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def _expect(self, want: str) -> None:
        got = self.proc.stdout.readline().strip()
        if got != want:
            self.stop()
            raise RuntimeError(f"the sandbox neighbour said {got!r}, not {want!r} (its stderr is above)")

    def resume(self) -> None:
        self._send("run")

    def pause(self) -> None:
        self._send("pause")
        self._expect("paused")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def describe(self) -> str:
        return f"the grader in a loop over {self.suite} (hidden tests in the sandbox)"


def _grader_loop(suite: str) -> None:
    from opencomposer.tasks.build import default_backend, task_image
    from opencomposer.tasks.grade import grade
    from opencomposer.tasks.task import Suite

    tasks = Suite.load(suite).tasks
    backend = default_backend()
    images = {t.id: task_image(t, backend) for t in tasks}  # built (or found cached) before any pass
    running = threading.Event()

    def commands():
        for line in sys.stdin:
            running.set() if line.strip() == "run" else running.clear()
        os._exit(0)  # the parent is gone

    threading.Thread(target=commands, daemon=True).start()
    i = 0
    while True:
        if not running.is_set():
            print("paused", flush=True)
            running.wait()
        task = tasks[i % len(tasks)]
        grade(task, task.gold_patch, backend=backend, image=images[task.id])
        i += 1


if __name__ == "__main__":
    if sys.argv[1:2] != ["sandbox"] or len(sys.argv) != 3:
        raise SystemExit("usage: python benchmarks/neighbours.py sandbox SUITE_DIR")
    _grader_loop(sys.argv[2])
