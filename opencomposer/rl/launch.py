"""Which function runs an RL config, decided once: (mode, runner) -> run function.

single_turn.py runs single-turn configs, orchestrator.py the local agentic runner, ray_runner.py
the Ray one. `run_rl` is that choice for every caller (the `opencomposer rl` command, the demo
pipeline), so no mode imports another's runner. Each run function is imported when chosen,
so a single-turn or local run never imports Ray.
"""

from __future__ import annotations

from typing import Callable

RunFn = Callable[..., dict]  # (cfg, *, resume, on_step) -> the run's summary


def _single_turn() -> RunFn:
    from opencomposer.rl.single_turn import run_single_turn

    return run_single_turn


def _agentic_local() -> RunFn:
    from opencomposer.rl.orchestrator import run_agentic

    return run_agentic


def _agentic_ray() -> RunFn:
    from opencomposer.rl.ray_runner import run_ray

    return run_ray


RUNNERS: dict[tuple[str, str], Callable[[], RunFn]] = {
    ("single_turn", "local"): _single_turn,
    ("agentic", "local"): _agentic_local,
    ("agentic", "ray"): _agentic_ray,
}


def runner_for(cfg) -> RunFn:
    """The run function for cfg's mode and runner (agentic.runner; single-turn runs are local)."""
    runner = cfg.agentic.runner if cfg.mode == "agentic" else "local"
    return RUNNERS[cfg.mode, runner]()


def run_rl(cfg, *, resume: bool = False, on_step: Callable[[int, dict], None] | None = None) -> dict:
    """Run one RL config to the end with the function RUNNERS names for it; returns its summary."""
    return runner_for(cfg)(cfg, resume=resume, on_step=on_step)
