"""Placeholder: filled in by the part's owner."""

import typer

app = typer.Typer(no_args_is_help=True)
