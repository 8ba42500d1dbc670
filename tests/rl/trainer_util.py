"""Shared helpers for the trainer-side RL tests: a tiny MoE that trains in seconds on 2 cores,
random sample groups, and a fast single-turn run config."""

from __future__ import annotations

import numpy as np
import torch
import yaml

from opencomposer.model import ModelConfig, Transformer
from opencomposer.rl.buffer import Group, Sample

TINY_MODEL = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                  num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=256)


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**{**TINY_MODEL, **overrides}))


def write_tiny_model_yaml(directory) -> str:
    path = directory / "tiny_model.yaml"
    path.write_text(yaml.safe_dump(TINY_MODEL))
    return str(path)


def tiny_run_config(out_dir, model_yaml, **sections) -> dict:
    """An RLConfig dict for a fast single-turn run on the tiny model (sections override per key)."""
    cfg = {
        "run": {"out_dir": str(out_dir), "seed": 0},
        "model": {"config": str(model_yaml)},
        "engine": {"max_slots": 32, "max_len": 64},
        "sampling": {"max_new_tokens": 16},
        "data": {"prompts": [f"prompt {i}" for i in range(64)], "group_size": 4, "groups_per_step": 2,
                 "rewards": [{"fn": "opencomposer.rl.single_turn:token_range_fraction",
                              "kwargs": {"lo": 1000, "hi": 1400}}]},
        "train": {"max_steps": 4, "optim": {"lr": 1e-2}},
        "log": {"tensorboard": False, "progress": False},
        "checkpoint": {"every_steps": 2, "keep_last": 2},
    }
    for name, values in sections.items():
        cfg[name] = {**cfg.get(name, {}), **values}
    return cfg


def random_groups(n_groups=2, G=3, seed=0, vocab=4096, versions=0) -> list[Group]:
    """Samples of different lengths (prompt 3-5 tokens, completion 2-9) with random behaviour logprobs."""
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(n_groups):
        samples = []
        for i in range(G):
            P, O = int(rng.integers(3, 6)), int(rng.integers(2, 10))
            ids = rng.integers(0, vocab, P + O)
            mask = np.r_[np.zeros(P, bool), np.ones(O, bool)]
            behav = np.where(mask, -rng.uniform(7.5, 9.0, P + O), 0.0)
            ver = np.where(mask, versions, -1)
            samples.append(Sample(ids, mask, behav, float(rng.normal()), f"g{g}", f"t{g}", policy_versions=ver))
        groups.append(Group(f"g{g}", f"t{g}", samples))
    return groups
