"""Token-level RL losses: KL estimators, the clipped policy loss with off-policy correction, aggregation.

Every function takes padded token tensors and a loss mask (True on tokens the model generated;
False on prompt, tool output, summaries' prompts and padding). Shape legend:
    B  sequences in the batch          T  tokens per sequence (padded)
    logp_BT        log π_θ(y_t), with gradient (the trainer's forward)
    behav_logp_BT  log μ(y_t) from the inference engine that sampled y (the behaviour policy)
    old_logp_BT    log π_old(y_t) recomputed by the trainer for the weights that sampled y
    prox_logp_BT   log π_prox(y_t), the trainer's policy at the start of this step (AReaL)
    ref_logp_BT    log π_ref(y_t), the frozen reference policy

KL [Schulman, "Approximating KL divergence", 2020], r = π_ref/π = exp(ref_logp − logp):
    k1 = −log r            unbiased, can be negative per token
    k2 = (log r)²/2        biased, low variance
    k3 = (r − 1) − log r   unbiased and ≥ 0, but r is unbounded when π ≪ π_ref
Composer 2 [R §4] puts k1 in the reward; GRPO [Shao et al. 2402.03300] puts k3 in the loss.
Liu et al. (2510.01555) and "A Comedy of Estimators" (2512.21852) find k1-in-reward gives an
unbiased gradient of the KL-regularised objective and k3-in-loss a biased one; both placements
are here (kl_in_reward, kl_in_loss) so the choice can be compared.

Policy loss: PPO's clipped surrogate [Schulman et al. 2017] per token, with separate ε_low and
ε_high (DAPO's clip-higher, Yu et al. 2503.14476):
    ρ_t = exp(logp − anchor),  L_t = max(−A·ρ_t, −A·clip(ρ_t, 1 − ε_low, 1 + ε_high))
The anchor is old_logp if given, else behav_logp: training is single-epoch, so the policy that
sampled y *is* the old policy unless the trainer recomputes it. Off-policy corrections for the
trainer–inference mismatch (option `off_policy`):
    truncated_is  L_t ← min(exp(old − behav), C)·L_t, weight detached [Yao et al. 2025, "Your
                  efficient RL framework secretly brings you off-policy RL training"; verl TIS]
    masked_is     tokens with exp(old − behav) ∉ [α, β] are dropped, from the denominator too
    decoupled     AReaL [Fu et al. 2505.24298]: ρ_t = exp(logp − prox) clipped around π_prox,
                  L_t ← exp(prox − behav)·L_t (detached); tokens whose weight exceeds a cap dropped
Aggregation (option `aggregation`): "token_mean" Σ L·m / Σ m (DAPO); "constant" Σ L·m / (B·T_c)
(Dr. GRPO [Liu et al. 2503.20783], no length normalisation; the default, as in Composer 2);
"seq_mean_token_mean" mean_b(Σ_t L·m / Σ_t m) (the original GRPO).

Simplifications, named: no dual-clip for negative advantages; log-ratios are clamped to ±20
so one absurd token cannot make the loss inf (such a token gets no gradient); with gradient
accumulation, "token_mean" and "seq_mean_token_mean" are per micro-batch means (only
"constant" sums exactly across equal micro-batches).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator

from opencomposer.config import Section

KLEstimator = Literal["k1", "k2", "k3"]
Aggregation = Literal["token_mean", "constant", "seq_mean_token_mean"]

_MAX_LOG_RATIO = 20.0  # e^20 ≈ 5e8: far past any clip range, still finite in bf16/fp32


def _kl_from_log_r(log_r: torch.Tensor, estimator: str) -> torch.Tensor:
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r**2
    if estimator == "k3":
        return torch.expm1(log_r) - log_r  # (r − 1) − log r, exact near r = 1
    raise ValueError(f"unknown KL estimator {estimator!r}: use 'k1', 'k2' or 'k3'")


def kl(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: KLEstimator = "k1") -> torch.Tensor:
    """Per-token KL(π‖π_ref) estimate on tokens sampled from π; r = exp(ref_logp − logp).

    k1 = −log r, k2 = (log r)²/2, k3 = (r − 1) − log r. Gradients w.r.t. logp: k1' = 1,
    k2' = −log r = logp − ref_logp, k3' = 1 − r.
    """
    return _kl_from_log_r(ref_logp - logp, estimator)


def aggregate(loss_BT: torch.Tensor, mask_BT: torch.Tensor, mode: Aggregation = "constant",
              norm_tokens: int | None = None) -> torch.Tensor:
    """Reduce per-token losses to a scalar over the masked tokens.

    token_mean: Σ L·m / Σ m. constant: Σ L·m / (B·T_c), T_c = norm_tokens or the padded T.
    seq_mean_token_mean: mean over sequences with ≥ 1 token of Σ_t L·m / Σ_t m.
    A batch with no unmasked token gives 0 (still attached to the graph).
    """
    m = mask_BT.bool()
    masked_BT = torch.where(m, loss_BT, torch.zeros((), dtype=loss_BT.dtype, device=loss_BT.device))
    if mode == "token_mean":
        return masked_BT.sum() / m.sum().clamp(min=1)
    if mode == "constant":
        B, T = loss_BT.shape
        return masked_BT.sum() / (B * (norm_tokens or T))
    if mode == "seq_mean_token_mean":
        n_B = m.sum(-1)
        seq_B = masked_BT.sum(-1) / n_B.clamp(min=1)
        has_B = n_B > 0
        return (seq_B * has_B).sum() / has_B.sum().clamp(min=1)
    raise ValueError(f"unknown aggregation {mode!r}: use 'token_mean', 'constant' or 'seq_mean_token_mean'")


@torch.no_grad()
def kl_in_reward(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, mask_BT: torch.Tensor,
                 estimator: KLEstimator = "k1") -> torch.Tensor:
    """Σ_t kl_t over each sequence's masked tokens, detached: [B]. Composer 2's placement.

    The caller subtracts β times this from the trajectory's reward (rewards.compute_reward's
    kl_sum), before advantages. Pass the behaviour logp (the policy that sampled the tokens;
    no extra forward) or the trainer's, detached.
    """
    m = mask_BT.bool()
    log_r = torch.where(m, ref_logp_BT - logp_BT, torch.zeros((), dtype=logp_BT.dtype, device=logp_BT.device))
    return _kl_from_log_r(log_r, estimator).sum(-1)


def kl_in_loss(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, mask_BT: torch.Tensor,
               estimator: KLEstimator = "k3", aggregation: Aggregation = "constant",
               norm_tokens: int | None = None) -> torch.Tensor:
    """aggregate(kl_t) with gradient through logp: GRPO's placement (k3 there); add coef × this to the loss."""
    m = mask_BT.bool()
    # Zero the log-ratio off the mask *before* exp, so garbage in padded positions (−inf, nan)
    # cannot turn into nan gradients through the masked-out branch.
    log_r = torch.where(m, ref_logp_BT.detach() - logp_BT, torch.zeros((), dtype=logp_BT.dtype, device=logp_BT.device))
    return aggregate(_kl_from_log_r(log_r, estimator), m, aggregation, norm_tokens)


