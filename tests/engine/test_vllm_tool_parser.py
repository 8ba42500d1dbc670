"""The vLLM tool-parser plugin's parsing core (no vLLM needed): calls are exactly what the
format's parse_assistant reads, malformed ones come back marked and read back with `error`."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as HFTokenizer

from opencomposer.engine.vllm_tool_parser import MALFORMED_NAME, PARSER_NAMES, extract, malformed_from_openai
from opencomposer.model.chat import FORMATS, ChatToolCall, Message, get_format
from opencomposer.model.tokenizer import Tokenizer, bundled_tokenizer
from opencomposer.model.vocab import load_vocab


@pytest.fixture(scope="module")
def fmts():
    qwen = load_vocab("qwen")
    out = {"opencomposer": get_format(bundled_tokenizer())}
    for name in ("qwen3", "qwen3_coder"):
        out[name] = get_format(Tokenizer(HFTokenizer.from_str(qwen.to_json()), {**qwen.config, "chat_format": name}))
    return out


def _generated_text(fmt, message: Message) -> str:
    ids = fmt.generated_ids(message)
    return fmt.tok.hf.decode(ids, skip_special_tokens=False)


def test_one_parser_name_per_format():
    assert set(PARSER_NAMES) == set(FORMATS)
    assert len(set(PARSER_NAMES.values())) == len(FORMATS)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_valid_calls_match_parse_assistant(fmts, name):
    fmt = fmts[name]
    call = ChatToolCall(id="c0", name="read_file", arguments='{"path": "a.py"}')
    text = _generated_text(fmt, Message(role="assistant", content="look", tool_calls=[call]))
    called, content, calls = extract(fmt, text)
    parsed = fmt.parse_assistant(text)
    assert called and len(calls) == 1
    assert calls[0]["function"]["name"] == "read_file"
    assert json.loads(calls[0]["function"]["arguments"]) == {"path": "a.py"}
    assert calls == [c.to_openai() for c in parsed.tool_calls]
    assert content == parsed.content
    assert malformed_from_openai(calls[0]) is None


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_no_call_is_plain_content(fmts, name):
    fmt = fmts[name]
    text = _generated_text(fmt, Message(role="assistant", content="just text"))
    assert extract(fmt, text) == (False, fmt.parse_assistant(text).content, [])


def test_malformed_call_comes_back_with_its_error(fmts):
    fmt = fmts["opencomposer"]
    good = _generated_text(fmt, Message(role="assistant", content="",
                                        tool_calls=[ChatToolCall(id="c0", name="x", arguments="{}")]))
    inner = fmt.call_text(ChatToolCall(id="c0", name="x", arguments="{}"))
    bad = good.replace(inner, '{"name": "x", "arguments": {oops')
    assert bad != good
    parsed = fmt.parse_assistant(bad)
    assert parsed.tool_calls and not parsed.tool_calls[0].ok
    called, _, calls = extract(fmt, bad)
    assert called and len(calls) == 1
    back = malformed_from_openai(calls[0])
    assert back is not None and back.error == parsed.tool_calls[0].error
    assert calls[0]["function"]["name"] in (parsed.tool_calls[0].name, MALFORMED_NAME)
