"""Glob patterns for the glob tool, matched in bounded time.

Syntax (unchanged from the regex translation this replaces): `*` and `?` stay within one
path component, `**/` spans any number of directories, `**` elsewhere spans anything,
`[abc]` / `[!abc]` are classes, `{a,b}` are alternatives (not nested: the first `}` closes).
A class never matches '/' (components are matched one by one).

Why not a regex: `*a*a*a*a*a*b` becomes `[^/]*a[^/]*a...b`, which Python's backtracking
`re` takes exponential time to reject on a long name (22 s on 200 characters, holding the
GIL, so the whole event loop froze). Here a pattern is a few alternatives, each a list of
component patterns and "any number of components" items (`**/`; a `**` inside a component
is rewritten into those). A component pattern is split at its stars into fixed-length
pieces, placed left to right at their leftmost match (correct for `*`, and linear apart from
the piece searches, which `re` does without backtracking: a piece has no quantifier). The
components of a path are matched by dynamic programming over (item, component): at most
items x components piece matches per alternative.
"""

from __future__ import annotations

import re

MAX_ALTERNATIVES = 64
"""A pattern that expands into more alternatives ({a,b} and inner `**`) is refused."""

_STAR, _SPAN, _DIRS, _SEP = "*", "**", "**/", "/"


class GlobError(ValueError):
    """A pattern that cannot be used; the message says why."""


def _tokens(pattern: str) -> list[list]:
    """The pattern's alternatives ({a,b} expanded), each a list of tokens: _STAR, _SPAN,
    _DIRS, _SEP, or a one-character regex (a literal, `?`, a class)."""
    variants: list[list] = [[]]
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            piece, i = [[_DIRS]], i + 3
        elif pattern.startswith("**", i):
            piece, i = [[_SPAN]], i + 2
        elif c == "*":
            piece, i = [[_STAR]], i + 1
        elif c == "?":
            piece, i = [["[^/]"]], i + 1
        elif c == "/":
            piece, i = [[_SEP]], i + 1
        elif c == "[" and (j := pattern.find("]", i + 2)) != -1:
            piece, i = [[_char_class(pattern[i + 1:j])]], j + 1
        elif c == "{" and (j := pattern.find("}", i)) != -1:
            piece, i = [v for alt in pattern[i + 1:j].split(",") for v in _tokens(alt)], j + 1
        else:
            piece, i = [[re.escape(c)]], i + 1
        variants = [v + p for v in variants for p in piece]
        if len(variants) > MAX_ALTERNATIVES:
            raise GlobError(f"it has over {MAX_ALTERNATIVES} alternatives; use fewer {{a,b}} groups")
    return variants


def _char_class(body: str) -> str:
    regex = "[" + ("^" + body[1:] if body[0] == "!" else body).replace("\\", "\\\\") + "]"
    try:
        re.compile(regex)
    except re.error as e:
        raise GlobError(str(e)) from None
    return regex


def _at_boundary(tokens: list) -> bool:
    return not tokens or tokens[-1] in (_SEP, _DIRS)


def _component_form(tokens: list) -> list[list]:
    """Rewrite `**` and a `**/` inside a component in terms of whole components:
    `.*` = `[^/]*` | `[^/]*/(?:[^/]*/)*[^/]*`, and (?:[^/]*/)* after other characters of a
    component = `` | `[^/]*/(?:[^/]*/)*`. Afterwards every _DIRS stands at a boundary."""
    outs: list[list] = [[]]
    for t in tokens:
        new = []
        for out in outs:
            if t == _SPAN:
                new += [out + [_STAR], out + [_STAR, _SEP, _DIRS, _STAR]]
            elif t == _DIRS and not _at_boundary(out):
                new += [out, out + [_STAR, _SEP, _DIRS]]
            else:
                new.append(out + [t])
        outs = new
        if len(outs) > MAX_ALTERNATIVES:
            raise GlobError(f"it has over {MAX_ALTERNATIVES} alternatives; use fewer `**`")
    return outs


