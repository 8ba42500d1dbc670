"""Shared-prefix packing: a group's common prefix goes through the trainer's forward once, and no
token of padding goes through it at all.

The G rollouts of one task start with the same tokens: the system turn, the instruction, and
often the first tool call and its result (in the demo environment ~70% of every sample). The
trainer's forward over them is the same computation G times. Packed, a micro-batch is one row of
N tokens laid end to end, cut into segments (training/attention.Segment), and runs in one call
of the model (Prefix Grouper, Liu et al. 2506.05433, which verl offers as `use_prefix_grouper`,
splits attention the same way):

    [ prefix of group 1 | suffix 1.1 | suffix 1.2 | ... | prefix of group 2 | suffix 2.1 | ... | sample | ... ]

A prefix segment is causal over itself; a suffix segment (the rest of one sample, at positions
P .. n-1) attends to its group's prefix segment and causally to itself; a sample of a group that
shares too little is one segment of its own. Token-wise work (projections, experts, norms) runs
over sum(P_g) + sum(n_b - P_g) real tokens instead of B·T padded ones, and attention over each
segment's own pairs only (training/attention.py: S·(P + S/2) per suffix).

Every sample's logits equal those of its own unpacked forward (up to float summation order).
Gradients are exact: each sample's log-probs are gathered back into the trainer's [B, T] layout
(`index_BT`, into the row), so the loss code is unchanged, and a prefix position that G samples
use receives the sum of their gradients through the gather and through its keys and values, as
it would through G separate forwards.

The prefix is the longest run of *input* positions on which every sample of the group agrees in
token id and in replayed experts (router replay must not change which experts a sample used).
The last prefix position's logits are shared, but each sample gathers its own target there.
Groups sharing fewer than MIN_SHARED_TOKENS, and single samples, are one segment per sample.

Issue 23 replaced the layout before it (a prefix call padded to the longest prefix, then the
suffixes padded to the longest, attending through a mask over every padded pair): the same
values up to float rounding, measured in docs/benchmarks.md.

Left out: sharing prefixes across groups, and tree-shaped sharing inside a group (samples that
agree on a longer prefix pairwise).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Sequence

import numpy as np
import torch

from opencomposer.training.attention import Segment, SegmentAttention


MIN_SHARED_TOKENS = 16
"""A group whose samples share fewer input tokens is not merged (each sample is its own segment):
a suffix's second attention block would cost more than the few tokens saved."""


@dataclass
class Packed:
    """A micro-batch as one padding-free row of N tokens cut into segments (module docstring)."""

    ids_1N: torch.Tensor                 # int64
    pos_1N: torch.Tensor                 # int64 positions: a suffix continues its prefix's
    routed_1NYK: torch.Tensor | None     # int32 replayed experts, -1 = the router's choice
    segments: list[Segment]
    index_BT: torch.Tensor               # int64: sample b's input position t in the row (0 past its end)

    @property
    def tokens(self) -> int:
        """Tokens the call computes (a shared prefix position once)."""
        return self.ids_1N.shape[1]

    def to(self, device: torch.device) -> "Packed":
        """The same layout on `device` (itself where it already is): `pack` builds it on the host."""
        return replace(self, **{f.name: t.to(device) for f in fields(self)
                                if isinstance(t := getattr(self, f.name), torch.Tensor)})

    def replay_rows(self) -> int:
        """Positions the call replays (a shared prefix position counts once)."""
        return 0 if self.routed_1NYK is None else int((self.routed_1NYK[..., 0] >= 0).sum())


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
    """Pack sequences (each group's consecutive) into one row of segments. T: the [B, T] layout's
    width (max input length). moe_shape (Y, K) with `routed` (per sequence [len, Y, K] or None)
    carries routed experts for replay; None for no replay."""
    ids, pos, experts, segments = [], [], [], []
    index_BT = torch.zeros(len(token_ids), T, dtype=torch.int64)
    N = 0

    def add(b: int, t0: int, t1: int, prefix: Segment | None) -> None:
        """Sample b's input positions t0..t1-1 as a segment after `prefix`."""
        nonlocal N
        if t1 <= t0:
            return
        ids.append(token_ids[b][t0:t1])
        pos.append(np.arange(t0, t1))
        if moe_shape is not None:
            experts.append(_routed(routed[b] if routed is not None else None, t1, moe_shape)[t0:])
        segments.append(Segment(N, t1 - t0, *((prefix.start, prefix.length) if prefix else (0, 0))))
        index_BT[b, t0:t1] = N + torch.arange(t1 - t0)
        N += t1 - t0

    for i, j in _group_bounds(group_ids):
        P = 0
        if j - i > 1:
            P = common_prefix(token_ids[i:j], None if moe_shape is None or routed is None else routed[i:j])
        if P < MIN_SHARED_TOKENS:
            for b in range(i, j):
                add(b, 0, len(token_ids[b]) - 1, None)
            continue
        add(i, 0, P, None)
        prefix = segments[-1]
        for b in range(i, j):
            index_BT[b, :P] = prefix.start + torch.arange(P)
            n = len(token_ids[b]) - 1
            if n > P:
                add(b, P, n, prefix)
    return Packed(torch.from_numpy(np.concatenate(ids).astype(np.int64))[None],
                  torch.from_numpy(np.concatenate(pos).astype(np.int64))[None],
                  torch.from_numpy(np.concatenate(experts))[None] if moe_shape is not None else None,
                  segments, index_BT)


def forward_packed(model, p: Packed, replay: bool = False, replay_min_ratio: float | None = None,
                   compute_logits: bool = True) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """One model call over the packed row; returns (hidden [N, D], logits [N, V] or None,
    replaced experts), in the row's order (what `index_BT` indexes)."""
    out = model(p.ids_1N, routed_experts=p.routed_1NYK if replay else None,
                replay_min_ratio=replay_min_ratio if replay else None, position_ids=p.pos_1N,
                attention=SegmentAttention(p.segments), compute_logits=compute_logits)
    return out.hidden[0], out.logits[0] if compute_logits else None, out.replaced_experts


def _routed(routed: np.ndarray | None, n: int, moe_shape: tuple[int, int] | None) -> np.ndarray | None:
    if moe_shape is None:
        return None
    if routed is None:
        return np.full((n, *moe_shape), -1, np.int32)
    if routed.shape[1:] != moe_shape:
        raise ValueError(f"routed_experts rows are {routed.shape[1:]}, the model's MoE layout is (Y, K) = {moe_shape}")
    return routed[:n]
