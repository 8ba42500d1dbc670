"""What every chat format shares: messages, tool calls, parsed turns, and the renderer's machinery.

A chat format (one class per format, opencomposer/model/formats/) turns messages into token ids and
generated ids back into messages. This module holds what does not depend on the format:

- the data: `Message` (OpenAI-convertible), `ChatToolCall` (malformed calls are data, with `error`
  set), `ParsedAssistant` (a generated turn read back);
- `ChatFormat`, the Protocol the engine, the harness, SFT and RL use (model/chat.py picks a format
  for a tokenizer: `get_format`);
- `FormatBase`, the machinery formats build on. A format describes a turn as *pieces*,
  ``(is_structure, string)`` pairs; structure pieces are inserted by id, text pieces are encoded
  with `Tokenizer.encode`, which never yields an added token, so message text can never become
  structure (no prompt injection). Adjacent text pieces are joined before encoding, so a turn
  tokenizes exactly as a chat template's rendered string does in transformers (which splits the
  string at added tokens and encodes each run between them).

Append-only with context: a turn may depend on the role of the message before it (ChatML groups
consecutive tool results into one user turn, so a tool result opens that turn only after a
non-tool message, and the turn is closed by whatever follows). ``encode_messages(m)`` is
``bos + turn(m0) + turn(m1 | m0) + ... + close(last)``, where ``close`` is what ends an open
group (nothing in opencomposer's format), and the generation prompt after ``m[:k]`` is
``close(m[k-1]) + open-assistant``; so the ids of a growing conversation only ever grow, and the
agent loop appends each turn as it happens. Generated ids are kept verbatim (`finish_generated`
appends only what the model did not sample: the turn end of a cut-off generation, and the
format's separator after it).

Any str encodes: a lone surrogate is encoded, and rendered, as U+FFFD rather than raising.
Left out: images and other non-text content parts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, Sequence

from opencomposer.errors import CheckpointError, MessageError
from opencomposer.model.tokenizer import Tokenizer

ROLES = ("system", "user", "assistant", "tool")
Piece = tuple[bool, str]  # (is a structure token, string)

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
        if self.role not in ROLES:
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
    (the harness's ToolCall). Dict arguments are serialised as JSON; empty ones become {}. A dict
    with string `raw` and `error` (a malformed call as harness.agent.message_dict stores it) keeps
    them, so a trajectory's messages render back to the ids the model generated."""
    if isinstance(c, ChatToolCall):
        return c
    if isinstance(c, dict):
        fn = c.get("function", c)
        if not isinstance(fn, dict):
            raise MessageError("a tool call's 'function' must be an object with 'name' and 'arguments'")
        call_id, name, args = c.get("id"), fn.get("name"), fn.get("arguments")
    else:
        call_id, name, args = getattr(c, "id", None), getattr(c, "name", None), getattr(c, "arguments", None)
    if isinstance(c, dict) and isinstance(c.get("raw"), str) and isinstance(c.get("error"), str):
        name = name if isinstance(name, str) else ""  # malformed: the name may be missing
    elif not isinstance(name, str) or not name:
        raise MessageError(f"tool call {index} has no function name")
    if isinstance(args, dict):
        args = json.dumps(args, ensure_ascii=False)
    elif args is None or (isinstance(args, str) and not args.strip()):
        args = "{}"
    elif not isinstance(args, str):
        raise MessageError(f"tool call {name!r}: arguments must be a JSON string or an object")
    raw, error = (c.get("raw"), c.get("error")) if isinstance(c, dict) else (None, None)
    if isinstance(raw, str) and isinstance(error, str):  # a malformed call as a trajectory stores it
        return ChatToolCall(id=call_id or f"call_{index}", name=name, arguments=args, error=error, raw=raw)
    return ChatToolCall(id=call_id or f"call_{index}", name=name, arguments=args)


def as_message(m: Message | dict) -> Message:
    return m if isinstance(m, Message) else Message.from_openai(m)


