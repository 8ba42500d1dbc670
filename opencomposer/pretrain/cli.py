"""`opencomposer pretrain --config FILE [--resume] [--run-dir DIR]`: one pretraining run.

Single process: `opencomposer pretrain --config configs/pretrain/tiny.yaml`. Distributed:
`torchrun --nproc_per_node N -m opencomposer.cli pretrain --config FILE` (each rank runs this
command; train.py joins the process group). docs/pretrain.md describes the configs.
"""

from __future__ import annotations

from pathlib import Path

import typer


def pretrain(
    config: Path = typer.Option(..., "--config", help="A pretraining YAML (configs/pretrain/*.yaml)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in run_dir."),
    run_dir: str = typer.Option(None, "--run-dir", help="Override the config's run_dir."),
) -> None:
    """Continued pretraining with MTP and context extension (checkpoints, metrics, resume)."""
    from opencomposer.errors import OpenComposerError
    from opencomposer.pretrain.config import load_config
    from opencomposer.pretrain.train import train

    try:
        cfg = load_config(config, {"run_dir": run_dir} if run_dir else None)
        train(cfg, resume=resume)
    except OpenComposerError as exc:
        typer.echo(f"pretrain: {exc}", err=True)
        raise typer.Exit(1)


def sft(
    config: Path = typer.Option(..., "--config", help="An SFT YAML (configs/sft/*.yaml)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in run_dir."),
    run_dir: str = typer.Option(None, "--run-dir", help="Override the config's run_dir."),
    init_from: str = typer.Option(None, "--init-from", help="Override the checkpoint to fine-tune."),
) -> None:
    """SFT on oracle trajectories collected through the harness (or given JSONL files); writes run_dir/model."""
    from opencomposer.errors import OpenComposerError
    from opencomposer.pretrain.sft import load_config, train_sft

    overrides = {k: v for k, v in {"run_dir": run_dir, "init_from": init_from}.items() if v}
    try:
        train_sft(load_config(config, overrides), resume=resume)
    except OpenComposerError as exc:
        typer.echo(f"sft: {exc}", err=True)
        raise typer.Exit(1)
