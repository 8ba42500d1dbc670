"""Policy clients: how the harness, evaluation and RL talk to a policy, wherever it runs.

`PolicyClient` has two levels:

- token level, ``await client.generate(input_ids, sampling, *, return_logprob=True,
  return_routed_experts=False, return_prompt_routed_experts=False, logprobs_mode="raw") ->
  GenerationResult`` (types.py): token ids in; token ids, per-token behaviour logprobs, routed
  experts and policy versions out; logprobs_mode "processed" asks for the log-probabilities of
  the distribution actually sampled (temperature, top-p, top-k applied: what RL's ratio needs
  when it samples at a temperature other than 1). This is what RL rollouts use: the agent loop encodes the
  conversation itself (model/chat.py) and keeps the generated ids verbatim.
- chat level, ``await client.chat(messages, tools=None, sampling=SamplingParams()) ->
  ChatResult``: OpenAI-format messages and tools in; a `ChatResult` out with
  ``message`` (the assistant message as an OpenAI dict: role, content (None when there are
  only tool calls), tool_calls with JSON-string arguments, reasoning_content when the model
  thought), ``usage`` (prompt/completion tokens, cost in USD when prices are known),
  ``finish_reason`` ("stop", "length" or "tool_calls"), ``errors`` (malformed tool calls and
  other format problems, token-level backends only: OpenAI's message has no field for them)
  and ``raw`` (the `GenerationResult` for token-level backends, the response JSON otherwise).

Backends:

| client | token level | chat level |
|---|---|---|
| `InProcessClient(engine, tokenizer)` | the embedded engine | chat format -> engine -> parse |
| `SGLangClient(base_url)` | SGLang's native ``/generate`` (ours or SGLang's) | with `tokenizer=`: chat format over ``/generate``; else ``/v1/chat/completions`` |
| `VLLMClient(base_url, model)` | vLLM's ``/v1/completions`` with a token-id prompt | as SGLangClient |
| `OpenAIChatClient(base_url, model, ...)` | raises `InferenceError` | ``{base_url}/chat/completions``, with cost |

Chat through the tokenizer (``tokenizer=``) is exact for every chat format (model/chat.py: the
tokenizer's `chat_format`): the prompt is `encode_messages` and the reply is parsed from ids; a server's own chat endpoint uses the
server's chat template (for public models that ship one). Stop strings are matched on the
client side when the client holds the tokenizer, by the server otherwise.

HTTP clients use one `httpx.AsyncClient` each (connect timeout 10 s, read timeout
`timeout_s`); connection errors, 429 and 5xx are retried `max_retries` times with
exponential backoff (``backoff_s * 2**attempt``); other 4xx raise `InferenceError` at once
with the server's message. A read timeout is not retried (the request may still be
running); raise `timeout_s` for long generations. Routed experts: see protocol.py for the
wire layouts; SGLangClient needs ``routed_experts_shape=(L_moe, K)`` for servers that do not
send ``meta_info.routed_experts_shape`` (real SGLang); VLLMClient needs a vLLM started with
``--enable-return-routed-experts`` (its .npy payload carries the shape). vLLM reports no
policy version (`policy_versions` is None). Left out: streaming, n > 1 per call (call
concurrently instead), prompt-token logprobs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol, Sequence

import httpx

from opencomposer.engine.protocol import (
    apply_stop_strings, from_b64_int32, from_b64_npy, parse_version, split_routed_rows, text_before_stop,
)
from opencomposer.engine.types import GenerationRequest, GenerationResult, InferenceEngine, SamplingParams
from opencomposer.errors import InferenceError
from opencomposer.model.chat import Message, encode_messages, parse_assistant, stop_token_ids
from opencomposer.model.tokenizer import Tokenizer


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None = None
    """Known for priced endpoints (OpenAIChatClient); None for self-hosted ones."""


@dataclass
class ChatResult:
    """One assistant turn at chat level (see the module docstring)."""

    message: dict
    usage: Usage
    finish_reason: str
    raw: Any = None
    errors: list[str] = field(default_factory=list)


class PolicyClient(Protocol):
    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *, return_logprob: bool = True,
                       return_routed_experts: bool = False, return_prompt_routed_experts: bool = False,
                       logprobs_mode: str = "raw") -> GenerationResult: ...

    async def chat(self, messages: Sequence[dict], tools: Sequence[dict] | None = None,
                   sampling: SamplingParams = SamplingParams()) -> ChatResult: ...

    async def aclose(self) -> None: ...


GenerateFn = Callable[[list[int], SamplingParams], Awaitable[GenerationResult]]


async def chat_turn(generate: GenerateFn, tok: Tokenizer, prompt_ids: list[int], sampling: SamplingParams,
                    call_id_prefix: str | None = None, tools: Sequence[dict] | None = None) -> ChatResult:
    """One assistant turn over a token-level `generate`: stop on the chat format's end tokens
    (plus any the caller gave), match stop strings here, parse the reply.

    `prompt_ids` is ``encode_messages(tok, messages, tools, add_generation_prompt=True)``; the reply is
    parsed in the tokenizer's chat format (`tools` types the arguments of formats that need it).
    finish_reason: "length" when cut off by max tokens, else "tool_calls" when the reply
    holds a valid call, else "stop"."""
    stops = tuple(dict.fromkeys((*sampling.stop_token_ids, *stop_token_ids(tok))))
    result = await generate(prompt_ids, dataclasses.replace(sampling, stop_token_ids=stops, stop=()))
    result, matched = apply_stop_strings(result, tok, sampling.stop)
    prefix = call_id_prefix or f"call_{uuid.uuid4().hex[:8]}_"
    if matched is None:
        parsed = parse_assistant(result.output_ids, tok, call_id_prefix=prefix, tools=tools)
    else:  # cut the text at the stop string; special tokens are kept as strings for the parser
        parsed = parse_assistant(text_before_stop(tok.decode(result.output_ids), matched), tok,
                                 call_id_prefix=prefix, tools=tools)
    if result.finish_reason == "stop":
        finish = "tool_calls" if parsed.valid_calls else "stop"
    else:
        finish = result.finish_reason
    return ChatResult(message=parsed.to_openai(), usage=Usage(len(prompt_ids), len(result.output_ids)),
                      finish_reason=finish, raw=result, errors=list(parsed.errors))


def _request(input_ids: Sequence[int], sampling: SamplingParams, return_logprob: bool, return_routed_experts: bool,
             return_prompt_routed_experts: bool, logprobs_mode: str = "raw") -> GenerationRequest:
    return GenerationRequest(input_ids=list(input_ids), sampling=dataclasses.replace(sampling, stop=()),
                             return_logprob=return_logprob, return_routed_experts=return_routed_experts,
                             return_prompt_routed_experts=return_prompt_routed_experts,
                             request_id=uuid.uuid4().hex, logprobs_mode=logprobs_mode)


class InProcessClient:
    """The embedded engine (same process). A tokenizer is needed for chat and stop strings."""

    def __init__(self, engine: InferenceEngine, tokenizer: Tokenizer | None = None):
        self.engine, self.tokenizer = engine, tokenizer

    def _tok(self, what: str) -> Tokenizer:
        if self.tokenizer is None:
            raise InferenceError(f"{what} needs a tokenizer: InProcessClient(engine, tokenizer)")
        return self.tokenizer

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *, return_logprob: bool = True,
                       return_routed_experts: bool = False, return_prompt_routed_experts: bool = False,
                       logprobs_mode: str = "raw") -> GenerationResult:
        tok = self._tok("stop strings") if sampling.stop else None
        result = await self.engine.generate(_request(input_ids, sampling, return_logprob, return_routed_experts,
                                                     return_prompt_routed_experts, logprobs_mode))
        return apply_stop_strings(result, tok, sampling.stop)[0] if tok else result

    async def chat(self, messages: Sequence[dict], tools: Sequence[dict] | None = None,
                   sampling: SamplingParams = SamplingParams()) -> ChatResult:
        tok = self._tok("chat")
        return await chat_turn(self.generate, tok, encode_messages(tok, messages, tools, add_generation_prompt=True),
                               sampling, tools=tools)

    async def aclose(self) -> None:
        pass


# ----------------------------------------------------------------------------- HTTP


def _error_text(r: httpx.Response) -> str:
    """The server's reason: OpenAI/our {"error": {"message"}}, FastAPI {"detail"}, or the body."""
    try:
        body = r.json()
    except ValueError:
        return r.text[:1000]
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if err is not None:
            return str(err)
    return str(body)[:1000]


