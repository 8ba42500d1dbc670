"""Shared-prefix packing: a group's common prefix goes through the trainer's forward once.

The G rollouts of one task start with the same tokens: the system turn, the instruction, and
often the first tool call and its result (in the demo environment ~70% of every sample). The
trainer's forward over them is the same computation G times. Packed, a micro-batch runs in two
calls of the model (Prefix Grouper, Liu et al. 2506.05433, which verl offers as
`use_prefix_grouper`, splits attention the same way):

    1. prefix call   [R, P]  one row per group: its common prefix, causal; returns every
                             layer's keys/values (with their autograd graph)
    2. suffix call   [B', S] one row per sample of a merged group: the rest of the sample at
                             positions P_r .. n-1, attending to its group's prefix keys/values
                             (gathered per row, differentiable) and causally to its own tokens

so every sample's logits equal those of its own unpacked forward (up to float summation order)
while the model runs sum(P_r) + sum(n_b - P_r) tokens instead of sum(n_b), and attention costs
P^2 + G·S·(P + S) per group instead of G·(P + S)^2. Gradients are exact: each sample's
log-probs are gathered back into the trainer's [B, T] layout (`index_BT`, into the prefix and
suffix logits laid end to end), so the loss code is unchanged, and a prefix position that G
samples use receives the sum of their gradients through the gather and the key/value gather,
as it would through G separate forwards.

The prefix is the longest run of *input* positions on which every sample of the group agrees in
token id and in replayed experts (router replay must not change which experts a sample used).
The last prefix position's logits are shared, but each sample gathers its own target there.
Groups sharing fewer than MIN_SHARED_TOKENS, and single samples, run whole in the prefix call.

Left out: sharing prefixes across groups, tree-shaped sharing inside a group (samples that
agree on a longer prefix pairwise), and padding-free (varlen) attention: rows are right-padded
to the longest prefix and the longest suffix of the micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Sequence

import numpy as np
import torch


MIN_SHARED_TOKENS = 16
"""A group whose samples share fewer input tokens is not merged (each sample is its own row):
the block mask's quadratic cost would outweigh the few tokens saved."""


@dataclass
class Packed:
    """A micro-batch in the two-call layout of the module docstring."""

    prefix_ids_RP: torch.Tensor          # int64, right-padded with 0 (causal: pads are never seen)
    prefix_routed_RPYK: torch.Tensor | None
    suffix_ids_BS: torch.Tensor | None   # int64 [B', S], None when no group was merged
    suffix_pos_BS: torch.Tensor | None
    suffix_mask_B1SQ: torch.Tensor | None  # bool over Q = P + S keys: own prefix, then causal own tokens
    suffix_rows_B: torch.Tensor | None   # int64: the prefix row of each suffix row
    suffix_routed_BSYK: torch.Tensor | None
    index_BT: torch.Tensor               # int64: sample b's input position t in [R*P + B'*S] (0 past its end)
    tokens: int                          # real tokens the two calls compute

    def to(self, device: torch.device) -> "Packed":
        """The same layout on `device` (itself where it already is): `pack` builds it on the host."""
        return replace(self, **{f.name: t.to(device) for f in fields(self)
                                if isinstance(t := getattr(self, f.name), torch.Tensor)})

    def replay_rows(self) -> int:
        """Positions the two calls replay (a shared prefix position counts once)."""
        rows = [r for r in (self.prefix_routed_RPYK, self.suffix_routed_BSYK) if r is not None]
        return sum(int((r[..., 0] >= 0).sum()) for r in rows)


def common_prefix(token_ids: Sequence[np.ndarray], routed: Sequence[np.ndarray | None] | None = None) -> int:
    """Input positions (ids[:-1]) on which all sequences agree in token and routed experts."""
    n = min(len(ids) - 1 for ids in token_ids)
    agree = np.ones(n, dtype=bool)
    for ids in token_ids[1:]:
        agree &= ids[:n] == token_ids[0][:n]
    if routed is not None:
        if any((r is None) != (routed[0] is None) for r in routed):
            return 0
        for r in routed[1:]:
            if r is not None:
                agree &= (r[:n] == routed[0][:n]).all(axis=(1, 2))
    return int(n if agree.all() else np.argmin(agree))


def _group_bounds(group_ids: Sequence[object]) -> list[tuple[int, int]]:
    """Runs of equal consecutive group ids -> [(start, end)]."""
    bounds, start = [], 0
    for i in range(1, len(group_ids) + 1):
        if i == len(group_ids) or group_ids[i] != group_ids[start]:
            bounds.append((start, i))
            start = i
    return bounds


