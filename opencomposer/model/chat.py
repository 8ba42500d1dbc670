"""The chat format: messages <-> token ids, tool calls, and the model's output parsed back.

One format, used by the agent loop, the engine's OpenAI-compatible server, SFT and RL.
A conversation is ``<|bos|>`` followed by one block per message::

    <|system|>{system text}\\n\\n# Tools ... one JSON schema per line<|im_end|>
    <|user|>{text}<|im_end|>
    <|assistant|><|think|>{thinking}<|/think|>{text}<|tool_call|>{"name": "read", "arguments": {...}}<|/tool_call|><|im_end|>
    <|tool|>{tool name}\\n{result text}<|im_end|>

Every ``<|...|>`` above is one special token, inserted by id; message text is encoded with
`Tokenizer.encode`, which never yields a special token, so a message that contains the
string "<|im_end|>" cannot close its turn (no prompt injection through tool output).

Append-only. ``encode_messages(m) == [bos] + encode_turn(m[0]) + encode_turn(m[1]) + ...``,
and a turn's ids depend only on that message (and the tool list, for the system turn), so
adding turns never changes earlier ids. The engine generates after
``generation_prompt_ids() == [<|assistant|>]``; the agent loop keeps the generated ids
verbatim (`finish_generated` appends ``<|im_end|>`` only to a cut-off generation), and for a
well-formed generation, ``encode_turn(parse_assistant(gen).to_message())`` gives back
``[<|assistant|>] + gen`` exactly, so the OpenAI server path also re-renders it unchanged.
Well-formed means: tokens as `encode` would produce them, thinking first, text, then tool
calls, then ``<|im_end|>``.
Thinking is kept in every turn (it is not stripped from earlier turns as Qwen3's template
does), because stripping would break append-only and RL trains on the tokens as generated.

Tool-call ids are not in the tokens: `parse_assistant` assigns them (``call_id_prefix`` +
index) and a tool turn is matched to its call by order, which the agent loop preserves
(results follow their calls, in order, as Qwen's and most open templates do). So the model
never copies an opaque id, and a turn renders the same whatever ids a client chose.

Bad output from the model is data, never an exception: malformed tool calls (bad JSON, no
name, arguments not an object, a block cut off) come back in `ParsedAssistant.tool_calls`
with `error` set, and every problem is listed in `ParsedAssistant.errors`, for the agent
loop to return to the model as tool errors. Malformed *messages* from a user or API client
raise `MessageError`.

Self-summarization (Composer 2 report, section 4): at a token trigger the loop appends
`summary_request_message()`; the assistant's answer is the summary; the next generation
starts from `summarized_context(messages, summary)` = system + first user message (the
task) + one user message carrying the summary.

Any str encodes: a lone surrogate (not text; JSON can spell one, and Python's os functions
make one from a file name that is not UTF-8) is encoded, and rendered, as U+FFFD rather
than raising, so a message can never end a rollout. (The tool harness already shows such
bytes as `\\xNN` escapes; this is the last line of defence.)

Left out: images and other non-text content parts; Jinja chat templates (encode with this
module instead); a separate special token for summaries (plain user turns suffice).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from opencomposer.errors import MessageError
from opencomposer.model.tokenizer import (
    ASSISTANT, BOS, END, EOS, SPECIAL_TOKENS, SYSTEM, THINK, THINK_END, TOOL, TOOL_CALL, TOOL_CALL_END, USER,
    Tokenizer,
)

ROLE_TOKENS = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT, "tool": TOOL}
_ROLE_OF_TOKEN = {v: k for k, v in ROLE_TOKENS.items()}

TOOLS_HEADER = (
    "# Tools\n\n"
    "You may call the tools below. To call one, write a tool-call block holding a JSON object "
    '{"name": <tool name>, "arguments": <JSON object>}; consecutive blocks run in parallel. '
    "Each result comes back in a tool turn, in the order of the calls. "
    "The tools, one JSON schema per line:\n"
)

SUMMARY_REQUEST = (
    "Your context is nearly full: this conversation will be replaced by the summary you write now. "
    "Summarize your work on the task so that you can continue from the summary alone: the task, "
    "what you found (files, functions, causes), what you changed, what you verified, and what remains "
    "to be done and how. Be concise: at most about {max_words} words. Do not call tools."
)
SUMMARY_PREFIX = (
    "Your earlier context was replaced by this summary of your work on the task above. "
    "Continue the task from here.\n\n"
)


@dataclass
class ChatToolCall:
    """One tool call. `arguments` is the JSON text of the arguments object, as written.

    `error` is set when the model wrote a malformed call (then `name`/`arguments` hold what
    could be recovered); `raw` is the exact text between the tool-call tokens when the call
    was parsed from model output, so that re-encoding reproduces it even if its JSON is
    spaced differently from the canonical ``{"name": ..., "arguments": ...}``.
    """

    id: str
    name: str
    arguments: str
    error: str | None = None
    raw: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def text(self) -> str:
        """What goes between <|tool_call|> and <|/tool_call|>."""
        if self.raw is not None:
            return self.raw
        return _canonical_call(self.name, self.arguments)

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _canonical_call(name: str, arguments: str) -> str:
    return '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ' + arguments + "}"


@dataclass
class Message:
    """A chat message. `thinking` and `tool_calls` are for assistant messages; `name` (the
    tool's name) and `tool_call_id` for tool messages. OpenAI-format dicts convert with
    `from_openai` / `to_openai` (thinking is OpenAI's ``reasoning_content``)."""

    role: str
    content: str = ""
    thinking: str | None = None
    tool_calls: list[ChatToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None

    def __post_init__(self):
        if self.role not in ROLE_TOKENS:
            raise MessageError(f"message role {self.role!r} is not one of system, user, assistant, tool")
        if not isinstance(self.content, str):
            raise MessageError(f"message content must be a string, got {type(self.content).__name__}")
        self.tool_calls = [_as_tool_call(c, i) for i, c in enumerate(self.tool_calls)]

    @classmethod
    def from_openai(cls, d: dict) -> "Message":
        if not isinstance(d, dict):
            raise MessageError(f"a message must be a dict with 'role' and 'content', got {type(d).__name__}")
        role = "system" if d.get("role") == "developer" else d.get("role")
        thinking = d.get("reasoning_content")
        if thinking is not None and not isinstance(thinking, str):
            raise MessageError("'reasoning_content' must be a string")
        calls = d.get("tool_calls") or []
        if calls and role != "assistant":
            raise MessageError(f"only assistant messages may carry tool_calls, not {role!r}")
        return cls(role=role, content=_content_text(d.get("content")), thinking=thinking, tool_calls=list(calls),
                   tool_call_id=d.get("tool_call_id"), name=d.get("name"))

    def to_openai(self) -> dict:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.role == "assistant":
            if self.tool_calls:
                d["tool_calls"] = [c.to_openai() for c in self.tool_calls]
                d["content"] = self.content or None
            if self.thinking is not None:
                d["reasoning_content"] = self.thinking
        if self.role == "tool":
            d["tool_call_id"] = self.tool_call_id
            d["name"] = self.name
        return d


def _content_text(content: Any) -> str:
    """OpenAI content: a string, null, or a list of {"type": "text", "text": ...} parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise MessageError("message content must be a string or a list of text parts; images and other parts "
                       "are not supported")


def _as_tool_call(c: Any, index: int) -> ChatToolCall:
    """Accepts OpenAI tool-call dicts, ChatToolCall, and objects with id/name/arguments
    (the harness's ToolCall). Dict arguments are serialised as JSON; empty ones become {}."""
    if isinstance(c, ChatToolCall):
        return c
    if isinstance(c, dict):
        fn = c.get("function", c)
        if not isinstance(fn, dict):
            raise MessageError("a tool call's 'function' must be an object with 'name' and 'arguments'")
        call_id, name, args = c.get("id"), fn.get("name"), fn.get("arguments")
    else:
        call_id, name, args = getattr(c, "id", None), getattr(c, "name", None), getattr(c, "arguments", None)
    if not isinstance(name, str) or not name:
        raise MessageError(f"tool call {index} has no function name")
    if isinstance(args, dict):
        args = json.dumps(args, ensure_ascii=False)
    elif args is None or (isinstance(args, str) and not args.strip()):
        args = "{}"
    elif not isinstance(args, str):
        raise MessageError(f"tool call {name!r}: arguments must be a JSON string or an object")
    return ChatToolCall(id=call_id or f"call_{index}", name=name, arguments=args)


def as_message(m: Message | dict) -> Message:
    return m if isinstance(m, Message) else Message.from_openai(m)


# ----------------------------------------------------------------------------- rendering

def render_tools(tools: Sequence[dict]) -> str:
    """The tools section of the system turn. Accepts OpenAI tools ({"type": "function",
    "function": {...}}) or bare function schemas ({"name", "description", "parameters"})."""
    lines = []
    for t in tools:
        fn = t.get("function", t) if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise MessageError(f"a tool must be a function schema with a 'name', got {t!r}")
        lines.append(json.dumps(fn, ensure_ascii=False))
    return TOOLS_HEADER + "\n".join(lines)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _text(s: str) -> str:
    """`s` with each lone surrogate replaced by U+FFFD (the tokenizer cannot encode one)."""
    return s if s.isascii() else _SURROGATE.sub("\ufffd", s)


def _turn_parts(m: Message, tools: Sequence[dict] | None = None) -> list[tuple[bool, str]]:
    """A turn as (is_special, string) pieces. Text pieces are encoded separately, so no BPE
    merge crosses a special token and each piece encodes the same wherever it stands."""
    parts: list[tuple[bool, str]] = [(True, ROLE_TOKENS[m.role])]
    if m.role == "system":
        text = m.content
        if tools:
            text = (text + "\n\n" if text else "") + render_tools(tools)
        parts.append((False, text))
    elif m.role == "assistant":
        if m.thinking is not None:
            parts += [(True, THINK), (False, m.thinking), (True, THINK_END)]
        parts.append((False, m.content))
        for call in m.tool_calls:
            parts += [(True, TOOL_CALL), (False, call.text()), (True, TOOL_CALL_END)]
    elif m.role == "tool":
        parts.append((False, f"{m.name or ''}\n{m.content}"))
    else:
        parts.append((False, m.content))
    parts.append((True, END))
    return [(special, s if special else _text(s)) for special, s in parts if special or s]


def encode_turn(tok: Tokenizer, message: Message | dict, tools: Sequence[dict] | None = None) -> list[int]:
    """Ids of one message's turn, from its role token to its <|im_end|> (tools: system only)."""
    ids: list[int] = []
    for is_special, s in _turn_parts(as_message(message), tools):
        ids += [tok.special_id(s)] if is_special else tok.encode(s)
    return ids


def _prepare(messages: Iterable[Message | dict], tools: Sequence[dict] | None) -> list[Message]:
    """Normalise messages; put the tools into a system turn (adding one if needed); give
    tool messages without a name the name of the call they answer."""
    msgs = [as_message(m) for m in messages]
    if tools and (not msgs or msgs[0].role != "system"):
        msgs.insert(0, Message(role="system"))
    names: dict[str, str] = {}
    out = []
    for m in msgs:
        if m.role == "assistant":
            names.update((c.id, c.name) for c in m.tool_calls)
        if m.role == "tool" and not m.name and m.tool_call_id in names:
            m = Message(role="tool", content=m.content, tool_call_id=m.tool_call_id, name=names[m.tool_call_id])
        out.append(m)
    return out


def encode_messages(tok: Tokenizer, messages: Iterable[Message | dict], tools: Sequence[dict] | None = None,
                    add_generation_prompt: bool = False) -> list[int]:
    """``[bos] + encode_turn(m0, tools) + encode_turn(m1) + ...`` (+ ``[<|assistant|>]``)."""
    ids = [tok.special_id(BOS)]
    for i, m in enumerate(_prepare(messages, tools)):
        ids += encode_turn(tok, m, tools if i == 0 else None)
    return ids + (generation_prompt_ids(tok) if add_generation_prompt else [])


def encode_with_mask(tok: Tokenizer, messages: Iterable[Message | dict],
                     tools: Sequence[dict] | None = None) -> tuple[list[int], list[int]]:
    """Ids and a loss mask for SFT: 1 on what the model generates in assistant turns (after
    the role token, up to and including <|im_end|>), 0 elsewhere."""
    ids, mask = [tok.special_id(BOS)], [0]
    for i, m in enumerate(_prepare(messages, tools)):
        turn = encode_turn(tok, m, tools if i == 0 else None)
        ids += turn
        mask += [0] + [int(m.role == "assistant")] * (len(turn) - 1)
    return ids, mask


def render_messages(messages: Iterable[Message | dict], tools: Sequence[dict] | None = None,
                    add_generation_prompt: bool = False) -> str:
    """The conversation as text, special tokens written as their strings: for reading and
    logs. (Encode with `encode_messages`: text that contains special strings is ambiguous.)"""
    msgs = _prepare(messages, tools)
    text = BOS + "".join(s for i, m in enumerate(msgs) for _, s in _turn_parts(m, tools if i == 0 else None))
    return text + (ASSISTANT if add_generation_prompt else "")


def generation_prompt_ids(tok: Tokenizer) -> list[int]:
    """What opens an assistant turn; the engine generates after it."""
    return [tok.special_id(ASSISTANT)]


def stop_token_ids(tok: Tokenizer) -> list[int]:
    """Ids the engine should stop on: <|im_end|> ends a turn; <|endoftext|> is what a base
    model emits at a document's end."""
    return [tok.special_id(END), tok.special_id(EOS)]


def finish_generated(tok: Tokenizer, generated: Sequence[int]) -> list[int]:
    """The generated ids kept verbatim, with <|im_end|> appended if the generation did not end
    with it (cut off by max_tokens, or stopped on <|endoftext|>), so the next turn can follow.
    An appended <|im_end|> was not sampled: leave it out of the loss mask."""
    end = tok.special_id(END)
    return list(generated) if generated and generated[-1] == end else [*generated, end]


# ----------------------------------------------------------------------------- parsing

_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_TOKENS) + ")")


def _items(output: str | Sequence[int], tok: Tokenizer | None) -> list[tuple[bool, str]]:
    """(is_special, string) items: from ids exactly, or from text by matching special strings."""
    if isinstance(output, str):
        return [(bool(i % 2), s) for i, s in enumerate(_SPECIAL_RE.split(output)) if s]
    if tok is None:
        raise TypeError("parsing token ids needs the tokenizer: pass tok=")
    items: list[tuple[bool, str]] = []
    run: list[int] = []
    for t in output:
        if tok.is_special(t):
            if run:
                items.append((False, tok.decode(run)))
                run = []
            items.append((True, tok.id_to_token(t)))
        else:
            run.append(t)
    if run:
        items.append((False, tok.decode(run)))
    return items


@dataclass
class ParsedAssistant:
    """An assistant turn read back from model output.

    `tool_calls` holds every call in order, malformed ones with `error` set; `errors` lists
    every format problem; `finished` is False when the output did not reach <|im_end|>.
    """

    thinking: str | None
    content: str
    tool_calls: list[ChatToolCall]
    errors: list[str]
    finished: bool

    @property
    def valid_calls(self) -> list[ChatToolCall]:
        return [c for c in self.tool_calls if c.ok]

    @property
    def finish_reason(self) -> str:
        """OpenAI's finish_reason: 'length' if cut off, 'tool_calls' if any valid call, else 'stop'."""
        if not self.finished:
            return "length"
        return "tool_calls" if self.valid_calls else "stop"

    def to_message(self) -> Message:
        """The turn as a Message (all calls, with their raw text), for the conversation."""
        return Message(role="assistant", content=self.content, thinking=self.thinking,
                       tool_calls=list(self.tool_calls))

    def to_openai(self) -> dict:
        """The OpenAI chat-completion message: content (null when there are tool calls and no
        text), tool_calls with JSON-string arguments (valid calls only: OpenAI has no field
        for malformed ones; they are in `errors`), reasoning_content when the model thought."""
        return Message(role="assistant", content=self.content, thinking=self.thinking,
                       tool_calls=self.valid_calls).to_openai()


def parse_assistant(output: str | Sequence[int], tok: Tokenizer | None = None, *,
                    call_id_prefix: str = "call_") -> ParsedAssistant:
    """Parse generated output (ids, which need `tok`, or text), with or without the leading
    <|assistant|>. Never raises on bad model output. Call ids are ``call_id_prefix + index``:
    pass a prefix unique to the turn (e.g. ``f"call_{turn}_"``) where ids must be unique
    across a conversation."""
    items = _items(output, tok)
    if items and items[0] == (True, ASSISTANT):
        items = items[1:]
    return _parse_assistant_items(items, call_id_prefix)


def _parse_assistant_items(items: list[tuple[bool, str]], call_id_prefix: str) -> ParsedAssistant:
    thinking: str | None = None
    content: list[str] = []
    calls: list[ChatToolCall] = []
    errors: list[str] = []
    state, buf, finished = "body", "", False

    def close_call(error: str | None = None) -> None:
        call = _parse_call(buf, f"{call_id_prefix}{len(calls)}", error)
        calls.append(call)
        if call.error:
            errors.append(f"tool call {len(calls) - 1}: {call.error}")

    for special, s in items:
        if finished:
            errors.append("output continues after <|im_end|>; the rest was ignored")
            break
        if state == "think":
            if not special:
                thinking += s
                continue
            state = "body"
            if s == THINK_END:
                continue
            errors.append(f"thinking segment not closed with {THINK_END} before {s}")
        elif state == "call":
            if not special:
                buf += s
                continue
            state = "body"
            if s == TOOL_CALL_END:
                close_call()
                continue
            close_call(f"not closed with {TOOL_CALL_END} before {s}")
        # body state
        if not special:
            if not calls or s.strip():  # whitespace between or after calls is not content
                content.append(s)
        elif s == THINK:
            if thinking is not None or content or calls:
                errors.append(f"{THINK} must open the turn, once; this thinking was appended to the first")
            thinking, state = thinking or "", "think"
        elif s == TOOL_CALL:
            state, buf = "call", ""
        elif s == END:
            finished = True
        else:
            errors.append(f"unexpected special token {s} in an assistant turn (ignored)")
    if state == "call":
        close_call(f"cut off before {TOOL_CALL_END}")
    return ParsedAssistant(thinking=thinking, content="".join(content), tool_calls=calls,
                           errors=errors, finished=finished)


_NAME_RE = re.compile(r'"name"\s*:\s*"([^"\\]*)"')


def _parse_call(raw: str, call_id: str, error: str | None = None) -> ChatToolCall:
    """A tool-call block's text -> ChatToolCall; on any problem, `error` says what, so the
    model can be told. Arguments keep their exact text when the block is canonical."""
    name_match = _NAME_RE.search(raw)
    bad = ChatToolCall(id=call_id, name=name_match.group(1) if name_match else "", arguments="", raw=raw)
    if error:
        bad.error = error
        return bad
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        bad.error = f"not valid JSON ({exc.msg} at character {exc.pos})"
        return bad
    if not isinstance(obj, dict):
        bad.error = 'must be a JSON object {"name": ..., "arguments": {...}}'
        return bad
    name, args = obj.get("name"), obj.get("arguments")
    if not isinstance(name, str) or not name:
        bad.error = "missing 'name' (a non-empty string)"
        return bad
    if not isinstance(args, dict):
        bad.error = ("missing 'arguments'" if args is None else
                     f"'arguments' must be a JSON object, not {type(args).__name__}")
        return bad
    arguments = json.dumps(args, ensure_ascii=False)
    prefix = _canonical_call(name, "")[:-1]
    if raw.startswith(prefix) and raw.endswith("}"):
        exact = raw[len(prefix):-1]
        try:
            if json.loads(exact) == args:
                arguments = exact
        except json.JSONDecodeError:
            pass
    return ChatToolCall(id=call_id, name=name, arguments=arguments, raw=raw)


def parse_conversation(output: str | Sequence[int], tok: Tokenizer | None = None
                       ) -> tuple[list[Message], list[dict] | None]:
    """Read a whole conversation (ids or text) back into messages and the tool list.

    Inverse of `encode_messages` / `render_messages`, for trajectory viewers and turning
    trajectories into SFT data. Call ids are ``call_{turn}_{index}``; tool messages get the
    id of the call they answer, by order. A trailing empty generation prompt is dropped.
    """
    items = _items(output, tok)
    if items and items[0] == (True, BOS):
        items = items[1:]
    messages: list[Message] = []
    tools: list[dict] | None = None
    pending: list[ChatToolCall] = []  # calls still waiting for their tool turn
    i = 0
    while i < len(items):
        special, s = items[i]
        if not special or s not in _ROLE_OF_TOKEN:
            raise MessageError(f"expected a role token at item {i}, found {s[:40]!r}")
        role = _ROLE_OF_TOKEN[s]
        j = i + 1
        while j < len(items) and items[j] != (True, END):
            j += 1
        body = items[i + 1:j + 1]  # includes <|im_end|> when present
        i = j + 1
        if role == "assistant":
            if not body:
                break  # the generation prompt of an unfinished conversation
            parsed = _parse_assistant_items(body, f"call_{len(messages)}_")
            messages.append(parsed.to_message())
            pending = list(parsed.tool_calls)
            continue
        text = "".join(t for sp, t in body if not sp)
        if role == "system" and TOOLS_HEADER in text:
            text, _, schemas = text.partition(TOOLS_HEADER)
            text = text[:-2] if text.endswith("\n\n") else text
            tools = [{"type": "function", "function": json.loads(line)} for line in schemas.split("\n") if line]
        if role == "tool":
            name, _, text = text.partition("\n")
            call = pending.pop(0) if pending else None
            messages.append(Message(role="tool", content=text, name=name or None,
                                    tool_call_id=call.id if call else None))
        else:
            messages.append(Message(role=role, content=text))
    return messages, tools


# ----------------------------------------------------------------------------- tool results and summaries

def tool_result_message(result: Any) -> dict:
    """An OpenAI tool message from a harness ToolResult (call_id, name, ok, output, error):
    the output if ok, else "Error: ..." followed by any output."""
    if result.ok:
        content = result.output
    else:
        content = f"Error: {result.error}" + (f"\n{result.output}" if result.output else "")
    return {"role": "tool", "tool_call_id": result.call_id, "name": result.name, "content": content}


def summary_request_message(max_words: int = 700) -> dict:
    """The user message the loop appends when the context passes its trigger (Cursor reports
    summaries of about 1,000 tokens, hence the default of about 700 words)."""
    return {"role": "user", "content": SUMMARY_REQUEST.format(max_words=max_words)}


def summarized_context(messages: Sequence[Message | dict], summary: str) -> list[dict]:
    """The fresh context after a summary: the leading system message (if any), the first user
    message (the task), and a user message carrying the summary."""
    msgs = [as_message(m) for m in messages]
    head = msgs[:1] if msgs and msgs[0].role == "system" else []
    task = next((m for m in msgs if m.role == "user"), None)
    if task is None:
        raise MessageError("cannot build a summarized context: the conversation has no user message (the task)")
    return [m.to_openai() for m in (*head, task)] + [{"role": "user", "content": SUMMARY_PREFIX + summary}]
