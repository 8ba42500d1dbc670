"""`opencomposer pretrain` and `opencomposer sft`: one run each, from one YAML file.

    opencomposer pretrain --config configs/pretrain/tiny.yaml [--resume] [--set run.out_dir=DIR ...]
    opencomposer sft --config configs/sft/tiny.yaml [--resume] [--set init_from=DIR ...]

Single process, or distributed pretraining: `torchrun --nproc_per_node N -m opencomposer.cli
pretrain --config FILE` (each rank runs this command; train.py joins the process group).
`--print-config` prints the resolved config (every default filled in) and exits.
docs/pretrain.md describes the configs. A bad config stops before anything starts (exit 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import typer


def _run(command: str, load: Callable, train: Callable, config: Path, overrides: list[str], print_config: bool,
         resume: bool) -> None:
    """Load the config (or print it resolved), then train; a config or run error exits 1 with its message."""
    from opencomposer.config import dump_config
    from opencomposer.errors import OpenComposerError

    try:
        cfg = load(config, overrides)
        if print_config:
            typer.echo(dump_config(cfg), nl=False)
            return
        train()(cfg, resume=resume)
    except OpenComposerError as exc:
        typer.echo(f"{command}: {exc}", err=True)
        raise typer.Exit(1)


def pretrain(
    config: Path = typer.Option(..., "--config", help="A pretraining YAML (configs/pretrain/*.yaml)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in run.out_dir."),
    overrides: list[str] = typer.Option([], "--set", help="Override a field: --set run.out_dir=runs/x (repeatable)."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved config and exit."),
) -> None:
    """Continued pretraining with MTP and context extension (checkpoints, metrics, resume)."""
    from opencomposer.pretrain.config import load_config

    def train():  # imported only when training starts: --print-config stays fast
        from opencomposer.pretrain.train import train

        return train

    _run("pretrain", load_config, train, config, overrides, print_config, resume)


def sft(
    config: Path = typer.Option(..., "--config", help="An SFT YAML (configs/sft/*.yaml)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in run.out_dir."),
    overrides: list[str] = typer.Option([], "--set", help="Override a field: --set init_from=runs/p/model (repeatable)."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved config and exit."),
) -> None:
    """SFT on oracle trajectories collected through the harness (or given JSONL files); writes run.out_dir/model."""
    from opencomposer.pretrain.sft import load_config, train_sft

    _run("sft", load_config, lambda: train_sft, config, overrides, print_config, resume)
