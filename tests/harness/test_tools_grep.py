"""grep: ripgrep in the workspace's sandbox with filters, context, caps and clear errors."""

import pytest

from opencomposer.harness.tools import ToolBox, ToolConfig
from opencomposer.harness.tools import grep as grep_mod
from opencomposer.sandbox import get_backend


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    return get_backend("bwrap", store_dir=tmp_path_factory.mktemp("store"))


@pytest.fixture
def ws(tmp_path, backend):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text(
        "import json\n\n\ndef load_config(path):\n    return json.load(open(path))\n\n\n"
        "def save_config(path, cfg):\n    json.dump(cfg, open(path, 'w'))\n")
    (tmp_path / "src" / "notes.md").write_text("Load the CONFIG first.\n")
    (tmp_path / ".github").mkdir()
    (tmp_path / ".github" / "ci.yml").write_text("run: load_config\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("load_config in git internals\n")
    with backend.workspace_in_place(tmp_path) as ws:
        yield ws


def grep(ws, cfg=None, **args):
    return ToolBox(ws, cfg).call("grep", args)


def test_matches_with_line_numbers_hidden_files_but_not_git(ws):
    r = grep(ws, pattern=r"def \w+_config")
    assert r.ok
    assert r.output.splitlines() == ["src/app.py:4:def load_config(path):", "src/app.py:8:def save_config(path, cfg):"]
    out = grep(ws, pattern="load_config").output
    assert ".github/ci.yml:1:run: load_config" in out and ".git/" not in out


def test_context_lines_and_separators(ws):
    r = grep(ws, pattern="def ", path="src/app.py", context_lines=1)
    assert r.output.splitlines() == [
        "src/app.py-3-", "src/app.py:4:def load_config(path):", "src/app.py-5-    return json.load(open(path))",
        "--",
        "src/app.py-7-", "src/app.py:8:def save_config(path, cfg):", "src/app.py-9-    json.dump(cfg, open(path, 'w'))"]


def test_filters_case_and_fixed_strings(ws):
    assert grep(ws, pattern="config", glob="*.md").output.startswith("No matches")
    assert grep(ws, pattern="config", glob="*.md", case_insensitive=True).output == \
        "src/notes.md:1:Load the CONFIG first."
    assert grep(ws, pattern="json.load(", fixed_strings=True).output == \
        "src/app.py:5:    return json.load(open(path))"
    assert grep(ws, pattern="json", path="src", files_with_matches=True).output == "src/app.py"


def test_caps_matches_and_says_so(ws):
    (ws.root / "many.txt").write_text("hit\n" * 500)
    r = grep(ws, ToolConfig(grep_max_matches=10), pattern="hit")
    lines = r.output.splitlines()
    assert lines[:10] == [f"many.txt:{i}:hit" for i in range(1, 11)]
    assert len(lines) == 11 and "capped at 10 matches" in lines[-1]
    r = grep(ws, ToolConfig(grep_max_output_bytes=200), pattern="hit")
    assert len(r.output) < 400 and "capped" in r.output


def test_errors(ws, monkeypatch):
    r = grep(ws, pattern="(unclosed")
    assert not r.ok and r.stats.error_kind == "invalid_arguments" and "regex" in r.error.lower()
    assert grep(ws, pattern="x", path="nope").stats.error_kind == "not_found"
    monkeypatch.setattr(grep_mod, "RG", "rg-not-installed")
    r = grep(ws, pattern="x")
    assert not r.ok and r.stats.error_kind == "setup" and "apt-get install ripgrep" in r.error


def test_timeout_kills_ripgrep(ws, monkeypatch):
    monkeypatch.setattr(grep_mod, "_rg_args", lambda *_: ["sleep", "30"])
    r = grep(ws, ToolConfig(grep_timeout_s=0.3), pattern="x")
    assert not r.ok and r.stats.error_kind == "timeout"


def test_ripgrep_exit_code_is_never_lost(ws):
    # Regression: killing an rg that had already exited reaped it early, and asyncio then
    # reported exit code 255, so a bad regex sometimes came back as "No matches".
    box = ToolBox(ws)
    kinds = {box.call("grep", {"pattern": "(unclosed"}).stats.error_kind for _ in range(50)}
    assert kinds == {"invalid_arguments"}


def test_names_and_lines_that_are_not_utf8(ws):
    base = ws.root.as_posix().encode()
    with open(base + b"/\xff.txt", "wb") as f:
        f.write("café hit\n".encode("latin-1"))
    (ws.root / "sub").mkdir()
    with open(base + b"/sub/na\xefve.py", "wb") as f:
        f.write(b"hit = 1\n\xfe\xfe context\n")
    r = grep(ws, pattern="hit", context_lines=1)
    assert r.ok, r.error
    r.output.encode("utf-8")  # valid text
    assert "\\xff.txt:1:caf\ufffd hit" in r.output  # names escaped, contents as read_file shows them
    assert "sub/na\\xefve.py:1:hit = 1" in r.output and "sub/na\\xefve.py-2-\ufffd\ufffd context" in r.output
    r = grep(ws, pattern="hit", files_with_matches=True)
    assert sorted(r.output.splitlines()) == ["\\xff.txt", "sub/na\\xefve.py"]


def test_a_name_with_a_newline_or_colon_keeps_its_lines_apart(ws):
    (ws.root / "a\nb:1:fake.txt").write_text("hit\n")
    r = grep(ws, pattern="hit", glob="*fake*")
    assert r.output == "a\nb:1:fake.txt:1:hit"


def test_minified_lines_are_cut_and_the_output_stops_at_the_caps(ws):
    (ws.root / "min.js").write_text(("var a=1;" * 100_000 + "\n") * 3)  # three 800 KB lines
    r = grep(ws, ToolConfig(max_line_chars=100), pattern="var")
    lines = r.output.splitlines()
    assert lines[:3] == ["min.js:1:" + ("var a=1;" * 13)[:100] + " ...", "min.js:2:" + ("var a=1;" * 13)[:100] + " ...",
                         "min.js:3:" + ("var a=1;" * 13)[:100] + " ..."]
    (ws.root / "many.txt").write_text("hit " * 50 + "\n" + ("hit\n" * 2_000_000))  # 8 MB of matches
    r = grep(ws, ToolConfig(grep_max_matches=5), pattern="hit", path="many.txt")
    assert len(r.output.splitlines()) == 6 and "capped at 5 matches" in r.output


def test_a_pattern_too_long_for_a_command_line_is_refused(ws):
    r = grep(ws, pattern="x" * 20_000)
    assert r.stats.error_kind == "invalid_arguments" and "at most 10,000" in r.error
