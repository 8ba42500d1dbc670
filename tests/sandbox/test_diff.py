"""diff.py's hunk builder: every hunk set must rebuild the new text from the old one."""

from __future__ import annotations

import difflib
import random
import re

from opencomposer.sandbox.diff import file_diff, unified


def _apply(old: list[str], hunks: list[str]) -> list[str]:
    """A minimal `patch` for one file's hunks (context lines are checked, not trusted)."""
    out, i = [], 0
    for line in hunks:
        if line.startswith("@@"):
            start, count = re.match(r"@@ -(\d+)(?:,(\d+))? \+", line).groups()
            begin = int(start) - 1 if count != "0" else int(start)
            out += old[i:begin]
            i = begin
        elif line[0] == " ":
            assert old[i] == line[1:]
            out.append(old[i])
            i += 1
        elif line[0] == "-":
            assert old[i] == line[1:]
            i += 1
        else:
            out.append(line[1:])
    return out + old[i:]


def test_hunks_rebuild_the_new_text_on_random_edits():
    rng = random.Random(0)
    for _ in range(500):
        old = [f"line {rng.randint(0, 6)}\n" for _ in range(rng.randint(0, 40))]
        new = list(old)
        for _ in range(rng.randint(0, 6)):
            r = rng.random()
            if r < 0.3 and new:
                del new[rng.randrange(len(new))]
            elif r < 0.6:
                new.insert(rng.randint(0, len(new)), f"new {rng.randint(0, 3)}\n")
            elif new:
                new[rng.randrange(len(new))] = f"changed {rng.randint(0, 3)}\n"
        assert _apply(old, list(unified(old, new))) == new


def test_one_line_edit_in_a_long_file_is_one_small_hunk():
    old = [f"{i}\n" for i in range(10_000)]
    new = list(old)
    new[5000] = "edited\n"
    assert list(unified(old, new)) == ["@@ -4998,7 +4998,7 @@\n", " 4997\n", " 4998\n", " 4999\n",
                                       "-5000\n", "+edited\n", " 5001\n", " 5002\n", " 5003\n"]


def test_file_diff_headers():
    assert file_diff("x", ("100644", b"a\n"), ("100644", b"a\n")) == ""
    assert file_diff("e", None, ("100644", b"")) == "diff --git a/e b/e\nnew file mode 100644\n"
    assert file_diff("t", ("100644", b"a\nb"), ("100644", b"a\nc")) == (
        "diff --git a/t b/t\n--- a/t\n+++ b/t\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n"
        "+c\n\\ No newline at end of file\n")


def test_hunks_are_difflibs_on_repeated_blocks():
    # tasks/task.py writes the committed suites' patches with `unified`; they were written with
    # difflib, and repeated blocks are where two correct diffs can align differently.
    rng = random.Random(1)
    block = [f"    step {i}\n" for i in range(6)]
    for _ in range(300):
        old = [line for _ in range(rng.randint(1, 5)) for line in [f"def f{rng.randint(0, 3)}():\n", *block]]
        new = list(old)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(new) + 1)
            new[i:i + rng.randint(0, 12)] = rng.choice([[], ["    raise NotImplementedError\n"], block])
        expected = [line for line in difflib.unified_diff(old, new, n=3)][2:]  # without ---/+++
        assert list(unified(old, new)) == expected