_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(s: str) -> str:
    """`s` with each lone surrogate replaced by U+FFFD (the tokenizer cannot encode one)."""
    return s if s.isascii() else _SURROGATE.sub("\ufffd", s)


def function_schema(tool: Any) -> dict:
    """The function schema of an OpenAI tool ({"type": "function", "function": {...}}) or of a
    bare schema ({"name", "description", "parameters"})."""
    fn = tool.get("function", tool) if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise MessageError(f"a tool must be a function schema with a 'name', got {tool!r}")
    return fn


def prepare(messages: Iterable[Message | dict], tools: Sequence[dict] | None) -> list[Message]:
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


@dataclass
class ParsedAssistant:
    """An assistant turn read back from model output.

    `tool_calls` holds every call in order, malformed ones with `error` set; `errors` lists
    every format problem; `finished` is False when the output did not reach the turn end.
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


def parse_json_call(raw: str, call_id: str, error: str | None = None) -> ChatToolCall:
    """A JSON tool call ``{"name": ..., "arguments": {...}}`` -> ChatToolCall; on any problem,
    `error` says what, so the model can be told. Arguments keep their exact text when the call
    is written canonically (so re-encoding reproduces it); `raw` is set by the caller's format."""
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
    stripped = raw.strip()
    if stripped.startswith(prefix) and stripped.endswith("}"):
        exact = stripped[len(prefix):-1]
        try:
            if json.loads(exact) == args:
                arguments = exact
        except json.JSONDecodeError:
            pass
    return ChatToolCall(id=call_id, name=name, arguments=arguments, raw=raw)


_NAME_RE = re.compile(r'"name"\s*:\s*"([^"\\]*)"')


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


# ----------------------------------------------------------------------------- the Protocol

class ChatFormat(Protocol):
    """A chat format bound to a tokenizer (see the module docstring and model/chat.py).

    name: the registry name (tokenizer_config.json "chat_format"); structure_tokens: the added
    tokens it needs; tool_parser: the vLLM ``--tool-call-parser`` that reads its tool calls.
    `previous_role` is the role of the message before the one rendered (None at the start).
    """

    name: str
    structure_tokens: tuple[str, ...]
    tool_parser: str
    call_hint: str
    tok: Tokenizer

    def bos_ids(self) -> list[int]: ...
    def encode_turn(self, message: Message | dict, tools: Sequence[dict] | None = None, *,
                    previous_role: str | None = None) -> list[int]: ...
    def generation_prompt_ids(self, previous_role: str | None = None) -> list[int]: ...
    def close_ids(self, last_role: str | None) -> list[int]: ...
    def stop_token_ids(self) -> list[int]: ...
    def finish_generated(self, generated: Sequence[int]) -> list[int]: ...
    def generated_ids(self, message: Message | dict) -> list[int]: ...
    def encode_messages(self, messages: Iterable[Message | dict], tools: Sequence[dict] | None = None,
                        add_generation_prompt: bool = False) -> list[int]: ...
    def encode_with_mask(self, messages: Iterable[Message | dict],
                         tools: Sequence[dict] | None = None) -> tuple[list[int], list[int]]: ...
    def render_messages(self, messages: Iterable[Message | dict], tools: Sequence[dict] | None = None,
                        add_generation_prompt: bool = False) -> str: ...
    def render_tools(self, tools: Sequence[dict]) -> str: ...
    def call_text(self, call: ChatToolCall) -> str: ...
    def parse_assistant(self, output: str | Sequence[int], *, call_id_prefix: str = "call_",
                        tools: Sequence[dict] | None = None) -> ParsedAssistant: ...
    def parse_conversation(self, output: str | Sequence[int]) -> tuple[list[Message], list[dict] | None]: ...
    def chat_template(self) -> str: ...


# ----------------------------------------------------------------------------- shared machinery

