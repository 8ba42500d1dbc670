"""Qwen3's chat formats: ChatML turns, ``<think>`` blocks, tool calls in ``<tool_call>`` tags.

Written from the formats' public descriptions (Qwen3's and Qwen3-Coder's chat templates, vLLM's
``hermes`` and ``qwen3_coder`` tool-call parsers). Every turn is
``<|im_start|>{role}\\n{text}<|im_end|>\\n``; an assistant turn is::

    <|im_start|>assistant\\n<think>\\n{thinking}\\n</think>\\n\\n{text}{calls}<|im_end|>\\n

and the two formats differ in their calls and their tool listing:

- ``qwen3`` (Qwen3, vLLM parser "hermes"): each call is ``<tool_call>\\n{"name": ..., "arguments":
  {...}}\\n</tool_call>``, after a newline when text or another call precedes it; the system turn
  lists the tools as JSON lines inside ``<tools></tools>`` with Qwen3's instructions; tool results
  are ``\\n<tool_response>\\n{result}\\n</tool_response>``, consecutive results in one user turn.
- ``qwen3_coder`` (Qwen3-Coder, vLLM parser "qwen3_coder"): each call is ``<tool_call>\\n
  <function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>`` (string
  values raw, others as JSON; "\\n\\n" between text and the first call, "\\n" between calls); the
  tools are listed in Qwen3-Coder's XML (``<function><name>...<parameters><parameter>...``) with
  its instructions; tool results are ``<tool_response>\\n{result}\\n</tool_response>\\n``. Argument
  values are typed back by the tool's schema (an integer parameter's "5" is 5), so
  `parse_assistant` takes the tools; a value that does not fit its declared type is a malformed
  call. A string value holding "\\n</parameter>\\n<parameter=" or "\\n</parameter>\\n</function>"
  cannot be told from the call's structure: it is read as the structure (ids are kept anyway).

Where these formats differ from the models' own templates, and why (RL trains on generated ids
verbatim and needs rendering to be append-only):

- Thinking is rendered in every assistant turn. Qwen3's template drops the thinking of turns
  before the last user query and strips newlines around thinking and text, so its rendering of a
  conversation is not a prefix of its rendering of the conversation extended; here it is.
  Qwen3-Coder's template has no thinking at all; here an assistant message with thinking renders
  Qwen3's block, and one without renders none (as in Qwen3-Coder).
- Text is never stripped or trimmed (Qwen3-Coder trims text before calls and descriptions in the
  listing: descriptions are still trimmed here, text is not), and no default system prompt is
  added (Qwen3-Coder's template adds one when tools come without a system message).
- The newline after ``<|im_end|>`` is part of the turn, as in the templates; the model stops at
  ``<|im_end|>``, so `finish_generated` appends that newline (not sampled: loss mask 0) and the
  next turn follows it. Generated ids are kept verbatim: the trajectory RL trains on is the
  prompt's ids, the sampled ids, then the appended ones.
- A group of tool results is closed (``<|im_end|>\\n``) by what follows it: the next non-tool
  turn, the generation prompt, or the end of the conversation (FormatBase's close).

Exactness: text between structure tokens is encoded as one run (as transformers does with the
rendered template), so the generation prompt ``<|im_start|>assistant\\n`` and the turn's first
text share a run: ``encode_turn(parse(gen))`` equals ``prompt + gen`` when the model's ids are
the canonical encoding and its text does not start with a newline (Qwen's pre-tokenizer joins
``\\n\\n``). Token ids generated otherwise are still kept verbatim by the agent loop.

`chat_template()` is the Jinja that renders the same ids in transformers (tests/model/
test_chat_formats.py), message text passed through template.py's `esc`. The qwen3_coder template
needs tool-call arguments as objects (vLLM's chat endpoint parses them before rendering; pass
dicts to transformers). Not covered: images, ``enable_thinking`` (the model decides), tool_choice.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from opencomposer.errors import MessageError
from opencomposer.model.formats.base import (
    ChatToolCall, FormatBase, Message, ParsedAssistant, Piece, function_schema, parse_json_call,
)
from opencomposer.model.formats.template import escape_macro, lit

IM_START, IM_END, EOT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
THINK, THINK_END = "<think>", "</think>"
TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"
NL = (False, "\n")


class ChatMLFormat(FormatBase):
    """What Qwen3 and Qwen3-Coder share; subclasses write the calls and the tool listing."""

    structure_tokens = (IM_START, IM_END, THINK, THINK_END, TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE,
                        TOOL_RESPONSE_END)
    end_token = IM_END
    extra_stop_tokens = (EOT,)
    tools_header = ""
    call_separator = "\n"  # between text and the first call

    # --- subclass parts

    def tools_pieces(self, tools: Sequence[dict]) -> list[Piece]:
        raise NotImplementedError

    def tool_result_pieces(self, m: Message, opens: bool) -> list[Piece]:
        raise NotImplementedError

    def parse_call(self, raw: str, call_id: str, tools: Sequence[dict] | None) -> ChatToolCall:
        raise NotImplementedError

    # --- rendering

    def render_tools(self, tools: Sequence[dict]) -> str:
        return "".join(s for _, s in self.tools_pieces(tools))

    def close_pieces(self, last_role: str | None) -> list[Piece]:
        return [(True, IM_END), NL] if last_role == "tool" else []

    def trailer_pieces(self) -> list[Piece]:
        return [NL]

    def prompt_pieces(self, previous_role: str | None) -> list[Piece]:
        return self.close_pieces(previous_role) + [(True, IM_START), (False, "assistant\n")]

    def turn_pieces(self, m: Message, tools: Sequence[dict] | None, previous_role: str | None) -> list[Piece]:
        if m.role == "tool":
            return self.tool_result_pieces(m, previous_role != "tool")
        parts = self.close_pieces(previous_role) + [(True, IM_START), (False, m.role + "\n")]
        if m.role == "system":
            parts.append((False, m.content))
            if tools:
                parts += [(False, "\n\n" if m.content else "")] + self.tools_pieces(tools)
        elif m.role == "assistant":
            if m.thinking is not None:
                parts += [(True, THINK), (False, "\n" + m.thinking + "\n"), (True, THINK_END), (False, "\n\n")]
            parts.append((False, m.content))
            for i, call in enumerate(m.tool_calls):
                if i or m.content:
                    parts.append((False, self.call_separator if i == 0 else "\n"))
                parts += [(True, TOOL_CALL), (False, self.call_text(call)), (True, TOOL_CALL_END)]
        else:
            parts.append((False, m.content))
        return parts + [(True, IM_END), NL]

    # --- parsing

    def strip_prompt(self, items: list[Piece]) -> list[Piece]:
        if len(items) >= 2 and items[0] == (True, IM_START) and not items[1][0] \
                and items[1][1].startswith("assistant\n"):
            rest = items[1][1][len("assistant\n"):]
            return ([(False, rest)] if rest else []) + items[2:]
        return items

    def parse_items(self, items: list[Piece], call_id_prefix: str, tools: Sequence[dict] | None) -> ParsedAssistant:
        thinking: str | None = None
        text: list[str] = []  # before the first call
        calls: list[ChatToolCall] = []
        errors: list[str] = []
        finished = False
        i = 0
        if items and items[0] == (True, THINK):
            j = 1
            while j < len(items) and not items[j][0]:
                j += 1
            body = "".join(s for _, s in items[1:j])
            thinking = body[1:] if body.startswith("\n") else body
            thinking = thinking[:-1] if thinking.endswith("\n") else thinking
            if j < len(items) and items[j] == (True, THINK_END):
                j += 1
                if j < len(items) and not items[j][0] and items[j][1].startswith("\n\n"):
                    items = items[:j] + [(False, items[j][1][2:])] + items[j + 1:]
            else:
                errors.append(f"thinking not closed with {THINK_END}" +
                              (f" before {items[j][1]}" if j < len(items) else ""))
            i = j
        while i < len(items):
            special, s = items[i]
            i += 1
            if finished:
                if special or s != "\n":
                    errors.append(f"output continues after {IM_END}; the rest was ignored")
                    break
                continue
            if not special:
                if not calls:
                    text.append(s)
                elif s.strip():  # text after a call is kept as text; whitespace between calls is not
                    text.append(s)
                    errors.append("text after a tool call (kept as text)")
            elif s == TOOL_CALL:
                j = i
                while j < len(items) and not items[j][0]:
                    j += 1
                raw = "".join(t for _, t in items[i:j])
                call_id = f"{call_id_prefix}{len(calls)}"
                if j < len(items) and items[j] == (True, TOOL_CALL_END):
                    call = self.parse_call(raw, call_id, tools)
                    j += 1
                else:
                    why = f"not closed with {TOOL_CALL_END} before {items[j][1]}" if j < len(items) \
                        else f"cut off before {TOOL_CALL_END}"
                    call = ChatToolCall(id=call_id, name=_guess_name(raw), arguments="", raw=raw, error=why)
                calls.append(call)
                if call.error:
                    errors.append(f"tool call {len(calls) - 1}: {call.error}")
                i = j
            elif s == IM_END:
                finished = True
            elif s == THINK:
                errors.append(f"{THINK} must open the turn, once (ignored)")
            else:
                errors.append(f"unexpected special token {s} in an assistant turn (ignored)")
        content = "".join(text)
        if calls and content.endswith(self.call_separator):
            content = content[:-len(self.call_separator)]
        return ParsedAssistant(thinking=thinking, content=content, tool_calls=calls, errors=errors,
                               finished=finished)

    def parse_conversation(self, output: str | Sequence[int]) -> tuple[list[Message], list[dict] | None]:
        """Read a whole conversation (ids or text) back into messages and the tool list (see
        `parse_tools`). Call ids are ``call_{turn}_{index}``; tool results get the id and name of the
        call they answer, by order. A trailing empty generation prompt is dropped."""
        items = self.items(output)
        messages: list[Message] = []
        tools: list[dict] | None = None
        pending: list[ChatToolCall] = []
        i = 0
        while i < len(items):
            if items[i] == NL:
                i += 1
                continue
            if items[i] != (True, IM_START) or i + 1 >= len(items) or items[i + 1][0]:
                raise MessageError(f"expected {IM_START} and a role at item {i}, found {items[i][1][:40]!r}")
            role, nl, first = items[i + 1][1].partition("\n")
            if not nl or role not in ("system", "user", "assistant"):
                raise MessageError(f"unknown role {role[:40]!r} at item {i + 1}")
            j = i + 2
            while j < len(items) and items[j] != (True, IM_END):
                j += 1
            body = ([(False, first)] if first else []) + items[i + 2:j + 1]
            i = j + 1
            if role == "assistant":
                if not body:
                    break  # the generation prompt of an unfinished conversation
                parsed = self.parse_items(body, f"call_{len(messages)}_", tools)
                messages.append(parsed.to_message())
                pending = list(parsed.tool_calls)
            elif role == "user" and any(p == (True, TOOL_RESPONSE) for p in body) and not first.strip():
                for result in self._tool_results(body):
                    call = pending.pop(0) if pending else None
                    messages.append(Message(role="tool", content=result, name=call.name if call else None,
                                            tool_call_id=call.id if call else None))
            else:
                text = "".join(s for _, s in (body[:-1] if body[-1:] == [(True, IM_END)] else body))
                if role == "system" and not messages and self.tools_header in text:
                    text, _, listing = text.partition(self.tools_header)
                    text = text[:-2] if text.endswith("\n\n") else text
                    tools = self.parse_tools(self.tools_header + listing)
                messages.append(Message(role=role, content=text))
        return messages, tools

    def _tool_results(self, body: list[Piece]) -> list[str]:
        results, k = [], 0
        while k < len(body):
            if body[k] == (True, TOOL_RESPONSE):
                end = k + 1
                while end < len(body) and body[end] != (True, TOOL_RESPONSE_END):
                    end += 1
                text = "".join(s for _, s in body[k + 1:end])
                results.append(text[1:-1] if len(text) >= 2 and text[0] == text[-1] == "\n" else text)
                k = end
            k += 1
        return results

    def parse_tools(self, listing: str) -> list[dict]:
        raise NotImplementedError


def _guess_name(raw: str) -> str:
    m = re.search(r'"name"\s*:\s*"([^"\\]*)"|<function=([^>\n]*)>', raw)
    return (m.group(1) or m.group(2) or "") if m else ""


def openai_tool(tool: Any) -> dict:
    """A tool as Qwen3's listing writes it: the OpenAI form, {"type": "function", "function": {...}}."""
    fn = function_schema(tool)
    return tool if isinstance(tool, dict) and "function" in tool else {"type": "function", "function": fn}


