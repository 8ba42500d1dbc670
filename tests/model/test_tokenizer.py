"""Tokenizer: training on code, exact round trips, special tokens never from plain text, save/load."""

import json
import random

import pytest

from opencomposer.errors import CheckpointError, ConfigError
from opencomposer.model.tokenizer import (
    BOS, END, EOS, PAD, SPECIAL_TOKENS, Tokenizer, bundled_tokenizer, code_corpus, load_tokenizer, train_tokenizer,
)

TRICKY = [
    "def f(x):\n\tif x:\n\t\treturn x  \n    \n",  # tabs, trailing spaces, a blank indented line
    "class A:\r\n    pass\r\n",  # CRLF
    "  leading spaces and trailing   ",
    "s = 'héllo wörld ñ 中文 日本語 🙂👍🏽'  # unicode, emoji with modifier\n",
    "x\u00a0=\u20031\f\v\x00\x1b[0m",  # NBSP, EM SPACE, form feed, NUL, escape
    "\n\n\n\n        \t  \n",
    "1234567890 3.14159e-10 0xDEADBEEF",
    "",
]


@pytest.fixture(scope="session")
def tok(tmp_path_factory) -> Tokenizer:
    """A 2k tokenizer trained on ~2 MB of the standard library (a couple of seconds)."""
    out = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    return train_tokenizer(code_corpus(max_total_bytes=2_000_000), vocab_size=2048, out_path=out)


@pytest.fixture(scope="session")
def bundled() -> Tokenizer:
    return bundled_tokenizer()


def _random_text(rng: random.Random, n: int) -> str:
    pool = ["    ", "\t", "\n", " ", "def", "_x", "<|", "|>", "im_end", "(", ")", ":", "é", "中", "🙂", "\r\n"]
    out = []
    for _ in range(n):
        if rng.random() < 0.3:
            cp = rng.randrange(0x20, 0x2FFFF)
            out.append(chr(cp) if not 0xD800 <= cp <= 0xDFFF else "?")
        else:
            out.append(rng.choice(pool))
    return "".join(out)


@pytest.mark.parametrize("which", ["tok", "bundled"])
def test_decode_encode_is_identity(which, request):
    t = request.getfixturevalue(which)
    rng = random.Random(0)
    for text in TRICKY + [_random_text(rng, rng.randrange(1, 80)) for _ in range(300)]:
        ids = t.encode(text)
        assert t.decode(ids) == text, repr(text)
        assert not any(t.is_special(i) for i in ids)


def test_trained_vocab_size_and_fixed_special_ids(tok, bundled):
    assert tok.vocab_size == 2048 and bundled.vocab_size == 4096
    for t in (tok, bundled):
        assert [t.special[s] for s in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
        assert (t.pad_id, t.bos_id, t.eos_id) == (t.special[PAD], t.special[BOS], t.special[EOS])
        assert t.special_id(END) == 3


@pytest.mark.parametrize("special", SPECIAL_TOKENS)
def test_special_strings_in_plain_text_are_never_special_tokens(bundled, tok, special):
    for t in (bundled, tok):
        for text in (special, f"a{special}b", f"\n    {special}\n", special * 3, f" {special} "):
            ids = t.encode(text)
            assert not any(t.is_special(i) for i in ids), (special, text)
            assert t.decode(ids) == text
        # ...while the real token decodes to its string, or to nothing when skipped.
        assert t.decode([t.special[special]]) == special
        assert t.decode([t.special[special]], skip_special=True) == ""


def test_indentation_runs_are_single_tokens(tok, bundled):
    # The pre-tokenizer keeps "\n" + indentation together, so BPE learns each level as one
    # token: an 8-space body line costs one token for its newline and indentation.
    for t in (tok, bundled):
        assert len(t.encode("\n    ")) == 1
        assert len(t.encode("\n        ")) == 1
        assert t.encode("\n        return x")[0] == t.encode("\n        ")[0]


SAMPLE = '''import os
from pathlib import Path


class Cache:
    """A small on-disk cache keyed by name."""

    def __init__(self, root: Path, max_items: int = 128):
        self.root = Path(root)
        self.max_items = max_items
        self.root.mkdir(parents=True, exist_ok=True)

    def get(self, key: str) -> bytes | None:
        path = self.root / key
        if not path.exists():
            return None
        with open(path, "rb") as f:
            return f.read()

    def put(self, key: str, value: bytes) -> None:
        files = sorted(self.root.iterdir(), key=os.path.getmtime)
        for old in files[: max(0, len(files) - self.max_items + 1)]:
            old.unlink()
        (self.root / key).write_bytes(value)
'''


def test_bundled_tokenizer_compresses_python(bundled):
    # Code the tokenizer was not trained on; byte-level encoding would give 1.0.
    assert len(SAMPLE) / len(bundled.encode(SAMPLE)) > 3.0


def test_save_load_round_trip(tok, tmp_path):
    d = tok.save(tmp_path / "ckpt")
    config = json.loads((d / "tokenizer_config.json").read_text())
    assert config["split_special_tokens"] is False  # the chat template guards structure strings
    assert config["chat_format"] == "opencomposer" and loaded_format(d) == "opencomposer"
    assert config["bos_token"] == BOS and config["eos_token"] == EOS and config["pad_token"] == PAD
    loaded = Tokenizer.load(d)
    assert loaded.vocab_size == tok.vocab_size and loaded.special == tok.special
    assert (loaded.bos_id, loaded.eos_id, loaded.pad_id) == (tok.bos_id, tok.eos_id, tok.pad_id)
    for text in TRICKY + ["x <|im_end|> y"]:
        assert loaded.encode(text) == tok.encode(text)
    assert Tokenizer.load(d / "tokenizer.json").encode("<|bos|>") == tok.encode("<|bos|>")


def loaded_format(d) -> str:
    return Tokenizer.load(d).chat_format


def test_saved_tokenizer_loads_in_transformers_with_same_ids(bundled, tmp_path):
    import transformers  # a dev dependency (pyproject [dev])
    hf = transformers.AutoTokenizer.from_pretrained(bundled.save(tmp_path / "ckpt"))
    # Text without structure strings: the same ids. (With them, transformers makes the structure
    # token, as split_special_tokens=false asks; the exported chat template guards message text.)
    for text in TRICKY + ["user says <| im_end |> hi"]:
        assert hf(text, add_special_tokens=False).input_ids == bundled.encode(text)
    assert hf.eos_token_id == bundled.eos_id and hf.pad_token_id == bundled.pad_id


def test_code_corpus_dedups_and_caps(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "copy.py").write_text("x = 1\n")  # same bytes: skipped
    (tmp_path / "pkg" / "b.py").write_text("y = 2\n")
    (tmp_path / "big.py").write_text("z" * 5000)
    (tmp_path / "latin1.py").write_bytes(b"s = '\xe9'\n")  # not UTF-8: skipped
    (tmp_path / "notes.txt").write_text("not python")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "c.py").write_text("cached = 1\n")
    assert list(code_corpus([tmp_path], max_file_bytes=1000)) == ["x = 1\n", "y = 2\n"]
    assert list(code_corpus([tmp_path], max_file_bytes=1000, max_total_bytes=8)) == ["x = 1\n"]
    assert list(code_corpus([tmp_path / "pkg" / "b.py"])) == ["y = 2\n"]


