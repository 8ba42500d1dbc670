"""CPU inference kernels: the engine's linear layers and experts on oneDNN with prepacked weights.

Decoding multiplies a few rows (1-16 tokens, or the 2-6 tokens routed to one expert) by each
weight matrix. PyTorch's default fp32 path (MKL sgemm) repacks the weight on every call and,
on the AMD EPYC (Zen 5) CPUs this project runs on, reaches about a third of the memory
bandwidth at those shapes; oneDNN with the weight reordered once into its blocked layout
(`torch.ops.mkldnn._reorder_linear_weight` / `_linear_pointwise`, the ops inductor's CPU
freezing passes use) runs the same products 1.5-2x faster (benchmarks/decode.py shows the
effect on a whole decode step). The math is the model's; only the summation order differs
(logits agree to ~1e-6 in float32).

`prepack(model)` swaps, in place, every `nn.Linear` for a `PackedLinear` and every `Experts`
for a `PackedExperts`. Both keep the original Parameters under the same names, so
`state_dict()`, `load_state_dict`, checkpoints and tied embeddings are unchanged, and:
  * the packed copy is rebuilt whenever the weight's in-place version counter moves (an
    `Engine.update_weights`, an optimizer step), so it is never stale;
  * with autograd recording (training), they run the eager code: the oneDNN op has no
    backward.
Left out: GPUs (nothing to do there), int8/fp8 weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from opencomposer.model.model import Experts


def available() -> bool:
    """oneDNN is built into this torch and runs the two ops."""
    try:
        w = torch.randn(8, 4)
        ok = torch.allclose(_linear(torch.ones(2, 4), _pack(w), None), F.linear(torch.ones(2, 4), w), atol=1e-5)
        return bool(torch.backends.mkldnn.is_available() and ok)
    except (AttributeError, RuntimeError):
        return False


def _pack(w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(w.detach(), None)


def _linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class _Packed:
    """Packed copies of some weights (each [out, in], or [E, out, in]: one per expert), rebuilt
    when any of them has been modified in place since."""

    def __init__(self, weights: list[torch.Tensor]):
        self.weights, self.versions, self.packed = weights, None, []

    def get(self) -> list:
        versions = [w._version for w in self.weights]
        if versions != self.versions:
            self.packed = [_pack(w) if w.dim() == 2 else [_pack(we) for we in w] for w in self.weights]
            self.versions = versions
        return self.packed


class PackedLinear(nn.Module):
    """nn.Linear with a oneDNN-packed weight for inference (same `weight`/`bias` Parameters)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self._packed = _Packed([self.weight])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and self.weight.requires_grad:
            return F.linear(x, self.weight, self.bias)
        return _linear(x, self._packed.get()[0], self.bias)


class PackedExperts(Experts):
    """Experts (model.py) with each expert's two matrices packed; the same grouped algorithm."""

    def __init__(self, experts: Experts):
        nn.Module.__init__(self)
        self.gate_up_proj, self.down_proj = experts.gate_up_proj, experts.down_proj
        self._packed = _Packed([self.gate_up_proj, self.down_proj])

    def forward(self, x_ND: torch.Tensor, w_NK: torch.Tensor, idx_NK: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and self.gate_up_proj.requires_grad:
            return super().forward(x_ND, w_NK, idx_NK)
        gate_up_E, down_E = self._packed.get()
        K = idx_NK.shape[1]
        e_M = idx_NK.reshape(-1)
        order_M = torch.argsort(e_M, stable=True)
        counts = torch.bincount(e_M, minlength=self.gate_up_proj.shape[0]).tolist()
        tok_M = order_M // K
        x_MD = x_ND[tok_M]
        outs, start = [], 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            gate, up = _linear(x_MD[start:start + n], gate_up_E[e], None).chunk(2, dim=-1)
            outs.append(_linear(F.silu(gate) * up, down_E[e], None))
            start += n
        y_MD = torch.cat(outs) * w_NK.reshape(-1)[order_M, None]
        return torch.zeros_like(x_ND).index_add_(0, tok_M, y_MD.to(x_ND.dtype))


def prepack(model: nn.Module) -> int:
    """Swap the model's nn.Linear and Experts modules for the packed ones, in place; returns
    how many were swapped."""
    n = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, PackedLinear(child))
                n += 1
            elif type(child) is Experts:
                setattr(module, name, PackedExperts(child))
                n += 1
    return n
