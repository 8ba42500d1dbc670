"""Chat formats: messages <-> token ids, tool calls, and the model's output parsed back.

The engine, the harness's agent loop, the OpenAI server, SFT and RL all render and parse through
the format of their tokenizer: ``get_format(tok)`` (cached per tokenizer object) picks the class
named by ``tok.chat_format`` (tokenizer_config.json "chat_format"; absent: "opencomposer") from
`FORMATS`:

| name | turns | tool calls | vLLM tool parser | module |
|---|---|---|---|---|
| opencomposer | a structure token per role, ``<|im_end|>`` | JSON between ``<|tool_call|>`` tokens | "opencomposer" (a plugin, not provided here) | formats/opencomposer.py |
| qwen3 | ChatML, ``<think>`` blocks | Hermes JSON in ``<tool_call>`` | hermes | formats/chatml.py |
| qwen3_coder | ChatML, ``<think>`` blocks | XML ``<function=..><parameter=..>`` in ``<tool_call>`` | qwen3_coder | formats/chatml.py |

A format (`ChatFormat`, formats/base.py) resolves its structure tokens to ids by name when it is
made and raises CheckpointError naming the missing ones and the fix; it renders a turn to ids
append-only (adding turns never changes earlier ids), gives the generation prompt and the stop
ids, parses generated ids into thinking, text and tool calls (malformed calls as data with
`error` set, never raised: the agent loop returns them to the model as tool errors), lists the
tools in the system turn, renders tool results and the self-summarization turns (plain user
turns: `summary_request_message`, `summarized_context`), gives SFT's ids and loss mask, reads a
whole conversation back, and writes its Jinja chat template for transformers and vLLM. Message
text never becomes a structure token, in any format (text is encoded with `Tokenizer.encode`,
which never yields an added token).

The functions below are the format-agnostic entry points with the signatures callers have always
used; each dispatches to ``get_format(tok)``. Where a turn depends on the one before it (ChatML
groups consecutive tool results into one user turn), pass ``previous_role``. Parsing *text*
without a tokenizer reads opencomposer's format (its structure strings are unambiguous there).

Adding a format: a class in formats/ (FormatBase gives the conversation-level methods from a
format's pieces and parser), an entry in `FORMATS`, and the property tests of
tests/model/test_chat_formats.py (docs/chat-formats.md).
"""

from __future__ import annotations

import weakref
from typing import Iterable, Sequence

from opencomposer.errors import ConfigError
from opencomposer.model.formats.base import (  # noqa: F401  (the data types, re-exported)
    ROLES, SUMMARY_PREFIX, SUMMARY_REQUEST, ChatFormat, ChatToolCall, FormatBase, Message, ParsedAssistant,
    as_message, summarized_context, summary_request_message, tool_result_message,
)
from opencomposer.model.formats.chatml import Qwen3CoderFormat, Qwen3Format
from opencomposer.model.formats.opencomposer import ROLE_TOKENS, TOOLS_HEADER, OpenComposerFormat  # noqa: F401
from opencomposer.model.tokenizer import Tokenizer, bundled_tokenizer

FORMATS: dict[str, type] = {
    "opencomposer": OpenComposerFormat,
    "qwen3": Qwen3Format,
    "qwen3_coder": Qwen3CoderFormat,
}

_CACHE: "weakref.WeakKeyDictionary[Tokenizer, tuple[str, ChatFormat]]" = weakref.WeakKeyDictionary()


def format_class(name: str) -> type:
    """The class of chat format `name`; ConfigError listing the known names for any other."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ConfigError(f"unknown chat format {name!r}; known formats: {', '.join(FORMATS)} (set "
                          f"\"chat_format\" in the tokenizer's tokenizer_config.json to one of them)") from None


def get_format(tok: Tokenizer) -> ChatFormat:
    """The chat format of `tok` (its `chat_format`), made once per tokenizer object."""
    name = tok.chat_format
    cached = _CACHE.get(tok)
    if cached is not None and cached[0] == name:
        return cached[1]
    fmt = format_class(name)(tok)
    _CACHE[tok] = (name, fmt)
    return fmt


def _text_format(tok: Tokenizer | None) -> ChatFormat:
    return get_format(tok if tok is not None else bundled_tokenizer())


# ----------------------------------------------------------------------------- the entry points

def render_tools(tools: Sequence[dict], tok: Tokenizer | None = None) -> str:
    """The tools section of the system turn (opencomposer's format without `tok`)."""
    return _text_format(tok).render_tools(tools)


def encode_turn(tok: Tokenizer, message: Message | dict, tools: Sequence[dict] | None = None, *,
                previous_role: str | None = None) -> list[int]:
    """Ids of one message's turn (tools: system only), after a message of `previous_role`."""
    return get_format(tok).encode_turn(message, tools, previous_role=previous_role)


def encode_messages(tok: Tokenizer, messages: Iterable[Message | dict], tools: Sequence[dict] | None = None,
                    add_generation_prompt: bool = False) -> list[int]:
    """The conversation's ids: bos, each turn, then the generation prompt or what closes the last turn."""
    return get_format(tok).encode_messages(messages, tools, add_generation_prompt)


def encode_with_mask(tok: Tokenizer, messages: Iterable[Message | dict],
                     tools: Sequence[dict] | None = None) -> tuple[list[int], list[int]]:
    """Ids and a loss mask for SFT: 1 on what the model generates in assistant turns, 0 elsewhere."""
    return get_format(tok).encode_with_mask(messages, tools)


def render_messages(messages: Iterable[Message | dict], tools: Sequence[dict] | None = None,
                    add_generation_prompt: bool = False, *, tok: Tokenizer | None = None) -> str:
    """The conversation as text, structure tokens as their strings (for reading and logs)."""
    return _text_format(tok).render_messages(messages, tools, add_generation_prompt)


def generation_prompt_ids(tok: Tokenizer, previous_role: str | None = None) -> list[int]:
    """What opens an assistant turn after a message of `previous_role`; the engine generates after it."""
    return get_format(tok).generation_prompt_ids(previous_role)


def stop_token_ids(tok: Tokenizer) -> list[int]:
    """Ids the engine stops on: the turn end first, then end-of-text when the tokenizer has it."""
    return get_format(tok).stop_token_ids()


def finish_generated(tok: Tokenizer, generated: Sequence[int]) -> list[int]:
    """The generated ids verbatim, plus what the model did not sample (a missing turn end, the
    format's separator after it): leave the appended ids out of the loss mask."""
    return get_format(tok).finish_generated(generated)


def parse_assistant(output: str | Sequence[int], tok: Tokenizer | None = None, *, call_id_prefix: str = "call_",
                    tools: Sequence[dict] | None = None) -> ParsedAssistant:
    """Parse generated output (ids, which need `tok`, or text), with or without the generation
    prompt. Never raises on bad model output. Call ids are ``call_id_prefix + index``; `tools`
    types the arguments of formats that write them untyped (qwen3_coder)."""
    if not isinstance(output, str) and tok is None:
        raise TypeError("parsing token ids needs the tokenizer: pass tok=")
    return _text_format(tok).parse_assistant(output, call_id_prefix=call_id_prefix, tools=tools)


def parse_conversation(output: str | Sequence[int], tok: Tokenizer | None = None
                       ) -> tuple[list[Message], list[dict] | None]:
    """Read a whole conversation (ids or text) back into messages and the tool list: the inverse of
    `encode_messages`, for trajectory viewers and turning trajectories into SFT data."""
    if not isinstance(output, str) and tok is None:
        raise TypeError("parsing token ids needs the tokenizer: pass tok=")
    return _text_format(tok).parse_conversation(output)
