"""The agent loop: one loop for evaluation and RL (Composer 2 trains in the harness it ships).

    system prompt (+ tool schemas) + task  ->  policy turn  ->  tool calls run in the sandbox
        ^                                                         (one turn's calls in parallel)
        └──────────── tool results appended ◄────────────────────┘
    ends when the policy answers without tool calls (stop_reason "final"), or on a limit:
    max_turns, max_tokens (generated tokens over the episode), wall_time, context_full.

Shaped after mini-swe-agent: small Protocols at the seams (a policy, a workspace, the
tools), a linear append-only history, control flow by a few exceptions (`Finished` and
`LimitsExceeded` end the episode, `FormatError` becomes a user turn that tells the model
what went wrong), and the trajectory written in a `finally` after every step, so a crash
or a kill leaves the episode on disk up to its last step.

Two kinds of policy:

- `ChatPolicy`: OpenAI-style messages and tool schemas in, one assistant message out (any
  OpenAI-compatible endpoint, hosted APIs with a model name and prices, and the
  deterministic policies in `opencomposer.tasks.policies`). Token counts come from the
  reply's usage when it has one, else from the loop's tokenizer.
- `TokenPolicy`: token ids in, `GenerationResult` out (the engine seam). The loop encodes
  the conversation itself in the tokenizer's chat format (model/chat.py: opencomposer's, Qwen3's,
  Qwen3-Coder's), append-only (each turn given the role before it), and keeps
  every generated id verbatim, never re-tokenised, with its behaviour logprob, routed
  experts and policy version; what the loop inserts (prompt, tool results, summary
  requests, role tokens) has loss mask 0. This is the record RL trains on
  (harness/trajectory.py).

Bad output from the model is data: malformed tool calls come back as tool errors, a
cut-off turn without a tool call comes back as a user message, and neither ends the
episode. Exceptions from the policy itself (an endpoint down) end it with stop_reason
"error" (saved) and propagate to the caller.

Self-summarization (Composer 2 report, section 4): when the context reaches
`summarize_at` tokens, the loop appends a summary request, the policy writes the summary,
and the episode continues in a fresh context: system + task + summary
(`chat.summarized_context`). Each context is a `Segment` of the trajectory; all are kept,
so the summary tokens are trained on with the episode's reward.

Left out: streaming, tool calls that depend on each other within one turn (a turn's calls
run concurrently; writes are serialised in call order by the ToolBox), and retries of a
failing policy call (the caller decides; evaluation retries on rerun).
"""

from __future__ import annotations

import asyncio
import hashlib
import copy
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from opencomposer.engine.types import GenerationResult, SamplingParams, behaviour_logprobs_mode
from opencomposer.errors import ConfigError
from opencomposer.harness.tools import ToolBox, ToolCall, ToolConfig, ToolResult, ToolStats
from opencomposer.harness.trajectory import Prices, Segment, ToolRecord, Trajectory, TurnRecord
from opencomposer.model.chat import (
    Message, encode_messages, encode_turn, finish_generated, generation_prompt_ids, get_format, parse_assistant,
    stop_token_ids, summarized_context, summary_request_message, tool_result_message,
)
from opencomposer.model.tokenizer import Tokenizer, bundled_tokenizer

SYSTEM_PROMPT = """\
You are a coding agent working on a software project in /workspace. You have tools to read, \
search and edit its files and to run shell commands inside the project's sandbox (no network \
access); paths are relative to /workspace. Complete the user's request: explore the code as \
much as you need, make the changes, and check them, for example by running the relevant tests. \
Several tool calls in one reply run in parallel, so put calls that depend on each other in \
separate replies. When you are done, reply without any tool call, with a short summary of what \
you changed: a reply without tool calls ends the task."""

CUT_OFF_MESSAGE = ("Your last reply was cut off after {n} tokens, before it finished. Be more concise: "
                   "continue the task with a tool call, or reply without tool calls if you are done.")


