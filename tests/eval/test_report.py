"""`opencomposer report`: metrics (pass@k, Pareto frontier), the plot and tables, and the
static viewer, which must show untrusted trajectory content as text (checked in Chromium)."""

import json
import re
import shutil
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opencomposer.cli import app
from opencomposer.eval.report import pareto_front, pass_at_k, summarize
from opencomposer.eval.results import RESULTS, RUN, TRAJECTORIES, Row
from opencomposer.harness.trajectory import Segment, Trajectory, write_jsonl

EVIL = "<script>document.title='PWNED'</script><img src=x onerror=\"document.title='PWNED-IMG'\">"


def test_pass_at_k_matches_the_closed_form():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(4, 0, 3) == 0.0 and pass_at_k(4, 2, 3) == 1.0  # fewer than k failures
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_pareto_front_keeps_undominated_runs_by_cost():
    points = [(1.0, 0.5), (2.0, 0.4), (0.5, 0.2), (3.0, 0.9), (1.0, 0.5)]
    assert pareto_front(points) == [2, 0, 4, 3]  # (2.0, 0.4) is beaten by (1.0, 0.5); equal points both stay


def _row(task, p, resolved, cost=0.0, tokens=100, status="done"):
    return asdict(Row(task, p, f"{task}__p{p}", status, resolved=resolved, reward=float(resolved), cost_usd=cost,
                      completion_tokens=tokens, stop_reason="final"))


def test_summarize_accuracy_per_pass_and_pass_at_k():
    rows = [_row("a", 0, True), _row("a", 1, False), _row("b", 0, False), _row("b", 1, False, status="error")]
    s = summarize(rows)
    assert s["accuracy"] == 0.25 and s["accuracy_per_pass"] == [0.5, 0.0] and s["errors"] == 1
    assert s["pass_at_k"] == {"1": 0.25, "2": 0.5}


def _trajectory(task, p, resolved, evil=False):
    content = EVIL if evil else "ok"
    seg = Segment(messages=[
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Fix {task}." + (" </pre>" + EVIL if evil else "")},
        {"role": "assistant", "content": "Reading.", "reasoning_content": "I should look" + (EVIL if evil else ""),
         "tool_calls": [{"id": "c0", "type": "function",
                         "function": {"name": "read_file", "arguments": json.dumps({"path": "evil.html"})}},
                        {"id": "c1", "type": "function", "function": {"name": "", "arguments": ""},
                         "error": "not valid JSON", "raw": "{" + content}]},
        {"role": "tool", "tool_call_id": "c0", "name": "read_file", "content": "TOOL-OUTPUT " + content},
        {"role": "tool", "tool_call_id": "c1", "name": "", "content": "Error: malformed tool call"},
        {"role": "assistant", "content": "Done " + content}])
    t = Trajectory(id=f"{task}__p{p}", task_id=task, policy="fake", instruction=f"Fix {task}.", segments=[seg],
                   stop_reason="final", final_message="Done " + content, reward=float(resolved),
                   patch="diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+" + content + "\n",
                   grade={"resolved": resolved, "f2p_passed": int(resolved), "f2p_total": 1, "p2p_passed": 0,
                          "p2p_total": 0, "tests": {"tests/test_x.py::test_x": "passed" if resolved else "failed"},
                          "reason": None, "log": content})
    t.counts.turns, t.counts.completion_tokens = 2, 100
    return t


def _make_run(path: Path, label: str, results: list[bool], cost: float, evil: bool = False) -> Path:
    path.mkdir(parents=True)
    (path / RUN).write_text(json.dumps({"label": label, "policy": "fake", "suite_name": "smoke", "suite_version": "1",
                                        "passes": 1}))
    rows = [_row(f"task{i}", 0, ok, cost=cost) for i, ok in enumerate(results)]
    (path / RESULTS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_jsonl([_trajectory(f"task{i}", 0, ok, evil and i == 0) for i, ok in enumerate(results)], path / TRAJECTORIES)
    return path


@pytest.fixture
def report(tmp_path):
    runs = [_make_run(tmp_path / "a", "cheap <model>", [True, False, False, False], 0.01, evil=True),
            _make_run(tmp_path / "b", "strong", [True, True, True, False], 0.10),
            _make_run(tmp_path / "c", "wasteful", [True, False, False, False], 0.20)]
    r = CliRunner().invoke(app, ["report", *map(str, runs), "--out", str(tmp_path / "report")])
    assert r.exit_code == 0, r.output
    return tmp_path / "report"


def test_report_writes_plot_tables_and_viewer(report):
    png = (report / "pareto.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    md = (report / "report.md").read_text()
    assert "| strong | 4 | 4 | 0 | 0.750 | @1 0.750 | $0.1000 |" in md
    summary = {s["label"]: s for s in json.loads((report / "summary.json").read_text())}
    assert summary["cheap <model>"]["accuracy"] == 0.25 and summary["wasteful"]["median_cost_usd"] == 0.2
    index = (report / "index.html").read_text()
    assert "cheap &lt;model&gt;" in index and "data:image/png;base64," in index
    run_index = (report / "runs" / "strong" / "index.html").read_text()
    assert run_index.count('href="t/task') == 4
    page = (report / "runs" / "strong" / "t" / "task0__p0.html").read_text()
    assert "TOOL-OUTPUT ok" in page and "<details>" in page and "resolved" in page
    assert "<script>document.title" not in (report / "runs" / "cheap-model" / "t" / "task0__p0.html").read_text()


def test_pareto_frontier_across_runs_excludes_dominated_runs(report):
    from opencomposer.eval.report import Run, _cost_axis

    runs = [Run(report.parent / d) for d in "abc"]
    _, xs = _cost_axis(runs)
    ys = [r.summary["accuracy"] for r in runs]
    assert [runs[i].label for i in pareto_front(list(zip(xs, ys)))] == ["cheap <model>", "strong"]


def _chromium_dom(html_file: Path, tmp_path: Path) -> str:
    exe = shutil.which("chromium")
    assert exe, "chromium is not installed: run `make setup` (it installs Debian's chromium)"
    proc = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'chromium'}", "--dump-dom", html_file.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_viewer_in_headless_chromium_shows_untrusted_content_as_text(report, tmp_path):
    dom = _chromium_dom(report / "runs" / "cheap-model" / "t" / "task0__p0.html", tmp_path)
    assert 'data-viewer="ready"' in dom  # the viewer's own script ran: scripts do run in this browser
    title = re.search(r"<title>(.*?)</title>", dom, re.S).group(1)
    assert title == "task0__p0: trajectory"  # no script from the data ran (it would set the title)
    assert "PWNED" not in title
    # the payload is on the page, as text, in the tool output, thinking, final message, patch and log
    shown = dom.count("&lt;script&gt;document.title='PWNED'&lt;/script&gt;")
    assert shown >= 6
    assert "<script>document.title" not in dom and '<img src="x"' not in dom
    assert dom.count("<script>") == 1  # only the viewer's
    assert "TOOL-OUTPUT &lt;script&gt;" in dom and "malformed tool call" in dom


def test_report_refuses_a_directory_that_is_not_a_run(tmp_path):
    r = CliRunner().invoke(app, ["report", str(tmp_path), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and "not an evaluation run" in r.output
