"""`make demo`: the harness demo (until the RL pipeline exists, this is the project's main job).

It builds a sandbox image from a real project's source on this machine (the Python standard
library's `json` package, from the interpreter's own lib directory), forks it 8 times, runs a
scripted sequence of the agent's tool calls in every fork concurrently (explore with
list_dir, grep and codebase_search, read, plan with todo, edit, write a test, run it in the
sandbox's terminal), and prints the 8 diffs: each fork adds a different small feature, and
the base image is untouched.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.syntax import Syntax

from opencomposer.harness.tools import ToolBox, ToolCall, ToolResult
from opencomposer.sandbox import Workspace, get_backend

ANCHOR = "def dumps(obj, *, skipkeys=False, ensure_ascii=True, check_circular=True,"


@dataclass(frozen=True)
class Feature:
    """One fork's scripted change: a helper function added to json/__init__.py and its check."""

    name: str
    body: str
    check: str  # a Python expression that must print True


FEATURES = [
    Feature("dumps_sorted", "return dumps(obj, sort_keys=True, **kw)",
            "json.dumps_sorted({'b': 1, 'a': 2}) == '{\"a\": 2, \"b\": 1}'"),
    Feature("dumps_compact", "return dumps(obj, separators=(',', ':'), **kw)",
            "json.dumps_compact([1, {'a': 2}]) == '[1,{\"a\":2}]'"),
    Feature("dumps_pretty", "return dumps(obj, indent=2, sort_keys=True, **kw)",
            "json.dumps_pretty({'a': [1]}) == '{\\n  \"a\": [\\n    1\\n  ]\\n}'"),
    Feature("loads_lines", "return [loads(line, **kw) for line in obj.splitlines() if line.strip()]",
            "json.loads_lines('1\\n\\n[2]\\n') == [1, [2]]"),
    Feature("dumps_lines", "return ''.join(dumps(o, **kw) + '\\n' for o in obj)",
            "json.dumps_lines([1, 'x']) == '1\\n\"x\"\\n'"),
    Feature("roundtrip", "return loads(dumps(obj, **kw))",
            "json.roundtrip({'a': (1, 2)}) == {'a': [1, 2]}"),
    Feature("is_json", "try:\n        loads(obj, **kw)\n    except ValueError:\n        return False\n    return True",
            "json.is_json('[1, 2]') and not json.is_json('[1,')"),
    Feature("dumps_ascii", "return dumps(obj, ensure_ascii=True, **kw)",
            "json.dumps_ascii('\u00e9') == '\"\\\\u00e9\"'"),
]


def source_project(dest: Path) -> Path:
    """A small real project: a copy of the running interpreter's stdlib `json` package."""
    src = Path(sysconfig.get_paths()["stdlib"]) / "json"
    shutil.copytree(src, dest / "json", ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "README.md").write_text("The Python standard library's json package, as a demo project.\n")
    return dest


def script(feature: Feature) -> list[list[ToolCall]]:
    """The tool calls of one fork, turn by turn (calls of one turn run in parallel)."""
    new_fn = f"def {feature.name}(obj, **kw):\n    \"\"\"Demo helper added by a forked agent.\"\"\"\n    {feature.body}\n\n\n"
    test = f"import json\nprint({feature.check})\n"
    call = lambda i, name, **args: ToolCall(f"{feature.name}-{i}", name, json.dumps(args))  # noqa: E731
    return [
        [call(0, "list_dir", path="."), call(1, "grep", pattern=r"^def dumps\(", path="json"),
         call(2, "codebase_search", query="serialize a Python object to a JSON formatted string", top_k=3)],
        [call(3, "read_file", path="json/__init__.py", start_line=180, end_line=200),
         call(4, "todo", action="add", items=[f"add json.{feature.name}", "test it in the sandbox"])],
        [call(5, "edit_file", path="json/__init__.py", old_string=ANCHOR, new_string=new_fn + ANCHOR),
         call(6, "write_file", path=f"tests/test_{feature.name}.py", content=test)],
        [call(7, "run_terminal_cmd", command=f"PYTHONPATH=. python3 tests/test_{feature.name}.py", timeout_s=30)],
        [call(8, "todo", action="complete", id=1), call(9, "todo", action="complete", id=2)],
    ]


async def run_fork(ws: Workspace, feature: Feature, on_turn) -> list[ToolResult]:
    box = ToolBox(ws)
    results: list[ToolResult] = []
    for turn in script(feature):
        results += await box.run_many(turn)
        on_turn()
    return results


async def run_all(forks: list[Workspace], progress: Progress) -> list[list[ToolResult]]:
    n_turns = len(script(FEATURES[0]))
    task = progress.add_task("tool calls in 8 forks", total=len(forks) * n_turns)
    return await asyncio.gather(*(run_fork(ws, f, lambda: progress.advance(task))
                                  for ws, f in zip(forks, FEATURES)))


def main(console: Console | None = None) -> dict[str, tuple[bool, str]]:
    """Run the demo; returns {feature: (its test passed in the sandbox, its diff)}."""
    console = console or Console()
    outcomes: dict[str, tuple[bool, str]] = {}
    backend = get_backend("bwrap")
    with tempfile.TemporaryDirectory(prefix="oc-demo-") as tmp:
        project = source_project(Path(tmp) / "project")
        n_files = sum(1 for p in project.rglob("*") if p.is_file())
        console.print(f"[bold]opencomposer harness demo[/]: image from {project.name} "
                      f"({n_files} files of the stdlib json package), 8 forks, {len(script(FEATURES[0]))} turns each")
        base = backend.image_from_dir(project).workspace()
        t0 = time.perf_counter()
        forks = base.fork(len(FEATURES))
        fork_ms = (time.perf_counter() - t0) * 1e3
        try:
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), console=console) as progress:
                results = asyncio.run(run_all(forks, progress))
            for ws, feature, res in zip(forks, FEATURES, results):
                term = next(r for r in res if r.name == "run_terminal_cmd")
                failed = [r for r in res if not r.ok]
                passed = term.ok and "True" in term.output
                verdict = "[green]test passed[/]" if passed else "[red]test failed[/]"
                diff = ws.diff()
                outcomes[feature.name] = (passed, diff)
                console.rule(f"fork {feature.name}: {len(res)} tool calls, {len(failed)} errors, {verdict}")
                for r in failed:
                    console.print(f"[red]{r.name}: {r.error}[/]")
                console.print(Syntax(diff, "diff", theme="ansi_dark", word_wrap=True))
            console.print(f"forked 8 workspaces in {fork_ms:.1f} ms; base image unchanged: "
                          f"{not base.diff()}")
        finally:
            for ws in forks:
                ws.close()
            base.close()
    return outcomes


if __name__ == "__main__":
    main()
