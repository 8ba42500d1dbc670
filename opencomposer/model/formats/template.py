"""Helpers for the formats' Jinja chat templates (transformers' apply_chat_template, vLLM, SGLang).

A served checkpoint's tokenizer_config.json has ``split_special_tokens: false`` (model/tokenizer.py
says why), so transformers turns every added token's string that appears in the *rendered* text
into that token: the template's own structure strings, as intended, but also any that a message
holds. The templates therefore pass message text through `esc`, which breaks each added token's
string with a zero-width space (U+200B) after its first character ("<|im_end|>" becomes
"<\u200b|im_end|>"). Such text then tokenizes differently from opencomposer's renderer, which
encodes the string's own bytes exactly; text without an added token's string is unchanged, and
gives the renderer's ids exactly. Not covered: text that *ends* with the beginning of an added
token's string whose rest the template itself writes next; of the formats here only qwen3_coder
writes such a rest (the ">" after a function or parameter name in ``<function=NAME>``), so a
tool-call name or argument key ending in "<tool_call" would form a token in transformers (the
renderer is not affected: it never matches added tokens in text).
"""

from __future__ import annotations

from opencomposer.model.tokenizer import Tokenizer

ZWSP = "\u200b"


def lit(s: str) -> str:
    """`s` as a Jinja string literal."""
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def broken(s: str) -> str:
    """An added token's string as the templates write it inside message text."""
    return s[0] + ZWSP + s[1:]


def escape_macro(tok: Tokenizer) -> str:
    """The `esc(text)` macro: every added token's string of `tok` broken (longest first). The
    replacements are chained in `set` statements of at most 64 each: one expression of DeepSeek's
    1,283 chained filters would overflow Jinja's recursive compiler."""
    filters = [f" | replace({lit(t)}, {lit(broken(t))})"
               for t in sorted(tok.special, key=lambda t: (-len(t), t)) if len(t) > 1]
    sets = "".join("{%- set s = s" + "".join(filters[i:i + 64]) + " %}" for i in range(0, len(filters), 64))
    return "{%- macro esc(s) %}{%- set s = s | string %}" + sets + "{{- s }}{%- endmacro %}"
