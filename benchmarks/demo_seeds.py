"""The demo pipeline over several seeds: held-out success before and after RL, mean and spread.

    .venv/bin/python benchmarks/demo_seeds.py [--seeds 0 1 2] [--out runs/demo-seeds] [--json] [--set key=value ...]

Each seed is one full `make demo` run (opencomposer/pipeline.py) in <out>/seed<N> (about 30
minutes each on a 2-core CPU; a rerun resumes unfinished seeds and reuses finished ones). The
seed changes the model's initialisation, the SFT order, RL's sampling and the training and
held-out task draws. Prints per seed the SFT and RL held-out success and the lift, then the
mean and sample standard deviation of each; --json prints the same as one JSON object.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opencomposer.pipeline import Pipeline, load_config  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="runs/demo-seeds")
    ap.add_argument("--config", default=None, help="A pipeline YAML (default: the built-in demo).")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="key.sub=value")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    runs = []
    for seed in args.seeds:
        cfg = load_config(args.config, [*args.overrides, f"run.seed={seed}", f"run.out_dir={Path(args.out) / f'seed{seed}'}"])
        console = Console(file=io.StringIO()) if args.json else Console(stderr=True)
        p = Pipeline(cfg, console)
        p.run()
        s = json.loads((p.paths["report"] / "summary_demo.json").read_text())
        runs.append({k: s[k] for k in ("seed", "sft_success", "rl_success", "lift_points", "total_wall_s")})

    def stats(key: str) -> dict:
        xs = [r[key] for r in runs]
        return {"mean": statistics.mean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
                "min": min(xs), "max": max(xs)}

    result = {"runs": runs, **{k: stats(k) for k in ("sft_success", "rl_success", "lift_points")}}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for r in runs:
        print(f"seed {r['seed']}: SFT {r['sft_success']:.1%} -> RL {r['rl_success']:.1%} "
              f"({r['lift_points']:+.1f} points), {r['total_wall_s']:.0f} s")
    for k in ("sft_success", "rl_success", "lift_points"):
        s = result[k]
        print(f"{k}: mean {s['mean']:.3f}, std {s['std']:.3f}, range {s['min']:.3f}..{s['max']:.3f}")


if __name__ == "__main__":
    main()
