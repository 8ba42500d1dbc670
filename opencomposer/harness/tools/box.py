"""ToolBox: the agent's tool set bound to one workspace; runs tool calls, never raises on bad input.

`run(call)` parses and validates the call's arguments against the tool's schema, runs the
tool and wraps its output, or its `ToolError`, in a `ToolResult` with `ToolStats`. An
unexpected exception inside a tool (a bug) is logged and returned as `internal_error`
rather than ending the rollout. Output and error text pass through `base.printable`, so
what goes back to the model is always valid Unicode (a file name that is not UTF-8 shows
its bytes as `\\xNN`), whatever a tool or the workspace produced.

`run_many(calls)` runs one turn's calls concurrently and returns results in call order.
Calls that write files (edit_file, write_file, delete_file) are serialized in call order,
so two edits of the same file in one turn both land; reads, searches and terminal commands
run alongside them, so a turn's calls should not depend on each other's effects.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time

from opencomposer.errors import SetupError
from opencomposer.harness.tools.base import (
    ToolCall, ToolConfig, ToolError, ToolResult, ToolSpec, ToolStats, params, printable, validate_arguments,
)
from opencomposer.harness.tools.files import FILE_TOOLS
from opencomposer.harness.tools.grep import GREP_TOOL
from opencomposer.harness.tools.paths import resolve
from opencomposer.harness.tools.terminal import TERMINAL_TOOL
from opencomposer.harness.tools.todo import TODO_TOOL, TodoList

log = logging.getLogger(__name__)


async def codebase_search(box: "ToolBox", args: dict) -> str:
    from opencomposer.harness.search import format_hits

    under = None
    if args.get("path"):
        under = "/".join(resolve(box.root, args["path"])) or None
    k = min(args.get("top_k", box.config.search_top_k), 30)
    index = box.search_index()
    hits = await asyncio.to_thread(index.search, args["query"], k, under)
    return await asyncio.to_thread(format_hits, box.root, hits, index.backend)


SEARCH_TOOL = ToolSpec(
    "codebase_search",
    "Semantic search over the workspace's code: finds the functions, classes and text passages "
    "closest in meaning to a natural-language query (e.g. 'where are retries configured'). Use "
    "grep for exact identifiers.",
    params(["query"],
           query={"type": "string", "maxLength": 2_000, "description": "What you are looking for, in words."},
           path={"type": "string", "description": "Only search under this directory."},
           top_k={"type": "integer", "minimum": 1, "description": "Number of results (default 8)."}),
    codebase_search)

TOOLS: dict[str, ToolSpec] = {t.name: t for t in [*FILE_TOOLS, GREP_TOOL, TERMINAL_TOOL, SEARCH_TOOL, TODO_TOOL]}
"""Every tool, by name, in the order schemas() lists them."""


def _bytes(arguments) -> int:
    try:
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False, default=str)
    except (RecursionError, ValueError):  # nested too deeply, or a cycle: not what a model can send
        return 0
    return len(text.encode("utf-8", errors="replace"))


def _parse(arguments) -> object:
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str):
        raise ToolError("invalid_arguments", f"arguments must be a JSON object, got {type(arguments).__name__}")
    if not arguments.strip():  # models send "" for tools called without arguments
        return {}
    try:
        return json.loads(arguments)
    except json.JSONDecodeError as e:
        raise ToolError("invalid_json", f"arguments are not valid JSON: {e.msg} at line {e.lineno} "
                        f"column {e.colno}; send a JSON object like {{\"path\": \"src/main.py\"}}") from None
    except RecursionError:
        raise ToolError("invalid_json", "arguments are nested too deeply; send a flat JSON object like "
                        "{\"path\": \"src/main.py\"}") from None


class ToolBox:
    """The tools of one workspace. State kept across calls: the todo list and the search index."""

    def __init__(self, workspace, config: ToolConfig | None = None, *, tools: list[str] | None = None,
                 embedder=None):
        """`tools` restricts the set (default: all of TOOLS); `embedder` overrides the search model."""
        self.workspace = workspace
        self.root = os.path.realpath(workspace.root)
        self.config = config or ToolConfig()
        unknown = set(tools or []) - TOOLS.keys()
        if unknown:
            raise ValueError(f"unknown tools {sorted(unknown)}; available: {', '.join(TOOLS)}")
        self.tools = {n: TOOLS[n] for n in (tools or TOOLS)}
        self.todos = TodoList()
        self._embedder = embedder
        self._index = None
        self._write_lock_loop: asyncio.AbstractEventLoop | None = None
        self._write_lock_obj: asyncio.Lock | None = None

    def schemas(self, compact: bool = False) -> list[dict]:
        """OpenAI function-calling tool schemas, one per tool (compact: see ToolSpec.schema)."""
        return [t.schema(compact) for t in self.tools.values()]

    def unfinished_todos(self) -> int:
        """Todo items still pending or in progress (for rewards)."""
        return self.todos.unfinished()

    def search_index(self):
        """The workspace's codebase_search index, built on first use."""
        if self._index is None:
            from opencomposer.harness.search import CodebaseIndex

            image = getattr(self.workspace, "image", None)
            # An in-place workspace lists its own (mutable) root as its layer: not cacheable as one.
            layers = [str(p) for p in getattr(image, "layers", ()) or () if os.path.realpath(p) != self.root]
            try:
                self._index = CodebaseIndex(self.root, layers, self.config, self._embedder)
            except SetupError as e:
                raise ToolError("setup", str(e)) from None
        return self._index

    def _write_lock(self) -> asyncio.Lock:
        # An asyncio.Lock belongs to one event loop, and `call()` runs each call in a fresh one.
        loop = asyncio.get_running_loop()
        if self._write_lock_loop is not loop:
            self._write_lock_loop, self._write_lock_obj = loop, asyncio.Lock()
        return self._write_lock_obj

    async def run(self, call: ToolCall) -> ToolResult:
        """Run one call; every failure is a ToolResult with ok=False, never an exception."""
        t0 = time.perf_counter()
        stats = ToolStats(bytes_in=_bytes(call.arguments))
        output, error = "", None
        try:
            spec = self.tools.get(call.name)
            if spec is None:
                raise ToolError("unknown_tool", f"unknown tool {call.name!r}; available tools: {', '.join(self.tools)}")
            args = validate_arguments(_parse(call.arguments), spec.parameters)
            if spec.mutates_files:
                async with self._write_lock():  # acquired in call order: FIFO lock, taken before any await
                    output = await spec.handler(self, args)
            else:
                output = await spec.handler(self, args)
        except ToolError as e:
            output, error, stats.error_kind = e.output, e.message, e.kind
        except SetupError as e:
            error, stats.error_kind = str(e), "setup"
        except Exception as e:  # a bug in a tool must not end the rollout; it is logged loudly
            log.exception("tool %s crashed on %r", call.name, call.arguments)
            error, stats.error_kind = f"internal error in tool {call.name}: {type(e).__name__}: {e}", "internal_error"
        output, error = printable(output), None if error is None else printable(error)
        stats.duration_s = time.perf_counter() - t0
        stats.bytes_out = len(output.encode("utf-8", errors="replace")) + len((error or "").encode("utf-8", errors="replace"))
        return ToolResult(call.id, call.name, error is None, output, error, stats)

    async def run_many(self, calls: list[ToolCall]) -> list[ToolResult]:
        """One turn's calls, concurrently; results in call order."""
        return list(await asyncio.gather(*(self.run(c) for c in calls)))

    def call(self, name: str, arguments: str | dict = "{}", call_id: str = "call_0") -> ToolResult:
        """Synchronous single call (CLI, scripts); not for use inside a running event loop."""
        return asyncio.run(self.run(ToolCall(call_id, name, arguments)))
