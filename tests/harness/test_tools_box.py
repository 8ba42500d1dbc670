"""ToolBox: schemas, argument handling, stats, concurrency of run_many, the todo tool."""

import asyncio
import json
from pathlib import Path

import pytest

from opencomposer.harness.tools import ERROR_KINDS, ToolBox, ToolCall
from opencomposer.sandbox.base import ExecResult


class FakeWorkspace:
    """Records terminal commands; each waits until `expected` of them are running at once."""

    def __init__(self, root, expected=1):
        self.root = Path(root)
        self.running, self.peak, self.expected = 0, 0, expected
        self.all_in = asyncio.Event()

    async def aexec(self, cmd, *, limits=None, **_):
        self.running += 1
        self.peak = max(self.peak, self.running)
        if self.running >= self.expected:
            self.all_in.set()
        await asyncio.wait_for(self.all_in.wait(), 5)  # deadlocks (then times out) if calls ran one by one
        self.running -= 1
        return ExecResult(0, f"ran {cmd}\n", "")


@pytest.fixture
def root(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    return tmp_path


def test_schemas_are_openai_function_tools(root):
    schemas = ToolBox(FakeWorkspace(root)).schemas()
    names = [s["function"]["name"] for s in schemas]
    assert names == ["read_file", "edit_file", "write_file", "delete_file", "list_dir", "glob", "grep",
                     "run_terminal_cmd", "codebase_search", "todo"]
    for s in schemas:
        assert s["type"] == "function"
        fn = s["function"]
        assert fn["description"] and fn["parameters"]["type"] == "object"
        assert set(fn["parameters"]["required"]) <= set(fn["parameters"]["properties"])
        json.dumps(s)  # serializable as is


def test_tool_subset(root):
    box = ToolBox(FakeWorkspace(root), tools=["read_file", "grep"])
    assert [s["function"]["name"] for s in box.schemas()] == ["read_file", "grep"]
    assert box.call("write_file", {"path": "b", "content": ""}).stats.error_kind == "unknown_tool"
    with pytest.raises(ValueError, match="unknown tools"):
        ToolBox(FakeWorkspace(root), tools=["rm_rf"])


def test_compact_schemas_keep_required_parameters_and_still_accept_optional_ones(root):
    box = ToolBox(FakeWorkspace(root), tools=["read_file", "edit_file"])
    full, compact = box.schemas(), box.schemas(compact=True)
    assert len(json.dumps(compact)) < len(json.dumps(full)) / 2
    for f, c in zip(full, compact):
        f, c = f["function"], c["function"]
        assert c["name"] == f["name"] and f["description"].startswith(c["description"][:-1])
        assert set(c["parameters"]["properties"]) == set(c["parameters"]["required"]) == set(f["parameters"]["required"])
    result = box.call("read_file", {"path": "a.py", "start_line": 1})  # optional argument, not in the compact schema
    assert result.ok and "x = 1" in result.output


@pytest.mark.parametrize("name,args,kind,needle", [
    ("frobnicate", "{}", "unknown_tool", "available tools: read_file"),
    ("read_file", '{"path": "a.py"', "invalid_json", "not valid JSON"),
    ("read_file", "[1, 2]", "invalid_arguments", "JSON object"),
    ("read_file", '{"path": 7}', "invalid_arguments", "'path' must be a string, got integer 7"),
    ("read_file", '{}', "invalid_arguments", "missing required argument 'path'"),
    ("read_file", '{"path": "a.py", "start_line": "3"}', "invalid_arguments", "'start_line' must be an integer"),
    ("read_file", '{"path": "a.py", "start_line": 0}', "invalid_arguments", "'start_line' must be >= 1"),
    ("read_file", '{"path": "a.py", "lines": 3}', "invalid_arguments", "unknown argument 'lines'"),
    ("edit_file", '{"path": "a.py", "old_string": "x", "new_string": "y", "replace_all": "yes"}',
     "invalid_arguments", "'replace_all' must be a boolean"),
    ("todo", '{"action": "explode"}', "invalid_arguments", "must be one of"),
    ("todo", '{"action": "add", "items": [1]}', "invalid_arguments", "'items[0]' must be a string"),
    ("run_terminal_cmd", '{"command": "ls", "timeout_s": 99999}', "invalid_arguments", "maximum"),
])
def test_bad_calls_are_errors_not_exceptions(root, name, args, kind, needle):
    r = ToolBox(FakeWorkspace(root)).call(name, args)
    assert not r.ok and r.output == ""
    assert r.stats.error_kind == kind and kind in ERROR_KINDS
    assert needle in r.error


def test_lenient_but_exact_argument_forms(root):
    box = ToolBox(FakeWorkspace(root))
    assert box.call("list_dir", "").ok  # empty argument string = no arguments
    assert box.call("read_file", {"path": "a.py", "start_line": 1.0, "end_line": None}).ok  # 1.0 is an integer


def test_stats_are_filled(root):
    box = ToolBox(FakeWorkspace(root))
    args = '{"path": "a.py"}'
    r = box.call("read_file", args, call_id="c1")
    assert r.call_id == "c1" and r.name == "read_file"
    assert r.stats.bytes_in == len(args) and r.stats.bytes_out == len(r.output.encode())
    assert r.stats.duration_s > 0 and r.stats.error_kind is None
    bad = box.call("read_file", {"path": "nope.py"})
    assert bad.stats.bytes_out == len(bad.error.encode()) and bad.stats.error_kind == "not_found"


def test_a_crashing_tool_returns_internal_error(root, monkeypatch):
    from opencomposer.harness.tools import files

    def boom(box, args):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(files, "_list_dir", boom)
    r = ToolBox(FakeWorkspace(root)).call("list_dir", {})
    assert not r.ok and r.stats.error_kind == "internal_error" and "disk on fire" in r.error


async def test_run_many_runs_calls_concurrently_in_order(root):
    ws = FakeWorkspace(root, expected=3)
    box = ToolBox(ws)
    calls = [ToolCall(f"c{i}", "run_terminal_cmd", json.dumps({"command": f"job {i}"})) for i in range(3)]
    calls.insert(1, ToolCall("r", "read_file", '{"path": "a.py"}'))
    results = await box.run_many(calls)
    assert ws.peak == 3  # all three commands were in flight at once
    assert [r.call_id for r in results] == ["c0", "r", "c1", "c2"]
    assert all(r.ok for r in results), [r.error for r in results]
    assert "ran job 2" in results[3].output


async def test_run_many_applies_file_writes_in_call_order(root):
    box = ToolBox(FakeWorkspace(root))
    calls = [ToolCall("w", "write_file", {"path": "f.txt", "content": "a\n"})]
    calls += [ToolCall(f"e{i}", "edit_file", {"path": "f.txt", "old_string": f"{chr(97 + i)}\n",
                                             "new_string": f"{chr(97 + i)}\n{chr(98 + i)}\n"}) for i in range(5)]
    results = await box.run_many(calls)
    assert all(r.ok for r in results), [r.error for r in results]
    assert (root / "f.txt").read_text() == "a\nb\nc\nd\ne\nf\n"


def test_todo_list_lifecycle(root):
    box = ToolBox(FakeWorkspace(root))
    r = box.call("todo", {"action": "list"})
    assert r.ok and "empty" in r.output
    r = box.call("todo", {"action": "add", "items": ["write test", "fix bug", "update docs"]})
    assert "3 of 3 unfinished" in r.output and "  2. [pending]     fix bug" in r.output
    assert box.unfinished_todos() == 3
    box.call("todo", {"action": "complete", "id": 1})
    box.call("todo", {"action": "update", "id": 2, "status": "in_progress"})
    r = box.call("todo", {"action": "update", "id": 3, "status": "cancelled", "content": "skip docs"})
    assert "[cancelled]   skip docs" in r.output and "[completed]   write test" in r.output
    assert box.unfinished_todos() == 1
    r = box.call("todo", {"action": "add", "items": ["more"]})
    assert "  4. [pending]     more" in r.output
    assert box.call("todo", {"action": "complete", "id": 9}).stats.error_kind == "not_found"
    assert box.call("todo", {"action": "complete"}).stats.error_kind == "invalid_arguments"
    assert box.call("todo", {"action": "update", "id": 2}).stats.error_kind == "invalid_arguments"
    assert box.call("todo", {"action": "add", "items": []}).stats.error_kind == "invalid_arguments"
    assert ToolBox(FakeWorkspace(root)).unfinished_todos() == 0  # state is per ToolBox



# ---------------------------------------------------------------- hostile input: text that is not text, sizes, nesting

class SurrogateTerminal(FakeWorkspace):
    """A backend that decodes command output with surrogateescape, as os functions do."""

    async def aexec(self, cmd, *, limits=None, **_):
        return ExecResult(0, b"out \xff\xfe done\n".decode("utf-8", "surrogateescape"), "err \ud800\n")


def test_every_output_and_error_is_valid_text(root):
    r = ToolBox(SurrogateTerminal(root)).call("run_terminal_cmd", {"command": "cat blob"})
    assert r.ok and "out \\xff\\xfe done" in r.output and "err \\ud800" in r.output
    assert r.stats.bytes_out == len(r.output.encode("utf-8"))


@pytest.mark.parametrize("name,args,needle", [
    ("todo", '{"action": "add", "items": ["fix \\ud800 bug"]}', "'items[0]' holds a lone surrogate (\\ud800"),
    ("todo", '{"action": "add", "items": ["ok"]}|{"action": "update", "id": 1, "content": "\\udcff"}',
     "'content' holds a lone surrogate (\\xff"),
    ("write_file", '{"path": "a.txt", "content": "x\\udc80y"}', "'content' holds a lone surrogate (\\x80"),
    ("read_file", '{"path": "caf\\udce9.txt"}', "(\\xe9 at character 3)"),
    ("grep", '{"pattern": "\\ud83d"}', "'pattern' holds a lone surrogate (\\ud83d"),
    ("run_terminal_cmd", '{"command": "echo \\udfff"}', "(\\udfff at character 5)"),
])
def test_lone_surrogates_in_arguments_are_refused_and_echoed_escaped(root, name, args, needle):
    box = ToolBox(FakeWorkspace(root))
    *setup, args = args.split("|")
    for a in setup:
        assert box.call(name, a).ok
    r = box.call(name, args)
    assert r.stats.error_kind == "invalid_arguments" and needle in r.error, r.error
    r.error.encode("utf-8")
    assert not (root / "a.txt").exists()


def test_deeply_nested_arguments_are_an_error_not_a_crash(root):
    box = ToolBox(FakeWorkspace(root))
    r = box.call("read_file", '{"path": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert r.stats.error_kind == "invalid_json" and "nested too deeply" in r.error
    nested: list = []
    for _ in range(100_000):  # an API client can hand over any Python object
        nested = [nested]
    r = box.call("read_file", {"path": nested})
    assert r.stats.error_kind == "invalid_arguments" and "must be a string, got array" in r.error


@pytest.mark.parametrize("name,args,needle", [
    ("run_terminal_cmd", {"command": "echo " + "x" * 200_000}, "write the script to a file"),
    ("run_terminal_cmd", {"command": "echo " + "é" * 60_000}, "120,005 bytes"),
    ("grep", {"pattern": "x" * 20_000}, "at most 10,000"),
    ("grep", {"pattern": "x", "glob": "*" * 5_000}, "at most 1,000"),
    ("glob", {"pattern": "a" * 5_000}, "at most 1,000"),
    ("codebase_search", {"query": "word " * 2_000}, "at most 2,000"),
    ("todo", {"action": "add", "items": ["x" * 5_000]}, "at most 1,000"),
    ("todo", {"action": "add", "items": [f"task {i}" for i in range(101)]}, "at most 100 are kept"),
])
def test_oversized_arguments_are_refused_before_any_work(root, name, args, needle):
    ws = FakeWorkspace(root)
    box = ToolBox(ws)
    r = box.call(name, args)
    assert r.stats.error_kind == "invalid_arguments" and needle in r.error, r.error
    assert ws.running == ws.peak == 0 and box.todos.items == []  # nothing ran, nothing was kept


def test_the_todo_list_stays_bounded_across_calls(root):
    box = ToolBox(FakeWorkspace(root))
    for i in range(10):
        assert box.call("todo", {"action": "add", "items": [f"t{i}.{j}" for j in range(10)]}).ok
    r = box.call("todo", {"action": "add", "items": ["one more"]})
    assert r.stats.error_kind == "invalid_arguments" and len(box.todos.items) == 100
