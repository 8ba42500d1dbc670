"""`opencomposer tool ...`: run one harness tool from the shell.

    opencomposer tool call --workspace DIR [--json] NAME 'JSON_ARGS'
    opencomposer tool list

`call` runs one tool against DIR in place, through the sandbox backend's in-place
workspace: file tools edit DIR itself (confined to it), run_terminal_cmd runs in the
sandbox with DIR mounted read-write at /workspace. `--json` prints one object
`{"ok", "output", "error"}` and exits 0 whatever the tool said; without it the output goes
to stdout, or the error to stderr with exit 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False)


@app.command("call")
def call(
    name: str = typer.Argument(..., metavar="NAME", help="Tool name (see `opencomposer tool list`)."),
    json_args: str = typer.Argument("{}", metavar="JSON_ARGS", help="The tool's arguments as a JSON object."),
    workspace: Path = typer.Option(..., "--workspace", exists=True, file_okay=False, resolve_path=True,
                                   metavar="DIR", help="Directory the tool works on, in place."),
    as_json: bool = typer.Option(False, "--json", help="Print {ok, output, error} as one JSON object."),
    backend: str = typer.Option("bwrap", "--backend", help="Sandbox backend for run_terminal_cmd."),
) -> None:
    """Run one harness tool against DIR in place."""
    from opencomposer.harness.tools import ToolBox
    from opencomposer.sandbox import get_backend

    with get_backend(backend).workspace_in_place(workspace) as ws:
        result = ToolBox(ws).call(name, json_args)
    if as_json:
        print(json.dumps({"ok": result.ok, "output": result.output, "error": result.error}))
        return
    if result.output:
        print(result.output)
    if not result.ok:
        print(f"error ({result.stats.error_kind}): {result.error}", file=sys.stderr)
        raise typer.Exit(1)


@app.command("list")
def list_tools() -> None:
    """Print the tools' OpenAI function-calling schemas as JSON."""
    from opencomposer.harness.tools import TOOLS

    print(json.dumps([t.schema() for t in TOOLS.values()], indent=2))
