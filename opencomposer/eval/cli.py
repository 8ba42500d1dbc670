"""`opencomposer eval` and `opencomposer report` (registered on the top-level app in cli.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import List, Optional

import typer

from opencomposer.errors import OpenComposerError


def eval_command(
    suite: Path = typer.Option(..., "--suite", help="Suite directory (with suite.toml)."),
    policy: str = typer.Option(..., "--policy", help="oracle | oracle:tests | noop | openai:MODEL@BASE_URL | "
                                                     "sglang:BASE_URL | vllm:MODEL@BASE_URL | engine:CKPT_DIR"),
    out: Path = typer.Option(..., "--out", help="Run directory (rerun with the same one to resume)."),
    passes: int = typer.Option(1, "--passes", min=1, help="Episodes per task."),
    concurrency: int = typer.Option(1, "--concurrency", min=1, help="Episodes run at once."),
    task_timeout: float = typer.Option(1800.0, "--task-timeout", help="Seconds per episode (the diff is still graded)."),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="Comma-separated globs of task ids (default: all)."),
    label: str = typer.Option("", "--label", help="Name of the run in reports (default: the policy spec)."),
    input_price: float = typer.Option(0.0, "--input-price", help="USD per million input tokens."),
    output_price: float = typer.Option(0.0, "--output-price", help="USD per million output tokens."),
    api_key_env: str = typer.Option("OPENAI_API_KEY", "--api-key-env",
                                    help="Variable holding the API key of openai: endpoints ('' for none)."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="Tokenizer dir for sglang:/vllm:/engine: specs."),
    agent_config: Optional[Path] = typer.Option(None, "--agent-config", help="YAML file of AgentConfig fields."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
) -> None:
    """Run a policy on a suite and grade every episode; writes results and trajectories to --out."""
    from rich.console import Console

    from opencomposer.eval.run import EvalOptions, evaluate
    from opencomposer.harness.agent import AgentConfig

    try:
        agent = AgentConfig()
        if agent_config:
            import yaml

            agent = AgentConfig.model_validate(yaml.safe_load(agent_config.read_text()) or {})
        options = EvalOptions(suite=str(suite), policy=policy, label=label, passes=passes, concurrency=concurrency,
                              task_timeout_s=task_timeout, tasks=tasks.split(",") if tasks else ["*"],
                              input_price_per_m=input_price, output_price_per_m=output_price,
                              api_key_env=api_key_env or None, tokenizer=str(tokenizer) if tokenizer else None,
                              agent=agent)
        result = asyncio.run(evaluate(options, out, progress=progress))
    except (OpenComposerError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    s = result["summary"]
    pk = ", ".join(f"pass@{k} {v:.3f}" for k, v in s["pass_at_k"].items())
    Console().print(f"{result['label']} on {result['suite_name']}: accuracy {s['accuracy']:.3f} "
                    f"({s['episodes']} episodes, {s['errors']} errors; {pk}); median cost/task "
                    f"${s['median_cost_usd']:.4f}, median completion tokens/task {s['median_completion_tokens']:.0f}"
                    f"\nresults: {out / 'results.json'}")


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
