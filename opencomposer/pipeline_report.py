"""The demo pipeline's report (stage 8 of opencomposer/pipeline.py).

Writes into `<out_dir>/report/`:

    learning_curve.png   RL: mean reward and the fraction of resolved rollouts per trainer step
    eval/index.html      eval/report.py over both evaluations: the table, the cost/accuracy
                         (Pareto) plot and the trajectory viewer of every held-out episode
    efficiency.png       turns per solved held-out task (easy / hard), and per RL step the length
                         penalty's share of the reward, turns per rollout and parallel reads
    README.md            what the task family is, the before/after held-out success, the stage
                         wall times and the settings that matter (index.html: the same, as HTML)
    summary_demo.json    the figures above, for scripts (benchmarks/demo_seeds.py)

Left out: confidence intervals (one seed per run; the seeds script reports the spread).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Protocol, Sequence


class DemoRun(Protocol):
    """What the report reads of a pipeline run (`pipeline.Pipeline` is one); the report is the
    pipeline's last stage, so it names the run's shape here instead of importing the pipeline."""

    STAGES: Sequence[str]
    cfg: Any  # pipeline.PipelineConfig
    out: Path
    paths: dict[str, Path]

    def record(self, name: str) -> dict | None: ...

    def model_dict(self) -> dict[str, Any]: ...

REWARD_KEYS = ("reward/total_mean", "reward/mean", "rewards/mean", "reward_mean")


def rl_curve(metrics_file: Path) -> tuple[list[int], list[float], list[float], str]:
    """(steps, mean reward, resolved fraction, reward key) from the RL run's metrics.jsonl."""
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    key = next((k for k in REWARD_KEYS if rows and k in rows[0]), None)
    if key is None:  # fall back to any mean reward the trainer logs
        key = next((k for k in (rows[0] if rows else {}) if k.startswith("reward") and "mean" in k), "")
    steps = [int(r.get("step", i + 1)) for i, r in enumerate(rows)]
    reward = [float(r.get(key, float("nan"))) for r in rows]
    resolved = [float(r.get("rollouts/resolved_frac", float("nan"))) for r in rows]
    return steps, reward, resolved, key