# ----------------------------------------------------------------------------- qwen3

QWEN3_TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
QWEN3_TOOLS_FOOTER = ("\n</tools>\n\nFor each function call, return a json object with function name and "
                      "arguments within ")


class Qwen3Format(ChatMLFormat):
    name = "qwen3"
    tool_parser = "hermes"
    tools_header = QWEN3_TOOLS_HEADER

    def tools_pieces(self, tools: Sequence[dict]) -> list[Piece]:
        lines = "".join("\n" + json.dumps(openai_tool(t), ensure_ascii=False) for t in tools)
        return [(False, QWEN3_TOOLS_HEADER + lines + QWEN3_TOOLS_FOOTER), (True, TOOL_CALL), (True, TOOL_CALL_END),
                (False, " XML tags:\n"), (True, TOOL_CALL),
                (False, '\n{"name": <function-name>, "arguments": <args-json-object>}\n'), (True, TOOL_CALL_END)]

    def parse_tools(self, listing: str) -> list[dict]:
        body = listing[len(QWEN3_TOOLS_HEADER):].partition("\n</tools>")[0]
        return [json.loads(line) for line in body.split("\n") if line]

    def call_text(self, call: ChatToolCall) -> str:
        """Between <tool_call> and </tool_call>: the call as generated, or ``\\n{JSON}\\n``."""
        return call.raw if call.raw is not None else "\n" + call.text() + "\n"

    def tool_result_pieces(self, m: Message, opens: bool) -> list[Piece]:
        head = [(True, IM_START), (False, "user")] if opens else []
        return head + [NL, (True, TOOL_RESPONSE), (False, "\n" + m.content + "\n"), (True, TOOL_RESPONSE_END)]

    def parse_call(self, raw: str, call_id: str, tools: Sequence[dict] | None) -> ChatToolCall:
        if not raw.strip():
            return ChatToolCall(id=call_id, name="", arguments="", raw=raw, error="empty tool call (expected a JSON object)")
        return parse_json_call(raw, call_id)

    def chat_template(self) -> str:
        tools_section = (
            "{{- " + lit(QWEN3_TOOLS_HEADER) + " }}"
            "{%- for t in tools %}{{- '\\n' + esc((t if t.function is defined else "
            "{'type': 'function', 'function': t}) | tojson) }}{%- endfor %}"
            "{{- " + lit(QWEN3_TOOLS_FOOTER + TOOL_CALL + TOOL_CALL_END + " XML tags:\n" + TOOL_CALL +
                         '\n{"name": <function-name>, "arguments": <args-json-object>}\n' + TOOL_CALL_END) + " }}")
        call = ("{%- if not loop.first or m.content %}{{- '\\n' }}{%- endif %}"
                "{{- '<tool_call>\\n' + esc('{\"name\": ' + (f.name | tojson) + ', \"arguments\": ' + "
                "(f.arguments if f.arguments is string else (f.arguments | tojson)) + '}') + '\\n</tool_call>' }}")
        result = ("{%- if ns.prev != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
                  "{{- '\\n<tool_response>\\n' + esc(m.content or '') + '\\n</tool_response>' }}")
        return chatml_template(escape_macro(self.tok), tools_section, call, result)


