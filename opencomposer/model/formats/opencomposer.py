"""opencomposer's own chat format: one structure token per role, thinking and tool call.

A conversation is ``<|bos|>`` followed by one block per message::

    <|system|>{system text}\\n\\n# Tools ... one JSON schema per line<|im_end|>
    <|user|>{text}<|im_end|>
    <|assistant|><|think|>{thinking}<|/think|>{text}<|tool_call|>{"name": "read", "arguments": {...}}<|/tool_call|><|im_end|>
    <|tool|>{tool name}\\n{result text}<|im_end|>

Every ``<|...|>`` above is one structure token, inserted by id; message text is encoded with
`Tokenizer.encode`, which never yields one, so a message that contains the string "<|im_end|>"
cannot close its turn. A turn's ids depend only on that message (and the tool list, for the system
turn): there is no separator between turns and nothing to close, so append-only is plain
concatenation. The engine generates after ``<|assistant|>``; for a well-formed generation (tokens
as `encode` would produce them, thinking first, text, then tool calls, then ``<|im_end|>``),
``encode_turn(parse_assistant(gen).to_message())`` gives back ``[<|assistant|>] + gen`` exactly, so
the OpenAI server path re-renders it unchanged. Thinking is kept in every turn.

Tool-call ids are not in the tokens: `parse_assistant` assigns them (``call_id_prefix`` + index)
and a tool turn is matched to its call by order. Malformed tool calls (bad JSON, no name, arguments
not an object, a block cut off) come back with `error` set, never raised.

The chat template (`chat_template`) renders the same ids in transformers, except for message text
holding an added token's string, which the template breaks with a zero-width space (U+200B) after
its first character so that transformers, which matches added tokens in the rendered string,
cannot turn it into structure (docs/chat-formats.md). vLLM has no parser for these tool calls:
`tool_parser` names the plugin in opencomposer/engine/vllm_tool_parser.py (`--tool-parser-plugin`).
"""

from __future__ import annotations

import json
from typing import Sequence

