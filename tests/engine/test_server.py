"""The inference server: SGLang's /generate, OpenAI's chat and completions, weight updates,
health and metrics, and bad input answered 4xx while the server keeps serving.

Most tests serve the deterministic FakeEngine in-process (httpx over ASGI); one starts
`opencomposer serve` as a subprocess on a tiny random checkpoint.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json

import httpx
import numpy as np
import pytest
import torch

from opencomposer.engine.fake import FakeEngine, assistant_reply
from opencomposer.engine.server import create_app
from opencomposer.model import ModelConfig, Transformer, save_pretrained
from opencomposer.model.chat import encode_messages, stop_token_ids
from opencomposer.model.tokenizer import BOS, END, bundled_tokenizer

MAX_LEN = 256
TOOLS = [{"type": "function", "function": {"name": "read", "description": "Read a file.",
                                           "parameters": {"type": "object",
                                                          "properties": {"path": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def tok():
    return bundled_tokenizer()


def serve(engine, tok):
    app = create_app(engine, tok, max_len=MAX_LEN, vocab_size=tok.vocab_size, model_name="tiny")
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@pytest.fixture
def engine(tok):
    return FakeEngine(vocab_size=tok.vocab_size, max_len=MAX_LEN)


@pytest.fixture
async def client(engine, tok):
    async with serve(engine, tok) as c:
        yield c


def tiny_checkpoint(path, vocab_size=4096, seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      num_experts=4, num_experts_per_tok=2, num_mtp_modules=1)
    save_pretrained(Transformer(cfg).eval(), path)
    return path


def decode_int32(data: str, L: int, K: int) -> np.ndarray:
    return np.frombuffer(base64.b64decode(data), dtype="<i4").reshape(-1, L, K)


# ----------------------------------------------------------------------------- /generate


async def test_generate_returns_sglang_fields(client, engine):
    prompt = [1, 50, 60, 70, 80]
    r = await client.post("/generate", json={"input_ids": prompt, "rid": "r1", "return_logprob": True,
                                             "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
    assert r.status_code == 200, r.text
    body = r.json()
    out, meta = body["output_ids"], body["meta_info"]
    assert len(out) == 6 and all(isinstance(t, int) for t in out)
    assert meta["id"] == "r1"
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (5, 6)
    assert meta["weight_version"] == "0" and meta["policy_versions"] == [0] * 6
    assert [e[1] for e in meta["output_token_logprobs"]] == out
    assert [e[0] for e in meta["output_token_logprobs"]] == [-(1 + t % 5) / 10 for t in out]
    assert body["text"] == bundled_tokenizer().decode(out, skip_special=True)
    assert engine.requests[0].sampling.temperature == 0 and engine.requests[0].input_ids == prompt


async def test_generate_routed_experts_cover_the_sequence_minus_the_last_token(client, engine):
    prompt = [1, 50, 60, 70]
    P, T, L, K = len(prompt), 5, engine.num_moe_layers, engine.top_k
    full = (await client.post("/generate", json={"input_ids": prompt, "return_routed_experts": True,
                                                 "sampling_params": {"max_new_tokens": T}})).json()["meta_info"]
    assert full["routed_experts_shape"] == [P + T - 1, L, K]
    rows = decode_int32(full["routed_experts"], L, K)
    np.testing.assert_array_equal(rows, engine._routing(range(P + T - 1)))  # row i = input position i
    tail = (await client.post("/generate", json={
        "input_ids": prompt, "return_routed_experts": True, "routed_experts_start_len": P - 1,
        "sampling_params": {"max_new_tokens": T}})).json()["meta_info"]
    np.testing.assert_array_equal(decode_int32(tail["routed_experts"], L, K), rows[P - 1:])
    assert not engine.requests[-1].return_prompt_routed_experts  # output routing alone sufficed


async def test_generate_batch_answers_in_order(client):
    prompts = [[1, 10, 11], [1, 20, 21, 22, 23], [1, 30]]
    r = await client.post("/generate", json={"input_ids": prompts, "rid": ["a", "b", "c"],
                                             "sampling_params": [{"max_new_tokens": n} for n in (1, 2, 3)]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [b["meta_info"]["id"] for b in body] == ["a", "b", "c"]
    assert [b["meta_info"]["prompt_tokens"] for b in body] == [3, 5, 2]
    assert [len(b["output_ids"]) for b in body] == [1, 2, 3]


async def test_generate_stops_on_a_stop_token_and_keeps_it(client):
    first = (await client.post("/generate", json={"input_ids": [1, 5, 6], "sampling_params": {
        "max_new_tokens": 8, "temperature": 0}})).json()["output_ids"]
    stop = first[2]
    body = (await client.post("/generate", json={"input_ids": [1, 5, 6], "sampling_params": {
        "max_new_tokens": 8, "temperature": 0, "stop_token_ids": [stop]}})).json()
    cut = first[: first.index(stop) + 1]
    assert body["output_ids"] == cut
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert body["text"] == bundled_tokenizer().decode(cut[:-1], skip_special=True)  # SGLang trims it from text


async def test_generate_stop_string_cuts_output_text_and_logprobs(tok):
    reply = tok.encode("def f():\n    return 1\n# END of file\nmore") + [tok.special_id(END)]
    async with serve(FakeEngine(vocab_size=tok.vocab_size, max_len=MAX_LEN, replies=[reply]), tok) as c:
        body = (await c.post("/generate", json={"input_ids": [1, 5], "return_logprob": True, "sampling_params": {
            "max_new_tokens": 50, "stop": ["# END", "never"]}})).json()
    meta = body["meta_info"]
    assert body["text"] == "def f():\n    return 1\n"
    assert meta["finish_reason"] == {"type": "stop", "matched": "# END"}
    out = body["output_ids"]
    assert out == reply[: len(out)] and "# END" in tok.decode(out) and "# END" not in tok.decode(out[:-1])
    assert meta["completion_tokens"] == len(out) == len(meta["output_token_logprobs"])


async def test_generate_text_prompt_is_encoded_after_bos(client, engine, tok):
    r = await client.post("/generate", json={"text": "import os", "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 200
    assert list(engine.requests[0].input_ids) == [tok.special_id(BOS), *tok.encode("import os")]


async def test_default_max_new_tokens_is_cut_to_the_context(client, engine):
    r = await client.post("/generate", json={"input_ids": [1] * (MAX_LEN - 3)})
    assert r.status_code == 200
    assert engine.requests[0].sampling.max_new_tokens == 3 and len(r.json()["output_ids"]) == 3


# ----------------------------------------------------------------------------- OpenAI


async def test_chat_completion_with_a_tool_call(tok):
    reply = assistant_reply(tok, "Let me read it.", thinking="The bug is in a.py.",
                            tool_calls=[{"name": "read", "arguments": {"path": "a.py"}}])
    engine = FakeEngine(vocab_size=tok.vocab_size, max_len=MAX_LEN, replies=[reply])
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix a.py"}]
    async with serve(engine, tok) as c:
        r = await c.post("/v1/chat/completions", json={"model": "tiny", "messages": messages, "tools": TOOLS,
                                                        "temperature": 0, "return_token_ids": True})
    assert r.status_code == 200, r.text
    body = r.json()
    choice = body["choices"][0]
    msg = choice["message"]
    assert choice["finish_reason"] == "tool_calls"
    assert msg["role"] == "assistant" and msg["content"] == "Let me read it."
    assert msg["reasoning_content"] == "The bug is in a.py."
    [call] = msg["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "read"
    assert json.loads(call["function"]["arguments"]) == {"path": "a.py"} and call["id"].startswith("call_")
    prompt = encode_messages(tok, messages, TOOLS, add_generation_prompt=True)
    request = engine.requests[0]
    assert list(request.input_ids) == prompt == body["prompt_token_ids"]
    assert set(stop_token_ids(tok)) <= set(request.sampling.stop_token_ids)
    assert request.sampling.max_new_tokens == MAX_LEN - len(prompt)  # default: the rest of the context
    assert choice["token_ids"] == reply
    assert body["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(reply),
                             "total_tokens": len(prompt) + len(reply)}


async def test_chat_stop_strings_logprobs_and_n(tok):
    replies = [assistant_reply(tok, "First line. STOP then more"), assistant_reply(tok, "Second answer")]
    async with serve(FakeEngine(vocab_size=tok.vocab_size, max_len=MAX_LEN, replies=replies), tok) as c:
        r = await c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "n": 2, "stop": "STOP", "logprobs": True,
            "max_tokens": 40})
    assert r.status_code == 200, r.text
    a, b = r.json()["choices"]
    assert (a["message"]["content"], a["finish_reason"]) == ("First line. ", "stop")
    assert (b["message"]["content"], b["finish_reason"]) == ("Second answer", "stop")
    content = b["logprobs"]["content"]
    assert len(content) == len(replies[1]) and all(e["logprob"] < 0 for e in content)
    assert "".join(e["token"] for e in content).startswith("Second answer")


async def test_chat_cut_off_reports_length(tok):
    reply = assistant_reply(tok, "a long answer that goes on and on")
    async with serve(FakeEngine(vocab_size=tok.vocab_size, max_len=MAX_LEN, replies=[reply]), tok) as c:
        body = (await c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})).json()
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 3


async def test_completions_with_token_ids_logprobs_and_routed_experts(client, engine):
    prompt = [1, 40, 41, 42, 43]
    r = await client.post("/v1/completions", json={
        "model": "tiny", "prompt": prompt, "max_tokens": 4, "logprobs": 0, "return_tokens_as_token_ids": True,
        "return_token_ids": True, "return_routed_experts": True, "routed_experts_prompt_start": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    [choice] = body["choices"]
    out = choice["token_ids"]
    assert len(out) == 4 and choice["prompt_token_ids"] == prompt and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in out]
    assert choice["logprobs"]["token_logprobs"] == [-(1 + t % 5) / 10 for t in out]
    rows = np.load(io.BytesIO(base64.b64decode(choice["routed_experts"])))
    np.testing.assert_array_equal(rows, engine._routing(range(2, len(prompt) + 4 - 1)))
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}


async def test_completions_string_prompts_and_n(client, engine, tok):
    r = await client.post("/v1/completions", json={"prompt": ["x = 1", "y = 2"], "n": 2, "max_tokens": 2,
                                                   "seed": 7})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [list(q.input_ids) for q in engine.requests] == [[tok.bos_id, *tok.encode("x = 1")]] * 2 + \
        [[tok.bos_id, *tok.encode("y = 2")]] * 2
    assert [q.sampling.seed for q in engine.requests] == [7, 8, 7, 8]
    assert choices[0]["logprobs"] is None


async def test_models_and_model_info(client):
    models = (await client.get("/v1/models")).json()
    assert models["data"][0]["id"] == "tiny" and models["data"][0]["max_model_len"] == MAX_LEN
    assert (await client.get("/get_model_info")).json()["weight_version"] == "0"


# ----------------------------------------------------------------------------- weights, health, metrics


async def test_update_weights_from_disk_bumps_the_version(client, engine, tmp_path):
    ckpt = tiny_checkpoint(tmp_path / "step1")
    r = await client.post("/update_weights_from_disk", json={"model_path": str(ckpt), "load_format": "auto"})
    assert r.status_code == 200, r.text
    assert r.json()["success"] is True and r.json()["version"] == 1
    assert "embed_tokens.weight" in engine.weights
    assert (await client.get("/health")).json() == {"status": "ok", "policy_version": 1}
    meta = (await client.post("/generate", json={"input_ids": [1, 2], "sampling_params": {
        "max_new_tokens": 2}})).json()["meta_info"]
    assert meta["weight_version"] == "1" and meta["policy_versions"] == [1, 1]

    bad = await client.post("/update_weights_from_disk", json={"model_path": str(tmp_path / "missing")})
    assert bad.status_code == 400
    assert bad.json()["success"] is False and bad.json()["version"] == 1 and "missing" in bad.json()["message"]
    assert engine.policy_version == 1


async def test_metrics_count_requests_tokens_and_version(client):
    await client.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}})
    await client.post("/generate", content=b"not json")
    text = (await client.get("/metrics")).text
    metrics = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert metrics['opencomposer_requests_total{endpoint="/generate",status="200"}'] == "1"
    assert metrics['opencomposer_requests_total{endpoint="/generate",status="400"}'] == "1"
    assert metrics["opencomposer_prompt_tokens_total"] == "3"
    assert metrics["opencomposer_generation_tokens_total"] == "4"
    assert metrics["opencomposer_policy_version"] == "0"
    assert metrics["opencomposer_requests_in_flight"] == "0"


async def test_concurrent_requests_run_together_and_show_in_metrics(tok):
    engine = FakeEngine(vocab_size=tok.vocab_size, max_len=MAX_LEN, step_delay_s=0.2)
    async with serve(engine, tok) as c:
        tasks = [asyncio.create_task(c.post("/generate", json={"input_ids": [1, i + 20], "sampling_params": {
            "max_new_tokens": 3}})) for i in range(6)]
        while engine.num_running < 6:  # each request holds the engine for 0.6 s
            await asyncio.sleep(0.001)
        text = (await c.get("/metrics")).text
        responses = await asyncio.gather(*tasks)
    assert all(r.status_code == 200 for r in responses)
    assert "\nopencomposer_requests_in_flight 6\n" in text and "\nopencomposer_requests_running 6\n" in text


# ----------------------------------------------------------------------------- bad input

BAD = [
    ("/generate", b"{", "not valid JSON"),
    ("/generate", b"[1, 2]", "JSON object"),
    ("/generate", b'{"input_ids": [1, 2], "sampling_params": {"temperature": NaN}}', "not valid JSON"),
    ("/generate", {"sampling_params": {"max_new_tokens": 3}}, "input_ids"),
    ("/generate", {"input_ids": "hello"}, "list of token ids"),
    ("/generate", {"input_ids": [1, "2"]}, "list of token ids"),
    ("/generate", {"input_ids": []}, "empty"),
    ("/generate", {"input_ids": [1, 10 ** 6]}, "outside the vocabulary"),
    ("/generate", {"input_ids": [1, -3]}, "outside the vocabulary"),
    ("/generate", {"input_ids": [1] * MAX_LEN}, "prompt must be shorter"),
    ("/generate", {"input_ids": [1] * 200, "sampling_params": {"max_new_tokens": 100}}, "does not fit"),
    ("/generate", {"input_ids": [1], "sampling_params": {"temperature": -0.5}}, "temperature"),
    ("/generate", {"input_ids": [1], "sampling_params": {"temperature": "0.5"}}, "temperature"),
    ("/generate", {"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p"),
    ("/generate", {"input_ids": [1], "sampling_params": {"top_p": 1.5}}, "top_p"),
    ("/generate", {"input_ids": [1], "sampling_params": {"top_k": -2}}, "top_k"),
    ("/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 0}}, "max_new_tokens"),
    ("/generate", {"input_ids": [1], "sampling_params": {"max_new_token": 5}}, "max_new_token"),
    ("/generate", {"input_ids": [1], "sampling_params": {"frequency_penalty": 0.5}}, "not supported"),
    ("/generate", {"input_ids": [1], "sampling_params": {"stop_token_ids": [99999]}}, "stop_token_ids"),
    ("/generate", {"input_ids": [1], "stream": True}, "stream"),
    ("/generate", {"input_ids": [1], "return_logprob": "yes"}, "return_logprob"),
    ("/generate", {"input_ids": [[1], [2]], "rid": ["only-one"]}, "one entry per prompt"),
    ("/generate", {"input_ids": [1, 2, 3], "logprob_start_len": 0}, "prompt-token logprobs"),
    ("/generate", {"input_ids": [1, 2], "return_routed_experts": True, "routed_experts_start_len": 5}, "routed"),
    ("/v1/chat/completions", {}, "messages"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10 ** 4}, "does not fit"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 0}, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}, "stream"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [{"x": 1}]}, "tool"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"},
     "tool_choice"),
    ("/v1/completions", {"max_tokens": 3}, "prompt"),
    ("/v1/completions", {"prompt": [1, 2], "echo": True}, "echo"),
    ("/v1/completions", {"prompt": [1, 2], "logprobs": -1}, "logprobs"),
    ("/v1/completions", {"prompt": [1, 2], "top_p": 2}, "top_p"),
    ("/update_weights_from_disk", {}, "model_path"),
    ("/update_weights_from_disk", {"model_path": "/x", "load_format": "gguf"}, "load_format"),
]


@pytest.mark.parametrize("path,body,expect", BAD, ids=[f"{p}:{e}" for p, _, e in BAD])
async def test_bad_input_is_a_400_and_the_server_keeps_serving(client, path, body, expect):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = await client.post(path, **kw)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and expect in error["message"], error
    ok = await client.post("/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}})
    assert ok.status_code == 200


async def test_unknown_route_is_a_json_404(client):
    r = await client.get("/v2/nothing")
    assert r.status_code == 404 and "/v2/nothing" in r.json()["error"]["message"]


async def test_engine_failure_is_a_500_and_the_server_keeps_serving(tok):
    async with serve(FakeEngine(vocab_size=tok.vocab_size, max_len=MAX_LEN, replies=[[20, 21]]), tok) as c:
        ok = await c.post("/generate", json={"input_ids": [1]})
        failed = await c.post("/generate", json={"input_ids": [1]})  # the script is exhausted
        health = await c.get("/health")
    assert ok.status_code == 200 and ok.json()["output_ids"] == [20, 21]
    assert failed.status_code == 500 and "script exhausted" in failed.json()["error"]["message"]
    assert health.status_code == 200


# ----------------------------------------------------------------------------- hostile input: size, nesting, disconnects


async def asgi_post(app, path, receive_messages, headers=()):
    """POST straight through the ASGI interface, the body given as receive() messages (an
    iterator, so it may be endless); returns (status, body, how many messages the app took)."""
    taken, sent = 0, []

    async def receive():
        nonlocal taken
        taken += 1
        return next(receive_messages)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), *headers], "client": ("127.0.0.1", 1),
             "server": ("test", 80)}
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"), taken


def endless_body(chunk=b" " * (1 << 20)):
    yield {"type": "http.request", "body": b'{"text": "', "more_body": True}
    while True:
        yield {"type": "http.request", "body": chunk, "more_body": True}


def metric_counts(text: str) -> dict:
    return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))}


async def test_a_declared_content_length_over_the_limit_is_refused_before_reading(engine, tok):
    app = create_app(engine, tok, max_len=MAX_LEN, vocab_size=tok.vocab_size)
    for path in ("/generate", "/v1/completions", "/v1/chat/completions", "/update_weights_from_disk"):
        status, body, taken = await asgi_post(app, path, endless_body(), [(b"content-length", b"200000000")])
        assert (status, taken) == (413, 0), (path, body)  # not one byte of the body was read
        assert "limit" in json.loads(body)["error"]["message"]


async def test_a_streamed_body_is_cut_off_as_soon_as_it_passes_the_limit(engine, tok):
    app = create_app(engine, tok, max_len=MAX_LEN, vocab_size=tok.vocab_size, max_body_bytes=4 << 20)
    status, body, taken = await asgi_post(app, "/generate", endless_body())  # chunked: no Content-Length
    assert status == 413 and taken <= 6 and json.loads(body)["error"]["code"] == 413
    status, _, _ = await asgi_post(app, "/generate", endless_body(), [(b"content-length", b"lots")])
    assert status == 400


async def test_the_body_limit_is_configurable_and_has_a_default_from_the_context(engine, tok):
    from opencomposer.engine.requests import default_body_limit

    assert default_body_limit(256) == 8 << 20 and default_body_limit(1 << 20) == 64 << 20
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(
            engine, tok, max_len=MAX_LEN, vocab_size=tok.vocab_size, max_body_bytes=200)), base_url="http://t") as c:
        small = await c.post("/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}})
        big = await c.post("/generate", json={"input_ids": [1] * 100})
        health = await c.get("/health")
    assert small.status_code == 200 and big.status_code == 413 and health.status_code == 200


@pytest.mark.parametrize("body", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"input_ids": ' + b"[" * 100_000 + b"1" + b"]" * 100_000 + b"}",
    b'{"input_ids": [1], "sampling_params": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_001,
], ids=["root", "input_ids", "sampling_params"])
async def test_deeply_nested_json_is_a_400_not_a_500(client, body):
    r = await client.post("/generate", content=body)
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"]
    assert (await client.get("/health")).status_code == 200


async def test_nesting_around_the_parsers_limit_is_never_a_500(client):
    # Bodies that parse, but nest so deep that a later step (tools rendered as JSON) may recurse too far.
    import sys

    limit = sys.getrecursionlimit()
    for depth in range(limit - 300, limit + 20, 20):
        body = ('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": [{"type": "function", '
                '"function": {"name": "t", "parameters": ' + "[" * depth + "]" * depth + "}}]}")
        r = await client.post("/v1/chat/completions", content=body)
        assert r.status_code in (200, 400), (depth, r.text)


async def test_a_client_that_disconnects_mid_body_is_not_a_server_error(engine, tok):
    app = create_app(engine, tok, max_len=MAX_LEN, vocab_size=tok.vocab_size)
    for path in ("/generate", "/v1/chat/completions", "/v1/completions"):
        messages = iter([{"type": "http.request", "body": b'{"input_ids": [1, ', "more_body": True},
                         {"type": "http.disconnect"}])
        status, _, taken = await asgi_post(app, path, messages)
        assert status == 499 and taken == 2
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        counts = metric_counts((await c.get("/metrics")).text)
    assert counts['opencomposer_requests_total{endpoint="/generate",status="499"}'] == 1
    assert not [k for k in counts if 'status="500"' in k]


@pytest.mark.parametrize("path,body", [
    ("/generate", {"text": "word " * 200_000}),
    ("/generate", {"text": ["hi", "word " * 200_000]}),
    ("/v1/completions", {"prompt": "word " * 200_000}),
    ("/v1/completions", {"prompt": [[1, 2], "word " * 200_000]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 200_000}]}),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "x" * 30_000},
                                           {"role": "user", "content": "y" * 30_000}]}),
], ids=["text", "text-batch", "prompt", "prompt-batch", "chat", "chat-split"])
async def test_a_text_that_cannot_fit_the_context_is_refused_without_tokenizing(client, tok, monkeypatch, path, body):
    encoded = []
    monkeypatch.setattr(tok, "encode", lambda text: encoded.append(len(text)) or [5] * len(text))
    r = await client.post(path, json=body)
    assert r.status_code == 400 and "characters" in r.json()["error"]["message"], r.text
    assert not [n for n in encoded if n > 1000]  # the huge text never reached the tokenizer


def read_response(sock) -> bytes:
    """One HTTP response from a raw socket: its head, then Content-Length bytes of body."""
    data = b""
    while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next((line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(
        b"content-length:")), b"0"))
    while len(body) < length and (chunk := sock.recv(65536)):
        body += chunk
    return head + b"\r\n\r\n" + body


def test_health_answers_while_a_huge_body_is_refused(tok):
    """Over a real socket: a 24 MB chunked upload (the old server read it all, then spent most
    of a minute tokenizing it on the event loop) is cut off at the limit, /health stays quick."""
    import socket
    import threading
    import time

    import uvicorn

    app = create_app(FakeEngine(vocab_size=tok.vocab_size, max_len=MAX_LEN), tok, max_len=MAX_LEN,
                     vocab_size=tok.vocab_size)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    upload = {"sent": 0, "response": b""}

    def send_huge():
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            chunk = b'{"text": "' + b"a" * ((1 << 20) - 10)
            try:
                for _ in range(24):
                    sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    upload["sent"] += len(chunk)
                    chunk = b"a" * (1 << 20)
                sock.sendall(b'1\r\n"\r\n1\r\n}\r\n0\r\n\r\n')
            except OSError:  # the server closed the connection after answering
                pass
            upload["response"] = read_response(sock)

    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)
        uploader = threading.Thread(target=send_huge)
        uploader.start()
        latencies = []
        while uploader.is_alive() and len(latencies) < 50:
            t0 = time.monotonic()
            assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
            latencies.append(time.monotonic() - t0)
        uploader.join(60)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:  # declared: refused at once
            sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 200000000\r\n\r\n")
            declared = read_response(sock)
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
    finally:
        server.should_exit = True
        thread.join(30)
    assert upload["response"].startswith(b"HTTP/1.1 413"), upload
    assert declared.startswith(b"HTTP/1.1 413") and b"limit" in declared
    assert health.status_code == 200 and max(latencies, default=0) < 5, latencies


# ----------------------------------------------------------------------------- the real engine


@pytest.fixture
def real_engine(tmp_path):
    from opencomposer.engine.engine import Engine
    from opencomposer.model import load_pretrained

    engine = Engine(load_pretrained(tiny_checkpoint(tmp_path / "step0", seed=0)), max_slots=4, max_len=MAX_LEN)
    yield engine
    engine.stop()


def serve_engine(engine, tok):
    app = create_app(engine, tok, max_len=engine.max_len, vocab_size=engine.vocab_size, model_name="tiny",
                     update_from_disk=engine.update_weights_from_disk)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def test_real_engine_generate_routed_experts_and_logprobs(real_engine, tok):
    from opencomposer.engine.types import GenerationRequest, SamplingParams

    prompt, T = [1, 100, 200, 300, 400], 6
    cfg = real_engine.model.config
    L, K = len(cfg.moe_layers), cfg.num_experts_per_tok
    direct = await real_engine.generate(GenerationRequest(
        prompt, SamplingParams(temperature=0, max_new_tokens=T), return_routed_experts=True,
        return_prompt_routed_experts=True))
    async with serve_engine(real_engine, tok) as c:
        body = (await c.post("/generate", json={
            "input_ids": prompt, "return_logprob": True, "return_routed_experts": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": T}})).json()
    meta = body["meta_info"]
    assert body["output_ids"] == direct.output_ids and meta["finish_reason"]["type"] == "length"
    np.testing.assert_allclose([e[0] for e in meta["output_token_logprobs"]], direct.logprobs, atol=1e-6)
    assert meta["routed_experts_shape"] == [len(prompt) + T - 1, L, K]
    rows = decode_int32(meta["routed_experts"], L, K)
    np.testing.assert_array_equal(rows[: len(prompt)], direct.prompt_routed_experts)
    np.testing.assert_array_equal(rows[len(prompt) - 1:], direct.routed_experts)


async def test_real_engine_weight_update_changes_outputs_and_rejects_other_architectures(real_engine, tok, tmp_path):
    request = {"input_ids": [1, 100, 200], "return_logprob": True,
               "sampling_params": {"temperature": 0, "max_new_tokens": 4}}
    async with serve_engine(real_engine, tok) as c:
        before = (await c.post("/generate", json=request)).json()["meta_info"]
        step1 = tiny_checkpoint(tmp_path / "s1", seed=1)
        r = await c.post("/update_weights_from_disk", json={"model_path": str(step1)})
        assert r.status_code == 200 and r.json() == {**r.json(), "success": True, "version": 1}
        after = (await c.post("/generate", json=request)).json()["meta_info"]
        torch.manual_seed(0)
        other = tmp_path / "other"
        save_pretrained(Transformer(ModelConfig(vocab_size=4096, hidden_size=16, intermediate_size=24,
                                                moe_intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                                                num_key_value_heads=1, head_dim=8, num_experts=4,
                                                num_experts_per_tok=2)), other)
        refused = await c.post("/update_weights_from_disk", json={"model_path": str(other)})
        health = (await c.get("/health")).json()
    assert (before["weight_version"], after["weight_version"]) == ("0", "1")
    assert [e[0] for e in before["output_token_logprobs"]] != [e[0] for e in after["output_token_logprobs"]]
    assert refused.status_code == 400 and refused.json()["success"] is False
    assert "config" in refused.json()["message"] and health["policy_version"] == 1


async def test_speculative_decoding_counts_show_in_meta_info_and_metrics(tok, tmp_path):
    from opencomposer.engine.engine import Engine
    from opencomposer.model import load_pretrained

    engine = Engine(load_pretrained(tiny_checkpoint(tmp_path / "c")), max_slots=2, max_len=MAX_LEN,
                    speculative_depth=1)
    try:
        async with serve_engine(engine, tok) as c:
            meta = (await c.post("/generate", json={"input_ids": [1, 100, 200], "sampling_params": {
                "temperature": 0, "max_new_tokens": 8}})).json()["meta_info"]
            text = (await c.get("/metrics")).text
    finally:
        engine.stop()
    accepted, proposed = meta["spec_accepted_tokens"], meta["spec_proposed_tokens"]
    assert proposed > 0 and 0 <= accepted <= proposed
    assert f"\nopencomposer_spec_proposed_tokens_total {proposed}\n" in text
    assert f"\nopencomposer_spec_acceptance_rate {accepted / proposed}\n" in text


# ----------------------------------------------------------------------------- the CLI


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_cli_answers_health_and_generate(tmp_path):
    import subprocess
    import sys
    import time

    ckpt, port = tiny_checkpoint(tmp_path / "ckpt"), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "opencomposer.cli", "serve", "--model", str(ckpt), "--port",
                             str(port), "--max-slots", "2", "--max-len", "64"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                health = httpx.get(f"{url}/health", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "server did not come up"
                time.sleep(0.2)
        assert health.json() == {"status": "ok", "policy_version": 0}
        gen = httpx.post(f"{url}/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3}},
                         timeout=30)
        assert gen.status_code == 200 and len(gen.json()["output_ids"]) == 3
        assert httpx.get(f"{url}/v1/models", timeout=5).json()["data"][0]["id"] == "ckpt"
    finally:
        proc.terminate()
        log = proc.communicate(timeout=30)[0]
    # uvicorn shuts down cleanly, then re-raises SIGTERM so the exit status tells how it ended
    assert proc.returncode in (0, -15) and "Application shutdown complete" in log, log


def test_serve_cli_refuses_a_directory_that_is_not_a_checkpoint(tmp_path):
    from typer.testing import CliRunner

    from opencomposer.cli import app

    result = CliRunner().invoke(app, ["serve", "--model", str(tmp_path)])
    assert result.exit_code == 1 and "no config.json" in result.output
