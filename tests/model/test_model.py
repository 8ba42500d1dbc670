"""The decoder: config validation, the slot KV cache, grouped experts, MTP modules and losses."""

import pytest
import torch
import torch.nn.functional as F

from opencomposer.errors import ConfigError
from opencomposer.model import KVCache, ModelConfig, Transformer
from opencomposer.model.model import MoE
from opencomposer.model.mtp import mtp_loss


def tiny_config(**kw) -> ModelConfig:
    base = dict(vocab_size=61, hidden_size=32, intermediate_size=40, moe_intermediate_size=16,
                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                num_experts=6, num_experts_per_tok=2, mlp_only_layers=[1], num_mtp_modules=2,
                shared_expert_intermediate_size=12)
    return ModelConfig(**{**base, **kw})


def tiny_model(seed=0, **kw) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(tiny_config(**kw)).eval()
    with torch.no_grad():  # spread the router's scores so near-ties do not flip choices
        for layer in model.layers:
            if isinstance(layer.mlp, MoE):
                layer.mlp.gate.weight.normal_(0, 1.0)
    return model


# ---- config -----------------------------------------------------------------------------

@pytest.mark.parametrize("override, words", [
    (dict(num_key_value_heads=3), "num_key_value_heads"),
    (dict(head_dim=7), "head_dim"),
    (dict(num_experts_per_tok=7), "num_experts_per_tok"),
    (dict(mlp_only_layers=[5]), "mlp_only_layers"),
    (dict(hidden_size=0), "hidden_size"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "dynamic"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 2.0, "bogus": 1}), "bogus"),
    (dict(num_mtp_modules=-1), "num_mtp_modules"),
])
def test_invalid_config_names_the_field(override, words):
    with pytest.raises(ConfigError, match=words):
        tiny_config(**override)


def test_config_dicts_roundtrip_and_reject_bad_keys():
    cfg = tiny_config(rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})
    assert cfg.rope_scaling["rope_type"] == "yarn"
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    with pytest.raises(ConfigError, match="hidden_sise"):
        ModelConfig.from_dict({**cfg.to_dict(), "hidden_sise": 3})
    d = cfg.to_dict()
    del d["vocab_size"]
    with pytest.raises(ConfigError, match="vocab_size"):
        ModelConfig.from_dict(d)
    with pytest.raises(ConfigError, match="moe_intermediate_size"):
        ModelConfig.from_hf_dict({k: v for k, v in cfg.to_hf_dict().items() if k != "moe_intermediate_size"})
    with pytest.raises(ConfigError, match="qwen2"):
        ModelConfig.from_hf_dict({**cfg.to_hf_dict(), "model_type": "qwen2"})
    with pytest.raises(ConfigError, match="quantization_config"):
        ModelConfig.from_hf_dict({**cfg.to_hf_dict(), "quantization_config": {}})


def test_transformers5_layout_is_read():
    hf = tiny_config().to_hf_dict()
    hf["num_local_experts"] = hf.pop("num_experts")
    hf.pop("rope_theta"), hf.pop("rope_scaling")
    hf["rope_parameters"] = {"rope_type": "yarn", "factor": 2.0, "rope_theta": 5e5,
                             "original_max_position_embeddings": 128}
    cfg = ModelConfig.from_hf_dict(hf)
    assert (cfg.num_experts, cfg.rope_theta, cfg.rope_scaling["factor"]) == (6, 5e5, 2.0)


def test_hub_config_of_qwen3_30b_a3b():
    """The key set of the Hub's Qwen3-30B-A3B config.json reads, and gives its 30.5B parameters."""
    hub = {"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
           "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
           "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
           "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
           "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": True,
           "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
           "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
           "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
           "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
           "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
           "vocab_size": 151936}
    cfg = ModelConfig.from_hf_dict(hub)
    with torch.device("meta"):
        n_params = sum(p.numel() for p in Transformer(cfg).parameters())
    assert round(n_params / 1e9, 1) == 30.5
    with pytest.raises(ConfigError, match="sliding"):
        ModelConfig.from_hf_dict({**hub, "use_sliding_window": True})


