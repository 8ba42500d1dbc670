"""File tools on a host directory: read_file, edit_file, write_file, delete_file, list_dir, glob."""

import os
from pathlib import Path

import pytest

from opencomposer.harness.tools import ToolBox, ToolConfig


class HostDir:
    def __init__(self, root):
        self.root = Path(root)


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "mod.py").write_text(
        "import os\n\n\ndef add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n")
    (root / "README.md").write_text("# demo\n")
    return root


def box(root, **cfg):
    return ToolBox(HostDir(root), ToolConfig(**cfg))


# ---------------------------------------------------------------- read_file

def test_read_file_numbers_lines(ws):
    r = box(ws).call("read_file", {"path": "src/pkg/mod.py"})
    assert r.ok and r.error is None
    assert "src/pkg/mod.py (lines 1-9 of 9)" in r.output
    assert "     4\tdef add(a, b):" in r.output


def test_read_file_range_and_workspace_absolute_path(ws):
    r = box(ws).call("read_file", {"path": "/workspace/src/pkg/mod.py", "start_line": 4, "end_line": 5})
    assert r.ok
    lines = r.output.splitlines()
    assert lines[0] == "src/pkg/mod.py (lines 4-5 of 9)"
    assert lines[1:] == ["     4\tdef add(a, b):", "     5\t    return a + b"]


def test_read_file_caps_lines_and_says_where_to_continue(ws):
    (ws / "long.txt").write_text("".join(f"line {i}\n" for i in range(1, 1001)))
    r = box(ws, max_read_lines=100).call("read_file", {"path": "long.txt"})
    assert r.ok
    assert "   100\tline 100" in r.output
    assert "line 101" not in r.output
    assert "use start_line=101" in r.output
    r2 = box(ws, max_read_lines=100).call("read_file", {"path": "long.txt", "start_line": 101})
    assert "   101\tline 101" in r2.output


def test_read_file_caps_bytes(ws):
    (ws / "wide.txt").write_text(("x" * 500 + "\n") * 100)
    r = box(ws, max_read_bytes=5_000).call("read_file", {"path": "wide.txt"})
    assert r.ok and len(r.output) < 6_000
    assert "use start_line=" in r.output


def test_read_file_cuts_very_long_lines(ws):
    (ws / "min.js").write_text("a" * 10_000 + "\n")
    r = box(ws, max_line_chars=100).call("read_file", {"path": "min.js"})
    assert r.ok and "[9900 more characters]" in r.output and len(r.output) < 400


def test_read_file_errors(ws):
    b = box(ws)
    (ws / "blob.bin").write_bytes(b"\x7fELF\x00\x01\x02" * 100)
    (ws / "big.txt").write_text("y" * 2_000)
    cases = {
        "missing.py": "not_found",
        "src": "is_a_directory",
        "blob.bin": "binary_file",
    }
    for path, kind in cases.items():
        r = b.call("read_file", {"path": path})
        assert not r.ok and r.stats.error_kind == kind, (path, r)
        assert r.error and path in r.error
    r = box(ws, max_file_bytes=1_000).call("read_file", {"path": "big.txt"})
    assert not r.ok and r.stats.error_kind == "too_large" and "grep" in r.error
    r = b.call("read_file", {"path": "src/pkg/mod.py", "start_line": 50})
    assert not r.ok and r.stats.error_kind == "invalid_arguments" and "9 lines" in r.error


def test_read_file_refuses_fifo_without_blocking(ws):
    os.mkfifo(ws / "pipe")
    r = box(ws).call("read_file", {"path": "pipe"})
    assert not r.ok and r.stats.error_kind == "not_a_file"


def test_read_file_non_utf8_is_shown_with_replacement(ws):
    (ws / "latin.txt").write_bytes("café\n".encode("latin-1"))
    r = box(ws).call("read_file", {"path": "latin.txt"})
    assert r.ok and "caf\ufffd" in r.output and "not valid UTF-8" in r.output


# ---------------------------------------------------------------- edit_file

def test_edit_file_replaces_exactly_once(ws):
    r = box(ws).call("edit_file", {"path": "src/pkg/mod.py", "old_string": "return a + b",
                                   "new_string": "return b + a"})
    assert r.ok, r.error
    text = (ws / "src/pkg/mod.py").read_text()
    assert "return b + a" in text and "return a + b" not in text and "return a - b" in text
    assert "1 replacement" in r.output and "     5\t    return b + a" in r.output


