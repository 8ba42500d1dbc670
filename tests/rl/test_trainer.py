"""The trainer step: micro-batches add up to the full-batch gradient, router replay uses the
engine's experts at the right positions, KL-in-reward against the initial weights, the policy
moves toward positive advantages, versions and staleness."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from opencomposer.rl.config import TrainConfig
from opencomposer.engine.engine import Engine
from opencomposer.engine.types import GenerationRequest, SamplingParams
from opencomposer.rl.buffer import Group, Sample
from opencomposer.rl.losses import PolicyLossConfig
from opencomposer.rl.rewards import RewardConfig
from opencomposer.rl.single_turn import sample_from_result
from opencomposer.rl.trainer import Trainer, collate, target_logprobs

from trainer_util import random_groups, tiny_model

NO_KL = RewardConfig(kl_coef=0.0)


def grads_after_step(trainer: Trainer, groups) -> dict[str, torch.Tensor]:
    """Run one step, capturing the gradients the optimiser saw."""
    seen = {}
    step = trainer.optimizer.step

    def capture(*a, **k):
        for name, p in trainer.model.named_parameters():
            if p.grad is not None:
                seen[name] = p.grad.clone()
        return step(*a, **k)

    trainer.optimizer.step = capture
    trainer.step(groups)
    return seen


@pytest.mark.parametrize("aggregation", ["constant", "token_mean", "seq_mean_token_mean"])
def test_micro_batches_give_the_full_batch_gradient(aggregation):
    groups = random_groups()
    loss = PolicyLossConfig(aggregation=aggregation)
    full = grads_after_step(Trainer(tiny_model(), TrainConfig(micro_batch_size=64), loss, reward=NO_KL), groups)
    for mb in (1, 4):
        part = grads_after_step(Trainer(tiny_model(), TrainConfig(micro_batch_size=mb), loss, reward=NO_KL), groups)
        assert full.keys() == part.keys()
        for name in full:
            torch.testing.assert_close(part[name], full[name], rtol=1e-4, atol=1e-7, msg=f"{aggregation} mb={mb} {name}")


def test_token_mean_matches_policy_loss_on_one_batch():
    """With one micro-batch the trainer's token_mean loss is losses.policy_loss's own."""
    from opencomposer.rl.advantages import compute_advantages
    from opencomposer.rl.losses import policy_loss

    groups = random_groups()
    model = tiny_model()
    samples = [s for g in groups for s in g.samples]
    batch = collate(samples, None)
    with torch.no_grad():
        logp = target_logprobs(model(batch.input_ids_BT).logits, batch.target_ids_BT)
    adv = compute_advantages(torch.tensor([s.reward for s in samples], dtype=torch.float64),
                             group_ids=torch.tensor([int(s.group_id[1:]) for s in samples])).float()
    want, _ = policy_loss(logp, batch.behav_logp_BT, adv, batch.mask_BT, PolicyLossConfig(aggregation="token_mean"))
    trainer = Trainer(model, TrainConfig(router_replay=False), PolicyLossConfig(aggregation="token_mean"), reward=NO_KL)
    assert trainer.step(groups)["loss"] == pytest.approx(want.item(), rel=1e-5)


def test_collate_aligns_targets_mask_and_behaviour_logprobs():
    s = Sample([5, 6, 7, 8], [0, 0, 1, 1], [0, 0, -1.5, -2.5], 1.0, "g", "t",
               routed_experts=np.arange(4 * 2 * 2).reshape(4, 2, 2))
    short = Sample([9, 10], [0, 1], [0, -0.5], 0.0, "g", "t")
    b = collate([s, short], (2, 2))
    assert b.input_ids_BT.tolist() == [[5, 6, 7], [9, 0, 0]]
    assert b.target_ids_BT.tolist() == [[6, 7, 8], [10, 0, 0]]
    assert b.mask_BT.tolist() == [[False, True, True], [True, False, False]]
    assert b.behav_logp_BT.tolist() == [[0, -1.5, -2.5], [-0.5, 0, 0]]
    assert b.routed_BTYK[0].tolist() == np.arange(12).reshape(3, 2, 2).tolist()  # input positions 0..2
    assert (b.routed_BTYK[1] == -1).all()  # no routing recorded: the router chooses


def test_sample_validation_names_the_problem():
    with pytest.raises(ValueError, match="loss_mask"):
        Sample([1, 2, 3], [0, 1], [0, 0, 0], 0.0, "g", "t")
    with pytest.raises(ValueError, match="token 0"):
        Sample([1, 2], [1, 1], [0, 0], 0.0, "g", "t")
    with pytest.raises(ValueError, match="routed_experts"):
        Sample([1, 2], [0, 1], [0, 0], 0.0, "g", "t", routed_experts=np.zeros((3, 2, 2)))


def engine_groups(model, n_prompts=2, G=4, max_new=12):
    """Real engine rollouts of `model` (seeded), as Groups with routed experts."""
    engine = Engine(copy.deepcopy(model), max_slots=16, max_len=64)
    reqs = [GenerationRequest([1, 17 + p, 300 + p], SamplingParams(max_new_tokens=max_new, seed=10 * p + j),
                              return_routed_experts=True, return_prompt_routed_experts=True)
            for p in range(n_prompts) for j in range(G)]
    results = engine.generate_batch(reqs)
    engine.stop()
    cfg = model.config
    shape = (len(cfg.moe_layers), cfg.num_experts_per_tok)
    groups = []
    for p in range(n_prompts):
        samples = [sample_from_result(r, float(j), f"g{p}", f"t{p}", shape)  # distinct rewards: no sample skipped
                   for j, r in enumerate(results[p * G:(p + 1) * G])]
        groups.append(Group(f"g{p}", f"t{p}", samples))
    return groups


def test_replayed_experts_are_the_engines_at_every_input_position():
    model = tiny_model()
    groups = engine_groups(model)
    s = groups[0].samples[0]
    b = collate([s], (len(model.config.moe_layers), model.config.num_experts_per_tok))
    assert (b.routed_BTYK >= 0).all()  # every input position has the engine's routing
    own = model.eval()(b.input_ids_BT, return_routed_experts=True).routed_experts
    # same weights, full recompute: the router picks what the engine picked (as a set per token)
    assert torch.equal(own.sort(-1).values, b.routed_BTYK.sort(-1).values)


def test_router_replay_lowers_the_train_inference_mismatch():
    engine_model = tiny_model()
    groups = engine_groups(engine_model)
    drifted = copy.deepcopy(engine_model)  # the trainer's router differs from the engine's (numerics, bf16...)
    with torch.no_grad():
        for layer in drifted.layers:
            layer.mlp.gate.weight.add_(torch.randn_like(layer.mlp.gate.weight) * 0.05)
    m_replay = Trainer(copy.deepcopy(drifted), TrainConfig(replay_min_ratio=None), reward=NO_KL).step(groups)
    m_free = Trainer(copy.deepcopy(drifted), TrainConfig(router_replay=False), reward=NO_KL).step(groups)
    assert m_replay["mismatch/abs_logp_diff"] < 0.5 * m_free["mismatch/abs_logp_diff"]
    assert m_replay["replay/replaced_experts"] == 0
    # the plausibility rule at its strictest swaps the replayed experts the drifted router dislikes
    m_strict = Trainer(copy.deepcopy(drifted), TrainConfig(replay_min_ratio=1.0), reward=NO_KL).step(groups)
    assert m_strict["replay/replaced_experts"] > 0 and 0 < m_strict["replay/replaced_frac"] < 1
    m_same = Trainer(copy.deepcopy(engine_model), TrainConfig(replay_min_ratio=1.0), reward=NO_KL).step(groups)
    assert m_same["replay/replaced_experts"] == 0 and m_same["mismatch/abs_logp_diff"] < 1e-4


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3"])
def test_a_step_raises_the_logprob_of_positive_advantage_samples(arch):
    dense = dict(num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0, tie_word_embeddings=True)
    model = tiny_model(**(dense if arch == "qwen3" else {}))
    assert model.config.arch == arch
    groups = engine_groups(model, n_prompts=1, G=4)
    samples = groups[0].samples
    for i, s in enumerate(samples):
        s.reward = 1.0 if i < 2 else 0.0
    b = collate(samples, None)

    def seq_logp():
        with torch.no_grad():
            lp = target_logprobs(model(b.input_ids_BT).logits, b.target_ids_BT)
        return (lp * b.mask_BT).sum(-1)

    before = seq_logp()
    trainer = Trainer(model, TrainConfig(optim={"lr": 1e-3}), reward=NO_KL)
    m = trainer.step(groups)
    delta = seq_logp() - before
    assert delta[:2].min() > 0 > delta[2:].max()
    assert trainer.version == 1 and m["policy_version"] == 1
    assert m["advantage/abs_mean"] == pytest.approx(0.5)


def test_kl_in_reward_uses_the_initial_weights_and_beta():
    model = tiny_model()
    groups = random_groups()
    beta = 0.1
    trainer = Trainer(model, TrainConfig(router_replay=False), reward=RewardConfig(kl_coef=beta))
    assert trainer.ref_model is not None and not any(p.requires_grad for p in trainer.ref_model.parameters())
    samples = [s for g in groups for s in g.samples]
    b = collate(samples, None)
    with torch.no_grad():
        ref = target_logprobs(tiny_model()(b.input_ids_BT).logits, b.target_ids_BT)
    k1 = ((b.behav_logp_BT - ref) * b.mask_BT).sum(-1)  # k1 = log μ − log π_ref per token
    m = trainer.step(groups)
    assert m["reward/kl"] == pytest.approx((-beta * k1).mean().item(), rel=1e-5)
    # the reference stays the initial model while the policy moves
    trainer.step(groups)
    assert all(torch.equal(p, q) for p, q in zip(trainer.ref_model.parameters(), tiny_model().parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(trainer.model.parameters(), tiny_model().parameters()))
    assert Trainer(tiny_model(), reward=NO_KL).ref_model is None  # β = 0: no reference model at all


def test_staleness_is_trainer_version_minus_sample_version():
    trainer = Trainer(tiny_model(), TrainConfig(router_replay=False), reward=NO_KL, version=5)
    groups = random_groups(versions=3)
    groups[1].samples[0].policy_versions[groups[1].samples[0].loss_mask] = 1
    m = trainer.step(groups)
    assert m["staleness/max"] == 4 and m["staleness/mean"] == pytest.approx((5 * 2 + 4) / 6)
    assert trainer.version == 6


@pytest.mark.parametrize("off_policy", ["truncated_is", "masked_is", "decoupled"])
def test_off_policy_corrections_run_and_report_is_stats(off_policy):
    m = Trainer(tiny_model(), TrainConfig(router_replay=False), PolicyLossConfig(off_policy=off_policy),
                reward=NO_KL).step(random_groups())
    assert np.isfinite(m["loss"]) and np.isfinite(m["grad_norm"])
    if off_policy != "masked_is":
        assert m["is_weight_max"] >= m["is_weight_mean"] >= m["is_weight_min"] > 0


def test_train_frozen_prefixes_keep_those_tensors_fixed_and_typos_are_named():
    from opencomposer.errors import ConfigError

    model = tiny_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = Trainer(model, TrainConfig(frozen=["embed_tokens", "lm_head"], optim={"lr": 1e-2}), reward=NO_KL)
    trainer.step(random_groups())
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) == n.startswith(("embed_tokens", "lm_head")), n
    with pytest.raises(ConfigError, match="embeddings"):
        Trainer(tiny_model(), TrainConfig(frozen=["embeddings"]), reward=NO_KL)


def test_frozen_parameters_are_not_optimised():
    model = tiny_model()
    model.embed_tokens.weight.requires_grad_(False)
    before = model.embed_tokens.weight.clone()
    Trainer(model, TrainConfig(router_replay=False), reward=NO_KL).step(random_groups())
    assert torch.equal(model.embed_tokens.weight, before)


def test_loss_metrics_do_not_depend_on_micro_batching():
    groups = random_groups()
    one = Trainer(tiny_model(), TrainConfig(micro_batch_size=64, router_replay=False), reward=NO_KL).step(groups)
    many = Trainer(tiny_model(), TrainConfig(micro_batch_size=2, router_replay=False), reward=NO_KL).step(groups)
    for k in ("loss", "pg_loss", "mismatch/abs_logp_diff", "mismatch/kl_k3", "entropy", "ratio_mean", "grad_norm"):
        assert many[k] == pytest.approx(one[k], rel=1e-4, abs=1e-9), k


def test_a_summarized_episode_counts_once_in_its_group_mean():
    """Episode A (2 segments, reward 1) and B (1 segment, reward 0): Dr. GRPO gives A's segments
    +0.5 and B −0.5, not the per-sample 1/3 and −2/3; the KL term sums over A's segments."""
    from opencomposer.rl.advantages import AdvantageConfig
    from opencomposer.rl.trainer import trajectory_advantages

    def seg(reward, traj):
        return Sample(token_ids=[1, 2, 3], loss_mask=[0, 1, 1], behav_logprobs=[0, -1, -1],
                      reward=reward, group_id="g", task_id="t", info={"trajectory_id": traj})

    samples = [seg(1.0, "A"), seg(1.0, "A"), seg(0.0, "B")]
    gid = torch.zeros(3, dtype=torch.long)
    adv = trajectory_advantages(samples, torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64), gid, AdvantageConfig())
    assert adv.tolist() == pytest.approx([0.5, 0.5, -0.5])
    # KL terms −0.1 on each of A's segments: r_A = 1 − 0.2 = 0.8, r_B = 0 → A +0.4, B −0.4
    adv = trajectory_advantages(samples, torch.tensor([0.9, 0.9, 0.0], dtype=torch.float64), gid, AdvantageConfig())
    assert adv.tolist() == pytest.approx([0.4, 0.4, -0.4])
    # without trajectory ids every sample is its own trajectory
    for s in samples:
        s.info.clear()
    adv = trajectory_advantages(samples, torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64), gid, AdvantageConfig())
    assert adv.tolist() == pytest.approx([1 / 3, 1 / 3, -2 / 3])


