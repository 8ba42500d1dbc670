"""Reports over evaluation runs: accuracy, pass@k, cost, the cost-vs-accuracy Pareto plot,
and the static trajectory viewer.

Per run (one `opencomposer eval` output directory):

- accuracy: resolved episodes / all episodes (errors count as unresolved), i.e. the mean
  over passes of each pass's accuracy when every pass is complete; also per pass.
- pass@k for k = 1..passes, with the unbiased estimator of Chen et al. 2021 ("Evaluating
  Large Language Models Trained on Code", eq. 1), per task with n episodes of which c
  resolved, averaged over tasks:

      pass@k = 1 - C(n - c, k) / C(n, k)

- median cost (USD) and median completion tokens per task episode, mean and total cost.

Across runs: a table (report.md and index.html) and `pareto.png`: accuracy against median
cost per task (or median completion tokens per task when no run has prices), the Pareto
frontier (runs no other run beats on both: cheaper-or-equal and more-or-equally accurate,
strictly on one) drawn as a step line.

Output directory:

    index.html, report.md, summary.json, pareto.png
    runs/<label>/index.html          the run's trajectories (filterable)
    runs/<label>/t/<trajectory>.html one page per trajectory (viewer/)

Left out: confidence intervals, per-task comparisons across runs, cost of grading.
"""

from __future__ import annotations

import base64
import json
import math
import re
import statistics
from collections import Counter
from pathlib import Path
from typing import Sequence

from opencomposer.errors import ConfigError
from opencomposer.eval import viewer
from opencomposer.eval.results import PARTIAL, RUN, TRAJECTORIES, read_rows
from opencomposer.eval.viewer import esc

# ----------------------------------------------------------------------------- metrics


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for n samples of which c are correct (Chen et al. 2021)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarize(rows: Sequence[dict]) -> dict:
    """The summary of one run's rows (results.jsonl lines as dicts)."""
    if not rows:
        return {"tasks": 0, "episodes": 0, "errors": 0, "accuracy": None, "accuracy_per_pass": [],
                "pass_at_k": {}, "median_cost_usd": None, "mean_cost_usd": None, "total_cost_usd": 0.0,
                "median_completion_tokens": None, "stop_reasons": {}}
    by_task: dict[str, list[dict]] = {}
    for r in rows:
        by_task.setdefault(r["task_id"], []).append(r)
    passes = sorted({r["pass_index"] for r in rows})
    n_min = min(len(v) for v in by_task.values())
    costs = [r["cost_usd"] for r in rows]
    return {
        "tasks": len(by_task),
        "episodes": len(rows),
        "errors": sum(r["status"] != "done" for r in rows),
        "accuracy": sum(r["resolved"] for r in rows) / len(rows),
        "accuracy_per_pass": [statistics.mean(r["resolved"] for r in rows if r["pass_index"] == p) for p in passes],
        "pass_at_k": {str(k): statistics.mean(pass_at_k(len(v), sum(r["resolved"] for r in v), k)
                                              for v in by_task.values()) for k in range(1, n_min + 1)},
        "median_cost_usd": statistics.median(costs),
        "mean_cost_usd": statistics.mean(costs),
        "total_cost_usd": sum(costs),
        "median_completion_tokens": statistics.median(r["completion_tokens"] for r in rows),
        "stop_reasons": dict(Counter(r["stop_reason"] or "none" for r in rows)),
    }


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points (cost, accuracy) that no other point dominates, by cost."""
    front = []
    for i, (x, y) in enumerate(points):
        if not any((xj <= x and yj >= y) and (xj < x or yj > y) for j, (xj, yj) in enumerate(points) if j != i):
            front.append(i)
    return sorted(front, key=lambda i: points[i])


# ----------------------------------------------------------------------------- runs


class Run:
    """One evaluation directory, loaded."""

    def __init__(self, path: Path):
        from opencomposer.harness.trajectory import Trajectory, read_jsonl

        self.path = Path(path)
        if not (self.path / RUN).is_file():
            raise ConfigError(f"{path} is not an evaluation run (no {RUN}); pass directories written by "
                              "`opencomposer eval --out DIR`")
        self.info = json.loads((self.path / RUN).read_text())
        self.label = self.info.get("label") or self.info.get("policy", self.path.name)
        self.rows = [r.__dict__ for r in read_rows(self.path)]
        self.summary = summarize(self.rows)
        trajs = read_jsonl(self.path / TRAJECTORIES) if (self.path / TRAJECTORIES).is_file() else []
        done = {t.id for t in trajs}
        trajs += [Trajectory.load(p) for p in sorted((self.path / PARTIAL).glob("*.json")) if p.stem not in done]
        self.trajectories = {t.id: t for t in trajs}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:80] or "run"


def _fmt(x, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _cost_axis(runs: Sequence[Run]) -> tuple[str, list[float]]:
    if any((r.summary["median_cost_usd"] or 0) > 0 for r in runs):
        return "median cost per task (USD)", [r.summary["median_cost_usd"] or 0.0 for r in runs]
    return "median completion tokens per task", [float(r.summary["median_completion_tokens"] or 0) for r in runs]


def plot_pareto(runs: Sequence[Run], path: Path) -> Path:
    """Accuracy against cost per task, one point per run, the Pareto frontier as a step line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xlabel, xs = _cost_axis(runs)
    ys = [100 * (r.summary["accuracy"] or 0.0) for r in runs]
    front = pareto_front(list(zip(xs, ys)))
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.scatter(xs, ys, s=40, color="#0969da", zorder=3)
    for x, y, r in zip(xs, ys, runs):
        ax.annotate(r.label, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
    fx, fy = [xs[i] for i in front], [ys[i] for i in front]
    ax.step(fx, fy, where="post", color="#cf222e", linestyle="--", linewidth=1.2, label="Pareto frontier", zorder=2)
    positive = [x for x in xs if x > 0]
    if len(positive) == len(xs) and max(xs) / min(xs) > 20:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("accuracy (% of episodes resolved)")
    ax.set_ylim(-5, 105)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("Cost vs accuracy")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- output

_COLUMNS = ["run", "tasks", "episodes", "errors", "accuracy", "pass@k", "median cost/task", "median tokens/task",
            "total cost"]


def _row_cells(r: Run) -> list[str]:
    s = r.summary
    pk = ", ".join(f"@{k} {v:.3f}" for k, v in s["pass_at_k"].items())
    return [r.label, str(s["tasks"]), str(s["episodes"]), str(s["errors"]), _fmt(s["accuracy"]), pk or "-",
            "$" + _fmt(s["median_cost_usd"], ".4f"), _fmt(s["median_completion_tokens"], ".0f"),
            "$" + _fmt(s["total_cost_usd"], ".4f")]


def markdown_table(runs: Sequence[Run]) -> str:
    lines = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in _row_cells(r)) + " |" for r in runs]
    return "\n".join(lines) + "\n"