def test_edit_file_no_match_shows_closest_region_with_line_numbers(ws):
    r = box(ws).call("edit_file", {"path": "src/pkg/mod.py", "old_string": "def sub(a, c):\n    return a - c",
                                   "new_string": "x"})
    assert not r.ok and r.stats.error_kind == "no_match"
    assert "lines 8-9" in r.error
    assert "     8\tdef sub(a, b):" in r.error
    assert (ws / "src/pkg/mod.py").read_text().count("def sub(a, b)") == 1  # untouched


def test_edit_file_no_match_finds_region_despite_indentation_and_in_big_files(ws):
    r = box(ws).call("edit_file", {"path": "src/pkg/mod.py", "old_string": "def add(a, b):\nreturn a + b",
                                   "new_string": "x"})
    assert r.stats.error_kind == "no_match" and "lines 4-5 (100% similar)" in r.error
    lines = [f"    result_{i} = step(data_{i}, scale={i})" for i in range(5000)]
    (ws / "big.py").write_text("\n".join(lines) + "\n")
    old = "\n".join(lines[3000:3030]).replace("scale=3010", "scale=3011")  # 5000 x 30: the anchored search
    r = box(ws).call("edit_file", {"path": "big.py", "old_string": old, "new_string": "x"})
    assert r.stats.error_kind == "no_match" and "--- lines 3001-3030 (" in r.error


def test_edit_file_ambiguous_match_says_where(ws):
    r = box(ws).call("edit_file", {"path": "src/pkg/mod.py", "old_string": "(a, b):", "new_string": "(x, y):"})
    assert not r.ok and r.stats.error_kind == "ambiguous_match"
    assert "2 times" in r.error and "lines 4, 8" in r.error and "replace_all" in r.error


def test_edit_file_replace_all(ws):
    r = box(ws).call("edit_file", {"path": "src/pkg/mod.py", "old_string": "(a, b):", "new_string": "(x, y):",
                                   "replace_all": True})
    assert r.ok and "2 replacements" in r.output
    assert (ws / "src/pkg/mod.py").read_text().count("(x, y):") == 2


def test_edit_file_keeps_crlf_and_mode(ws):
    p = ws / "win.txt"
    p.write_bytes(b"one\r\ntwo\r\nthree\r\n")
    p.chmod(0o755)
    r = box(ws).call("edit_file", {"path": "win.txt", "old_string": "one\ntwo", "new_string": "1\n2"})
    assert r.ok, r.error
    assert p.read_bytes() == b"1\r\n2\r\nthree\r\n"
    assert p.stat().st_mode & 0o777 == 0o755


def test_edit_file_bad_arguments(ws):
    b = box(ws)
    r = b.call("edit_file", {"path": "README.md", "old_string": "", "new_string": "x"})
    assert r.stats.error_kind == "invalid_arguments" and "write_file" in r.error
    r = b.call("edit_file", {"path": "README.md", "old_string": "demo", "new_string": "demo"})
    assert r.stats.error_kind == "invalid_arguments"
    (ws / "latin.txt").write_bytes("café\n".encode("latin-1"))
    r = b.call("edit_file", {"path": "latin.txt", "old_string": "caf", "new_string": "x"})
    assert r.stats.error_kind == "binary_file"
    assert (ws / "latin.txt").read_bytes() == "café\n".encode("latin-1")


# ---------------------------------------------------------------- write_file / delete_file

def test_write_file_creates_parents_and_overwrites(ws):
    b = box(ws)
    r = b.call("write_file", {"path": "new/deep/file.py", "content": "x = 1\ny = 2\n"})
    assert r.ok and r.output.startswith("Created new/deep/file.py (2 lines")
    assert (ws / "new/deep/file.py").read_text() == "x = 1\ny = 2\n"
    r = b.call("write_file", {"path": "new/deep/file.py", "content": "z"})
    assert r.ok and r.output.startswith("Overwrote")
    assert (ws / "new/deep/file.py").read_text() == "z"
    assert not [p for p in (ws / "new/deep").iterdir() if p.name != "file.py"]  # no temp files left


