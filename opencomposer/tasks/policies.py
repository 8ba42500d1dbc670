"""Deterministic policies that ship in the package: for evaluation checks and for tests.

- `OraclePolicy(task)`: replays the task's gold patch through the agent's own file tools,
  in one turn of parallel calls: `write_file` for created files, `delete_file` for deleted
  ones, and for modified files one `edit_file` per hunk whose old_string is the hunk's old
  side, widened line by line (from the workspace's known content) until it occurs exactly
  once in the file as it is at that point, so every edit lands where the patch says. Then,
  optionally, one `run_terminal_cmd` with the task's test command; then it answers without
  tool calls. `opencomposer eval --policy oracle` must score 100% on a valid suite: it
  checks the whole chain (workspace, tools, diff, grader) end to end.
- `NoOpPolicy`: answers at once without tools; must score 0% (a task that passes with no
  change is not a task).
- `ScriptedPolicy` / `ScriptedTokenPolicy`: replay fixed turns (chat level / token level,
  with deterministic logprobs, routed experts and policy versions), for tests of the loop
  and of anything built on it.

The oracle knows the broken workspace's files without a sandbox: a generated task's
`workspace/` directory, or a pypi task's cached sdist layer with `break.patch` applied
(`apply_hunks` below, checked line by line, so a patch that does not fit raises TaskError).

Left out: renames, binary files and mode changes in gold patches (the task format's
diffs have none).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from opencomposer.engine.types import GenerationResult, SamplingParams
from opencomposer.errors import TaskError
from opencomposer.harness.agent import ChatReply
from opencomposer.model.chat import stop_token_ids
from opencomposer.model.tokenizer import Tokenizer
from opencomposer.tasks.task import Task

# ----------------------------------------------------------------------------- unified diffs


@dataclass
class Hunk:
    """One @@ block. Lines keep their endings (the last may lack one: "No newline at end of file")."""

    old_start: int
    new_start: int
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)

    @property
    def index(self) -> int:
        """0-based index of the hunk's first old line (for an insertion: the line it goes before)."""
        return self.old_start - 1 if self.old else self.old_start


@dataclass
class FilePatch:
    path: str
    kind: str
    """"add", "delete" or "modify"."""
    hunks: list[Hunk] = field(default_factory=list)


_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _strip_prefix(path: str) -> str:
    path = path.rstrip("\n").split("\t")[0]
    return path[2:] if path[:2] in ("a/", "b/") else path


def parse_patch(text: str) -> list[FilePatch]:
    """Parse a (git-style or plain) unified diff into per-file hunks."""
    files: list[FilePatch] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(("rename from", "copy from", "Binary files", "GIT binary patch")):
            raise TaskError(f"patch line {i + 1}: renames, copies and binary files are not supported: {line.strip()}")
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = line[4:].rstrip("\n"), lines[i + 1][4:].rstrip("\n")
            kind = "add" if old.startswith("/dev/null") else "delete" if new.startswith("/dev/null") else "modify"
            files.append(FilePatch(_strip_prefix(old if kind == "delete" else new), kind))
            i += 2
            continue
        m = _HUNK_RE.match(line)
        if m:
            if not files:
                raise TaskError(f"patch line {i + 1}: a hunk before any ---/+++ header")
            hunk = Hunk(int(m[1]), int(m[3]))
            n_old = int(m[2]) if m[2] is not None else 1
            n_new = int(m[4]) if m[4] is not None else 1
            i += 1
            last = ""
            while i < len(lines) and (len(hunk.old) < n_old or len(hunk.new) < n_new or lines[i].startswith("\\")):
                body = lines[i]
                tag, content = body[:1], body[1:]
                if tag == "\\":  # "\ No newline at end of file": the previous line has no "\n"
                    for side in ([hunk.old] if last == "-" else [hunk.new] if last == "+" else [hunk.old, hunk.new]):
                        side[-1] = side[-1].removesuffix("\n")
                elif tag in (" ", "\n"):
                    content = "\n" if tag == "\n" else content  # an empty context line whose space was stripped
                    hunk.old.append(content)
                    hunk.new.append(content)
                elif tag == "-":
                    hunk.old.append(content)
                elif tag == "+":
                    hunk.new.append(content)
                else:
                    raise TaskError(f"patch line {i + 1}: unexpected line in a hunk: {body[:60]!r}")
                last = tag
                i += 1
            files[-1].hunks.append(hunk)
            continue
        i += 1
    return files


