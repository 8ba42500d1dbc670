"""The `opencomposer` command: one sub-command per part, `opencomposer <part> <verb>`.

Each part defines its own typer app next to its code; heavy imports (torch, ray) happen
inside the commands so that `opencomposer --help` stays fast.
"""

from __future__ import annotations

import typer

from opencomposer.engine.cli import serve
from opencomposer.eval.cli import eval_command, report_command
from opencomposer.harness.cli import app as tool_app
from opencomposer.model.cli import app as model_app
from opencomposer.pretrain.cli import pretrain, sft
from opencomposer.rl.cli import rl
from opencomposer.sandbox.cli import app as sandbox_app
from opencomposer.tasks.cli import app as tasks_app

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="opencomposer: train coding agents the way Composer 2 was trained.")
app.add_typer(sandbox_app, name="sandbox", help="Isolated copy-on-write workspaces.")
app.add_typer(tool_app, name="tool", help="The agent's IDE tools, one call at a time.")
app.add_typer(tasks_app, name="tasks", help="Task suites: build, grade, validate, export.")
app.add_typer(model_app, name="model", help="Checkpoints: a small random one with a real vocabulary and format.")
app.command("eval")(eval_command)
app.command("report")(report_command)
app.command("serve")(serve)
app.command("rl")(rl)
app.command("pretrain")(pretrain)
app.command("sft")(sft)


@app.command()
def demo(
    harness: bool = typer.Option(False, "--harness", help="The harness demo instead (8 sandbox forks, scripted tools)."),
    config: str = typer.Option(None, "--config", help="A pipeline YAML (configs/demo/pipeline.yaml); default: built in."),
    overrides: list[str] = typer.Option([], "--set", help="Override a field: --set rl.steps=8 (repeatable)."),
    until: str = typer.Option(None, "--until", help="Stop after this stage (tokenizer, pretrain, tasks, sft, "
                                                      "eval_sft, rl, eval_rl, report); a later run goes on."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved pipeline config and exit."),
) -> None:
    """`make demo`: tokenizer, pretraining, SFT, eval, async RL, eval, report (opencomposer/pipeline.py)."""
    if harness:
        from opencomposer.demo import main

        main()
        return
    from opencomposer.config import dump_config
    from opencomposer.errors import OpenComposerError
    from opencomposer.pipeline import load_config
    from opencomposer.pipeline import main as pipeline

    try:
        if print_config:
            typer.echo(dump_config(load_config(config, overrides)), nl=False)
            return
        pipeline(config, overrides, until=until)
    except OpenComposerError as exc:
        typer.echo(f"demo: {exc}", err=True)
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
