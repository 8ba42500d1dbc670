"""What a checkpoint carries besides its weights, so that transformers, vLLM and SGLang render and
stop as opencomposer does, and the check that a tokenizer fits its model.

`save_pretrained(model, path, tokenizer=tok)` (hf.py) calls `write_tokenizer_files`, which writes:

    tokenizer.json            the vocabulary (added tokens flagged as their source file flagged them)
    tokenizer_config.json     bos/eos/pad, "chat_format", the format's Jinja "chat_template",
                              "split_special_tokens": false (tokenizer.py says why)
    generation_config.json    eos_token_id: the format's stop ids (its turn end included), bos/pad
                              ids; what transformers' `generate` and vLLM stop on
    opencomposer.json         {"chat_format", "tool_parser", "stop_token_ids"}: the vLLM tool-call
                              parser that reads this format (`vllm serve DIR --enable-auto-tool-choice
                              --tool-call-parser <tool_parser>`), docs/models.md

Every checkpoint the project writes goes through it (pretraining, SFT, RL, MTP distillation,
`opencomposer model new`). The format comes from the tokenizer (`get_format(tok)`, model/chat.py),
which raises CheckpointError naming the missing structure tokens and the fix when the vocabulary
lacks them; `check_tokenizer` adds the vocabulary-size check every command runs when it pairs a
tokenizer with a model. Not covered: SGLang's own tool-parser names (they match vLLM's for
these formats: hermes, qwen3_coder) and sampling defaults (generation_config.json sets none).
"""

from __future__ import annotations

import json
from pathlib import Path

from opencomposer.errors import CheckpointError
from opencomposer.model.chat import format_class, get_format
from opencomposer.model.config import ModelConfig
from opencomposer.model.tokenizer import Tokenizer

GENERATION_CONFIG = "generation_config.json"
OPENCOMPOSER_FILE = "opencomposer.json"


def structure_tokens(name: str) -> tuple[str, ...]:
    """The special strings chat format `name` needs (what `model new` adds to a vocabulary lacking them);
    ConfigError listing the known formats for an unknown name."""
    return tuple(format_class(name).structure_tokens)


def check_tokenizer(tok: Tokenizer, config: ModelConfig, where: str | Path = "the checkpoint") -> None:
    """Stop with the fix when `tok` cannot drive a model of `config`: more ids than the model's
    vocab_size, or a chat format whose structure tokens the vocabulary lacks (get_format raises)."""
    if tok.vocab_size > config.vocab_size:
        raise CheckpointError(
            f"the tokenizer has {tok.vocab_size} ids but the model's vocab_size is {config.vocab_size} ({where}): "
            f"use the tokenizer the model was trained with, or a model with vocab_size >= {tok.vocab_size} "
            f"(opencomposer model new --set vocab_size=...)")
    get_format(tok)


def write_tokenizer_files(tok: Tokenizer, path: str | Path, config: ModelConfig | None = None) -> dict:
    """Write the files of the module docstring into `path`; returns opencomposer.json's content."""
    path = Path(path)
    if config is not None:
        check_tokenizer(tok, config, path)
    fmt = get_format(tok)
    tok.save(path, chat_template=fmt.chat_template())
    stops = [int(i) for i in fmt.stop_token_ids()]
    generation = {"eos_token_id": stops}
    if tok.bos_id is not None:
        generation["bos_token_id"] = tok.bos_id
    if tok.pad_id is not None:
        generation["pad_token_id"] = tok.pad_id
    (path / GENERATION_CONFIG).write_text(json.dumps(generation, indent=2) + "\n")
    meta = {"chat_format": fmt.name, "tool_parser": fmt.tool_parser, "stop_token_ids": stops}
    (path / OPENCOMPOSER_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return meta
