"""The engine's one-token decode step with few, large PyTorch ops: the same math as the model's
cached forward (model.py) at T = 1, rearranged for a CPU where each PyTorch op costs
microseconds. The engine uses it where its C++ kernels (native.py) are unavailable
(forward.TorchForward).

At batch 16 the ~15M-parameter benchmark model (benchmarks/decode.py) spends its decode step
reading ~50 MB of weights; the model's generic forward adds ~1,500 small ops (norms, rotary,
mask building, a Python loop over experts with index bookkeeping) that cost as much again.
`FusedDecoder.decode` computes the same step as `Transformer.forward(ids_B1, cache, slots)`
with about 30 ops per layer:

  * q, k and v come from one matmul with the three weights concatenated [(H+2G)C, D];
  * the q and k heads are RMS-normed together (F.rms_norm, then one multiply by the two norm
    weights side by side, the query half pre-scaled by 1/sqrt(C) so attention needs no scale),
    and rotated together with per-position tables: rope(x) = x * cos + roll(x, C/2) * sin',
    with sin' = [-sin, sin] (roll(x, C/2) * sin' = rotate_half(x) * sin, bit for bit);
  * attention over the slot cache is two batched matmuls (baddbmm adds the causal mask)
    and a softmax, reading the cache in place when the batch's slots are contiguous;
  * MoE: the router's softmax top-k exactly as `model.route` (so the reported experts are the
    router's choice), then, when the batch's N*K (token, expert) pairs can cover all E
    experts, every expert in one matmul: y = [a_1 w_1, ..., a_E w_E] @ [down_1; ...; down_E]
    with a_e = silu(gate_e x) * up_e x and w_e the token's routing weight (0 for experts it
    was not routed to). That reads each expert's weights once (the minimum when every expert
    is hit, as at batch 16 with top-2 of 8) in two matmuls instead of 2E; its extra arithmetic
    (E/K times the routed products) is cheap while the step is bound by memory bandwidth, so
    it is used only when E <= DENSE_MAX_RATIO * K. Otherwise the model's grouped experts run.

The concatenated and packed weights are `kernels.Derived`: rebuilt when a weight changes in
place, so `Engine.update_weights` needs nothing more. Results equal the generic forward up to
float rounding (summation order; ~1e-6 in float32), checked by tests/engine/test_fused.py.

Left out: T > 1 (prefill and speculative verification use the generic forward), router replay
(the engine never replays), and the MTP modules.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from opencomposer.engine import kernels
from opencomposer.model.model import MoE, Transformer, KVCache

DENSE_MAX_RATIO = 8
"""Run all experts densely only when E <= this * K (the dense step's arithmetic is E/K times
the routed one's)."""


class _PlainOps:
    """kernels.py's packed products, on plain weights with PyTorch's default kernels."""

    pack = staticmethod(lambda w: w.contiguous())
    linear = staticmethod(F.linear)
    linear_silu = staticmethod(lambda x, w: F.silu(F.linear(x, w)))
    linear_mul = staticmethod(lambda x, w, other: F.linear(x, w) * other)
    linear_add = staticmethod(lambda x, w, bias, other: F.linear(x, w, bias) + other)


class FusedDecoder:
    """decode(ids_B, slots) == the model's cached forward of one token per row (module docstring).

    packed: use oneDNN prepacked weights (kernels.py); otherwise PyTorch's F.linear.
    """

    def __init__(self, model: Transformer, cache: KVCache, packed: bool):
        cfg = model.config
        self.model, self.cache, self.cfg = model, cache, cfg
        self.ops = kernels if packed else _PlainOps
        self.dtype = model.embed_tokens.weight.dtype
        H, G, C = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.H, self.G, self.C = H, G, C
        # Per-position rotary tables, computed exactly as Transformer.rope computes them.
        freqs_Lc = torch.arange(cache.max_len, dtype=torch.float32)[:, None] * model.inv_freq
        cos_Lc, sin_Lc = freqs_Lc.cos() * model.rope_scale, freqs_Lc.sin() * model.rope_scale
        self.device = cache.lengths.device
        self.cos_LC = torch.cat([cos_Lc, cos_Lc], dim=-1).to(self.device, self.dtype)
        self.sin_LC = torch.cat([-sin_Lc, sin_Lc], dim=-1).to(self.device, self.dtype)
        self.attn = [self._attention_weights(layer.self_attn) for layer in model.layers]
        self.o_proj = [kernels.Derived([layer.self_attn.o_proj.weight], self.ops.pack) for layer in model.layers]
        self.experts = [self._expert_weights(layer.mlp) if isinstance(layer.mlp, MoE) else None
                        for layer in model.layers]

    def _attention_weights(self, attn) -> kernels.Derived:
        H, G, C = self.H, self.G, self.C
        scale = 1.0 / math.sqrt(C)
        has_bias = attn.q_proj.bias is not None
        weights = [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, attn.q_norm.weight, attn.k_norm.weight]
        if has_bias:
            weights += [attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]

        def build(wq, wk, wv, nq, nk, *biases):
            qkv = self.ops.pack(torch.cat([wq, wk, wv]))
            bias = torch.cat(biases) if has_bias else None
            norm_RC = torch.cat([(nq * scale).expand(H, C), nk.expand(G, C)]).to(self.dtype)
            return qkv, bias, norm_RC

        return kernels.Derived(weights, build)

    def _expert_weights(self, moe: MoE) -> kernels.Derived | None:
        E, twoF, D = moe.experts.gate_up_proj.shape
        if E > DENSE_MAX_RATIO * moe.k:
            return None

        F_ = twoF // 2

        def build(gate_up_EfD, down_EDF):
            # gate and up [E*F, D]; down [D, E*F]: column e*F + f of it is down_e[:, f].
            return (self.ops.pack(gate_up_EfD[:, :F_].reshape(E * F_, D)),
                    self.ops.pack(gate_up_EfD[:, F_:].reshape(E * F_, D)),
                    self.ops.pack(down_EDF.permute(1, 0, 2).reshape(D, E * F_)))

        return kernels.Derived([moe.experts.gate_up_proj, moe.experts.down_proj], build)

    def decode(self, ids_B: torch.Tensor, slots: list[int],
               want_experts: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """One token per row appended to slot slots[b] at position cache.lengths[slot] (the
        caller advances the lengths). Returns logits [B, V], the routed experts [B, Y, K] int32
        (None unless asked) and the final-normed hidden [B, D]."""
        model, cache, cfg = self.model, self.cache, self.cfg
        B, H, G, C = len(slots), self.H, self.G, self.C
        r = H // G
        slots_B = torch.tensor(slots, device=self.device)
        pos_B = cache.lengths[slots_B]
        P = int(pos_B.max()) + 1
        if P > cache.max_len:
            raise ValueError(f"KV cache: position {P - 1} does not fit in a slot of max_len={cache.max_len}; "
                             f"free a slot or build a longer cache")
        first = slots[0]
        rows = slice(first, first + B) if slots == list(range(first, first + B)) else slots_B
        cos_B1C, sin_B1C = self.cos_LC[pos_B][:, None], self.sin_LC[pos_B][:, None]
        hidden_mask_BP = torch.arange(P, device=self.device) > pos_B[:, None]
        bias_XrP = (torch.zeros(B, P, dtype=self.dtype, device=self.device).masked_fill_(hidden_mask_BP, float("-inf"))
                    [:, None, None].expand(B, G, r, P).reshape(B * G, r, P))
        x_BD = model.embed_tokens(ids_B)
        experts_Y = []
        for i, layer in enumerate(model.layers):
            attn = layer.self_attn
            qkv_w, qkv_b, norm_RC = self.attn[i].get()
            h_BD = F.rms_norm(x_BD, x_BD.shape[-1:], layer.input_layernorm.weight, layer.input_layernorm.eps)
            qkv = self.ops.linear(h_BD, qkv_w, qkv_b)                           # [B, (H+2G)C]
            qk_BRC = F.rms_norm(qkv[:, :(H + G) * C].view(B, H + G, C), (C,), eps=attn.q_norm.eps) * norm_RC
            qk_BRC = qk_BRC * cos_B1C + qk_BRC.roll(C // 2, -1) * sin_B1C
            k_SGLC, v_SGLC = cache.layer(i)
            k_SGLC[slots_B, :, pos_B] = qk_BRC[:, H:].to(k_SGLC.dtype)
            v_SGLC[slots_B, :, pos_B] = qkv[:, (H + G) * C:].view(B, G, C).to(v_SGLC.dtype)
            k_XPC = k_SGLC[rows, :, :P].to(self.dtype).reshape(B * G, P, C)
            v_XPC = v_SGLC[rows, :, :P].to(self.dtype).reshape(B * G, P, C)
            s_XrP = torch.baddbmm(bias_XrP, qk_BRC[:, :H].reshape(B * G, r, C), k_XPC.transpose(1, 2))
            p_XrP = torch.softmax(s_XrP, dim=-1, dtype=torch.float32).to(self.dtype)
            o_BD = torch.bmm(p_XrP, v_XPC).view(B, H * C)
            x_BD = self.ops.linear_add(o_BD, self.o_proj[i].get(), attn.o_proj.bias, x_BD)  # x + o_proj(o)
            norm = layer.post_attention_layernorm
            h_BD = F.rms_norm(x_BD, x_BD.shape[-1:], norm.weight, norm.eps)
            if isinstance(layer.mlp, MoE):
                x_BD, idx_BK = self._moe(i, layer.mlp, h_BD, x_BD)
                experts_Y.append(idx_BK)
            else:
                x_BD = x_BD + layer.mlp(h_BD)
        h_BD = F.rms_norm(x_BD, x_BD.shape[-1:], model.norm.weight, model.norm.eps)
        logits_BV = model.lm_head(h_BD)
        routed = None
        if want_experts:
            routed = (torch.stack(experts_Y, dim=1).to(torch.int32) if experts_Y
                      else torch.zeros(B, 0, cfg.num_experts_per_tok, dtype=torch.int32, device=self.device))
        return logits_BV, routed, h_BD

    def _moe(self, i: int, moe: MoE, h_ND: torch.Tensor, x_ND: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Router (as model.route without replay) and experts on the normed h; returns the
        residual stream x + moe(h) [N, D] and the experts [N, K]."""
        N, K = h_ND.shape[0], moe.k
        probs_NE = torch.softmax(moe.gate(h_ND), dim=-1, dtype=torch.float32)
        w_NK, idx_NK = torch.topk(probs_NE, K, dim=-1)
        if moe.norm_topk_prob:
            w_NK = w_NK / w_NK.sum(dim=-1, keepdim=True)
        w_NK = w_NK.to(h_ND.dtype)
        E = probs_NE.shape[1]
        dense = self.experts[i]
        if moe.shared_expert is not None:
            x_ND = x_ND + torch.sigmoid(moe.shared_expert_gate(h_ND)) * moe.shared_expert(h_ND)
        if dense is not None and N * K >= E:
            gate_w, up_w, down_w = dense.get()
            w_NE = torch.zeros(N, E, dtype=h_ND.dtype, device=h_ND.device).scatter_(1, idx_NK, w_NK)
            # a_e = silu(gate_e h) * w_e * up_e h, the silu and the product done by the matmuls
            gw_NEF = self.ops.linear_silu(h_ND, gate_w).view(N, E, -1) * w_NE[:, :, None]
            a_NX = self.ops.linear_mul(h_ND, up_w, gw_NEF.view(N, -1))
            return self.ops.linear_add(a_NX, down_w, None, x_ND), idx_NK
        return x_ND + moe.experts(h_ND, w_NK, idx_NK), idx_NK