class _HTTPClient:
    """One httpx.AsyncClient with retries (see the module docstring)."""

    def __init__(self, base_url: str, *, timeout_s: float = 600.0, max_retries: int = 3, backoff_s: float = 0.5,
                 headers: dict | None = None, transport: httpx.AsyncBaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        self.max_retries, self.backoff_s = max_retries, backoff_s
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers, transport=transport,
                                       timeout=httpx.Timeout(timeout_s, connect=10.0))

    async def _post(self, path: str, body: dict) -> Any:
        url = f"{self.base_url}{path}"
        for attempt in range(self.max_retries + 1):
            try:
                r = await self._http.post(path, json=body)
            except httpx.TimeoutException as exc:
                if isinstance(exc, httpx.ConnectTimeout):
                    error = InferenceError(f"POST {url}: could not connect ({exc!r})")
                else:
                    raise InferenceError(f"POST {url}: no answer within the read timeout; raise timeout_s for "
                                         f"long generations") from exc
            except httpx.TransportError as exc:
                error = InferenceError(f"POST {url}: {type(exc).__name__}: {exc} (is the server running?)")
            else:
                if r.status_code < 400:
                    return r.json()
                error = InferenceError(f"POST {url} answered {r.status_code}: {_error_text(r)}", r.status_code)
                if r.status_code < 500 and r.status_code != 429:
                    raise error
            if attempt < self.max_retries:
                await asyncio.sleep(self.backoff_s * 2 ** attempt)
        raise InferenceError(f"{error} (gave up after {self.max_retries + 1} attempts)", error.status)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


