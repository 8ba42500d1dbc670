"""`opencomposer tasks ...`: build, grade, validate and export tasks.

    opencomposer tasks grade TASK_DIR --patch FILE [--json]
    opencomposer tasks validate SUITE_DIR [--json] [--runs N] [--jobs J]
    opencomposer tasks export SUITE_DIR [--out FILE.jsonl]
    opencomposer tasks build (TASK_DIR | SUITE_DIR)
    opencomposer tasks mine (--sdist PATH | --package NAME==VERSION | --source DIR) --out DIR [--max-tasks N]
                            [--variants V] [--find-links DIR] [--json]

`grade --json` prints {resolved, f2p_passed, f2p_total, p2p_passed, p2p_total, tests,
reason, notes, duration_s, log} and exits 0 whatever the verdict (the verdict is data);
`validate` exits 1 if any task is invalid. Malformed task files exit 2 with the message.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from opencomposer.errors import TaskError

app = typer.Typer(no_args_is_help=True, add_completion=False)


def _fail(e: Exception) -> None:
    print(f"error: {e}", file=sys.stderr)
    raise typer.Exit(2)


@app.command("grade")
def grade_cmd(
    task_dir: Path = typer.Argument(..., exists=True, file_okay=False, help="A task directory."),
    patch: str = typer.Option(..., "--patch", help="A git-style diff against the task's workspace; - for stdin."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
) -> None:
    """Grade a patch on a task's hidden tests, in a fresh sandbox."""
    from opencomposer.tasks.grade import grade
    from opencomposer.tasks.task import Task

    text = sys.stdin.read() if patch == "-" else Path(patch).read_text()
    try:
        result = grade(Task.load(task_dir), text)
    except TaskError as e:
        _fail(e)
    if as_json:
        print(json.dumps(result.to_json()))
        return
    verdict = "RESOLVED" if result.resolved else "NOT RESOLVED"
    print(f"{verdict}: fail-to-pass {result.f2p_passed}/{result.f2p_total}, "
          f"pass-to-pass {result.p2p_passed}/{result.p2p_total} ({result.duration_s:.2f} s)")
    if result.reason:
        print(f"reason: {result.reason}")
    for note in result.notes:
        print(f"note: {note}")
    for test, outcome in result.tests.items():
        if outcome != "passed":
            print(f"  {outcome:8} {test}")


@app.command("validate")
def validate_cmd(
    suite_dir: Path = typer.Argument(..., exists=True, file_okay=False, help="A suite directory (with suite.toml)."),
    as_json: bool = typer.Option(False, "--json", help="Print tasks, valid, stats and per-task results as JSON."),
    runs: int = typer.Option(2, "--runs", min=1, help="Repeat each check this many times (flakiness)."),
    jobs: int = typer.Option(2, "--jobs", min=1, help="Tasks validated concurrently."),
) -> None:
    """Check every task: broken fails fail-to-pass, passes pass-to-pass; gold passes all; repeatably."""
    from opencomposer.tasks.validate import validate_suite

    try:
        report = validate_suite(suite_dir, runs=runs, jobs=jobs)
    except TaskError as e:
        _fail(e)
    if as_json:
        print(json.dumps(report))
    else:
        for r in report["results"]:
            print(f"{'ok     ' if r['valid'] else 'INVALID'} {r['id']}")
            for p in r["problems"]:
                print(f"        {p}")
        print(f"{report['valid']}/{report['tasks']} valid in {report['duration_s']} s; stats {report['stats']}")
    if report["valid"] != report["tasks"]:
        raise typer.Exit(1)


@app.command("export")
def export_cmd(
    suite_dir: Path = typer.Argument(..., exists=True, file_okay=False, help="A suite directory."),
    out: Path = typer.Option(None, "--out", help="JSONL file to write (default: stdout)."),
) -> None:
    """Export a suite as SWE-bench-style JSONL."""
    from opencomposer.tasks.export import export_suite

    try:
        records = export_suite(suite_dir, out)
    except TaskError as e:
        _fail(e)
    if out is None:
        for r in records:
            print(json.dumps(r))
    else:
        print(f"wrote {len(records)} instances to {out}", file=sys.stderr)


@app.command("build")
def build_cmd(path: Path = typer.Argument(..., exists=True, file_okay=False, help="A task or suite directory.")) -> None:
    """Build (or find cached) the images of a task or of every task in a suite; print their layers."""
    from opencomposer.tasks.build import task_image
    from opencomposer.tasks.task import SUITE_FILE, Suite, Task

    try:
        tasks = Suite.load(path).tasks if (path / SUITE_FILE).is_file() else [Task.load(path)]
        for task in tasks:
            print(task.id, " ".join(str(p) for p in task_image(task).layers))
    except TaskError as e:
        _fail(e)


@app.command("mine")
def mine_cmd(
    package: str = typer.Option(None, "--package", help="NAME==VERSION of a PyPI package (its sdist is fetched)."),
    sdist: Path = typer.Option(None, "--sdist", help="A local sdist (.tar.gz or .zip) instead of --package."),
    source: Path = typer.Option(None, "--source", help="A local project directory (a git checkout, your own code)."),
    out: Path = typer.Option(..., "--out", help="Directory (suite) to write task directories into."),
    max_tasks: int = typer.Option(8, "--max-tasks", min=1, help="Tasks for this package (existing ones count)."),
    variants: int = typer.Option(1, "--variants", min=0, help="How many of them are procedural-bug variants."),
    seed: int = typer.Option(0, "--seed", help="Seed for feature sizes and variant choice."),
    find_links: Path = typer.Option(None, "--find-links", exists=True, file_okay=False,
                                    help="A directory of wheels/sdists to install requirements from besides PyPI."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
) -> None:
    """Mine tasks from a real project: features (bodies removed) and procedural bugs, each validated.

    A report per package (candidates tried, valid, rejected with reasons, seconds) is written
    to OUT/mining/NAME-VERSION.json and summarized here, also when mining stops early.
    """
    from dataclasses import asdict

    from opencomposer.tasks.mine import Settings, mine

    settings = Settings(seed=seed, max_tasks=max_tasks, variants=min(variants, max_tasks))
    try:
        report = mine(out, package=package, sdist=sdist, source=source, settings=settings, find_links=find_links)
    except TaskError as e:
        _fail(e)
    if as_json:
        print(json.dumps(asdict(report)))
        return
    print(report.summary())