class FormatBase:
    """Pieces -> ids, ids -> items, and the conversation-level methods of `ChatFormat`, built on
    a subclass's pieces (`bos_pieces`, `turn_pieces`, `prompt_pieces`, `close_pieces`,
    `trailer_pieces`) and parser (`parse_items`, `parse_conversation`)."""

    name = ""
    structure_tokens: tuple[str, ...] = ()
    tool_parser = ""
    end_token = ""  # the token that ends a turn; generation stops on it
    call_hint = '{"name": <tool>, "arguments": {...}} as valid JSON'  # how to write a call (tool errors)
    extra_stop_tokens: tuple[str, ...] = ()  # other stops (a base model's end of text), when present

    def __init__(self, tok: Tokenizer):
        missing = [t for t in self.structure_tokens if t not in tok.special]
        if missing:
            raise CheckpointError(
                f"this tokenizer lacks the {self.name!r} chat format's structure tokens {missing}: give it "
                f"those added tokens (`opencomposer model new --format {self.name}`, or "
                f"model/vocab.py with_structure_tokens), or name the tokenizer's own format under "
                f"\"chat_format\" in tokenizer_config.json (docs/chat-formats.md)")
        self.tok = tok
        self.ids = {t: tok.special[t] for t in self.structure_tokens}
        self.end_id = self.ids[self.end_token]
        strings = sorted(self.structure_tokens, key=len, reverse=True)
        self._structure_re = re.compile("(" + "|".join(re.escape(s) for s in strings) + ")")

    # --- subclass hooks (defaults: a format without context between turns)

    def bos_pieces(self) -> list[Piece]:
        return []

    def turn_pieces(self, m: Message, tools: Sequence[dict] | None, previous_role: str | None) -> list[Piece]:
        raise NotImplementedError

    def prompt_pieces(self, previous_role: str | None) -> list[Piece]:
        raise NotImplementedError

    def close_pieces(self, last_role: str | None) -> list[Piece]:
        return []

    def trailer_pieces(self) -> list[Piece]:
        """What follows the turn end of an assistant turn, not generated (a separator)."""
        return []

    # --- pieces and ids

    def pieces_ids(self, pieces: Sequence[Piece]) -> list[int]:
        """Ids of pieces: structure by id, each run of adjacent text pieces encoded as one string."""
        ids: list[int] = []
        run: list[str] = []
        for special, s in pieces:
            if special:
                if run:
                    ids += self.tok.encode(clean_text("".join(run)))
                    run = []
                ids.append(self.ids[s] if s in self.ids else self.tok.special_id(s))
            elif s:
                run.append(s)
        if run:
            ids += self.tok.encode(clean_text("".join(run)))
        return ids

    def items(self, output: str | Sequence[int]) -> list[Piece]:
        """(is_structure, string) items of output: from ids exactly (every added token is one
        item), or from text by matching the format's structure strings."""
        if isinstance(output, str):
            return [(bool(i % 2), s) for i, s in enumerate(self._structure_re.split(output)) if s]
        items: list[Piece] = []
        run: list[int] = []
        for t in output:
            if self.tok.is_special(t):
                if run:
                    items.append((False, self.tok.decode(run)))
                    run = []
                items.append((True, self.tok.id_to_token(t)))
            else:
                run.append(t)
        if run:
            items.append((False, self.tok.decode(run)))
        return items

    # --- ChatFormat

    def bos_ids(self) -> list[int]:
        return self.pieces_ids(self.bos_pieces())

    def encode_turn(self, message: Message | dict, tools: Sequence[dict] | None = None, *,
                    previous_role: str | None = None) -> list[int]:
        return self.pieces_ids(self.turn_pieces(as_message(message), tools, previous_role))

    def generation_prompt_ids(self, previous_role: str | None = None) -> list[int]:
        return self.pieces_ids(self.prompt_pieces(previous_role))

    def close_ids(self, last_role: str | None) -> list[int]:
        return self.pieces_ids(self.close_pieces(last_role))

    def stop_token_ids(self) -> list[int]:
        """The turn end, then any extra stop the tokenizer has (a base model's end of text)."""
        return [self.end_id] + [self.tok.special[t] for t in self.extra_stop_tokens if t in self.tok.special]

    def finish_generated(self, generated: Sequence[int]) -> list[int]:
        """The generated ids kept verbatim, then what the model did not sample: the turn end if the
        generation did not end with it (cut off, or stopped on end-of-text), and the format's
        separator. Leave the appended ids out of the loss mask."""
        trailer = self.pieces_ids(self.trailer_pieces())
        if generated and generated[-1] == self.end_id:
            return [*generated, *trailer]
        return [*generated, self.end_id, *trailer]

    def generated_ids(self, message: Message | dict) -> list[int]:
        """The ids a model generates for this assistant message: after the generation prompt, up to
        and including the turn end (for scripted engines and tests)."""
        turn = self.encode_turn(message)
        trailer = len(self.pieces_ids(self.trailer_pieces()))
        return turn[len(self.generation_prompt_ids()):len(turn) - trailer]

    def _turns(self, messages, tools) -> Iterable[tuple[Message, list[int], str | None]]:
        previous = None
        for i, m in enumerate(prepare(messages, tools)):
            yield m, self.encode_turn(m, tools if i == 0 else None, previous_role=previous), previous
            previous = m.role

    def encode_messages(self, messages: Iterable[Message | dict], tools: Sequence[dict] | None = None,
                        add_generation_prompt: bool = False) -> list[int]:
        """``bos + turn(m0, tools) + turn(m1 | m0) + ...``, then the generation prompt or the close."""
        ids, last = self.bos_ids(), None
        for m, turn, _ in self._turns(messages, tools):
            ids += turn
            last = m.role
        return ids + (self.generation_prompt_ids(last) if add_generation_prompt else self.close_ids(last))

    def encode_with_mask(self, messages: Iterable[Message | dict],
                         tools: Sequence[dict] | None = None) -> tuple[list[int], list[int]]:
        """Ids and a loss mask for SFT: 1 on what the model generates in assistant turns (after the
        generation prompt, up to and including the turn end), 0 elsewhere."""
        ids = self.bos_ids()
        mask = [0] * len(ids)
        trailer = len(self.pieces_ids(self.trailer_pieces()))
        last = None
        for m, turn, previous in self._turns(messages, tools):
            ids += turn
            if m.role == "assistant":
                head = len(self.generation_prompt_ids(previous))
                mask += [0] * head + [1] * (len(turn) - head - trailer) + [0] * trailer
            else:
                mask += [0] * len(turn)
            last = m.role
        close = self.close_ids(last)
        return ids + close, mask + [0] * len(close)

    def render_messages(self, messages: Iterable[Message | dict], tools: Sequence[dict] | None = None,
                        add_generation_prompt: bool = False) -> str:
        """The conversation as text, structure tokens written as their strings: for reading and
        logs (encode with `encode_messages`: text that contains structure strings is ambiguous)."""
        pieces = list(self.bos_pieces())
        previous = None
        for i, m in enumerate(prepare(messages, tools)):
            pieces += self.turn_pieces(m, tools if i == 0 else None, previous)
            previous = m.role
        pieces += self.prompt_pieces(previous) if add_generation_prompt else self.close_pieces(previous)
        return "".join(s if special else clean_text(s) for special, s in pieces)

    def parse_assistant(self, output: str | Sequence[int], *, call_id_prefix: str = "call_",
                        tools: Sequence[dict] | None = None) -> ParsedAssistant:
        """Parse generated output (ids or text), with or without the generation prompt before it.
        Never raises on bad model output. Call ids are ``call_id_prefix + index``."""
        return self.parse_items(self.strip_prompt(self.items(output)), call_id_prefix, tools)

    def strip_prompt(self, items: list[Piece]) -> list[Piece]:
        prompt = [p for p in self.prompt_pieces(None) if p[1]]
        n = len(prompt)
        if items[:n] == prompt:
            return items[n:]
        return items

    def parse_items(self, items: list[Piece], call_id_prefix: str,
                    tools: Sequence[dict] | None) -> ParsedAssistant:
        raise NotImplementedError