def test_write_file_errors(ws):
    r = box(ws).call("write_file", {"path": "src", "content": "x"})
    assert r.stats.error_kind == "is_a_directory"
    r = box(ws, max_write_bytes=10).call("write_file", {"path": "a.txt", "content": "x" * 11})
    assert r.stats.error_kind == "too_large" and not (ws / "a.txt").exists()
    r = box(ws).call("write_file", {"path": "README.md/sub.txt", "content": "x"})
    assert r.stats.error_kind == "not_a_directory"


def test_delete_file(ws):
    b = box(ws)
    r = b.call("delete_file", {"path": "README.md"})
    assert r.ok and not (ws / "README.md").exists()
    assert b.call("delete_file", {"path": "README.md"}).stats.error_kind == "not_found"
    r = b.call("delete_file", {"path": "src"})
    assert r.stats.error_kind == "is_a_directory" and (ws / "src").is_dir()


# ---------------------------------------------------------------- list_dir / glob

def test_list_dir_types_sizes_and_cap(ws):
    (ws / "src" / "link").symlink_to("pkg")
    r = box(ws).call("list_dir", {"path": "src"})
    assert r.ok
    assert r.output.splitlines() == ["src/ (2 entries)", "dir   pkg/", "link  link -> pkg"]
    r = box(ws).call("list_dir", {})
    assert "file  README.md  (7 B)" in r.output
    for i in range(30):
        (ws / f"f{i:02d}").write_text("")
    r = box(ws, max_list_entries=10).call("list_dir", {})
    assert len(r.output.splitlines()) == 12 and "22 more entries" in r.output
    assert box(ws).call("list_dir", {"path": "README.md"}).stats.error_kind == "not_a_directory"
    assert box(ws).call("list_dir", {"path": "nope"}).stats.error_kind == "not_found"


def test_glob_patterns(ws):
    (ws / "tests").mkdir()
    (ws / "tests" / "test_mod.py").write_text("")
    (ws / "src" / "pkg" / "data.json").write_text("{}")
    (ws / ".git").mkdir()
    (ws / ".git" / "hook.py").write_text("")
    b = box(ws)
    assert b.call("glob", {"pattern": "*.py"}).output.splitlines() == ["src/pkg/mod.py", "tests/test_mod.py"]
    assert b.call("glob", {"pattern": "src/**/*.{py,json}"}).output.splitlines() == [
        "src/pkg/data.json", "src/pkg/mod.py"]
    assert b.call("glob", {"pattern": "test_*.py", "path": "tests"}).output == "tests/test_mod.py"
    assert b.call("glob", {"pattern": "pkg"}).output == "src/pkg/"
    assert "No paths match" in b.call("glob", {"pattern": "*.rs"}).output
    for i in range(20):
        (ws / f"m{i:02d}.py").write_text("")
    r = box(ws, max_glob_results=5).call("glob", {"pattern": "*.py"})
    assert r.output.splitlines()[:5] == [f"m{i:02d}.py" for i in range(5)]
    assert "17 more matches" in r.output


def test_line_numbers_agree_with_grep_despite_form_feeds(ws, tmp_path):
    from opencomposer.sandbox import get_backend

    (ws / "ff.py").write_text("a = 1\x0c\nb = 2\r\nc = 3\n")
    with get_backend("bwrap", store_dir=tmp_path / "store").workspace_in_place(ws) as real:  # grep runs in its sandbox
        b = ToolBox(real)
        r = b.call("read_file", {"path": "ff.py"})
        assert "(lines 1-3 of 3)" in r.output and "     3\tc = 3" in r.output
        assert b.call("grep", {"pattern": "c = 3"}).output == "ff.py:3:c = 3"


# ---------------------------------------------------------------- hostile input: bounded work

