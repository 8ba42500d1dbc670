"""Word statistics."""

import re

_WORD = re.compile(r"[a-z0-9']+")


def words(text):
    """Lowercased words of text (letters, digits and apostrophes)."""
    return _WORD.findall(text.lower())


def count_words(text):
    """Map each lowercased word to its number of occurrences."""
    counts = {}
    for w in words(text):
        counts[w] = counts.get(w, 0) + 1
    return counts


def top_words(text, n):
    """The n most frequent words as (word, count) pairs: most frequent first, ties alphabetical."""
    counts = count_words(text)
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