# ----------------------------------------------------------------------------- qwen3_coder

CODER_TOOLS_HEADER = "# Tools\n\nYou have access to the following functions:\n\n<tools>"
CODER_INSTRUCTIONS = (
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n",
    "\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n",
    "\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within ",
    " XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function "
    "call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, "
    "answer the question like normal with your current knowledge and do not tell the user about function calls\n"
    "</IMPORTANT>",
)


def _xml_value(v: Any) -> str:
    """A value in Qwen3-Coder's listing: JSON for objects and lists, else Python's str (Jinja's string)."""
    return json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list, tuple)) else str(v)


def _extra(d: Any, handled: tuple[str, ...]) -> str:
    if not isinstance(d, dict):
        return ""
    return "".join(f"\n<{k}>{_xml_value(v)}</{k}>" for k, v in d.items() if k not in handled)


def coder_listing(tools: Sequence[dict]) -> str:
    """Qwen3-Coder's XML listing of the tools (its template's, between <tools> and </tools>)."""
    out = []
    for t in tools:
        fn = function_schema(t)
        out.append(f"\n<function>\n<name>{fn['name']}</name>")
        if "description" in fn:
            out.append(f"\n<description>{str(fn['description']).strip()}</description>")
        out.append("\n<parameters>")
        params = fn.get("parameters")
        if isinstance(params, dict) and isinstance(params.get("properties"), dict):
            for pname, pf in params["properties"].items():
                out.append(f"\n<parameter>\n<name>{pname}</name>")
                if isinstance(pf, dict) and "type" in pf:
                    out.append(f"\n<type>{pf['type']}</type>")
                if isinstance(pf, dict) and "description" in pf:
                    out.append(f"\n<description>{str(pf['description']).strip()}</description>")
                out.append(_extra(pf, ("name", "type", "description")) + "\n</parameter>")
        out.append(_extra(params, ("type", "properties")) + "\n</parameters>")
        out.append(_extra(fn, ("type", "name", "description", "parameters")) + "\n</function>")
    return "".join(out)


