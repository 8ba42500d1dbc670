"""The inference server: an engine behind SGLang's native API and OpenAI's, on 127.0.0.1.

Endpoints (`create_app`; `opencomposer serve` runs it with uvicorn):

- ``POST /generate``: token in, token out, with SGLang's field names. Request: ``input_ids``
  (a list of ids, or a list of lists for a batch; or ``text``, encoded after ``<|bos|>``),
  ``sampling_params`` (``temperature``, ``top_p``, ``top_k``, ``max_new_tokens`` (default 128,
  cut to what fits the context when not given), ``stop``, ``stop_token_ids``,
  ``sampling_seed`` (or ``seed``), ``skip_special_tokens``, ``no_stop_trim``; SGLang's
  penalties, ``min_p``, ``min_new_tokens``, ``ignore_eos`` and ``n`` only at their neutral
  values), ``return_logprob``, ``return_text_in_logprobs``, ``return_routed_experts``,
  ``routed_experts_start_len``, ``rid``. Response (a list for a batch): ``text``,
  ``output_ids`` (stop token included) and ``meta_info``: ``id``, ``finish_reason``
  ({"type": "stop", "matched": id or string} | {"type": "length", "length": n} |
  {"type": "abort", ...}), ``prompt_tokens``, ``completion_tokens``, ``cached_tokens`` (0),
  ``weight_version`` (the policy version as a string, as SGLang), ``e2e_latency``,
  ``output_token_logprobs`` ([[logprob, token_id, text or null], ...]), ``routed_experts``
  (base64 int32, rows ``[routed_experts_start_len, P + T - 1)``, see protocol.py), and the
  opencomposer extensions ``routed_experts_shape`` ([rows, L_moe, K]), ``policy_versions``
  (per output token) and ``spec_accepted_tokens`` / ``spec_proposed_tokens``.
- ``POST /v1/chat/completions`` (OpenAI): messages and tools through the tokenizer's chat format
  (model/chat.py: opencomposer, qwen3, qwen3_coder; a reply sent back re-renders to the ids
  generated when they were the canonical encoding); ``choices[i].message`` has content, tool_calls and reasoning_content;
  finish_reason "tool_calls" when the reply holds a valid call; ``stop`` strings are matched
  on the decoded reply; ``logprobs``; ``n``; vLLM's ``return_token_ids`` adds
  ``choices[i].token_ids`` and ``prompt_token_ids``. ``max_tokens`` defaults to the rest of
  the context.
- ``POST /v1/completions`` (OpenAI, with vLLM's extensions): ``prompt`` as a string (encoded
  after ``<|bos|>``), a list of ids, or a list of either; ``logprobs`` (the sampled tokens'
  logprobs; ``top_logprobs`` is null: alternatives are not computed), ``n``,
  ``return_token_ids``, ``return_tokens_as_token_ids``, and routed experts with
  ``routed_experts_prompt_start`` (vLLM's field, which asks for them; .npy in base64; our
  ``return_routed_experts`` alone asks with start 0).
- ``POST /update_weights_from_disk`` {model_path, load_format} (SGLang's): loads an HF
  checkpoint directory and swaps the weights in place between decode steps; the policy
  version increments. Answers {success, message, version} (400 with success false on a bad
  checkpoint; the old weights stay).
- ``GET /health``, ``GET /v1/models``, ``GET /get_model_info``, ``GET /metrics`` (Prometheus
  text: requests by endpoint and status, prompt and generated tokens, requests in flight,
  running/waiting when the engine counts them, policy version, weight updates, speculative
  tokens proposed/accepted and the acceptance rate).

Bad input (malformed or too deeply nested JSON, missing fields, wrong types, token ids
outside the vocabulary, a prompt that leaves no room in the context, an explicit max tokens
that does not fit, bad sampling parameters, unsupported options) is answered 400 with
``{"error": {"message", "type": "invalid_request_error", "code": 400}}``; a body over
`max_body_bytes` 413 (refused from its Content-Length before reading, or as soon as a
streamed body passes the limit); an unknown route 404, an engine failure 500, in the same
shape; the server keeps serving. A client that disconnects before its body is read is
counted as 499, not as a server error. Unknown top-level fields are ignored (clients send
many); unknown sampling parameters are refused.

Work before the engine is bounded by the request's size: the body limit (default
`default_body_limit(max_len)`), and a prompt given as text is refused before it is tokenized
when its length alone shows it cannot fit (a token covers at most `chars_per_token`
characters), so a huge text costs neither tokenizer time nor memory. /health keeps answering
meanwhile.

Left out: streaming (``stream: true`` is refused with a 400), prompt-token logprobs
(``logprob_start_len`` >= 0 inside the prompt), top-k alternative logprobs, ``echo``,
tool_choice other than "auto"/"none", authentication (bind to 127.0.0.1, the default).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
import uuid
from collections import Counter
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from opencomposer.engine.client import chat_turn
from opencomposer.engine.protocol import (
    apply_stop_strings, b64_int32, b64_npy, routed_rows, sglang_finish_reason, text_before_stop,
)
from opencomposer.engine.requests import (
    CLIENT_CLOSED, BadRequest, ChatBody, CompletionBody, GenerateBody, SGLangSampling, UpdateWeightsBody,
    default_body_limit, error_response, parse_body, validate_body,
)
from opencomposer.engine.types import GenerationRequest, GenerationResult, InferenceEngine, SamplingParams
from opencomposer.errors import CheckpointError, ConfigError, MessageError
from opencomposer.model.chat import encode_messages
from opencomposer.model.tokenizer import Tokenizer

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- the server


class Server:
    """The engine, the tokenizer, the limits and the counters behind the routes."""

    def __init__(self, engine: InferenceEngine, tokenizer: Tokenizer, *, max_len: int, vocab_size: int,
                 max_body_bytes: int):
        self.engine, self.tok = engine, tokenizer
        self.max_len, self.vocab_size, self.max_body_bytes = max_len, vocab_size, max_body_bytes
        self.chars_per_token = chars_per_token(tokenizer)
        self.requests: Counter[tuple[str, int]] = Counter()
        self.prompt_tokens = self.generated_tokens = self.spec_accepted = self.spec_proposed = 0
        self.weight_updates = self.in_flight = 0
        self.created = int(time.time())

    # --- validation

    def check_ids(self, ids: Any, what: str) -> list[int]:
        if not isinstance(ids, list) or not all(type(t) is int for t in ids):
            raise BadRequest(f"{what} must be a list of token ids (integers)")
        if not ids:
            raise BadRequest(f"{what} is empty")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise BadRequest(f"{what} holds token id {bad[0]}, outside the vocabulary [0, {self.vocab_size})")
        if len(ids) >= self.max_len:
            raise BadRequest(f"{what} has {len(ids)} tokens; the context holds {self.max_len} (prompt + output), "
                             f"so the prompt must be shorter than {self.max_len}")
        return ids

    def budget(self, prompt_len: int, requested: int | None, default: int | None, field: str) -> int:
        """Tokens to generate: an explicit request must fit the context; a default is cut to fit."""
        room = self.max_len - prompt_len
        if requested is None:
            return room if default is None else min(default, room)
        if requested > room:
            raise BadRequest(f"{field}={requested} does not fit: the prompt has {prompt_len} tokens and the context "
                             f"holds {self.max_len}, so at most {room} can be generated")
        return requested

    def sampling(self, **kw) -> SamplingParams:
        stop_ids = kw.get("stop_token_ids") or ()
        if any(not 0 <= t < self.vocab_size for t in stop_ids):
            raise BadRequest(f"stop_token_ids must be in [0, {self.vocab_size})")
        kw = {k: v for k, v in kw.items() if v is not None}
        if isinstance(kw.get("stop"), str):
            kw["stop"] = (kw["stop"],)
        kw["stop"], kw["stop_token_ids"] = tuple(kw.get("stop", ())), tuple(stop_ids)
        try:
            return SamplingParams(**kw)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None

    def check_text_fits(self, chars: int, what: str) -> None:
        """Refuse, without tokenizing, text whose length alone shows it cannot fit the context."""
        fewest = -(-chars // self.chars_per_token)
        if fewest >= self.max_len:
            raise BadRequest(f"{what} has {chars:,} characters, so at least {fewest:,} tokens (a token covers at "
                             f"most {self.chars_per_token} characters); the context holds {self.max_len} tokens "
                             "(prompt + output)")

    def text_prompt(self, text: str, what: str) -> list[int]:
        self.check_text_fits(len(text) + (self.tok.bos_id is not None), what)
        return [self.tok.bos_id, *self.tok.encode(text)] if self.tok.bos_id is not None else self.tok.encode(text)

    # --- running

    async def run(self, request: GenerationRequest, stop: tuple[str, ...]) -> tuple[GenerationResult, str | int | None]:
        self.in_flight += 1
        try:
            result = await self.engine.generate(request)
        finally:
            self.in_flight -= 1
        result, matched = apply_stop_strings(result, self.tok, stop)
        if matched is None and result.finish_reason == "stop" and result.output_ids:
            matched = result.output_ids[-1]
        self.prompt_tokens += len(result.prompt_ids)
        self.generated_tokens += len(result.output_ids)
        self.spec_accepted += result.spec_accepted
        self.spec_proposed += result.spec_proposed
        return result, matched

    async def generate_ids(self, ids: list[int], sampling: SamplingParams) -> GenerationResult:
        """Token-level generate for `chat_turn` (it matches stop strings itself)."""
        req = GenerationRequest(input_ids=ids, sampling=sampling, return_logprob=True, request_id=uuid.uuid4().hex)
        return (await self.run(req, ()))[0]

    def metrics(self) -> str:
        lines = ["# TYPE opencomposer_requests_total counter"]
        lines += [f'opencomposer_requests_total{{endpoint="{p}",status="{s}"}} {n}'
                  for (p, s), n in sorted(self.requests.items())]
        gauges = {"requests_in_flight": self.in_flight, "policy_version": self.engine.policy_version}
        for name in ("num_running", "num_waiting"):  # engines that schedule requests count them
            if isinstance(getattr(self.engine, name, None), int):
                gauges[f"requests_{name.removeprefix('num_')}"] = getattr(self.engine, name)
        if self.spec_proposed:
            gauges["spec_acceptance_rate"] = self.spec_accepted / self.spec_proposed
        counters = {"prompt_tokens_total": self.prompt_tokens, "generation_tokens_total": self.generated_tokens,
                    "spec_accepted_tokens_total": self.spec_accepted,
                    "spec_proposed_tokens_total": self.spec_proposed, "weight_updates_total": self.weight_updates}
        for kind, values in (("counter", counters), ("gauge", gauges)):
            for name, value in values.items():
                lines += [f"# TYPE opencomposer_{name} {kind}", f"opencomposer_{name} {value}"]
        return "\n".join(lines) + "\n"


def chars_per_token(tok: Tokenizer) -> int:
    """The most characters of text one token can stand for: its vocabulary entry's length
    (bytes, for byte-level BPE), x4 for a normalizer that composes characters (NFC: at most 3)."""
    return 4 * max(map(len, tok.hf.get_vocab(with_added_tokens=False)), default=1)


def create_app(engine: InferenceEngine, tokenizer: Tokenizer, *, max_len: int, vocab_size: int,
               model_name: str = "opencomposer",
               update_from_disk: Callable[[str, int | None], int] | None = None,
               max_body_bytes: int | None = None) -> FastAPI:
    """The FastAPI app serving `engine` (see the module docstring). `max_len` is the engine's
    context (prompt + output tokens per request). `update_from_disk(path, version)` loads a
    checkpoint directory into the engine and returns the new policy version (`Engine` has
    one that also checks the config matches); by default the checkpoint's state dict goes
    to `engine.update_weights`, which checks names and shapes. `max_body_bytes`: larger
    request bodies get 413 (default: `default_body_limit(max_len)`)."""
    limit = max_body_bytes if max_body_bytes is not None else default_body_limit(max_len)
    srv = Server(engine, tokenizer, max_len=max_len, vocab_size=vocab_size, max_body_bytes=limit)
    routes = Routes(srv, model_name, update_from_disk or functools.partial(_load_state_dict, engine))
    app = FastAPI(title="opencomposer inference server", docs_url=None, redoc_url=None)
    app.state.server = srv
    app.add_exception_handler(StarletteHTTPException, functools.partial(_http_error, srv))
    for method, path, endpoint in routes.table():
        app.add_api_route(path, guarded(srv, method, path, endpoint), methods=[method])
    return app


def _load_state_dict(engine: InferenceEngine, path: str, version: int | None) -> int:
    """The default weight update: the checkpoint's state dict into `engine.update_weights`."""
    from opencomposer.model import load_pretrained

    return engine.update_weights(load_pretrained(path).state_dict(), version)


