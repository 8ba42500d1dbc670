"""run_terminal_cmd in the real bwrap sandbox: output, exit codes, caps, timeout, OOM, file sharing."""

import dataclasses

import pytest

from opencomposer.harness.tools import ToolBox, ToolCall, ToolConfig
from opencomposer.harness.tools.terminal import head_tail
from opencomposer.sandbox import Limits, get_backend


@pytest.fixture
def backend(tmp_path):
    return get_backend("bwrap", store_dir=tmp_path / "store")


@pytest.fixture
def ws(backend, tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "hello.txt").write_text("hello from the host\n")
    with backend.workspace_in_place(root) as w:
        yield w


def test_head_tail_keeps_both_ends():
    text = "".join(f"{i}\n" for i in range(1000))
    cut = head_tail(text, 20, 20)
    assert cut.startswith("0\n1\n2\n") and cut.endswith("998\n999\n")
    assert f"... {len(text.encode()) - 40:,} bytes omitted ..." in cut
    assert head_tail("short", 20, 20) == "short"
    assert "\ufffd" not in head_tail("é" * 100, 3, 3)  # a cut inside a character drops it, no garbage


def test_runs_in_workspace_with_exit_code(ws):
    r = ToolBox(ws).call("run_terminal_cmd", {"command": "pwd; cat hello.txt; echo oops >&2; exit 3"})
    assert r.ok and r.stats.error_kind is None  # a failing command is a result, not a tool error
    assert r.output.splitlines() == ["exit code: 3", "--- stdout ---", "/workspace", "hello from the host",
                                     "--- stderr ---", "oops"]


def test_command_and_file_tools_see_the_same_tree(ws):
    box = ToolBox(ws)
    assert box.call("write_file", {"path": "made_by_tool.py", "content": "print(6 * 7)\n"}).ok
    r = box.call("run_terminal_cmd", {"command": "python3 made_by_tool.py > made_by_cmd.txt"})
    assert r.ok and "exit code: 0" in r.output and "(no output)" in r.output
    assert "42" in box.call("read_file", {"path": "made_by_cmd.txt"}).output


def test_links_made_in_the_sandbox_work_for_file_tools(ws):
    box = ToolBox(ws)
    assert box.call("run_terminal_cmd", {"command": "ln -s /workspace/hello.txt abs.txt; ln -s /etc/passwd pw"}).ok
    assert "hello from the host" in box.call("read_file", {"path": "abs.txt"}).output
    assert box.call("read_file", {"path": "pw"}).stats.error_kind == "path_outside_workspace"


def test_output_is_capped_head_and_tail(ws):
    box = ToolBox(ws, ToolConfig(terminal_head_bytes=200, terminal_tail_bytes=200))
    r = box.call("run_terminal_cmd", {"command": "seq 1 100000"})
    assert r.ok
    assert "\n1\n2\n3\n" in r.output and r.output.endswith("99999\n100000")
    assert "bytes omitted" in r.output and len(r.output) < 700


def test_timeout_is_reported_with_partial_output(ws):
    r = ToolBox(ws).call("run_terminal_cmd", {"command": "echo started; sleep 30", "timeout_s": 1})
    assert not r.ok and r.stats.error_kind == "timeout"
    assert "timed out after 1 s" in r.error and "started" in r.output


def test_oom_is_reported(ws):
    limits = dataclasses.replace(Limits(), memory_mb=64)
    box = ToolBox(ws, ToolConfig(terminal_limits=limits))
    r = box.call("run_terminal_cmd", {"command": "python3 -c 'x = bytearray(400 * 2**20); print(len(x))'"})
    assert not r.ok and r.stats.error_kind == "oom" and "64 MB" in r.error


def test_commands_cannot_see_host_paths(ws, tmp_path):
    r = ToolBox(ws).call("run_terminal_cmd", {"command": f"ls {tmp_path}/store 2>/dev/null || echo hidden"})
    assert r.ok and r.output.splitlines()[-1] == "hidden"


async def test_parallel_commands_in_one_turn(backend, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "x.txt").write_text("x\n")
    with backend.image_from_dir(src).workspace() as ws:
        calls = [ToolCall(str(i), "run_terminal_cmd", {"command": f"echo {i} > f{i}.txt; cat f{i}.txt"})
                 for i in range(4)]
        results = await ToolBox(ws).run_many(calls)
        assert [r.output.splitlines()[-1] for r in results] == ["0", "1", "2", "3"]
        assert all(f"+++ b/f{i}.txt" in ws.diff() for i in range(4))
    assert sorted(p.name for p in src.iterdir()) == ["x.txt"]  # the image's source is untouched


def test_output_that_is_not_utf8_comes_back_as_text(ws):
    r = ToolBox(ws).call("run_terminal_cmd", {"command": "printf 'a\\377\\376b\\n'; touch $'\\xff'; ls >&2"})
    assert r.ok and "a\ufffd\ufffdb" in r.output and "\ufffd" in r.output.split("--- stderr ---")[1]
    r.output.encode("utf-8")