from opencomposer.errors import MessageError
from opencomposer.model.formats.base import (
    ChatToolCall, FormatBase, Message, ParsedAssistant, Piece, function_schema, parse_json_call,
)
from opencomposer.model.formats.template import escape_macro
from opencomposer.model.tokenizer import (
    ASSISTANT, BOS, END, EOS, SYSTEM, THINK, THINK_END, TOOL, TOOL_CALL, TOOL_CALL_END, USER,
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


class OpenComposerFormat(FormatBase):
    name = "opencomposer"
    structure_tokens = (BOS, END, SYSTEM, USER, ASSISTANT, TOOL, THINK, THINK_END, TOOL_CALL, TOOL_CALL_END)
    tool_parser = "opencomposer"
    end_token = END
    extra_stop_tokens = (EOS,)

    def bos_pieces(self) -> list[Piece]:
        return [(True, BOS)]

    def render_tools(self, tools: Sequence[dict]) -> str:
        """The tools section of the system turn: a header, then one function schema per line."""
        return TOOLS_HEADER + "\n".join(json.dumps(function_schema(t), ensure_ascii=False) for t in tools)

    def call_text(self, call: ChatToolCall) -> str:
        """What goes between <|tool_call|> and <|/tool_call|>: the call as generated, or canonical JSON."""
        return call.text()

    def turn_pieces(self, m: Message, tools: Sequence[dict] | None, previous_role: str | None) -> list[Piece]:
        parts: list[Piece] = [(True, ROLE_TOKENS[m.role])]
        if m.role == "system":
            text = m.content
            if tools:
                text = (text + "\n\n" if text else "") + self.render_tools(tools)
            parts.append((False, text))
        elif m.role == "assistant":
            if m.thinking is not None:
                parts += [(True, THINK), (False, m.thinking), (True, THINK_END)]
            parts.append((False, m.content))
            for call in m.tool_calls:
                parts += [(True, TOOL_CALL), (False, self.call_text(call)), (True, TOOL_CALL_END)]
        elif m.role == "tool":
            parts.append((False, f"{m.name or ''}\n{m.content}"))
        else:
            parts.append((False, m.content))
        parts.append((True, END))
        return [(special, s) for special, s in parts if special or s]

    def prompt_pieces(self, previous_role: str | None) -> list[Piece]:
        return [(True, ASSISTANT)]

    def parse_items(self, items: list[Piece], call_id_prefix: str, tools: Sequence[dict] | None) -> ParsedAssistant:
        thinking: str | None = None
        content: list[str] = []
        calls: list[ChatToolCall] = []
        errors: list[str] = []
        state, buf, finished = "body", "", False

        def close_call(error: str | None = None) -> None:
            call = parse_json_call(buf, f"{call_id_prefix}{len(calls)}", error)
            calls.append(call)
            if call.error:
                errors.append(f"tool call {len(calls) - 1}: {call.error}")

        for special, s in items:
            if finished:
                errors.append(f"output continues after {END}; the rest was ignored")
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

    def parse_conversation(self, output: str | Sequence[int]) -> tuple[list[Message], list[dict] | None]:
        """Read a whole conversation (ids or text) back into messages and the tool list. Call ids
        are ``call_{turn}_{index}``; tool messages get the id of the call they answer, by order."""
        items = self.items(output)
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
                parsed = self.parse_items(body, f"call_{len(messages)}_", None)
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

    def chat_template(self) -> str:
        """Jinja for transformers' apply_chat_template / vLLM's chat endpoint: the ids of
        `encode_messages` (module docstring for text holding added-token strings)."""
        header = json.dumps(TOOLS_HEADER)
        return escape_macro(self.tok) + (
            "{{- '" + BOS + "' }}"
            "{%- set ns = namespace(system=false) %}"
            "{%- if tools and (not messages or messages[0].role != 'system') %}"
            "{{- '" + SYSTEM + "' + " + header + " }}"
            "{%- for t in tools %}{{- esc((t.function if t.function is defined else t) | tojson) }}"
            "{%- if not loop.last %}{{- '\\n' }}{%- endif %}{%- endfor %}"
            "{{- '" + END + "' }}"
            "{%- endif %}"
            "{%- for m in messages %}"
            "{%- if m.role == 'system' or m.role == 'developer' %}"
            "{{- '" + SYSTEM + "' + esc(m.content or '') }}"
            "{%- if loop.first and tools %}{%- if m.content %}{{- '\\n\\n' }}{%- endif %}"
            "{{- " + header + " }}"
            "{%- for t in tools %}{{- esc((t.function if t.function is defined else t) | tojson) }}"
            "{%- if not loop.last %}{{- '\\n' }}{%- endif %}{%- endfor %}{%- endif %}"
            "{{- '" + END + "' }}"
            "{%- elif m.role == 'user' %}"
            "{{- '" + USER + "' + esc(m.content or '') + '" + END + "' }}"
            "{%- elif m.role == 'assistant' %}"
            "{{- '" + ASSISTANT + "' }}"
            "{%- if m.reasoning_content is defined and m.reasoning_content is not none %}"
            "{{- '" + THINK + "' + esc(m.reasoning_content) + '" + THINK_END + "' }}{%- endif %}"
            "{{- esc(m.content or '') }}"
            "{%- for c in (m.tool_calls or []) %}{%- set f = c.function if c.function is defined else c %}"
            "{{- '" + TOOL_CALL + "' + esc('{\"name\": ' + (f.name | tojson) + ', \"arguments\": '"
            " + (f.arguments if f.arguments is string else (f.arguments | tojson)) + '}') + '" + TOOL_CALL_END + "' }}"
            "{%- endfor %}"
            "{{- '" + END + "' }}"
            "{%- elif m.role == 'tool' %}"
            "{%- set ns.name = m.name if m.name is defined and m.name else '' %}"
            "{%- if not ns.name %}{%- for p in messages[:loop.index0] %}{%- for c in (p.tool_calls or []) %}"
            "{%- if c.id is defined and c.id == m.tool_call_id %}"
            "{%- set ns.name = (c.function.name if c.function is defined else c.name) %}"
            "{%- endif %}{%- endfor %}{%- endfor %}{%- endif %}"
            "{{- '" + TOOL + "' + esc(ns.name + '\\n' + (m.content or '')) + '" + END + "' }}"
            "{%- endif %}"
            "{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '" + ASSISTANT + "' }}{%- endif %}"
        )
