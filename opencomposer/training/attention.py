"""Attention over a padding-free packed call: each segment is causal, and may first see a prefix.

training/packing.py lays a micro-batch out as one row of N tokens cut into segments: a group's
shared prefix, then each sample's own tokens (its suffix), which attend to that prefix and
causally to themselves. `SegmentAttention` is what the model's attention layers call for such a
row (model.py's `attention=`): per segment s, with queries q_s, its own keys/values (k_s, v_s)
and, for a suffix, its prefix segment's keys/values (k_p, v_p),

    o_s = softmax([q_s k_p^T, q_s k_s^T + causal] / sqrt(C)) [v_p; v_s]

so no query-key pair outside a sample is computed: a suffix of S tokens after a prefix of P
costs S·(P + S/2) pairs, where the padded layout before (every suffix padded to the longest,
every prefix to the longest, a mask over all of it) cost S_max·(P_max + S_max) per row.

On the CPU the two blocks are two calls of the flash-attention kernel (the prefix block
unmasked, the own block causal, whose kernel skips the future keys), merged by their
log-sum-exps, as ring and split-KV attention do (FlashAttention-2's online softmax, Dao 2307.08691):

    lse = logaddexp(lse_p, lse_s),   o = exp(lse_p − lse)·o_p + exp(lse_s − lse)·o_s

and the backward calls the kernel's backward once per block with the *merged* output and
log-sum-exp: the kernel recomputes each block's probabilities as exp(score − lse) and its
row term rowsum(dO·O) from them, which are exactly the merged softmax's, so each block's
gradients are the whole attention's (tests/training/test_attention.py checks values and
gradients against masked attention over the concatenated keys). Grouped-query heads go to the
kernel as they are (it reads each key/value head for its H/G query heads). The CPU kernel runs
in float32 whatever the step's dtype (a bfloat16 step casts q, k, v up and the output back): its
bfloat16 backward takes ~4x its float32 time on these CPUs.

Elsewhere (a GPU), each segment is one `scaled_dot_product_attention` over its concatenated
keys with a bottom-right causal mask: the same values, computed with the framework's autograd
(not timed here: these machines have no GPU).

Not covered: dropout, attention bias or sliding windows (the model has none), double backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from opencomposer.device import in_autocast_dtype

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


@dataclass(frozen=True)
class Segment:
    """Tokens [start, start + length) of the packed row; they see tokens [prefix_start,
    prefix_start + prefix_length) first (prefix_length 0: no prefix), then themselves causally."""

    start: int
    length: int
    prefix_start: int = 0
    prefix_length: int = 0

    @property
    def end(self) -> int:
        return self.start + self.length


class SegmentAttention:
    """The attention of a packed row (module docstring); called by each attention layer with
    q [1, H, N, C], k and v [1, G, N, C] (after RoPE), returns o [1, H, N, C]."""

    def __init__(self, segments: list[Segment]):
        self.segments = segments
        self.runs = _prefix_runs(segments)   # the same for every layer

    def __call__(self, q_1HNC: torch.Tensor, k_1GNC: torch.Tensor, v_1GNC: torch.Tensor) -> torch.Tensor:
        # the kernel takes one dtype; under autocast RoPE's float32 tables promote q and k
        q_1HNC, k_1GNC, v_1GNC = in_autocast_dtype(q_1HNC, k_1GNC, v_1GNC)
        if q_1HNC.device.type == "cpu":
            # in float32 whatever the dtype: the CPU kernel's bfloat16 backward is ~4x slower than its
            # float32 one (docs/benchmarks.md, issue 23), which made a bfloat16 step slower than float32
            o_1HNC = _CPUSegmentAttention.apply(q_1HNC.float(), k_1GNC.float(), v_1GNC.float(),
                                                self.segments, self.runs)
            return o_1HNC.to(q_1HNC.dtype)
        return masked_segment_attention(q_1HNC, k_1GNC, v_1GNC, self.segments)


def masked_segment_attention(q_1HNC: torch.Tensor, k_1GNC: torch.Tensor, v_1GNC: torch.Tensor,
                             segments: list[Segment]) -> torch.Tensor:
    """Each segment as one masked attention over [its prefix; its own keys] (any device)."""
    outs = []
    for s in segments:
        q = q_1HNC[:, :, s.start:s.end]
        k, v = k_1GNC[:, :, s.start:s.end], v_1GNC[:, :, s.start:s.end]
        mask = None
        if s.prefix_length:
            p0, p1 = s.prefix_start, s.prefix_start + s.prefix_length
            k, v = torch.cat([k_1GNC[:, :, p0:p1], k], 2), torch.cat([v_1GNC[:, :, p0:p1], v], 2)
            t = torch.arange(s.length, device=q.device)
            mask = torch.arange(s.prefix_length + s.length, device=q.device)[None, :] <= t[:, None] + s.prefix_length
        outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                                   enable_gqa=k.shape[1] != q.shape[1]))
    return torch.cat(outs, 2)


def _prefix_runs(segments: list[Segment]) -> list[tuple[int, int, int, int]]:
    """(start, end, prefix_start, prefix_end) of each run of consecutive segments after the same
    prefix: the suffixes of one group, whose queries see that prefix's keys unmasked, so they go
    to the kernel in one call."""
    runs: list[list[int]] = []
    for s in segments:
        if not s.prefix_length:
            continue
        p = [s.prefix_start, s.prefix_start + s.prefix_length]
        if runs and runs[-1][1] == s.start and runs[-1][2:] == p:
            runs[-1][1] = s.end
        else:
            runs.append([s.start, s.end, *p])
    return [tuple(r) for r in runs]


class _CPUSegmentAttention(torch.autograd.Function):
    """All segments of one layer as one autograd node: the flash kernel per block (module docstring):
    each segment's causal block, then one unmasked call per group for its suffixes' prefix block;
    outputs and gradients are written into whole-row tensors (no per-slice autograd bookkeeping)."""

    @staticmethod
    def forward(ctx, q_1HNC, k_1GNC, v_1GNC, segments, runs):
        _, H, N, C = q_1HNC.shape
        o_1NHC = q_1HNC.new_empty(1, N, H, C)   # the kernel's own output layout: [B, T, H, C] in memory
        lse_1HN = q_1HNC.new_empty(1, H, N, dtype=torch.float32)
        o_1HNC = o_1NHC.transpose(1, 2)
        for s in segments:
            a, b = s.start, s.end
            o_1HNC[:, :, a:b], lse_1HN[:, :, a:b] = _flash(q_1HNC[:, :, a:b], k_1GNC[:, :, a:b], v_1GNC[:, :, a:b],
                                                           0.0, True)
        for a, b, p0, p1 in runs:
            o_p, lse_p = _flash(q_1HNC[:, :, a:b], k_1GNC[:, :, p0:p1], v_1GNC[:, :, p0:p1], 0.0, False)
            lse_s = lse_1HN[:, :, a:b]
            merged = torch.logaddexp(lse_p, lse_s)
            w_p, w_s = (lse_p - merged).exp_().unsqueeze(-1), (lse_s - merged).exp_().unsqueeze(-1)
            o_1HNC[:, :, a:b] = o_p * w_p.to(o_p.dtype) + o_1HNC[:, :, a:b] * w_s.to(o_p.dtype)
            lse_1HN[:, :, a:b] = merged
        ctx.segments, ctx.runs = segments, runs
        ctx.save_for_backward(q_1HNC, k_1GNC, v_1GNC, o_1HNC, lse_1HN)
        return o_1HNC

    @staticmethod
    def backward(ctx, g_1HNC):
        q_1HNC, k_1GNC, v_1GNC, o_1HNC, lse_1HN = ctx.saved_tensors
        gq, gk, gv = torch.zeros_like(q_1HNC), torch.zeros_like(k_1GNC), torch.zeros_like(v_1GNC)
        g_1HNC = g_1HNC.contiguous()

        def block(a: int, b: int, k0: int, k1: int, causal: bool) -> None:
            """Queries a..b against keys k0..k1, with the merged output and log-sum-exp."""
            dq, dk, dv = _flash_backward(g_1HNC[:, :, a:b], q_1HNC[:, :, a:b], k_1GNC[:, :, k0:k1],
                                         v_1GNC[:, :, k0:k1], o_1HNC[:, :, a:b], lse_1HN[:, :, a:b].contiguous(),
                                         0.0, causal)
            gq[:, :, a:b] += dq
            gk[:, :, k0:k1] += dk
            gv[:, :, k0:k1] += dv

        for s in ctx.segments:
            block(s.start, s.end, s.start, s.end, True)
        for a, b, p0, p1 in ctx.runs:
            block(a, b, p0, p1, False)
        ctx.segments = ctx.runs = None
        return gq, gk, gv, None, None
