"""`opencomposer model new`: a small random checkpoint with a real vocabulary and a real model's chat format.

    opencomposer model new --arch {qwen3,qwen3_moe} --vocab {qwen,deepseek,bundled}
                           --format {opencomposer,qwen3,qwen3_coder} [--config F] [--set key=value ...] --out DIR

For tests, demos and users who want a tiny copy of a real model's interface: DIR gets config.json
(Qwen3ForCausalLM or Qwen3MoeForCausalLM), safetensors, tokenizer.json + tokenizer_config.json with
the format's chat template, generation_config.json and opencomposer.json (model/export.py), so
`transformers.AutoModelForCausalLM` / `AutoTokenizer`, vLLM and `opencomposer eval --policy engine:DIR`
load it as they would the real model.

The vocabulary is model/vocab.py's; a format's structure tokens that it lacks are added as special
tokens after its last id (opencomposer's format on Qwen's vocabulary gains <|bos|>, <|system|>, ...).
The sizes are `SIZES[arch]` (a 2-layer model of width 64, a few million parameters, nearly all in the
embedding and head), then `--config` (a YAML of ModelConfig keys, e.g. configs/model/tiny.yaml), then
each `--set key=value` (a YAML scalar: `--set num_hidden_layers=4 --set tie_word_embeddings=false`).
vocab_size defaults to Qwen3's padded 151,936 for the Qwen vocabulary and to the tokenizer's size
rounded up to a multiple of 64 otherwise; a smaller one stops with the fix. Weights are normal(0,
initializer_range) from `seed`, so the model's output is noise: it exercises the interface, not skill.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from opencomposer.config import apply_overrides, read_yaml
from opencomposer.errors import ConfigError
from opencomposer.model.config import ARCHS, ModelConfig
from opencomposer.model.export import check_tokenizer, structure_tokens
from opencomposer.model.hf import save_pretrained
from opencomposer.model.model import Transformer
from opencomposer.model.tokenizer import BOS, Tokenizer
from opencomposer.model.vocab import QWEN3_VOCAB_SIZE, VOCABS, load_vocab, with_structure_tokens

_COMMON = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
               max_position_embeddings=40960)  # Qwen3's theta and context
SIZES: dict[str, dict[str, Any]] = {
    "qwen3": {**_COMMON, "tie_word_embeddings": True},  # as Qwen3-0.6B
    "qwen3_moe": {**_COMMON, "tie_word_embeddings": False, "num_experts": 8, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 32, "norm_topk_prob": True},  # as Qwen3-30B-A3B, in miniature
}


def new_tokenizer(vocab: str, chat_format: str) -> tuple[Tokenizer, list[str]]:
    """The vocabulary with `chat_format`'s structure tokens (those it lacks added); (tokenizer, added)."""
    tok = load_vocab(vocab)
    added = with_structure_tokens(tok, structure_tokens(chat_format), chat_format)
    if chat_format == "opencomposer" and tok.bos_id is None:  # the format starts every conversation with it
        tok.add_special_tokens([], bos=BOS)
    return tok, added


def new_config(arch: str, tok: Tokenizer, vocab: str, config_file: str | Path | None = None,
               overrides: Sequence[str] = ()) -> ModelConfig:
    if arch not in SIZES:
        raise ConfigError(f"unknown --arch {arch!r}; known: {', '.join(SIZES)} ({', '.join(ARCHS.values())})")
    raw: dict[str, Any] = dict(SIZES[arch])
    raw["vocab_size"] = QWEN3_VOCAB_SIZE if vocab == "qwen" else -(-tok.vocab_size // 64) * 64
    if config_file is not None:
        raw.update(read_yaml(config_file))
    apply_overrides(raw, list(overrides))
    cfg = ModelConfig.from_dict(raw)
    if cfg.arch != arch:
        raise ConfigError(f"--arch {arch} but the sizes given make a {cfg.arch} model (num_experts="
                          f"{cfg.num_experts}); set num_experts {'> 0' if arch == 'qwen3_moe' else '= 0'} or change --arch")
    return cfg


def new_checkpoint(out: str | Path, *, arch: str, vocab: str, chat_format: str,
                   config_file: str | Path | None = None, overrides: Sequence[str] = (), seed: int = 0) -> dict:
    """Write the checkpoint of the module docstring into `out`; returns a summary (what the command prints)."""
    if vocab not in VOCABS:
        raise ConfigError(f"unknown --vocab {vocab!r}; known: {', '.join(VOCABS)}")
    tok, added = new_tokenizer(vocab, chat_format)
    cfg = new_config(arch, tok, vocab, config_file, overrides)
    check_tokenizer(tok, cfg, "--set vocab_size")
    torch.manual_seed(seed)
    model = Transformer(cfg).eval()
    save_pretrained(model, out, tokenizer=tok)
    return {"out": str(out), "arch": arch, "architecture": ARCHS[arch], "vocab": vocab, "format": chat_format,
            "vocab_size": cfg.vocab_size, "tokenizer_ids": tok.vocab_size, "added_tokens": added,
            "parameters": sum(p.numel() for p in model.parameters()), "seed": seed}
