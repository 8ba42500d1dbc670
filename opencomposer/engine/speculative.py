"""MTP self-speculative decoding: draft with the model's own MTP modules, verify in one forward.

One step for a batch of sequences (gpt-fast's `speculative_decode`, with the draft model
replaced by DeepSeek-V3's MTP modules, 2412.19437 §2.2 and §5.4.3):

  1. Draft (`draft`). The main cache holds positions 0..L-1 of a slot and the last sampled token
     t_L is pending. MTP depth d (module d) at position i reads h^{d-1}_i and token t_{i+d} and
     predicts t_{i+d+1}; chaining depths 1..k at the newest position drafts x_1..x_k, each drawn
     from its sampling distribution q_d (the request's temperature/top-k/top-p applied to the MTP
     logits; greedy: the argmax).
  2. Verify: one main-model forward of the k+1 tokens [t_L, x_1, .., x_k] per row (T = k+1)
     gives the target distributions p_0..p_k (same transform), its logprobs and routed experts.
  3. Accept (`accept`). Leviathan et al. 2211.17192 / Chen et al. 2302.01318: accept x_j with
     probability min(1, p_{j-1}(x_j) / q_j(x_j)); at the first rejection draw the token from
     norm(max(0, p_{j-1} - q_j)); if all k are accepted draw a bonus token from p_k. Each of
     the n+1 emitted tokens is then distributed exactly as plain sampling from p. Greedy rows
     have one-hot p and q, and the rule reduces to "accept while x_j == argmax p_{j-1}", so the
     output equals plain greedy decoding.
  4. Roll back: the caller advances the main cache by n+1 (positions L..L+n hold accepted
     tokens); the verify forward's keys of rejected positions lie past the length and are
     overwritten later.

The MTP caches. Module d's cache entry i holds position i's (h^{d-1}_i, t_{i+d}); an entry is
final only once t_{i+d} is a real token, and drafting writes entries whose token is a draft
(for d >= 2, the d-1 newest positions). So every draft call recomputes a window of the W = 2k
newest positions (W >= (n+1) + (k-1) for any n <= k accepted), rewriting every entry that held
a draft with real tokens, from the last W main hiddens (kept by the caller per slot). A fixed
W keeps one T for the whole batch; only a sequence shorter than W gets its own, shorter window.

The functions here are the reference of the step. For all-greedy batches the engine runs the
whole step as one call of its forward backend (forward.Forward.spec_greedy; on the CPU one C++
op doing verify, acceptance, the window shifts and all k drafting depths), so that a step at
batch 1 costs its arithmetic and not ~20 Python-level tensor operations. That op also keeps
each depth's hiddens over the window, so that depth d recomputes only its max(d, n+1) newest
entries (those that read a rejected draft, and the new positions) instead of all W: with
greedy drafts an accepted draft *is* the real token, so the other entries are already exact.

Left out: drafting deeper than the number of MTP modules (chaining the last module EAGLE-style),
and tree drafts (several candidates per depth).
"""

from __future__ import annotations

from typing import Callable

import torch

from opencomposer.engine.sampling import sample
from opencomposer.model.model import KVCache

# forward.Forward.mtp_step: (depth, hidden [B, T, D], ids [B, T], slots [B], logits?) ->
# (last position's logits [B, V] or None, hidden [B, T, D])
MtpStep = Callable[..., tuple[torch.Tensor | None, torch.Tensor]]

# (logits [B, V] of one depth) -> (draft tokens int64 [B], their distribution q [B, V] or None
# when every row is greedy)
DraftSampler = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]


def window(k: int) -> int:
    """Positions each draft call recomputes in the MTP caches (see the module docstring)."""
    return 2 * k


def draft(mtp_step: MtpStep, cache: KVCache, slots_B: torch.Tensor, hidden_BTD: torch.Tensor,
          next_BT: torch.Tensor, k: int,
          sampler: DraftSampler) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
    """Draft k tokens per row. The window is the last T positions i = L-T..L-1 of each slot
    (L = cache.lengths[slot]); hidden_BTD holds their main hiddens h_i and next_BT the tokens
    t_{i+1} (so next_BT[:, -1] is the pending token t_L). Returns drafts int64 [B, k], the
    stacked q [B, k, V] (None when the sampler returns None) and each depth's hiddens over the
    window [B, T, D] (the engine keeps them: see forward.Forward.spec_greedy)."""
    T = next_BT.shape[1]
    ext_BX = next_BT  # t_{L-T+1} .., then the drafts as they come
    h_BTD, qs, hs = hidden_BTD, [], []
    for d in range(1, k + 1):
        logits_BV, h_BTD = mtp_step(d, h_BTD, ext_BX[:, d - 1:d - 1 + T], slots_B)
        tok_B, q_BV = sampler(logits_BV)
        ext_BX = torch.cat([ext_BX, tok_B[:, None]], dim=1)
        qs.append(q_BV)
        hs.append(h_BTD)
    return ext_BX[:, T:], (None if qs[0] is None else torch.stack(qs, dim=1)), hs


