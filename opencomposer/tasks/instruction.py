"""Terse task instructions written from names, docstrings and module paths (no language model).

A feature task (bodies removed) reads like a short request from a colleague:

    Implement `sliding_window`, `partition` in toolz/itertoolz.py and `merge_with` in
    toolz/dicttoolz.py: A sequence of overlapping subsequences. Keep the existing API.

and a procedural-bug task names the function and what it should do:

    Fix the bug in `SortedList.bisect_left` (sortedcontainers/sortedlist.py): it should
    return an index to insert value in the sorted list.

Budget: `limit` characters (default 400, CursorBench's median prompt is 390). What does
not fit is dropped in this order: docstring sentences, then names past the first few per
file (replaced by "and N more"), then all names ("Implement the N functions that raise
NotImplementedError in a.py and b.py"). Docstring sentences are the first sentence of each
docstring, in the order of the functions, with doctest prompts and reST markup removed.
"""

from __future__ import annotations

import re

LIMIT = 400
TAIL = " Keep the existing API."


def first_sentence(doc: str, max_chars: int = 160) -> str:
    """The first sentence of a docstring, plain text, at most `max_chars` (cut at a word)."""
    para = doc.strip().split("\n\n")[0]
    if para.lstrip().startswith((">>>", "..", ":")):
        return ""
    text = " ".join(para.split())
    text = re.sub(r":(?:func|meth|class|attr|obj|mod|data|exc):`~?([^`]+)`", r"`\1`", text)
    text = text.replace("``", "`")
    m = re.match(r"(.+?[.!?])(\s|$)", text)
    text = m.group(1) if m else text
    if len(text) > max_chars:
        text = text[:max_chars].rsplit(" ", 1)[0].rstrip(",;:") + "..."
    if text and not text.endswith((".", "!", "?", "...")):
        text += "."
    return text[:1].upper() + text[1:]


def _names(quals: list[str], keep: int) -> str:
    shown = [f"`{q}`" for q in quals[:keep]]
    if len(quals) > keep:
        shown.append(f"{len(quals) - keep} more")
    if len(shown) == 1:
        return shown[0]
    return ", ".join(shown[:-1]) + " and " + shown[-1]


def feature_instruction(functions: list[tuple[str, str, str]], limit: int = LIMIT) -> str:
    """Instruction for implementing `functions` = [(path, qualname, docstring)], in order.

    Raises ValueError if even the shortest form does not fit `limit`.
    """
    by_file: dict[str, list[str]] = {}
    for path, qual, _ in functions:
        quals = by_file.setdefault(path, [])
        if qual not in quals:
            quals.append(qual)
    sentences = []
    for _, _, doc in functions:
        s = first_sentence(doc)
        if s and s not in sentences:
            sentences.append(s)
    most = max(len(q) for q in by_file.values())
    for keep in range(most, 0, -1):
        head = "Implement " + _join([f"{_names(q, keep)} in {p}" for p, q in by_file.items()])
        if len(head) + len(TAIL) + 1 > limit:
            continue
        text, room = head, limit - len(head) - len(TAIL) - 1
        said = []
        for s in sentences:
            if len(" ".join(said + [s])) + 1 <= room:
                said.append(s)
        text += (": " + " ".join(said)) if said else "."
        if said and not text.endswith((".", "!", "?")):
            text += "."
        return text + TAIL
    n = sum(len(q) for q in by_file.values())
    text = f"Implement the {n} functions that raise NotImplementedError in {_join(list(by_file))}." + TAIL
    if len(text) > limit:
        raise ValueError(f"cannot write an instruction under {limit} characters for {n} functions")
    return text


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else "; ".join(parts[:-1]) + "; and " + parts[-1]


BUG_SYMPTOMS = {
    "flip_compare": "a comparison is wrong",
    "flip_arith": "it computes a wrong value",
    "remove_if": "a case is no longer handled",
    "remove_loop": "part of the work is skipped",
    "swap_branches": "two cases are handled the wrong way round",
}


def bug_instruction(path: str, qualname: str, doc: str, kind: str, limit: int = LIMIT) -> str:
    """Instruction for a procedural bug of `kind` in one function."""
    text = f"Fix the bug in `{qualname}` ({path}): {BUG_SYMPTOMS[kind]}."
    s = first_sentence(doc)
    if s and len(text) + len(" Its docstring says: ") + len(s) <= limit:
        text += f" Its docstring says: {s}"
    return text