class AgentConfig(BaseModel):
    """Limits and settings of one episode."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    max_turns: int = Field(100, ge=1)
    """Assistant turns (summaries included) before stop_reason "max_turns"."""
    max_total_tokens: int = Field(400_000, ge=1)
    """Tokens the policy may generate over the whole episode (stop_reason "max_tokens")."""
    max_tool_errors: int | None = Field(None, ge=1)
    """Failed tool calls (malformed ones included) that end the episode (stop_reason "tool_errors");
    None: no limit. Composer 2 validates tool arguments more strictly in training than in the
    product; ending a small model's episode at its first failed call keeps RL's negative
    advantages on the tokens that made the mistake instead of an error-recovery context that
    training never showed it (docs/demo-design.md)."""
    max_wall_s: float = Field(3600.0, gt=0)
    """Wall-clock limit of the episode (stop_reason "wall_time"); interrupts a running call."""
    summarize_at: int | None = Field(64_000, ge=1)
    """Context length in tokens that triggers self-summarization; None disables it."""
    summary_max_words: int = Field(700, ge=1)
    """Length asked of a summary (Cursor reports summaries of about 1,000 tokens)."""
    context_window: int | None = Field(None, ge=1)
    """The model's context length: a context that leaves no room to generate ends the episode
    with stop_reason "context_full" (token mode also caps max_new_tokens by the room left)."""
    max_new_tokens: int = Field(8192, ge=1)
    """Tokens one turn may generate (token mode; chat endpoints set their own max_tokens)."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature (token mode)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling (token mode)."""
    top_k: int = -1
    """Top-k sampling, -1 for all (token mode)."""
    system_prompt: str = SYSTEM_PROMPT
    """The system message; the tool schemas are added by the chat template or the endpoint."""
    tools: list[str] | None = None
    """Names of the tools offered (harness.tools.TOOLS); None: all. Tool sets are chosen per
    environment (Composer 2 report): e.g. the demo offers read_file and edit_file only."""
    compact_tools: bool = False
    """Offer the tools' compact schemas (first sentence of the description, required parameters
    only; ToolSpec.schema): a short system turn for small models (the demo's environment)."""


# ----------------------------------------------------------------------------- control flow

class AgentStop(Exception):
    """Ends the episode normally; `reason` becomes the trajectory's stop_reason."""

    reason = "stop"

    def __init__(self, message: str = "", reason: str | None = None):
        super().__init__(message)
        if reason:
            self.reason = reason


class Finished(AgentStop):
    """The policy answered without tool calls."""

    reason = "final"


class LimitsExceeded(AgentStop):
    """A limit of `AgentConfig` was reached; `reason` names it."""


class FormatError(Exception):
    """The turn could not be used (cut off before a call or an answer); the message goes back
    to the model as a user turn and the episode goes on."""


# ----------------------------------------------------------------------------- policies

@dataclass
class ChatReply:
    """One assistant turn from a chat-level policy."""

    message: dict
    """OpenAI assistant message: content, tool_calls, and reasoning_content for thinking."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    """OpenAI's finish_reason; "length" marks a reply cut off by max_tokens."""


class ChatPolicy(Protocol):
    """Messages in, one assistant message out. `name` and `prices: Prices` are optional."""

    name: str

    async def chat(self, messages: list[dict], tools: list[dict]) -> ChatReply | dict:
        ...


class TokenPolicy(Protocol):
    """Token ids in, token ids (+ logprobs, routed experts, policy versions) out. `name` is optional."""

    name: str
    tokenizer: Tokenizer

    async def generate(self, input_ids: list[int], sampling: SamplingParams) -> GenerationResult:
        ...


class TokenClientPolicy:
    """A `TokenPolicy` over the token level of a `PolicyClient` (engine/client.py): the
    embedded engine (InProcessClient), opencomposer's server or SGLang (SGLangClient), vLLM
    (VLLMClient). `tokenizer` must be the served model's."""

    def __init__(self, client, tokenizer: Tokenizer, name: str = "tokens", routed_experts: bool = True):
        self.client, self.tokenizer, self.name, self.routed_experts = client, tokenizer, name, routed_experts

    async def generate(self, input_ids: list[int], sampling: SamplingParams) -> GenerationResult:
        """Logprobs of the distribution the tokens were drawn from (behaviour_logprobs_mode)."""
        return await self.client.generate(input_ids, sampling, return_logprob=True,
                                          return_routed_experts=self.routed_experts,
                                          logprobs_mode=behaviour_logprobs_mode(sampling))