class PolicyLossConfig(Section):
    """The clipped, off-policy-corrected token loss; defaults documented in docs/rl-algorithm.md."""

    clip_eps_low: float = Field(0.2, ge=0, lt=1)
    """ε_low: ρ is clipped below at 1 − ε_low (PPO's 0.2)."""
    clip_eps_high: float = Field(0.28, ge=0)
    """ε_high: ρ is clipped above at 1 + ε_high (DAPO's clip-higher 0.28: room for rare tokens to grow)."""
    off_policy: Literal["none", "truncated_is", "masked_is", "decoupled"] = "none"
    """Correction for the trainer–inference mismatch: none (ratio against behaviour only),
    truncated_is / masked_is (need old_logp), decoupled (AReaL; needs prox_logp)."""
    is_cap: float = Field(2.0, gt=0)
    """C of truncated IS: w = min(exp(old − behav), C) (the value used by verl's TIS). OURS."""
    is_mask_low: float = Field(0.5, ge=0)
    """α of masked IS: tokens with exp(old − behav) < α are dropped. OURS."""
    is_mask_high: float = Field(2.0, gt=0)
    """β of masked IS: tokens with exp(old − behav) > β are dropped. OURS."""
    decoupled_weight_cap: float = Field(5.0, gt=0)
    """Decoupled objective: tokens with exp(prox − behav) above this are dropped. OURS."""
    aggregation: Aggregation = "constant"
    """token_mean (DAPO), constant (Dr. GRPO, default: no length normalisation), seq_mean_token_mean (GRPO)."""
    loss_norm_tokens: int | None = Field(None, gt=0)
    """T_c of "constant": Dr. GRPO uses the generation budget; None = the batch's padded length T."""
    kl_loss_coef: float = Field(0.0, ge=0)
    """Coefficient of KL-in-the-loss (0 = off, the default: Composer 2 puts k1 in the reward)."""
    kl_loss_estimator: KLEstimator = "k3"
    """Estimator for KL-in-the-loss (k3 as GRPO; k1's gradient in the loss has zero mean on-policy)."""

    @model_validator(mode="after")
    def _check_bounds(self) -> "PolicyLossConfig":
        if self.is_mask_low >= self.is_mask_high:
            raise ValueError(f"is_mask_low ({self.is_mask_low}) must be < is_mask_high ({self.is_mask_high})")
        return self