def prefill_mtp(mtp_step: MtpStep, cache: KVCache, slots_B: torch.Tensor, hidden_BPD: torch.Tensor,
                prompt_BP: torch.Tensor, k: int, upto: int) -> None:
    """Write the MTP caches of prompt positions 0..upto-1, all of whose depth-d tokens t_{i+d}
    (d <= k) are prompt tokens (needs upto + k <= P). The newest positions are left to `draft`.
    The main cache must hold the prompt; its lengths are moved to `upto` and restored, since
    mtp_step works on the last T positions."""
    if upto <= 0:
        return
    lengths_B = cache.lengths[slots_B].clone()
    cache.lengths[slots_B] = upto
    try:
        h_BTD = hidden_BPD[:, :upto]
        for d in range(1, k + 1):
            _, h_BTD = mtp_step(d, h_BTD, prompt_BP[:, d:d + upto], slots_B, logits=False)
    finally:
        cache.lengths[slots_B] = lengths_B


def accept(p_BJV: torch.Tensor, q_BkV: torch.Tensor, drafts_Bk: torch.Tensor, u_Bk: torch.Tensor,
           u_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The speculative sampling rule (module docstring, step 3) for a batch.

    p_BJV: target sampling distributions at the J = k+1 verified positions; q_BkV: the draft
    distributions; drafts_Bk: the drafted tokens; u_Bk, u_B: uniforms in [0, 1) for the k
    acceptance tests and the final draw. Returns (n accepted int64 [B], final token int64 [B]).
    """
    B, k = drafts_Bk.shape
    p_draft_Bk = p_BJV[:, :k].gather(-1, drafts_Bk[..., None]).squeeze(-1)
    q_draft_Bk = q_BkV.gather(-1, drafts_Bk[..., None]).squeeze(-1)
    # u < p/q accepts with probability min(1, p/q); q(x) > 0 for a token drawn from q.
    ok_Bk = u_Bk * q_draft_Bk < p_draft_Bk
    n_B = ok_Bk.to(torch.int64).cumprod(dim=1).sum(dim=1)
    rows = torch.arange(B, device=p_BJV.device)
    p_BV = p_BJV[rows, n_B]
    q_pad_BJV = torch.cat([q_BkV, torch.zeros_like(q_BkV[:, :1])], dim=1)  # bonus: p - 0 = p
    resid_BV = (p_BV - q_pad_BJV[rows, n_B]).clamp_(min=0)
    # An all-zero residual needs p <= q everywhere, i.e. p == q: then rejection had probability 0
    # and only rounding got here; p is the right distribution.
    empty_B1 = resid_BV.sum(-1, keepdim=True) <= 0
    final_B = sample(torch.where(empty_B1, p_BV, resid_BV), u_B)
    return n_B, final_B


def accept_greedy(target_BJ: torch.Tensor, drafts_Bk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`accept` for all-greedy batches without building one-hot distributions: accept while the
    draft equals the target argmax (target_BJ: the argmax of each verified position); the final
    token is the argmax after the last accepted one."""
    k = drafts_Bk.shape[1]
    n_B = (drafts_Bk == target_BJ[:, :k]).to(torch.int64).cumprod(dim=1).sum(dim=1)
    return n_B, target_BJ.gather(1, n_B[:, None]).squeeze(1)


def shift_hidden(hist_BW_: torch.Tensor, new_BJ_: torch.Tensor, n_B: torch.Tensor) -> torch.Tensor:
    """The last W entries of each row after appending the first n+1 of new_BJ_ (hiddens
    [B, W, D] or tokens [B, W]: any trailing dims)."""
    W = hist_BW_.shape[1]
    all_BX_ = torch.cat([hist_BW_, new_BJ_.to(hist_BW_.dtype)], dim=1)
    idx_BW = (n_B[:, None] + 1) + torch.arange(W, device=n_B.device)
    idx = idx_BW.view(*idx_BW.shape, *[1] * (all_BX_.dim() - 2)).expand(-1, -1, *all_BX_.shape[2:])
    return all_BX_.gather(1, idx)
