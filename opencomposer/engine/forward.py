"""The engine's forward passes behind one seam: T tokens per row appended to KV-cache slots
(prefill: T = prompt length; plain decode: T = 1; speculative verification: T = k+1) and MTP
drafting steps.

`Forward` is the Protocol; two backends implement it on the same model and cache:

  * `NativeForward`: every pass on the C++ kernels (native.py): per layer the normed q/k/v
    product, attention (q/k norms, RoPE, cache write and softmax in one op), the output product
    with its residual, and the whole normed MoE (router, top-k, grouped experts) or dense MLP:
    4 ops per layer, whatever T is.
  * `TorchForward`: the model's generic forward (model.py), and for T = 1 fused.py's decode
    step on oneDNN or PyTorch kernels: used where the C++ kernels cannot be built, or for
    dtypes other than float32.

Both compute what `Transformer.forward(ids_BT, cache, slots)` and `Transformer.mtp_step`
compute, up to float rounding (summation order, ~1e-6 in float32; tests/engine/test_forward.py).
Packed weights are `kernels.Derived`: rebuilt when a weight changes in place, so
`Engine.update_weights` needs nothing more.

Left out: router replay (the engine never replays), devices other than the CPU for the native
backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from opencomposer.engine import fused, native
from opencomposer.engine.kernels import Derived
from opencomposer.model.model import MoE, KVCache, Transformer


@dataclass
class Step:
    """One pass's outputs for B rows of T tokens."""

    hidden: torch.Tensor                 # [B, T, D] final-normed (MTP depth 1 reads it)
    logits: torch.Tensor | None          # [B, T, V] ("all"), [B, V] ("last"), None ("none")
    routed_experts: torch.Tensor | None  # [B, T, Y, K] int32, when asked


