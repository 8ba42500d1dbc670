"""Shared-prefix packing: a group's common prefix goes through the trainer's forward once.

The G rollouts of one task start with the same tokens: the system turn, the instruction, and
often the first tool call and its result (in the demo environment ~70% of every sample). The
trainer's forward over them is the same computation G times. Packed, a micro-batch runs in two
(or, chunked, a few more) calls of the model (Prefix Grouper, Liu et al. 2506.05433, which verl offers as
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

Chunked suffixes (`pack(..., chunk=C)`, the trainer's `train.suffix_chunk`): instead of one
suffix call padded to the longest suffix, call c runs tokens [c·C, (c+1)·C) of the suffixes that
reach that far, longest first, attending to its rows' prefix keys and to the keys of the earlier
calls (the first n rows of each, which are the same samples). Attention then costs close to the
causal, unpadded S·(P + S/2) per sample, and rows that have ended drop out of the later calls;
the price is more model calls (more small ops). On the demo's RL shapes (benchmarks/train_step.py)
C = 128 took 5-15% off the trainer step, with other float rounding than one call, so it is off
by default. Both layouts are `SuffixCall`s; with chunk=None the single call is the layout (and
the bits) of before issue 23.

The suffix calls get their attention mask as 0 / -inf floats, built once per call: attention
would convert a bool mask to the same floats in every layer.

Left out: sharing prefixes across groups, tree-shaped sharing inside a group (samples that
agree on a longer prefix pairwise), and varlen attention kernels: rows are right-padded to the
longest prefix of the micro-batch and to the longest suffix of each call.
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
class SuffixCall:
    """One call of the model over suffix tokens [s0, s0 + T) of n rows (module docstring)."""

    ids_nT: torch.Tensor                 # int64, right-padded with 0
    pos_nT: torch.Tensor                 # int64 positions
    mask_n1TQ: torch.Tensor              # bool over Q keys: prefix, earlier chunks' tokens, then causal own
    prefix_rows_n: torch.Tensor          # int64: the prefix-call row whose keys come first
    prefix_keys: int                     # how many of that row's key positions the call reads
    after: list[int]                     # earlier calls (indices) whose first n rows' keys come next, in order
    routed_nTYK: torch.Tensor | None


@dataclass
class Packed:
    """A micro-batch in the layout of the module docstring: the prefix call, then the suffix calls."""

    prefix_ids_RP: torch.Tensor          # int64, right-padded with 0 (causal: pads are never seen)
    prefix_routed_RPYK: torch.Tensor | None
    calls: list[SuffixCall]
    index_BT: torch.Tensor               # int64: sample b's input position t in the calls' rows laid end to end (0 past its end)
    tokens: int                          # real tokens the calls compute

    def to(self, device: torch.device) -> "Packed":
        """The same layout on `device` (itself where it already is): `pack` builds it on the host."""
        def move(obj):
            return replace(obj, **{f.name: t.to(device) for f in fields(obj)
                                   if isinstance(t := getattr(obj, f.name), torch.Tensor)})
        return replace(move(self), calls=[move(c) for c in self.calls])

    def replay_rows(self) -> int:
        """Positions the calls replay (a shared prefix position counts once)."""
        rows = [r for r in [self.prefix_routed_RPYK] + [c.routed_nTYK for c in self.calls] if r is not None]
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


@dataclass
class _Suffix:
    sample: int
    prefix_row: int
    P: int
    ids: np.ndarray
    routed: np.ndarray | None


def pack(token_ids: Sequence[np.ndarray], group_ids: Sequence[object], T: int,
         moe_shape: tuple[int, int] | None = None, routed: Sequence[np.ndarray | None] | None = None,
         chunk: int | None = None) -> Packed:
    """Pack sequences (each group's consecutive) into the calls. T: the [B, T] layout's width
    (max input length). moe_shape (Y, K) with `routed` (per sequence [len, Y, K] or None) carries
    routed experts for replay; None for no replay. chunk: suffix tokens per call, one group per
    call (None: every suffix in one call, the layout before issue 23)."""
    def experts(b: int, n: int) -> np.ndarray | None:
        return _routed(routed[b] if routed is not None else None, n, moe_shape)

    prefixes: list[tuple[np.ndarray, np.ndarray | None]] = []   # ids, routed
    groups: list[list[_Suffix]] = []                             # the suffixes of each merged group
    own_row: dict[int, int] = {}                                 # unmerged sample -> its prefix row
    for i, j in _group_bounds(group_ids):
        P = 0
        if j - i > 1:
            P = common_prefix(token_ids[i:j], None if moe_shape is None or routed is None else routed[i:j])
        if P < MIN_SHARED_TOKENS:
            for b in range(i, j):
                n = len(token_ids[b]) - 1
                prefixes.append((token_ids[b][:n], experts(b, n)))
                own_row[b] = len(prefixes) - 1
            continue
        prefixes.append((token_ids[i][:P], experts(i, P)))
        group = []
        for b in range(i, j):
            n = len(token_ids[b]) - 1
            r = experts(b, n)
            group.append(_Suffix(b, len(prefixes) - 1, P, token_ids[b][P:n], None if r is None else r[P:]))
        groups.append(group)

    R, Pm = len(prefixes), max(len(ids) for ids, _ in prefixes)
    prefix_ids, prefix_routed = _pad([ids for ids, _ in prefixes], Pm), _pad_routed([r for _, r in prefixes], Pm, moe_shape)
    tokens = sum(len(ids) for ids, _ in prefixes)
    index_BT = torch.zeros(len(token_ids), T, dtype=torch.int64)
    for b, row in own_row.items():
        n = len(token_ids[b]) - 1
        index_BT[b, :n] = row * Pm + torch.arange(n)
    calls: list[SuffixCall] = []
    offset = R * Pm
    if chunk is None and groups:
        offset = _merged_call([x for g in groups for x in g], Pm, moe_shape, calls, index_BT, offset)
    if chunk is not None and groups:
        offset = _chunked_calls([x for g in groups for x in g], chunk, moe_shape, calls, index_BT, offset, Pm)
    tokens += sum(len(x.ids) for g in groups for x in g)
    return Packed(prefix_ids, prefix_routed, calls, index_BT, tokens)


def _merged_call(suffixes: list[_Suffix], Pm: int, moe_shape, calls: list[SuffixCall], index_BT: torch.Tensor,
                 offset: int) -> int:
    """Every suffix in one call, padded to the longest, each row reading its prefix row's Pm keys
    masked to its own P."""
    Sm = max(1, max(len(x.ids) for x in suffixes))
    P_B = torch.tensor([x.P for x in suffixes])
    t_S = torch.arange(Sm)
    own_BSS = (t_S[None, :] <= t_S[:, None]).expand(len(suffixes), Sm, Sm)  # causal; pads see themselves
    prefix_BSP = (torch.arange(Pm)[None, :] < P_B[:, None])[:, None, :].expand(-1, Sm, -1)
    calls.append(SuffixCall(_pad([x.ids for x in suffixes], Sm), P_B[:, None] + t_S[None, :],
                            torch.cat([prefix_BSP, own_BSS], dim=-1)[:, None],
                            torch.tensor([x.prefix_row for x in suffixes]), Pm, [],
                            _pad_routed([x.routed for x in suffixes], Sm, moe_shape)))
    for row, x in enumerate(suffixes):
        _index_suffix(index_BT, x, x.prefix_row * Pm, offset + row * Sm, 0, len(x.ids))
    return offset + len(suffixes) * Sm


def _chunked_calls(suffixes: list[_Suffix], chunk: int, moe_shape, calls: list[SuffixCall], index_BT: torch.Tensor,
                   offset: int, Pm: int) -> int:
    """The suffixes in calls of `chunk` tokens: call c holds tokens [c*chunk, (c+1)*chunk) of the
    rows that reach that far (the longest rows first, so that they are the first n rows of every
    earlier call), reading its prefix row's keys (masked to the row's own P) and the earlier
    calls' keys, which are all real tokens of the row."""
    order = sorted(suffixes, key=lambda x: -len(x.ids))
    first = len(calls)
    for s0 in range(0, len(order[0].ids), chunk):
        rows = [x for x in order if len(x.ids) > s0]
        Tc = min(chunk, len(rows[0].ids) - s0)
        Pc = max(x.P for x in rows)
        t_T = torch.arange(Tc)
        P_n = torch.tensor([x.P for x in rows])
        prefix_nTP = (torch.arange(Pc)[None, :] < P_n[:, None])[:, None, :].expand(-1, Tc, -1)
        rest_nTQ = torch.cat([torch.ones(Tc, s0, dtype=torch.bool), t_T[None, :] <= t_T[:, None]], dim=-1)
        mask_n1TQ = torch.cat([prefix_nTP, rest_nTQ.expand(len(rows), -1, -1)], dim=-1)[:, None]
        calls.append(SuffixCall(_pad([x.ids[s0:s0 + Tc] for x in rows], Tc), P_n[:, None] + s0 + t_T[None, :],
                                mask_n1TQ, torch.tensor([x.prefix_row for x in rows]), Pc,
                                list(range(first, len(calls))),
                                _pad_routed([x.routed[s0:s0 + Tc] for x in rows] if moe_shape else [], Tc, moe_shape)))
        for row, x in enumerate(rows):
            _index_suffix(index_BT, x, x.prefix_row * Pm, offset + row * Tc, s0, min(len(x.ids), s0 + Tc))
        offset += len(rows) * Tc
    return offset


