"""Policy clients: in-process, SGLang, vLLM and OpenAI-chat backends give the same results
against opencomposer's server; retries and errors; the real engine behind the server."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest
import torch

from opencomposer.engine.client import InProcessClient, OpenAIChatClient, SGLangClient, VLLMClient
from opencomposer.engine.fake import FakeEngine, assistant_reply
from opencomposer.engine.server import create_app
from opencomposer.engine.types import SamplingParams
from opencomposer.errors import InferenceError
from opencomposer.model import ModelConfig, Transformer
from opencomposer.model.tokenizer import bundled_tokenizer

MAX_LEN = 256
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}}}}]
MESSAGES = [{"role": "user", "content": "Fix the bug in a.py"}]


@pytest.fixture(scope="module")
def tok():
    return bundled_tokenizer()


def fake(tok, **kw):
    return FakeEngine(vocab_size=tok.vocab_size, max_len=MAX_LEN, **kw)


def asgi(engine, tok):
    app = create_app(engine, tok, max_len=MAX_LEN, vocab_size=tok.vocab_size, model_name="tiny")
    return httpx.ASGITransport(app=app)


def assert_same(a, b):
    assert a.prompt_ids == b.prompt_ids and a.output_ids == b.output_ids
    assert a.finish_reason == b.finish_reason
    np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-6)
    for x, y in ((a.routed_experts, b.routed_experts), (a.prompt_routed_experts, b.prompt_routed_experts)):
        assert (x is None) == (y is None)
        if x is not None:
            np.testing.assert_array_equal(x, y)


# ----------------------------------------------------------------------------- in-process


async def test_in_process_generate_and_stop_strings(tok):
    reply = tok.encode("x = 1\ny = 2\nz = 3")
    client = InProcessClient(fake(tok, replies=[reply]), tok)
    result = await client.generate([1, 7, 8], SamplingParams(max_new_tokens=30, stop=("y =",)),
                                   return_routed_experts=True)
    assert result.finish_reason == "stop" and result.output_ids == reply[: len(result.output_ids)]
    assert tok.decode(result.output_ids).startswith("x = 1\ny =") and "z" not in tok.decode(result.output_ids)
    assert len(result.logprobs) == len(result.routed_experts) == len(result.output_ids)
    with pytest.raises(InferenceError, match="tokenizer"):
        await InProcessClient(fake(tok)).generate([1], SamplingParams(stop=("x",)))


async def test_in_process_chat_with_a_tool_call(tok):
    reply = assistant_reply(tok, "Reading.", tool_calls=[{"name": "read", "arguments": {"path": "a.py"}}])
    engine = fake(tok, replies=[reply])
    chat = await InProcessClient(engine, tok).chat(MESSAGES, TOOLS, SamplingParams(temperature=0))
    assert chat.finish_reason == "tool_calls" and chat.errors == []
    assert chat.message["content"] == "Reading."
    [call] = chat.message["tool_calls"]
    assert call["function"]["name"] == "read" and json.loads(call["function"]["arguments"]) == {"path": "a.py"}
    assert chat.usage.completion_tokens == len(reply) == len(chat.raw.output_ids)
    assert chat.usage.prompt_tokens == len(engine.requests[0].input_ids) and chat.usage.cost_usd is None


async def test_in_process_chat_reports_malformed_tool_calls(tok):
    from opencomposer.model.tokenizer import END, TOOL_CALL, TOOL_CALL_END

    bad = [tok.special_id(TOOL_CALL), *tok.encode('{"name": "read", "arguments": [1]}'),
           tok.special_id(TOOL_CALL_END), tok.special_id(END)]
    chat = await InProcessClient(fake(tok, replies=[bad]), tok).chat(MESSAGES, TOOLS)
    assert chat.finish_reason == "stop" and "tool_calls" not in chat.message
    assert len(chat.errors) == 1 and "arguments" in chat.errors[0]


# ----------------------------------------------------------------------------- over HTTP


@pytest.mark.parametrize("prompt_routing", [False, True])
async def test_sglang_and_vllm_clients_match_the_in_process_client(tok, prompt_routing):
    sampling = SamplingParams(max_new_tokens=7, temperature=0.7, seed=3)
    ids = [1, 300, 301, 302, 303]
    kw = dict(return_routed_experts=True, return_prompt_routed_experts=prompt_routing)
    local = await InProcessClient(fake(tok), tok).generate(ids, sampling, **kw)
    async with SGLangClient("http://test", transport=asgi(fake(tok), tok)) as sgl:
        via_sglang = await sgl.generate(ids, sampling, **kw)
    async with VLLMClient("http://test", "tiny", transport=asgi(fake(tok), tok)) as vllm:
        via_vllm = await vllm.generate(ids, sampling, **kw)
    assert local.routed_experts.shape == (7, 2, 2)
    assert_same(via_sglang, local)
    assert_same(via_vllm, local)
    assert via_sglang.policy_versions == local.policy_versions == [0] * 7
    assert via_vllm.policy_versions is None  # vLLM reports no weight version


async def test_http_clients_pass_stop_strings_and_stop_tokens(tok):
    reply = tok.encode("a = 1\nb = 2\nc = 3")
    async with SGLangClient("http://test", transport=asgi(fake(tok, replies=[reply, reply]), tok)) as c:
        by_string = await c.generate([1, 2], SamplingParams(max_new_tokens=40, stop=("b =",)))
        by_token = await c.generate([1, 2], SamplingParams(max_new_tokens=40, stop_token_ids=(reply[3],)))
    assert by_string.finish_reason == "stop" and tok.decode(by_string.output_ids).endswith("b =")
    assert by_token.finish_reason == "stop" and by_token.output_ids == reply[:4]


async def test_chat_through_the_tokenizer_equals_the_servers_chat(tok):
    reply = assistant_reply(tok, "Reading.", thinking="First look.",
                            tool_calls=[{"name": "read", "arguments": {"path": "a.py"}}])
    engine = fake(tok, replies=[reply, reply, reply])
    transport = asgi(engine, tok)
    async with SGLangClient("http://test", tokenizer=tok, transport=transport) as token_level, \
            SGLangClient("http://test", transport=transport) as server_chat, \
            VLLMClient("http://test", "tiny", transport=transport) as vllm_chat:
        results = [await c.chat(MESSAGES, TOOLS, SamplingParams(temperature=0, max_new_tokens=50))
                   for c in (token_level, server_chat, vllm_chat)]
    for r in results:
        assert r.finish_reason == "tool_calls"
        assert {k: v for k, v in r.message.items() if k != "tool_calls"} == \
            {"role": "assistant", "content": "Reading.", "reasoning_content": "First look."}
        assert [c["function"] for c in r.message["tool_calls"]] == \
            [{"name": "read", "arguments": json.dumps({"path": "a.py"})}]
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(engine.requests[0].input_ids), len(reply))
    assert [list(q.input_ids) for q in engine.requests] == [list(engine.requests[0].input_ids)] * 3


async def test_openai_chat_client_costs_and_refuses_token_level(tok, monkeypatch):
    monkeypatch.setenv("TEST_API_KEY", "sk-test")
    seen = []
    app_transport = asgi(fake(tok, replies=[assistant_reply(tok, "Done.")]), tok)

    async def handler(request: httpx.Request):
        seen.append(request)
        return await app_transport.handle_async_request(request)

    client = OpenAIChatClient("http://test/v1", "tiny", api_key_env="TEST_API_KEY", input_price_per_m=2.0,
                              output_price_per_m=10.0, transport=httpx.MockTransport(handler))
    async with client:
        chat = await client.chat(MESSAGES, sampling=SamplingParams(max_new_tokens=20))
        with pytest.raises(InferenceError, match="chat-only"):
            await client.generate([1, 2], SamplingParams())
    assert chat.message["content"] == "Done." and chat.finish_reason == "stop"
    usage = chat.usage
    assert usage.cost_usd == pytest.approx((usage.prompt_tokens * 2 + usage.completion_tokens * 10) / 1e6)
    assert seen[0].url.path == "/v1/chat/completions" and seen[0].headers["authorization"] == "Bearer sk-test"
    monkeypatch.delenv("TEST_API_KEY")
    with pytest.raises(InferenceError, match="TEST_API_KEY"):
        OpenAIChatClient("http://test/v1", "tiny", api_key_env="TEST_API_KEY")


# ----------------------------------------------------------------------------- retries, errors, real SGLang


def sglang_payload(output_ids, routed: np.ndarray | None = None, **meta) -> dict:
    meta_info = {"id": "x", "finish_reason": {"type": "length", "length": len(output_ids)},
                 "weight_version": "default", "output_token_logprobs": [[-0.5, t, None] for t in output_ids], **meta}
    if routed is not None:
        meta_info["routed_experts"] = base64.b64encode(routed.astype("<i4").tobytes()).decode()
    return {"text": "", "output_ids": output_ids, "meta_info": meta_info}


async def test_retries_5xx_then_succeeds():
    calls = []

    def handler(request):
        calls.append(request)
        if len(calls) < 3:
            return httpx.Response(503, json={"error": {"message": "warming up"}})
        return httpx.Response(200, json=sglang_payload([5, 6]))

    async with SGLangClient("http://s", transport=httpx.MockTransport(handler), backoff_s=0) as c:
        result = await c.generate([1, 2], SamplingParams(max_new_tokens=2))
    assert len(calls) == 3 and result.output_ids == [5, 6] and result.logprobs == [-0.5, -0.5]
    assert result.policy_versions is None  # "default" is not a version number


async def test_4xx_raises_at_once_with_the_servers_message():
    calls = []

    def handler(request):
        calls.append(request)
        return httpx.Response(400, json={"error": {"message": "top_p must be in (0, 1]", "type": "x"}})

    async with SGLangClient("http://s", transport=httpx.MockTransport(handler), backoff_s=0) as c:
        with pytest.raises(InferenceError, match=r"400: top_p must be in \(0, 1\]") as err:
            await c.generate([1], SamplingParams())
    assert err.value.status == 400 and len(calls) == 1


async def test_connection_errors_are_retried_then_reported():
    calls = []

    def handler(request):
        calls.append(request)
        raise httpx.ConnectError("connection refused")

    async with VLLMClient("http://s", "m", transport=httpx.MockTransport(handler), max_retries=2, backoff_s=0) as c:
        with pytest.raises(InferenceError, match="gave up after 3 attempts"):
            await c.generate([1], SamplingParams())
    assert len(calls) == 3


async def test_real_sglang_routed_experts_need_the_shape():
    routed = np.arange(3 * 2 * 4).reshape(3, 2, 4)  # rows [P-1, P+T-1) for P=2, T=3: 2 layers, top-4
    transport = httpx.MockTransport(lambda r: httpx.Response(200, json=sglang_payload([7, 8, 9], routed)))
    async with SGLangClient("http://s", transport=transport, routed_experts_shape=(2, 4)) as c:
        result = await c.generate([1, 2], SamplingParams(max_new_tokens=3), return_routed_experts=True)
    np.testing.assert_array_equal(result.routed_experts, routed)
    async with SGLangClient("http://s", transport=transport) as c:
        with pytest.raises(InferenceError, match="routed_experts_shape"):
            await c.generate([1, 2], SamplingParams(max_new_tokens=3), return_routed_experts=True)


# ----------------------------------------------------------------------------- the real engine


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=4096, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      num_experts=4, num_experts_per_tok=2, num_mtp_modules=1, max_position_embeddings=512)
    return Transformer(cfg).eval()


@pytest.fixture
def engine(tiny_model):
    from opencomposer.engine.engine import Engine

    eng = Engine(tiny_model, max_slots=4, max_len=MAX_LEN)
    yield eng
    eng.stop()


async def test_real_engine_in_process_and_over_http_agree(engine, tok):
    ids = [1, 100, 200, 300]
    sampling = SamplingParams(temperature=0, max_new_tokens=6)
    local = await InProcessClient(engine, tok).generate(ids, sampling, return_routed_experts=True,
                                                        return_prompt_routed_experts=True)
    async with SGLangClient("http://test", transport=asgi(engine, tok)) as sgl, \
            VLLMClient("http://test", "tiny", transport=asgi(engine, tok)) as vllm:
        via_sglang = await sgl.generate(ids, sampling, return_routed_experts=True, return_prompt_routed_experts=True)
        via_vllm = await vllm.generate(ids, sampling, return_routed_experts=True)
        chat = await sgl.chat(MESSAGES, TOOLS, SamplingParams(temperature=0, max_new_tokens=5))
    assert local.routed_experts.shape == (6, 2, 2) and local.prompt_routed_experts.shape == (4, 2, 2)
    assert_same(via_sglang, local)
    assert via_vllm.output_ids == local.output_ids
    np.testing.assert_array_equal(via_vllm.routed_experts, local.routed_experts)
    assert chat.finish_reason in ("stop", "length", "tool_calls") and chat.message["role"] == "assistant"
    assert chat.usage.completion_tokens <= 5


async def test_tempered_sampling_returns_the_logprobs_it_sampled_from(engine, tiny_model, tok):
    """At a temperature other than 1 the agent's token policy asks for "processed" logprobs:
    log softmax(logits / T) of the sampled tokens, what RL's trainer recomputes at that
    temperature; in process and through the server's /generate alike. vLLM, whose mode is the
    server's, refuses a mode it was not declared to serve."""
    from opencomposer.harness.agent import TokenClientPolicy

    ids = [1, 100, 200, 300]
    T = 1.7
    sampling = SamplingParams(temperature=T, max_new_tokens=8, seed=3)
    local = await TokenClientPolicy(InProcessClient(engine, tok), tok, routed_experts=False).generate(ids, sampling)
    async with SGLangClient("http://test", transport=asgi(engine, tok)) as sgl:
        remote = await TokenClientPolicy(sgl, tok, routed_experts=False).generate(ids, sampling)
    raw = await InProcessClient(engine, tok).generate(ids, sampling)
    seq = torch.tensor([ids + local.output_ids])
    with torch.no_grad():
        logits = tiny_model(seq[:, :-1]).logits[0, len(ids) - 1:].float()
    out = torch.tensor(local.output_ids)
    tempered = torch.log_softmax(logits / T, -1).gather(-1, out[:, None])[:, 0]
    plain = torch.log_softmax(logits, -1).gather(-1, out[:, None])[:, 0]
    assert raw.output_ids == local.output_ids == remote.output_ids  # same seed, same tokens
    np.testing.assert_allclose(local.logprobs, tempered.numpy(), atol=1e-4)
    np.testing.assert_allclose(remote.logprobs, local.logprobs, atol=1e-6)
    np.testing.assert_allclose(raw.logprobs, plain.numpy(), atol=1e-4)
    assert not np.allclose(raw.logprobs, local.logprobs, atol=1e-3)
    async with VLLMClient("http://test", "tiny", transport=asgi(engine, tok)) as vllm:
        with pytest.raises(InferenceError, match="--logprobs-mode processed_logprobs"):
            await vllm.generate(ids, sampling, logprobs_mode="processed")
