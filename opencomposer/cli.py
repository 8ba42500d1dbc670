"""The `opencomposer` command: one sub-command per part, `opencomposer <part> <verb>`.

Each part defines its own typer app next to its code; heavy imports (torch, ray) happen
inside the commands so that `opencomposer --help` stays fast.
"""

from __future__ import annotations

import typer

from opencomposer.engine.cli import serve
from opencomposer.eval.cli import eval_command, report_command
from opencomposer.harness.cli import app as tool_app
from opencomposer.pretrain.cli import pretrain, sft
from opencomposer.rl.cli import rl
from opencomposer.sandbox.cli import app as sandbox_app
from opencomposer.tasks.cli import app as tasks_app

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="opencomposer: train coding agents the way Composer 2 was trained.")
app.add_typer(sandbox_app, name="sandbox", help="Isolated copy-on-write workspaces.")
app.add_typer(tool_app, name="tool", help="The agent's IDE tools, one call at a time.")
app.add_typer(tasks_app, name="tasks", help="Task suites: build, grade, validate, export.")
app.command("eval")(eval_command)
app.command("report")(report_command)
app.command("serve")(serve)
app.command("rl")(rl)
app.command("pretrain")(pretrain)
app.command("sft")(sft)


@app.command()
def demo() -> None:
    """Run the main demo on embedded defaults (what `make demo` runs)."""
    from opencomposer.demo import main

    main()


if __name__ == "__main__":
    app()
