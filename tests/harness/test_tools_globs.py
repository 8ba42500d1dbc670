"""Glob patterns: the same language as the regex translation they replace, in bounded time."""

import random
import re
import time

import pytest

from opencomposer.harness.tools.globs import MAX_ALTERNATIVES, Glob, GlobError


def old_glob_to_regex(pattern: str) -> re.Pattern:
    """The previous implementation (a regex for Python's backtracking `re`), kept as the oracle."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and (j := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1:j]
            body = "^" + body[1:] if body[0] == "!" else body
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = j
        elif c == "{" and (j := pattern.find("}", i)) != -1:
            alts = pattern[i + 1:j].split(",")
            out.append("(?:" + "|".join(old_glob_to_regex(a).pattern for a in alts) + ")")
            i = j
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


# classes that cannot match '/' (the one place the languages differ: components are matched one by one)
PIECES = ["a", "b", "ab", ".", "*", "**", "**/", "?", "/", "[ab]", "[!/a]", "{a,b}", "{a,*/b}", "{,a}", "{a", "}"]


def test_same_language_as_the_old_regex_on_random_patterns_and_paths():
    rng = random.Random(0)
    paths = ["/".join("".join(rng.choice("ab.") for _ in range(rng.randint(1, 4)))
                      for _ in range(rng.randint(1, 4))) for _ in range(300)]
    paths += ["a", "b", "ab", "a/b", "a/a/b", "ab/ba/a.b", ".a/b"]
    checked = 0
    for _ in range(1500):
        pattern = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 6)))
        try:
            glob = Glob(pattern)
        except GlobError:
            continue
        oracle = old_glob_to_regex(pattern)
        for path in paths:
            assert glob.match(path) == bool(oracle.fullmatch(path)), (pattern, path)
        checked += 1
    assert checked > 1000


@pytest.mark.parametrize("pattern,yes,no", [
    ("**/*.py", ["a.py", "src/pkg/a.py"], ["a.pyc", "src/a.py/x"]),
    ("src/**", ["src/a", "src/a/b"], ["src", "lib/a"]),
    ("src/**/*.{py,json}", ["src/a.py", "src/x/y/b.json"], ["src/a.md", "a.py"]),
    ("a**b", ["ab", "axb", "a/b", "a/x/yb"], ["a", "b/a"]),
    ("a**/b", ["ab", "a/b", "ax/b", "a/x/b"], ["a/xb"]),
    ("test_?.py", ["test_1.py"], ["test_10.py", "test_/.py"]),
    ("[!t]*.py", ["a.py"], ["t.py"]),
])
def test_familiar_patterns(pattern, yes, no):
    glob = Glob(pattern)
    assert [p for p in yes if not glob.match(p)] == [] and [p for p in no if glob.match(p)] == []


@pytest.mark.parametrize("pattern", ["*a*a*a*a*a*b", "*a*a*a*a*a*a*a*a*a*a*a*b", "**a**a**a**a**a**b",
                                     "*[ab]*[ab]*[ab]*[ab]*[ab]*[ab]*c", "a*a*a*a*a*a*?b"])
def test_many_stars_cost_linear_time(pattern):
    # The old regex took > 22 s on the first pattern against this name (exponential in the stars).
    name = "a" * 200
    t0 = time.perf_counter()
    assert not Glob(pattern).match(name) and not Glob(pattern).match("/".join([name] * 20))
    assert time.perf_counter() - t0 < 5


def test_many_doublestar_segments_on_a_deep_path_are_bounded():
    path = "/".join(["a"] * 200)
    t0 = time.perf_counter()
    assert not Glob("/".join(["**"] * 12 + ["b"])).match(path)
    assert time.perf_counter() - t0 < 5


def test_too_many_alternatives_are_refused_before_any_matching():
    with pytest.raises(GlobError, match="alternatives"):
        Glob("{a,b}" * 7)
    assert len(Glob("{a,b}" * 6).alternatives) == MAX_ALTERNATIVES
    with pytest.raises(GlobError, match="bad character range"):
        Glob("[z-a]")
