"""Byte-level BPE tokenizer for code, trained with Hugging Face `tokenizers`.

What it is: the tokenizer the model, the engine, the chat format (model/chat.py), SFT and
RL share. It is a GPT-2-style byte-level BPE (any byte string round-trips: no unknown
token, no normalisation, so tabs, trailing spaces and unicode come back exactly), with a
pre-tokenizer tuned for source code:

- a newline run and the indentation after it form one pre-token (``"\\n        "``), so
  BPE learns indentation levels as single tokens instead of spending one per space;
- a word takes at most one leading non-letter (``" return"``, ``"_name"``, ``".append"``),
  digits split in groups of at most 3 (as in GPT-4's pattern), punctuation runs stay
  together (``"):"``, ``"=="``), other whitespace stays apart.

Special tokens (pad, bos, end-of-text, the chat structure tokens, a few reserved ones)
take ids 0..15 in every tokenizer trained here, whatever its vocabulary size, and are real
added special tokens. Encoding *plain text* never produces them: a user message that
contains the literal string "<|im_end|>" encodes as the ordinary bytes of that string
(`encode_special_tokens`, HF's `split_special_tokens`), which closes prompt injection and
keeps chat encoding append-only. Structure tokens enter a sequence only by id, from
model/chat.py. (The pre-tokenizer also never puts a whole special string into one
pre-token, so BPE merges cannot rebuild one either.)

`code_corpus()` gathers real Python sources from this machine (the standard library by
default), deduplicated by content hash, with per-file and total size caps.
`train_tokenizer()` trains on it (about 12 s for 30 MB and a 4k vocabulary on 2 cores).
The committed asset `assets/tokenizer-4k.json` (4,096 tokens, 3.53 characters per token on
its corpus) was made with
``python -m opencomposer.model.tokenizer --vocab-size 4096 --out opencomposer/model/assets/tokenizer-4k.json``
on the standard library and test suite of the venv's CPython 3.11.7 (1,736 files, 30 MB);
training is deterministic (two runs give the same file). `bundled_tokenizer()` loads it.

Tokenizers from elsewhere (`Tokenizer.load`: any Hugging Face tokenizer.json, with its
tokenizer_config.json): every *added* token is treated as special here, whether or not the file
marks it so. Qwen3's tokenizer.json marks ``<think>``, ``<tool_call>``, ``<tool_response>`` and
their closers as added but not special (so that servers decoding with ``skip_special_tokens``
keep them in the text their tool parsers read); were they not special here, a user message
holding the string "<tool_call>" would encode to the structure token. `save` writes the file's
own flags back unchanged. bos/eos/pad come from tokenizer_config.json (``"bos_token": null``
means none, as Qwen3 has); a missing one is None. The chat format a tokenizer is rendered with
is named in tokenizer_config.json under ``chat_format`` (absent: recognised from a Hub checkpoint's
own chat template, `detect_chat_format`, else ``"opencomposer"``, the format of model/chat.py); model/vocab.py builds the real vocabularies (Qwen, DeepSeek) and adds a format's
structure tokens to a vocabulary that lacks them (`Tokenizer.add_special_tokens`).

What `save` writes for transformers, vLLM and SGLang: tokenizer.json, and tokenizer_config.json
with ``chat_format``, the format's Jinja ``chat_template`` when given, and
``split_special_tokens: false``. False because with true those libraries would split the
template's own structure strings into bytes too; the template itself keeps structure strings in
message text from becoming structure tokens (model/chat.py's formats, docs/models.md), and this
class's `encode` never produces them whatever the file says.

Left out: byte fallback / unknown tokens (not needed with byte-level BPE), fill-in-the-middle
tokens (reserved ids are kept for them), incremental streaming decode, tokenizers without a
tokenizer.json (sentencepiece .model files, tiktoken files: convert them first, as
model/vocab.py does for Qwen's).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sysconfig
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from opencomposer.errors import CheckpointError, ConfigError

# --- special tokens: their order fixes ids 0..15 in every tokenizer trained here ---
PAD = "<|pad|>"
BOS = "<|bos|>"  # starts every document and every conversation
EOS = "<|endoftext|>"  # ends a pretraining document
END = "<|im_end|>"  # ends a chat turn; the engine stops on it
SYSTEM, USER, ASSISTANT, TOOL = "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"  # open a turn
THINK, THINK_END = "<|think|>", "<|/think|>"
TOOL_CALL, TOOL_CALL_END = "<|tool_call|>", "<|/tool_call|>"
RESERVED = tuple(f"<|reserved_{i}|>" for i in range(4))  # kept free so ids need not move later
SPECIAL_TOKENS: tuple[str, ...] = (
    PAD, BOS, EOS, END, SYSTEM, USER, ASSISTANT, TOOL,
    THINK, THINK_END, TOOL_CALL, TOOL_CALL_END, *RESERVED,
)

# Alternatives are tried left to right at each position (see the module docstring).
CODE_SPLIT_PATTERN = (
    r"[\r\n]+[ \t]*"  # newline run + the indentation that follows
    r"|[^\r\n\p{L}\p{N}]?\p{L}+"  # a word with at most one leading non-letter
    r"|\p{N}{1,3}"  # digits, at most 3 per pre-token
    r"| ?[^\s\p{L}\p{N}]+"  # a punctuation run, with at most one leading space
    r"|[ \t]+(?!\S)"  # spaces before a newline / end, or all but the one a word takes
    r"|\s+"
)

BUNDLED_DIR = Path(__file__).parent / "assets"
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
DEFAULT_FORMAT = "opencomposer"  # the chat format of a tokenizer_config.json without "chat_format"
# tokenizer_config.json keys `save` does not carry over: tokenizer.json holds the added tokens
# (a stale copy would disagree after `add_special_tokens`), and no remote code is run.
_STALE_CONFIG_KEYS = ("added_tokens_decoder", "additional_special_tokens", "auto_map", "extra_special_tokens")


_SKIP_DIRS = {"__pycache__", "site-packages", "dist-packages"}  # installed third-party code is not "ours"


def code_corpus(
    paths: Sequence[str | Path] | None = None,
    *,
    suffixes: tuple[str, ...] = (".py",),
    max_file_bytes: int = 256_000,
    max_total_bytes: int = 64_000_000,
) -> Iterator[str]:
    """Yield source texts from `paths` (files or directories, searched recursively).

    Defaults to this interpreter's standard library, its test suite included and
    site-packages excluded (about 31 MB of Python for the venv's CPython 3.11.7). Files are visited in sorted order so a corpus is the same on
    every run; exact duplicates (by SHA-256 of the bytes) are skipped, as are files over
    `max_file_bytes` (mostly generated tables) and files that are not UTF-8. Stops before
    the total would pass `max_total_bytes`.
    """
    roots = [Path(p) for p in paths] if paths is not None else [Path(sysconfig.get_paths()["stdlib"])]
    seen: set[bytes] = set()
    total = 0
    for root in roots:
        if not root.exists():
            raise ConfigError(f"corpus path {root} does not exist; pass existing files or directories")
        files = [root] if root.is_file() else sorted(
            p for p in root.rglob("*")
            if p.suffix in suffixes and p.is_file() and not _SKIP_DIRS.intersection(p.relative_to(root).parts))
        for path in files:
            data = path.read_bytes()
            if not data or len(data) > max_file_bytes:
                continue
            digest = hashlib.sha256(data).digest()
            if digest in seen:
                continue
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if total + len(data) > max_total_bytes:
                return
            seen.add(digest)
            total += len(data)
            yield text


def _empty_tokenizer(split_digits: bool = False) -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    pattern = CODE_SPLIT_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}") if split_digits else CODE_SPLIT_PATTERN
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(
    texts: Iterable[str] | None = None,
    *,
    vocab_size: int = 4096,
    out_path: str | Path | None = None,
    min_frequency: int = 2,
    split_digits: bool = False,
) -> "Tokenizer":
    """Train a byte-level BPE of `vocab_size` tokens (special tokens included) on `texts`.

    split_digits: one digit per token (as LLaMA's and DeepSeek's tokenizers do) instead of up to
    three, so a number is the same tokens wherever it appears and a model copies it digit by digit.

    `texts` defaults to `code_corpus()`; to train on files or directories pass
    `code_corpus([...])`. `out_path`: a ``.json`` file (tokenizer.json format) or a
    directory (written with `Tokenizer.save`).
    """
    floor = 256 + len(SPECIAL_TOKENS)
    if vocab_size < floor:
        raise ConfigError(f"vocab_size={vocab_size} is too small: byte-level BPE needs at least "
                          f"{floor} (256 bytes + {len(SPECIAL_TOKENS)} special tokens)")
    hf = _empty_tokenizer(split_digits)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    hf.train_from_iterator(code_corpus() if texts is None else texts, trainer)
    tok = Tokenizer(hf)
    if out_path is not None:
        out = Path(out_path)
        if out.suffix == ".json":
            out.parent.mkdir(parents=True, exist_ok=True)
            hf.save(str(out))
        else:
            tok.save(out)
    return tok


def _as_special(token: AddedToken) -> AddedToken:
    return AddedToken(token.content, single_word=token.single_word, lstrip=token.lstrip, rstrip=token.rstrip,
                      normalized=token.normalized, special=True)


def _token_content(value: object) -> str | None:
    """tokenizer_config.json writes a token as a string or as {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """A loaded tokenizer: text <-> ids, with the special token ids as attributes.

    `encode` never produces special tokens (see the module docstring); `special` maps
    every special token string (every added token of the HF tokenizer) to its id; `bos_id`,
    `eos_id`, `pad_id` are None for a tokenizer that lacks them (Qwen3 has no bos).
    """

    def __init__(self, hf: HFTokenizer, config: dict | None = None):
        self.hf = hf
        self.config = dict(config or {})
        added = hf.get_added_tokens_decoder()
        # Added but not special in the file (Qwen3's <think>, <tool_call>, ...): special here,
        # so that text never encodes to them; `save` restores the file's flag.
        self._not_special_in_file = sorted(t.content for t in added.values() if not t.special)
        if self._not_special_in_file:
            hf.add_special_tokens([_as_special(t) for t in added.values() if not t.special])
        # Literal special strings in user text are encoded as text, never as the token.
        self.hf.encode_special_tokens = True
        self.special: dict[str, int] = {t.content: i for i, t in hf.get_added_tokens_decoder().items()}
        self._special_ids = frozenset(self.special.values())
        self.bos_id = self._lookup("bos_token", BOS)
        self.eos_id = self._lookup("eos_token", EOS)
        self.pad_id = self._lookup("pad_token", PAD)

    def _lookup(self, key: str, default: str) -> int | None:
        """The id of tokenizer_config.json's `key`; `default` when the key is absent; None when
        it is null or names a token this vocabulary lacks."""
        name = _token_content(self.config[key]) if key in self.config else default
        if name is None:
            return None
        return self.special.get(name, self.hf.token_to_id(name))

    @property
    def chat_format(self) -> str:
        """The chat format this tokenizer is rendered with (tokenizer_config.json "chat_format")."""
        return self.config.get("chat_format", DEFAULT_FORMAT)

    def add_special_tokens(self, tokens: Sequence[str], *, special_in_file: bool | Callable[[str], bool] = True,
                           bos: str | None = None, eos: str | None = None, pad: str | None = None,
                           chat_format: str | None = None) -> list[int]:
        """Add `tokens` (those not yet in the vocabulary) after the last id; returns their ids.

        special_in_file: how tokenizer.json marks each new token (a bool, or a function of the
        token): `encode` never yields any of them either way (the class docstring); False matters
        to servers that decode with skip_special_tokens and parse the text. bos/eos/pad/chat_format
        set the tokenizer_config.json entries of the same names.
        """
        flag = special_in_file if callable(special_in_file) else (lambda _t: special_in_file)
        new = [t for t in dict.fromkeys(tokens) if t not in self.special and self.hf.token_to_id(t) is None]
        self.hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in new])
        self._not_special_in_file = sorted({*self._not_special_in_file, *(t for t in new if not flag(t))})
        self.special = {t.content: i for i, t in self.hf.get_added_tokens_decoder().items()}
        self._special_ids = frozenset(self.special.values())
        for key, value in (("bos_token", bos), ("eos_token", eos), ("pad_token", pad), ("chat_format", chat_format)):
            if value is not None:
                self.config[key] = value
        self.bos_id = self._lookup("bos_token", BOS)
        self.eos_id = self._lookup("eos_token", EOS)
        self.pad_id = self._lookup("pad_token", PAD)
        return [self.special[t] for t in tokens]

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        """Load a tokenizer.json file, or a directory holding tokenizer.json (and, optionally,
        tokenizer_config.json naming bos/eos/pad)."""
        path = Path(path)
        file = path / TOKENIZER_FILE if path.is_dir() else path
        if not file.is_file():
            raise CheckpointError(f"no tokenizer at {path}: expected a tokenizer.json file or a directory "
                                  f"containing one (train one with opencomposer.model.tokenizer.train_tokenizer)")
        try:
            hf = HFTokenizer.from_file(str(file))
        except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
            raise CheckpointError(f"{file} is not a valid tokenizer.json: {exc}") from exc
        config_file = file.parent / CONFIG_FILE
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        if "chat_format" not in config and (detected := detect_chat_format(config, file.parent)):
            config["chat_format"] = detected
        return cls(hf, config)

    def save(self, directory: str | Path, *, chat_template: str | None = None) -> Path:
        """Write tokenizer.json and tokenizer_config.json into `directory` (created if needed),
        in the layout transformers' `AutoTokenizer.from_pretrained` reads, with the chat format's
        name and, when given, its Jinja `chat_template` (see the module docstring)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / TOKENIZER_FILE).write_text(self.to_json(), encoding="utf-8")
        config = {k: v for k, v in self.config.items() if k not in _STALE_CONFIG_KEYS}
        config.update({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.hf.id_to_token(self.bos_id) if self.bos_id is not None else None,
            "eos_token": self.hf.id_to_token(self.eos_id) if self.eos_id is not None else None,
            "pad_token": self.hf.id_to_token(self.pad_id) if self.pad_id is not None else None,
            "chat_format": self.chat_format,
            # false: true would split the chat template's own structure strings too (module docstring)
            "split_special_tokens": False,
            "clean_up_tokenization_spaces": False,
            "add_bos_token": False,
            "add_eos_token": False,
        })
        if chat_template is not None:
            config["chat_template"] = chat_template
        (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return directory

    def to_json(self) -> str:
        """tokenizer.json as the source file marked its added tokens (special or not)."""
        data = json.loads(self.hf.to_str())
        keep = set(self._not_special_in_file)
        for entry in data.get("added_tokens", []):
            if entry["content"] in keep:
                entry["special"] = False
        return json.dumps(data, ensure_ascii=False, indent=2)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Ids of `text`, with no bos/eos added and never a special token."""
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text of `ids`; special tokens appear as their strings unless `skip_special`."""
        return self.hf.decode(list(ids), skip_special_tokens=skip_special)

    def special_id(self, token: str) -> int:
        """Id of special token `token`; a clear error if this tokenizer lacks it."""
        try:
            return self.special[token]
        except KeyError:
            raise CheckpointError(
                f"this tokenizer has no special token {token!r} (its chat format is {self.chat_format!r}); "
                f"use a tokenizer that has it, or add it with `opencomposer model new` / "
                f"Tokenizer.add_special_tokens (docs/models.md)") from None

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def id_to_token(self, token_id: int) -> str | None:
        return self.hf.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, special={len(self.special)})"


def detect_chat_format(config: dict, directory: Path) -> str | None:
    """The chat format of a checkpoint from the Hub, whose tokenizer_config.json names none: Qwen3-Coder's
    template (ChatML with XML ``<function=...>`` calls) is "qwen3_coder", Qwen3's (ChatML with JSON
    ``<tool_call>`` blocks) "qwen3"; anything else None (the default format, or set "chat_format")."""
    template = config.get("chat_template")
    if template is None and (directory / "chat_template.jinja").is_file():  # transformers 5 writes it apart
        template = (directory / "chat_template.jinja").read_text(encoding="utf-8")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        template = "\n".join(t.get("template", "") for t in template if isinstance(t, dict))
    if not isinstance(template, str) or "<|im_start|>" not in template:
        return None
    if "<function=" in template:
        return "qwen3_coder"
    return "qwen3" if "<tool_call>" in template else None


def bundled_tokenizer(name: str = "tokenizer-4k") -> Tokenizer:
    """The committed tokenizer `assets/<name>.json` (4,096 tokens, trained on the stdlib)."""
    return Tokenizer.load(BUNDLED_DIR / f"{name}.json")


def load_tokenizer(spec: str | Path | None = None, *, checkpoint: str | Path | None = None) -> Tokenizer:
    """The tokenizer a config or a command line names: every command loads its tokenizer here.

    spec: "bundled:NAME" (a packaged tokenizer, `bundled_tokenizer(NAME)`), or a tokenizer.json
    file or a directory holding one. Without a spec: the tokenizer saved in `checkpoint` (a model
    directory) when it holds a tokenizer.json, else the bundled default.
    """
    if spec:
        spec = str(spec)
        if spec.startswith("bundled:"):
            return bundled_tokenizer(spec.removeprefix("bundled:"))
        return Tokenizer.load(spec)
    if checkpoint is not None and (Path(checkpoint) / TOKENIZER_FILE).is_file():
        return Tokenizer.load(checkpoint)
    return bundled_tokenizer()


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m opencomposer.model.tokenizer --vocab-size N --out PATH [--corpus DIR ...]`"""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--out", required=True, help="a .json file or a directory")
    parser.add_argument("--corpus", nargs="*", default=None,
                        help="files/directories of sources (default: the Python standard library)")
    parser.add_argument("--max-total-mb", type=float, default=64.0)
    args = parser.parse_args(argv)
    texts = list(code_corpus(args.corpus, max_total_bytes=int(args.max_total_mb * 1e6)))
    tok = train_tokenizer(texts, vocab_size=args.vocab_size, out_path=args.out)
    n_chars = sum(len(t) for t in texts)
    n_tokens = sum(len(ids) for ids in tok.encode_batch(texts))
    print(json.dumps({"files": len(texts), "chars": n_chars, "vocab_size": tok.vocab_size,
                      "chars_per_token": round(n_chars / max(n_tokens, 1), 3), "out": str(args.out)}))


if __name__ == "__main__":
    main()
