"""Shared-prefix packing: a packed step is the unpacked step (loss, gradients, metrics), with fewer
tokens through the model, for groups that share prompts, generated tokens and routed experts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opencomposer.rl.config import TrainConfig
from opencomposer.rl.buffer import Group, Sample
from opencomposer.training.packing import common_prefix, forward_packed, pack
from opencomposer.rl.rewards import RewardConfig
from opencomposer.rl.trainer import Trainer

from test_trainer import grads_after_step
from trainer_util import tiny_model

Y, K, E = 2, 2, 4  # tiny_model: 2 MoE layers, top-2 of 4


def shared_prefix_groups(n_groups=3, G=4, prefix=40, seed=0, routed=True) -> list[Group]:
    """Each group: a common prompt, then a generated run the G samples share (loss-masked, same
    routing), then per-sample generated tokens of different lengths. One group shares too little."""
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(n_groups):
        shared_len = 5 if 0 < g == n_groups - 1 else prefix  # the last of several is below MIN_SHARED_TOKENS
        head = rng.integers(0, 4096, shared_len)
        gen_shared = rng.integers(0, 4096, 6)
        route_head = rng.integers(0, E, (shared_len + 6, Y, K)).astype(np.int32)
        samples = []
        for i in range(G):
            own = rng.integers(0, 4096, int(rng.integers(3, 12)))
            ids = np.r_[head, gen_shared, own]
            mask = np.r_[np.zeros(shared_len, bool), np.ones(len(ids) - shared_len, bool)]
            behav = np.where(mask, -rng.uniform(7.5, 9.0, len(ids)), 0.0)
            r = None
            if routed:
                r = np.r_[route_head, rng.integers(0, E, (len(own), Y, K)).astype(np.int32)]
                r[:shared_len] = -1  # prompt rows: the engine reported no routing there
                r = r.astype(np.int32)
            samples.append(Sample(ids, mask, behav, float(rng.normal()), f"g{g}", f"t{g}", routed_experts=r,
                                  policy_versions=np.where(mask, 0, -1)))
        groups.append(Group(f"g{g}", f"t{g}", samples))
    return groups


def test_common_prefix_stops_at_the_first_token_or_routing_difference():
    g = shared_prefix_groups(n_groups=1, prefix=40)[0].samples
    ids, routed = [s.token_ids for s in g], [s.routed_experts for s in g]
    assert common_prefix(ids, routed) == 46  # prompt + the shared generated run (inputs only)
    g[1].routed_experts[44, 0, 0] = (g[1].routed_experts[44, 0, 0] + 1) % E
    assert common_prefix(ids, routed) == 44 and common_prefix(ids) == 46  # without replay, routing does not matter
    g[2].token_ids[10] += 1
    assert common_prefix(ids, routed) == 10


def test_packed_rows_reproduce_each_samples_logits():
    groups = shared_prefix_groups()
    samples = [s for grp in groups for s in grp.samples]
    T = max(len(s.token_ids) for s in samples) - 1
    p = pack([s.token_ids for s in samples], [s.group_id for s in samples], T, (Y, K),
             [s.routed_experts for s in samples])
    # no padding: each merged group's prefix once, then every sample's own tokens
    P = [common_prefix([s.token_ids for s in g.samples], [s.routed_experts for s in g.samples]) for g in groups]
    assert p.tokens == sum(len(s.token_ids) - 1 for s in samples) - sum((len(g.samples) - 1) * n
                                                                         for g, n in zip(groups, P) if n >= 16)
    assert p.tokens < sum(len(s.token_ids) - 1 for s in samples)
    assert [s.prefix_length > 0 for s in p.segments].count(True) == 8  # two merged groups of 4
    model = tiny_model().eval()
    with torch.no_grad():
        _, out, _ = forward_packed(model, p, replay=True, replay_min_ratio=None)
        for b, s in enumerate(samples):
            n = len(s.token_ids) - 1
            alone = model(torch.from_numpy(s.token_ids[None, :-1]),
                          routed_experts=torch.from_numpy(s.routed_experts[None, :-1])).logits[0]
            torch.testing.assert_close(out[p.index_BT[b, :n]], alone, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("micro_batch_size", [1, 5, 64])
@pytest.mark.parametrize("kl", [0.0, 0.1])
def test_a_packed_step_equals_the_unpacked_step(micro_batch_size, kl):
    groups = shared_prefix_groups()
    reward = RewardConfig(kl_coef=kl)
    runs = {}
    for packed in (False, True):
        tr = Trainer(tiny_model(), TrainConfig(micro_batch_size=micro_batch_size, pack_prefixes=packed),
                     reward=reward)
        grads = grads_after_step(tr, groups)
        runs[packed] = (grads, tr)
    (g0, t0), (g1, t1) = runs[False], runs[True]
    assert g0.keys() == g1.keys()
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-4, atol=1e-6, msg=name)
    for name, p in t0.model.named_parameters():
        torch.testing.assert_close(dict(t1.model.named_parameters())[name], p, rtol=1e-5, atol=1e-6, msg=name)


def test_packed_step_metrics_match():
    groups = shared_prefix_groups(seed=3)
    m = {packed: Trainer(tiny_model(), TrainConfig(pack_prefixes=packed), reward=RewardConfig(kl_coef=0.0)).step(groups)
         for packed in (False, True)}
    # (replay/replaced_* count computed positions: a shared prefix position once, so they differ)
    for key in ("loss", "pg_loss", "entropy", "mismatch/kl_k3", "mismatch/abs_logp_diff"):
        assert m[True][key] == pytest.approx(m[False][key], rel=1e-4, abs=1e-6), key
    assert m[True]["tokens/generated"] == m[False]["tokens/generated"]
