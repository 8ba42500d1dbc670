"""Rewards for one trajectory: correctness + auxiliary terms − λ·C(effort) − β·KL.

Composer 2 [R §4] rewards a rollout for correctness (hidden tests), subtracts auxiliary
penalties for poor tool use, and subtracts a *nonlinear length penalty* C(x) of the effort x
the agent spent, a weighted sum of thinking tokens, tool-call tokens, tool-output tokens,
final-message tokens, tool calls and turns:

    C(x) = ((1 + k·x)^(1−q) − 1) / (k·(1 − q)),        q ≠ 1
    C(x) = log(1 + k·x) / k,                            q = 1 (the limit)

C(0) = 0 and C'(x) = (1 + k·x)^(−q) > 0, so C is increasing; for q > 0 it is concave (each
extra unit of effort costs less on a long rollout than on a short one: easy tasks are pushed
to be quick, hard tasks may still take long); q = 0 is the linear penalty x; C ≈ x while
k·x ≪ 1; for q > 1 it is bounded by 1/(k·(q − 1)).

The report gives the form but not k, q, λ, the effort weights or the auxiliary coefficients:
every default below marked OURS is our choice, with its reason (docs/rl-algorithm.md).

Covered: the penalty on floats, numpy arrays and torch tensors; the reward of one trajectory
from plain counts, itemised for metrics; broadcasting a trajectory's value to its
self-summarization segments. Left out: graders (opencomposer.tasks.grade), counting tokens
in a trajectory (the agent loop), style/communication rewards (would need a judge model).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal, Sequence, TypeVar

import numpy as np
import torch
from pydantic import Field

from opencomposer.config import Section

Num = TypeVar("Num", float, np.ndarray, torch.Tensor)

# Below this |1 − q| the general form is replaced by its limit log(1+kx)/k; the relative error
# of doing so is about |1 − q|·log(1+kx)/2, i.e. < 1e-10 for any x a rollout can reach.
_Q_ONE_TOL = 1e-12


def length_penalty(x: Num, k: float, q: float) -> Num:
    """C(x) = ((1+kx)^(1−q) − 1)/(k(1−q)), and log(1+kx)/k at q = 1 [Composer 2, R §4].

    Computed as expm1((1−q)·log1p(kx)) / (k(1−q)), which is exact to rounding for every q,
    including q → 1 where the textbook form cancels catastrophically. x may be a Python number
    (returns float), a numpy array or scalar (returns numpy) or a torch tensor (returns a
    tensor of x's float dtype, differentiable in x). Raises ValueError unless k > 0, q ≥ 0
    and every x ≥ 0.
    """
    if not (k > 0 and math.isfinite(k)):
        raise ValueError(f"length_penalty: k must be a finite number > 0 (the scale where the penalty bends), got {k}")
    if not (q >= 0 and math.isfinite(q)):
        raise ValueError(f"length_penalty: q must be a finite number ≥ 0 (0 = linear, 1 = log), got {q}")
    if isinstance(x, torch.Tensor):
        x = x if x.is_floating_point() else x.to(torch.get_default_dtype())
        log1p, expm1 = torch.log1p, torch.expm1
        negative = bool((x < 0).any())
    elif isinstance(x, (np.ndarray, np.generic)):
        if not np.issubdtype(x.dtype, np.floating):
            x = x.astype(np.float64)
        log1p, expm1 = np.log1p, np.expm1
        negative = bool(np.any(x < 0))
    else:
        x = float(x)
        log1p, expm1 = math.log1p, math.expm1
        negative = x < 0
    if negative:
        raise ValueError("length_penalty: effort x must be ≥ 0 (a weighted count of tokens, calls and turns)")
    a = 1.0 - q
    log_1_kx = log1p(k * x)
    if abs(a) < _Q_ONE_TOL:
        return log_1_kx / k
    return expm1(a * log_1_kx) / (k * a)


class EffortWeights(Section):
    """Weights of the effort x = Σ weight·count, in units of "decoded-token equivalents".

    All defaults are OURS (the report names the components, not their weights).
    """

    thinking_tokens: float = Field(1.0, ge=0)
    """Per reasoning token; decoded tokens are the unit of cost. OURS."""
    tool_call_tokens: float = Field(1.0, ge=0)
    """Per token of tool-call arguments; decoded like any other token. OURS."""
    tool_output_tokens: float = Field(0.1, ge=0)
    """Per token of tool output; prefilled, not decoded, so roughly 10× cheaper per token. OURS."""
    final_message_tokens: float = Field(1.0, ge=0)
    """Per token of the final answer to the user. OURS."""
    tool_calls: float = Field(10.0, ge=0)
    """Per tool call (sandbox work, parsing); a call is worth ~10 decoded tokens. OURS."""
    turns: float = Field(100.0, ge=0)
    """Per model turn (one round trip: stop, run tools, prefill, resume). Charging turns more
    than calls is what rewards batching calls in parallel in one turn, the behaviour the report
    says the penalty taught. OURS."""


class RewardConfig(Section):
    """Coefficients of r = w_c·correctness − auxiliary − λ·C(x; k, q) − β·KL. Defaults are OURS."""

    correctness: Literal["resolved", "tests_passed"] = "resolved"
    """"resolved": 1 if the grader resolved the task, else 0; "tests_passed": the fraction of hidden tests passed."""
    correctness_weight: float = Field(1.0, ge=0)
    """w_c: the reward for a fully correct rollout; the other terms are scaled against it."""
    length_coef: float = Field(5e-5, ge=0)
    """λ: with the default k, q, λ·C(x) is ≈0.02 at x = 500, ≈0.12 at 10⁴ and ≈0.23 at 10⁵, so a
    cheap wrong answer never beats a correct one, yet effort separates rollouts in a group. OURS."""
    length_k: float = Field(1e-3, gt=0)
    """k: C(x) ≈ x while x ≪ 1/k = 1,000 token equivalents, and bends beyond. OURS."""
    length_q: float = Field(1.0, ge=0)
    """q: curvature; 0 = linear, 1 = logarithmic (default), > 1 = bounded. OURS."""
    length_scope: Literal["all", "correct"] = "all"
    """Where λ·C(x) applies. "all": every rollout. "correct": scaled by the rollout's correctness c
    and capped at w_c, −c·min(λ·C(x), w_c): failures are not ranked by length (the quitting
    collapse, docs/demo-design.md "Issue 21") and no success falls below a failure. OURS."""
    effort: EffortWeights = EffortWeights()
    """Weights of the effort x."""
    failed_tool_call_coef: float = Field(0.01, ge=0)
    """Penalty per tool call that ran and returned an error (exploration makes some normal). OURS."""
    malformed_tool_call_coef: float = Field(0.05, ge=0)
    """Penalty per tool call that could not be parsed or validated; larger than a failed call,
    since the report saw models emit broken calls on purpose to dodge penalties. OURS."""
    unfinished_todo_coef: float = Field(0.05, ge=0)
    """Penalty per to-do item created and left unfinished [R §4]. OURS."""
    max_auxiliary_penalty: float = Field(0.5, ge=0)
    """Cap on the sum of the three auxiliary penalties: Dr. GRPO does not divide by the group's
    std, so a flood of bad calls must not produce advantages far larger than correctness. OURS."""
    kl_coef: float = Field(1e-3, ge=0)
    """β of the KL-in-reward term −β·Σ_t kl_t (0 disables; then no reference model is needed). OURS."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k1"
    """Estimator summed for the KL-in-reward term; k1 as in the report (losses.kl_in_reward)."""


@dataclass
class RewardInputs:
    """What one trajectory and its grading report; the agent loop and the grader fill it."""

    thinking_tokens: int
    tool_call_tokens: int
    tool_output_tokens: int
    final_message_tokens: int
    tool_calls: int
    turns: int
    failed_tool_calls: int
    malformed_tool_calls: int
    unfinished_todos: int
    resolved: bool
    tests_passed_fraction: float | None = None  # needed only when cfg.correctness == "tests_passed"


@dataclass
class RewardBreakdown:
    """Each signed term of the reward, for metrics; `total` is their sum."""

    correctness: float
    failed_tool_calls: float      # −coef·count (before the cap)
    malformed_tool_calls: float
    unfinished_todos: float
    auxiliary: float              # the three above, summed and capped at −max_auxiliary_penalty
    effort: float                 # x, for logging (not a reward term)
    length_penalty: float         # −λ·C(x)
    kl: float                     # −β·Σ_t kl_t
    total: float                  # correctness + auxiliary + length_penalty + kl

    def as_dict(self, prefix: str = "reward/") -> dict[str, float]:
        return {prefix + k: v for k, v in dataclasses.asdict(self).items()}


def effort(inputs: RewardInputs, w: EffortWeights) -> float:
    """x = Σ_c w_c·n_c over the six effort components [R §4]."""
    return (w.thinking_tokens * inputs.thinking_tokens + w.tool_call_tokens * inputs.tool_call_tokens
            + w.tool_output_tokens * inputs.tool_output_tokens + w.final_message_tokens * inputs.final_message_tokens
            + w.tool_calls * inputs.tool_calls + w.turns * inputs.turns)


def compute_reward(inputs: RewardInputs, cfg: RewardConfig, kl_sum: float = 0.0) -> RewardBreakdown:
    """r = w_c·correctness − min(Σ aux, cap) − λ·C(x) − β·kl_sum (cfg.length_scope "correct":
    −c·min(λ·C(x), w_c) in place of −λ·C(x)).

    kl_sum is the trajectory's Σ_t kl_t over its generated tokens (losses.kl_in_reward with
    cfg.kl_estimator); it is a number, not a tensor: the KL-in-reward term carries no gradient.
    """
    if cfg.correctness == "resolved":
        correct = 1.0 if inputs.resolved else 0.0
    else:
        f = inputs.tests_passed_fraction
        if f is None or not 0.0 <= f <= 1.0:
            raise ValueError(f"correctness='tests_passed' needs tests_passed_fraction in [0, 1], got {f!r}")
        correct = float(f)
    failed = -cfg.failed_tool_call_coef * inputs.failed_tool_calls
    malformed = -cfg.malformed_tool_call_coef * inputs.malformed_tool_calls
    todos = -cfg.unfinished_todo_coef * inputs.unfinished_todos
    aux = max(failed + malformed + todos, -cfg.max_auxiliary_penalty)
    x = effort(inputs, cfg.effort)
    length = -cfg.length_coef * length_penalty(x, cfg.length_k, cfg.length_q)
    if cfg.length_scope == "correct":
        length = max(length, -cfg.correctness_weight) * correct
    kl = -cfg.kl_coef * kl_sum
    correctness = cfg.correctness_weight * correct
    return RewardBreakdown(correctness=correctness, failed_tool_calls=failed, malformed_tool_calls=malformed,
                           unfinished_todos=todos, auxiliary=aux, effort=x, length_penalty=length, kl=kl,
                           total=correctness + aux + length + kl)


def broadcast_to_segments(values_N: Sequence[float] | torch.Tensor,
                          segment_trajectory_S: Sequence[int] | torch.Tensor) -> list[float] | torch.Tensor:
    """Give every self-summarization segment its trajectory's value: out[s] = values[traj[s]].

    With self-summarization a rollout is several generations joined by summaries, and "the
    final reward is applied to every token, summaries included" [R §4]. Compute rewards *and
    advantages* per trajectory first, then broadcast: a trajectory split into many segments
    must not weigh more in its group's mean. Returns a tensor if values_N is a tensor.
    """
    if isinstance(values_N, torch.Tensor):
        idx = torch.as_tensor(segment_trajectory_S, dtype=torch.long, device=values_N.device)
        return values_N[idx]
    return [float(values_N[i]) for i in segment_trajectory_S]
