"""The engine's forward passes behind one seam: T tokens per row appended to KV-cache slots
(prefill: T = prompt length; plain decode: T = 1; speculative verification: T = k+1) and MTP
drafting steps.

`Forward` is the Protocol; two backends implement it on the same model and cache:

  * `NativeForward`: every pass is one C++ op (native.py; csrc/ops.cpp): per layer the normed
    q/k/v product, attention (q/k norms, RoPE, cache write and softmax), the output product
    with its residual, and the whole normed MoE (router, top-k, grouped experts) or dense MLP,
    with no Python in between: at batch 1 the pass costs its arithmetic, not its op count.
  * `TorchForward`: the model's generic forward (model.py), and for T = 1 fused.py's decode
    step on oneDNN or PyTorch kernels: used where the C++ kernels cannot be built, or for
    dtypes other than float32.

Both compute what `Transformer.forward(ids_BT, cache, slots)` and `Transformer.mtp_step`
compute, up to float rounding (summation order, ~1e-6 in float32; tests/engine/test_forward.py).
The native backend packs the weights when built and on `refresh()`, which
`Engine.update_weights` calls; the torch backend follows in-place changes by itself.

Left out: router replay (the engine never replays), devices other than the CPU for the native
backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from opencomposer.engine import fused, native, speculative
from opencomposer.engine.sampling import greedy
from opencomposer.model.model import MoE, KVCache, Transformer


@dataclass
class Step:
    """One pass's outputs for B rows of T tokens."""

    hidden: torch.Tensor                 # [B, T, D] final-normed (MTP depth 1 reads it)
    logits: torch.Tensor | None          # [B, T, V] ("all"), [B, V] ("last"), None ("none")
    routed_experts: torch.Tensor | None  # [B, T, Y, K] int32, when asked


@dataclass
class SpecStep:
    """One greedy speculative step's outputs (Forward.spec_greedy): row b emits
    tokens[b, :accepted[b] + 1] (its accepted drafts, then the target's next argmax)."""

    tokens: torch.Tensor                 # [B, k+1] int64: the target argmax at each verified position
    logprobs: torch.Tensor               # [B, k+1] float32: their log-softmax
    accepted: torch.Tensor               # [B] int64: n, drafts accepted
    drafts: torch.Tensor                 # [B, k] int64: the next step's drafts
    routed_experts: torch.Tensor | None  # [B, k+1, Y, K] int32, when asked


class Forward(Protocol):
    def __call__(self, ids_BT: torch.Tensor, slots_B: torch.Tensor, *, logits: str = "all",
                 want_experts: bool = False) -> Step:
        """Row b appends its T tokens to slot slots_B[b] at positions cache.lengths[slot]..+T-1
        (lengths are not advanced). logits: "all", "last" or "none"."""

    def mtp_step(self, depth: int, hidden_BTD: torch.Tensor, ids_BT: torch.Tensor, slots_B: torch.Tensor,
                 logits: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Transformer.mtp_step's contract, but only the last position's logits [B, V] (or None)."""

    def refresh(self) -> None:
        """The model's weights were changed in place (Engine.update_weights): rebuild anything
        derived from them."""

    def spec_greedy(self, ids_BJ: torch.Tensor, slots_B: torch.Tensor, recent_BW: torch.Tensor,
                    windows_SkWD: torch.Tensor, want_experts: bool = False) -> SpecStep:
        """A whole greedy speculative step: verify ids_BJ = [pending token, k drafts] per row,
        accept (speculative.accept_greedy), advance the cache by n+1, and draft k tokens.
        windows_SkWD[slot, d] holds depth d's hiddens (d = 0: the main model's) at the W newest
        positions and moves on in place; recent_BW holds the row's last W tokens (the pending
        one last). Needs every row's cache to hold at least W - 1 positions."""


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

    def refresh(self) -> None:
        pass  # kernels.Derived and PackedLinear follow the weights' version counters themselves

    def spec_greedy(self, ids_BJ, slots_B, recent_BW, windows_SkWD, want_experts=False) -> SpecStep:
        B, J = ids_BJ.shape
        out = self(ids_BJ, slots_B, logits="all", want_experts=want_experts)
        target_N, lp_N = greedy(out.logits.flatten(0, 1))
        target_BJ = target_N.view(B, J)
        n_B, _ = speculative.accept_greedy(target_BJ, ids_BJ[:, 1:])
        self.cache.advance(slots_B, n_B + 1)
        windows_SkWD[slots_B, 0] = speculative.shift_hidden(windows_SkWD[slots_B, 0], out.hidden, n_B)
        next_BW = speculative.shift_hidden(recent_BW, target_BJ, n_B)
        # the reference: every depth over the whole window
        drafts_Bk, _, hs = speculative.draft(self.mtp_step, self.cache, slots_B, windows_SkWD[slots_B, 0], next_BW,
                                             J - 1, lambda logits_BV: (logits_BV.argmax(-1), None))
        for d, h_BWD in enumerate(hs[:-1], start=1):
            windows_SkWD[slots_B, d] = h_BWD
        return SpecStep(target_BJ, lp_N.view(B, J), n_B, drafts_Bk, out.routed_experts)


