"""Log-probabilities of target tokens through the output head, in chunks when the vocabulary is large.

The RL trainer and SFT run the output head only on the positions their loss reads (U of them),
but with a real vocabulary (Qwen3: V = 151,936) even those logits are large: 8k positions x 152k
ids in float32 is 5 GB, and the softmax's backward keeps a copy. Above `CHUNK_ELEMENTS` logits,
`head_logprobs` computes them `CHUNK_ELEMENTS // V` positions at a time under activation
checkpointing, so at most one chunk's logits exist at once, in the forward and again in the
backward (which recomputes the chunk's logits from its hidden states: one more head matmul).

Below the threshold (every tiny model here: V = 4,096) it runs the one-shot computation the
trainers always ran, so seeded runs stay bit for bit (tests/test_golden_runs.py). The chunked
path gives the same values up to float summation order (tests/training/test_logits.py).

The head is called as a module (`head(h)`), never through its weight, so a sharded (FSDP) head
gathers its weight as in any forward. Not covered: pretraining's full-sequence cross-entropy
and the MTP losses, which still materialise [B, T, V] logits (pretrain with a small vocabulary,
or a small batch).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

CHUNK_ELEMENTS = 1 << 26  # 64M logits (256 MB in float32) per chunk


def head_logprobs(head: nn.Linear, hidden_UD: torch.Tensor, inv_M: torch.Tensor,
                  target_M: torch.Tensor, temperature: float = 1.0, *, entropy: bool = False,
                  chunk_elements: int = CHUNK_ELEMENTS) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log softmax(head(hidden_U) / temperature)[target] at each of M targets, float32, differentiable;
    entropy of each of the U distributions, no grad, when `entropy`).

    Target m is token target_M[m] at position inv_M[m] (several targets may share a position:
    samples of one group packed over a shared prefix).
    """
    U, V = hidden_UD.shape[0], head.out_features
    if U * V <= chunk_elements:
        logits_UV = _scaled(head(hidden_UD), temperature)
        lse_U = torch.logsumexp(logits_UV, dim=-1)
        logp_M = logits_UV[inv_M, target_M] - lse_U[inv_M]
        ent_U = None
        if entropy:
            with torch.no_grad():
                ent_U = lse_U - (torch.softmax(logits_UV, -1) * logits_UV).sum(-1)
        return logp_M, ent_U
    rows = max(1, chunk_elements // V)
    order_M = torch.argsort(inv_M, stable=True)  # targets grouped by position, so each chunk's are contiguous
    inv_sorted, target_sorted = inv_M[order_M], target_M[order_M]
    bounds = torch.searchsorted(inv_sorted, torch.arange(0, U + rows, rows, device=inv_M.device).clamp(max=U)).tolist()
    logp_parts, ent_parts = [], []
    for c, start in enumerate(range(0, U, rows)):
        lo, hi = bounds[c], bounds[c + 1]
        logp, ent = checkpoint(_chunk, head, hidden_UD[start:start + rows], inv_sorted[lo:hi] - start,
                               target_sorted[lo:hi], temperature, entropy, use_reentrant=False)
        logp_parts.append(logp)
        ent_parts.append(ent)
    logp_M = torch.cat(logp_parts)[torch.argsort(order_M)]  # back to the callers' order
    return logp_M, torch.cat(ent_parts) if entropy else None


def _chunk(head, hidden_uD, inv_m, target_m, temperature, entropy):
    logits_uV = _scaled(head(hidden_uD), temperature)
    lse_u = torch.logsumexp(logits_uV, dim=-1)
    ent_u = hidden_uD.new_zeros(0)
    if entropy:
        with torch.no_grad():
            ent_u = lse_u - (torch.softmax(logits_uV, -1) * logits_uV).sum(-1)
    return logits_uV[inv_m, target_m] - lse_u[inv_m], ent_u


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature in float32; x / 1 is x, so temperature 1 skips a pass over [U, V]."""
    return (logits if temperature == 1.0 else logits / temperature).float()
