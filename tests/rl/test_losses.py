"""KL estimators, aggregation and the clipped off-policy loss against hand-computed values and gradients."""

import math

import pytest
import torch

from opencomposer.rl.losses import PolicyLossConfig, aggregate, kl, kl_in_loss, kl_in_reward, policy_loss

LN2 = math.log(2)
D = torch.float64


def _leaf(values):
    return torch.tensor(values, dtype=D, requires_grad=True)


# r = exp(ref − logp).  r = 1/2: log r = −ln2.  r = 2: log r = ln2.
# k1 = −log r; k2 = (log r)²/2; k3 = (r − 1) − log r.  d/dlogp: k1' = 1, k2' = −log r, k3' = 1 − r.
@pytest.mark.parametrize("estimator, values, grads", [
    ("k1", [LN2, -LN2, 0.0], [1.0, 1.0, 1.0]),
    ("k2", [LN2**2 / 2, LN2**2 / 2, 0.0], [LN2, -LN2, 0.0]),
    ("k3", [LN2 - 0.5, 1.0 - LN2, 0.0], [0.5, -1.0, 0.0]),
])
def test_kl_estimator_value_and_gradient(estimator, values, grads):
    logp = _leaf([math.log(0.5), math.log(0.25), math.log(0.3)])
    ref = torch.tensor([math.log(0.25), math.log(0.5), math.log(0.3)], dtype=D)
    k = kl(logp, ref, estimator)
    torch.testing.assert_close(k, torch.tensor(values, dtype=D))
    k.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor(grads, dtype=D))


def test_k3_is_accurate_near_r_equal_one_and_unknown_estimator_is_refused():
    logp = torch.tensor([0.0], dtype=D)
    k = kl(logp, torch.tensor([1e-8], dtype=D), "k3")
    assert k.item() == pytest.approx(5e-17, rel=1e-6, abs=0)  # ≈ (log r)²/2; exp(x) − 1 − x would be all rounding
    with pytest.raises(ValueError, match="k1"):
        kl(logp, logp, "k4")


def test_kl_in_reward_sums_masked_tokens_and_is_detached():
    logp = _leaf([[math.log(0.5), math.log(0.25), 0.0]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5), -math.inf]], dtype=D)  # padding holds garbage
    mask = torch.tensor([[True, True, False]])
    s = kl_in_reward(logp, ref, mask)                  # k1: ln2 − ln2 = 0
    assert not s.requires_grad and s.shape == (1,)
    assert s.item() == pytest.approx(0.0, abs=1e-12)
    assert kl_in_reward(logp, ref, mask, "k3").item() == pytest.approx(0.5)  # (ln2 − 0.5) + (1 − ln2)


def test_kl_in_loss_has_gradient_and_no_nan_from_padding():
    logp = _leaf([[math.log(0.5), math.log(0.25), 0.0]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5), -math.inf]], dtype=D)
    mask = torch.tensor([[True, True, False]])
    loss = kl_in_loss(logp, ref, mask, "k3", "token_mean")
    assert loss.item() == pytest.approx(((LN2 - 0.5) + (1 - LN2)) / 2)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.5 / 2, -1.0 / 2, 0.0]], dtype=D))


def test_aggregation_modes():
    L = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
    m = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    assert aggregate(L, m, "token_mean").item() == pytest.approx(21 / 5)
    assert aggregate(L, m, "constant").item() == pytest.approx(21 / 8)          # B·T = 2·4
    assert aggregate(L, m, "constant", norm_tokens=10).item() == pytest.approx(21 / 20)
    assert aggregate(L, m, "seq_mean_token_mean").item() == pytest.approx((1.5 + 6.0) / 2)
    m0 = torch.tensor([[0, 0, 0, 0], [1, 1, 1, 0]])  # a fully masked sequence is left out of the seq mean
    assert aggregate(L, m0, "seq_mean_token_mean").item() == pytest.approx(6.0)
    assert aggregate(L, m0, "token_mean").item() == pytest.approx(6.0)
    assert aggregate(L, m0, "constant").item() == pytest.approx(18 / 8)
    for mode in ("token_mean", "constant", "seq_mean_token_mean"):
        assert aggregate(L, torch.zeros_like(m), mode).item() == 0.0
    with pytest.raises(ValueError, match="token_mean"):
        aggregate(L, m, "sum")


def _clip_case():
    """Seq 0 has A = +1, seq 1 has A = −1; ρ per token chosen to land on each side of [0.8, 1.28]."""
    rho = torch.tensor([[1.5, 0.5, 1.1, 1.0], [0.5, 1.5, 0.9, 1.0]], dtype=D)
    behav = torch.full((2, 4), math.log(0.5), dtype=D)
    logp = (behav + rho.log()).detach().requires_grad_(True)
    behav[:, 3] = math.nan                  # padding may hold garbage: it must not reach the loss or gradient
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]], dtype=torch.bool)
    return logp, behav, torch.tensor([1.0, -1.0], dtype=D), mask