class Qwen3CoderFormat(ChatMLFormat):
    name = "qwen3_coder"
    tool_parser = "qwen3_coder"
    tools_header = CODER_TOOLS_HEADER
    call_separator = "\n\n"
    call_hint = "<function=NAME> then one <parameter=ARG>, value, </parameter> block per argument, then </function>"

    def tools_pieces(self, tools: Sequence[dict]) -> list[Piece]:
        a, b, c, d = CODER_INSTRUCTIONS
        return [(False, CODER_TOOLS_HEADER + coder_listing(tools) + a), (True, TOOL_CALL), (False, b),
                (True, TOOL_CALL_END), (False, c), (True, TOOL_CALL), (True, TOOL_CALL_END), (False, d)]

    def parse_tools(self, listing: str) -> list[dict]:
        """Names, descriptions and parameter types only: the XML listing does not keep JSON schemas."""
        tools = []
        for block in listing.split("\n<function>\n")[1:]:
            name = re.match(r"<name>([^<\n]*)</name>", block)
            desc = re.match(r"<name>[^<\n]*</name>\n<description>(.*?)</description>", block, re.S)
            props = {p: {"type": t} for p, t in re.findall(
                r"\n<parameter>\n<name>([^<\n]*)</name>\n<type>([a-z]+)</type>", block)}
            fn = {"name": name.group(1) if name else ""}
            if desc:
                fn["description"] = desc.group(1)
            fn["parameters"] = {"type": "object", "properties": props}
            tools.append({"type": "function", "function": fn})
        return tools

    def call_text(self, call: ChatToolCall) -> str:
        if call.raw is not None:
            return call.raw
        try:
            args = json.loads(call.arguments)
        except json.JSONDecodeError:
            args = None
        if not isinstance(args, dict):  # not a call the model could write: kept as text, never raised
            return f"\n<function={call.name}>\n{call.arguments}\n</function>\n"
        params = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}"
                         f"\n</parameter>\n" for k, v in args.items())
        return f"\n<function={call.name}>\n{params}</function>\n"

    def tool_result_pieces(self, m: Message, opens: bool) -> list[Piece]:
        head = [(True, IM_START), (False, "user\n")] if opens else []
        return head + [(True, TOOL_RESPONSE), (False, "\n" + m.content + "\n"), (True, TOOL_RESPONSE_END), NL]

    def parse_call(self, raw: str, call_id: str, tools: Sequence[dict] | None) -> ChatToolCall:
        return parse_xml_call(raw, call_id, tools)

    def chat_template(self) -> str:
        a, b, c, d = CODER_INSTRUCTIONS
        extra = ("{%- macro extra(d, handled) %}{%- if d is mapping %}{%- for k, v in d | items %}"
                 "{%- if k not in handled %}{{- '\\n<' + esc(k) + '>' }}"
                 "{%- if v is mapping or (v is sequence and v is not string) %}{{- esc(v | tojson) }}"
                 "{%- else %}{{- esc(v | string) }}{%- endif %}{{- '</' + esc(k) + '>' }}"
                 "{%- endif %}{%- endfor %}{%- endif %}{%- endmacro %}")
        tools_section = (
            "{{- " + lit(CODER_TOOLS_HEADER) + " }}"
            "{%- for t in tools %}{%- set fn = t.function if t.function is defined else t %}"
            "{{- '\\n<function>\\n<name>' + esc(fn.name) + '</name>' }}"
            "{%- if fn.description is defined %}{{- '\\n<description>' + esc(fn.description | string | trim) + "
            "'</description>' }}{%- endif %}"
            "{{- '\\n<parameters>' }}"
            "{%- if fn.parameters is defined and fn.parameters is mapping and fn.parameters.properties is defined "
            "and fn.parameters.properties is mapping %}"
            "{%- for pn, pf in fn.parameters.properties | items %}"
            "{{- '\\n<parameter>\\n<name>' + esc(pn) + '</name>' }}"
            "{%- if pf is mapping and pf.type is defined %}{{- '\\n<type>' + esc(pf.type | string) + '</type>' }}"
            "{%- endif %}"
            "{%- if pf is mapping and pf.description is defined %}{{- '\\n<description>' + "
            "esc(pf.description | string | trim) + '</description>' }}{%- endif %}"
            "{{- extra(pf, ['name', 'type', 'description']) }}{{- '\\n</parameter>' }}"
            "{%- endfor %}{%- endif %}"
            "{{- extra(fn.parameters, ['type', 'properties']) }}{{- '\\n</parameters>' }}"
            "{{- extra(fn, ['type', 'name', 'description', 'parameters']) }}{{- '\\n</function>' }}"
            "{%- endfor %}"
            "{{- " + lit(a + TOOL_CALL + b + TOOL_CALL_END + c + TOOL_CALL + TOOL_CALL_END + d) + " }}")
        call = ("{%- if not loop.first %}{{- '\\n' }}{%- elif m.content %}{{- '\\n\\n' }}{%- endif %}"
                "{%- if f.arguments is string %}{{- raise_exception('the qwen3_coder template needs tool-call "
                "arguments as objects, not JSON strings') }}{%- endif %}"
                "{{- '<tool_call>\\n<function=' + esc(f.name) + '>\\n' }}"
                "{%- for k, v in (f.arguments or {}) | items %}{{- '<parameter=' + esc(k) + '>\\n' }}"
                "{%- if v is string %}{{- esc(v) }}{%- else %}{{- esc(v | tojson) }}{%- endif %}"
                "{{- '\\n</parameter>\\n' }}{%- endfor %}"
                "{{- '</function>\\n</tool_call>' }}")
        result = ("{%- if ns.prev != 'tool' %}{{- '<|im_start|>user\\n' }}{%- endif %}"
                  "{{- '<tool_response>\\n' + esc(m.content or '') + '\\n</tool_response>\\n' }}")
        return chatml_template(escape_macro(self.tok) + extra, tools_section, call, result)


