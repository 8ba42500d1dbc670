"""Training losses for the multi-token-prediction (MTP) modules.

The modules themselves live in model.py (`MTPModule`, `Transformer.mtp_logits` for training,
`Transformer.mtp_step` for drafting). Depth k's logits at position i predict token t_{i+k+1};
two objectives are offered:

  * "ce": cross-entropy on the future token (DeepSeek-V3, 2412.19437 §2.2),
        L_k = mean_i -log p_k(t_{i+k+1} | ...).
  * "distill": self-distillation to the main head (Composer 2 report §3), whose logits at
        position i+k predict the same token: L_k = mean_i KL(p_main,i+k || p_k,i), with
        the main head's logits detached so that only the MTP modules learn from it.

Both are combined as L_MTP = (lambda / D) * sum_k L_k. Means are over target tokens with
loss_mask = 1 (e.g. to skip padding or prompts). Left out: the choice of lambda and of when to
switch objectives, which belong to the training recipe (pretrain/).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def mtp_loss(mtp_logits: list[torch.Tensor], input_ids: torch.Tensor, *, mode: str = "ce",
             main_logits: torch.Tensor | None = None, weight: float = 1.0,
             loss_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(lambda/D) * sum_k L_k and the per-depth L_k.

    mtp_logits: Transformer.mtp_logits output, depth k (1-based) [B, T-k-1, V].
    input_ids [B, T]; main_logits [B, T, V] (mode "distill" only); loss_mask [B, T] (1 = this
    token counts as a target; depth k's targets are input_ids[:, k+1:]).
    """
    if mode not in ("ce", "distill"):
        raise ValueError(f"mtp_loss mode must be 'ce' or 'distill', got {mode!r}")
    if mode == "distill" and main_logits is None:
        raise ValueError("mtp_loss mode 'distill' needs main_logits (the main head's logits)")
    B, T = input_ids.shape
    per_depth = []
    for k, logits_BtV in enumerate(mtp_logits, start=1):
        t = logits_BtV.shape[1]  # = T - k - 1
        mask_Bt = (torch.ones(B, t, device=input_ids.device) if loss_mask is None
                   else loss_mask[:, k + 1:].to(torch.float32))
        if mode == "ce":
            tok_Bt = F.cross_entropy(logits_BtV.float().transpose(1, 2), input_ids[:, k + 1:], reduction="none")
        else:
            teacher_BtV = F.log_softmax(main_logits[:, k:T - 1].detach().float(), dim=-1)
            student_BtV = F.log_softmax(logits_BtV.float(), dim=-1)
            tok_Bt = (teacher_BtV.exp() * (teacher_BtV - student_BtV)).sum(-1)
        per_depth.append((tok_Bt * mask_Bt).sum() / mask_Bt.sum().clamp(min=1))
    if not per_depth:
        return torch.zeros((), device=input_ids.device), []
    return weight / len(per_depth) * torch.stack(per_depth).sum(), per_depth