async def _http_error(srv: Server, request: Request, exc: StarletteHTTPException) -> Response:
    """Starlette's own errors (no such route, wrong method) as JSON errors, counted."""
    srv.requests[(request.url.path if exc.status_code != 404 else "unknown", exc.status_code)] += 1
    return error_response(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                          "not_found_error" if exc.status_code == 404 else "invalid_request_error")


def guarded(srv: Server, method: str, path: str, fn: Callable[[Request], Any]) -> Callable[[Request], Any]:
    """`fn` answering every failure as a JSON error (a bad request is the client's, anything else
    the engine's: logged, and the server keeps serving), with each answer counted by status."""
    @functools.wraps(fn)
    async def handler(request: Request):
        try:
            response = await fn(request)
        except BadRequest as exc:
            response = error_response(exc.status, str(exc), "invalid_request_error")
        except MessageError as exc:
            response = error_response(400, f"bad message: {exc}", "invalid_request_error")
        except ClientDisconnect:  # nobody is left to answer: not a server error
            response = Response(status_code=CLIENT_CLOSED)
        except RecursionError:  # a parsed body nested deeper than any field allows
            response = error_response(400, "request nests too deeply", "invalid_request_error")
        except Exception as exc:  # the engine failed: report it, keep serving
            log.exception("%s %s failed", method, path)
            response = error_response(500, f"internal error: {type(exc).__name__}: {exc}", "internal_error")
        srv.requests[(path, getattr(response, "status_code", 200))] += 1
        return response
    return handler


