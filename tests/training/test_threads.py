"""training/threads.py: torch's thread count follows the CPUs other processes leave free."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from opencomposer.training.threads import FreeCPUs, StepThreads, cpu_times

CPUS = sorted(os.sched_getaffinity(0))


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_cpu_times_count_this_process_busy_time():
    before = cpu_times(set(CPUS))
    own0 = time.process_time()
    _spin(0.3)
    after = cpu_times(set(CPUS))
    assert before is not None and after is not None
    busy, total = after[0] - before[0], after[1] - before[1]
    own = time.process_time() - own0
    assert busy >= own - 0.05  # every process's busy time includes ours (10 ms ticks)
    assert total == pytest.approx(len(CPUS) * 0.3, rel=0.35)


@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs")
def test_a_busy_neighbour_takes_its_cpu_out_of_the_count_and_gives_it_back():
    """With a busy process pinned to every CPU but one, one CPU counts as free, and torch's
    thread count follows it down; once they stop, it goes back up to the starting count."""
    before = torch.get_num_threads()
    torch.set_num_threads(len(CPUS))
    try:
        threads = StepThreads()
        assert threads.threads == len(CPUS)
        busy = [subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{c}}})\nwhile True: pass"])
                for c in CPUS[1:]]
        try:
            time.sleep(0.3)  # their start-up
            threads.fit()
            _spin(0.5)  # a step on one CPU, beside them
            assert threads.fit() == 1
            assert torch.get_num_threads() == 1
        finally:
            for p in busy:
                p.kill()
                p.wait()
        deadline = time.monotonic() + 10  # a job of another test beside it may hold a CPU a while
        while threads.fit() != len(CPUS) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert torch.get_num_threads() == len(CPUS), "the CPUs did not come back after the busy processes stopped"
    finally:
        torch.set_num_threads(before)


def test_own_threads_are_not_counted_as_neighbours():
    """This process's own threads busy on every CPU (torch's, in matrix products) leave the
    count at every CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(len(CPUS))
    try:
        a = torch.randn(512, 512)
        free = FreeCPUs()
        end = time.perf_counter() + 0.5
        while time.perf_counter() < end:
            a @ a
        assert free() == len(CPUS)
    finally:
        torch.set_num_threads(before)


def test_without_proc_stat_the_count_stays(monkeypatch):
    from opencomposer.training import threads as mod

    monkeypatch.setattr(mod, "cpu_times", lambda cpus: None)
    before = torch.get_num_threads()
    st = StepThreads(threads=before)
    assert st.fit() == before


def test_a_count_set_by_someone_else_becomes_the_most():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        st = StepThreads()
        torch.set_num_threads(len(CPUS))  # e.g. a run's num_threads, set after the trainer was built
        assert st.fit() <= len(CPUS) and st.threads == len(CPUS)
    finally:
        torch.set_num_threads(before)