def test_layer_kinds_follow_sparse_step_and_mlp_only_layers():
    cfg = tiny_config(num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3])
    assert cfg.moe_layers == [1, 5]
    model = Transformer(cfg)
    assert [isinstance(layer.mlp, MoE) for layer in model.layers] == [False, True, False, False, False, True]


# ---- experts and the forward ---------------------------------------------------------------

def test_grouped_experts_equal_dense_reference():
    model = tiny_model()
    moe = model.layers[0].mlp
    x_BTD = torch.randn(3, 5, 32)
    y_BTD, idx_NK, _ = moe(x_BTD)
    x_ND = x_BTD.reshape(-1, 32)
    probs_NE = torch.softmax(moe.gate(x_ND), -1)
    ref_ND = torch.zeros_like(x_ND)
    for e in range(6):  # every expert on every token, weighted by p_e if e is in the token's top-k
        gate, up = (x_ND @ moe.experts.gate_up_proj[e].T).chunk(2, -1)
        out_ND = (F.silu(gate) * up) @ moe.experts.down_proj[e].T
        chosen_N = (idx_NK == e).any(-1, keepdim=True)
        ref_ND += torch.where(chosen_N, probs_NE[:, e:e + 1], 0) * out_ND
    shared_ND = torch.sigmoid(moe.shared_expert_gate(x_ND)) * moe.shared_expert(x_ND)
    torch.testing.assert_close(y_BTD.reshape(-1, 32), ref_ND + shared_ND, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("unused_expert", [False, True])
def test_grouped_backward_gives_autograds_bits(unused_expert):
    """train_experts.py's one-node backward: the same outputs and gradients, bit for bit, as
    autograd through model.py's per-expert loop (including an expert that gets no rows)."""
    from opencomposer.model.model import grouped_experts
    from opencomposer.model.train_experts import grouped_experts_train

    torch.manual_seed(0)
    experts = tiny_model().layers[0].mlp.experts
    E = experts.gate_up_proj.shape[0]
    x_ND = torch.randn(40, 32, requires_grad=True)
    w_NK = torch.rand(40, 2, requires_grad=True)
    idx_NK = torch.stack([torch.randperm(E - int(unused_expert))[:2] for _ in range(40)])
    gy_ND = torch.randn(40, 32)
    runs = []
    for fast in (False, True):
        params = (x_ND, w_NK, experts.gate_up_proj, experts.down_proj)
        for t in params:
            t.grad = None
        y_ND = (grouped_experts_train(x_ND, w_NK, idx_NK, experts.gate_up_proj, experts.down_proj) if fast
                else grouped_experts(x_ND, w_NK, idx_NK, E, experts.expert))
        (y_ND * gy_ND).sum().backward()
        runs.append([y_ND.detach()] + [t.grad.clone() for t in params])
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    if unused_expert:
        assert not runs[1][3][E - 1].any()


def test_forward_outputs_and_gradients():
    model = tiny_model().train()
    ids = torch.randint(0, 61, (2, 9))
    out = model(ids, return_routed_experts=True)
    assert out.logits.shape == (2, 9, 61) and out.hidden.shape == (2, 9, 32)
    assert out.routed_experts.shape == (2, 9, 2, 2) and out.routed_experts.dtype == torch.int32
    torch.testing.assert_close(out.logits, model.lm_head(out.hidden))
    F.cross_entropy(out.logits[:, :-1].reshape(-1, 61), ids[:, 1:].reshape(-1)).backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if not n.startswith("mtp."))


def test_right_padding_needs_no_mask():
    model = tiny_model()
    ids = torch.randint(0, 61, (1, 7))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(padded).logits[:, :7], model(ids).logits, atol=1e-6, rtol=1e-5)


def test_training_reduces_loss_on_a_fixed_batch():
    model = tiny_model().train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    ids = torch.randint(0, 61, (4, 16))
    losses = []
    for _ in range(30):
        logits = model(ids).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, 61), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