# ----------------------------------------------------------------------------- the routes


class Routes:
    """One method per endpoint: parse the body, check it against the server's limits, run the
    engine, shape the answer in the API's format."""

    def __init__(self, srv: Server, model_name: str, update_from_disk: Callable[[str, int | None], int]):
        self.srv, self.model_name, self.update_from_disk = srv, model_name, update_from_disk

    def table(self) -> list[tuple[str, str, Callable[[Request], Any]]]:
        """(method, path, endpoint) of every route."""
        return [
            ("GET", "/health", self.health),
            ("GET", "/v1/models", self.models),
            ("GET", "/get_model_info", self.model_info),
            ("GET", "/metrics", self.metrics),
            ("POST", "/generate", self.generate),
            ("POST", "/v1/completions", self.completions),
            ("POST", "/v1/chat/completions", self.chat),
            ("POST", "/update_weights_from_disk", self.update_weights),
        ]

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "policy_version": self.srv.engine.policy_version})

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": self.srv.created, "owned_by": "opencomposer",
             "max_model_len": self.srv.max_len}]})

    async def model_info(self, request: Request) -> Response:
        return JSONResponse({"model_path": self.model_name, "is_generation": True, "max_len": self.srv.max_len,
                             "weight_version": str(self.srv.engine.policy_version)})

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(self.srv.metrics(), media_type="text/plain; version=0.0.4")

    # --- SGLang's /generate

    async def generate(self, request: Request) -> Response:
        srv = self.srv
        body: GenerateBody = await parse_body(request, GenerateBody, srv.max_body_bytes)
        batch, prompts = self._generate_prompts(body)
        sp_raw = body.sampling_params
        if isinstance(sp_raw, list):
            sps = [validate_body(SGLangSampling, x, f"sampling_params[{i}]") for i, x in enumerate(sp_raw)]
        else:
            sps = [validate_body(SGLangSampling, sp_raw or {}, "sampling_params")] * len(prompts)
        rids = body.rid if isinstance(body.rid, list) else [body.rid] * len(prompts)
        if len(sps) != len(prompts) or len(rids) != len(prompts):
            raise BadRequest(f"sampling_params and rid lists must have one entry per prompt ({len(prompts)})")
        jobs = [self._generate_job(body, ids, sp, rid) for ids, sp, rid in zip(prompts, sps, rids)]
        t0 = time.perf_counter()
        results = await asyncio.gather(*(srv.run(req, sampling.stop) for req, sampling, _ in jobs))
        latency = time.perf_counter() - t0
        out = [_sglang_response(srv, body, sp, result, matched, latency)
               for (_, _, sp), (result, matched) in zip(jobs, results)]
        return JSONResponse(out if batch else out[0])

    def _generate_prompts(self, body: GenerateBody) -> tuple[bool, list[list[int]]]:
        """(whether the request is a batch, its checked prompts): token ids or text, one or a list."""
        srv = self.srv
        if body.input_ids is not None:
            batch = isinstance(body.input_ids, list) and bool(body.input_ids) and isinstance(body.input_ids[0], list)
            prompts = [srv.check_ids(p, f"input_ids[{i}]") for i, p in enumerate(body.input_ids)] if batch else \
                [srv.check_ids(body.input_ids, "input_ids")]
        elif body.text is not None:
            batch = isinstance(body.text, list)
            prompts = [srv.check_ids(srv.text_prompt(t, "text"), "text") for t in (body.text if batch else [body.text])]
        else:
            raise BadRequest("give the prompt as input_ids (token ids) or text")
        return batch, prompts

    def _generate_job(self, body: GenerateBody, ids: list[int], sp: SGLangSampling,
                      rid: str | None) -> tuple[GenerationRequest, SamplingParams, SGLangSampling]:
        """One prompt's engine request, its sampling (with the stop strings the server matches)
        and its SGLang sampling parameters (for the answer)."""
        srv = self.srv
        if 0 <= body.logprob_start_len < len(ids):
            raise BadRequest("prompt-token logprobs (logprob_start_len inside the prompt) are not supported")
        if body.return_routed_experts and body.routed_experts_start_len > len(ids):
            raise BadRequest(f"routed_experts_start_len={body.routed_experts_start_len} must be in "
                             f"[0, prompt length {len(ids)}]")
        sampling = srv.sampling(temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k,
                                max_new_tokens=srv.budget(len(ids), sp.max_new_tokens, 128,
                                                          "sampling_params.max_new_tokens"),
                                stop=sp.stop, stop_token_ids=sp.stop_token_ids,
                                seed=sp.sampling_seed if sp.sampling_seed is not None else sp.seed)
        req = GenerationRequest(
            input_ids=ids, sampling=dataclasses.replace(sampling, stop=()), return_logprob=body.return_logprob,
            return_routed_experts=body.return_routed_experts,
            return_prompt_routed_experts=(body.return_routed_experts
                                          and body.routed_experts_start_len < len(ids) - 1),
            request_id=rid or uuid.uuid4().hex, logprobs_mode=body.logprobs_mode)
        return req, sampling, sp

    # --- OpenAI's /v1/completions

    async def completions(self, request: Request) -> Response:
        srv = self.srv
        body: CompletionBody = await parse_body(request, CompletionBody, srv.max_body_bytes)
        prompts = [srv.check_ids(ids, "prompt") for ids in self._completion_prompts(body)]
        jobs = []
        for ids in prompts:
            if body.return_routed_experts and body.routed_experts_prompt_start > len(ids):
                raise BadRequest(f"routed_experts_prompt_start={body.routed_experts_prompt_start} must be in "
                                 f"[0, prompt length {len(ids)}]")
            for i in range(body.n):
                sampling = srv.sampling(
                    temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, stop=body.stop,
                    max_new_tokens=srv.budget(len(ids), body.max_tokens, 16, "max_tokens"),
                    stop_token_ids=body.stop_token_ids, seed=None if body.seed is None else body.seed + i)
                req = GenerationRequest(
                    input_ids=ids, sampling=dataclasses.replace(sampling, stop=()),
                    return_logprob=body.logprobs is not None, return_routed_experts=body.return_routed_experts,
                    return_prompt_routed_experts=body.return_routed_experts
                    and body.routed_experts_prompt_start < len(ids) - 1, request_id=uuid.uuid4().hex)
                jobs.append(srv.run(req, sampling.stop))
        results = await asyncio.gather(*jobs)
        choices = [_completion_choice(srv, body, i, r, m) for i, (r, m) in enumerate(results)]
        completion_tokens = sum(len(r.output_ids) for r, _ in results)
        prompt_tokens = sum(len(ids) for ids in prompts)
        return JSONResponse({"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                             "model": self.model_name, "choices": choices,
                             "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                       "total_tokens": prompt_tokens + completion_tokens}})

    def _completion_prompts(self, body: CompletionBody) -> list:
        """The prompts as given (text encoded, ids unchecked): a string, ids, or a list of either."""
        p = body.prompt
        if isinstance(p, str):
            return [self.srv.text_prompt(p, "prompt")]
        if isinstance(p, list) and p and all(type(t) is int for t in p):
            return [p]
        if isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p):
            return [self.srv.text_prompt(x, "prompt") if isinstance(x, str) else x for x in p]
        raise BadRequest("prompt must be a string, a list of token ids, or a non-empty list of either")

    # --- OpenAI's /v1/chat/completions

    async def chat(self, request: Request) -> Response:
        srv, tokenizer = self.srv, self.srv.tok
        body: ChatBody = await parse_body(request, ChatBody, srv.max_body_bytes)
        tools = body.tools if body.tool_choice != "none" else None
        if tools is not None and not all(isinstance(t, dict) for t in tools):
            raise BadRequest("tools must be a list of function schemas (objects)")
        srv.check_text_fits(sum(len(m["content"]) for m in body.messages
                                if isinstance(m, dict) and isinstance(m.get("content"), str)), "messages")
        ids = srv.check_ids(encode_messages(tokenizer, body.messages, tools, add_generation_prompt=True), "messages")
        requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        max_new = srv.budget(len(ids), requested, None, "max_tokens")
        turns = await asyncio.gather(*(
            chat_turn(srv.generate_ids, tokenizer, ids, srv.sampling(
                temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, max_new_tokens=max_new,
                stop=body.stop, stop_token_ids=body.stop_token_ids,
                seed=None if body.seed is None else body.seed + i), call_id_prefix=f"call_{uuid.uuid4().hex[:8]}_",
                tools=tools)
            for i in range(body.n)))
        choices = [_chat_choice(tokenizer, body, i, turn) for i, turn in enumerate(turns)]
        completion_tokens = sum(t.usage.completion_tokens for t in turns)
        response = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                    "model": self.model_name, "choices": choices,
                    "usage": {"prompt_tokens": len(ids), "completion_tokens": completion_tokens,
                              "total_tokens": len(ids) + completion_tokens}}
        if body.return_token_ids:
            response["prompt_token_ids"] = ids
        return JSONResponse(response)

    # --- weight sync

    async def update_weights(self, request: Request) -> Response:
        srv = self.srv
        body: UpdateWeightsBody = await parse_body(request, UpdateWeightsBody, srv.max_body_bytes)
        version = int(body.weight_version) if body.weight_version and body.weight_version.isdigit() else None
        try:  # loading takes a while and the engine applies it between decode steps: off the loop
            new_version = await asyncio.to_thread(self.update_from_disk, body.model_path, version)
        except (CheckpointError, ConfigError, OSError, ValueError, KeyError, RuntimeError) as exc:
            return JSONResponse({"success": False, "version": srv.engine.policy_version,
                                 "message": f"weights not updated from {body.model_path}: {exc}",
                                 "error": {"message": str(exc), "type": "invalid_request_error", "code": 400}},
                                status_code=400)
        srv.weight_updates += 1
        return JSONResponse({"success": True, "version": new_version, "num_paused_requests": 0,
                             "message": f"loaded {body.model_path}: policy version {new_version}"})