def test_zero_advantage_samples_are_skipped_without_changing_the_step():
    """A degenerate group (equal rewards) has advantage 0 and is not run; the gradient is still
    that of policy_loss over the whole batch (normalisers of the whole batch)."""
    from opencomposer.rl.advantages import compute_advantages
    from opencomposer.rl.losses import policy_loss

    groups = random_groups(n_groups=3, G=3)
    for s in groups[1].samples:
        s.reward = 1.0
    samples = [s for g in groups for s in g.samples]
    for agg in ("constant", "token_mean", "seq_mean_token_mean"):
        cfg = PolicyLossConfig(aggregation=agg)
        model = tiny_model()
        batch = collate(samples, None)
        adv = compute_advantages(torch.tensor([s.reward for s in samples], dtype=torch.float64),
                                 group_ids=torch.tensor([int(s.group_id[1:]) for s in samples])).float()
        assert (adv[3:6] == 0).all()
        logp = target_logprobs(model(batch.input_ids_BT).logits, batch.target_ids_BT)
        policy_loss(logp, batch.behav_logp_BT, adv, batch.mask_BT, cfg)[0].backward()
        want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        trainer = Trainer(tiny_model(), TrainConfig(router_replay=False, micro_batch_size=2, optim={"grad_clip": None}),
                          cfg, reward=NO_KL)
        got = grads_after_step(trainer, groups)
        assert trainer.steps == 1 and got.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-7, msg=f"{agg} {name}")
    m = Trainer(tiny_model(), TrainConfig(), reward=NO_KL).step(groups)
    assert m["samples/skipped_zero_advantage"] == 3 and m["groups/degenerate_frac"] == pytest.approx(1 / 3)
    all_tied = random_groups(n_groups=1, G=3)
    for s in all_tied[0].samples:
        s.reward = 0.0
    m = Trainer(tiny_model(), TrainConfig(), reward=NO_KL).step(all_tied)  # nothing to run: a step all the same
    assert m["samples/skipped_zero_advantage"] == 3 and m["policy_version"] == 1 and m["grad_norm"] == 0


