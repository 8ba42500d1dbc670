"""Parity with transformers' Qwen3MoeForCausalLM, and HF checkpoint I/O errors.

transformers is a test dependency only. Router weights are drawn with std 1 so that the
top-k is well separated and float rounding cannot flip a choice.
"""

import copy
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from opencomposer.errors import CheckpointError
from opencomposer.model import ModelConfig, Transformer, load_pretrained, save_pretrained
from opencomposer.model.model import MoE

from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

BASE = dict(vocab_size=67, hidden_size=32, intermediate_size=40, moe_intermediate_size=16,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            num_experts=6, num_experts_per_tok=2, max_position_embeddings=64)
CONFIGS = {
    "topk-norm+dense-layer+yarn+tied": dict(norm_topk_prob=True, mlp_only_layers=[1], tie_word_embeddings=True,
                                            rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                          "original_max_position_embeddings": 16}),
    "no-norm+sparse-step+mqa+bias": dict(norm_topk_prob=False, decoder_sparse_step=2, num_hidden_layers=4,
                                         num_key_value_heads=1, attention_bias=True, rope_theta=500.0),
    "mha+wide-heads+yarn-options+top1": dict(num_key_value_heads=4, head_dim=12, num_experts_per_tok=1,
                                             norm_topk_prob=True,
                                             rope_scaling={"rope_type": "yarn", "factor": 2.0, "beta_fast": 16,
                                                           "beta_slow": 2, "truncate": False,
                                                           "original_max_position_embeddings": 32}),
    "all-experts+mscale": dict(num_experts=4, num_experts_per_tok=4, norm_topk_prob=False,
                               rope_scaling={"rope_type": "yarn", "factor": 8.0, "mscale": 1.0,
                                             "mscale_all_dim": 0.5, "original_max_position_embeddings": 8}),
}


def spread_routers(moe_blocks) -> None:
    with torch.no_grad():
        for block in moe_blocks:
            block.gate.weight.normal_(0, 1.0)