def _chat_choice(tokenizer: Tokenizer, body: ChatBody, index: int, turn) -> dict:
    result: GenerationResult = turn.raw
    choice: dict[str, Any] = {"index": index, "message": turn.message, "finish_reason": turn.finish_reason,
                              "logprobs": None}
    if body.logprobs:
        choice["logprobs"] = {"content": [
            {"token": (s := tokenizer.decode([t])), "logprob": lp, "bytes": list(s.encode()),
             "top_logprobs": []}
            for t, lp in zip(result.output_ids, result.logprobs)]}
    if body.return_token_ids:
        choice["token_ids"] = result.output_ids
    return choice


def _sglang_response(srv: Server, body: GenerateBody, sp: SGLangSampling, result: GenerationResult,
                     matched: str | int | None, latency: float) -> dict:
    tok = srv.tok
    ids = result.output_ids
    trim_token = isinstance(matched, int) and not sp.no_stop_trim
    text = tok.decode(ids[:-1] if trim_token else ids, skip_special=sp.skip_special_tokens)
    if isinstance(matched, str) and not sp.no_stop_trim:
        text = text_before_stop(text, matched)
    version = result.policy_version if result.policy_version is not None else srv.engine.policy_version
    meta: dict[str, Any] = {
        "id": result.request_id, "finish_reason": sglang_finish_reason(result, matched),
        "prompt_tokens": len(result.prompt_ids), "completion_tokens": len(ids), "cached_tokens": 0,
        "weight_version": str(version), "policy_versions": result.policy_versions, "e2e_latency": latency,
    }
    if body.return_logprob:
        meta["output_token_logprobs"] = [[lp, t, tok.decode([t]) if body.return_text_in_logprobs else None]
                                         for lp, t in zip(result.logprobs, ids)]
    if body.return_routed_experts and ids:
        rows = routed_rows(result, body.routed_experts_start_len)
        meta["routed_experts"] = b64_int32(rows)
        meta["routed_experts_shape"] = list(rows.shape)
    if result.spec_proposed:
        meta["spec_accepted_tokens"], meta["spec_proposed_tokens"] = result.spec_accepted, result.spec_proposed
    return {"text": text, "output_ids": ids, "meta_info": meta}


def _completion_choice(srv: Server, body: CompletionBody, index: int, result: GenerationResult,
                       matched: str | int | None) -> dict:
    tok = srv.tok
    ids = result.output_ids
    text = tok.decode(ids, skip_special=body.skip_special_tokens)
    if isinstance(matched, str) and not body.include_stop_str_in_output:
        text = text_before_stop(text, matched)
    choice: dict[str, Any] = {"index": index, "text": text, "logprobs": None, "finish_reason": result.finish_reason,
                              "stop_reason": matched}
    if body.logprobs is not None:
        tokens = [f"token_id:{t}" if body.return_tokens_as_token_ids else tok.decode([t]) for t in ids]
        offsets, at = [], 0
        for t in ids:
            offsets.append(at)
            at += len(tok.decode([t]))
        choice["logprobs"] = {"tokens": tokens, "token_logprobs": result.logprobs, "top_logprobs": None,
                              "text_offset": offsets}
    if body.return_token_ids:
        choice["token_ids"], choice["prompt_token_ids"] = ids, result.prompt_ids
    if body.return_routed_experts and ids:
        choice["routed_experts"] = b64_npy(routed_rows(result, body.routed_experts_prompt_start))
    return choice