class ChatClientPolicy:
    """A `ChatPolicy` over the chat level of a `PolicyClient`: OpenAIChatClient for hosted
    APIs (model name and prices), or a server's own chat endpoint. Malformed tool calls that
    a token-level backend reports in `ChatResult.errors` are not in OpenAI's message, so the
    model does not hear about them this way: use `TokenClientPolicy` for opencomposer models.
    `send_thinking=False` drops earlier turns' reasoning_content from the request (hosted APIs
    that return it, e.g. DeepSeek's, refuse it as input); the trajectory keeps it. A server that
    sends malformed calls with `error` and `raw` beside them (VLLMClient over opencomposer's
    tool-parser plugin) has them returned to the model as tool errors."""

    def __init__(self, client, name: str, prices: Prices | None = None, sampling: SamplingParams | None = None,
                 send_thinking: bool = True, tokenizer: Tokenizer | None = None):
        self.client, self.name, self.prices, self.send_thinking = client, name, prices, send_thinking
        self.tokenizer = tokenizer  # the served model's, when known: the loop counts and hints in its format
        self.sampling = sampling or SamplingParams(max_new_tokens=8192)

    async def chat(self, messages: list[dict], tools: list[dict]) -> ChatReply:
        if not self.send_thinking:
            messages = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]
        r = await self.client.chat(messages, tools, self.sampling)
        return ChatReply(r.message, r.usage.prompt_tokens, r.usage.completion_tokens, r.finish_reason)


# ----------------------------------------------------------------------------- contexts

def message_dict(m: Message) -> dict:
    """A message as the trajectory stores it: OpenAI format, plus `error`/`raw` on malformed
    tool calls (OpenAI has no field for them; the viewer shows them)."""
    d = m.to_openai()
    if m.tool_calls:
        d["tool_calls"] = [c.to_openai() | ({"error": c.error, "raw": c.raw} if c.error else {})
                           for c in m.tool_calls]
    return d


@dataclass
class _Turn:
    message: Message
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None
    cut_off: bool


class _ChatContext:
    """The current segment for a chat-level policy: messages only."""

    def __init__(self, policy: ChatPolicy, tools: list[dict], tok: Tokenizer, config: AgentConfig):
        self.policy, self.tools, self.tok = policy, tools, tok
        self.segment = Segment()
        self._reported = 0  # context size the endpoint reported after its last turn
        self._counted = 0  # tokenizer count of what was appended since
        self.budget = config.max_new_tokens  # unused: chat endpoints set their own max_tokens

    def begin(self, messages: Sequence[dict]) -> None:
        self.segment = Segment(messages=list(messages))
        self._reported, self._counted = 0, len(encode_messages(self.tok, messages, self.tools))

    def append(self, message: dict) -> int:
        n = len(encode_turn(self.tok, message, previous_role=_last_role(self.segment)))
        self.segment.messages.append(message)
        self._counted += n
        return n

    def context_tokens(self) -> int:
        return self._reported + self._counted

    async def generate(self, turn: int) -> _Turn:
        reply = await self.policy.chat(copy.deepcopy(self.segment.messages), self.tools)
        if isinstance(reply, dict):
            reply = ChatReply(message=reply)
        msg = Message.from_openai({**reply.message, "role": "assistant"})
        counted = len(get_format(self.tok).generated_ids(msg))  # without the generation prompt
        prompt = reply.prompt_tokens if reply.prompt_tokens is not None else self.context_tokens() + 1
        completion = reply.completion_tokens if reply.completion_tokens is not None else counted
        self.append(message_dict(msg))
        if reply.prompt_tokens is not None:
            self._reported, self._counted = reply.prompt_tokens + completion, 0
        return _Turn(msg, prompt, completion, reply.finish_reason, reply.finish_reason == "length")

    def sync(self) -> None:
        pass


