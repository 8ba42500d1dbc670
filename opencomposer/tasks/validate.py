"""Suite validation: every task must be solvable, unsolved as given, and deterministic.

For each task, `runs` times (default 2), in fresh workspaces:

    broken workspace (empty patch):  every fail-to-pass test fails, every pass-to-pass passes
    gold patch:                      every test passes (resolved)

A test whose outcome differs between runs is reported as flaky and makes the task invalid.
The stats in task.toml must match what gold.patch and the instruction actually give.
Tasks run concurrently (a thread pool of `jobs`; each grading is a sandboxed subprocess).

`opencomposer tasks validate SUITE_DIR --json` prints

    {"tasks": N, "valid": K, "stats": {"median_lines_changed", "median_files_changed",
     "median_instruction_chars", "packages"}, "results": [per-task detail], "duration_s"}

Left out: dropping flaky tests automatically (the generator/miner decides what to keep).
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

from opencomposer.sandbox.base import Backend
from opencomposer.tasks.build import default_backend, task_image
from opencomposer.tasks.grade import GradeResult, grade
from opencomposer.tasks.task import Suite, Task, patch_stats


@dataclass
class TaskValidation:
    """The verdict on one task, with the reasons when it is invalid."""

    id: str
    valid: bool
    problems: list[str] = field(default_factory=list)
    flaky: list[str] = field(default_factory=list)
    broken_s: float = 0.0
    """Mean seconds per grading of the broken workspace."""
    gold_s: float = 0.0
    """Mean seconds per grading of the gold patch."""


def validate_task(task: Task, *, runs: int = 2, backend: Backend | None = None) -> TaskValidation:
    backend = backend or default_backend()
    image = task_image(task, backend)
    broken = [grade(task, "", backend=backend, image=image) for _ in range(runs)]
    gold = [grade(task, task.gold_patch, backend=backend, image=image) for _ in range(runs)]
    problems = []
    for i, r in enumerate(broken):
        if r.reason:
            problems.append(f"broken run {i + 1}: {r.reason}")
        problems += [f"broken run {i + 1}: fail-to-pass {t} {r.tests[t]} (must fail)"
                     for t in task.spec.tests.fail_to_pass if r.tests[t] == "passed"]
        problems += [f"broken run {i + 1}: pass-to-pass {t} {r.tests[t]} (must pass)"
                     for t in task.spec.tests.pass_to_pass if r.tests[t] != "passed"]
    for i, r in enumerate(gold):
        if r.reason:
            problems.append(f"gold run {i + 1}: {r.reason}")
        problems += [f"gold run {i + 1}: {t} {o} (must pass)" for t, o in r.tests.items() if o != "passed"]
    flaky = sorted(flaky_tests(broken) | flaky_tests(gold))
    problems += [f"flaky: {t}" for t in flaky]
    lines, files = patch_stats(task.gold_patch)
    stats = task.spec.stats
    got = (lines, files, len(task.spec.instruction))
    if (stats.gold_lines_changed, stats.gold_files_changed, stats.instruction_chars) != got:
        problems.append(f"task.toml stats {stats.model_dump()} do not match gold.patch/instruction "
                        f"(lines {got[0]}, files {got[1]}, chars {got[2]})")
    return TaskValidation(task.id, not problems, problems, flaky,
                          round(sum(r.duration_s for r in broken) / runs, 3),
                          round(sum(r.duration_s for r in gold) / runs, 3))


def flaky_tests(runs: list[GradeResult]) -> set[str]:
    """Tests whose outcome is not the same in every run."""
    ids = set().union(*(r.tests for r in runs))
    return {t for t in ids if len({r.tests.get(t) for r in runs}) > 1}


def suite_stats(tasks: list[Task]) -> dict:
    """Medians over the suite, computed from the gold patches and instructions themselves."""
    stats = [patch_stats(t.gold_patch) for t in tasks]
    return {
        "median_lines_changed": statistics.median(s[0] for s in stats),
        "median_files_changed": statistics.median(s[1] for s in stats),
        "median_instruction_chars": statistics.median(len(t.spec.instruction) for t in tasks),
        "packages": len({t.spec.source.package for t in tasks}),
    }


def validate_suite(path: Path | str, *, runs: int = 2, jobs: int = 2, backend: Backend | None = None,
                   progress: bool = True) -> dict:
    """Validate every task of a suite; the dict `opencomposer tasks validate --json` prints."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    start = time.monotonic()
    suite = Suite.load(path)
    backend = backend or default_backend()
    for task in suite.tasks:  # build shared layers once, before the threads race for them
        task_image(task, backend)
    results: dict[str, TaskValidation] = {}
    columns = (TextColumn("validate {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), disable=not progress) as bar, \
            ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        job = bar.add_task(suite.spec.name, total=len(suite.tasks))
        futures = {pool.submit(validate_task, t, runs=runs, backend=backend): t for t in suite.tasks}
        for fut in as_completed(futures):
            task = futures[fut]
            try:
                results[task.id] = fut.result()
            except Exception as e:  # a task that cannot even be built is invalid, not fatal
                results[task.id] = TaskValidation(task.id, False, [f"{type(e).__name__}: {e}"])
            bar.advance(job)
    ordered = [results[t.id] for t in suite.tasks]
    return {
        "tasks": len(ordered),
        "valid": sum(r.valid for r in ordered),
        "stats": suite_stats(suite.tasks),
        "results": [asdict(r) for r in ordered],
        "duration_s": round(time.monotonic() - start, 2),
    }