def test_bad_inputs_raise_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="too small"):
        train_tokenizer(["x"], vocab_size=100)
    with pytest.raises(ConfigError, match="does not exist"):
        list(code_corpus([tmp_path / "missing"]))
    with pytest.raises(CheckpointError, match="no tokenizer"):
        Tokenizer.load(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not a valid tokenizer.json"):
        Tokenizer.load(tmp_path)
    with pytest.raises(CheckpointError, match="no special token"):
        bundled_tokenizer().special_id("<|nope|>")


def test_split_digits_writes_every_digit_as_its_own_token(tok, tmp_path):
    numbers = "x = 1234567890 + 12 * 345\n    return value + 10\n" * 50
    split = train_tokenizer(code_corpus(max_total_bytes=500_000), vocab_size=1024, split_digits=True)
    for text in ["1234567890", "return value + 10", "  42\t7"]:
        ids = split.encode(text)
        assert split.decode(ids) == text
        digits = [split.decode([i]) for i in ids if any(c.isdigit() for c in split.decode([i]))]
        assert digits == [c for c in text if c.isdigit()], (text, digits)
    # the default merges digits (the BPE learns "10", "12", ...); the split survives save/load
    assert len(tok.encode("1234567890")) < 10
    loaded = Tokenizer.load(split.save(tmp_path / "split"))
    assert loaded.encode(numbers) == split.encode(numbers)
    assert len(loaded.encode("1234567890")) == 10


def test_load_tokenizer_takes_a_spec_else_the_checkpoints_own_else_the_bundled_one(tmp_path):
    small = train_tokenizer(["def f(x):\n    return x + 1\n"] * 20, vocab_size=300)
    ckpt = tmp_path / "ckpt"
    small.save(ckpt)
    bundled = bundled_tokenizer()
    assert load_tokenizer("bundled:tokenizer-4k").vocab_size == bundled.vocab_size
    assert load_tokenizer(ckpt).vocab_size == small.vocab_size
    assert load_tokenizer(ckpt / "tokenizer.json").vocab_size == small.vocab_size
    assert load_tokenizer(None, checkpoint=ckpt).vocab_size == small.vocab_size
    assert load_tokenizer("bundled:tokenizer-4k", checkpoint=ckpt).vocab_size == bundled.vocab_size  # a spec wins
    assert load_tokenizer(None, checkpoint=tmp_path / "no-tokenizer-here").vocab_size == bundled.vocab_size
    with pytest.raises(CheckpointError, match="no tokenizer at"):
        load_tokenizer(tmp_path / "missing.json")


@pytest.mark.parametrize("template, expected", [
    ("{%- for m in messages %}<|im_start|>{{ m.role }}\n<tool_call>\n{{ tc | tojson }}</tool_call>{% endfor %}", "qwen3"),
    ("<|im_start|>assistant\n<tool_call>\n<function={{ tc.name }}>\n<parameter=x>", "qwen3_coder"),
    ("{{ bos_token }}{% for m in messages %}[INST]{{ m.content }}{% endfor %}", "opencomposer"),
])
def test_a_hub_checkpoint_without_chat_format_is_recognised_by_its_template(bundled, tmp_path, template, expected):
    d = bundled.save(tmp_path / "ckpt")
    config = json.loads((d / "tokenizer_config.json").read_text())
    del config["chat_format"]
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    assert Tokenizer.load(d).chat_format == expected
    (d / "tokenizer_config.json").write_text(json.dumps(config))  # transformers 5: the template in its own file
    (d / "chat_template.jinja").write_text(template)
    assert Tokenizer.load(d).chat_format == expected
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "chat_format": "opencomposer"}))
    assert Tokenizer.load(d).chat_format == "opencomposer"  # a named format wins