class Forward(Protocol):
    def __call__(self, ids_BT: torch.Tensor, slots_B: torch.Tensor, *, logits: str = "all",
                 want_experts: bool = False) -> Step:
        """Row b appends its T tokens to slot slots_B[b] at positions cache.lengths[slot]..+T-1
        (lengths are not advanced). logits: "all", "last" or "none"."""

    def mtp_step(self, depth: int, hidden_BTD: torch.Tensor, ids_BT: torch.Tensor, slots_B: torch.Tensor,
                 logits: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Transformer.mtp_step's contract, but only the last position's logits [B, V] (or None)."""


def make_forward(model: Transformer, cache: KVCache, packed: bool) -> Forward:
    """The native backend where it runs (float32 on the CPU, kernels built), else the torch one."""
    p = next(model.parameters())
    if p.dtype == torch.float32 and p.device.type == "cpu" and native.ops() is not None \
            and model.config.head_dim % 8 == 0:
        return NativeForward(model, cache)
    return TorchForward(model, cache, packed)


class TorchForward:
    """The model's own forward; T = 1 with all logits through fused.FusedDecoder."""

    def __init__(self, model: Transformer, cache: KVCache, packed: bool):
        self.model, self.cache = model, cache
        self.fused = fused.FusedDecoder(model, cache, packed=packed)

    def __call__(self, ids_BT, slots_B, *, logits="all", want_experts=False) -> Step:
        if ids_BT.shape[1] == 1 and logits == "all":
            logits_BV, routed_BYK, hidden_BD = self.fused.decode(ids_BT[:, 0], slots_B.tolist(), want_experts)
            return Step(hidden_BD[:, None], logits_BV[:, None],
                        routed_BYK[:, None] if routed_BYK is not None else None)
        out = self.model(ids_BT, self.cache, slots_B, return_routed_experts=want_experts, compute_logits=False)
        head = self.model.lm_head
        lg = {"all": lambda: head(out.hidden), "last": lambda: head(out.hidden[:, -1]), "none": lambda: None}
        return Step(out.hidden, lg[logits](), out.routed_experts)

    def mtp_step(self, depth, hidden_BTD, ids_BT, slots_B, logits=True):
        B, T = ids_BT.shape
        m = self.model
        step = self.cache.step(slots_B, T, self.cache.lengths[slots_B] - T)
        cos_BTC, sin_BTC = m.rope(step.pos_BT, hidden_BTD.dtype)
        kv = self.cache.layer(m.config.num_hidden_layers + depth - 1)
        h_BTD = m.mtp[depth - 1](hidden_BTD, m.embed_tokens(ids_BT), cos_BTC, sin_BTC, kv, step)
        return (m.lm_head(h_BTD[:, -1]) if logits else None), h_BTD


@dataclass
class _Block:
    """Packed weights of one transformer block (main layer or MTP block)."""

    block: torch.nn.Module
    cache_layer: int
    qkv: Derived        # (packed [q; k; v], bias or None)
    o: Derived          # packed o_proj
    mlp: Derived        # MoE: (router, gate/up, down); dense: (gate/up, down)
    moe: MoE | None


class NativeForward:
    """Forward on the C++ kernels (module docstring)."""

    def __init__(self, model: Transformer, cache: KVCache):
        self.ops = native.ops()
        self.model, self.cache, cfg = model, cache, model.config
        self.H, self.G, self.C, self.D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        # Per-position rotary tables, computed exactly as Transformer.rope computes them.
        freqs_Lc = torch.arange(cache.max_len, dtype=torch.float32)[:, None] * model.inv_freq
        emb_LC = torch.cat([freqs_Lc, freqs_Lc], dim=-1)
        self.cos_LC = (emb_LC.cos() * model.rope_scale).contiguous()
        self.sin_LC = (emb_LC.sin() * model.rope_scale).contiguous()
        self.blocks = [self._block(layer, i) for i, layer in enumerate(model.layers)]
        self.mtp_blocks = [self._block(m.block, cfg.num_hidden_layers + d) for d, m in enumerate(model.mtp)]
        self.eh = [Derived([m.eh_proj.weight], native.pack_linear) for m in model.mtp]
        self.head = Derived([model.lm_head.weight], native.pack_linear)

    def _block(self, block, cache_layer: int) -> _Block:
        a = block.self_attn
        qkv_w = [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]
        biases = [a.q_proj.bias, a.k_proj.bias, a.v_proj.bias] if a.q_proj.bias is not None else []

        def build_qkv(wq, wk, wv, *b):
            return native.pack_linear(torch.cat([wq, wk, wv])), (torch.cat(b) if b else None)

        moe = block.mlp if isinstance(block.mlp, MoE) else None
        if moe is not None:
            def build_mlp(router_ED, gate_up_EfD, down_EDF):
                F_ = down_EDF.shape[-1]
                F8 = -(-F_ // 8) * 8  # the kernels' activation width: padded to whole panels
                down_EDF8 = F.pad(down_EDF, (0, F8 - F_))
                return (native.pack_linear(router_ED), native.pack_swiglu(gate_up_EfD[:, :F_], gate_up_EfD[:, F_:]),
                        native.pack_linear(down_EDF8))

            mlp = Derived([moe.gate.weight, moe.experts.gate_up_proj, moe.experts.down_proj], build_mlp)
        else:
            m = block.mlp
            mlp = Derived([m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight],
                          lambda g, u, d: (native.pack_swiglu(g, u), native.pack_linear(d)))
        return _Block(block, cache_layer, Derived(qkv_w + biases, build_qkv),
                      Derived([a.o_proj.weight], native.pack_linear), mlp, moe)

    def _run_block(self, blk: _Block, x_ND: torch.Tensor, slots_B: torch.Tensor,
                   start_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x + attn(norm(x)), then + mlp(norm(x)) (the norms done by the kernels); returns the
        residual stream and the experts [N, K] (None for a dense block)."""
        ops, b, a, D = self.ops, blk.block, blk.block.self_attn, self.D
        n1, n2 = b.input_layernorm, b.post_attention_layernorm
        qkv_w, qkv_b = blk.qkv.get()
        qkv_NX = ops.linear(x_ND, qkv_w, (self.H + 2 * self.G) * self.C, qkv_b, None, n1.weight, n1.eps)
        k_SGLC, v_SGLC = self.cache.layer(blk.cache_layer)
        o_NX = ops.attention(qkv_NX, a.q_norm.weight, a.k_norm.weight, a.q_norm.eps, self.cos_LC, self.sin_LC,
                             k_SGLC, v_SGLC, slots_B, start_B, self.H)
        x_ND = ops.linear(o_NX, blk.o.get(), D, a.o_proj.bias, x_ND)
        moe = blk.moe
        if moe is None:
            gu, down = blk.mlp.get()
            act_NF = ops.swiglu(x_ND, gu, b.mlp.down_proj.in_features, n2.weight, n2.eps)
            return ops.linear(act_NF, down, D, None, x_ND), None
        router, gu, down = blk.mlp.get()
        E = moe.gate.out_features
        if moe.shared_expert is None:
            return ops.moe(x_ND, n2.weight, n2.eps, router, E, moe.k, moe.norm_topk_prob, gu, down)
        h_ND = ops.rms_norm(x_ND, n2.weight, n2.eps)
        x_ND = x_ND + torch.sigmoid(moe.shared_expert_gate(h_ND)) * moe.shared_expert(h_ND)
        return ops.moe(h_ND, None, 0.0, router, E, moe.k, moe.norm_topk_prob, gu, down, x_ND)

    def _check(self, start_B: torch.Tensor, T: int) -> None:
        if int(start_B.min()) < 0 or int(start_B.max()) + T > self.cache.max_len:
            raise ValueError(f"KV cache: positions {int(start_B.min())}..{int(start_B.max()) + T - 1} do not fit "
                             f"in a slot of max_len={self.cache.max_len}; free a slot or build a longer cache")

    def __call__(self, ids_BT, slots_B, *, logits="all", want_experts=False) -> Step:
        model, cfg = self.model, self.model.config
        B, T = ids_BT.shape
        slots_B = slots_B.to(torch.int64).contiguous()
        start_B = self.cache.lengths[slots_B].contiguous()
        self._check(start_B, T)
        x_ND = model.embed_tokens(ids_BT.reshape(-1))
        experts_Y = []
        for blk in self.blocks:
            x_ND, idx_NK = self._run_block(blk, x_ND, slots_B, start_B)
            if idx_NK is not None:
                experts_Y.append(idx_NK)
        h_ND = self.ops.rms_norm(x_ND, model.norm.weight, model.norm.eps)
        h_BTD = h_ND.view(B, T, self.D)
        V = cfg.vocab_size
        out = None
        if logits == "all":
            out = self.ops.linear(h_ND, self.head.get(), V, None, None).view(B, T, V)
        elif logits == "last":
            out = self.ops.linear(h_BTD[:, -1].contiguous(), self.head.get(), V, None, None)
        routed = None
        if want_experts:
            routed = (torch.stack(experts_Y, dim=1).view(B, T, len(experts_Y), -1).to(torch.int32) if experts_Y
                      else torch.zeros(B, T, 0, cfg.num_experts_per_tok, dtype=torch.int32))
        return Step(h_BTD, out, routed)

    def mtp_step(self, depth, hidden_BTD, ids_BT, slots_B, logits=True):
        model, D = self.model, self.D
        m = model.mtp[depth - 1]
        B, T = ids_BT.shape
        slots_B = slots_B.to(torch.int64).contiguous()
        start_B = (self.cache.lengths[slots_B] - T).contiguous()
        self._check(start_B, T)
        h_ND = self.ops.rms_norm(hidden_BTD.reshape(B * T, D), m.hnorm.weight, m.hnorm.eps)
        e_ND = self.ops.rms_norm(model.embed_tokens(ids_BT.reshape(-1)), m.enorm.weight, m.enorm.eps)
        x_ND = self.ops.linear(torch.cat([h_ND, e_ND], dim=-1), self.eh[depth - 1].get(), D, None, None)
        x_ND, _ = self._run_block(self.mtp_blocks[depth - 1], x_ND, slots_B, start_B)
        h_BTD = self.ops.rms_norm(x_ND, m.norm.weight, m.norm.eps).view(B, T, D)
        out = self.ops.linear(h_BTD[:, -1].contiguous(), self.head.get(), model.config.vocab_size, None, None) \
            if logits else None
        return out, h_BTD
