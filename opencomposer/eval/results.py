"""An evaluation run's directory as files: their names, one result row, and reading rows back.

eval/run.py writes these files and eval/report.py reads them; both import this module, so the
report never imports the runner (see eval/run.py's docstring for what each file holds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

RESULTS, TRAJECTORIES, RUN, SUMMARY, PARTIAL = "results.jsonl", "trajectories.jsonl", "run.json", "results.json", "partial"


@dataclass
class Row:
    """One graded episode (one line of results.jsonl)."""

    task_id: str
    pass_index: int
    trajectory_id: str
    status: str
    """"done", or "error" (not graded: rerun the evaluation to retry it)."""
    resolved: bool = False
    reward: float = 0.0
    f2p_passed: int = 0
    f2p_total: int = 0
    p2p_passed: int = 0
    p2p_total: int = 0
    grade_reason: str | None = None
    stop_reason: str | None = None
    error: str | None = None
    turns: int = 0
    tool_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    agent_s: float = 0.0
    grade_s: float = 0.0
    patch_lines: int = 0
    extra: dict = field(default_factory=dict)


def read_rows(out: Path) -> list[Row]:
    """Rows of results.jsonl; the last row of a task x pass wins (a rerun after an error)."""
    path = out / RESULTS
    if not path.is_file():
        return []
    rows: dict[tuple[str, int], Row] = {}
    for line in path.read_text().splitlines(keepends=True):
        if line.endswith("\n"):  # a line cut by a crash is not a result
            r = Row(**json.loads(line))
            rows[(r.task_id, r.pass_index)] = r
    return list(rows.values())