_TYPE_CHECKS = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
                "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
                "boolean": lambda v: isinstance(v, bool), "object": lambda v: isinstance(v, dict),
                "array": lambda v: isinstance(v, list), "null": lambda v: v is None}


def _typed(value: str, schema: Any) -> tuple[Any, str | None]:
    """A parameter's text as its schema's type: (value, None) or (text, why not)."""
    types = schema.get("type") if isinstance(schema, dict) else None
    types = [types] if isinstance(types, str) else list(types or [])
    if not types or "string" in types or not all(t in _TYPE_CHECKS for t in types):
        return value, None
    text = value.strip()
    if "boolean" in types and text in ("True", "False"):  # Qwen3-Coder's own template writes Python's str
        return text == "True", None
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        parsed = ValueError
    if parsed is not ValueError and any(_TYPE_CHECKS[t](parsed) for t in types):
        return parsed, None
    return value, f"must be {' or '.join(types)}, got {text[:40]!r}"


def parse_xml_call(raw: str, call_id: str, tools: Sequence[dict] | None) -> ChatToolCall:
    """A Qwen3-Coder call ``\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n...</function>\\n``
    -> ChatToolCall with JSON arguments (typed by the tool's schema when `tools` has it)."""
    def bad(why: str, name: str = "") -> ChatToolCall:
        return ChatToolCall(id=call_id, name=name, arguments="", raw=raw, error=why)

    s = raw.lstrip("\n")
    if not s.startswith("<function="):
        return bad("must start with <function=NAME>")
    end = s.find(">")
    if end < 0 or "\n" in s[:end]:
        return bad("<function= is not closed with >")
    name, s = s[len("<function="):end], s[end + 1:]
    if not name.strip():
        return bad("empty function name in <function=>")
    s = s[1:] if s.startswith("\n") else s
    schema = next((function_schema(t) for t in tools or () if function_schema(t).get("name") == name), None)
    props = ((schema or {}).get("parameters") or {}).get("properties") or {}
    args: dict[str, Any] = {}
    while True:
        if s.startswith("</function>"):
            if s[len("</function>"):].strip():
                return bad("text after </function> (one function per <tool_call>)", name)
            break
        if not s.startswith("<parameter="):
            return bad("expected <parameter=NAME> or </function>" if s.strip() else "not closed with </function>", name)
        end = s.find(">")
        if end < 0 or "\n" in s[:end]:
            return bad("<parameter= is not closed with >", name)
        key, s = s[len("<parameter="):end], s[end + 1:]
        if not key.strip():
            return bad("empty parameter name in <parameter=>", name)
        if key in args:
            return bad(f"parameter {key!r} given twice", name)
        s = s[1:] if s.startswith("\n") else s
        stop = _value_end(s)
        if stop < 0:
            return bad(f"parameter {key!r} not closed with </parameter>", name)
        value, s = s[:stop], s[stop + len("\n</parameter>"):]
        s = s[1:] if s.startswith("\n") else s
        typed, why = _typed(value, props.get(key))
        if why:
            return bad(f"parameter {key!r} {why}", name)
        args[key] = typed
    return ChatToolCall(id=call_id, name=name, arguments=json.dumps(args, ensure_ascii=False), raw=raw)


