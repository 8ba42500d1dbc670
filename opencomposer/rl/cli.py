"""`opencomposer rl`: one RL run from one YAML file.

    opencomposer rl --config configs/rl/single_turn_tiny.yaml [--resume] [--set train.lr=1e-4 ...]

Writes <run.out_dir>/config.yaml (the resolved config), metrics.jsonl, tb/ (TensorBoard) and
checkpoints/step_N. `--resume` continues from the latest checkpoint there; without it a run
directory that already holds checkpoints is refused, so a finished run is never overwritten.
A bad config stops before anything starts, with the field named; exit status 2.

Which function runs a config is decided here, once: RUNNERS maps (mode, runner) to it
(single_turn.py, orchestrator.py for the local agentic runner, ray_runner.py); `run_rl` is
that choice for Python callers (the demo pipeline), so no mode imports another's runner.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Callable

import typer

from opencomposer.errors import OpenComposerError

# (mode, runner) -> the function that runs it, as "module:function": imported on use, so a
# single-turn or local run never imports Ray. Each takes (cfg, *, resume, on_step).
RUNNERS = {
    ("single_turn", "local"): "opencomposer.rl.single_turn:run_single_turn",
    ("agentic", "local"): "opencomposer.rl.orchestrator:run_agentic",
    ("agentic", "ray"): "opencomposer.rl.ray_runner:run_ray",
}


def runner_for(cfg) -> Callable[..., dict]:
    """The run function for cfg's mode and runner (agentic.runner; single-turn runs are local)."""
    runner = cfg.agentic.runner if cfg.mode == "agentic" else "local"
    module, _, name = RUNNERS[cfg.mode, runner].partition(":")
    return getattr(importlib.import_module(module), name)


def run_rl(cfg, *, resume: bool = False, on_step: Callable[[int, dict], None] | None = None) -> dict:
    """Run one RL config to the end with the function RUNNERS names for it; returns its summary."""
    return runner_for(cfg)(cfg, resume=resume, on_step=on_step)


def rl(
    config: Path = typer.Option(..., "--config", exists=True, dir_okay=False, help="RL config YAML."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the latest checkpoint in run.out_dir."),
    overrides: list[str] = typer.Option([], "--set", help="Override a field: --set train.lr=1e-4 (repeatable)."),
) -> None:
    """Train with RL (single-turn: prompts + reward functions; agentic: tasks in sandboxes, async)."""
    from rich.console import Console

    from opencomposer.config import load_rl_config

    console = Console(stderr=True)
    try:
        cfg = load_rl_config(config, overrides)
    except OpenComposerError as e:
        console.print(f"[red]error:[/red] {e}", markup=True, highlight=False)
        raise typer.Exit(2)
    try:
        summary = run_rl(cfg, resume=resume)
    except OpenComposerError as e:
        console.print(f"[red]error:[/red] {e}", markup=True, highlight=False)
        raise typer.Exit(2)
    summary["trained"] = len(summary["trained"])
    print(json.dumps(summary))
