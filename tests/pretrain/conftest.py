"""Shared pieces of the pretraining tests: a tiny MoE+MTP run config over a slice of the stdlib."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

TINY_MODEL = {"vocab_size": 4096, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 4,
              "num_experts_per_tok": 2, "norm_topk_prob": True, "max_position_embeddings": 64,
              "num_mtp_modules": 1}


@pytest.fixture(scope="session")
def corpus_cache(tmp_path_factory) -> Path:
    """One tokenized-corpus cache for the whole session (the first run tokenizes ~1.5 MB)."""
    return tmp_path_factory.mktemp("pretrain-cache")


@pytest.fixture
def make_config(tmp_path, corpus_cache):
    """make_config(**top_level_overrides) -> a config dict for a ~0.7M-parameter run in tmp_path."""

    def make(**over) -> dict:
        cfg = {
            "run": {"out_dir": str(tmp_path / "run"), "seed": 0, "num_threads": 1},
            "model": copy.deepcopy(TINY_MODEL),
            "data": {"sources": ["stdlib"], "max_total_bytes": 1_500_000, "val_fraction": 0.1,
                     "cache_dir": str(corpus_cache)},
            "phases": [{"name": "main", "steps": 8, "seq_len": 64, "batch_size": 8, "micro_batch_size": 4,
                        "lr": 3e-3, "warmup_steps": 2}],
            "mtp": {"mode": "distill", "weight": 0.3, "start_step": 0},
            "checkpoint": {"every_steps": 4}, "eval_every": 4, "eval_sequences": 4,
            "log": {"every_steps": 100, "tensorboard": False},
        }
        cfg.update(over)
        return cfg

    return make
