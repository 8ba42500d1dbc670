"""The routed experts' training path: model.py's grouped loop with a backward that is grouped too.

`model.Experts` runs each expert on the contiguous group of (token, expert) rows routed to it
(`grouped_experts`). Under plain autograd the backward of that loop pays for the indexing that
the forward gets for free: `gate_up_proj[e]` is a select, whose backward writes expert e's
weight gradient into a zero tensor of the *whole* stacked parameter [E, 2F, D] and adds it to
the accumulated gradient (2E full-size fills and adds per layer), and each group's slice of
the gathered rows x_MD does the same with a zero [M, D] tensor (E fills and adds of the whole
micro-batch's rows per layer). On the demo's SFT shapes those fills and adds were ~10% of a step.

`grouped_swiglu` is the same computation as one autograd node: the forward keeps each group's
gate, up and activation, and the backward runs, per expert, the very products autograd runs for
F.linear, chunk, silu and mul (same operands, same order, so the same bits:
tests/model/test_model.py compares them), writing weight gradients straight into one [E, ...]
tensor per parameter and the rows' gradient into one [M, D] tensor.

Under autocast (pretraining's, SFT's and the RL trainer's `dtype: bfloat16`) the node runs in the
autocast dtype, forward and backward: the rows and both weights are cast on entry, and the weight
gradients come back in that dtype and are cast to the parameters' float32 by autograd, as for any
autocast linear.

Not covered: double backward (nothing here differentiates twice), and experts that received no
rows, whose gradient is an exact zero as under autograd.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from opencomposer.device import in_autocast_dtype


class _GroupedSwiGLU(torch.autograd.Function):
    """y_MD = per group e: down_e(silu(gate_e(x)) * up_e(x)) over rows start_e .. start_e + n_e."""

    @staticmethod
    def forward(ctx, x_MD: torch.Tensor, gate_up_EFD: torch.Tensor, down_EDF: torch.Tensor,
                counts: list[int]) -> torch.Tensor:
        # Autocast would cast the forward's F.linear operands but not the backward's mm calls (a
        # node's backward runs outside the autocast region): the whole node runs in its dtype.
        x_MD, gate_up_EFD, down_EDF = in_autocast_dtype(x_MD, gate_up_EFD, down_EDF)
        with torch.autocast(x_MD.device.type, enabled=False):
            return _GroupedSwiGLU._forward(ctx, x_MD, gate_up_EFD, down_EDF, counts)

    @staticmethod
    def _forward(ctx, x_MD, gate_up_EFD, down_EDF, counts):
        outs, saved, start = [], [], 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            x_nD = x_MD[start:start + n]
            gate_nF, up_nF = F.linear(x_nD, gate_up_EFD[e]).chunk(2, dim=-1)
            act_nF = F.silu(gate_nF)
            h_nF = act_nF * up_nF
            outs.append(F.linear(h_nF, down_EDF[e]))
            saved.append((gate_nF, up_nF, act_nF, h_nF))
            start += n
        ctx.counts, ctx.saved = counts, saved
        ctx.save_for_backward(x_MD, gate_up_EFD, down_EDF)
        return torch.cat(outs)

    @staticmethod
    def backward(ctx, gy_MD: torch.Tensor):
        x_MD, gate_up_EFD, down_EDF = ctx.saved_tensors
        need_x, need_gu, need_down = ctx.needs_input_grad[:3]
        g_gate_up = torch.zeros_like(gate_up_EFD) if need_gu else None
        g_down = torch.zeros_like(down_EDF) if need_down else None
        gx = []
        start, i = 0, 0
        for e, n in enumerate(ctx.counts):
            if n == 0:
                continue
            gate_nF, up_nF, act_nF, h_nF = ctx.saved[i]
            i += 1
            gy_nD = gy_MD[start:start + n]
            x_nD = x_MD[start:start + n]
            start += n
            if need_down:
                g_down[e] = gy_nD.t().mm(h_nF)
            gh_nF = gy_nD.mm(down_EDF[e])
            g_gate_nF = torch.ops.aten.silu_backward(gh_nF * up_nF, gate_nF)
            g_up_nF = gh_nF * act_nF
            g_gu_n2F = torch.cat([g_gate_nF, g_up_nF], dim=-1)
            if need_gu:
                g_gate_up[e] = g_gu_n2F.t().mm(x_nD)
            if need_x:
                gx.append(g_gu_n2F.mm(gate_up_EFD[e]))
        ctx.saved = None
        return (torch.cat(gx) if need_x else None), g_gate_up, g_down, None


def grouped_swiglu(x_MD: torch.Tensor, gate_up_EFD: torch.Tensor, down_EDF: torch.Tensor,
                   counts: list[int]) -> torch.Tensor:
    """The SwiGLU experts over rows grouped by expert (counts[e] rows of expert e, in order) [M, D]."""
    return _GroupedSwiGLU.apply(x_MD, gate_up_EFD, down_EDF, counts)


def grouped_experts_train(x_ND: torch.Tensor, w_NK: torch.Tensor, idx_NK: torch.Tensor,
                          gate_up_EFD: torch.Tensor, down_EDF: torch.Tensor) -> torch.Tensor:
    """model.grouped_experts (the same sort, gather, weighting and scatter) with the experts'
    loop as one autograd node (`grouped_swiglu`)."""
    K, E = idx_NK.shape[1], gate_up_EFD.shape[0]
    e_M = idx_NK.reshape(-1)
    order_M = torch.argsort(e_M, stable=True)
    counts = torch.bincount(e_M, minlength=E).tolist()
    tok_M = order_M // K
    y_MD = grouped_swiglu(x_ND[tok_M], gate_up_EFD, down_EDF, counts) * w_NK.reshape(-1)[order_M, None]
    return torch.zeros_like(x_ND).index_add_(0, tok_M, y_MD.to(x_ND.dtype))
