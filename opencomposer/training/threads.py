"""torch's thread count for a training step, capped by the CPUs that other processes leave free.

Why: torch's CPU ops split each parallel region between its OpenMP threads, and the region
ends when the last thread does. A thread that has lost its core to another process (a sandbox
running the agents' commands or the hidden tests, a server, any busy neighbour) holds every
region of the step until the scheduler gives the core back. Measured on 2 cores with one busy
process pinned to one of them, the RL trainer's step took 5.75-6.47 s on 2 threads against
3.16-3.24 s on one (docs/benchmarks.md, vs_trl's recorded steps replayed): twice as slow as
its own one-thread figure. The engine's kernels have the same guard in C++
(engine/csrc/pool.h, policy 3).

How: before each step, `StepThreads.fit()` reads the CPU time that others used on this
process's CPUs since the last call (/proc/stat's busy time on those CPUs, less this process's
own CPU time: every thread of it) and sets torch's thread count to the CPUs left, rounded to
the nearest, between 1 and the count it started with. A step is long (0.1-10 s) against
/proc/stat's 10 ms ticks, so one step's window is enough. On a quiet machine the count never
moves, so seeded runs keep their bits; under load a step may run on fewer threads than the
last, which can change float rounding (as any change of thread count can), not the maths.

Left out: CPU quotas (cgroup cpu.max) are not read; without /proc/stat (gVisor, macOS) the
count stays as it started.
"""

from __future__ import annotations

import math
import os
import time

import torch

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def cpu_times(cpus: set[int]) -> tuple[float, float] | None:
    """(busy, total) seconds of `cpus` since boot, from /proc/stat (every process's time);
    None where it cannot be read."""
    busy = total = 0
    try:
        with open("/proc/stat") as f:
            for line in f:
                if not (line.startswith("cpu") and line[3:4].isdigit()):
                    continue
                name, *fields = line.split()
                if int(name[3:]) not in cpus:
                    continue
                # user nice system idle iowait irq softirq steal: idle and iowait are free time
                ticks = [int(x) for x in fields[:8]]
                total += sum(ticks)
                busy += sum(ticks) - ticks[3] - ticks[4]
    except (OSError, ValueError):
        return None
    return (busy * _TICK_S, total * _TICK_S) if total else None


class FreeCPUs:
    """How many of this process's CPUs other processes left free since the last call."""

    def __init__(self):
        self._last = self._read()[1:]

    @staticmethod
    def _read() -> tuple[int, tuple[float, float] | None, float]:
        """(CPUs this process may use, cpu_times of them, this process's CPU seconds)."""
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
        return len(cpus), cpu_times(cpus), time.process_time()

    def __call__(self) -> int | None:
        """The CPUs left (rounded to the nearest, at least 1) over the time since the last call,
        or None when /proc/stat cannot be read or no tick has passed."""
        n, now, own = self._read()
        then, own0 = self._last
        if now is None or (then is not None and now[1] <= then[1]):
            return None
        self._last = (now, own)
        if then is None:  # the first readable call: the window starts here
            return None
        per_cpu_s = (now[1] - then[1]) / n
        others = ((now[0] - then[0]) - (own - own0)) / per_cpu_s
        return int(min(n, max(1, math.floor(n - max(0.0, others) + 0.5))))


class StepThreads:
    """Fits torch's thread count to the free CPUs before each step (see the module docstring).

    `threads` is the most the steps may use (default: torch's count now; a count that someone
    else sets between two steps becomes the new most). `fit()` returns the count the next step
    runs on. Call it from the thread that runs the step: torch keeps the count per thread."""

    def __init__(self, threads: int | None = None):
        self.threads = threads or torch.get_num_threads()
        self._set = torch.get_num_threads()
        self._free = FreeCPUs()

    def fit(self) -> int:
        now = torch.get_num_threads()
        if now != self._set:  # set by someone else since the last step
            self.threads = now
        free = self._free()
        want = now if free is None else min(self.threads, free)
        if want != now:
            torch.set_num_threads(want)
        self._set = want
        return want