# ---- KV cache -----------------------------------------------------------------------------

@pytest.fixture
def model_and_ids():
    return tiny_model(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}), \
        torch.randint(0, 61, (3, 20), generator=torch.Generator().manual_seed(1))


def test_token_by_token_decoding_equals_full_recompute(model_and_ids):
    model, ids = model_and_ids
    full = model(ids, return_routed_experts=True)
    cache = KVCache(model.config, max_slots=5, max_len=24)
    slots = torch.tensor([4, 0, 2])
    logits, experts = [], []
    with torch.inference_mode():
        for t in range(20):
            out = model(ids[:, t:t + 1], cache, slots, return_routed_experts=True)
            cache.advance(slots, 1)
            logits.append(out.logits)
            experts.append(out.routed_experts)
    torch.testing.assert_close(torch.cat(logits, 1), full.logits, atol=1e-5, rtol=1e-4)
    assert torch.equal(torch.cat(experts, 1), full.routed_experts)
    assert cache.lengths.tolist() == [20, 0, 20, 0, 20]


def test_chunks_in_several_slots_at_different_lengths(model_and_ids):
    model, ids = model_and_ids
    full = model(ids).logits
    cache = KVCache(model.config, max_slots=3, max_len=20)
    slots = torch.tensor([1, 2, 0])
    # Bring the rows to different lengths, one row at a time.
    for row, n in enumerate([3, 7, 12]):
        s = slots[row:row + 1]
        out = model(ids[row:row + 1, :n], cache, s)
        cache.advance(s, n)
        torch.testing.assert_close(out.logits, full[row:row + 1, :n], atol=1e-5, rtol=1e-4)
    # Then one batched call appends 5 tokens to each row, at its own positions.
    starts = [3, 7, 12]
    chunk = torch.stack([ids[r, s:s + 5] for r, s in enumerate(starts)])
    out = model(chunk, cache, slots)
    for r, s in enumerate(starts):
        torch.testing.assert_close(out.logits[r], full[r, s:s + 5], atol=1e-5, rtol=1e-4)


def test_rollback_then_rewrite_is_exact(model_and_ids):
    """Speculative rejection: drafts written past the kept length are overwritten later."""
    model, ids = model_and_ids
    full = model(ids[:1]).logits
    cache = KVCache(model.config, max_slots=1, max_len=20)
    slot = torch.tensor([0])
    model(ids[:1, :6], cache, slot)
    cache.advance(slot, 6)
    model(torch.randint(0, 61, (1, 4)), cache, slot)  # "drafts", all rejected: lengths untouched
    out = model(ids[:1, 6:10], cache, slot)
    torch.testing.assert_close(out.logits, full[:, 6:10], atol=1e-5, rtol=1e-4)


def test_right_padded_rows_in_cached_prefill(model_and_ids):
    model, ids = model_and_ids
    full = model(ids).logits
    cache = KVCache(model.config, max_slots=2, max_len=20)
    slots, lens = torch.tensor([0, 1]), torch.tensor([9, 5])
    batch = ids[:2, :9].clone()
    batch[1, 5:] = 0  # pad row 1
    out = model(batch, cache, slots)
    cache.advance(slots, lens)
    out2 = model(torch.stack([ids[0, 9:12], ids[1, 5:8]]), cache, slots)
    torch.testing.assert_close(out.logits[1, :5], full[1, :5], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out2.logits[0], full[0, 9:12], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out2.logits[1], full[1, 5:8], atol=1e-5, rtol=1e-4)


def test_cache_overflow_is_a_clear_error(model_and_ids):
    model, ids = model_and_ids
    cache = KVCache(model.config, max_slots=1, max_len=8)
    with pytest.raises(ValueError, match="max_len=8"):
        model(ids[:1, :9], cache, torch.tensor([0]))
    with pytest.raises(ValueError, match="both cache and slots"):
        model(ids, cache)


# ---- MTP ----------------------------------------------------------------------------------