def _run_pages(run: Run, out: Path, slug: str) -> None:
    tdir = out / "runs" / slug / "t"
    tdir.mkdir(parents=True, exist_ok=True)
    nav = [("../../../index.html", "all runs"), ("../index.html", run.label)]
    files = {}
    for tid, t in run.trajectories.items():
        name = _slug(tid) + ".html"
        files[tid] = name
        (tdir / name).write_text(viewer.trajectory_page(t.to_dict(experts=False), nav))
    rows = []
    for r in sorted(run.rows, key=lambda r: (r["task_id"], r["pass_index"])):
        link = (f'<a href="t/{esc(files[r["trajectory_id"]])}">{esc(r["trajectory_id"])}</a>'
                if r["trajectory_id"] in files else esc(r["trajectory_id"]))
        verdict = viewer.verdict(r["resolved"]) if r["status"] == "done" else \
            f'<span class="bad">error</span> <span class="muted">{esc(r["error"])}</span>'
        rows.append([link, esc(r["pass_index"]), verdict, esc(r["stop_reason"]), esc(r["turns"]),
                     esc(r["tool_calls"]), esc(f'{r["completion_tokens"]:,}'), esc(f'${r["cost_usd"]:.4f}'),
                     esc(f'{r["agent_s"]:.1f}')])
    body = (f"<h1>{esc(run.label)}</h1>"
            f'<p class="muted">suite {esc(run.info.get("suite_name"))} v{esc(run.info.get("suite_version"))}, '
            f'policy {esc(run.info.get("policy"))}, {esc(run.info.get("passes"))} pass(es)</p>'
            + viewer.table(_COLUMNS, [[esc(c) for c in _row_cells(run)]], numeric=set(range(1, 9)))
            + '<div class="toolbar"><input id="filter" type="search" placeholder="filter rows"></div>'
            + viewer.table(["trajectory", "pass", "verdict", "stop", "turns", "tool calls", "tokens out", "cost",
                            "agent s"], rows, numeric={1, 4, 5, 6, 7, 8}))
    (out / "runs" / slug / "index.html").write_text(viewer.page(run.label, body, [("../../index.html", "all runs")]))


def write_report(run_dirs: Sequence[Path | str], out: Path | str) -> Path:
    """Write the report for `run_dirs` into `out`; returns the path of index.html."""
    if not run_dirs:
        raise ConfigError("give at least one run directory")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = [Run(Path(d)) for d in run_dirs]
    slugs: list[str] = []
    for r in runs:
        s = _slug(r.label)
        while s in slugs:
            s += "-2"
        slugs.append(s)
    png = plot_pareto(runs, out / "pareto.png")
    (out / "report.md").write_text("# Evaluation report\n\n" + markdown_table(runs) + "\n![cost vs accuracy](pareto.png)\n")
    (out / "summary.json").write_text(json.dumps(
        [{"label": r.label, "path": str(r.path), "policy": r.info.get("policy"), "suite": r.info.get("suite_name"),
          **r.summary} for r in runs], indent=2))
    for r, s in zip(runs, slugs):
        _run_pages(r, out, s)
    data = base64.b64encode(png.read_bytes()).decode()
    rows = [[f'<a href="runs/{esc(s)}/index.html">{esc(r.label)}</a>'] + [esc(c) for c in _row_cells(r)[1:]]
            for r, s in zip(runs, slugs)]
    body = ("<h1>Evaluation report</h1>" + viewer.table(_COLUMNS, rows, numeric=set(range(1, 9)))
            + f'<h2>Cost vs accuracy</h2><img class="plot" alt="cost vs accuracy" src="data:image/png;base64,{data}">')
    index = out / "index.html"
    index.write_text(viewer.page("Evaluation report", body))
    return index
