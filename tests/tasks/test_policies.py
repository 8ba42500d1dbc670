"""The in-package policies: the oracle reproduces the gold patch exactly through the file
tools; the no-op policy changes nothing; the diff parser and hunk applier they rest on."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from opencomposer.errors import TaskError
from opencomposer.harness.agent import Agent
from opencomposer.sandbox import get_backend
from opencomposer.tasks.build import task_image
from opencomposer.tasks.policies import NoOpPolicy, OraclePolicy, _edit_calls, apply_hunks, parse_patch
from opencomposer.tasks.task import Suite, diff_excludes

SMOKE = Path(__file__).resolve().parents[2] / "tasks" / "suites" / "smoke"

PATCH = """\
diff --git a/m.py b/m.py
--- a/m.py
+++ b/m.py
@@ -1,3 +1,3 @@
 a = 1
-b = 2
+b = 3
 c = 3
@@ -8,2 +8,3 @@
 y = 8
-z = 9
\\ No newline at end of file
+z = 10
+w = 11
\\ No newline at end of file
diff --git a/new.txt b/new.txt
new file mode 100644
--- /dev/null
+++ b/new.txt
@@ -0,0 +1,2 @@
+hello
+world
diff --git a/old.txt b/old.txt
deleted file mode 100644
--- a/old.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
"""
M_PY = "a = 1\nb = 2\nc = 3\nd = 4\ne = 5\nf = 6\nx = 7\ny = 8\nz = 9"


def test_parse_patch_reads_kinds_hunks_and_missing_final_newlines():
    files = parse_patch(PATCH)
    assert [(f.path, f.kind, len(f.hunks)) for f in files] == [("m.py", "modify", 2), ("new.txt", "add", 1),
                                                               ("old.txt", "delete", 1)]
    h = files[0].hunks[1]
    assert h.old == ["y = 8\n", "z = 9"] and h.new == ["y = 8\n", "z = 10\n", "w = 11"]
    assert files[1].hunks[0].new == ["hello\n", "world\n"] and files[1].hunks[0].index == 0
    assert apply_hunks(M_PY, files[0].hunks) == "a = 1\nb = 3\nc = 3\nd = 4\ne = 5\nf = 6\nx = 7\ny = 8\nz = 10\nw = 11"


def test_apply_hunks_refuses_a_patch_that_does_not_fit():
    with pytest.raises(TaskError, match="does not match"):
        apply_hunks(M_PY.replace("b = 2", "b = 5"), parse_patch(PATCH)[0].hunks, "m.py")


def _apply_edits(text: str, calls: list[dict]) -> str:
    """What edit_file does: each old_string must occur exactly once in the current text."""
    for c in calls:
        args = json.loads(c["function"]["arguments"])
        if c["function"]["name"] == "write_file":
            text = args["content"]
            continue
        assert text.count(args["old_string"]) == 1, args["old_string"]
        text = text.replace(args["old_string"], args["new_string"])
    return text


def test_edits_are_widened_until_they_match_exactly_once():
    block = "    if x:\n        return 1\n    return 0\n"
    old = "def f(x):\n" + block + "\n\ndef g(x):\n" + block
    new = "def f(x):\n" + block + "\n\ndef g(x):\n" + block.replace("return 1", "return 2")
    from opencomposer.tasks.task import text_file_diff

    hunks = parse_patch(text_file_diff("f.py", old, new))[0].hunks
    hunks[0].old, hunks[0].new = hunks[0].old[-3:], hunks[0].new[-3:]  # shrink to the ambiguous block
    hunks[0].old_start = old.count("\n") - 2
    calls = _edit_calls("f.py", old, hunks)
    args = json.loads(calls[0]["function"]["arguments"])
    assert old.count(args["old_string"]) == 1 and "def g" in args["old_string"]
    assert _apply_edits(old, calls) == new


def _stub_task(gold: str, test: str = "true"):
    return SimpleNamespace(gold_patch=gold, path=Path("stub"), spec=SimpleNamespace(environment=SimpleNamespace(test=test)))


async def test_oracle_reproduces_a_patch_with_added_modified_and_deleted_files(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    blocks = ["def f():\n    if x:\n        return 1\n    return 0\n\n\n"] * 8  # repeated: hunks must widen
    (base / "m.py").write_text("".join(blocks) + "tail\n")
    (base / "old.txt").write_text("bye\n")
    (base / "keep.txt").write_text("same\n")
    image = get_backend("bwrap").image_from_dir(base)
    with image.workspace() as ws:  # make the gold patch with the sandbox's own diff
        changed = blocks[:1] + [blocks[1].replace("return 1", "return 2")] + blocks[2:-1] + ["def f():\n"]
        (ws.root / "m.py").write_text("".join(changed) + "tail!\n")
        (ws.root / "new.txt").write_text("hello\n")
        (ws.root / "old.txt").unlink()
        gold = ws.diff()
    policy = OraclePolicy(_stub_task(gold), read=lambda p: (base / p).read_text() if (base / p).is_file() else None)
    with image.workspace() as ws:
        t = await Agent(policy, ws).run("apply")
        assert t.stop_reason == "final" and all(r.ok for r in t.tool_calls)
        assert ws.diff() == gold
    assert [r.name for r in t.tool_calls].count("edit_file") >= 2


@pytest.fixture(scope="module")
def smoke_task():
    return Suite.load(SMOKE).tasks[0]


async def test_oracle_diff_equals_the_gold_patch_on_a_smoke_task(smoke_task):
    image = task_image(smoke_task)
    with image.workspace() as ws:
        t = await Agent(OraclePolicy(smoke_task, run_tests=True), ws).run(smoke_task.spec.instruction)
        assert ws.diff(diff_excludes()) == smoke_task.gold_patch
    assert t.stop_reason == "final"
    assert [r.name for r in t.tool_calls][-1] == "run_terminal_cmd" and t.tool_calls[-1].ok
    assert "passed" in t.messages[-2]["content"]  # the visible tests ran and passed


async def test_noop_answers_without_tools(smoke_task):
    image = task_image(smoke_task)
    with image.workspace() as ws:
        t = await Agent(NoOpPolicy(), ws).run(smoke_task.spec.instruction)
        assert ws.diff(diff_excludes()) == ""
    assert t.stop_reason == "final" and t.counts.turns == 1 and t.counts.tool_calls == 0


def test_oracle_refuses_a_gold_patch_that_does_not_fit_the_workspace(tmp_path):
    policy = OraclePolicy(_stub_task(PATCH), read=lambda p: "something else\n" if p == "m.py" else None)
    with pytest.raises(TaskError, match="does not match"):
        policy.edits()
