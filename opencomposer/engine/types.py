"""Plain data that crosses the engine seam: token ids in; token ids, logprobs and routed experts out.

The engine knows nothing about tokenization (stop *strings* are matched by whoever holds a
tokenizer: the server or the client). Every backend a `PolicyClient` talks to (the embedded
engine, opencomposer's server, SGLang, vLLM) is mapped onto these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion (field names follow SGLang's `sampling_params`)."""

    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability mass reaches top_p."""
    top_k: int = -1
    """Keep the k most likely tokens; -1 (or 0) keeps all."""
    max_new_tokens: int = 256
    """Stop after this many generated tokens (finish_reason "length")."""
    stop_token_ids: tuple[int, ...] = ()
    """Stop when one of these is generated; it is included in the output (finish_reason "stop")."""
    stop: tuple[str, ...] = ()
    """Stop strings; matched by a tokenizer-holding layer (server/client), not by the engine."""
    seed: int | None = None
    """Per-request RNG seed, for reproducible sampling."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class GenerationRequest:
    """One request to the engine."""

    input_ids: Sequence[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    return_logprob: bool = True
    return_routed_experts: bool = False
    """Routed experts of every generated token: int32 [T_out, L_moe, K]; row j is the forward
    that produced output token j (input position T_in - 1 + j)."""
    return_prompt_routed_experts: bool = False
    """Also those of the prompt tokens: int32 [T_in, L_moe, K] (row i: input position i)."""
    request_id: str | None = None
    logprobs_mode: str = "raw"
    """"raw": log softmax of the model's logits at temperature 1 (what a trainer recomputes);
    "processed": log-probability under the distribution actually sampled from (temperature,
    top-k, top-p applied; 0.0 for greedy), as vLLM's `logprobs_mode="processed_logprobs"`."""


def behaviour_logprobs_mode(sampling: SamplingParams) -> str:
    """The logprobs_mode whose values are the probabilities the tokens were drawn from, for a
    trainer that applies the same temperature (and truncation) to its own logits: "raw" when
    sampling is the model's own distribution (temperature 1, no top-p or top-k) and for greedy
    decoding (whose "processed" logprob would be 0.0 for every token: raw says more), else
    "processed"."""
    untruncated = sampling.top_p >= 1.0 and sampling.top_k <= 0
    return "raw" if sampling.temperature == 0 or (untruncated and sampling.temperature == 1.0) else "processed"


@dataclass
class GenerationResult:
    """One finished completion. Arrays are numpy (plain data: picklable, JSON-able via .tolist())."""

    request_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str
    """"stop" (a stop token/string), "length" (max_new_tokens or context), or "abort"."""
    logprobs: list[float] | None = None
    """log p(token) of every output token under the *sampling* distribution's source model, at
    temperature 1 before top-p/top-k (the behaviour logprob the trainer's ratio uses)."""
    routed_experts: np.ndarray | None = None
    """int32 [len(output_ids), L_moe, K]; row j: input position len(prompt_ids) - 1 + j, the
    forward whose logits produced output token j (so row 0 repeats the prompt's last row)."""
    prompt_routed_experts: np.ndarray | None = None
    """int32 [len(prompt_ids), L_moe, K]; row i: input position i."""
    policy_versions: list[int] | None = None
    """The engine's policy version when each output token was generated (weights may change mid-request)."""
    spec_accepted: int = 0
    """Draft tokens accepted by speculative decoding (0 without it)."""
    spec_proposed: int = 0
    """Draft tokens proposed by speculative decoding."""

    @property
    def policy_version(self) -> int | None:
        return self.policy_versions[-1] if self.policy_versions else None


class InferenceEngine(Protocol):
    """What the server and the in-process client need from an engine."""

    policy_version: int

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate one completion; many concurrent calls share batched decode steps."""
        ...

    def update_weights(self, state_dict: dict, version: int | None = None) -> int:
        """Replace weights in place between decode steps; returns the new policy version."""
        ...
