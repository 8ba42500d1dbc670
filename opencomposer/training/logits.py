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

The log-softmax itself is one autograd function (`target_logprobs`) rather than torch's
logsumexp + indexing + softmax: two passes over [U, V] fewer, and the exponentials are taken of
inputs clamped at `EXP_FLOOR` (-87, just above float32's smallest normal exp). torch's vectorised
exp takes ~10x longer per element for inputs below about -87.3 (its results are denormal or 0),
and a confident model puts most of its vocabulary there: on the RL trainer's head (2,020 x 4,096
logits of a trained demo model) those exps were most of the step (docs/benchmarks.md, issue 23).
A clamped entry's probability becomes 1.6e-38 instead of something below 1.2e-38: the
log-probabilities are bit for bit torch's (the row's sum includes its top entry, 1, which
absorbs both), and a gradient entry moves by less than 1e-38 times its row's weight
(tests/training/test_logits.py).

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
EXP_FLOOR = -87.0  # exp(-87) = 1.6e-38, a normal float32; below about -87.3 torch's exp is ~10x slower


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
        logp_M, ent_U = target_logprobs(_scaled(head(hidden_UD), temperature), inv_M, target_M, entropy)
        return logp_M, ent_U if entropy else None
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
    return target_logprobs(_scaled(head(hidden_uD), temperature), inv_m, target_m, entropy)


def target_logprobs(logits_UV: torch.Tensor, inv_M: torch.Tensor, target_M: torch.Tensor,
                    entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(log softmax(logits_UV)[inv_M, target_M], differentiable in logits_UV; each row's entropy,
    no grad, when `entropy`, else an empty tensor). logits_UV is float32."""
    return _TargetLogprobs.apply(logits_UV, inv_M, target_M, entropy)


class _TargetLogprobs(torch.autograd.Function):
    """logsumexp, the targets' entries and (as a metric) the entropy in one node.

    The values are torch.logsumexp's, computed the same way (max, exp of the shifted row, sum,
    log, + max) with the shifted row clamped at EXP_FLOOR. The gradient is logsumexp's and
    indexing's, as autograd would form it: -g_lse * exp(logits - lse) everywhere (the same
    clamp) plus each target's g, duplicates summed in order first, then added once."""

    @staticmethod
    def forward(ctx, logits_UV, inv_M, target_M, entropy):
        max_U1 = logits_UV.amax(-1, keepdim=True)
        z_UV = (logits_UV - max_U1).clamp_(min=EXP_FLOOR)
        exp_UV = z_UV.exp()
        sum_U = exp_UV.sum(-1)
        lse_U = sum_U.log().add_(max_U1.squeeze(-1))
        logp_M = logits_UV[inv_M, target_M] - lse_U[inv_M]
        ent_U = logits_UV.new_zeros(0)
        if entropy:  # log S − Σ p·z, z the shifted row (= lse − Σ p·logits, with less cancellation)
            ent_U = sum_U.log() - exp_UV.mul_(z_UV).sum(-1).div_(sum_U)
        ctx.save_for_backward(logits_UV, lse_U, inv_M, target_M)
        ctx.mark_non_differentiable(ent_U)
        return logp_M, ent_U

    @staticmethod
    def backward(ctx, g_M, _g_ent):
        logits_UV, lse_U, inv_M, target_M = ctx.saved_tensors
        U, V = logits_UV.shape
        g_lse_U = torch.zeros(U, dtype=g_M.dtype, device=g_M.device).index_put_((inv_M,), -g_M, accumulate=True)
        grad_UV = (logits_UV - lse_U.unsqueeze(-1)).clamp_(min=EXP_FLOOR).exp_().mul_(g_lse_U.unsqueeze(-1))
        flat_M = inv_M * V + target_M
        entries, slot_M = torch.unique(flat_M, return_inverse=True)
        g_entries = torch.zeros(len(entries), dtype=g_M.dtype, device=g_M.device).index_put_(
            (slot_M,), g_M, accumulate=True)
        grad_UV.view(-1).index_put_((entries,), g_entries, accumulate=True)
        return grad_UV, None, None, None


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature in float32; x / 1 is x, so temperature 1 skips a pass over [U, V]."""
    return (logits if temperature == 1.0 else logits / temperature).float()