def test_mtp_drafting_with_the_cache_matches_training(model_and_ids):
    """The engine's drafting pattern, with deliberately wrong drafts at depth 2: every (hidden,
    real token) position still gets the logits of the training API, because each round's window
    reaches D-1 positions back and rewrites the cache entries that held a draft."""
    model, ids = model_and_ids
    B, T = ids.shape
    D = model.config.num_mtp_modules
    main = model(ids)
    train = model.mtp_logits(ids, main.hidden)
    assert [x.shape for x in train] == [(B, T - 2, 61), (B, T - 3, 61)]
    cache = KVCache(model.config, max_slots=B, max_len=T)
    slots = torch.arange(B)
    hidden, n = [], 0
    for c in (6, 1, 3, 2, 1, 4):  # accepted tokens per round
        out = model(ids[:, n:n + c], cache, slots)
        cache.advance(slots, c)
        hidden.append(out.hidden)
        w = max(0, n - (D - 1))  # window start: D-1 positions before this round's tokens
        h_BTD = torch.cat(hidden, 1)[:, w:n + c]
        logits1, h_BTD = model.mtp_step(1, h_BTD, ids[:, w + 1:n + c + 1], cache, slots)
        torch.testing.assert_close(logits1, train[0][:, w:n + c], atol=1e-5, rtol=1e-4)
        draft = (logits1[:, -1].argmax(-1, keepdim=True) + 1) % 61  # a draft that is surely wrong
        logits2, _ = model.mtp_step(2, h_BTD, torch.cat([ids[:, w + 2:n + c + 1], draft], 1), cache, slots)
        torch.testing.assert_close(logits2[:, :-1], train[1][:, w:n + c - 1], atol=1e-5, rtol=1e-4)
        n += c


def test_mtp_losses():
    model = tiny_model()
    ids = torch.randint(0, 61, (2, 10))
    out = model(ids)
    mtp = model.mtp_logits(ids, out.hidden)
    loss, per_depth = mtp_loss(mtp, ids, mode="ce", weight=0.3)
    ref = [F.cross_entropy(mtp[k - 1].reshape(-1, 61), ids[:, k + 1:].reshape(-1)) for k in (1, 2)]
    torch.testing.assert_close(loss, 0.3 / 2 * (ref[0] + ref[1]))
    mask = torch.ones(2, 10)
    mask[1] = 0
    _, masked = mtp_loss(mtp, ids, mode="ce", loss_mask=mask)
    torch.testing.assert_close(masked[0], F.cross_entropy(mtp[0][0], ids[0, 2:]))
    # Self-distillation is zero when each depth reproduces the main head's logits, and its
    # gradient reaches the MTP modules but not the main model.
    shifted = [out.logits[:, k:10 - 1].detach() for k in (1, 2)]
    zero, _ = mtp_loss(shifted, ids, mode="distill", main_logits=out.logits)
    assert abs(zero.item()) < 1e-6
    loss, _ = mtp_loss(mtp, ids, mode="distill", main_logits=out.logits)
    assert loss.item() > 0
    loss.backward()
    assert model.mtp[0].eh_proj.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="main_logits"):
        mtp_loss(mtp, ids, mode="distill")


def test_committed_yaml_configs_build(tmp_path):
    from pathlib import Path

    for path in sorted(Path(__file__).parents[2].joinpath("configs", "model").glob("*.yaml")):
        cfg = ModelConfig.from_yaml(path)
        assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    bad = tmp_path / "bad.yaml"
    bad.write_text("vocab_size: 10\nhiden_size: 8\n")
    with pytest.raises(ConfigError, match="hiden_size"):
        ModelConfig.from_yaml(bad)


def test_bfloat16_model_keeps_float32_rope_frequencies():
    model = tiny_model()
    pos = torch.tensor([[4000]])
    cos32, _ = model.rope(pos, torch.float32)
    model.to(torch.bfloat16)
    cos16, _ = model.rope(pos, torch.bfloat16)
    torch.testing.assert_close(cos16.float(), cos32, atol=1e-2, rtol=0)  # bf16 rounding of cos, no more
