"""Issue 21: the full reward against correctness-only RL, from the same SFT checkpoints, over seeds.

    .venv/bin/python benchmarks/reward21_seeds.py [--seeds 0 1 2] [--out runs/reward21] [--jobs 2]
        [--set key=value ...] [--full key=value ...] [--json]

Per seed, one pipeline run (opencomposer/pipeline.py) up to the SFT evaluation in
<out>/seed<N>/base, on the efficiency mix (MIX below: half the tasks two-file, 2,400 SFT steps, a
demonstrator that writes the decoy fix on 40% of its demonstrations, batches its calls on half
(the choice to batch taught on a fifth of those), first reads the package's __init__.py on 70% and
re-reads the edited file on 70%), then two RL arms from copies of it: `correctness` (the demo's RL
defaults) and `full` (FULL: the length penalty on successes only, k1 KL to the SFT policy, the
tool-error terms, groups without a success zeroed), each through RL, the held-out evaluation and
the report. --jobs runs that many arms at once (each `opencomposer demo` in its own process; on 2
cores, 2 arms take about as long as one alone twice). A rerun resumes unfinished stages and
reuses finished ones.

Per arm the figures come from its report (pipeline_report.efficiency on the held-out episodes):
success after SFT and after RL, and over the solved episodes by task kind mean turns, tokens and
effort, parallel reads on two-file tasks (the share of the solved ones, and of all two-file tasks
the share solved with one), re-reads after the edit and surveys (reads of a file the fix does not
touch). The comparison per seed: the full arm's lift over SFT, its distance to correctness-only,
its turns per solved task against correctness-only's, and the effort it saved on easy against
hard tasks (the concavity claim: more saved on easy ones). Mean and sample std over the seeds; --json prints it all.

MIX and FULL are configs/demo/pipeline_full_reward.yaml (a test checks it) and change with it. Until
session 17 MIX's SFT ran 1,600 steps, so the earlier commands in docs/demo-design.md that set no
sft.steps ran 1,600. Besides, the commands from before 2026-12-07 (session 12) ran with MIX =
two-file rate 0.5, 7 turns, parallel_rate 0.05, verify_rate 0.5 and FULL = length_coef 1e-3 (every
rollout), kl_coef 1e-3, tool_error_coef 0.02, zero_failed_groups; those of sessions 12 and 13 with
today's MIX less the survey (survey_rate 0) and with verify_rate 0.5; their --set flags name what
they changed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIX = ["tasks.two_file_rate=0.5", "tasks.max_turns=7", "sft.steps=2400", "sft.decoy_rate=0.4", "sft.parallel_rate=0.5",
       "sft.parallel_choice_rate=0.2", "sft.verify_rate=0.7", "sft.survey_rate=0.7"]
FULL = ["rl.length_coef=1.5e-3", "rl.length_scope=correct", "rl.kl_coef=1e-3", "rl.tool_error_coef=0.02",
        "rl.zero_failed_groups=true"]
ARMS = ("correctness", "full")


def demo(out: Path, overrides: list[str], until: str | None, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "opencomposer.cli", "demo", "--set", f"run.out_dir={out}",
           *[x for o in overrides for x in ("--set", o)], *(["--until", until] if until else [])]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("a"), stderr=subprocess.STDOUT)


def wait(procs: list[tuple[str, subprocess.Popen]]) -> None:
    for name, p in procs:
        if p.wait() != 0:
            raise SystemExit(f"{name} failed (exit {p.returncode}); its log is next to its run directory")


def arm_figures(run: Path) -> dict:
    s = json.loads((run / "report" / "summary_demo.json").read_text())
    e = s["efficiency"]
    solved = {k: e[k]["easy"]["solved"] + e[k]["hard"]["solved"] for k in ("sft", "rl")}

    def turns(stage: str) -> float | None:  # over every solved episode, both kinds
        n = solved[stage]
        return sum((e[stage][k]["turns_per_solved"] or 0) * e[stage][k]["solved"] for k in ("easy", "hard")) / n \
            if n else None

    return {"sft_success": s["sft_success"], "rl_success": s["rl_success"], "lift_points": s["lift_points"],
            "turns_per_solved": {"sft": turns("sft"), "rl": turns("rl")}, "efficiency": e,
            "penalty_share": s["rl_penalty_share"], "rl_wall_s": s["stage_wall_s"].get("rl")}


def _parallel_solved(hard: dict) -> float | None:
    """Of every held-out two-file task, the share solved with a parallel read (the issue's bar read
    over all two-file tasks; `parallel_read` reads it over the solved ones)."""
    if not hard["episodes"]:
        return None
    return (hard["parallel_read_frac"] or 0.0) * hard["solved"] / hard["episodes"]  # the frac is None when none solved


def compare(a: dict, f: dict) -> dict:
    """The full arm (f) against correctness-only (a), from the same SFT checkpoint."""
    ta, tf = a["turns_per_solved"]["rl"], f["turns_per_solved"]["rl"]
    saved = {}
    for kind in ("easy", "hard"):
        ea, ef = a["efficiency"]["rl"][kind]["effort_per_solved"], f["efficiency"]["rl"][kind]["effort_per_solved"]
        saved[kind] = None if ea is None or ef is None else {"points": ea - ef, "share": (ea - ef) / ea}
    return {"full_lift_points": f["lift_points"], "full_minus_correctness_points": 100 * (f["rl_success"] - a["rl_success"]),
            "turns_reduction": None if not ta or tf is None else 1 - tf / ta,
            "parallel_read": {"sft": f["efficiency"]["sft"]["hard"]["parallel_read_frac"],
                              "correctness": a["efficiency"]["rl"]["hard"]["parallel_read_frac"],
                              "full": f["efficiency"]["rl"]["hard"]["parallel_read_frac"]},
            # the same read over every two-file task: solved, and with a parallel read
            "parallel_solved_of_two_file": {"sft": _parallel_solved(f["efficiency"]["sft"]["hard"]),
                                            "correctness": _parallel_solved(a["efficiency"]["rl"]["hard"]),
                                            "full": _parallel_solved(f["efficiency"]["rl"]["hard"])},
            "effort_saved": saved}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=Path("runs/reward21"))
    ap.add_argument("--jobs", type=int, default=2, help="Arms (or bases) run at once.")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="key=value for every run")
    ap.add_argument("--full", action="append", default=[], help="key=value for the full arm (after FULL)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = args.out.resolve()
    common = [*MIX, *args.overrides]
    jobs = []  # (name, dir, overrides, until)
    for seed in args.seeds:
        jobs.append((f"seed{seed}/base", out / f"seed{seed}" / "base", [*common, f"run.seed={seed}"], "eval_sft"))
    for batch in (jobs[i:i + args.jobs] for i in range(0, len(jobs), args.jobs)):
        for name, d, o, until in batch:
            d.parent.mkdir(parents=True, exist_ok=True)
        wait([(name, demo(d, o, until, d.parent / "base.log")) for name, d, o, until in batch])
    arms = []
    for seed in args.seeds:
        base = out / f"seed{seed}" / "base"
        for arm in ARMS:
            d = out / f"seed{seed}" / arm
            if not (d / "stages" / "eval_sft.json").is_file():  # a fresh copy of the SFT checkpoint and its eval
                shutil.rmtree(d, ignore_errors=True)
                shutil.copytree(base, d, symlinks=True)
                (d / "pipeline.yaml").unlink()
            extra = [*FULL, *args.full] if arm == "full" else []
            arms.append((f"seed{seed}/{arm}", d, [*common, f"run.seed={seed}", *extra]))
    for batch in (arms[i:i + args.jobs] for i in range(0, len(arms), args.jobs)):
        wait([(name, demo(d, o, None, d.parent / f"{d.name}.log")) for name, d, o in batch])

    runs = []
    for seed in args.seeds:
        figs = {arm: arm_figures(out / f"seed{seed}" / arm) for arm in ARMS}
        runs.append({"seed": seed, **figs, "compare": compare(figs["correctness"], figs["full"])})

    def stats(xs: list) -> dict | None:
        xs = [x for x in xs if x is not None]
        return {"mean": statistics.mean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
                "min": min(xs), "max": max(xs)} if xs else None

    c = [r["compare"] for r in runs]
    summary = {
        "correctness_lift_points": stats([r["correctness"]["lift_points"] for r in runs]),
        "full_lift_points": stats([x["full_lift_points"] for x in c]),
        "full_minus_correctness_points": stats([x["full_minus_correctness_points"] for x in c]),
        "turns_reduction": stats([x["turns_reduction"] for x in c]),
        **{f"parallel_read_{k}": stats([x["parallel_read"][k] for x in c]) for k in ("sft", "correctness", "full")},
        **{f"parallel_solved_of_two_file_{k}": stats([x["parallel_solved_of_two_file"][k] for x in c])
           for k in ("sft", "correctness", "full")},
        **{f"effort_saved_share_{k}": stats([(x["effort_saved"][k] or {}).get("share") for x in c])
           for k in ("easy", "hard")},
    }
    result = {"mix": MIX, "full": [*FULL, *args.full], "overrides": args.overrides, "runs": runs, "summary": summary}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    def fmt(v, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    for r in runs:
        a, f, x = r["correctness"], r["full"], r["compare"]
        pr = x["parallel_read"]
        print(f"seed {r['seed']}: SFT {a['sft_success']:.1%}; correctness-only {a['rl_success']:.1%} "
              f"({a['lift_points']:+.1f}); full {f['rl_success']:.1%} ({f['lift_points']:+.1f}); turns per solved "
              f"{fmt(a['turns_per_solved']['rl'], '.2f')} -> {fmt(f['turns_per_solved']['rl'], '.2f')}; parallel "
              f"reads (two-file, solved) SFT {fmt(pr['sft'], '.0%')}, correctness {fmt(pr['correctness'], '.0%')}, "
              f"full {fmt(pr['full'], '.0%')}; of all two-file tasks solved so "
              + ", ".join(fmt(x["parallel_solved_of_two_file"][k], ".0%") for k in ("sft", "correctness", "full")))
    for k, s in summary.items():
        if s:
            print(f"{k}: mean {s['mean']:.3f}, std {s['std']:.3f}, range {s['min']:.3f}..{s['max']:.3f}")


if __name__ == "__main__":
    main()