def test_warmup_ramps_the_learning_rate_linearly_then_holds():
    trainer = Trainer(tiny_model(), TrainConfig(optim={"lr": 1e-3, "warmup_steps": 4}), reward=NO_KL)
    lrs = [trainer.step(random_groups(seed=i))["lr"] for i in range(5)]
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
    decay = Trainer(tiny_model(), TrainConfig(max_steps=6, optim={"lr": 1e-3, "warmup_steps": 2, "min_lr_ratio": 0.1}),
                    reward=NO_KL)
    assert [decay.lr_at(s) for s in range(7)] == pytest.approx(
        [5e-4, 1e-3, 1e-3, 1e-4 + 9e-4 * 0.75, 1e-4 + 9e-4 * 0.25, 1e-4, 1e-4])


def test_bfloat16_step_follows_the_float32_step_and_keeps_float32_weights():
    """train.dtype=bfloat16 autocasts the forward/backward (packed and padded paths): the step's gradients
    point where float32's do, the logprobs stay near the float32 engine's, and the weights stay float32."""
    model = tiny_model()
    groups = engine_groups(model)
    for packed in (True, False):
        cfgs = {d: TrainConfig(dtype=d, pack_prefixes=packed) for d in ("float32", "bfloat16")}
        steps = {d: Trainer(copy.deepcopy(model), c, reward=NO_KL) for d, c in cfgs.items()}
        grads = {d: grads_after_step(t, groups) for d, t in steps.items()}
        for name, g32 in grads["float32"].items():
            g16 = grads["bfloat16"][name]
            cos = torch.nn.functional.cosine_similarity(g16.flatten(), g32.flatten(), dim=0)
            assert cos > 0.98, f"packed={packed} {name}: cosine {cos:.3f}"
        assert all(p.dtype == torch.float32 for p in steps["bfloat16"].model.parameters())
        m = Trainer(copy.deepcopy(model), cfgs["bfloat16"], reward=NO_KL).step(groups)
        # bfloat16's rounding shows in the mismatch (float32's is ~1e-7), and stays small
        assert 1e-5 < m["mismatch/abs_logp_diff"] < 0.05, m["mismatch/abs_logp_diff"]