class _Component:
    """A pattern for one path component: fixed-length pieces with a star between each two."""

    def __init__(self, tokens: list):
        pieces: list[list[str]] = [[]]
        for t in tokens:
            if t == _STAR:
                if pieces[-1] or len(pieces) == 1:  # `**` inside a component is one star
                    pieces.append([])
            else:
                pieces[-1].append(t)
        self.starred = len(pieces) > 1
        self.size = sum(map(len, pieces))  # the fewest characters a match has
        compiled = [re.compile("".join(p), re.DOTALL) for p in pieces]
        self.first, self.middle, self.last = compiled[0], compiled[1:-1], compiled[-1]
        self.first_len, self.last_len = len(pieces[0]), len(pieces[-1])

    def match(self, name: str) -> bool:
        if not self.starred:
            return len(name) == self.size and self.first.fullmatch(name) is not None
        end = len(name) - self.last_len
        if len(name) < self.size or self.first.match(name) is None or self.last.fullmatch(name, end) is None:
            return False
        pos = self.first_len
        for piece in self.middle:  # leftmost placement, left to right
            m = piece.search(name, pos, end)
            if m is None:
                return False
            pos = m.end()
        return True


_ANY_DIRS = None  # an item: zero or more whole components


def _items(tokens: list) -> list:
    """Component patterns and _ANY_DIRS, in order."""
    items, current = [], []
    for t in tokens:
        if t == _SEP:
            items.append(_Component(current))
            current = []
        elif t == _DIRS:  # at a boundary: `current` is empty
            items.append(_ANY_DIRS)
        else:
            current.append(t)
    items.append(_Component(current))
    return items


class _Alternative:
    """One alternative: its items, matched against a path's components by dynamic programming
    over (item, component), pruned to positions that can still end at the last component."""

    def __init__(self, items: list):
        self.items = items
        k = len(items)
        self.fixed_after = [0] * (k + 1)  # components the items after k consume exactly
        self.dirs_after = [False] * (k + 1)  # whether an _ANY_DIRS comes after item k
        for i in range(k - 1, -1, -1):
            self.fixed_after[i] = self.fixed_after[i + 1] + (items[i] is not _ANY_DIRS)
            self.dirs_after[i] = self.dirs_after[i + 1] or items[i] is _ANY_DIRS
        # the common shapes (`src/*.py`, `**/*.py`): no _ANY_DIRS but a leading one, so the
        # components are matched where they must stand, without the table
        self.leading_dirs = bool(items) and items[0] is _ANY_DIRS
        self.tail = items[1:] if self.leading_dirs else items
        self.simple = _ANY_DIRS not in self.tail

    def match(self, parts: list[str]) -> bool:
        if self.simple:
            n, m = len(parts), len(self.tail)
            if n < m or (n != m and not self.leading_dirs):
                return False
            return all(item.match(part) for item, part in zip(self.tail, parts[n - m:]))
        n, at = len(parts), {0}
        for k, item in enumerate(self.items):
            last, free = n - self.fixed_after[k + 1], self.dirs_after[k + 1]  # item k ends at `last` at most
            if item is _ANY_DIRS:
                start = min(at)
                at = set(range(start, last + 1)) if free else ({last} if start <= last else set())
            else:
                at = {j + 1 for j in at if (j + 1 <= last if free else j + 1 == last) and item.match(parts[j])}
            if not at:
                return False
        return n in at


class Glob:
    """A compiled pattern; `match(path)` for '/'-separated relative paths without a trailing '/'."""

    def __init__(self, pattern: str):
        self.alternatives = [_Alternative(_items(form)) for tokens in _tokens(pattern)
                             for form in _component_form(tokens)]
        if len(self.alternatives) > MAX_ALTERNATIVES:
            raise GlobError(f"it has over {MAX_ALTERNATIVES} alternatives; use fewer {{a,b}} groups or `**`")

    def match(self, path: str) -> bool:
        parts = path.split("/")
        return any(alt.match(parts) for alt in self.alternatives)
