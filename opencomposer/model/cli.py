"""`opencomposer model new`: a small random checkpoint with a real vocabulary and chat format (model/new.py)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False)


@app.command("new")
def new(
    arch: str = typer.Option(..., "--arch", help="qwen3 (dense, Qwen3ForCausalLM) or qwen3_moe (Qwen3MoeForCausalLM)."),
    vocab: str = typer.Option(..., "--vocab", help="qwen (Qwen3's), deepseek (DeepSeek V4's) or bundled (opencomposer's 4k)."),
    chat_format: str = typer.Option(..., "--format", help="Chat format: opencomposer, qwen3 or qwen3_coder."),
    out: Path = typer.Option(..., "--out", help="Directory to write the checkpoint into."),
    config: Path = typer.Option(None, "--config", help="A YAML of ModelConfig keys over the small defaults."),
    overrides: list[str] = typer.Option([], "--set", help="Override a ModelConfig key: --set num_hidden_layers=4."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random weights."),
) -> None:
    """Write a small random checkpoint that transformers, vLLM and `opencomposer eval` load."""
    from opencomposer.errors import OpenComposerError
    from opencomposer.model.new import new_checkpoint

    try:
        summary = new_checkpoint(out, arch=arch, vocab=vocab, chat_format=chat_format, config_file=config,
                                 overrides=overrides, seed=seed)
    except OpenComposerError as exc:
        typer.echo(f"model new: {exc}", err=True)
        raise typer.Exit(1)
    typer.echo(json.dumps(summary))