def apply_hunks(text: str, hunks: Sequence[Hunk], path: str = "") -> str:
    """Apply a file's hunks to its text, checking every old line (TaskError if one differs)."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    pos = 0
    for h in hunks:
        start = h.index
        if lines[start:start + len(h.old)] != h.old or start < pos:
            raise TaskError(f"{path}: hunk @@ -{h.old_start} does not match the file's lines {start + 1}-"
                            f"{start + len(h.old)}")
        out += lines[pos:start] + h.new
        pos = start + len(h.old)
    return "".join(out + lines[pos:])


# ----------------------------------------------------------------------------- the oracle


def _edit_calls(path: str, text: str, hunks: Sequence[Hunk]) -> list[dict]:
    """edit_file calls that turn `text` into the patched text, each matching exactly once
    in the file as the previous calls left it (hunks widened with neighbouring lines)."""
    lines = text.splitlines(keepends=True)
    calls = []
    delta = 0  # lines added minus removed by earlier hunks
    for h in hunks:
        a = h.index + delta
        b = a + len(h.old)
        if lines[a:b] != h.old:
            raise TaskError(f"{path}: gold.patch hunk @@ -{h.old_start} does not match the workspace's file")
        lo, hi = a, b
        current = "".join(lines)
        while True:
            old = "".join(lines[lo:hi])
            if old and current.count(old) == 1:
                break
            if lo == 0 and hi == len(lines):
                break
            # widen downwards first (the text after a change is usually more distinctive), then up
            if hi < len(lines) and (hi - b <= a - lo or lo == 0):
                hi += 1
            else:
                lo -= 1
        new_lines = lines[lo:a] + h.new + lines[b:hi]
        if old:
            calls.append(_call("edit_file", path=path, old_string=old, new_string="".join(new_lines)))
        else:  # the file was empty: nothing to match
            calls.append(_call("write_file", path=path, content="".join(new_lines)))
        lines[lo:hi] = new_lines
        delta += len(h.new) - len(h.old)
    return calls


def _call(name: str, **arguments) -> dict:
    return {"id": "", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _workspace_reader(task: Task) -> Callable[[str], str | None]:
    """A function: workspace-relative path -> the broken workspace's text of it (None if absent)."""
    if task.spec.source.kind == "generated":
        root = task.workspace_dir

        def read(path: str) -> str | None:
            p = root / path
            return p.read_text() if p.is_file() else None
        return read

    src = task.spec.source
    broken = {f.path: f for f in parse_patch(task.break_patch)}

    @lru_cache(maxsize=None)
    def layer() -> Path:
        from opencomposer.tasks.build import source_layer

        return source_layer(src.package, src.version, src.sha256)

    def read(path: str) -> str | None:
        p = layer() / path
        text = p.read_text() if p.is_file() else None
        fp = broken.get(path)
        if fp is None:
            return text
        if fp.kind == "delete":
            return None
        return apply_hunks(text or "", fp.hunks, path)
    return read


class OraclePolicy:
    """Replays the task's gold patch with edit_file / write_file / delete_file (see module doc)."""

    name = "oracle"

    def __init__(self, task: Task, *, run_tests: bool = False,
                 read: Callable[[str], str | None] | None = None):
        self.task = task
        self.run_tests = run_tests
        self._read = read or _workspace_reader(task)
        self._edits: list[dict] | None = None

    def edits(self) -> list[dict]:
        """The tool calls of the editing turn (OpenAI tool-call dicts), computed once."""
        if self._edits is None:
            calls = []
            for fp in parse_patch(self.task.gold_patch):
                if fp.kind == "add":
                    calls.append(_call("write_file", path=fp.path, content="".join(fp.hunks[0].new if fp.hunks else [])))
                elif fp.kind == "delete":
                    calls.append(_call("delete_file", path=fp.path))
                else:
                    text = self._read(fp.path)
                    if text is None:
                        raise TaskError(f"{self.task.path}: gold.patch modifies {fp.path}, which the workspace lacks")
                    calls += _edit_calls(fp.path, text, fp.hunks)
            for k, c in enumerate(calls):
                c["id"] = f"oracle_{k}"
            self._edits = calls
        return self._edits

    async def chat(self, messages: list[dict], tools: list[dict]) -> ChatReply:
        done = sum(m["role"] == "assistant" for m in messages)
        plan = [{"role": "assistant", "content": "Applying the reference solution.", "tool_calls": self.edits()}]
        if self.run_tests:
            plan.append({"role": "assistant", "content": "Running the tests.", "tool_calls": [
                _call("run_terminal_cmd", command=self.task.spec.environment.test) | {"id": "oracle_test"}]})
        if done < len(plan):
            return ChatReply(plan[done])
        return ChatReply({"role": "assistant", "content": "Applied the reference solution."})


