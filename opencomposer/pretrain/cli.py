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

import typer


def pretrain(
    config: Path = typer.Option(..., "--config", help="A pretraining YAML (configs/pretrain/*.yaml)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in run.out_dir."),
    overrides: list[str] = typer.Option([], "--set", help="Override a field: --set run.out_dir=runs/x (repeatable)."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved config and exit."),
) -> None:
    """Continued pretraining with MTP and context extension (checkpoints, metrics, resume)."""
    from opencomposer.config import dump_config
    from opencomposer.errors import OpenComposerError
    from opencomposer.pretrain.config import load_config

    try:
        cfg = load_config(config, overrides)
        if print_config:
            typer.echo(dump_config(cfg), nl=False)
            return
        from opencomposer.pretrain.train import train

        train(cfg, resume=resume)
    except OpenComposerError as exc:
        typer.echo(f"pretrain: {exc}", err=True)
        raise typer.Exit(1)


def sft(
    config: Path = typer.Option(..., "--config", help="An SFT YAML (configs/sft/*.yaml)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in run.out_dir."),
    overrides: list[str] = typer.Option([], "--set", help="Override a field: --set init_from=runs/p/model (repeatable)."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved config and exit."),
) -> None:
    """SFT on oracle trajectories collected through the harness (or given JSONL files); writes run.out_dir/model."""
    from opencomposer.config import dump_config
    from opencomposer.errors import OpenComposerError
    from opencomposer.pretrain.sft import load_config, train_sft

    try:
        cfg = load_config(config, overrides)
        if print_config:
            typer.echo(dump_config(cfg), nl=False)
            return
        train_sft(cfg, resume=resume)
    except OpenComposerError as exc:
        typer.echo(f"sft: {exc}", err=True)
        raise typer.Exit(1)
