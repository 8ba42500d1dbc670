"""grep: ripgrep over the workspace with filters, context, caps and clear errors."""

from pathlib import Path

import pytest

from opencomposer.harness.tools import ToolBox, ToolConfig
from opencomposer.harness.tools import grep as grep_mod


class HostDir:
    def __init__(self, root):
        self.root = Path(root)


@pytest.fixture
def root(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text(
        "import json\n\n\ndef load_config(path):\n    return json.load(open(path))\n\n\n"
        "def save_config(path, cfg):\n    json.dump(cfg, open(path, 'w'))\n")
    (tmp_path / "src" / "notes.md").write_text("Load the CONFIG first.\n")
    (tmp_path / ".github").mkdir()
    (tmp_path / ".github" / "ci.yml").write_text("run: load_config\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("load_config in git internals\n")
    return tmp_path


def grep(root, cfg=None, **args):
    return ToolBox(HostDir(root), cfg).call("grep", args)


def test_matches_with_line_numbers_hidden_files_but_not_git(root):
    r = grep(root, pattern=r"def \w+_config")
    assert r.ok
    assert r.output.splitlines() == ["src/app.py:4:def load_config(path):", "src/app.py:8:def save_config(path, cfg):"]
    out = grep(root, pattern="load_config").output
    assert ".github/ci.yml:1:run: load_config" in out and ".git/" not in out


def test_context_lines_and_separators(root):
    r = grep(root, pattern="def ", path="src/app.py", context_lines=1)
    assert r.output.splitlines() == [
        "src/app.py-3-", "src/app.py:4:def load_config(path):", "src/app.py-5-    return json.load(open(path))",
        "--",
        "src/app.py-7-", "src/app.py:8:def save_config(path, cfg):", "src/app.py-9-    json.dump(cfg, open(path, 'w'))"]


def test_filters_case_and_fixed_strings(root):
    assert grep(root, pattern="config", glob="*.md").output.startswith("No matches")
    assert grep(root, pattern="config", glob="*.md", case_insensitive=True).output == \
        "src/notes.md:1:Load the CONFIG first."
    assert grep(root, pattern="json.load(", fixed_strings=True).output == \
        "src/app.py:5:    return json.load(open(path))"
    assert grep(root, pattern="json", path="src", files_with_matches=True).output == "src/app.py"


def test_caps_matches_and_says_so(root):
    (root / "many.txt").write_text("hit\n" * 500)
    r = grep(root, ToolConfig(grep_max_matches=10), pattern="hit")
    lines = r.output.splitlines()
    assert lines[:10] == [f"many.txt:{i}:hit" for i in range(1, 11)]
    assert len(lines) == 11 and "capped at 10 matches" in lines[-1]
    r = grep(root, ToolConfig(grep_max_output_bytes=200), pattern="hit")
    assert len(r.output) < 400 and "capped" in r.output


def test_errors(root, monkeypatch):
    r = grep(root, pattern="(unclosed")
    assert not r.ok and r.stats.error_kind == "invalid_arguments" and "regex" in r.error.lower()
    assert grep(root, pattern="x", path="nope").stats.error_kind == "not_found"
    monkeypatch.setattr(grep_mod.shutil, "which", lambda name: None)
    r = grep(root, pattern="x")
    assert not r.ok and r.stats.error_kind == "setup" and "apt-get install ripgrep" in r.error


def test_timeout_kills_ripgrep(root, monkeypatch):
    monkeypatch.setattr(grep_mod, "_rg_args", lambda args, target: ["sleep", "30"])
    r = grep(root, ToolConfig(grep_timeout_s=0.3), pattern="x")
    assert not r.ok and r.stats.error_kind == "timeout"


def test_ripgrep_exit_code_is_never_lost(root):
    # Regression: killing an rg that had already exited reaped it early, and asyncio then
    # reported exit code 255, so a bad regex sometimes came back as "No matches".
    box = ToolBox(HostDir(root))
    kinds = {box.call("grep", {"pattern": "(unclosed"}).stats.error_kind for _ in range(50)}
    assert kinds == {"invalid_arguments"}
