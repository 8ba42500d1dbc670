"""The server's request side: a body read within a size limit, parsed as JSON, validated into
the typed body of its endpoint (pydantic, strict), every problem a `BadRequest`.

The limit is enforced while reading: a Content-Length over it is refused before any byte is
read, and a streamed (chunked) body as soon as the bytes received pass it, so a huge body
costs neither memory nor time. JSON nested deeper than the parser's recursion limit is a
400, like any other malformed body.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class BadRequest(Exception):
    """A client error, answered with `status` and the message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def error_response(status: int, message: str, kind: str) -> JSONResponse:
    # 413 closes the connection: the rest of an oversized body is not read to its end
    headers = {"connection": "close"} if status == 413 else None
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status,
                        headers=headers)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


CLIENT_CLOSED = 499
"""Status counted for a client that went away before its request was read (nginx's code)."""


def default_body_limit(max_len: int) -> int:
    """64 bytes per context token (a full-context prompt as JSON-escaped text or as ids, a few
    times over, for batches), and never under 8 MiB."""
    return max(8 << 20, 64 * max_len)


def _too_large(size: int, limit: int) -> BadRequest:
    return BadRequest(f"request body is {size:,} bytes or more, over this server's limit of {limit:,} bytes; "
                      "send a shorter prompt (it could not fit the context anyway) or fewer prompts per request", 413)


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) from its Content-Length before reading, or as soon as the bytes
    received pass `limit` (a chunked body has no length). A disconnect raises ClientDisconnect."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequest(f"Content-Length {declared[:40]!r} is not a number of bytes")
        if int(declared) > limit:
            raise _too_large(int(declared), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def parse_body(request: Request, model: type[BaseModel], limit: int) -> Any:
    raw = await _read_body(request, limit)
    try:
        obj = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("request body is nested too deeply to parse; no request field nests more than a "
                         "few levels") from None
    if not isinstance(obj, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(obj).__name__}")
    return validate_body(model, obj)


def validate_body(model: type[BaseModel], obj: Any, prefix: str = "") -> Any:
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        problems = []
        for e in exc.errors()[:6]:
            # union branches add type tags such as "list[int]" to the location: not field names
            loc = ".".join(str(x) for x in (prefix, *e["loc"]) if x != "" and not (isinstance(x, str) and "[" in x))
            problems.append(f"{loc or 'body'}: {e['msg']}")
        raise BadRequest("invalid request: " + "; ".join(problems)) from None


# ----------------------------------------------------------------------------- request bodies


class _Body(BaseModel):
    # Strict: "0.5" is not a float, 1 is not a bool. Unknown top-level fields are ignored.
    model_config = ConfigDict(strict=True, extra="ignore")

    @model_validator(mode="after")
    def _neutral_only(self):
        """Options SGLang/OpenAI have and this engine does not: accepted at their neutral value only."""
        for name, neutral in self.neutral_values.items():
            if getattr(self, name) != neutral:
                raise ValueError(f"{name}={getattr(self, name)!r} is not supported by this server "
                                 f"(only {neutral!r})")
        return self

    neutral_values: ClassVar[dict[str, Any]] = {}


class SGLangSampling(_Body):
    model_config = ConfigDict(strict=True, extra="forbid")
    temperature: float = Field(1.0, ge=0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int = Field(-1, ge=-1)
    max_new_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    sampling_seed: int | None = None
    seed: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True  # no effect: byte-level BPE decodes exactly
    no_stop_trim: bool = False
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    ignore_eos: bool = False
    n: int = 1
    neutral_values: ClassVar[dict[str, Any]] = {
        "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
        "min_new_tokens": 0, "ignore_eos": False, "n": 1}


class GenerateBody(_Body):
    input_ids: Any = None
    text: str | list[str] | None = None
    sampling_params: Any = None
    rid: str | list[str] | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    return_routed_experts: bool = False
    routed_experts_start_len: int = Field(0, ge=0)
    logprobs_mode: Literal["raw", "processed"] = "raw"
    """opencomposer's extension: "processed" returns the logprobs of the distribution sampled from."""
    stream: bool = False
    neutral_values: ClassVar[dict[str, Any]] = {"top_logprobs_num": 0, "stream": False}


class _OpenAIBody(_Body):
    model: str | None = None
    temperature: float | None = Field(None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=-1)
    n: int = Field(1, ge=1, le=16)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    stream: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    return_token_ids: bool = False
    neutral_values: ClassVar[dict[str, Any]] = {"stream": False, "presence_penalty": 0.0, "frequency_penalty": 0.0}


class ChatBody(_OpenAIBody):
    messages: list[Any] = Field(min_length=1)
    tools: list[Any] | None = None
    tool_choice: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int = 0
    neutral_values: ClassVar[dict[str, Any]] = {**_OpenAIBody.neutral_values, "top_logprobs": 0}

    @model_validator(mode="after")
    def _tool_choice(self):
        if self.tool_choice not in (None, "auto", "none"):
            raise ValueError(f"tool_choice={self.tool_choice!r} is not supported (only 'auto' or 'none')")
        return self


class CompletionBody(_OpenAIBody):
    prompt: Any = None
    max_tokens: int | None = Field(None, ge=1)
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False
    suffix: str | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    return_tokens_as_token_ids: bool = False
    return_routed_experts: bool = False
    routed_experts_prompt_start: int = Field(0, ge=0)
    neutral_values: ClassVar[dict[str, Any]] = {**_OpenAIBody.neutral_values, "echo": False, "suffix": None}

    @model_validator(mode="before")
    @classmethod
    def _vllm_routing(cls, data: Any) -> Any:
        """vLLM asks for routed experts by giving routed_experts_prompt_start alone; so do we."""
        if isinstance(data, dict) and data.get("routed_experts_prompt_start") is not None:
            data = {**data, "return_routed_experts": True}
        return data


class UpdateWeightsBody(_Body):
    model_path: str = Field(min_length=1)
    load_format: str | None = None
    weight_version: str | None = None

    @model_validator(mode="after")
    def _format(self):
        if self.load_format not in (None, "auto", "safetensors"):
            raise ValueError(f"load_format={self.load_format!r} is not supported (only HF safetensors directories)")
        return self