def pack(token_ids: Sequence[np.ndarray], group_ids: Sequence[object], T: int,
         moe_shape: tuple[int, int] | None = None, routed: Sequence[np.ndarray | None] | None = None) -> Packed:
    """Pack sequences (each group's consecutive) into the two calls. T: the [B, T] layout's width
    (max input length). moe_shape (Y, K) with `routed` (per sequence [len, Y, K] or None) carries
    routed experts for replay; None for no replay."""
    def experts(b: int, n: int) -> np.ndarray | None:
        return _routed(routed[b] if routed is not None else None, n, moe_shape)

    prefixes: list[tuple[np.ndarray, np.ndarray | None]] = []        # ids, routed
    suffixes: list[tuple[int, int, np.ndarray, np.ndarray | None]] = []  # prefix row, P, ids, routed
    where: list[tuple[str, int, int, int]] = []  # per sequence: (call, row, P, n)
    for i, j in _group_bounds(group_ids):
        P = 0
        if j - i > 1:
            P = common_prefix(token_ids[i:j], None if moe_shape is None or routed is None else routed[i:j])
        if P < MIN_SHARED_TOKENS:
            for b in range(i, j):
                n = len(token_ids[b]) - 1
                prefixes.append((token_ids[b][:n], experts(b, n)))
                where.append(("prefix", len(prefixes) - 1, n, n))
            continue
        prefixes.append((token_ids[i][:P], experts(i, P)))
        for b in range(i, j):
            n = len(token_ids[b]) - 1
            r = experts(b, n)
            suffixes.append((len(prefixes) - 1, P, token_ids[b][P:n], None if r is None else r[P:]))
            where.append(("suffix", len(suffixes) - 1, P, n))

    R, Pm = len(prefixes), max(len(ids) for ids, _ in prefixes)
    prefix_ids, prefix_routed = _pad([ids for ids, _ in prefixes], Pm), _pad_routed([r for _, r in prefixes], Pm, moe_shape)
    tokens = sum(len(ids) for ids, _ in prefixes)
    sfx = dict.fromkeys(["suffix_ids_BS", "suffix_pos_BS", "suffix_mask_B1SQ", "suffix_rows_B", "suffix_routed_BSYK"])
    Sm = 0
    if suffixes:
        Sm = max(1, max(len(ids) for _, _, ids, _ in suffixes))
        P_B = torch.tensor([P for _, P, _, _ in suffixes])
        t_S = torch.arange(Sm)
        own_BSS = (t_S[None, :] <= t_S[:, None]).expand(len(suffixes), Sm, Sm)  # causal; pads see themselves
        prefix_BSP = (torch.arange(Pm)[None, :] < P_B[:, None])[:, None, :].expand(-1, Sm, -1)
        sfx = {"suffix_ids_BS": _pad([ids for _, _, ids, _ in suffixes], Sm),
               "suffix_pos_BS": P_B[:, None] + t_S[None, :],
               "suffix_mask_B1SQ": torch.cat([prefix_BSP, own_BSS], dim=-1)[:, None],
               "suffix_rows_B": torch.tensor([r for r, _, _, _ in suffixes]),
               "suffix_routed_BSYK": _pad_routed([r for _, _, _, r in suffixes], Sm, moe_shape)}
        tokens += sum(len(ids) for _, _, ids, _ in suffixes)
    index_BT = torch.zeros(len(token_ids), T, dtype=torch.int64)
    for b, (call, row, P, n) in enumerate(where):
        if call == "prefix":
            index_BT[b, :n] = row * Pm + torch.arange(n)
        else:
            r = suffixes[row][0]
            index_BT[b, :P] = r * Pm + torch.arange(P)
            index_BT[b, P:n] = R * Pm + row * Sm + torch.arange(n - P)
    return Packed(prefix_ids, prefix_routed, **sfx, index_BT=index_BT, tokens=tokens)


def _pad(rows: list[np.ndarray], L: int) -> torch.Tensor:
    out = torch.zeros(len(rows), L, dtype=torch.int64)
    for r, ids in enumerate(rows):
        out[r, :len(ids)] = torch.from_numpy(np.asarray(ids, dtype=np.int64))
    return out


def _pad_routed(rows: list[np.ndarray | None], L: int, moe_shape: tuple[int, int] | None) -> torch.Tensor | None:
    if moe_shape is None:
        return None
    out = torch.full((len(rows), L, *moe_shape), -1, dtype=torch.int32)
    for r, routed in enumerate(rows):
        out[r, :len(routed)] = torch.from_numpy(routed)
    return out


def forward_packed(model, p: Packed, replay: bool = False, replay_min_ratio: float | None = None,
                   compute_logits: bool = True) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """The two calls; returns (hidden [R*P + B'*S, D], logits [R*P + B'*S, V] or None, replaced
    experts), both calls' rows laid end to end (what `index_BT` indexes)."""
    ratio = replay_min_ratio if replay else None
    pre = model(p.prefix_ids_RP, routed_experts=p.prefix_routed_RPYK if replay else None, replay_min_ratio=ratio,
                return_key_values=p.suffix_ids_BS is not None, compute_logits=compute_logits)
    outs, replaced = [pre], pre.replaced_experts
    if p.suffix_ids_BS is not None:
        past = [(k[p.suffix_rows_B], v[p.suffix_rows_B]) for k, v in pre.key_values]
        suf = model(p.suffix_ids_BS, routed_experts=p.suffix_routed_BSYK if replay else None, replay_min_ratio=ratio,
                    position_ids=p.suffix_pos_BS, attention_mask=p.suffix_mask_B1SQ, past_key_values=past,
                    compute_logits=compute_logits)
        outs.append(suf)
        replaced += suf.replaced_experts
    hidden = torch.cat([o.hidden.flatten(0, 1) for o in outs])
    logits = torch.cat([o.logits.flatten(0, 1) for o in outs]) if compute_logits else None
    return hidden, logits, replaced


def _routed(routed: np.ndarray | None, n: int, moe_shape: tuple[int, int] | None) -> np.ndarray | None:
    if moe_shape is None:
        return None
    if routed is None:
        return np.full((n, *moe_shape), -1, np.int32)
    if routed.shape[1:] != moe_shape:
        raise ValueError(f"routed_experts rows are {routed.shape[1:]}, the model's MoE layout is (Y, K) = {moe_shape}")
    return routed[:n]