def hf_routed(hf_model, ids) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' logits and its router's top-k per MoE layer, [B, T, Y, K]."""
    chosen, hooks = [], []
    for layer in hf_model.model.layers:
        if hasattr(layer.mlp, "gate"):
            hooks.append(layer.mlp.gate.register_forward_hook(lambda m, i, o: chosen.append(o[2])))
    with torch.no_grad():
        logits = hf_model(ids).logits
    for h in hooks:
        h.remove()
    B, T = ids.shape
    return logits, torch.stack(chosen, dim=1).view(B, T, len(chosen), -1)


def ids_for(cfg, T=40):
    return torch.randint(0, cfg["vocab_size"], (2, T), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("name", CONFIGS)
def test_transformers_checkpoint_loads_with_same_logits_and_experts(name, tmp_path):
    kw = copy.deepcopy({**BASE, **CONFIGS[name]})  # transformers edits rope dicts in place
    torch.manual_seed(0)
    hf = Qwen3MoeForCausalLM(Qwen3MoeConfig(**kw)).eval()
    spread_routers(layer.mlp for layer in hf.model.layers if hasattr(layer.mlp, "gate"))
    hf.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path)
    ids = ids_for(kw)
    hf_logits, hf_experts = hf_routed(hf, ids)
    with torch.no_grad():
        out = ours(ids, return_routed_experts=True)
    torch.testing.assert_close(out.logits, hf_logits, atol=1e-4, rtol=0)
    assert torch.equal(out.routed_experts.long(), hf_experts)


@pytest.mark.parametrize("name", CONFIGS)
def test_our_checkpoint_loads_in_transformers_with_same_logits_and_experts(name, tmp_path):
    kw = copy.deepcopy({**BASE, **CONFIGS[name]})  # transformers edits rope dicts in place
    torch.manual_seed(1)
    ours = Transformer(ModelConfig(**kw, num_mtp_modules=2)).eval()
    spread_routers(layer.mlp for layer in ours.layers if isinstance(layer.mlp, MoE))
    save_pretrained(ours, tmp_path)
    hf = Qwen3MoeForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = ids_for(kw)
    hf_logits, hf_experts = hf_routed(hf, ids)
    with torch.no_grad():
        out = ours(ids, return_routed_experts=True)
    torch.testing.assert_close(hf_logits, out.logits, atol=1e-4, rtol=0)
    assert torch.equal(out.routed_experts.long(), hf_experts)


def test_roundtrip_keeps_mtp_and_shared_expert_and_shards(tmp_path):
    torch.manual_seed(2)
    cfg = ModelConfig(**BASE, num_mtp_modules=2, shared_expert_intermediate_size=24)
    model = Transformer(cfg).eval()
    save_pretrained(model, tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((tmp_path / s).is_file() for s in shards)
    assert "model.layers.0.mlp.experts.5.up_proj.weight" in index["weight_map"]
    assert "mtp.1.eh_proj.weight" in index["weight_map"]
    loaded = load_pretrained(tmp_path)
    assert loaded.config == cfg
    ids = ids_for(BASE)
    with torch.no_grad():
        a, b = model(ids), loaded(ids)
        assert torch.equal(a.logits, b.logits)
        assert all(torch.equal(x, y) for x, y in zip(model.mtp_logits(ids, a.hidden), loaded.mtp_logits(ids, b.hidden)))
    bf16 = load_pretrained(tmp_path, dtype=torch.bfloat16)
    assert bf16.embed_tokens.weight.dtype == torch.bfloat16
    assert bf16(ids).logits.argmax(-1).eq(a.logits.argmax(-1)).float().mean() > 0.9


def test_stacked_experts_on_disk_are_accepted(tmp_path):
    torch.manual_seed(3)
    model = Transformer(ModelConfig(**BASE)).eval()
    save_pretrained(model, tmp_path)
    (shard,) = tmp_path.glob("model-*.safetensors")
    tensors = {k: v for k, v in load_file(shard).items() if ".experts." not in k}
    for i, layer in enumerate(model.layers):
        tensors[f"model.layers.{i}.mlp.experts.gate_up_proj"] = layer.mlp.experts.gate_up_proj.detach().clone()
        tensors[f"model.layers.{i}.mlp.experts.down_proj"] = layer.mlp.experts.down_proj.detach().clone()
    (tmp_path / "model.safetensors.index.json").unlink()
    shard.unlink()
    save_file(tensors, tmp_path / "model.safetensors")
    ids = ids_for(BASE)
    assert torch.equal(load_pretrained(tmp_path)(ids).logits, model(ids).logits)


# ---- bad checkpoints ----------------------------------------------------------------------

@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(4)
    save_pretrained(Transformer(ModelConfig(**BASE)), tmp_path)
    (shard,) = tmp_path.glob("model-*.safetensors")
    return tmp_path, shard


def edit_tensors(shard, fn):
    tensors = load_file(shard)
    fn(tensors)
    save_file(tensors, shard, metadata={"format": "pt"})
    index_file = shard.parent / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    index["weight_map"] = dict.fromkeys(tensors, shard.name)
    index_file.write_text(json.dumps(index))


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        load_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="not a directory"):
        load_pretrained(tmp_path / "nope")


def test_bad_config_json(saved):
    path, _ = saved
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    with pytest.raises(CheckpointError, match="model_type is 'llama'"):
        load_pretrained(path)
    (path / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "num_experts"}))
    with pytest.raises(CheckpointError, match="num_experts"):
        load_pretrained(path)


def test_missing_unexpected_and_misshapen_tensors(saved):
    path, shard = saved
    edit_tensors(shard, lambda t: t.pop("model.layers.2.mlp.experts.3.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"'model.layers.2.mlp.experts.3.up_proj.weight' is missing"):
        load_pretrained(path)
    edit_tensors(shard, lambda t: t.update({"model.layers.2.mlp.experts.3.up_proj.weight": torch.zeros(16, 32),
                                            "model.layers.9.extra.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensor\(s\) \['model.layers.9.extra.weight'\]"):
        load_pretrained(path)
    edit_tensors(shard, lambda t: (t.pop("model.layers.9.extra.weight"),
                                   t.update({"model.norm.weight": torch.zeros(31)})))
    with pytest.raises(CheckpointError, match=r"'model.norm.weight' has shape \[31\], config.json implies \[32\]"):
        load_pretrained(path)


@pytest.mark.parametrize("rope_scaling", [
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},  # Qwen3's long-context recipe
    {"rope_type": "yarn", "factor": 2.5, "beta_fast": 16, "beta_slow": 2, "truncate": False,
     "original_max_position_embeddings": 4096},
    {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
    {"rope_type": "yarn", "factor": 8.0, "attention_factor": 1.3, "original_max_position_embeddings": 2048},
    None,
])
def test_rope_frequencies_match_transformers(rope_scaling):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeRotaryEmbedding

    from opencomposer.model.model import rope_frequencies

    kw = dict(BASE, head_dim=128, num_attention_heads=2, rope_theta=1e6, max_position_embeddings=131072,
              rope_scaling=copy.deepcopy(rope_scaling))
    inv_freq, scale = rope_frequencies(ModelConfig(**kw))
    hf_cfg = Qwen3MoeConfig(**copy.deepcopy(kw))
    if rope_scaling is None:
        hf_inv, hf_scale = Qwen3MoeRotaryEmbedding.compute_default_rope_parameters(hf_cfg)
    else:
        hf_inv, hf_scale = ROPE_INIT_FUNCTIONS["yarn"](hf_cfg, "cpu")
    assert torch.equal(inv_freq, hf_inv) and scale == pytest.approx(hf_scale, rel=1e-12)


# ---- Qwen3 dense ---------------------------------------------------------------------------

DENSE = dict(vocab_size=67, hidden_size=32, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
DENSE_CONFIGS = {
    "tied": dict(tie_word_embeddings=True),
    "untied+bias+yarn": dict(tie_word_embeddings=False, attention_bias=True, rope_theta=500.0,
                             rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
}


@pytest.mark.parametrize("name", DENSE_CONFIGS)
def test_qwen3_dense_checkpoint_parity_both_directions(name, tmp_path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    kw = copy.deepcopy({**DENSE, **DENSE_CONFIGS[name]})
    torch.manual_seed(5)
    hf = Qwen3ForCausalLM(Qwen3Config(**copy.deepcopy(kw))).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours = load_pretrained(tmp_path / "hf")
    assert ours.config.arch == "qwen3" and ours.config.moe_layers == []
    assert ours.config.tie_word_embeddings == kw["tie_word_embeddings"]
    ids = ids_for(kw)
    with torch.no_grad():
        hf_logits = hf(ids).logits
        out = ours(ids, return_routed_experts=True)
    torch.testing.assert_close(out.logits, hf_logits, atol=1e-4, rtol=0)
    assert out.routed_experts.shape == (2, ids.shape[1], 0, 0)  # nothing to replay

    torch.manual_seed(6)
    ours = Transformer(ModelConfig(**kw, num_mtp_modules=1)).eval()
    save_pretrained(ours, tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["architectures"] == ["Qwen3ForCausalLM"] and written["model_type"] == "qwen3"
    assert not {"num_experts", "moe_intermediate_size", "norm_topk_prob"} & set(written)
    hf = Qwen3ForCausalLM.from_pretrained(tmp_path / "ours", dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids).logits, atol=1e-4, rtol=0)
    assert load_pretrained(tmp_path / "ours").config == ours.config


def test_unknown_architecture_names_the_supported_ones(saved):
    path, _ = saved
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen2"}))
    with pytest.raises(CheckpointError, match=r"model_type is 'qwen2'; supported: qwen3_moe, qwen3"):
        load_pretrained(path)
    (path / "config.json").write_text(json.dumps({**cfg, "num_experts": 0}))
    with pytest.raises(CheckpointError, match="write it as model_type qwen3"):
        load_pretrained(path)
