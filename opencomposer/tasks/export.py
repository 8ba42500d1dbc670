"""Export a suite as SWE-bench-style JSONL, one instance per line, for other harnesses.

SWE-bench fields and what they hold here:

    instance_id                  task id
    repo                         "pypi/<package>" (real sdists) or "generated/<package>"
    base_commit                  "<package>==<version>": the source the task starts from
    environment_setup_commit     same as base_commit (the venv is built from that source)
    version                      the package version
    patch                        gold.patch (applies to the task's starting workspace)
    test_patch                   the hidden tests as a diff against the starting workspace
    problem_statement            the instruction
    hints_text                   "" (terse requests carry no hints)
    created_at                   task.toml `created`
    FAIL_TO_PASS, PASS_TO_PASS   JSON-encoded lists of pytest node ids (as in SWE-bench)

SWE-bench's base is a git commit; ours is an sdist (or a generated tree), so two extra
fields make an instance self-contained: `base_patch` (applied to the sdist unpacked at the
repo root, or to an empty directory for generated tasks, it gives the starting workspace)
and `sdist_sha256`; `requirements` lists the pinned test dependencies.

Left out: SWE-bench's docker image names and per-repo install specs (our environment is
the pinned `requirements` + `setup` commands instead).
"""

from __future__ import annotations

import json
from pathlib import Path

from opencomposer.sandbox.base import Backend
from opencomposer.tasks.task import Suite, Task, tree_diff


def workspace_files(task: Task, rels: list[str], backend: Backend | None = None) -> dict[str, str]:
    """Text of the given paths in the task's starting workspace (absent paths are left out)."""
    if task.spec.source.kind == "generated":
        root = task.workspace_dir
        return {r: (root / r).read_text() for r in rels if (root / r).is_file()}
    from opencomposer.tasks.build import task_image

    ws = task_image(task, backend).workspace()
    try:
        return {r: (ws.root / r).read_text() for r in rels if (ws.root / r).is_file()}
    finally:
        ws.close()


def swebench_record(task: Task, backend: Backend | None = None) -> dict:
    """One SWE-bench-style instance for a task (see the module docstring for the fields)."""
    src = task.spec.source
    hidden = {rel: data.decode() for rel, data in task.hidden_tests().items()}
    visible = workspace_files(task, sorted(hidden), backend)
    if src.kind == "generated":
        root = task.workspace_dir
        base_patch = tree_diff({}, {p.relative_to(root).as_posix(): p.read_text()
                                    for p in sorted(root.rglob("*")) if p.is_file()})
    else:
        base_patch = task.break_patch
    base = f"{src.package}=={src.version}"
    return {
        "instance_id": task.id,
        "repo": f"{'pypi' if src.kind == 'pypi' else 'generated'}/{src.package}",
        "base_commit": base,
        "environment_setup_commit": base,
        "version": src.version,
        "patch": task.gold_patch,
        "test_patch": tree_diff(visible, hidden),
        "problem_statement": task.spec.instruction,
        "hints_text": "",
        "created_at": task.spec.created,
        "FAIL_TO_PASS": json.dumps(task.spec.tests.fail_to_pass),
        "PASS_TO_PASS": json.dumps(task.spec.tests.pass_to_pass),
        "base_patch": base_patch,
        "sdist_sha256": src.sha256,
        "requirements": task.spec.environment.requirements,
    }


def export_suite(path: Path | str, out: Path | str | None = None, backend: Backend | None = None) -> list[dict]:
    """All tasks of a suite as records; written as JSONL to `out` when given."""
    records = [swebench_record(t, backend) for t in Suite.load(path).tasks]
    if out is not None:
        Path(out).write_text("".join(json.dumps(r) + "\n" for r in records))
    return records