def test_clipped_loss_values_gradients_and_clip_fractions():
    # A=+1: ρ=1.5 → −1.28 (clipped, no grad); ρ=0.5 → −0.5 (unclipped); ρ=1.1 → −1.1
    # A=−1: ρ=0.5 → +0.8 (clipped, no grad); ρ=1.5 → +1.5 (unclipped); ρ=0.9 → +0.9
    # Σ = 0.32 over 6 tokens; dL/dlogp = −A·ρ/6 where unclipped
    logp, behav, adv, mask = _clip_case()
    loss, m = policy_loss(logp, behav, adv, mask, PolicyLossConfig(aggregation="token_mean"))
    assert loss.item() == pytest.approx(0.32 / 6)
    loss.backward()
    expected = torch.tensor([[0.0, -0.5, -1.1, 0.0], [0.0, 1.5, 0.9, 0.0]], dtype=D) / 6  # exact 0 on padding
    torch.testing.assert_close(logp.grad, expected)
    assert m["clip_frac_high"] == pytest.approx(1 / 6)
    assert m["clip_frac_low"] == pytest.approx(1 / 6)
    assert m["ratio_mean"] == pytest.approx(1.0)
    assert m["masked_frac"] == 0.0
    assert m["pg_loss"] == pytest.approx(0.32 / 6)
    # KL(μ‖π_θ) by k3 with r = ρ: mean of (ρ − 1) − log ρ over the 6 tokens
    rhos = [1.5, 0.5, 1.1, 0.5, 1.5, 0.9]
    assert m["kl_behav_k3"] == pytest.approx(sum(r - 1 - math.log(r) for r in rhos) / 6)


@pytest.mark.parametrize("mode, expected", [
    ("token_mean", 0.32 / 6), ("constant", 0.32 / 8), ("seq_mean_token_mean", (-2.88 / 3 + 3.2 / 3) / 2),
])
def test_clipped_loss_every_aggregation(mode, expected):
    logp, behav, adv, mask = _clip_case()
    loss, _ = policy_loss(logp, behav, adv, mask, PolicyLossConfig(aggregation=mode))
    assert loss.item() == pytest.approx(expected)


def test_per_token_advantages_equal_broadcast_sequence_advantages():
    logp, behav, adv, mask = _clip_case()
    a, _ = policy_loss(logp, behav, adv, mask)
    b, _ = policy_loss(logp, behav, adv[:, None].expand(2, 4), mask)
    assert a.item() == pytest.approx(b.item())


def test_old_logp_is_the_ratio_anchor_when_given():
    logp, behav, adv, mask = _clip_case()
    loss, m = policy_loss(logp, behav, adv, mask, old_logp_BT=logp.detach())
    assert m["ratio_mean"] == pytest.approx(1.0) and m["clip_frac_high"] == 0.0
    assert loss.item() == pytest.approx(0.0)  # −A·1 summed: +3 −3


def test_truncated_is_weights_the_clipped_loss_and_is_detached():
    # ρ = logp/old = [1.5, 1.0, 1.2]; s = old/behav = [3, 0.5, 1] → w = min(s, 2) = [2, 0.5, 1]; A = +1
    # L = w·max(−ρ, −clip ρ) = [−2·1.28, −0.5, −1.2] = Σ −4.26; token-mean −1.42
    behav = torch.log(torch.tensor([[0.1, 0.4, 0.3]], dtype=D))
    old = (behav + torch.log(torch.tensor([[3.0, 0.5, 1.0]], dtype=D))).requires_grad_(True)
    logp = (old.detach() + torch.log(torch.tensor([[1.5, 1.0, 1.2]], dtype=D))).requires_grad_(True)
    mask = torch.ones(1, 3, dtype=torch.bool)
    cfg = PolicyLossConfig(off_policy="truncated_is", is_cap=2.0, aggregation="token_mean")
    loss, m = policy_loss(logp, behav, torch.tensor([1.0], dtype=D), mask, cfg, old_logp_BT=old)
    assert loss.item() == pytest.approx(-4.26 / 3)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.5 * 1.0, -1.0 * 1.2]], dtype=D) / 3)
    assert old.grad is None
    assert m["is_truncated_frac"] == pytest.approx(1 / 3)
    assert (m["is_weight_mean"], m["is_weight_min"], m["is_weight_max"]) == pytest.approx((3.5 / 3, 0.5, 2.0))


