"""Plain data types of the tool seam, the tool config, and argument validation.

The harness sees messages, tool calls and tool results. A `ToolCall` is what a model wrote
(its arguments as the raw JSON string, or an already parsed dict); a `ToolResult` is what
goes back to the model, plus `ToolStats` for rewards and metrics. Every failure of a call
is a `ToolError` inside a tool, turned into `ok=False` with an `error_kind` by the ToolBox:
bad input from a model is data, never an exception that ends a rollout.

Argument validation covers the JSON Schema subset the tool schemas use (object with
`properties`, `required`, `additionalProperties: false`; string / integer / boolean / array
of strings; `enum`; `minimum`; `maxLength`). It is not a general JSON Schema validator. A
string holding a lone surrogate (JSON can spell one, "\\ud800"; it is not text) is refused.

Text that goes back to the model is valid Unicode: `printable()` (applied by the ToolBox to
every output and error) shows a lone surrogate as an escape, `\\xNN` for the byte of a file
name that is not UTF-8 (Python's os functions decode such a byte as U+DCNN), `\\uNNNN` else.
"""

from __future__ import annotations

import re
import reprlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Literal

from opencomposer.sandbox.base import Limits


@dataclass
class ToolCall:
    """One tool call as a model wrote it."""

    id: str
    name: str
    arguments: str | dict
    """The raw JSON string the model wrote, or an already parsed dict."""


@dataclass
class ToolStats:
    """What one call cost, for rewards and metrics."""

    bytes_in: int = 0
    """UTF-8 bytes of the call's arguments."""
    bytes_out: int = 0
    """UTF-8 bytes of the output plus the error text returned to the model."""
    duration_s: float = 0.0
    """Wall-clock time of the call, validation included."""
    error_kind: str | None = None
    """None on success, else a short machine-readable kind (see `ERROR_KINDS`)."""


@dataclass
class ToolResult:
    """What goes back to the model for one call."""

    call_id: str
    name: str
    ok: bool
    output: str
    error: str | None = None
    stats: ToolStats = field(default_factory=ToolStats)


ERROR_KINDS = (
    "unknown_tool", "invalid_json", "invalid_arguments", "path_outside_workspace", "not_found",
    "not_a_file", "not_a_directory", "is_a_directory", "binary_file", "too_large", "no_match",
    "ambiguous_match", "timeout", "oom", "setup", "internal_error", "path_read_only",
)
"""Every `ToolStats.error_kind` a ToolBox can return."""


class ToolError(Exception):
    """A tool call failed in a way the model should hear about (never raised out of `ToolBox.run`).

    `output` carries partial output worth showing anyway (e.g. what a timed-out command printed).
    """

    def __init__(self, kind: str, message: str, output: str = ""):
        assert kind in ERROR_KINDS, kind
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.output = output


@dataclass(frozen=True)
class ToolConfig:
    """Caps and defaults of the tool set. The defaults suit a 256k-context agent."""

    max_read_lines: int = 500
    """Lines read_file returns per call at most (and by default)."""
    max_read_bytes: int = 60_000
    """Bytes of file text read_file returns per call at most."""
    max_line_chars: int = 2_000
    """Longer lines are cut in read_file and grep output (minified files)."""
    max_file_bytes: int = 20_000_000
    """read_file / edit_file refuse larger files (too_large): use grep or the terminal."""
    max_write_bytes: int = 20_000_000
    """write_file / edit_file refuse to write more than this."""
    max_list_entries: int = 300
    """Entries list_dir shows at most."""
    max_glob_results: int = 300
    """Paths glob returns at most."""
    grep_max_matches: int = 100
    """Matching lines grep returns at most (over all files)."""
    grep_max_output_bytes: int = 40_000
    """Bytes of grep output at most."""
    grep_timeout_s: float = 30.0
    """ripgrep is killed after this long."""
    terminal_timeout_s: float = 120.0
    """Default timeout of run_terminal_cmd."""
    terminal_max_timeout_s: float = 1_200.0
    """Largest timeout a model may ask run_terminal_cmd for."""
    terminal_head_bytes: int = 12_000
    """run_terminal_cmd keeps this many bytes from the start of stdout and of stderr..."""
    terminal_tail_bytes: int = 12_000
    """...and this many from the end, with an '... N bytes omitted ...' marker between."""
    terminal_limits: Limits = field(default_factory=Limits)
    """Memory / pids / file-size / network limits of terminal commands (timeout set per call)."""
    search_backend: Literal["auto", "embed", "bm25"] = "auto"
    """codebase_search ranking: embeddings when the model package is installed ("auto"), or BM25."""
    search_top_k: int = 8
    """Results codebase_search returns by default."""
    search_cache_dir: Path | None = None
    """Where per-layer embedding indexes live (default: $OPENCOMPOSER_CACHE/search or ~/.cache/opencomposer/search)."""
    search_max_files: int = 5_000
    """Files codebase_search indexes at most per directory tree."""
    search_max_file_bytes: int = 400_000
    """Larger files are not indexed by codebase_search."""


