"""`opencomposer rl`: one RL run from one YAML file.

    opencomposer rl --config configs/rl/single_turn_tiny.yaml [--resume] [--set train.optim.lr=1e-4 ...]

Writes <run.out_dir>/config.yaml (the resolved config), metrics.jsonl, tb/ (TensorBoard) and
checkpoints/step_N. `--resume` continues from the latest checkpoint there; without it a run
directory that already holds checkpoints is refused, so a finished run is never overwritten.
A bad config stops before anything starts, with the field named; exit status 2. `--print-config`
prints the resolved config (the defaults filled in, the fields the mode does not use left out)
and exits.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from opencomposer.errors import OpenComposerError
from opencomposer.rl.launch import run_rl


def rl(
    config: Path = typer.Option(..., "--config", exists=True, dir_okay=False, help="RL config YAML."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the latest checkpoint in run.out_dir."),
    overrides: list[str] = typer.Option([], "--set", help="Override a field: --set train.optim.lr=1e-4 (repeatable)."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved config and exit."),
) -> None:
    """Train with RL (single-turn: prompts + reward functions; agentic: tasks in sandboxes, async)."""
    from rich.console import Console
    from rich.markup import escape

    from opencomposer.config import dump_config
    from opencomposer.rl.config import load_rl_config

    console = Console(stderr=True)
    try:
        cfg = load_rl_config(config, overrides)
    except OpenComposerError as e:
        console.print("[red]error:[/red]", escape(str(e)), highlight=False)  # the message is no markup
        raise typer.Exit(2)
    if print_config:
        print(dump_config(cfg), end="")
        return
    try:
        summary = run_rl(cfg, resume=resume)
    except OpenComposerError as e:
        console.print("[red]error:[/red]", escape(str(e)), highlight=False)  # the message is no markup
        raise typer.Exit(2)
    summary["trained"] = len(summary["trained"])
    print(json.dumps(summary))