def test_masked_is_drops_tokens_from_numerator_and_denominator():
    # s = old/behav = [3, 0.4, 1, 2] with [α, β] = [0.5, 2]: tokens 0, 1 dropped; ρ = 1, A = +1
    behav = torch.log(torch.full((1, 4), 0.1, dtype=D))
    old = behav + torch.log(torch.tensor([[3.0, 0.4, 1.0, 2.0]], dtype=D))
    logp = old.clone().requires_grad_(True)
    mask = torch.ones(1, 4, dtype=torch.bool)
    cfg = PolicyLossConfig(off_policy="masked_is", is_mask_low=0.5, is_mask_high=2.0, aggregation="token_mean")
    loss, m = policy_loss(logp, behav, torch.tensor([1.0], dtype=D), mask, cfg, old_logp_BT=old)
    assert loss.item() == pytest.approx(-1.0)                  # −2 / 2 kept tokens, not / 4
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0, -0.5, -0.5]], dtype=D))
    assert m["masked_frac"] == pytest.approx(0.5)
    cfg_c = cfg.model_copy(update={"aggregation": "constant"})
    loss_c, _ = policy_loss(logp, behav, torch.tensor([1.0], dtype=D), mask, cfg_c, old_logp_BT=old)
    assert loss_c.item() == pytest.approx(-2 / 4)              # the constant normaliser does not move


def test_decoupled_objective_clips_around_prox_and_weights_by_prox_over_behav():
    # u = logp/prox = [1.5, 1.0, 0.9]; w = prox/behav = [2, 10, 0.5]; cap 5 drops token 1; A = +1
    # L = [−2·1.28, dropped, −0.5·0.9] → (−2.56 − 0.45)/2 kept = −1.505; grad only on token 2: −0.5·0.9/2
    behav = torch.log(torch.tensor([[0.05, 0.02, 0.4]], dtype=D))
    prox = behav + torch.log(torch.tensor([[2.0, 10.0, 0.5]], dtype=D))
    logp = (prox + torch.log(torch.tensor([[1.5, 1.0, 0.9]], dtype=D))).requires_grad_(True)
    mask = torch.ones(1, 3, dtype=torch.bool)
    cfg = PolicyLossConfig(off_policy="decoupled", decoupled_weight_cap=5.0, aggregation="token_mean")
    loss, m = policy_loss(logp, behav, torch.tensor([1.0], dtype=D), mask, cfg, prox_logp_BT=prox)
    assert loss.item() == pytest.approx(-1.505)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0, -0.225]], dtype=D))
    assert m["masked_frac"] == pytest.approx(1 / 3)
    assert m["clip_frac_high"] == pytest.approx(1 / 2)


def test_kl_in_the_loss_is_added_with_its_coefficient():
    logp, behav, adv, mask = _clip_case()
    ref = behav.nan_to_num()  # r = 1/ρ on the masked tokens
    cfg = PolicyLossConfig(aggregation="token_mean", kl_loss_coef=0.1, kl_loss_estimator="k1")
    loss, m = policy_loss(logp, behav, adv, mask, cfg, ref_logp_BT=ref)
    kl1 = sum(math.log(r) for r in [1.5, 0.5, 1.1, 0.5, 1.5, 0.9]) / 6  # k1 = log ρ
    assert m["kl_ref"] == pytest.approx(kl1)
    assert loss.item() == pytest.approx(0.32 / 6 + 0.1 * kl1)


@pytest.mark.parametrize("cfg, kwargs, match", [
    (PolicyLossConfig(off_policy="truncated_is"), {}, "needs old_logp"),
    (PolicyLossConfig(off_policy="masked_is"), {}, "needs old_logp"),
    (PolicyLossConfig(off_policy="decoupled"), {}, "needs prox_logp"),
    (PolicyLossConfig(), {"prox_logp_BT": "x"}, "only used by"),
    (PolicyLossConfig(kl_loss_coef=0.1), {}, "needs ref_logp"),
    (PolicyLossConfig(), {"ref_logp_BT": "x"}, "kl_loss_coef is 0"),
])
def test_missing_or_unused_inputs_are_refused(cfg, kwargs, match):
    logp, behav, adv, mask = _clip_case()
    kwargs = {k: behav for k in kwargs}
    with pytest.raises(ValueError, match=match):
        policy_loss(logp, behav, adv, mask, cfg, **kwargs)


def test_config_rejects_inverted_mask_bounds():
    with pytest.raises(ValueError, match="is_mask_low"):
        PolicyLossConfig(is_mask_low=2.0, is_mask_high=1.0)


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_minimising_the_loss_moves_logp_with_the_advantage(advantage):
    torch.manual_seed(0)
    logits = torch.randn(5, requires_grad=True)
    token = 2
    before = torch.log_softmax(logits, -1)[token].item()
    behav = torch.tensor([[before]])
    opt = torch.optim.SGD([logits], lr=0.5)
    logp = torch.log_softmax(logits, -1)[token].view(1, 1)
    loss, _ = policy_loss(logp, behav, torch.tensor([advantage]), torch.ones(1, 1, dtype=torch.bool))
    loss.backward()
    opt.step()
    after = torch.log_softmax(logits, -1)[token].item()
    assert (after - before) * advantage > 0