def test_edit_file_no_match_with_a_huge_old_string_answers_quickly(ws):
    # A 40 KB old_string against a 2 MB file: the closest-region search took > 90 s (difflib's
    # exact ratio, quadratic); now an old_string that long is not searched for.
    import time

    lines = [f"    result_{i} = step(data_{i}, scale={i})" for i in range(50_000)]
    (ws / "big.py").write_text("\n".join(lines) + "\n")
    old = "\n".join(lines[20_000:21_000]).replace("scale=20010", "scale=1")
    t0 = time.perf_counter()
    r = box(ws).call("edit_file", {"path": "big.py", "old_string": old, "new_string": "x"})
    assert r.stats.error_kind == "no_match" and "too long" in r.error and "read_file" in r.error
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize("text,old", [
    ("x = x + 1; " * 200_000 + "\n", "y = y + 1; " * 4_000),  # one 2 MB line, one 44 KB line
    ("a b c d\n" * 250_000, "a b c e\n" * 300),  # repetitive: the worst case of difflib's matcher
    (("x = y + z; " * 300 + "\n") * 600, ("x = y + z; " * 300 + "!\n") * 3),  # long lines, both sides
], ids=["one-line", "repetitive", "long-lines"])
def test_edit_file_closest_region_search_is_bounded(ws, text, old):
    import time

    (ws / "big.txt").write_text(text)
    t0 = time.perf_counter()
    r = box(ws).call("edit_file", {"path": "big.txt", "old_string": old, "new_string": "x"})
    assert r.stats.error_kind == "no_match"
    assert time.perf_counter() - t0 < 5


def test_edit_file_replace_all_refuses_a_huge_result_before_building_it(ws):
    # 20,000 x "a" -> 2,500 bytes each would be 50 MB: refused from its computed size
    import tracemalloc

    (ws / "a.txt").write_text("a\n" * 20_000)
    tracemalloc.start()
    try:
        r = box(ws, max_write_bytes=1_000_000).call("edit_file", {
            "path": "a.txt", "old_string": "a", "new_string": "b" * 2_500, "replace_all": True})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.stats.error_kind == "too_large" and "50,020,000 bytes" in r.error
    assert peak < 5_000_000  # the 50 MB result was never built
    assert (ws / "a.txt").read_text() == "a\n" * 20_000


def test_glob_answers_a_hostile_pattern_quickly(ws):
    # The regex translation took > 22 s on this pattern and this name, holding the GIL.
    import time

    (ws / ("a" * 200)).write_text("")
    (ws / "sub" / ("a" * 100)).mkdir(parents=True)
    b = box(ws)
    t0 = time.perf_counter()
    r = b.call("glob", {"pattern": "*a*a*a*a*a*b"})
    assert r.ok and "No paths match" in r.output
    r = b.call("glob", {"pattern": "{a,b}" * 10})
    assert r.stats.error_kind == "invalid_arguments" and "alternatives" in r.error
    r = b.call("glob", {"pattern": "*" * 5_000})
    assert r.stats.error_kind == "invalid_arguments" and "at most 1,000" in r.error
    assert time.perf_counter() - t0 < 5


# ---------------------------------------------------------------- names and contents that are not UTF-8

NON_UTF8_NAMES = [b"\xff", b"caf\xe9.txt", b"\xed\xa0\x80.py", b"ok\x80\x81"]


def test_names_that_are_not_utf8_are_shown_with_byte_escapes(ws):
    base = os.fsencode(ws)
    for name in NON_UTF8_NAMES:
        with open(os.path.join(base, name), "wb") as f:
            f.write(b"x\n")
    os.mkdir(os.path.join(base, b"d\xfe"))
    with open(os.path.join(base, b"d\xfe", b"in\xfd.py"), "wb") as f:
        f.write(b"y\n")
    os.symlink(b"t\xfc", os.path.join(base, b"l\xfb"))
    b = box(ws)
    listing = b.call("list_dir", {})
    for r in [listing, b.call("glob", {"pattern": "*"}), b.call("glob", {"pattern": "**/*"})]:
        assert r.ok, r.error
        r.output.encode("utf-8")  # valid text: no lone surrogates
        for shown in ["\\xff", "caf\\xe9.txt", "\\xed\\xa0\\x80.py", "ok\\x80\\x81", "d\\xfe/"]:
            assert shown in r.output, (shown, r.output)
    assert "link  l\\xfb -> t\\xfc" in listing.output
    assert "d\\xfe/in\\xfd.py" in b.call("glob", {"pattern": "**/*.py"}).output
    r = b.call("list_dir", {"path": "d\udcfe"})  # a model cannot name such a path: it is refused, escaped
    assert r.stats.error_kind == "invalid_arguments" and "\\xfe" in r.error
    r.error.encode("utf-8")
