"""The quitting collapse of issue 21, reproduced on the real reward and advantage code.

The demo's RL runs with length_coef = tool_error_coef = 0 because, with them on, the policy
collapsed into answering without any tool call (docs/demo-design.md). This script shows the
mechanism with opencomposer.rl.rewards.compute_reward and opencomposer.rl.advantages.
compute_advantages, on a two-action policy instead of a language model (seconds on a CPU):

- every rollout either "quits" (one turn, a short final message, no tool call, never resolves)
  or "works" (several turns of tool calls, resolves with probability p_solve);
- in a group where every rollout fails, correctness is 0 for all, so the only reward
  differences are the length penalty (and tool-error terms): the quitter has the least effort,
  hence the largest advantage, and each such group pushes the policy towards quitting;
- when most groups fail (hard tasks, or an early policy), that push outweighs the pull of the
  few successes and P(work) goes to 0: the collapse.

Rule "all" is today's reward (the penalty counts in every group); rule "gated" is one candidate
fix: a group with no success gets zero advantages (correctness alone has no signal there, and
the penalty is not allowed to speak where it cannot be weighed against a success). Row
"successes_only" is the other: every group counts, but the length term is charged to successes
only (reward.length_scope "correct"), so failures are never ranked by length. This is a
toy of the mechanism, not the demo's magnitudes: the demo's own figures need the real RL stage.

    PYTHONPATH=. python benchmarks/reward21_collapse.py --json
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import torch

from opencomposer.rl.advantages import compute_advantages
from opencomposer.rl.rewards import RewardConfig, RewardInputs, compute_reward

QUIT = RewardInputs(thinking_tokens=0, tool_call_tokens=0, tool_output_tokens=0, final_message_tokens=40,
                    tool_calls=0, turns=1, failed_tool_calls=0, malformed_tool_calls=0, unfinished_todos=0,
                    resolved=False)


def work(resolved: bool) -> RewardInputs:
    """Four turns: read, read, edit, answer; one of the calls errors."""
    return RewardInputs(thinking_tokens=0, tool_call_tokens=120, tool_output_tokens=600, final_message_tokens=40,
                        tool_calls=3, turns=4, failed_tool_calls=1, malformed_tool_calls=0, unfinished_todos=0,
                        resolved=resolved)


def group_advantages(rewards_nG: torch.Tensor, resolved_nG: torch.Tensor, rule: str) -> torch.Tensor:
    adv = compute_advantages(rewards_nG)
    if rule == "gated":
        adv = adv.masked_fill(~resolved_nG.any(dim=1, keepdim=True), 0.0)
    elif rule != "all":
        raise ValueError(f"rule must be 'all' or 'gated', got {rule!r}")
    return adv


def simulate(rule: str, cfg: RewardConfig, p_solve: float = 0.03, p_work0: float = 0.9, steps: int = 200,
             groups: int = 16, group_size: int = 8, lr: float = 1.0, seed: int = 0) -> dict:
    """REINFORCE with group advantages on theta = logit P(work); returns P(work) over steps."""
    rng = np.random.default_rng(seed)
    theta = math.log(p_work0 / (1 - p_work0))
    trace = []
    r_quit = compute_reward(QUIT, cfg).total
    r_fail, r_win = compute_reward(work(False), cfg).total, compute_reward(work(True), cfg).total
    for _ in range(steps):
        p = 1 / (1 + math.exp(-theta))
        works = rng.random((groups, group_size)) < p
        solved = works & (rng.random((groups, group_size)) < p_solve)
        rewards = np.where(works, np.where(solved, r_win, r_fail), r_quit)
        adv = group_advantages(torch.tensor(rewards), torch.tensor(solved), rule).numpy()
        # d log pi(a) / d theta: (1 - p) for "work", -p for "quit"
        grad = np.where(works, 1 - p, -p)
        theta += lr * float((adv * grad).sum()) / (groups * group_size)
        trace.append(p)
    return {"rule": rule, "p_work_start": trace[0], "p_work_end": 1 / (1 + math.exp(-theta)),
            "rewards": {"quit": r_quit, "work_fail": r_fail, "work_solve": r_win}}


def old_penalty_config(length_coef: float = 5e-4, tool_error_coef: float = 0.01) -> RewardConfig:
    return RewardConfig(length_coef=length_coef, failed_tool_call_coef=tool_error_coef,
                        malformed_tool_call_coef=tool_error_coef, kl_coef=0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p-solve", type=float, default=0.03)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    cfg = old_penalty_config()
    out = {r: simulate(r, cfg, p_solve=a.p_solve, steps=a.steps, seed=a.seed) for r in ("all", "gated")}
    out["successes_only"] = simulate("all", cfg.model_copy(update={"length_scope": "correct"}), p_solve=a.p_solve,
                                     steps=a.steps, seed=a.seed)
    out["correctness_only"] = simulate("all", RewardConfig(length_coef=0, failed_tool_call_coef=0,
                                                           malformed_tool_call_coef=0, kl_coef=0),
                                       p_solve=a.p_solve, steps=a.steps, seed=a.seed)
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        for k, v in out.items():
            print(f"{k:17s} P(work) {v['p_work_start']:.3f} -> {v['p_work_end']:.3f}")


if __name__ == "__main__":
    main()
