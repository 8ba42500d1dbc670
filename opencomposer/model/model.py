"""A Qwen3-MoE decoder with DeepSeek-V3-style MTP modules, a slot KV cache and router replay.

Single-device PyTorch, numerically the same as transformers' `Qwen3MoeForCausalLM` (checked by
tests/model/test_hf_parity.py): grouped-query attention with RMSNorm on each query and key
head, RoPE with optional YaRN scaling, SwiGLU experts behind a softmax top-k router, dense
SwiGLU layers where `decoder_sparse_step`/`mlp_only_layers` say so, and an optional
Qwen2-MoE-style shared expert. Sharding, checkpoint conversion (hf.py), serving (engine/) and
MTP losses (mtp.py) live beside this file, not in it.

Shape legend (suffixes on tensor names):
    B batch rows        T tokens in this call     P key positions attended   D hidden_size
    H query heads       G key/value heads         C head_dim                 V vocab_size
    E experts           K experts per token       F expert/MLP width         N = B*T tokens
    M = N*K (token, expert) pairs                 S cache slots              L cache max_len
    Y MoE layers (config.moe_layers)              X cache layers (main + MTP)     c = C/2 rotary pairs

The forward has two modes:
  * training / full recompute: `model(input_ids_BT)`: positions 0..T-1, causal attention over
    this call only. Right padding needs no mask: a real token never attends to a later pad.
  * cached: `model(input_ids_BT, cache, slots_B)`: row b appends its T tokens to cache slot
    slots_B[b] at positions cache.lengths[slot] .. +T-1, writes their keys/values and attends
    causally over the slot's cache. The forward never changes `cache.lengths`: the caller
    advances it (`cache.advance`) or rolls it back by assignment, which is all speculative
    verification needs. Rows may be right-padded: pads write keys/values past the row's real
    tokens, which later calls overwrite before anyone attends to them.

Router replay (Ma et al. 2510.11370 "R3"; Composer 2 report §6.2): `routed_experts_BTYK`
replaces the router's top-k with the given experts; the gate weights are still computed from
this model's router scores s, g_i = exp(s_i) / sum_{j in I} exp(s_j) over the replayed set I
(norm_topk_prob=True), or the softmax-over-all-experts probability p_i of each replayed expert
(norm_topk_prob=False, which is how the unreplayed router weights its top-k), so the router
still gets gradients. With `replay_min_ratio=r`, a replayed expert with p_i < r * p_(k) (the
router's own k-th largest probability) is replaced by the router's best candidate not already
in the set (prime-rl PR #2703's plausibility rule); the count comes back in
`ModelOutput.replaced_experts`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from opencomposer.model.config import ModelConfig
from opencomposer.model.train_experts import grouped_experts_train


# ---- building blocks ----------------------------------------------------------------------

class RMSNorm(nn.Module):
    """y = w * x / sqrt(mean(x^2) + eps), computed in float32 and cast back (as transformers)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_frequencies(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """inv_freq [C/2] and the cos/sin scale ("attention factor").

    Default RoPE: inv_freq_i = theta^(-2i/C). YaRN (Peng et al. 2309.00071, as transformers
    computes it): with s = factor and original length L0, dimension pairs that rotate more than
    beta_fast times over L0 keep their frequency, those rotating fewer than beta_slow times are
    interpolated (inv_freq / s), with a linear ramp in between; cos and sin are scaled by
    0.1 * ln(s) + 1 (or by mscale/mscale_all_dim, or by attention_factor when given).
    """
    C, theta = config.head_dim, config.rope_theta
    # Explicit CPU: load_pretrained builds the model under torch.device("meta"), but these
    # frequencies are not in the checkpoint and must hold real values.
    pos_freqs = theta ** (torch.arange(0, C, 2, dtype=torch.float, device="cpu") / C)
    rs = config.rope_scaling
    if rs is None:
        return 1.0 / pos_freqs, 1.0
    factor, L0 = rs["factor"], rs["original_max_position_embeddings"]

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = rs.get("attention_factor")
    if attention_factor is None:
        if rs.get("mscale") and rs.get("mscale_all_dim"):
            attention_factor = mscale(factor, rs["mscale"]) / mscale(factor, rs["mscale_all_dim"])
        else:
            attention_factor = mscale(factor)
    beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

    def correction_dim(n_rot: float) -> float:  # the dimension that rotates n_rot times over L0
        return C * math.log(L0 / (n_rot * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, C - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(C // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1)
    extrapolate = 1 - ramp  # 1: keep the original frequency, 0: interpolate
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate
    return inv_freq, float(attention_factor)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@dataclass
class CacheStep:
    """Where one cached forward writes and reads; computed once, shared by every layer."""

    slots_B: torch.Tensor      # int64 cache slot of each row
    pos_BT: torch.Tensor       # int64 position of each new token
    mask_B1TP: torch.Tensor    # bool: key p visible to query t (p <= pos_BT[b, t])
    first_slot: int | None     # slots_B == first_slot + arange(B): read keys as a view, no gather


class Attention(nn.Module):
    """softmax(q k^T / sqrt(C)) v with G key/value heads shared by H/G query heads each;
    q and k pass through a per-head RMSNorm (Qwen3) before RoPE."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        D, H, G, C = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.H, self.G, self.C = H, G, C
        self.q_proj = nn.Linear(D, H * C, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(D, G * C, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(D, G * C, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(H * C, D, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(C, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(C, cfg.rms_norm_eps)

    def forward(self, x_BTD: torch.Tensor, cos_BTC: torch.Tensor, sin_BTC: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None,
                step: CacheStep | None = None, attention: Callable | None = None) -> torch.Tensor:
        B, T, _ = x_BTD.shape
        q_BTHC = self.q_norm(self.q_proj(x_BTD).view(B, T, self.H, self.C))
        k_BTGC = self.k_norm(self.k_proj(x_BTD).view(B, T, self.G, self.C))
        v_BTGC = self.v_proj(x_BTD).view(B, T, self.G, self.C)
        cos_BT1C, sin_BT1C = cos_BTC.unsqueeze(2), sin_BTC.unsqueeze(2)
        q_BTHC = q_BTHC * cos_BT1C + rotate_half(q_BTHC) * sin_BT1C
        k_BTGC = k_BTGC * cos_BT1C + rotate_half(k_BTGC) * sin_BT1C
        q_BHTC = q_BTHC.transpose(1, 2)
        if kv_cache is None:
            k_BGPC, v_BGPC = k_BTGC.transpose(1, 2), v_BTGC.transpose(1, 2)
            if attention is not None:  # a packed row's segments (training/attention.py)
                o_BHTC = attention(q_BHTC, k_BGPC, v_BGPC)
            else:
                o_BHTC = F.scaled_dot_product_attention(q_BHTC, k_BGPC, v_BGPC, is_causal=True,
                                                        enable_gqa=self.G != self.H)
        else:
            k_SGLC, v_SGLC = kv_cache
            # Advanced indices around a slice put the indexed dims first: [B, T] + [G, C].
            k_SGLC[step.slots_B[:, None], :, step.pos_BT] = k_BTGC.to(k_SGLC.dtype)
            v_SGLC[step.slots_B[:, None], :, step.pos_BT] = v_BTGC.to(v_SGLC.dtype)
            P = step.mask_B1TP.shape[-1]
            rows = step.slots_B if step.first_slot is None else slice(step.first_slot, step.first_slot + B)
            k_BGPC = k_SGLC[rows, :, :P].to(q_BHTC.dtype)
            v_BGPC = v_SGLC[rows, :, :P].to(q_BHTC.dtype)
            o_BHTC = F.scaled_dot_product_attention(
                q_BHTC, k_BGPC, v_BGPC, attn_mask=step.mask_B1TP, enable_gqa=self.G != self.H)
        return self.o_proj(o_BHTC.transpose(1, 2).reshape(B, T, self.H * self.C))


# ---- mixture of experts -------------------------------------------------------------------

def route(logits_NE: torch.Tensor, k: int, norm_topk_prob: bool,
          replay_NK: torch.Tensor | None = None,
          min_ratio: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k softmax routing, or router replay. Returns (weights_NK, experts_NK, n_replaced).

    p = softmax(s) over all E experts (float32). Without replay the experts are top-k(p).
    With replay they are replay_NK (a row holding any negative index means "no replay for
    this token": it uses the router's own top-k). With min_ratio, replayed experts with
    p_i < min_ratio * p_(k) are swapped for the router's best candidates outside the set.
    Weights: p_i over the chosen experts, divided by their sum when norm_topk_prob.
    """
    probs_NE = torch.softmax(logits_NE, dim=-1, dtype=torch.float32)
    top_p_NK, top_i_NK = torch.topk(probs_NE, k, dim=-1)
    n_replaced = torch.zeros((), dtype=torch.int64, device=logits_NE.device)
    if replay_NK is None:
        idx_NK, w_NK = top_i_NK, top_p_NK
    else:
        idx_NK = replay_NK.to(torch.int64)
        idx_NK = torch.where((idx_NK < 0).any(-1, keepdim=True), top_i_NK, idx_NK)
        if min_ratio is not None:
            bad_NK = probs_NE.gather(1, idx_NK) < min_ratio * top_p_NK[:, -1:]
            idx_NK = _replace_implausible(idx_NK, bad_NK, top_i_NK)
            n_replaced = bad_NK.sum()
        w_NK = probs_NE.gather(1, idx_NK)
    if norm_topk_prob:
        w_NK = w_NK / w_NK.sum(dim=-1, keepdim=True)
    return w_NK.to(logits_NE.dtype), idx_NK, n_replaced


def _replace_implausible(idx_NK: torch.Tensor, bad_NK: torch.Tensor, top_i_NK: torch.Tensor) -> torch.Tensor:
    """The j-th flagged slot of a row takes the j-th router top-k expert not among the row's kept
    experts. There are always enough: with min_ratio <= 1 a flagged expert is outside the router's
    top-k, so at most K - n_bad of the top-k are kept."""
    kept_in_top_NK = ((top_i_NK[:, :, None] == idx_NK[:, None, :]) & ~bad_NK[:, None, :]).any(-1)
    order_NK = torch.sort(kept_in_top_NK.to(torch.int8), dim=1, stable=True).indices  # free ones first
    free_NK = top_i_NK.gather(1, order_NK)
    rank_NK = (bad_NK.to(torch.int64).cumsum(1) - 1).clamp(min=0)
    return torch.where(bad_NK, free_NK.gather(1, rank_NK), idx_NK)


class Experts(nn.Module):
    """E SwiGLU experts stacked (the layout transformers 5 uses in memory; hf.py maps it to and
    from the per-expert tensors of Hub checkpoints): gate_up_proj [E, 2F, D], down_proj [E, D, F].

    y_n = sum_k w_nk * down_e(silu(gate_e(x_n)) * up_e(x_n)), e = experts_nk. The M = N*K
    (token, expert) pairs are sorted by expert and each expert that received tokens runs one
    matmul on its contiguous group: work is proportional to K, not E.
    """

    def __init__(self, E: int, D: int, F_: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * F_, D))
        self.down_proj = nn.Parameter(torch.empty(E, D, F_))

    def forward(self, x_ND: torch.Tensor, w_NK: torch.Tensor, idx_NK: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():  # the same products, with a grouped backward (train_experts.py)
            return grouped_experts_train(x_ND, w_NK, idx_NK, self.gate_up_proj, self.down_proj)
        return grouped_experts(x_ND, w_NK, idx_NK, self.gate_up_proj.shape[0], self.expert)

    def expert(self, e: int, x_nD: torch.Tensor) -> torch.Tensor:
        """Expert e's SwiGLU over the n rows routed to it."""
        gate, up = F.linear(x_nD, self.gate_up_proj[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj[e])


def grouped_experts(x_ND: torch.Tensor, w_NK: torch.Tensor, idx_NK: torch.Tensor, E: int,
                    expert: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """sum_k w_nk * expert(idx_nk, x_n), running `expert(e, x_nD)` once per expert on the rows
    routed to it (the loop every experts implementation shares: model.py's, the engine's packed one)."""
    K = idx_NK.shape[1]
    e_M = idx_NK.reshape(-1)
    order_M = torch.argsort(e_M, stable=True)
    counts = torch.bincount(e_M, minlength=E).tolist()
    tok_M = order_M // K
    x_MD = x_ND[tok_M]
    outs, start = [], 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        outs.append(expert(e, x_MD[start:start + n]))
        start += n
    y_MD = torch.cat(outs) * w_NK.reshape(-1)[order_M, None]
    return torch.zeros_like(x_ND).index_add_(0, tok_M, y_MD.to(x_ND.dtype))


class MoE(nn.Module):
    """Router (`gate`, a bias-free [E, D] linear) + routed experts + optional shared expert.
    Shared expert (Qwen2-MoE): y += sigmoid(shared_expert_gate(x)) * shared_expert(x)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.k, self.norm_topk_prob = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = Experts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        self.shared_expert = None
        if cfg.shared_expert_intermediate_size:
            self.shared_expert = MLP(cfg.hidden_size, cfg.shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, x_BTD: torch.Tensor, replay_NK: torch.Tensor | None = None,
                min_ratio: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, D = x_BTD.shape
        x_ND = x_BTD.reshape(B * T, D)
        w_NK, idx_NK, n_replaced = route(self.gate(x_ND), self.k, self.norm_topk_prob, replay_NK, min_ratio)
        y_ND = self.experts(x_ND, w_NK, idx_NK)
        if self.shared_expert is not None:
            y_ND = y_ND + torch.sigmoid(self.shared_expert_gate(x_ND)) * self.shared_expert(x_ND)
        return y_ND.view(B, T, D), idx_NK, n_replaced


class Block(nn.Module):
    """Pre-norm transformer block: x += attn(norm(x)); x += mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, moe: bool):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MoE(cfg) if moe else MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x_BTD, cos_BTC, sin_BTC, kv_cache=None, step=None, replay_NK=None, min_ratio=None,
                attention=None):
        x_BTD = x_BTD + self.self_attn(self.input_layernorm(x_BTD), cos_BTC, sin_BTC, kv_cache, step, attention)
        h_BTD = self.post_attention_layernorm(x_BTD)
        if isinstance(self.mlp, MoE):
            y_BTD, idx_NK, n_replaced = self.mlp(h_BTD, replay_NK, min_ratio)
            return x_BTD + y_BTD, idx_NK, n_replaced
        return x_BTD + self.mlp(h_BTD), None, None


class MTPModule(nn.Module):
    """DeepSeek-V3 MTP depth k (2412.19437 §2.2): h'_i = eh_proj([hnorm(h_i^{k-1}); enorm(Emb(t_{i+k}))]),
    h_i^k = norm(Block(h'_i)). The block is dense (SwiGLU of width intermediate_size): a draft
    model must be cheap, and a dense block needs no routing or replay. Embedding and output
    head are the main model's. h^{k-1} is the previous depth's *normed* output (for k = 1, the
    main model's final-normed hidden, `ModelOutput.hidden`), so every depth returns what the
    output head reads."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.hnorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.enorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.block = Block(cfg, moe=False)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h_BTD, emb_BTD, cos_BTC, sin_BTC, kv_cache=None, step=None) -> torch.Tensor:
        x_BTD = self.eh_proj(torch.cat([self.hnorm(h_BTD), self.enorm(emb_BTD)], dim=-1))
        x_BTD, _, _ = self.block(x_BTD, cos_BTC, sin_BTC, kv_cache, step)
        return self.norm(x_BTD)


# ---- KV cache and outputs -----------------------------------------------------------------

class KVCache:
    """Keys and values of S independent sequences ("slots") of up to L tokens each.

    k, v: [X, S, G, L, C] for the X = num_hidden_layers + num_mtp_modules attention layers
    (MTP module k is layer num_hidden_layers + k - 1). lengths [S] int64 counts the tokens of
    each slot held by the main layers; the forward reads it and never writes it. MTP layers
    follow the convention of `Transformer.mtp_step`.
    """

    def __init__(self, config: ModelConfig, max_slots: int, max_len: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        shape = (config.num_cache_layers, max_slots, config.num_key_value_heads, max_len, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(max_slots, dtype=torch.int64, device=device)
        self.max_slots, self.max_len = max_slots, max_len

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[i], self.v[i]

    def advance(self, slots: torch.Tensor | list[int], n: torch.Tensor | int) -> None:
        """lengths[slots] += n (n: one int, or one count per slot)."""
        slots = torch.as_tensor(slots, dtype=torch.int64, device=self.lengths.device)
        self.lengths[slots] += torch.as_tensor(n, dtype=torch.int64, device=self.lengths.device)

    def reset(self, slots: torch.Tensor | list[int]) -> None:
        """Free slots for new sequences (their stale keys are simply overwritten later)."""
        self.lengths[torch.as_tensor(slots, dtype=torch.int64, device=self.lengths.device)] = 0

    def step(self, slots_B: torch.Tensor, T: int, start_B: torch.Tensor) -> CacheStep:
        """Positions start_B[b] .. +T-1 of slots_B[b]; checks that they fit in max_len."""
        pos_BT = start_B[:, None] + torch.arange(T, device=start_B.device)
        P = int(pos_BT.max()) + 1
        if P > self.max_len or int(start_B.min()) < 0:
            raise ValueError(f"KV cache: positions {int(start_B.min())}..{P - 1} do not fit in a slot of "
                             f"max_len={self.max_len}; free a slot or build a longer cache")
        mask_B1TP = torch.arange(P, device=start_B.device) <= pos_BT[:, None, :, None]
        first = int(slots_B[0])
        contiguous = bool((slots_B == first + torch.arange(len(slots_B), device=slots_B.device)).all())
        return CacheStep(slots_B, pos_BT, mask_B1TP, first if contiguous else None)


@dataclass
class ModelOutput:
    logits: torch.Tensor | None              # [B, T, V]; None when compute_logits=False
    hidden: torch.Tensor                     # [B, T, D] final-normed: logits = lm_head(hidden); MTP depth 1 reads it
    routed_experts: torch.Tensor | None = None  # [B, T, Y, K] int32 experts used, when asked
    replaced_experts: int = 0                # replayed experts swapped by the plausibility rule


# ---- the model ----------------------------------------------------------------------------

class Transformer(nn.Module):
    """Embedding -> num_hidden_layers Blocks -> RMSNorm -> lm_head, plus D MTP modules."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = cfg = config
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, cfg.is_moe_layer(i)) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.mtp = nn.ModuleList(MTPModule(cfg) for _ in range(cfg.num_mtp_modules))
        # A plain float32 attribute, not a buffer, so that model.to(torch.bfloat16) cannot round
        # the frequencies (a 0.4% error in a frequency is radians of error at position 1000).
        self.inv_freq, self.rope_scale = rope_frequencies(cfg)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, Experts):
            nn.init.normal_(module.gate_up_proj, std=std)
            nn.init.normal_(module.down_proj, std=std)

    def rope(self, pos_BT: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, T, C] of angle pos * inv_freq (both halves), times the YaRN scale."""
        freqs_BTc = pos_BT[..., None].float() * self.inv_freq.to(pos_BT.device)
        emb_BTC = torch.cat((freqs_BTc, freqs_BTc), dim=-1)
        return (emb_BTC.cos() * self.rope_scale).to(dtype), (emb_BTC.sin() * self.rope_scale).to(dtype)

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None,
                slots: torch.Tensor | None = None, *, routed_experts: torch.Tensor | None = None,
                replay_min_ratio: float | None = None, return_routed_experts: bool = False,
                compute_logits: bool = True, position_ids: torch.Tensor | None = None,
                attention: Callable | None = None) -> ModelOutput:
        """input_ids [B, T] -> ModelOutput. See the module docstring for the cached mode and replay.

        Full recompute of a packed row (training/packing.py runs a group's shared prompt once this
        way): position_ids [B, T] place the tokens, and `attention`, a callable (q [B, H, T, C],
        k [B, G, T, C], v [B, G, T, C]) -> o [B, H, T, C] (training/attention.SegmentAttention),
        replaces the causal attention over the call (which samples' tokens see which).

        routed_experts: [B, T, Y, K] expert ids to replay (any int dtype; a token row with a
        negative id uses the router). replay_min_ratio: None, or r in [0, 1].
        """
        cfg = self.config
        B, T = input_ids.shape
        if (cache is None) != (slots is None):
            raise ValueError("pass both cache and slots (cached mode) or neither (full recompute)")
        if routed_experts is not None and routed_experts.shape != (B, T, len(cfg.moe_layers), cfg.num_experts_per_tok):
            raise ValueError(f"routed_experts must have shape [B, T, Y, K] = "
                             f"{[B, T, len(cfg.moe_layers), cfg.num_experts_per_tok]}, got {list(routed_experts.shape)}")
        if replay_min_ratio is not None and not 0.0 <= replay_min_ratio <= 1.0:
            raise ValueError(f"replay_min_ratio must be in [0, 1], got {replay_min_ratio}")
        if cache is not None and (position_ids is not None or attention is not None):
            raise ValueError("position_ids and attention are for the full-recompute mode; "
                             "the cache handles positions and keys itself")
        x_BTD = self.embed_tokens(input_ids)
        step = None
        if position_ids is not None:
            pos_BT = position_ids
        elif cache is None:
            pos_BT = torch.arange(T, device=input_ids.device)[None]
        else:
            slots = torch.as_tensor(slots, dtype=torch.int64, device=input_ids.device)
            step = cache.step(slots, T, cache.lengths[slots])
            pos_BT = step.pos_BT
        cos_BTC, sin_BTC = self.rope(pos_BT, x_BTD.dtype)
        experts_Y, n_replaced = [], 0
        for i, layer in enumerate(self.layers):
            replay_NK = None
            if routed_experts is not None and isinstance(layer.mlp, MoE):
                replay_NK = routed_experts[:, :, len(experts_Y)].reshape(B * T, -1)
            kv = cache.layer(i) if cache is not None else None
            x_BTD, idx_NK, n = layer(x_BTD, cos_BTC, sin_BTC, kv, step, replay_NK, replay_min_ratio, attention)
            if idx_NK is not None:
                experts_Y.append(idx_NK)
                n_replaced = n_replaced + n
        h_BTD = self.norm(x_BTD)
        routed = None
        if return_routed_experts:
            routed = (torch.stack(experts_Y, dim=1).view(B, T, len(experts_Y), -1).to(torch.int32) if experts_Y
                      else torch.zeros(B, T, 0, cfg.num_experts_per_tok, dtype=torch.int32, device=input_ids.device))
        return ModelOutput(logits=self.lm_head(h_BTD) if compute_logits else None, hidden=h_BTD,
                           routed_experts=routed, replaced_experts=int(n_replaced))

    # ---- multi-token prediction -----------------------------------------------------------

    def mtp_logits(self, input_ids: torch.Tensor, hidden: torch.Tensor) -> list[torch.Tensor]:
        """Training: per depth k = 1..D, logits [B, T-k-1, V] where logits_k[:, i] predicts
        input_ids[:, i+k+1] (targets: input_ids[:, k+1:]). Depth k reads h^{k-1}_i and token
        t_{i+k} at RoPE position i. `hidden` is ModelOutput.hidden; pass hidden.detach() to keep
        MTP gradients out of the main model (self-distillation from a fixed trunk)."""
        B, T = input_ids.shape
        cos_BTC, sin_BTC = self.rope(torch.arange(T, device=input_ids.device)[None], hidden.dtype)
        h_BTD, out = hidden, []
        for k, module in enumerate(self.mtp, start=1):
            n = T - k - 1
            if n <= 0:  # too short for this depth (and so for every deeper one)
                out.append(hidden.new_zeros(B, 0, self.config.vocab_size))
                continue
            h_BTD = module(h_BTD[:, :n], self.embed_tokens(input_ids[:, k:k + n]), cos_BTC[:, :n], sin_BTC[:, :n])
            out.append(self.lm_head(h_BTD))
        return out

    def mtp_step(self, depth: int, hidden: torch.Tensor, input_ids: torch.Tensor,
                 cache: KVCache, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Drafting with the cache: MTP module `depth` (1..D) on T (hidden, token) pairs.

        Row b covers the last T main-model positions of its slot, i = lengths[slot]-T ..
        lengths[slot]-1 (advance the cache over the accepted tokens first). hidden [B, T, D]
        holds h^{depth-1}_i (depth 1: ModelOutput.hidden at those positions; depth k > 1: the
        hidden this method returned for depth k-1 on the same window) and input_ids [B, T] holds
        t_{i+depth}: real tokens, then drafts for the newest depth-1 positions. Cache entry i of
        this module is (re)written, attention reads entries 0..i. Returns (logits [B, T, V]
        predicting t_{i+depth+1}, hidden [B, T, D] for depth+1).

        The entries whose token was a draft (the last depth-1 of a window) are only valid if the
        drafts are accepted, so each round's window must start D-1 positions before the round's
        newly accepted tokens: the engine keeps the last D-1 main hiddens of each sequence and
        calls every depth on the same window (tests/model/test_model.py shows the loop).
        """
        B, T = input_ids.shape
        slots = torch.as_tensor(slots, dtype=torch.int64, device=input_ids.device)
        step = cache.step(slots, T, cache.lengths[slots] - T)
        cos_BTC, sin_BTC = self.rope(step.pos_BT, hidden.dtype)
        kv = cache.layer(self.config.num_hidden_layers + depth - 1)
        h_BTD = self.mtp[depth - 1](hidden, self.embed_tokens(input_ids), cos_BTC, sin_BTC, kv, step)
        return self.lm_head(h_BTD), h_BTD