def _openai_chat_body(model: str | None, messages: Sequence, tools: Sequence[dict] | None,
                      sampling: SamplingParams) -> dict:
    body: dict[str, Any] = {
        "messages": [m.to_openai() if isinstance(m, Message) else m for m in messages],
        "temperature": sampling.temperature, "top_p": sampling.top_p, "max_tokens": sampling.max_new_tokens,
    }
    if model is not None:
        body["model"] = model
    if tools:
        body["tools"] = list(tools)
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.top_k > 0:  # SGLang/vLLM extensions; a hosted API may refuse them, with a clear 400
        body["top_k"] = sampling.top_k
    if sampling.stop_token_ids:
        body["stop_token_ids"] = list(sampling.stop_token_ids)
    return body


def _chat_result(resp: dict, input_price_per_m: float | None = None,
                 output_price_per_m: float | None = None) -> ChatResult:
    choice = resp["choices"][0]
    message = dict(choice["message"])
    message.setdefault("role", "assistant")
    if "reasoning" in message and "reasoning_content" not in message:  # some servers' name for it
        message["reasoning_content"] = message.pop("reasoning")
    usage = resp.get("usage") or {}
    pt, ct = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    cost = None
    if input_price_per_m is not None and output_price_per_m is not None:
        cost = (pt * input_price_per_m + ct * output_price_per_m) / 1e6
    return ChatResult(message=message, usage=Usage(pt, ct, cost), finish_reason=choice.get("finish_reason") or "stop",
                      raw=resp)


async def _token_server_chat(client: "SGLangClient | VLLMClient", messages: Sequence, tools: Sequence[dict] | None,
                             sampling: SamplingParams) -> ChatResult:
    """Chat for servers that also generate from token ids: through the tokenizer when the
    client has one, else through the server's own chat endpoint (and chat template)."""
    if client.tokenizer is not None:
        prompt = encode_messages(client.tokenizer, messages, tools, add_generation_prompt=True)
        return await chat_turn(client.generate, client.tokenizer, prompt, sampling, tools=tools)
    body = _openai_chat_body(client.model, messages, tools, sampling)
    if not isinstance(client, VLLMClient):
        return _chat_result(await client._post("/v1/chat/completions", body))
    body["messages"] = [_reasoning_as_vllm(m) for m in body["messages"]]  # vLLM reads earlier thinking there
    body["skip_special_tokens"] = False  # the formats' tool-call tokens are special
    result = _chat_result(await client._post("/v1/chat/completions", body))
    if result.message.get("tool_calls"):  # malformed calls as opencomposer's parser plugin sends them
        result.message["tool_calls"] = [_harness_call(c) for c in result.message["tool_calls"]]
    return result


def _harness_call(call: dict) -> dict:
    """A tool call of vLLM's chat reply, with a malformed one (vllm_tool_parser's form) turned into
    the harness's: `error` and `raw` beside the call, so the agent returns it to the model as a
    tool error instead of running it."""
    from opencomposer.engine.vllm_tool_parser import malformed_from_openai

    bad = malformed_from_openai(call)
    if bad is None:
        return call
    return bad.to_openai() | {"error": bad.error, "raw": bad.raw or ""}


def _reasoning_as_vllm(message: dict) -> dict:
    if "reasoning_content" not in message:
        return message
    m = dict(message)
    m["reasoning"] = m.pop("reasoning_content")
    return m