class NoOpPolicy:
    """Answers at once, without tools."""

    name = "noop"

    async def chat(self, messages: list[dict], tools: list[dict]) -> ChatReply:
        return ChatReply({"role": "assistant", "content": "I am not making any changes."})


# ----------------------------------------------------------------------------- scripted policies


class ScriptedPolicy:
    """Chat level: returns `replies` in order (a dict, a ChatReply, or a callable of the
    messages returning one); an Exception in the list is raised at its turn. After the
    script: a final answer without tools. `seen` records the messages of every call."""

    def __init__(self, replies: Sequence, name: str = "scripted", prices=None):
        self.replies, self.name, self.prices = list(replies), name, prices
        self.seen: list[list[dict]] = []

    async def chat(self, messages: list[dict], tools: list[dict]) -> ChatReply:
        self.seen.append(messages)
        if len(self.seen) > len(self.replies):
            return ChatReply({"role": "assistant", "content": "Done."})
        r = self.replies[len(self.seen) - 1]
        if isinstance(r, BaseException):
            raise r
        r = r(messages) if callable(r) else r
        return r if isinstance(r, ChatReply) else ChatReply(r)


@lru_cache(maxsize=16)
def _special_re(strings: tuple[str, ...]) -> re.Pattern:
    return re.compile("(" + "|".join(re.escape(s) for s in sorted(strings, key=len, reverse=True)) + ")")


def text_to_ids(tok: Tokenizer, text: str) -> list[int]:
    """Ids of text in which the tokenizer's special strings ("<|tool_call|>" in opencomposer's
    format, "<tool_call>" in Qwen3's) stand for their tokens."""
    ids: list[int] = []
    for k, piece in enumerate(_special_re(tuple(tok.special)).split(text)):
        ids += [tok.special_id(piece)] if k % 2 else tok.encode(piece) if piece else []
    return ids


class ScriptedTokenPolicy:
    """Token level: returns `outputs` in order (text with special strings, or ids; an Exception
    is raised), ending each with the chat format's turn end unless cut by max_new_tokens. Logprobs, routed
    experts ([T, n_layers, top_k]) and policy versions are deterministic functions of the ids,
    so tests can check they land in the trajectory next to the right tokens."""

    def __init__(self, tokenizer: Tokenizer, outputs: Sequence, *, n_layers: int = 2, top_k: int = 2,
                 n_experts: int = 8, version: int = 0, name: str = "scripted-tokens"):
        self.tokenizer, self.outputs, self.name = tokenizer, list(outputs), name
        self.n_layers, self.top_k, self.n_experts, self.version = n_layers, top_k, n_experts, version
        self.prompts: list[list[int]] = []

    @staticmethod
    def logprob(token_id: int) -> float:
        return -((token_id % 7) + 1) / 8

    def experts(self, ids: Sequence[int]) -> np.ndarray:
        t = np.asarray(ids, dtype=np.int32)[:, None, None]
        layer = np.arange(self.n_layers, dtype=np.int32)[None, :, None]
        k = np.arange(self.top_k, dtype=np.int32)[None, None, :]
        return (t + 3 * layer + k) % self.n_experts  # [T, L, K]

    async def generate(self, input_ids: list[int], sampling: SamplingParams) -> GenerationResult:
        self.prompts.append(list(input_ids))
        n = len(self.prompts)
        out = self.outputs[n - 1] if n <= len(self.outputs) else "Done."
        if isinstance(out, BaseException):
            raise out
        ids = text_to_ids(self.tokenizer, out) if isinstance(out, str) else list(out)
        end = stop_token_ids(self.tokenizer)[0]  # the chat format's turn end
        if not ids or ids[-1] != end:
            ids.append(end)
        reason = "stop"
        if len(ids) > sampling.max_new_tokens:
            ids, reason = ids[:sampling.max_new_tokens], "length"
        return GenerationResult(request_id=f"scripted-{n}", prompt_ids=list(input_ids), output_ids=ids,
                                finish_reason=reason, logprobs=[self.logprob(t) for t in ids],
                                routed_experts=self.experts(ids), policy_versions=[self.version] * len(ids))
