"""`opencomposer sandbox ...`: run one command in a fresh sandbox, clean up after crashes.

    opencomposer sandbox exec --workspace DIR [--timeout S] [--memory-mb N] [--pids N]
                              [--network] [--json] [--backend bwrap|gvisor] -- CMD [ARG...]

runs CMD in a fresh sandbox over a copy-on-write view of DIR (DIR itself is never
modified: it is the read-only lowest layer, writes go to a throwaway upper dir). With
`--json` it prints one object: exit_code (int or null), stdout, stderr, timed_out,
oom_killed, duration_s. Without it, the command's stdout/stderr pass through and the exit
status is the command's (124 on timeout, 137 when out of memory, 125 when the sandbox
itself could not be set up). A failure to clean up after the command is a warning on
stderr. SIGTERM, SIGHUP or SIGINT to this process kill the sandbox and clean up before it
exits (with 128 + the signal's number).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from opencomposer.errors import OpenComposerError
from opencomposer.sandbox.base import Limits

app = typer.Typer(no_args_is_help=True, add_completion=False)

EXIT_TIMEOUT, EXIT_OOM, EXIT_SETUP = 124, 137, 125
_DEFAULTS = Limits()


@app.command("exec", context_settings={"allow_interspersed_args": False})
def exec_(
    cmd: List[str] = typer.Argument(..., help="The command and its arguments (after `--`)."),
    workspace: Path = typer.Option(..., "--workspace", help="Host directory; seen copy-on-write at /workspace."),
    timeout: float = typer.Option(_DEFAULTS.timeout_s, "--timeout", help="Wall-clock limit in seconds."),
    memory_mb: int = typer.Option(_DEFAULTS.memory_mb, "--memory-mb", help="Memory limit for the whole tree."),
    pids: int = typer.Option(_DEFAULTS.pids, "--pids", help="Maximum number of processes."),
    network: bool = typer.Option(False, "--network", help="Share the host network (for installs)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of passing output through."),
    backend: str = typer.Option("bwrap", "--backend", help="bwrap (default) or gvisor."),
    cwd: str = typer.Option(".", "--cwd", help="Working directory, relative to /workspace."),
) -> None:
    """Run CMD in a fresh sandbox over a copy-on-write view of DIR (DIR is never modified)."""
    from opencomposer.sandbox import get_backend

    limits = Limits(timeout_s=timeout, memory_mb=memory_mb, pids=pids, network=network)
    try:
        ws = get_backend(backend).image_from_dir(workspace).workspace()
        try:
            result = ws.exec(cmd, limits=limits, cwd=cwd)
        finally:
            _close(ws)
    except OpenComposerError as e:
        typer.echo(f"sandbox: {e}", err=True)
        raise typer.Exit(EXIT_SETUP)
    if as_json:
        out = {k: result.to_json()[k] for k in ("exit_code", "stdout", "stderr", "timed_out", "oom_killed",
                                               "duration_s")}
        typer.echo(json.dumps(out))
        return
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.timed_out:
        typer.echo(f"sandbox: timed out after {timeout:g} s", err=True)
        raise typer.Exit(EXIT_TIMEOUT)
    if result.oom_killed:
        typer.echo(f"sandbox: out of memory (limit {memory_mb} MB)", err=True)
        raise typer.Exit(EXIT_OOM)
    raise typer.Exit(result.exit_code or 0)


def _close(ws) -> None:
    """Close the workspace; if that fails the command still ran, so its result is still printed."""
    try:
        ws.close()
    except OpenComposerError as e:
        typer.echo(f"sandbox: warning: cleanup failed, `opencomposer sandbox gc` will retry: {e}", err=True)


@app.command("gc")
def gc_(
    store: Optional[Path] = typer.Option(None, "--store", help="Layer store (default: $OPENCOMPOSER_SANDBOX_DIR "
                                                             "or /var/tmp/opencomposer/sandbox)."),
    everything: bool = typer.Option(False, "--all", help="Remove every entry, not only dead processes' "
                                                         "(only when no sandbox is running)."),
) -> None:
    """Remove mounts, dirs, layers and cgroups left behind by crashed processes."""
    from opencomposer.sandbox.layers import gc

    removed = gc(store, everything=everything)
    typer.echo(json.dumps({k: len(v) for k, v in removed.items()}))
