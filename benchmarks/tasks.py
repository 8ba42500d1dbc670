"""Task figures: suite validation throughput and grading latency per task.

    .venv/bin/python benchmarks/tasks.py [--json] [--slice 10] [--jobs 2]

- validate: `validate_suite` (2 runs each of the broken workspace and the gold patch, per
  task, `--jobs` tasks at a time) on the smoke suite and on `--slice` tasks of ocbench-v1,
  evenly spaced over the sorted ids (a temporary suite of symlinks); reports tasks
  validated per minute.
  Images are built (or found in the cache) before the clock starts: a cold cache adds the
  sdist download and venv build once per package.
- grade: one `grade()` of the gold patch and one of the empty patch (the broken workspace,
  where the fail-to-pass tests fail with tracebacks) per task, sequentially, on the same
  tasks; reports median and p95 seconds per task (sandbox start, patch, hidden tests,
  pytest, JUnit check).

The machine is shared, so the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from opencomposer.tasks.build import default_backend, task_image
from opencomposer.tasks.grade import grade
from opencomposer.tasks.task import SUITE_FILE, Suite
from opencomposer.tasks.validate import validate_suite

REPO = Path(__file__).resolve().parents[1]
SUITES = REPO / "tasks" / "suites"


def slice_suite(src: Path, n: int, dest: Path) -> Path:
    """A temporary suite of n tasks of `src`, evenly spaced over its sorted ids, so that every
    package is represented (task dirs symlinked)."""
    tasks = Suite.load(src).tasks
    tasks = [tasks[i * len(tasks) // n] for i in range(min(n, len(tasks)))]
    dest.mkdir(parents=True)
    for t in tasks:
        (dest / t.id).symlink_to(t.path.resolve())
    (dest / SUITE_FILE).write_text(f'name = "{src.name}-slice{n}"\nversion = "0"\n')
    return dest


def measure(path: Path, jobs: int) -> dict:
    backend = default_backend()
    suite = Suite.load(path)
    for task in suite.tasks:  # warm the image cache: builds are not what this measures
        task_image(task, backend)
    start = time.monotonic()
    report = validate_suite(path, jobs=jobs, backend=backend, progress=False)
    minutes = (time.monotonic() - start) / 60
    gold = sorted(grade(t, t.gold_patch, backend=backend).duration_s for t in suite.tasks)
    broken = sorted(grade(t, "", backend=backend).duration_s for t in suite.tasks)
    return {
        "suite": suite.spec.name,
        "tasks": report["tasks"],
        "valid": report["valid"],
        "validated_per_min": round(report["tasks"] / minutes, 2),
        "grade_gold_median_s": round(statistics.median(gold), 3),
        "grade_gold_p95_s": round(gold[int(0.95 * (len(gold) - 1))], 3),
        "grade_broken_median_s": round(statistics.median(broken), 3),
        "grade_broken_p95_s": round(broken[int(0.95 * (len(broken) - 1))], 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--slice", type=int, default=10, help="ocbench-v1 tasks to measure")
    ap.add_argument("--jobs", type=int, default=2, help="tasks validated concurrently")
    args = ap.parse_args()
    results = [measure(SUITES / "smoke", args.jobs)]
    tmp = Path(tempfile.mkdtemp())
    try:
        results.append(measure(slice_suite(SUITES / "ocbench-v1", args.slice, tmp / "ocbench-v1-slice"), args.jobs))
    finally:
        shutil.rmtree(tmp)
    out = {"results": results, "jobs": args.jobs, "loadavg": [round(x, 2) for x in os.getloadavg()],
           "cpus": os.cpu_count()}
    if args.json:
        print(json.dumps(out))
        return
    for r in results:
        print(f"{r['suite']:24} {r['valid']}/{r['tasks']} valid  {r['validated_per_min']:7.2f} tasks/min  "
              f"grade gold median {r['grade_gold_median_s']:.2f} s p95 {r['grade_gold_p95_s']:.2f} s, "
              f"broken median {r['grade_broken_median_s']:.2f} s p95 {r['grade_broken_p95_s']:.2f} s")
    print(f"jobs {args.jobs}, load average {out['loadavg']}, {out['cpus']} cpus")


if __name__ == "__main__":
    main()
