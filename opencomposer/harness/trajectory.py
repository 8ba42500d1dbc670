"""The record of one episode of the agent loop: what evaluation reports and what RL trains on.

A `Trajectory` is a list of `Segment`s, one per context: the first starts from the system
prompt and the task; each self-summarization closes a segment (whose last turns are the
summary request and the summary) and opens a fresh one (system + task + summary). Every
segment keeps its messages (OpenAI-style dicts, for reading, viewers and chat policies).
A token-level episode also keeps, per segment, aligned per-token arrays:

    token_ids        [T]           the context exactly as the policy saw and wrote it
    loss_mask        [T]           1 on tokens the policy sampled, 0 on everything else
                                   (prompt, tool results, summaries inserted by the loop,
                                   role tokens, an <|im_end|> appended to a cut-off turn)
    logprobs         [T]           behaviour log-probability of sampled tokens, 0.0 elsewhere
    policy_versions  [T]           engine policy version of sampled tokens, -1 elsewhere
    routed_experts   [T, L_moe, K] int32 experts the engine's router chose for sampled
                                   tokens, -1 elsewhere (the trainer's router replay input)

The trainer computes one forward per segment over `token_ids` and takes the loss where
`loss_mask` is 1, so tokens are never re-tokenised between the engine and the trainer.

Everything else is plain data: per-call tool records (bytes, duration, error kind),
per-turn records (usage, latency, finish reason), counts, timings, cost, stop reason,
and what evaluation adds (patch, grade, reward).

Serialisation (both load back identically; tests/harness/test_agent.py checks it):

- `to_dict()` / `from_dict()`: JSON-able, arrays as (nested) lists. One line of
  `write_jsonl` per trajectory: what `opencomposer eval` writes (its policies seldom
  return routed experts, so the lists stay small).
- `save(path)` / `load(path)`: a JSON file, with routed experts moved to a side file
  `<path>.experts.npz` (one uncompressed int32 array per segment, `seg<i>`): what the agent
  loop rewrites after every step, where nested lists of a [T, L, K] array would be slow.

Left out: prompt-side routed experts (the engine's prefill routing of prompt tokens; the
trainer lets the router choose there), prompt caching discounts in `Cost`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable

import numpy as np


@dataclass
class Prices:
    """USD per million tokens, as API providers quote them."""

    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1e6


@dataclass
class Segment:
    """One context window of the episode (see the module docstring for the token arrays)."""

    messages: list[dict] = field(default_factory=list)
    token_ids: list[int] | None = None
    loss_mask: list[int] | None = None
    logprobs: list[float] | None = None
    policy_versions: list[int] | None = None
    routed_experts: np.ndarray | None = None
    """int32 [len(token_ids), L_moe, K]; None if the policy returned none."""
    summary: str | None = None
    """The summary that closed this segment (None for the last one)."""

    def to_dict(self, experts: bool = True) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "routed_experts"}
        if experts and self.routed_experts is not None:
            d["routed_experts"] = self.routed_experts.tolist()
            d["routed_experts_shape"] = list(self.routed_experts.shape)  # keeps [0, L, K] exact
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Segment":
        d = dict(d)
        experts, shape = d.pop("routed_experts", None), d.pop("routed_experts_shape", None)
        seg = cls(**d)
        if experts is not None:
            seg.routed_experts = np.asarray(experts, dtype=np.int32).reshape(shape)
        return seg


@dataclass
class ToolRecord:
    """One tool call: where it happened and what it cost."""

    segment: int
    turn: int
    call_id: str
    name: str
    ok: bool
    error_kind: str | None
    """A `harness.tools.ERROR_KINDS` value, or "malformed" for a call the model wrote badly."""
    bytes_in: int
    bytes_out: int
    duration_s: float


@dataclass
class TurnRecord:
    """One assistant turn (a generation)."""

    segment: int
    kind: str
    """"action" (tool calls), "final" (no tool calls: the episode's answer), "summary",
    or "cut_off" (stopped by max_new_tokens before a tool call or an answer)."""
    prompt_tokens: int
    completion_tokens: int
    policy_s: float
    tools_s: float = 0.0
    tool_calls: int = 0
    finish_reason: str | None = None


@dataclass
class Counts:
    """Totals over the episode. Token counts of parts of turns use the loop's tokenizer (the
    model's own in token mode, where they are exact)."""

    turns: int = 0
    """Assistant turns, summaries included."""
    summaries: int = 0
    tool_calls: int = 0
    malformed_calls: int = 0
    tool_errors: int = 0
    """Calls that came back with ok=False (malformed ones included)."""
    prompt_tokens: int = 0
    """Input tokens summed over every policy call (what an API bills)."""
    completion_tokens: int = 0
    """Tokens the policy generated, over every turn."""
    thinking_tokens: int = 0
    tool_call_tokens: int = 0
    tool_output_tokens: int = 0
    final_message_tokens: int = 0
    unfinished_todos: int = 0


@dataclass
class Trajectory:
    id: str
    task_id: str | None = None
    policy: str = ""
    instruction: str = ""
    tools: list[dict] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    tool_calls: list[ToolRecord] = field(default_factory=list)
    counts: Counts = field(default_factory=Counts)
    started_at: float = 0.0
    """Unix time the episode started."""
    wall_s: float = 0.0
    policy_s: float = 0.0
    tools_s: float = 0.0
    prices: Prices | None = None
    cost_usd: float = 0.0
    """prompt_tokens x input price + completion_tokens x output price (0 without prices)."""
    stop_reason: str | None = None
    """final | max_turns | max_tokens | wall_time | context_full | tool_errors | error (None while running)."""
    error: str | None = None
    final_message: str | None = None
    patch: str | None = None
    """The workspace's diff after the episode (filled by evaluation or RL)."""
    grade: dict | None = None
    """The grader's result (`tasks.grade.GradeResult.to_json()`)."""
    reward: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    """Free-form context: pass index, sampling and agent configs, suite name."""

    @property
    def messages(self) -> list[dict]:
        """Every message of every segment, in order (a fresh context repeats system and task)."""
        return [m for s in self.segments for m in s.messages]

    @property
    def token_level(self) -> bool:
        return any(s.token_ids is not None for s in self.segments)

    # ------------------------------------------------------------------ JSON

    def to_dict(self, experts: bool = True) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["segments"] = [s.to_dict(experts) for s in self.segments]
        d["turns"] = [asdict(t) for t in self.turns]
        d["tool_calls"] = [asdict(t) for t in self.tool_calls]
        d["counts"] = asdict(self.counts)
        d["prices"] = asdict(self.prices) if self.prices else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Trajectory":
        d = dict(d)
        d["segments"] = [Segment.from_dict(s) for s in d.get("segments", [])]
        d["turns"] = [TurnRecord(**t) for t in d.get("turns", [])]
        d["tool_calls"] = [ToolRecord(**t) for t in d.get("tool_calls", [])]
        d["counts"] = Counts(**d.get("counts", {}))
        d["prices"] = Prices(**d["prices"]) if d.get("prices") else None
        return cls(**d)

    def to_json(self, experts: bool = True) -> str:
        return _dumps(self.to_dict(experts))

    # ------------------------------------------------------------------ files

    def save(self, path: Path | str) -> None:
        """Write `path` (JSON) and, if any segment has routed experts, `<path>.experts.npz`.
        Each file is written to a temporary name and renamed, so a reader (or a crash) never
        sees half a file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {f"seg{i}": s.routed_experts for i, s in enumerate(self.segments) if s.routed_experts is not None}
        d = self.to_dict(experts=False)
        if arrays:
            npz = experts_path(path)
            d["experts_file"] = npz.name
            tmp = npz.with_name(npz.name + ".tmp")
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)
            os.replace(tmp, npz)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(_dumps(d), encoding="utf-8")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path | str) -> "Trajectory":
        path = Path(path)
        d = json.loads(path.read_text(encoding="utf-8"))
        npz_name = d.pop("experts_file", None)
        traj = cls.from_dict(d)
        if npz_name:
            with np.load(path.with_name(npz_name)) as arrays:
                for key in arrays.files:
                    traj.segments[int(key[3:])].routed_experts = arrays[key]
        return traj


def _dumps(d: dict) -> str:
    """JSON as readable UTF-8; with \\u escapes where text holds lone surrogates (a chat
    policy's reply or a file name that is not UTF-8), which UTF-8 cannot encode but JSON
    escapes carry exactly."""
    text = json.dumps(d, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(d)
    return text


def experts_path(path: Path) -> Path:
    return path.with_name(path.name + ".experts.npz")


def write_jsonl(trajectories: Iterable[Trajectory], path: Path | str, *, append: bool = True) -> None:
    """One trajectory per line (arrays as lists). Appending first drops a last line that a crash
    cut mid-write (read_jsonl skips it; appended to, it would join the next line and make it
    unreadable)."""
    if append:
        _drop_cut_line(Path(path))
    with open(path, "a" if append else "w") as f:
        for t in trajectories:
            f.write(t.to_json() + "\n")


def _drop_cut_line(path: Path) -> None:
    """Truncate the file after its last newline, when it does not end in one."""
    try:
        f = open(path, "rb+")
    except FileNotFoundError:
        return
    with f:
        end = f.seek(0, os.SEEK_END)
        if end == 0:
            return
        f.seek(end - 1)
        if f.read(1) == b"\n":
            return
        f.seek(0)
        f.truncate(f.read().rfind(b"\n") + 1)


def read_jsonl(path: Path | str) -> list[Trajectory]:
    """Every complete line of a trajectories file (a line cut by a crash mid-write is skipped)."""
    out = []
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                break
            out.append(Trajectory.from_dict(json.loads(line)))
    return out