_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_surrogate(m: re.Match) -> str:
    code = ord(m.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` as valid Unicode: each lone surrogate becomes an escape (see the module docstring),
    so a file named b'\\xff' shows as `\\xff`, as Python writes that byte in a bytes literal."""
    if text.isascii() or not _SURROGATE.search(text):
        return text
    return _SURROGATE.sub(_escape_surrogate, text)


def split_lines(text: str) -> list[str]:
    """Lines as editors, grep and `ast` number them: split at \\n only (not at form feeds or
    U+2028 as `str.splitlines` does), a trailing \\r dropped, no empty line after a final \\n."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


Handler = Callable[..., Awaitable[str]]


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its OpenAI function schema parts and its implementation."""

    name: str
    description: str
    parameters: dict
    handler: Handler
    """`async handler(box, args) -> output`; raises ToolError on failure."""
    mutates_files: bool = False
    """Calls that write files are serialized in call order within a ToolBox."""

    def schema(self, compact: bool = False) -> dict:
        """The OpenAI function schema. compact: the description's first sentence and only the
        required parameters, without their descriptions (optional arguments are still accepted)."""
        if not compact:
            return {"type": "function",
                    "function": {"name": self.name, "description": self.description,
                                 "parameters": self.parameters}}
        required = self.parameters.get("required", [])
        props = {k: {"type": v["type"]} for k, v in self.parameters.get("properties", {}).items() if k in required}
        return {"type": "function",
                "function": {"name": self.name, "description": self.description.split(". ")[0].rstrip(".") + ".",
                             "parameters": {"type": "object", "properties": props, "required": required}}}


def params(required: list[str], **props: dict) -> dict:
    """An object schema with no extra properties allowed."""
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


_JSON_TYPES = {"string": "a string", "integer": "an integer", "boolean": "a boolean",
               "array": "an array", "object": "an object", "number": "a number"}


def _type_ok(value: Any, typ: str) -> bool:
    if typ == "string":
        return isinstance(value, str)
    if typ == "integer":  # JSON has no int/float split: 3.0 is accepted as 3, True is not
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if typ == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if typ == "boolean":
        return isinstance(value, bool)
    if typ == "array":
        return isinstance(value, list)
    if typ == "object":
        return isinstance(value, dict)
    raise ValueError(f"schema type {typ!r} not supported")


_REPR = reprlib.Repr()  # bounded: a huge or deeply nested argument costs nothing to describe
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 2, 62, 62


def _describe(value: Any) -> str:
    text = _REPR.repr(value)
    kind = {str: "string", bool: "boolean", int: "integer", float: "number", list: "array",
            dict: "object", type(None): "null"}.get(type(value), type(value).__name__)
    return f"{kind} {text[:60]}{'...' if len(text) > 60 else ''}"


def validate_arguments(args: Any, schema: dict) -> dict:
    """Check `args` against an object schema; return it with integers normalized.

    Raises ToolError("invalid_arguments") naming the offending argument.
    """
    if not isinstance(args, dict):
        raise ToolError("invalid_arguments", f"arguments must be a JSON object, got {_describe(args)}")
    props = schema.get("properties", {})
    unknown = [k for k in args if k not in props]
    if unknown and schema.get("additionalProperties") is False:
        raise ToolError("invalid_arguments",
                        f"unknown argument {unknown[0]!r}; expected: {', '.join(props)}")
    missing = [k for k in schema.get("required", []) if args.get(k) is None]
    if missing:
        raise ToolError("invalid_arguments", f"missing required argument {missing[0]!r}")
    out = {}
    for key, value in args.items():
        if value is None:  # models often send explicit nulls for optional arguments
            continue
        out[key] = _check(key, value, props[key])
    return out


def _check(key: str, value: Any, prop: dict) -> Any:
    typ = prop["type"]
    if not _type_ok(value, typ):
        raise ToolError("invalid_arguments",
                        f"argument {key!r} must be {_JSON_TYPES[typ]}, got {_describe(value)}")
    if typ == "integer":
        value = int(value)
    if typ == "string":
        _check_text(key, value, prop)
    if "enum" in prop and value not in prop["enum"]:
        raise ToolError("invalid_arguments",
                        f"argument {key!r} must be one of {prop['enum']}, got {value!r}")
    if "minimum" in prop and value < prop["minimum"]:
        raise ToolError("invalid_arguments", f"argument {key!r} must be >= {prop['minimum']}, got {value}")
    if typ == "array" and "items" in prop:
        value = [_check(f"{key}[{i}]", v, prop["items"]) for i, v in enumerate(value)]
    return value


def _check_text(key: str, value: str, prop: dict) -> None:
    """Strings must be text (no lone surrogate) and, where the schema says, not too long."""
    if "maxLength" in prop and len(value) > prop["maxLength"]:
        raise ToolError("invalid_arguments", f"argument {key!r} is {len(value):,} characters long; at most "
                        f"{prop['maxLength']:,} are accepted")
    if not value.isascii() and (m := _SURROGATE.search(value)):
        raise ToolError("invalid_arguments", f"argument {key!r} holds a lone surrogate "
                        f"({printable(m.group())} at character {m.start()}), which is not text; send valid "
                        "Unicode (a file whose name is not UTF-8 is reached with run_terminal_cmd, e.g. $'\\xff')")
