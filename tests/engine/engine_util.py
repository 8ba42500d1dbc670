"""Tiny models for the engine tests (float32, a few thousand parameters: fast on a CPU)."""

from __future__ import annotations

import torch

from opencomposer.model import ModelConfig, Transformer
from opencomposer.model.model import MoE


def tiny_config(**kw) -> ModelConfig:
    base = dict(vocab_size=61, hidden_size=32, intermediate_size=40, moe_intermediate_size=16,
                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                num_experts=6, num_experts_per_tok=2, mlp_only_layers=[1], num_mtp_modules=2)
    return ModelConfig(**{**base, **kw})


def tiny_model(seed: int = 0, **kw) -> Transformer:
    """Random weights, with the router's and the head's scores spread so that near-ties (which
    float rounding could flip between two equivalent computations) are rare."""
    torch.manual_seed(seed)
    model = Transformer(tiny_config(**kw)).eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.3)
        for layer in model.layers:
            if isinstance(layer.mlp, MoE):
                layer.mlp.gate.weight.normal_(0, 1.0)
    return model


def draftable_model(seed: int = 0, alpha: float = 0.05, **kw) -> Transformer:
    """A model whose MTP modules draft well (~60% greedy acceptance at depth 1, 40% at 2), so
    that speculative decoding accepts, rejects and takes bonus tokens.

    The blocks' residual updates are scaled by `alpha`, making the main model nearly a bigram
    model g(t_i) = head(norm(emb(t_i))) with a little context; each MTP module's input
    projection selects the embedding half, so depth d at position i computes ~g(t_{i+d}): the
    same prediction the main model makes one position later.
    """
    torch.manual_seed(seed)
    model = Transformer(tiny_config(**kw)).eval()
    D = model.config.hidden_size
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
        model.embed_tokens.weight.normal_(0, 1.0)
        model.lm_head.weight.normal_(0, 1.0)
        for block in list(model.layers) + [m.block for m in model.mtp]:
            block.self_attn.o_proj.weight.mul_(alpha)
            if isinstance(block.mlp, MoE):
                block.mlp.experts.down_proj.mul_(alpha)
                block.mlp.gate.weight.normal_(0, 1.0)
            else:
                block.mlp.down_proj.weight.mul_(alpha)
        for m in model.mtp:
            m.eh_proj.weight.zero_()
            m.eh_proj.weight[:, D:] = torch.eye(D)
    return model


def prompts(n: int, vocab: int = 61, seed: int = 1, min_len: int = 2, max_len: int = 12) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(min_len, max_len + 1, (n,), generator=g).tolist()
    return [torch.randint(0, vocab, (L,), generator=g).tolist() for L in lens]


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module (the scripts are not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