class _TokenContext:
    """The current segment for a token-level policy: messages plus exact token arrays."""

    def __init__(self, policy: TokenPolicy, tools: list[dict], tok: Tokenizer, config: AgentConfig,
                 sampling_seed: int | None = None):
        self.policy, self.tools, self.tok, self.config = policy, tools, tok, config
        self.sampling_seed, self.requests = sampling_seed, 0
        self.segment = Segment()
        self._experts: list[tuple[int, np.ndarray | None]] = []  # chunks, joined by sync()
        self.budget = config.max_new_tokens  # set by the loop before each generation

    def begin(self, messages: Sequence[dict]) -> None:
        self.segment = Segment(messages=list(messages), token_ids=[], loss_mask=[], logprobs=[], policy_versions=[])
        self._experts = []
        self._extend(encode_messages(self.tok, messages, self.tools))

    def _extend(self, ids: list[int], mask: int = 0, logprobs=None, versions=None, experts=None) -> None:
        s = self.segment
        s.token_ids += ids
        s.loss_mask += [mask] * len(ids)
        s.logprobs += [float(x) for x in logprobs] if logprobs is not None else [0.0] * len(ids)
        s.policy_versions += [int(v) for v in versions] if versions is not None else [-1] * len(ids)
        self._experts.append((len(ids), experts))

    def append(self, message: dict) -> int:
        ids = encode_turn(self.tok, message, previous_role=_last_role(self.segment))
        self.segment.messages.append(message)
        self._extend(ids)
        return len(ids)

    def context_tokens(self) -> int:
        return len(self.segment.token_ids)

    async def generate(self, turn: int) -> _Turn:
        self._extend(generation_prompt_ids(self.tok, _last_role(self.segment)))
        prompt = list(self.segment.token_ids)
        seed = None if self.sampling_seed is None else derive_seed(self.sampling_seed, self.requests)
        self.requests += 1
        sampling = SamplingParams(temperature=self.config.temperature, top_p=self.config.top_p,
                                  top_k=self.config.top_k, max_new_tokens=self.budget,
                                  stop_token_ids=tuple(stop_token_ids(self.tok)), seed=seed)
        res = await self.policy.generate(prompt, sampling)
        out = list(res.output_ids)
        full = finish_generated(self.tok, out)
        self._extend(out, 1, res.logprobs, res.policy_versions, res.routed_experts)
        self._extend(full[len(out):])  # a turn end (and separator) the policy did not sample
        parsed = parse_assistant(full, self.tok, call_id_prefix=f"call_{turn}_", tools=self.tools)
        msg = parsed.to_message()
        self.segment.messages.append(message_dict(msg))
        return _Turn(msg, len(prompt), len(out), res.finish_reason, res.finish_reason == "length")

    def sync(self) -> None:
        """Join the routed-expert chunks into the segment's [T, L, K] array (-1 where none)."""
        shapes = [e.shape[1:] for _, e in self._experts if e is not None]
        if not shapes:
            self.segment.routed_experts = None
            return
        parts = [np.asarray(e, dtype=np.int32) if e is not None else np.full((n, *shapes[0]), -1, np.int32)
                 for n, e in self._experts]
        self.segment.routed_experts = np.concatenate(parts)


def _last_role(segment: Segment) -> str | None:
    return segment.messages[-1]["role"] if segment.messages else None


def _context_for(policy, tools: list[dict], tok: Tokenizer, config: AgentConfig, sampling_seed: int | None):
    # by the methods alone: `name` (and `prices`) are optional in practice
    if callable(getattr(policy, "generate", None)) and getattr(policy, "tokenizer", None) is not None:
        return _TokenContext(policy, tools, tok, config, sampling_seed)
    if callable(getattr(policy, "chat", None)):
        return _ChatContext(policy, tools, tok, config)
    raise ConfigError(f"{type(policy).__name__} is not a policy: it needs `async chat(messages, tools)` "
                      "(chat level) or `tokenizer` and `async generate(input_ids, sampling)` (token level)")