def policy_loss(logp_BT: torch.Tensor, behav_logp_BT: torch.Tensor, advantages: torch.Tensor,
                mask_BT: torch.Tensor, cfg: PolicyLossConfig = PolicyLossConfig(),
                old_logp_BT: torch.Tensor | None = None, prox_logp_BT: torch.Tensor | None = None,
                ref_logp_BT: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level clipped policy-gradient loss (to minimise) and its metrics.

    advantages: [B] per sequence or [B, T] per token. Gradient flows through logp_BT only.
    L_t = w_t·max(−A·ρ_t, −A·clip(ρ_t, 1 − ε_low, 1 + ε_high)) on the kept tokens, aggregated;
    ρ_t and w_t as in the module docstring for cfg.off_policy. Plus cfg.kl_loss_coef ×
    kl_in_loss(logp, ref_logp) when that coefficient is > 0.

    Metrics: pg_loss, ratio_mean, clip_frac_low / clip_frac_high (kept tokens whose gradient the
    clip removed: A < 0 and ρ < 1 − ε_low, or A > 0 and ρ > 1 + ε_high), masked_frac (tokens
    dropped by masked IS or the decoupled cap), is_weight_mean/min/max and is_truncated_frac
    (when a weight applies), kl_behav_k3 (KL(μ‖π_θ) by k3 on μ's samples, all masked tokens),
    kl_ref (when KL is in the loss).
    """
    _check_inputs(cfg, old_logp_BT, prox_logp_BT, ref_logp_BT)
    mask = mask_BT.bool()
    zero = torch.zeros((), dtype=logp_BT.dtype, device=logp_BT.device)
    adv_BT = (advantages[:, None] if advantages.dim() == 1 else advantages).detach()
    behav = behav_logp_BT.detach()
    keep = mask
    weight_BT = None  # detached per-token IS weight
    if cfg.off_policy == "decoupled":
        anchor = prox_logp_BT.detach()
        weight_BT = torch.exp(torch.where(mask, anchor - behav, zero))
        keep = mask & (weight_BT <= cfg.decoupled_weight_cap)
    else:
        anchor = (old_logp_BT if old_logp_BT is not None else behav_logp_BT).detach()
        if cfg.off_policy in ("truncated_is", "masked_is"):
            s_BT = torch.exp(torch.where(mask, anchor - behav, zero))  # π_old/μ
            if cfg.off_policy == "truncated_is":
                weight_BT = s_BT.clamp(max=cfg.is_cap)
            else:
                keep = mask & (s_BT >= cfg.is_mask_low) & (s_BT <= cfg.is_mask_high)

    # Zero off-mask log-ratios before exp (padding may hold −inf/nan); clamp so ρ stays finite.
    log_ratio_BT = torch.where(keep, logp_BT - anchor, zero).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio_BT = torch.exp(log_ratio_BT)
    clipped_BT = ratio_BT.clamp(1 - cfg.clip_eps_low, 1 + cfg.clip_eps_high)
    pg_BT = torch.maximum(-adv_BT * ratio_BT, -adv_BT * clipped_BT)
    if weight_BT is not None:
        pg_BT = pg_BT * weight_BT
    pg_loss = aggregate(pg_BT, keep, cfg.aggregation, cfg.loss_norm_tokens)
    loss = pg_loss
    if cfg.kl_loss_coef > 0:
        kl_ref = kl_in_loss(logp_BT, ref_logp_BT, keep, cfg.kl_loss_estimator, cfg.aggregation, cfg.loss_norm_tokens)
        loss = loss + cfg.kl_loss_coef * kl_ref

    with torch.no_grad():
        n_keep = keep.sum().clamp(min=1)
        adv_full_BT = adv_BT.expand_as(ratio_BT)
        low_BT = keep & (adv_full_BT < 0) & (ratio_BT < 1 - cfg.clip_eps_low)
        high_BT = keep & (adv_full_BT > 0) & (ratio_BT > 1 + cfg.clip_eps_high)
        metrics = {
            "pg_loss": pg_loss.item(),
            "ratio_mean": (ratio_BT * keep).sum().item() / n_keep.item(),
            "clip_frac_low": low_BT.sum().item() / n_keep.item(),
            "clip_frac_high": high_BT.sum().item() / n_keep.item(),
            "masked_frac": 1.0 - keep.sum().item() / max(mask.sum().item(), 1),
            "kl_behav_k3": (torch.where(mask, kl(behav, logp_BT.detach(), "k3"), zero).sum() / mask.sum().clamp(min=1)).item(),
        }
        if weight_BT is not None:
            w_kept = weight_BT[keep]
            empty = w_kept.numel() == 0
            metrics["is_weight_mean"] = 0.0 if empty else w_kept.mean().item()
            metrics["is_weight_min"] = 0.0 if empty else w_kept.min().item()
            metrics["is_weight_max"] = 0.0 if empty else w_kept.max().item()
            if cfg.off_policy == "truncated_is":
                metrics["is_truncated_frac"] = (keep & (s_BT > cfg.is_cap)).sum().item() / n_keep.item()
        if cfg.kl_loss_coef > 0:
            metrics["kl_ref"] = kl_ref.item()
    return loss, metrics


def _check_inputs(cfg: PolicyLossConfig, old, prox, ref) -> None:
    """Refuse a call whose tensors do not match cfg: a silently ignored input hides a trainer bug."""
    if cfg.off_policy in ("truncated_is", "masked_is") and old is None:
        raise ValueError(f"off_policy={cfg.off_policy!r} needs old_logp_BT: the trainer's log-probs for the weights "
                         "that sampled the tokens (logp.detach() when the batch gets a single optimiser step)")
    if cfg.off_policy == "decoupled":
        if prox is None:
            raise ValueError("off_policy='decoupled' needs prox_logp_BT: the trainer's log-probs at the start of this step")
        if old is not None:
            raise ValueError("off_policy='decoupled' anchors at prox_logp_BT; do not also pass old_logp_BT")
    elif prox is not None:
        raise ValueError("prox_logp_BT is only used by off_policy='decoupled'")
    if cfg.kl_loss_coef > 0 and ref is None:
        raise ValueError("kl_loss_coef > 0 needs ref_logp_BT (the reference policy's log-probs)")
    if cfg.kl_loss_coef == 0 and ref is not None:
        raise ValueError("ref_logp_BT was given but kl_loss_coef is 0: KL-in-the-loss is off (KL-in-reward uses kl_in_reward)")