class SGLangClient(_HTTPClient):
    """SGLang's native ``/generate`` (opencomposer's server speaks it too). `base_url` is the
    server root, e.g. ``http://127.0.0.1:30000``. logprobs_mode "processed" is sent as the body's
    ``logprobs_mode`` (opencomposer's server's extension; SGLang itself refuses the field)."""

    def __init__(self, base_url: str, *, tokenizer: Tokenizer | None = None,
                 routed_experts_shape: tuple[int, int] | None = None, **http):
        super().__init__(base_url, **http)
        self.tokenizer, self.routed_experts_shape = tokenizer, routed_experts_shape
        self.model: str | None = None

    async def chat(self, messages: Sequence[dict], tools: Sequence[dict] | None = None,
                   sampling: SamplingParams = SamplingParams()) -> ChatResult:
        return await _token_server_chat(self, messages, tools, sampling)

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *, return_logprob: bool = True,
                       return_routed_experts: bool = False, return_prompt_routed_experts: bool = False,
                       logprobs_mode: str = "raw") -> GenerationResult:
        ids = list(input_ids)
        sp: dict[str, Any] = {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
                              "max_new_tokens": sampling.max_new_tokens, "skip_special_tokens": False}
        if sampling.stop:
            sp["stop"] = list(sampling.stop)
        if sampling.stop_token_ids:
            sp["stop_token_ids"] = list(sampling.stop_token_ids)
        if sampling.seed is not None:
            sp["sampling_seed"] = sampling.seed
        body: dict[str, Any] = {"input_ids": ids, "sampling_params": sp, "return_logprob": return_logprob,
                                "rid": uuid.uuid4().hex}
        if return_routed_experts:
            body["return_routed_experts"] = True
            body["routed_experts_start_len"] = 0 if return_prompt_routed_experts else max(len(ids) - 1, 0)
        if logprobs_mode != "raw":
            body["logprobs_mode"] = logprobs_mode
        resp = await self._post("/generate", body)
        return self._result(ids, resp, return_logprob, return_routed_experts)

    def _result(self, ids: list[int], resp: dict, return_logprob: bool, return_routed: bool) -> GenerationResult:
        meta, out = resp["meta_info"], list(resp["output_ids"])
        fr = meta.get("finish_reason")
        reason = fr.get("type", "abort") if isinstance(fr, dict) else (fr or "abort")
        logprobs = [float(e[0]) for e in meta["output_token_logprobs"]] if return_logprob else None
        versions = meta.get("policy_versions")
        if versions is None and (v := parse_version(meta.get("weight_version"))) is not None:
            versions = [v] * len(out)
        prompt_routed = routed = None
        if return_routed and out:
            if "routed_experts" not in meta:
                raise InferenceError(f"{self.base_url} returned no routed experts: start SGLang with "
                                     f"--enable-return-routed-experts")
            shape = meta.get("routed_experts_shape")
            if shape is None and self.routed_experts_shape is None:
                raise InferenceError("cannot decode routed experts: pass routed_experts_shape=(moe_layers, top_k) "
                                     "to SGLangClient")
            L, K = shape[1:] if shape is not None else self.routed_experts_shape
            prompt_routed, routed = split_routed_rows(from_b64_int32(meta["routed_experts"], L, K), len(ids), len(out))
        return GenerationResult(request_id=str(meta.get("id") or ""), prompt_ids=ids, output_ids=out,
                                finish_reason=reason, logprobs=logprobs, routed_experts=routed,
                                prompt_routed_experts=prompt_routed, policy_versions=versions)