def _index_suffix(index_BT: torch.Tensor, x: _Suffix, prefix_at: int, at: int, s0: int, s1: int) -> None:
    """Sample x's prefix positions (at prefix_at in the laid-out rows) and its suffix tokens s0..s1-1 (at `at`)."""
    if s0 == 0:
        index_BT[x.sample, :x.P] = prefix_at + torch.arange(x.P)
    index_BT[x.sample, x.P + s0:x.P + s1] = at + torch.arange(s1 - s0)


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
    """The calls; returns (hidden [rows, D], logits [rows, V] or None, replaced experts), every
    call's rows laid end to end (what `index_BT` indexes)."""
    ratio = replay_min_ratio if replay else None
    pre = model(p.prefix_ids_RP, routed_experts=p.prefix_routed_RPYK if replay else None, replay_min_ratio=ratio,
                return_key_values=bool(p.calls), compute_logits=compute_logits)
    outs, replaced, kv = [pre], pre.replaced_experts, []
    for i, c in enumerate(p.calls):
        n = c.ids_nT.shape[0]
        past = []
        for layer, (k, v) in enumerate(pre.key_values):
            ks = [k[c.prefix_rows_n, :, :c.prefix_keys]] + [kv[j][layer][0][:n] for j in c.after]
            vs = [v[c.prefix_rows_n, :, :c.prefix_keys]] + [kv[j][layer][1][:n] for j in c.after]
            past.append((torch.cat(ks, 2), torch.cat(vs, 2)) if len(ks) > 1 else (ks[0], vs[0]))
        later = any(i in d.after for d in p.calls[i + 1:])
        # 0 / -inf, as attention converts a bool mask in every layer: converted once, the same bits
        bias = torch.zeros(c.mask_n1TQ.shape, dtype=pre.hidden.dtype, device=c.mask_n1TQ.device)
        bias.masked_fill_(~c.mask_n1TQ, float("-inf"))
        out = model(c.ids_nT, routed_experts=c.routed_nTYK if replay else None, replay_min_ratio=ratio,
                    position_ids=c.pos_nT, attention_mask=bias, past_key_values=past,
                    compute_logits=compute_logits, return_key_values=later)
        kv.append(out.key_values)
        outs.append(out)
        replaced += out.replaced_experts
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
