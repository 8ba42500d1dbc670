"""CPU inference kernels: the engine's linear layers and experts on oneDNN with prepacked weights.

Decoding multiplies a few rows (1-16 tokens, or the 2-6 tokens routed to one expert) by each
weight matrix. PyTorch's default fp32 path (MKL sgemm) repacks the weight on every call and,
on the AMD EPYC (Zen 5) CPUs this project runs on, reaches about a third of the memory
bandwidth at those shapes; oneDNN with the weight reordered once into its blocked layout
(`torch.ops.mkldnn._reorder_linear_weight` / `_linear_pointwise`, the ops inductor's CPU
freezing passes use) runs the same products 1.5-2x faster (benchmarks/decode.py shows the
effect on a whole decode step). The math is the model's; only the summation order differs
(logits agree to ~1e-6 in float32).

`linear_silu`, `linear_mul` and `linear_add` apply an activation, a product or a residual
sum inside the matmul kernel (oneDNN post-ops), saving one pass over the output each.
`Derived` holds tensors built from some weights (a packed copy, or fused.py's concatenations)
and rebuilds them when a weight's in-place version counter has moved.

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

from opencomposer.model.model import Experts, grouped_experts


def available() -> bool:
    """oneDNN is built into this torch and runs the ops below."""
    try:
        w = torch.randn(8, 4)
        x, other = torch.ones(2, 4), torch.full((2, 8), 0.5)
        ok = (torch.allclose(linear(x, pack(w), None), F.linear(x, w), atol=1e-5)
              and torch.allclose(linear_silu(x, pack(w)), F.silu(F.linear(x, w)), atol=1e-5)
              and torch.allclose(linear_mul(x, pack(w), other), F.linear(x, w) * other, atol=1e-5)
              and torch.allclose(linear_add(x, pack(w), None, other), F.linear(x, w) + other, atol=1e-5))
        return bool(torch.backends.mkldnn.is_available() and ok)
    except (AttributeError, RuntimeError):
        return False


def packs(dtype: torch.dtype) -> bool:
    """Whether weights of `dtype` can be packed here: float32 wherever `available()`; bfloat16 only
    on CPUs with oneDNN's bf16 support (avx512bw/vl/dq or avx_ne_convert; without it the reorder
    raises, so such an engine runs its bfloat16 weights unpacked)."""
    if not available():
        return False
    return dtype != torch.bfloat16 or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pack(w: torch.Tensor) -> torch.Tensor:
    """w [out, in] reordered into oneDNN's blocked layout, for `linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(w.detach(), None)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, w, bias) with w packed by `pack`."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def linear_silu(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """silu(x w^T), the activation applied by the matmul kernel (oneDNN post-op "swish")."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "swish", [], "")


def linear_mul(x: torch.Tensor, packed: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """(x w^T) * other, the product applied by the matmul kernel (a binary post-op)."""
    return torch.ops.mkldnn._linear_pointwise.binary(x, other, packed, None, "mul")


def linear_add(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, other: torch.Tensor) -> torch.Tensor:
    """x w^T + bias + other (a residual connection), added by the matmul kernel."""
    return torch.ops.mkldnn._linear_pointwise.binary(x, other, packed, bias, "add")


class Derived:
    """Tensors built from some weights by `build(*weights)`, rebuilt whenever any weight has
    been modified in place since (`Engine.update_weights`, `load_state_dict`, an optimizer
    step: all bump the tensor's version counter), so they are never stale."""

    def __init__(self, weights: list[torch.Tensor], build):
        self.weights, self.build, self.versions, self.value = weights, build, None, None

    def get(self):
        versions = [w._version for w in self.weights]
        if versions != self.versions:
            with torch.no_grad():
                self.value = self.build(*(w.detach() for w in self.weights))
            self.versions = versions
        return self.value


class PackedLinear(nn.Module):
    """nn.Linear with a oneDNN-packed weight for inference (same `weight`/`bias` Parameters)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self._packed = Derived([self.weight], pack)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and self.weight.requires_grad:
            return F.linear(x, self.weight, self.bias)
        return linear(x, self._packed.get(), self.bias)


class PackedExperts(Experts):
    """Experts (model.py) with each expert's two matrices packed; the same grouped loop (`grouped_experts`)."""

    def __init__(self, experts: Experts):
        nn.Module.__init__(self)
        self.gate_up_proj, self.down_proj = experts.gate_up_proj, experts.down_proj
        self._packed = Derived([self.gate_up_proj, self.down_proj],
                               lambda gate_up, down: ([pack(w) for w in gate_up], [pack(w) for w in down]))

    def forward(self, x_ND: torch.Tensor, w_NK: torch.Tensor, idx_NK: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and self.gate_up_proj.requires_grad:
            return super().forward(x_ND, w_NK, idx_NK)
        gate_up_E, down_E = self._packed.get()

        def expert(e: int, x_nD: torch.Tensor) -> torch.Tensor:
            gate, up = linear(x_nD, gate_up_E[e], None).chunk(2, dim=-1)
            return linear(F.silu(gate) * up, down_E[e], None)

        return grouped_experts(x_ND, w_NK, idx_NK, self.gate_up_proj.shape[0], expert)


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
