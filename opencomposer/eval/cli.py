"""`opencomposer eval` and `opencomposer report` (registered on the top-level app in cli.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import List, Optional

import typer

from opencomposer.errors import OpenComposerError


def eval_command(
    config: Optional[Path] = typer.Option(None, "--config", help="An eval YAML (EvalConfig: suite, policy, run.out_dir, ...)."),
    overrides: List[str] = typer.Option([], "--set", help="Override a field: --set passes=4 (repeatable)."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved config and exit."),
    suite: Optional[Path] = typer.Option(None, "--suite", help="Suite directory (with suite.toml)."),
    policy: Optional[str] = typer.Option(None, "--policy", help="oracle | oracle:tests | noop | openai:MODEL@BASE_URL | "
                                                                "sglang:BASE_URL | vllm:MODEL@BASE_URL | vllm:CKPT_DIR | engine:CKPT_DIR"),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory, run.out_dir (rerun with the same one to resume)."),
    passes: Optional[int] = typer.Option(None, "--passes", min=1, help="Episodes per task (default 1)."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", min=1, help="Episodes run at once (default 1)."),
    task_timeout: Optional[float] = typer.Option(None, "--task-timeout", help="Seconds per episode (default 1800; "
                                                                               "the diff is still graded)."),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="Comma-separated globs of task ids (default: all)."),
    label: Optional[str] = typer.Option(None, "--label", help="Name of the run in reports (default: the policy spec)."),
    input_price: Optional[float] = typer.Option(None, "--input-price", help="USD per million input tokens."),
    output_price: Optional[float] = typer.Option(None, "--output-price", help="USD per million output tokens."),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env",
                                              help="Variable holding the API key of openai: endpoints ('' for none)."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="Tokenizer dir for sglang:/vllm:/engine: specs."),
    agent_config: Optional[Path] = typer.Option(None, "--agent-config", help="YAML file of AgentConfig fields."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
) -> None:
    """Run a policy on a suite and grade every episode; writes results and trajectories to --out (run.out_dir).

    The flags are shorthands for the config's fields (a flag given wins over --config; --set over both)."""
    from rich.console import Console

    from opencomposer.config import dump_config, load_config, read_yaml
    from opencomposer.eval.run import EvalConfig, evaluate

    flags = {"suite": suite and str(suite), "policy": policy, "passes": passes, "concurrency": concurrency,
             "task_timeout_s": task_timeout, "tasks": tasks.split(",") if tasks else None, "label": label,
             "input_price_per_m": input_price, "output_price_per_m": output_price,
             "api_key_env": api_key_env, "tokenizer": tokenizer and str(tokenizer)}
    try:
        data = {k: v for k, v in flags.items() if v is not None}
        if data.get("api_key_env") == "":  # '' on the command line: no key
            data["api_key_env"] = None
        if agent_config:
            data["agent"] = read_yaml(agent_config)
        if out:
            data["run"] = {"out_dir": str(out)}
        cfg = load_config(EvalConfig, config, overrides, data, resolve_paths=_resolve_paths)
        if print_config:
            typer.echo(dump_config(cfg), nl=False)
            return
        out_dir = Path(cfg.run.out_dir)
        result = asyncio.run(evaluate(cfg.options(), out_dir, progress=progress))
    except (OpenComposerError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    s = result["summary"]
    pk = ", ".join(f"pass@{k} {v:.3f}" for k, v in s["pass_at_k"].items())
    Console().print(f"{result['label']} on {result['suite_name']}: accuracy {s['accuracy']:.3f} "
                    f"({s['episodes']} episodes, {s['errors']} errors; {pk}); median cost/task "
                    f"${s['median_cost_usd']:.4f}, median completion tokens/task {s['median_completion_tokens']:.0f}"
                    f"\nresults: {out_dir / 'results.json'}")


def _resolve_paths(raw: dict, base: Path) -> None:
    """The suite and tokenizer of a config file are relative to its directory."""
    from opencomposer.config import resolve_relative

    resolve_relative(raw, base, ("suite", "tokenizer"))


def report_command(
    run_dirs: List[Path] = typer.Argument(..., help="Run directories written by `opencomposer eval`."),
    out: Path = typer.Option(Path("report"), "--out", help="Where to write index.html, pareto.png and the viewer."),
) -> None:
    """Accuracy, pass@k, cost, the cost-vs-accuracy Pareto plot and the trajectory viewer for runs."""
    from opencomposer.eval.report import write_report

    try:
        index = write_report(run_dirs, out)
    except OpenComposerError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    typer.echo((out / "report.md").read_text())
    typer.echo(f"report: {index}\nplot: {out / 'pareto.png'}")