def plot_curve(steps: list[int], reward: list[float], resolved: list[float], key: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=120)
    ax.plot(steps, reward, marker="o", label=f"mean reward ({key})")
    ax.plot(steps, resolved, marker="s", linestyle="--", label="resolved rollouts (fraction)")
    ax.set_xlabel("RL trainer step")
    ax.set_ylabel("per step, over the step's rollouts")
    ax.set_title("RL on its own tasks (never the held-out ones)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def decoy_demonstrations(sft_dir: Path) -> int:
    """How many of SFT's demonstrations wrote the decoy fix (demo_family.demonstrator)."""
    from opencomposer.harness.trajectory import read_jsonl
    from opencomposer.pretrain.sft import TRAJECTORIES

    path = sft_dir / "sft_data" / TRAJECTORIES
    return sum(bool(t.meta.get("decoy")) for t in read_jsonl(path)) if path.is_file() else 0


def _added_lines(patch: str) -> list[str]:
    return sorted(x[1:].strip() for x in patch.splitlines() if x.startswith("+") and not x.startswith("+++"))


def outcomes(eval_dir: Path, suite: Path) -> dict[str, int]:
    """Held-out episodes as resolved / wrote the task's decoy fix / failed otherwise (a wrong path,
    a mis-copied old_string, no edit...): what RL changed, beyond the success rate."""
    from opencomposer.harness.trajectory import read_jsonl
    from opencomposer.tasks.demo_family import DECOY_PATCH

    out = {"resolved": 0, "decoy": 0, "other": 0}
    for t in read_jsonl(eval_dir / "trajectories.jsonl"):
        decoy = suite / t.task_id / DECOY_PATCH
        if t.reward and t.reward > 0:
            out["resolved"] += 1
        elif t.patch and decoy.is_file() and _added_lines(t.patch) == _added_lines(decoy.read_text()):
            out["decoy"] += 1
        else:
            out["other"] += 1
    return out


def _call_paths(t) -> dict[str, str]:
    """call id -> the `path` argument of each tool call the episode's messages hold (calls whose
    arguments do not parse, or name no path, are left out)."""
    out = {}
    for m in t.messages:
        for c in m.get("tool_calls") or []:
            try:
                path = json.loads(c["function"]["arguments"]).get("path")
            except (KeyError, TypeError, AttributeError, ValueError):
                continue
            if isinstance(path, str):
                out[c.get("id")] = path
    return out


def episode_shape(t, patched: set[str] | None = None) -> dict:
    """How an episode spent its turns: turns, generated tokens, effort x (rl.rewards.effort at the
    default weights), whether it read two of the task's patched files in one turn before its first
    edit (a parallel read), whether it read a file again after editing (a needless check) and
    whether it read, before its first edit, a file outside them (a needless survey, such as the
    package's __init__.py). `patched`: the files the task's gold patch modifies (suite_files);
    without it, the files the episode edited, which an episode that never edits lacks."""
    from opencomposer.rl.rewards import EffortWeights, RewardInputs, effort

    c = t.counts
    paths = _call_paths(t)
    edits = [r for r in t.tool_calls if r.name == "edit_file" and r.ok]
    if patched is None:
        patched = {paths.get(r.call_id) for r in edits} - {None}
    first_edit = min((r.turn for r in edits), default=None)
    before = [r for r in t.tool_calls if r.name == "read_file" and r.ok and (first_edit is None or r.turn < first_edit)]
    reads: dict[int, set[str]] = {}
    for r in before:
        if paths.get(r.call_id) in patched:
            reads.setdefault(r.turn, set()).add(paths[r.call_id])
    x = effort(RewardInputs(c.thinking_tokens, c.tool_call_tokens, c.tool_output_tokens, c.final_message_tokens,
                            c.tool_calls, c.turns, 0, 0, 0, False), EffortWeights())
    return {"turns": c.turns, "tokens": c.completion_tokens, "effort": x,
            "parallel_read": any(len(n) >= 2 for n in reads.values()),
            "verify": first_edit is not None and any(r.name == "read_file" and r.turn > first_edit
                                                     for r in t.tool_calls),
            "survey": bool(patched) and any(paths.get(r.call_id) not in patched for r in before)}


def suite_files(suite: Path) -> tuple[set[str], dict[str, set[str]]]:
    """From one load of the suite: the ids of its two-file (hard) tasks (demo_family.two_file), and
    task id -> the files its gold patch modifies."""
    from opencomposer.tasks.demo_family import two_file
    from opencomposer.tasks.policies import parse_patch
    from opencomposer.tasks.task import Suite

    tasks = Suite.load(suite).tasks
    return {t.id for t in tasks if two_file(t)}, {t.id: {fp.path for fp in parse_patch(t.gold_patch)} for t in tasks}


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def efficiency(eval_dir: Path, suite: Path) -> dict[str, dict]:
    """Held-out episodes by task kind (easy: one file; hard: two files, demo_family.two_file):
    success, and over the solved ones mean turns, tokens and effort, the share with a parallel
    read (two-file tasks), the share that read a file again after editing and the share that read
    a file the fix does not touch (issue 21; episode_shape against the gold patch's files)."""
    from opencomposer.harness.trajectory import read_jsonl

    hard, patched = suite_files(suite)
    by: dict[str, list[tuple[bool, dict]]] = {"easy": [], "hard": []}
    for t in read_jsonl(eval_dir / "trajectories.jsonl"):
        by["hard" if t.task_id in hard else "easy"].append((bool(t.reward and t.reward > 0),
                                                            episode_shape(t, patched.get(t.task_id))))
    out = {}
    for kind, eps in by.items():
        solved = [e for ok, e in eps if ok]
        out[kind] = {"episodes": len(eps), "solved": len(solved),
                     "success": len(solved) / len(eps) if eps else None,
                     "turns_per_solved": _mean([e["turns"] for e in solved]),
                     "tokens_per_solved": _mean([e["tokens"] for e in solved]),
                     "effort_per_solved": _mean([e["effort"] for e in solved]),
                     "parallel_read_frac": _mean([float(e["parallel_read"]) for e in solved]),
                     "verify_frac": _mean([float(e["verify"]) for e in solved]),
                     "survey_frac": _mean([float(e["survey"]) for e in solved])}
    return out


def rl_efficiency(rl_dir: Path, suite: Path) -> dict[str, list[float]]:
    """Per RL step, over its trained rollouts (rl/trajectories.jsonl): the length penalty's share of
    the reward (mean |length term| over the mean of every term's |value|), mean turns, the share
    of two-file rollouts with a parallel read, and the shares of rollouts with each needless habit
    (a survey, a re-read after the edit: episode_shape)."""
    from opencomposer.harness.trajectory import read_jsonl

    out: dict[str, list[float]] = {"step": [], "penalty_share": [], "turns": [], "parallel_read_frac": [],
                                   "survey_frac": [], "verify_frac": []}
    path = rl_dir / "trajectories.jsonl"
    if not path.is_file():
        return out
    hard, patched = suite_files(suite)
    steps: dict[int, list] = {}
    for t in read_jsonl(path):
        steps.setdefault(int(t.meta.get("step", 0)), []).append(t)
    for step in sorted(steps):
        ts = steps[step]
        rw = [t.meta.get("reward") or {} for t in ts]
        length = sum(abs(r.get("length_penalty", 0.0)) for r in rw)
        terms = sum(abs(r.get(k, 0.0)) for r in rw for k in ("correctness", "auxiliary", "length_penalty", "kl"))
        shapes = [(t.task_id in hard, episode_shape(t, patched.get(t.task_id))) for t in ts]
        two = [e["parallel_read"] for is_hard, e in shapes if is_hard]
        out["step"].append(step)
        out["penalty_share"].append(length / terms if terms else 0.0)
        out["turns"].append(sum(t.counts.turns for t in ts) / len(ts))
        out["parallel_read_frac"].append(sum(two) / len(two) if two else float("nan"))
        for habit in ("survey", "verify"):
            out[f"{habit}_frac"].append(sum(e[habit] for _, e in shapes) / len(shapes))
    return out


def plot_efficiency(eff: dict[str, dict], curve: dict[str, list[float]], path: Path) -> Path:
    """Three panels: turns per solved task (easy/hard, after SFT and after RL); the penalty's
    share of the reward per RL step; turns per rollout, parallel reads and the needless habits per
    RL step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(12, 3.6), dpi=110)
    kinds = ["easy", "hard"]
    for i, (stage, color) in enumerate((("sft", "tab:gray"), ("rl", "tab:blue"))):
        vals = [eff[stage][k]["turns_per_solved"] or 0.0 for k in kinds]
        a.bar([x + 0.38 * i for x in range(2)], vals, width=0.36, color=color, label=f"after {stage.upper()}")
    a.set_xticks([0.19, 1.19], ["easy (one file)", "hard (two files)"])
    a.set_ylabel("turns per solved held-out task")
    a.legend(fontsize=8)
    b.plot(curve["step"], curve["penalty_share"], marker=".")
    b.set_xlabel("RL step")
    b.set_ylabel("length penalty's share of |reward|")
    c.plot(curve["step"], curve["turns"], marker=".", label="turns per rollout")
    c.set_xlabel("RL step")
    c.set_ylabel("turns")
    c2 = c.twinx()
    c2.plot(curve["step"], curve["parallel_read_frac"], color="tab:orange", marker=".", label="parallel read (two-file)")
    if any(curve.get("survey_frac", [])):
        c2.plot(curve["step"], curve["survey_frac"], color="tab:green", marker=".", label="survey")
    if any(curve.get("verify_frac", [])):
        c2.plot(curve["step"], curve["verify_frac"], color="tab:red", marker=".", label="re-read")
    c2.set_ylim(0, 1)
    c2.set_ylabel("share of (two-file) rollouts")
    c.legend(loc="upper left", fontsize=8)
    c2.legend(loc="upper right", fontsize=8)
    for ax in (a, b, c):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_demo_report(p: DemoRun) -> dict:
    """Write the report (module docstring); returns the headline figures."""
    from opencomposer.eval.report import write_report

    out = p.paths["report"]
    out.mkdir(parents=True, exist_ok=True)
    steps, reward, resolved, key = rl_curve(p.paths["rl"] / "metrics.jsonl")
    plot_curve(steps, reward, resolved, key, out / "learning_curve.png")
    write_report([p.paths["eval_sft"], p.paths["eval_rl"]], out / "eval")
    rec = {n: p.record(n) or {} for n in p.STAGES}
    before, after = rec["eval_sft"]["accuracy"], rec["eval_rl"]["accuracy"]
    cfg = p.cfg
    summary = {
        "seed": cfg.run.seed, "sft_success": before, "rl_success": after, "lift_points": 100 * (after - before),
        "heldout_tasks": rec["tasks"]["heldout_tasks"], "train_tasks": rec["tasks"]["train_tasks"],
        "rl_tasks": rec["tasks"].get("rl_tasks"),
        "difficulty": cfg.tasks.difficulty, "eval_temperature": cfg.eval.temperature,
        "sft_decoy_demonstrations": decoy_demonstrations(p.paths["sft"]),
        "outcomes": {k: outcomes(p.paths[f"eval_{k}"], p.paths["heldout_suite"]) for k in ("sft", "rl")},
        "efficiency": {k: efficiency(p.paths[f"eval_{k}"], p.paths["heldout_suite"]) for k in ("sft", "rl")},
        "rl_steps": len(steps), "rl_reward_first": reward[0] if reward else None,
        "rl_reward_last": reward[-1] if reward else None,
        "stage_wall_s": {n: round(r.get("wall_s", 0.0), 1) for n, r in rec.items() if r},
    }
    summary["total_wall_s"] = round(sum(summary["stage_wall_s"].values()), 1)
    curve = rl_efficiency(p.paths["rl"], p.paths["rl_suite"])
    plot_efficiency(summary["efficiency"], curve, out / "efficiency.png")
    summary["rl_penalty_share"] = {"first": curve["penalty_share"][0] if curve["step"] else None,
                                   "last": curve["penalty_share"][-1] if curve["step"] else None}
    (out / "summary_demo.json").write_text(json.dumps(summary, indent=2))
    md = readme(p, summary, rec, key)
    (out / "README.md").write_text(md)
    (out / "index.html").write_text(_html(md))
    return {k: v for k, v in summary.items() if k != "stage_wall_s"}


def readme(p: DemoRun, s: dict, rec: dict, key: str) -> str:
    cfg = p.cfg
    m = p.model_dict()
    times = "\n".join(f"| {n} | {t:.0f} s |" for n, t in s["stage_wall_s"].items())
    o = s["outcomes"]
    verdict = ("RL lifted held-out success by at least 15 points." if s["lift_points"] >= 15 else
               "RL did not lift held-out success by 15 points in this run.")
    return f"""# opencomposer demo report (seed {s['seed']})

**What the tasks are.** Small generated mini-projects (`opencomposer/tasks/demo_family.py`): one
Python module with {1 + s['difficulty']} one-line function(s), one of them broken by a templated bug
(a flipped operator, a wrong constant, swapped arguments, `min` for `max`), a terse instruction
that names the function and the symptom, and hidden tests{_mix(cfg)}. They are **not real-world tasks**: a
2-core CPU cannot train a model to fix real bugs in 30 minutes. They do run through the same
sandbox, tools, agent loop, grader and hidden tests as every other suite.

## Result

| held-out success ({s['heldout_tasks']} tasks never trained on, temperature {s['eval_temperature']}) | |
|---|---|
| after SFT (before RL) | **{s['sft_success']:.1%}** |
| after RL | **{s['rl_success']:.1%}** |
| lift | **{s['lift_points']:+.1f} points** |

| held-out episodes | resolved | wrote the decoy fix | failed otherwise |
|---|---|---|---|
| after SFT | {o['sft']['resolved']} | {o['sft']['decoy']} | {o['sft']['other']} |
| after RL | {o['rl']['resolved']} | {o['rl']['decoy']} | {o['rl']['other']} |

The decoy fix is each bug's plausible wrong fix, which {s['sft_decoy_demonstrations']} of SFT's
{s['train_tasks']} demonstrations wrote (the SFT line below); only the grader tells it apart.

{verdict} One seed; `benchmarks/demo_seeds.py` measures the spread over seeds.

{_efficiency_section(s, cfg)}

![RL learning curve](learning_curve.png)

RL: {s['rl_steps']} trainer steps of {cfg.rl.groups_per_step} tasks x G={cfg.rl.group_size} rollouts, each task
used once, drawn from {s['rl_tasks']} RL tasks disjoint from SFT's {s['train_tasks']} and from the held-out ones;
lr {cfg.rl.lr}, KL beta {cfg.rl.kl_coef}, length lambda {cfg.rl.length_coef}; curve: `{key}` and the resolved
fraction per step.

Cost/accuracy plot and every held-out trajectory: [eval/index.html](eval/index.html).

## Pipeline

| stage | wall time |
|---|---|
{times}
| total | {s['total_wall_s']:.0f} s |

- tokenizer: byte-level BPE, {rec['tokenizer'].get('vocab_size')} tokens (system turn:
  {rec['tokenizer'].get('system_turn_tokens')} tokens)
- model: MoE+MTP decoder, hidden {m.get('hidden_size')}, {m.get('num_hidden_layers')} layers,
  {m.get('num_experts')} experts top-{m.get('num_experts_per_tok')}, {m.get('num_mtp_modules')} MTP module; pretrained
  {cfg.pretrain.steps} steps x {cfg.pretrain.batch_size} x {cfg.pretrain.seq_len} tokens of stdlib code
- SFT: {cfg.sft.steps} steps x {cfg.sft.batch_size} of {cfg.tasks.n_train} demonstrations (read_file,
  one edit_file, "Done."), lr {cfg.sft.lr}; final validation loss {rec['sft'].get('val_loss')}.
  {_demonstrator(s, cfg)}
- environment: read_file + edit_file with compact schemas, short system prompt, {cfg.tasks.max_turns} turns,
  1,024-token context (the demo environment's choice: `DEMO_AGENT`)
- held-out tasks: another generator seed, every training instance excluded

Config: `{p.out / 'pipeline.yaml'}`.
"""


def _mix(cfg) -> str:
    rate = cfg.tasks.two_file_rate
    return (f"; {rate:.0%} of them are two-file tasks (two modules, a bug in each, both named: the "
            f"hard ones, where reading both files in one turn saves a turn)") if rate else ""


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _efficiency_section(s: dict, cfg) -> str:
    """How the solved held-out episodes spent their turns, by task kind, before and after RL."""
    e = s["efficiency"]
    rows = []
    for kind, label in (("easy", "easy (one file)"), ("hard", "hard (two files)")):
        for stage in ("sft", "rl"):
            k = e[stage][kind]
            if not k["episodes"]:
                continue
            rows.append(f"| {label} | {stage.upper()} | {k['solved']}/{k['episodes']} | {_fmt(k['turns_per_solved'], '.2f')} | "
                        f"{_fmt(k['tokens_per_solved'], '.1f')} | {_fmt(k['effort_per_solved'], '.0f')} | "
                        f"{_fmt(k['parallel_read_frac'], '.0%') if kind == 'hard' else '-'} | "
                        f"{_fmt(k['verify_frac'], '.0%')} | {_fmt(k['survey_frac'], '.0%')} |")
    share = s["rl_penalty_share"]
    r = cfg.rl
    return f"""## Efficiency (issue 21)

| held-out tasks | after | solved | turns per solved | tokens per solved | effort x per solved | parallel read (two-file, solved) | re-read after the edit (solved) | read of a file the fix does not touch (solved) |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Reward: correctness, length penalty lambda {r.length_coef} (k {r.length_k}, q {r.length_q}; charged to
{"successes only" if r.length_scope == "correct" else "every rollout"}), KL beta {r.kl_coef},
tool-error penalty {r.tool_error_coef}, groups without a success zeroed: {r.zero_failed_groups}. The length
penalty's share of |reward| over RL's rollouts: {_fmt(share['first'], '.1%')} at the first step,
{_fmt(share['last'], '.1%')} at the last.

![Efficiency](efficiency.png)
"""


def _demonstrator(s: dict, cfg) -> str:
    n = s["sft_decoy_demonstrations"]
    text = "Every demonstration writes the gold fix (the oracle)."
    if n:
        text = (f"**An imperfect demonstrator:** {n} of the {s['train_tasks']} demonstrations (sft.decoy_rate "
                f"{cfg.sft.decoy_rate}) look the same but write a plausible wrong fix of the named line (the bug's "
                f"decoy: another operator, the arguments swapped instead of the operator flipped), unmarked, as "
                f"SFT data from people or models comes; SFT learns both, and only the grader's reward, i.e. RL, "
                f"tells them apart.")
    return text + _habits(cfg.sft)


def _habits(sft) -> str:
    """The demonstrator's turn habits (issue 21), when they are not the plain oracle's."""
    if sft.parallel_rate == 1.0 and sft.verify_rate == 0.0 and sft.survey_rate == 0.0:
        return ""
    choice = (f" (SFT learns the choice to batch the reads from {sft.parallel_choice_rate:.0%} of those, and "
              f"what follows batched reads from all of them)" if sft.parallel_choice_rate < 1.0 else "")
    survey = (f", and first reads the package's __init__.py in a turn of its own on {sft.survey_rate:.0%}"
              if sft.survey_rate else "")
    where = (" of the one-file tasks (never on two-file ones)"
             if sft.habit_tasks == "one_file" and (sft.verify_rate or sft.survey_rate) else "")
    return (f" Its habits: it batches its calls on {sft.parallel_rate:.0%} of the demonstrations{choice}, one "
            f"call a turn on the rest{',' if sft.survey_rate else ', and'} reads the edited file again on "
            f"{sft.verify_rate:.0%}{survey}{where}.")


def _html(md: str) -> str:
    """A minimal rendering of README.md (headings, tables, paragraphs, the image, links)."""
    import re

    out, table = [], []

    def inline(t: str) -> str:
        t = html.escape(t)
        t = re.sub(r"!\[([^\]]*)\]\(([^)]+)\)", r'<img alt="\1" src="\2">', t)
        t = re.sub(r"\[([^\]]+)\]\(([^)]+)\)", r'<a href="\2">\1</a>', t)
        t = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", t)
        return re.sub(r"`([^`]+)`", r"<code>\1</code>", t)

    def flush() -> None:
        if table:
            rows = [r for r in table if not set(r) <= {"|", "-", " "}]
            out.append("<table>" + "".join("<tr>" + "".join(f"<td>{inline(c.strip())}</td>" for c in r.strip("|").split("|"))
                                           + "</tr>" for r in rows) + "</table>")
            table.clear()

    for line in md.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{inline(line.lstrip('#').strip())}</h{level}>")
        elif line.strip():
            out.append(f"<p>{inline(line)}</p>")
    flush()
    style = "body{font-family:sans-serif;max-width:52em;margin:2em auto}td{border:1px solid #ccc;padding:.2em .6em}"
    return f"<!doctype html><meta charset='utf-8'><title>opencomposer demo</title><style>{style}</style>" + "\n".join(out)
