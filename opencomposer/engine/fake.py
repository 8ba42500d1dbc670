"""A deterministic fake engine: the `InferenceEngine` Protocol without a model.

For tests of everything that sits on top of an engine (server, clients, agent loop, RL
plumbing), where a real model would be slow and its output unpredictable. Two modes:

- generated (default): output token t of a request is a hash of the context so far, the
  policy version and the request's seed, drawn from ``[min_token_id, vocab_size)`` (by default
  above the 16 special ids of opencomposer's tokenizers, so the output is plain text);
- scripted: ``FakeEngine(replies=[ids, ids, ...])`` answers the i-th request with the i-th
  reply; `assistant_reply` builds one from an assistant message (text, thinking, tool calls)
  in the chat format, e.g. to make the "model" call a tool. An exhausted script raises.

Either way, a reply is cut like a real engine's output: at the first stop token (kept,
finish_reason "stop"), after max_new_tokens or when prompt + output reaches `max_len`
(finish_reason "length"). Logprobs are ``-(1 + t % 5) / 10`` for token t; routed experts are
``(3p + 5l + k) % num_experts`` for input position p, MoE layer l and slot k, with the
row alignment of types.py / protocol.py (output token j comes from position ``P - 1 + j``).
Temperature, top-p and top-k are recorded (`requests`) but do not change the output.
`update_weights` stores the state dict and bumps `policy_version`, which changes generated
(not scripted) output, so a test can see that new weights took effect.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Iterable, Sequence

import numpy as np

from opencomposer.engine.types import GenerationRequest, GenerationResult
from opencomposer.model.chat import get_format
from opencomposer.model.tokenizer import Tokenizer


class FakeEngine:
    """Implements `InferenceEngine` deterministically (see the module docstring)."""

    def __init__(self, *, vocab_size: int = 4096, max_len: int = 2048, replies: Iterable[Sequence[int]] | None = None,
                 num_moe_layers: int = 2, top_k: int = 2, num_experts: int = 8, min_token_id: int = 16,
                 step_delay_s: float = 0.0):
        self.vocab_size = vocab_size
        self.max_len = max_len
        self.num_moe_layers, self.top_k, self.num_experts = num_moe_layers, top_k, num_experts
        self.min_token_id = min_token_id
        self.step_delay_s = step_delay_s
        self.replies = None if replies is None else [list(r) for r in replies]
        self.policy_version = 0
        self.weights: dict | None = None
        self.requests: list[GenerationRequest] = []
        self.num_running = 0

    def _next_token(self, context: list[int], seed: int | None) -> int:
        h = 0  # a fixed mix (not hash(): hash(None) differs between processes in Python 3.11)
        for x in (*context[-4:], len(context), self.policy_version, -1 if seed is None else seed):
            h = ((h * 1000003) ^ (x & 0xFFFFFFFF)) & 0xFFFFFFFF
        return self.min_token_id + h % (self.vocab_size - self.min_token_id)

    def _routing(self, positions: range) -> np.ndarray:
        p_T = np.asarray(positions, dtype=np.int64)[:, None, None]
        l_Y = np.arange(self.num_moe_layers)[None, :, None]
        k_K = np.arange(self.top_k)[None, None, :]
        return ((3 * p_T + 5 * l_Y + k_K) % self.num_experts).astype(np.int32)  # [T, Y, K]

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        prompt, sp = list(request.input_ids), request.sampling
        if not prompt:
            raise ValueError("input_ids is empty")
        if self.replies is not None:
            if len(self.requests) > len(self.replies):
                raise IndexError(f"FakeEngine script exhausted: request {len(self.requests)} but only "
                                 f"{len(self.replies)} replies were given")
            script = self.replies[len(self.requests) - 1]
        budget = min(sp.max_new_tokens, self.max_len - len(prompt))
        out: list[int] = []
        versions: list[int] = []
        finish = "length"
        self.num_running += 1
        try:
            while len(out) < budget:
                if self.replies is not None:
                    if len(out) == len(script):
                        finish = "stop"  # a script that ends without a stop token ends there
                        break
                    token = script[len(out)]
                else:
                    token = self._next_token(prompt + out, sp.seed)
                out.append(token)
                versions.append(self.policy_version)
                if self.step_delay_s:
                    await asyncio.sleep(self.step_delay_s)
                if token in sp.stop_token_ids:
                    finish = "stop"
                    break
            await asyncio.sleep(0)  # let other requests interleave, as in a real batch
        finally:
            self.num_running -= 1
        P = len(prompt)
        return GenerationResult(
            request_id=request.request_id or uuid.uuid4().hex,
            prompt_ids=prompt, output_ids=out, finish_reason=finish,
            logprobs=[-(1 + t % 5) / 10 for t in out] if request.return_logprob else None,
            routed_experts=self._routing(range(P - 1, P - 1 + len(out))) if request.return_routed_experts else None,
            prompt_routed_experts=self._routing(range(P)) if request.return_prompt_routed_experts else None,
            policy_versions=versions,
        )

    def update_weights(self, state_dict: dict, version: int | None = None) -> int:
        self.weights = state_dict
        self.policy_version = self.policy_version + 1 if version is None else version
        return self.policy_version


def assistant_reply(tok: Tokenizer, content: str = "", *, thinking: str | None = None,
                    tool_calls: Sequence[dict] = ()) -> list[int]:
    """The ids a model would generate for this assistant turn in the tokenizer's chat format (after
    the generation prompt, up to and including the turn end), for `FakeEngine(replies=...)`. Tool calls are
    ``{"name": ..., "arguments": {...}}`` dicts or OpenAI tool-call dicts."""
    message = {"role": "assistant", "content": content, "reasoning_content": thinking,
               "tool_calls": [c if "function" in c else {"function": c} for c in tool_calls]}
    return get_format(tok).generated_ids(message)