def _value_end(s: str) -> int:
    """Where a parameter's value ends: the first "\\n</parameter>" followed by the next parameter,
    </function> or nothing; else the first "\\n</parameter>" at all (-1 if none)."""
    close = "\n</parameter>"
    k = s.find(close)
    first = k
    while k >= 0:
        rest = s[k + len(close):].lstrip("\n")
        if rest.startswith(("<parameter=", "</function>")) or not rest.strip():
            return k
        k = s.find(close, k + 1)
    return first


def chatml_template(macros: str, tools_section: str, call: str, result: str) -> str:
    """The ChatML chat template around a format's tool listing, call and tool-result parts."""
    return macros + (
        "{%- set ns = namespace(prev=none) %}"
        "{%- if tools and (not messages or messages[0].role not in ['system', 'developer']) %}"
        "{{- '<|im_start|>system\\n' }}" + tools_section + "{{- '<|im_end|>\\n' }}"
        "{%- set ns.prev = 'system' %}"
        "{%- endif %}"
        "{%- for m in messages %}"
        "{%- set role = 'system' if m.role == 'developer' else m.role %}"
        "{%- if role != 'tool' and ns.prev == 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
        "{%- if role == 'system' %}"
        "{{- '<|im_start|>system\\n' + esc(m.content or '') }}"
        "{%- if loop.first and tools %}{%- if m.content %}{{- '\\n\\n' }}{%- endif %}" + tools_section +
        "{%- endif %}{{- '<|im_end|>\\n' }}"
        "{%- elif role == 'user' %}"
        "{{- '<|im_start|>user\\n' + esc(m.content or '') + '<|im_end|>\\n' }}"
        "{%- elif role == 'assistant' %}"
        "{{- '<|im_start|>assistant\\n' }}"
        "{%- if m.reasoning_content is defined and m.reasoning_content is not none %}"
        "{{- '<think>\\n' + esc(m.reasoning_content) + '\\n</think>\\n\\n' }}{%- endif %}"
        "{{- esc(m.content or '') }}"
        "{%- for c in (m.tool_calls or []) %}{%- set f = c.function if c.function is defined else c %}" + call +
        "{%- endfor %}"
        "{{- '<|im_end|>\\n' }}"
        "{%- elif role == 'tool' %}" + result +
        "{%- endif %}"
        "{%- set ns.prev = role %}"
        "{%- endfor %}"
        "{%- if ns.prev == 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