_NONE = torch.empty(0)  # "no such tensor" in the C++ ops' block lists


def _block_weights(block, cache_layer: int) -> tuple[list[torch.Tensor], list[int]]:
    """One block's tensors and ints, in the order of csrc/ops.cpp's `Block`."""
    a, n1, n2 = block.self_attn, block.input_layernorm, block.post_attention_layernorm
    qkv = native.pack_linear(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
    qkv_b = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]) if a.q_proj.bias is not None else _NONE
    o_b = a.o_proj.bias if a.o_proj.bias is not None else _NONE
    t = [n1.weight, qkv, qkv_b, a.q_norm.weight, a.k_norm.weight, native.pack_linear(a.o_proj.weight), o_b, n2.weight]
    mlp = block.mlp
    if not isinstance(mlp, MoE):
        F_ = mlp.down_proj.in_features
        t += [_NONE, native.pack_swiglu(mlp.gate_proj.weight, mlp.up_proj.weight), native.pack_linear(mlp.down_proj.weight)]
        return t + [_NONE] * 3, [cache_layer, 0, 0, 0, F_, 0]
    gate_up_EfD, down_EDF = mlp.experts.gate_up_proj, mlp.experts.down_proj
    F_ = down_EDF.shape[-1]
    F8 = -(-F_ // 8) * 8  # the kernels' activation width: whole panels
    t += [native.pack_linear(mlp.gate.weight), native.pack_swiglu(gate_up_EfD[:, :F_], gate_up_EfD[:, F_:]),
          native.pack_linear(F.pad(down_EDF, (0, F8 - F_)))]
    sh, sh_F = mlp.shared_expert, 0
    if sh is None:
        t += [_NONE] * 3
    else:
        sh_F = sh.down_proj.in_features
        t += [native.pack_swiglu(sh.gate_proj.weight, sh.up_proj.weight), native.pack_linear(sh.down_proj.weight),
              native.pack_linear(mlp.shared_expert_gate.weight)]
    return t, [cache_layer, mlp.gate.out_features, mlp.k, int(mlp.norm_topk_prob), F_, sh_F]


class NativeForward:
    """Forward on the C++ kernels: one op per pass (module docstring)."""

    def __init__(self, model: Transformer, cache: KVCache):
        self.ops = native.ops()
        self.model, self.cache, cfg = model, cache, model.config
        self.H, self.D, self.V = cfg.num_attention_heads, cfg.hidden_size, cfg.vocab_size
        self.eps = cfg.rms_norm_eps
        # Per-position rotary tables, computed exactly as Transformer.rope computes them.
        freqs_Lc = torch.arange(cache.max_len, dtype=torch.float32)[:, None] * model.inv_freq
        emb_LC = torch.cat([freqs_Lc, freqs_Lc], dim=-1)
        self.cos_LC = (emb_LC.cos() * model.rope_scale).contiguous()
        self.sin_LC = (emb_LC.sin() * model.rope_scale).contiguous()
        self.refresh()

    def refresh(self) -> None:
        """Pack the weights again (after Engine.update_weights changed them in place). Passes
        do not check for changes themselves: comparing ~100 version counters costs a batch-1
        step tens of microseconds, and the engine owns its model."""
        model, cfg = self.model, self.model.config
        with torch.no_grad():
            self.blocks, self.ints = [], []
            for i, layer in enumerate(model.layers):
                t, n = _block_weights(layer, i)
                self.blocks += [w.detach() for w in t]
                self.ints += n
            self.mtp, self.mtp_flat, self.mtp_ints = [], [], []
            for d, m in enumerate(model.mtp):
                t, n = _block_weights(m.block, cfg.num_hidden_layers + d)
                depth = [m.hnorm.weight, m.enorm.weight, native.pack_linear(m.eh_proj.weight), *t, m.norm.weight]
                depth = [w.detach() for w in depth]
                self.mtp.append((depth[0], depth[1], depth[2], depth[3:-1], n, depth[-1]))
                self.mtp_flat += depth
                self.mtp_ints += n
            self.head = native.pack_linear(model.lm_head.weight)
            self.embed, self.norm_w = model.embed_tokens.weight.detach(), model.norm.weight.detach()

    def _start(self, slots_B: torch.Tensor, T: int, back: int) -> tuple[torch.Tensor, torch.Tensor]:
        slots_B = slots_B.to(torch.int64).contiguous()
        start_B = (self.cache.lengths[slots_B] - back).contiguous()
        lo, hi = int(start_B.min()), int(start_B.max())
        if lo < 0 or hi + T > self.cache.max_len:
            raise ValueError(f"KV cache: positions {lo}..{hi + T - 1} do not fit in a slot of "
                             f"max_len={self.cache.max_len}; free a slot or build a longer cache")
        return slots_B, start_B

    def __call__(self, ids_BT, slots_B, *, logits="all", want_experts=False) -> Step:
        B, T = ids_BT.shape
        slots_B, start_B = self._start(slots_B, T, 0)
        c = self.cache
        h_ND, out, routed_NYK = self.ops.forward(
            ids_BT.reshape(-1), slots_B, start_B, self.embed, self.blocks, self.ints,
            c.k, c.v, self.cos_LC, self.sin_LC, self.norm_w, self.head, self.V, self.H, self.eps,
            {"none": 0, "last": 1, "all": 2}[logits])
        out = out.view(B, T, self.V) if logits == "all" else (out if logits == "last" else None)
        routed = None
        if want_experts:
            routed = routed_NYK.view(B, T, routed_NYK.shape[1], -1).to(torch.int32) if routed_NYK.numel() else \
                torch.zeros(B, T, 0, self.model.config.num_experts_per_tok, dtype=torch.int32)
        return Step(h_ND.view(B, T, self.D), out, routed)

    def mtp_step(self, depth, hidden_BTD, ids_BT, slots_B, logits=True):
        B, T = ids_BT.shape
        slots_B, start_B = self._start(slots_B, T, T)
        hnorm, enorm, eh, block, ints, norm = self.mtp[depth - 1]
        c = self.cache
        h_ND, out = self.ops.mtp(hidden_BTD.reshape(B * T, self.D).contiguous(), ids_BT.reshape(-1), slots_B, start_B,
                                 self.embed, hnorm, enorm, eh, block, ints, c.k, c.v,
                                 self.cos_LC, self.sin_LC, norm, self.head, self.V, self.H, self.eps, logits)
        return (out if logits else None), h_ND.view(B, T, self.D)

    def spec_greedy(self, ids_BJ, slots_B, recent_BW, windows_SkWD, want_experts=False) -> SpecStep:
        B, J = ids_BJ.shape
        self._start(slots_B, J, 0)
        c = self.cache
        target, lp, n, drafts, routed_NYK = self.ops.spec_greedy(
            ids_BJ.contiguous(), slots_B.to(torch.int64).contiguous(), c.lengths, recent_BW.contiguous(), windows_SkWD,
            self.embed, self.blocks, self.ints, self.mtp_flat, self.mtp_ints, c.k, c.v,
            self.cos_LC, self.sin_LC, self.norm_w, self.head, self.V, self.H, self.eps)
        routed = None
        if want_experts:
            routed = routed_NYK.view(B, J, routed_NYK.shape[1], -1).to(torch.int32) if routed_NYK.numel() else \
                torch.zeros(B, J, 0, self.model.config.num_experts_per_tok, dtype=torch.int32)
        return SpecStep(target, lp, n, drafts, routed)
