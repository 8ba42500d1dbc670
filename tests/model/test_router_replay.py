"""Router replay: the trainer's forward uses the engine's experts, with the router's own gates."""

import pytest
import torch
import torch.nn.functional as F

from opencomposer.model import KVCache, ModelConfig, Transformer
from opencomposer.model.model import MoE, route


def tiny_model(norm_topk_prob: bool) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=40, moe_intermediate_size=16,
                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                      num_experts=8, num_experts_per_tok=3, norm_topk_prob=norm_topk_prob,
                      decoder_sparse_step=1, mlp_only_layers=[1])
    model = Transformer(cfg)
    with torch.no_grad():
        for layer in model.layers:
            if isinstance(layer.mlp, MoE):
                layer.mlp.gate.weight.normal_(0, 1.0)
    return model


@pytest.mark.parametrize("norm", [True, False])
def test_replaying_the_routers_own_choice_changes_nothing(norm):
    model = tiny_model(norm)
    ids = torch.randint(0, 50, (2, 12))
    out = model(ids, return_routed_experts=True)
    replayed = model(ids, routed_experts=out.routed_experts, return_routed_experts=True)
    assert torch.equal(replayed.logits, out.logits)
    assert torch.equal(replayed.routed_experts, out.routed_experts)
    assert replayed.replaced_experts == 0


@pytest.mark.parametrize("norm", [True, False])
def test_replaying_other_experts_changes_logits_and_trains_the_router(norm):
    model = tiny_model(norm)
    ids = torch.randint(0, 50, (2, 12))
    own = model(ids, return_routed_experts=True).routed_experts
    other = (own + 1) % 8  # a different, still duplicate-free, expert set per token
    out = model(ids, routed_experts=other, return_routed_experts=True)
    assert torch.equal(out.routed_experts, other)
    assert not torch.allclose(out.logits, model(ids).logits)
    F.cross_entropy(out.logits[:, :-1].reshape(-1, 50), ids[:, 1:].reshape(-1)).backward()
    for layer_id in model.config.moe_layers:
        assert model.layers[layer_id].mlp.gate.weight.grad.abs().sum() > 0


def test_gate_weights_follow_the_documented_formula():
    logits_NE = torch.randn(5, 8)
    replay_NK = torch.tensor([[0, 1, 2], [3, 4, 5], [7, 6, 5], [0, 2, 4], [1, 3, 5]])
    w_NK, idx_NK, _ = route(logits_NE, 3, True, replay_NK)
    s_NK = logits_NE.gather(1, replay_NK)
    torch.testing.assert_close(w_NK, torch.softmax(s_NK, -1))  # exp(s_i) / sum_{j in I} exp(s_j)
    w_NK, _, _ = route(logits_NE, 3, False, replay_NK)
    torch.testing.assert_close(w_NK, torch.softmax(logits_NE, -1).gather(1, replay_NK))
    assert torch.equal(idx_NK, replay_NK)


def test_plausibility_threshold_replaces_and_counts():
    # Token 0: probabilities ~ [.40, .30, .20, .07, .03] -> router top-3 = {0, 1, 2}, p_(3) = .20.
    probs = torch.tensor([[0.40, 0.30, 0.20, 0.07, 0.03],
                          [0.40, 0.30, 0.20, 0.07, 0.03]])
    logits_NE = probs.log()
    replay_NK = torch.tensor([[4, 0, 3],    # 4 (.03) and 3 (.07) are < 0.5 * .20 -> replaced by 1, 2
                              [2, 3, 1]])   # 3 (.07) < .10 -> replaced by 0
    w_NK, idx_NK, n = route(logits_NE, 3, True, replay_NK, min_ratio=0.5)
    assert n.item() == 3
    assert idx_NK.tolist() == [[1, 0, 2], [2, 0, 1]]
    # With a lower ratio .07 passes (>= .2 * .20 = .04) but .03 does not.
    _, idx_NK, n = route(logits_NE, 3, True, replay_NK, min_ratio=0.2)
    assert n.item() == 1 and idx_NK.tolist() == [[1, 0, 3], [2, 3, 1]]
    # The model sums the count over tokens and layers.
    model = tiny_model(True)
    ids = torch.randint(0, 50, (1, 6))
    own = model(ids, return_routed_experts=True).routed_experts
    worst = torch.zeros_like(own)
    for j, layer_id in enumerate(model.config.moe_layers):  # replay each token's 3 least likely experts
        captured = []
        hook = model.layers[layer_id].mlp.gate.register_forward_hook(lambda m, i, o: captured.append(o))
        model(ids)
        hook.remove()
        worst[:, :, j] = captured[0].argsort(-1)[:, :3].view(1, 6, 3)
    out = model(ids, routed_experts=worst, replay_min_ratio=1e-9, return_routed_experts=True)
    assert out.replaced_experts == 0  # a tiny ratio keeps everything
    out = model(ids, routed_experts=worst, replay_min_ratio=1.0, return_routed_experts=True)
    assert out.replaced_experts == 6 * 3 * 2  # every replayed expert falls outside the top-3...
    torch.testing.assert_close(out.logits, model(ids).logits)  # ...and the router's top-3 take over


def test_rows_without_replay_use_the_router():
    model = tiny_model(True)
    ids = torch.randint(0, 50, (1, 6))
    own = model(ids, return_routed_experts=True)
    replay = (own.routed_experts + 1) % 8
    replay[0, 2:] = -1  # replay only the first two tokens
    out = model(ids, routed_experts=replay, return_routed_experts=True)
    assert torch.equal(out.routed_experts[0, 2:], own.routed_experts[0, 2:])
    assert torch.equal(out.routed_experts[0, :2], replay[0, :2])
    with pytest.raises(ValueError, match="routed_experts must have shape"):
        model(ids, routed_experts=replay[:, :, :1])


def test_engine_routing_replayed_in_training_reproduces_engine_logprobs():
    """Decode with the cache (as the engine does), then replay its experts in one training forward."""
    model = tiny_model(False).eval()
    ids = torch.randint(0, 50, (2, 10))
    cache = KVCache(model.config, max_slots=2, max_len=10)
    slots = torch.tensor([0, 1])
    logps, experts = [], []
    with torch.inference_mode():
        for t in range(10):
            out = model(ids[:, t:t + 1], cache, slots, return_routed_experts=True)
            cache.advance(slots, 1)
            logps.append(torch.log_softmax(out.logits, -1))
            experts.append(out.routed_experts)
    train = model(ids, routed_experts=torch.cat(experts, 1))
    torch.testing.assert_close(torch.log_softmax(train.logits, -1), torch.cat(logps, 1), atol=1e-5, rtol=1e-4)