class VLLMClient(_HTTPClient):
    """vLLM's OpenAI server: token ids in as the ``/v1/completions`` prompt, ids back via
    ``return_token_ids`` (or ``return_tokens_as_token_ids`` logprobs), logprobs with
    ``logprobs=0`` (the sampled token only), routed experts via ``routed_experts_prompt_start``
    and ``choices[].routed_experts`` (.npy in base64). `base_url` is the server root.
    vLLM sets the logprobs mode per server, not per request: `logprobs_mode` says which the
    server was started with (``--logprobs-mode processed_logprobs`` for "processed"), and a
    request for the other one is refused rather than answered with the wrong numbers."""

    def __init__(self, base_url: str, model: str, *, tokenizer: Tokenizer | None = None,
                 logprobs_mode: str = "raw", **http):
        super().__init__(base_url, **http)
        self.model, self.tokenizer, self.logprobs_mode = model, tokenizer, logprobs_mode

    async def chat(self, messages: Sequence[dict], tools: Sequence[dict] | None = None,
                   sampling: SamplingParams = SamplingParams()) -> ChatResult:
        return await _token_server_chat(self, messages, tools, sampling)

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *, return_logprob: bool = True,
                       return_routed_experts: bool = False, return_prompt_routed_experts: bool = False,
                       logprobs_mode: str = "raw") -> GenerationResult:
        identity = sampling.temperature == 1.0 and sampling.top_p >= 1.0 and sampling.top_k <= 0
        if return_logprob and logprobs_mode != self.logprobs_mode and not identity:  # else both modes agree
            raise InferenceError(f"{logprobs_mode} logprobs asked of a vLLM server declared {self.logprobs_mode!r}: "
                                 f"start vLLM with --logprobs-mode {logprobs_mode}_logprobs and pass "
                                 f"VLLMClient(..., logprobs_mode={logprobs_mode!r})")
        ids = list(input_ids)
        body: dict[str, Any] = {
            "model": self.model, "prompt": ids, "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "stop": list(sampling.stop),
            "stop_token_ids": list(sampling.stop_token_ids), "skip_special_tokens": False,
            "return_token_ids": True, "return_tokens_as_token_ids": True,
        }
        if sampling.top_k > 0:
            body["top_k"] = sampling.top_k
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if return_logprob:
            body["logprobs"] = 0
        if return_routed_experts:  # vLLM's field; answered when started with --enable-return-routed-experts
            body["routed_experts_prompt_start"] = 0 if return_prompt_routed_experts else max(len(ids) - 1, 0)
        resp = await self._post("/v1/completions", body)
        choice = resp["choices"][0]
        lp = choice.get("logprobs") or {}
        if choice.get("token_ids") is not None:
            out = list(choice["token_ids"])
        elif lp.get("tokens") is not None:
            out = [int(t.removeprefix("token_id:")) for t in lp["tokens"]]
        else:
            raise InferenceError(f"{self.base_url} returned no token ids: this vLLM is too old for "
                                 f"return_token_ids (request logprobs to get them)")
        prompt_routed = routed = None
        if return_routed_experts and out:
            if choice.get("routed_experts") is None:
                raise InferenceError(f"{self.base_url} returned no routed experts: start vLLM with "
                                     f"--enable-return-routed-experts")
            prompt_routed, routed = split_routed_rows(from_b64_npy(choice["routed_experts"]), len(ids), len(out))
        return GenerationResult(
            request_id=str(resp.get("id") or ""), prompt_ids=ids, output_ids=out,
            finish_reason=choice.get("finish_reason") or "abort",
            logprobs=[float(x) for x in lp["token_logprobs"]] if return_logprob else None,
            routed_experts=routed, prompt_routed_experts=prompt_routed)


class OpenAIChatClient(_HTTPClient):
    """A hosted or chat-only OpenAI-compatible endpoint (chat level only). `base_url` includes
    the version prefix, as in OpenAI's SDK (``https://api.openai.com/v1``); the API key is read
    from the environment variable `api_key_env` (None: send no key, for local servers). Prices
    are USD per million input / output tokens; with both given, `Usage.cost_usd` is set."""

    def __init__(self, base_url: str, model: str, *, api_key_env: str | None = "OPENAI_API_KEY",
                 input_price_per_m: float | None = None, output_price_per_m: float | None = None, **http):
        headers = {}
        if api_key_env is not None:
            key = os.environ.get(api_key_env)
            if not key:
                raise InferenceError(f"environment variable {api_key_env} is not set: export your API key there, "
                                     f"or pass api_key_env=None for an endpoint without keys")
            headers["Authorization"] = f"Bearer {key}"
        super().__init__(base_url, headers=headers, **http)
        self.model, self.prices = model, (input_price_per_m, output_price_per_m)

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, **kw) -> GenerationResult:
        raise InferenceError(f"{self.base_url} is a chat-only endpoint: token-level generate (token ids, logprobs, "
                             f"routed experts) needs SGLangClient, VLLMClient or InProcessClient")

    async def chat(self, messages: Sequence[dict], tools: Sequence[dict] | None = None,
                   sampling: SamplingParams = SamplingParams()) -> ChatResult:
        resp = await self._post("/chat/completions", _openai_chat_body(self.model, messages, tools, sampling))
        return _chat_result(resp, *self.prices)


__all__ = ["PolicyClient", "ChatResult", "Usage", "InProcessClient", "SGLangClient", "VLLMClient", "OpenAIChatClient",
           "chat_turn"]