def derive_seed(seed: int, *parts: object) -> int:
    """A 63-bit seed for one request or episode, from a base seed and what identifies it."""
    digest = hashlib.blake2b(":".join(map(str, (seed, *parts))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


# ----------------------------------------------------------------------------- the loop

class Agent:
    """One episode of `policy` working in `workspace` (a sandbox Workspace)."""

    def __init__(self, policy, workspace, config: AgentConfig | None = None, *,
                 tool_config: ToolConfig | None = None, tokenizer: Tokenizer | None = None,
                 trajectory_id: str | None = None, task_id: str | None = None,
                 save_path: Path | str | None = None, meta: dict | None = None, sampling_seed: int | None = None):
        """sampling_seed: the episode's generation requests get seeds derived from it (a token-level
        policy samples the same tokens for the same seed, alone or batched), so a seeded run
        repeats its episodes whatever else the engine serves; None: unseeded."""
        self.config = config or AgentConfig()
        self.toolbox = ToolBox(workspace, tool_config, tools=self.config.tools)
        self.tok = getattr(policy, "tokenizer", None) or tokenizer or bundled_tokenizer()
        self.tools = self.toolbox.schemas(compact=self.config.compact_tools)
        self.ctx = _context_for(policy, self.tools, self.tok, self.config, sampling_seed)
        self.save_path = Path(save_path) if save_path else None
        prices = getattr(policy, "prices", None)
        self.trajectory = Trajectory(
            id=trajectory_id or uuid.uuid4().hex[:12], task_id=task_id, policy=getattr(policy, "name", ""),
            tools=self.tools, prices=prices if isinstance(prices, Prices) else None,
            meta={"agent_config": self.config.model_dump(), **(meta or {})})
        self._deadline = 0.0
        self._t0 = 0.0
        self._segment_turns = 0

    # ---------------------------------------------------------------- run

    async def run(self, instruction: str) -> Trajectory:
        """Run the episode to its end; returns the trajectory (also saved to `save_path`)."""
        t = self.trajectory
        t.instruction, t.started_at = instruction, time.time()
        self._t0 = time.monotonic()
        self._deadline = asyncio.get_running_loop().time() + self.config.max_wall_s
        try:
            self._begin([{"role": "system", "content": self.config.system_prompt},
                         {"role": "user", "content": instruction}])
            while True:
                try:
                    await self.step()
                except FormatError as e:
                    self.ctx.append({"role": "user", "content": str(e)})
                finally:
                    self.save()
        except AgentStop as e:
            t.stop_reason = e.reason
        except BaseException as e:  # saved below, then re-raised: the caller decides
            t.stop_reason, t.error = "error", f"{type(e).__name__}: {e}"
            raise
        finally:
            t.counts.unfinished_todos = self.toolbox.unfinished_todos()
            self.save()
        return t

    async def step(self) -> None:
        """One assistant turn (or one summary), with its tool calls run and their results appended."""
        self._check_limits()
        if self._should_summarize():
            await self._summarize()
            return
        turn = await self._generate("action")
        msg = turn.message
        if turn.cut_off and turn.completion_tokens == 0:  # the engine had no room left to generate
            raise LimitsExceeded(f"context of {turn.prompt_tokens} tokens", "context_full")
        if not msg.tool_calls:
            if turn.cut_off:
                self.trajectory.turns[-1].kind = "cut_off"
                raise FormatError(CUT_OFF_MESSAGE.format(n=turn.completion_tokens))
            self.trajectory.turns[-1].kind = "final"
            self.trajectory.final_message = msg.content
            self.trajectory.counts.final_message_tokens = len(self.tok.encode(msg.content))
            raise Finished()
        await self._run_tools(msg)

    def save(self) -> None:
        t = self.trajectory
        t.wall_s = time.monotonic() - self._t0 if self._t0 else 0.0
        t.cost_usd = t.prices.cost(t.counts.prompt_tokens, t.counts.completion_tokens) if t.prices else 0.0
        self.ctx.sync()
        if self.save_path:
            t.save(self.save_path)

    # ---------------------------------------------------------------- pieces

    def _begin(self, messages: list[dict]) -> None:
        self.ctx.begin(messages)
        self.trajectory.segments.append(self.ctx.segment)
        self._segment_turns = 0

    def _check_limits(self) -> None:
        cfg, c = self.config, self.trajectory.counts
        if c.turns >= cfg.max_turns:
            raise LimitsExceeded(f"{c.turns} turns", "max_turns")
        if c.completion_tokens >= cfg.max_total_tokens:
            raise LimitsExceeded(f"{c.completion_tokens} generated tokens", "max_tokens")
        if asyncio.get_running_loop().time() >= self._deadline:
            raise LimitsExceeded(f"{cfg.max_wall_s} s", "wall_time")
        room = cfg.max_total_tokens - c.completion_tokens
        if cfg.context_window:
            room = min(room, cfg.context_window - self.ctx.context_tokens() - 1)
            if room < 1:
                raise LimitsExceeded(f"context of {self.ctx.context_tokens()} tokens", "context_full")
        self.ctx.budget = min(cfg.max_new_tokens, room)

    def _should_summarize(self) -> bool:
        at = self.config.summarize_at
        return bool(at) and self._segment_turns > 0 and self.ctx.context_tokens() >= at

    async def _bounded(self, coro):
        """Await `coro` within the episode's wall-clock limit."""
        try:
            async with asyncio.timeout_at(self._deadline) as cm:
                return await coro
        except TimeoutError:
            if cm.expired():
                raise LimitsExceeded(f"{self.config.max_wall_s} s", "wall_time") from None
            raise

    async def _generate(self, kind: str) -> _Turn:
        t, c = self.trajectory, self.trajectory.counts
        t0 = time.monotonic()
        turn = await self._bounded(self.ctx.generate(c.turns))
        dt = time.monotonic() - t0
        t.policy_s += dt
        c.turns += 1
        self._segment_turns += 1
        c.prompt_tokens += turn.prompt_tokens
        c.completion_tokens += turn.completion_tokens
        msg = turn.message
        if msg.thinking:
            c.thinking_tokens += len(self.tok.encode(msg.thinking))
        fmt = get_format(self.tok)
        c.tool_call_tokens += sum(len(self.tok.encode(fmt.call_text(call))) + 2 for call in msg.tool_calls)
        t.turns.append(TurnRecord(segment=len(t.segments) - 1, kind=kind, prompt_tokens=turn.prompt_tokens,
                                  completion_tokens=turn.completion_tokens, policy_s=round(dt, 4),
                                  finish_reason=turn.finish_reason))
        return turn

    async def _summarize(self) -> None:
        t = self.trajectory
        self.ctx.append(summary_request_message(self.config.summary_max_words))
        turn = await self._generate("summary")
        t.counts.summaries += 1
        summary = turn.message.content.strip() or "(the summary was empty)"
        self.ctx.segment.summary = summary
        self.ctx.sync()
        # only system and task are kept; assistant turns with malformed calls are not valid Messages
        head = [m for m in self.ctx.segment.messages if m["role"] in ("system", "user")]
        self._begin(summarized_context(head, summary))

    async def _run_tools(self, msg: Message) -> None:
        """Run the turn's calls (malformed ones become tool errors) and append the results in order."""
        t, c = self.trajectory, self.trajectory.counts
        results: list[ToolResult | None] = []
        valid: list[ToolCall] = []
        for call in msg.tool_calls:
            if call.error:
                raw = call.raw or ""
                results.append(ToolResult(call.id, call.name, False, "",
                                          f"malformed tool call ({call.error}); write "
                                          + get_format(self.tok).call_hint,
                                          ToolStats(bytes_in=len(raw.encode()), error_kind="malformed")))
            else:
                results.append(None)
                valid.append(ToolCall(call.id, call.name, call.arguments))
        t0 = time.monotonic()
        ran = iter(await self._bounded(self.toolbox.run_many(valid)))
        dt = time.monotonic() - t0
        t.tools_s += dt
        t.turns[-1].tools_s, t.turns[-1].tool_calls = round(dt, 4), len(results)
        seg, turn_index = len(t.segments) - 1, c.turns - 1
        for r in results:
            r = r if r is not None else next(ran)
            kind = r.stats.error_kind
            c.tool_calls += 1
            c.tool_errors += not r.ok
            c.malformed_calls += kind in ("malformed", "invalid_json")
            t.tool_calls.append(ToolRecord(seg, turn_index, r.call_id, r.name, r.ok, kind, r.stats.bytes_in,
                                           r.stats.bytes_out, round(r.stats.duration_s, 4)))
            c.tool_output_tokens += self.ctx.append(tool_result_message(r))
        if self.config.max_tool_errors is not None and c.tool_errors >= self.config.max_tool_errors:
            raise LimitsExceeded(f"{c.tool_errors} failed tool calls", "tool_errors")


async def run_agent(policy, workspace, instruction: str, config: AgentConfig | None = None, **kw) -> Trajectory:
    """`Agent(policy, workspace, config, **kw).run(instruction)`."""
    return await Agent(policy, workspace, config, **kw).run(instruction)
