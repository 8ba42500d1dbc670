"""Wire formats shared by the server (server.py) and the clients (client.py).

Routed experts on the wire. SGLang (`meta_info.routed_experts`, with
`--enable-return-routed-experts` and per-request `return_routed_experts`) and vLLM
(`choices[].routed_experts`, with `enable_return_routed_experts`) both return one row per
*input position* of the whole sequence, rows ``[start, P + T - 1)`` for a prompt of P tokens
and T generated tokens: the last sampled token is never fed to the model, so it has no row.
Each row is ``[L_moe, K]`` expert ids. Encodings:

- SGLang: base64 of the little-endian int32 C-order bytes, shape ``[rows, L_moe, K]``
  flattened; ``start`` is the request's ``routed_experts_start_len`` (default 0, the whole
  sequence). The reader must know ``L_moe`` and ``K``: this server also sends
  ``meta_info.routed_experts_shape = [rows, L_moe, K]`` (an opencomposer extension).
- vLLM: base64 of ``np.save`` (.npy) bytes, which carry their own shape; ``start`` is the
  request's ``routed_experts_prompt_start``.

`GenerationResult` (types.py) keeps them per token instead: ``prompt_routed_experts[i]`` is
input position i (prefill) and ``routed_experts[j]`` the forward that produced output token j,
input position ``P - 1 + j``. So the wire rows are ``prompt_routed_experts[start:]`` followed by
``routed_experts[1:]``, and ``routed_experts`` alone is wire rows ``[P - 1, P + T - 1)``.

Stop strings are matched on decoded text by whoever holds the tokenizer (the engine sees
ids only): `apply_stop_strings` cuts a finished result after the token where the first stop
string appears, as SGLang and vLLM stop generation at that token. The engine does not see
them, so it keeps generating to a stop token or max_new_tokens; the extra tokens are dropped.
"""

from __future__ import annotations

import base64
import dataclasses
import io
from typing import Sequence

import numpy as np

from opencomposer.engine.types import GenerationResult
from opencomposer.model.tokenizer import Tokenizer

# ----------------------------------------------------------------------------- routed experts


def routed_rows(result: GenerationResult, start: int) -> np.ndarray:
    """Wire rows ``[start, P + T - 1)`` of int32 [rows, L_moe, K] from a result (see module docstring).

    ``start < P - 1`` needs the prompt's routing (`return_prompt_routed_experts`)."""
    P, T = len(result.prompt_ids), len(result.output_ids)
    out_BYK = result.routed_experts
    if out_BYK is None or T == 0:
        raise ValueError("the result has no routed experts (request them with return_routed_experts)")
    if not 0 <= start <= P:
        raise ValueError(f"routed experts start {start} must be in [0, prompt length {P}]")
    if start >= P - 1:  # output rows alone cover it
        return np.ascontiguousarray(out_BYK[start - (P - 1):], dtype=np.int32)
    prompt_BYK = result.prompt_routed_experts
    if prompt_BYK is None:
        raise ValueError("routed experts of prompt tokens were not captured (return_prompt_routed_experts)")
    return np.ascontiguousarray(np.concatenate([prompt_BYK[start:], out_BYK[1:]]), dtype=np.int32)


def split_routed_rows(rows: np.ndarray, prompt_len: int, output_len: int
                      ) -> tuple[np.ndarray | None, np.ndarray]:
    """Wire rows (ending at ``P + T - 1``) -> (prompt routing [P] or None if rows start after 0,
    output routing [T]); the inverse of `routed_rows`. The start is implied by the row count."""
    P, T = prompt_len, output_len
    start = P + T - 1 - len(rows)
    if not 0 <= start <= P - 1:
        raise ValueError(f"{len(rows)} routed-expert rows do not fit a prompt of {P} and an output of {T} "
                         f"tokens: expected between {T} and {P + T - 1} rows")
    out = rows[P - 1 - start:]
    prompt = rows[:P] if start == 0 else None
    return prompt, out


def b64_int32(rows: np.ndarray) -> str:
    """SGLang's encoding: base64 of little-endian int32 C-order bytes."""
    return base64.b64encode(np.ascontiguousarray(rows, dtype="<i4").tobytes()).decode("ascii")


def from_b64_int32(data: str, num_layers: int, top_k: int) -> np.ndarray:
    """Inverse of `b64_int32`: int32 [rows, num_layers, top_k]."""
    flat = np.frombuffer(base64.b64decode(data), dtype="<i4")
    if flat.size % (num_layers * top_k):
        raise ValueError(f"routed experts hold {flat.size} ids, not a multiple of layers x top_k = "
                         f"{num_layers} x {top_k}")
    return flat.reshape(-1, num_layers, top_k).astype(np.int32)


def b64_npy(rows: np.ndarray) -> str:
    """vLLM's encoding: base64 of the .npy bytes (shape and dtype included)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(rows, dtype=np.int32), allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def from_b64_npy(data: str) -> np.ndarray:
    """Inverse of `b64_npy`: int32 [rows, L_moe, K] (vLLM may send uint8/uint16; widened here)."""
    return np.load(io.BytesIO(base64.b64decode(data)), allow_pickle=False).astype(np.int32)


# ----------------------------------------------------------------------------- results


def truncate(result: GenerationResult, n: int, finish_reason: str) -> GenerationResult:
    """The result with only its first n output tokens (and their logprobs, routing, versions)."""
    cut = lambda x: None if x is None else x[:n]  # noqa: E731
    return dataclasses.replace(result, output_ids=result.output_ids[:n], finish_reason=finish_reason,
                               logprobs=cut(result.logprobs), routed_experts=cut(result.routed_experts),
                               policy_versions=cut(result.policy_versions))


def apply_stop_strings(result: GenerationResult, tok: Tokenizer, stops: Sequence[str]
                       ) -> tuple[GenerationResult, str | None]:
    """Cut the result after the first token at which a stop string appears in the decoded
    output (special tokens as their strings); returns (result, matched string or None).

    The cut point is the smallest n such that ``decode(output_ids[:n])`` contains a stop
    string, found by bisection (containment only grows with n)."""
    stops = [s for s in stops if s]
    if not stops or not result.output_ids:
        return result, None
    ids = result.output_ids
    text = tok.decode(ids)
    if not any(s in text for s in stops):
        return result, None
    lo, hi = 1, len(ids)  # invariant: the prefix of length hi contains a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in tok.decode(ids[:mid]) for s in stops):
            hi = mid
        else:
            lo = mid + 1
    prefix = tok.decode(ids[:hi])
    matched = min((s for s in stops if s in prefix), key=prefix.find)
    return truncate(result, hi, "stop"), matched


def text_before_stop(text: str, matched: str | None) -> str:
    """Decoded text without the matched stop string and what follows it (SGLang's and
    OpenAI's default: the stop string is not returned)."""
    at = -1 if matched is None else text.find(matched)
    return text if at < 0 else text[:at]


def sglang_finish_reason(result: GenerationResult, matched: str | int | None) -> dict:
    """SGLang's `meta_info.finish_reason`: {"type": "stop", "matched": str | token id},
    {"type": "length", "length": n} or {"type": "abort", "message": ...}."""
    if result.finish_reason == "stop":
        if matched is None and result.output_ids:
            matched = result.output_ids[-1]
        return {"type": "stop", "matched": matched}
    if result.finish_reason == "length":
        return {"type": "length", "length": len(result.output_ids)}
    return {"type": "abort", "message": "request aborted by the engine"}


def parse_version(value: object) -> int | None:
    """A policy version from SGLang's `weight_version` (a string; "default" when unset)."""
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None
