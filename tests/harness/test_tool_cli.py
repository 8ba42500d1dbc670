"""The `opencomposer tool` contract: `call --workspace DIR [--json] NAME 'JSON_ARGS'` and `list`."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

OPENCOMPOSER = str(Path(sys.executable).with_name("opencomposer"))


def tool(*args, check=False):
    return subprocess.run([OPENCOMPOSER, "tool", *args], capture_output=True, text=True, timeout=120, check=check)


@pytest.fixture
def ws(tmp_path):
    (tmp_path / "main.py").write_text("print('hi')\n")
    return tmp_path


def test_call_json_prints_ok_output_error(ws):
    p = tool("call", "--workspace", str(ws), "--json", "read_file", '{"path": "main.py"}')
    assert p.returncode == 0
    obj = json.loads(p.stdout)
    assert set(obj) == {"ok", "output", "error"}
    assert obj["ok"] is True and obj["error"] is None and "     1\tprint('hi')" in obj["output"]

    p = tool("call", "--workspace", str(ws), "--json", "read_file", '{"path": "../etc/passwd"}')
    obj = json.loads(p.stdout)
    assert p.returncode == 0 and obj["ok"] is False and "out of the workspace" in obj["error"]


def test_call_plain_edits_in_place_and_errors_go_to_stderr(ws):
    p = tool("call", "--workspace", str(ws), "edit_file",
             json.dumps({"path": "main.py", "old_string": "'hi'", "new_string": "'bye'"}))
    assert p.returncode == 0 and "1 replacement" in p.stdout
    assert (ws / "main.py").read_text() == "print('bye')\n"

    p = tool("call", "--workspace", str(ws), "read_file", "{not json")
    assert p.returncode == 1 and p.stdout == "" and "invalid_json" in p.stderr


def test_call_terminal_runs_in_the_sandbox_on_dir(ws):
    p = tool("call", "--workspace", str(ws), "--json", "run_terminal_cmd",
             '{"command": "python3 main.py > out.txt; pwd; ls /root 2>&1 | head -1"}')
    obj = json.loads(p.stdout)
    assert obj["ok"], obj
    assert "/workspace" in obj["output"] and "No such file" in obj["output"]
    assert (ws / "out.txt").read_text() == "hi\n"  # in place: DIR itself changed


def test_call_refuses_to_write_the_checkouts_git_dir(ws):
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / "alias").symlink_to(".git")
    for path in [".git/hooks/pre-commit", "alias/hooks/post-checkout"]:
        p = tool("call", "--workspace", str(ws), "--json", "write_file",
                 json.dumps({"path": path, "content": "#!/bin/sh\nevil\n"}))
        obj = json.loads(p.stdout)
        assert obj["ok"] is False and "read-only" in obj["error"], obj
    assert list((ws / ".git" / "hooks").iterdir()) == []


def test_list_prints_schemas():
    p = tool("list", check=True)
    schemas = json.loads(p.stdout)
    assert {s["function"]["name"] for s in schemas} >= {"read_file", "edit_file", "run_terminal_cmd", "todo"}
