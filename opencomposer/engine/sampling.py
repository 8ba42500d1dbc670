"""Token sampling for the engine: the sampling distribution, inverse-CDF draws, logprobs.

One batch row per sequence, each with its own temperature, top-p and top-k, so requests with
different sampling parameters decode in the same step. The distribution a row samples from is

    p = renorm(top_p(renorm(top_k(softmax(logits / temperature)))))

top-k first, then top-p on the renormalised top-k distribution (as transformers' warpers and
vLLM do): top-k keeps the k most likely tokens; top-p keeps, in decreasing probability, every
token whose preceding mass is still below top_p (the smallest set reaching top_p; the most
likely token is always kept). Temperature 0 means greedy: p is one-hot at argmax(logits), which
makes greedy a special case of every rule built on p (speculative acceptance included).

Randomness is not drawn here: the caller passes one uniform u per row, from a per-request RNG,
and the token is the inverse CDF of p at u. So a seeded request samples the same tokens alone
or in any batch (up to float rounding of the logits themselves, which can move a boundary only
when u falls within ~1e-6 of it).

Logprobs ("behaviour logprobs" for RL): `token_logprobs` is log softmax(logits)[token] at
temperature 1, before top-k/top-p: the log-probability of the token under the model itself,
which is what the trainer recomputes for its importance ratio. When sampling at temperature
!= 1 or with truncation, the tokens were in fact drawn from p; `log(p[token])` (the engine's
`logprobs_mode="processed"`, as vLLM names it) is then the exact behaviour probability, for
a trainer that applies the same transform to its own logits.
"""

from __future__ import annotations

import torch


def sampling_probs(logits_NV: torch.Tensor, temperature_N: torch.Tensor, top_p_N: torch.Tensor,
                   top_k_N: torch.Tensor) -> torch.Tensor:
    """The distribution each row samples from (see the module docstring), float32 [N, V].

    temperature_N float (0 = greedy), top_p_N float in (0, 1], top_k_N int (<= 0 or >= V: off).
    """
    logits_NV = logits_NV.float()
    N, V = logits_NV.shape
    greedy_N = temperature_N <= 0
    x_NV = logits_NV / torch.where(greedy_N, 1.0, temperature_N)[:, None]
    top_k_N = torch.where((top_k_N <= 0) | (top_k_N > V), V, top_k_N)
    if bool((top_k_N < V).any()) or bool((top_p_N < 1).any()):
        sorted_NV, order_NV = torch.sort(x_NV, dim=-1, descending=True)
        probs_NV = torch.softmax(sorted_NV, dim=-1)
        rank_V = torch.arange(V, device=logits_NV.device)
        probs_NV = probs_NV * (rank_V[None] < top_k_N[:, None])
        probs_NV = probs_NV / probs_NV.sum(-1, keepdim=True)
        before_NV = probs_NV.cumsum(-1) - probs_NV  # mass of the more likely tokens
        probs_NV = probs_NV * (before_NV < top_p_N[:, None])
        probs_NV = probs_NV / probs_NV.sum(-1, keepdim=True)
        probs_NV = torch.zeros_like(probs_NV).scatter_(-1, order_NV, probs_NV)
    else:
        probs_NV = torch.softmax(x_NV, dim=-1)
    if bool(greedy_N.any()):
        one_hot_NV = torch.zeros_like(probs_NV).scatter_(-1, logits_NV.argmax(-1, keepdim=True), 1.0)
        probs_NV = torch.where(greedy_N[:, None], one_hot_NV, probs_NV)
    return probs_NV


def sample(probs_NV: torch.Tensor, u_N: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: the first token whose cumulative mass exceeds u * total (u in [0, 1)).

    Rows need not be normalised; a token of zero mass is never drawn. int64 [N]. The C++
    kernels' `inverse_cdf` (native.py) give the same tokens bit for bit, without the [N, V]
    double copy and cumsum, where they are loaded.
    """
    from opencomposer.engine import native

    ops = native.ops()
    if ops is not None and probs_NV.dtype == torch.float32 and probs_NV.device.type == "cpu":
        return ops.inverse_cdf(probs_NV, u_N.double())
    cdf_NV = probs_NV.double().cumsum(-1)
    x_N1 = (u_N.double() * cdf_NV[:, -1])[:, None]
    return torch.searchsorted(cdf_NV, x_N1, right=True).squeeze(1).clamp_(max=probs_NV.shape[-1] - 1)


def token_logprobs(logits_NV: torch.Tensor, tokens_N: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] at temperature 1, float32 [N]."""
    logits_NV = logits_NV.float()
    return logits_NV.gather(-1, tokens_N[:, None]).squeeze(1) - torch.logsumexp(logits_NV, dim=-1)


def greedy(logits_NV: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(argmax int64 [N], token_logprobs of it float32 [N]): greedy sampling in one pass of the
    C++ kernels (native.py) where they are loaded, else two PyTorch ops."""
    from opencomposer.engine import native

    ops = native.ops()
    if ops is not None and logits_NV.dtype == torch.float32 and logits_NV.device.type == "cpu":
        return ops.argmax_logprob(logits_NV)
    tokens_N = logits_NV.argmax(-1)
    return tokens_N, token_logprobs(logits_NV, tokens_N)
