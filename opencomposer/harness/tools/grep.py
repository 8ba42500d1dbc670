"""The grep tool: ripgrep run inside the workspace's sandbox.

ripgrep runs through `workspace.aexec`, in the sandbox the agent's terminal commands run in
(cwd /workspace; /usr/bin/rg is there because /usr is bound read-only), so it can only read
what a terminal command could read. Covered: a symlink in the tree to a host path, and the
race where a command of the same turn keeps exchanging a directory with a symlink to a host
directory (renameat2 RENAME_EXCHANGE) while rg opens the path or walks below it: inside the
sandbox such a link leads nowhere outside. On the host, `paths.resolve` only checks the path
argument, so that a path outside the workspace gets the same `path_outside_workspace` error
as with the other tools; nothing on the host is opened by name.

rg does not follow symlinks while walking (no `-L`), reads no config file (`--no-config`),
skips `.git` and gitignored files but searches other hidden files. Work is bounded in the
sandbox and here: `head -c` ends rg (SIGPIPE) once it has printed enough bytes for the caps
(`--max-columns` cuts minified lines first), the call has `grep_timeout_s`, and the lines are
counted here against `grep_max_matches` / `grep_max_output_bytes`. rg's bytes come back
base64-encoded, so names and lines that are not UTF-8 survive the sandbox's text decoding:
names are shown with `\\xNN` escapes (ToolBox), line text with U+FFFD (as read_file).

Cost: one sandbox start per call (about 10 ms with bwrap on these machines).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os

from opencomposer.harness.tools.base import ToolError, ToolSpec, params
from opencomposer.harness.tools.paths import display, resolve

RG = "rg"
"""The ripgrep command inside the sandbox."""

_RG_MISSING = ("ripgrep (`rg`) is not installed in the sandbox (it runs there from the host's /usr); the "
               "operator must install it (Debian: `apt-get install ripgrep`, or `make setup`). Meanwhile use "
               "run_terminal_cmd with `grep -rn`.")

MAX_PATTERN_CHARS = 10_000
"""Longer patterns are refused (a command line holds at most 128 KiB per argument anyway)."""

# $1: the path to search ("" for the workspace), $2: bytes of rg output to keep, then rg's argv.
# Prints the kept output in base64, a space, and rg's exit status (141: stopped by head).
_SCRIPT = r"""
target=$1 cap=$2
shift 2
if [ -n "$target" ] && [ ! -e "$target" ]; then printf ' missing'; exit 0; fi
"$@" | head -c "$cap" | base64 -w0
printf ' %s' "${PIPESTATUS[0]}"
"""


def _rg_args(args: dict, target: str | None, max_columns: int) -> list[str]:
    cmd = [RG, "--no-config", "--hidden", "--glob", "!.git", "--no-messages", "--null", "--color", "never"]
    if args.get("case_insensitive"):
        cmd.append("--ignore-case")
    if args.get("fixed_strings"):
        cmd.append("--fixed-strings")
    if args.get("glob"):
        cmd += ["--glob", args["glob"]]
    if args.get("files_with_matches"):
        cmd += ["--files-with-matches"]
    else:
        cmd += ["--with-filename", "--line-number", "--no-heading", "--no-context-separator",
                "--max-columns", str(max_columns), "--max-columns-preview",
                "--context", str(args.get("context_lines", 0))]
    cmd += ["--regexp", args["pattern"], "--"]
    return cmd + ([target] if target else [])


def _records(raw: bytes, files_only: bool):
    """(path, line_number, is_match, text) per record of rg's output; only path for -l.

    -l prints `path\\0`; otherwise `path\\0N:text\\n` (match) or `path\\0N-text\\n` (context).
    A path may hold a newline but never a NUL, so the records are read in order from the NUL.
    """
    at = 0
    while (nul := raw.find(b"\0", at)) != -1:
        path = os.fsdecode(raw[at:nul]).removeprefix("./")
        if files_only:
            yield path, 0, True, ""
            at = nul + 1
            continue
        end = raw.find(b"\n", nul)
        if end == -1:
            return
        head, sep, text = _split_number(raw[nul + 1:end])
        at = end + 1
        if head is not None:  # else a notice such as "binary file matches": not a line
            yield path, head, sep == b":", text.decode("utf-8", errors="replace").rstrip("\r")


def _split_number(rest: bytes) -> tuple[int | None, bytes, bytes]:
    i = 0
    while i < len(rest) and 48 <= rest[i] <= 57:
        i += 1
    if i == 0 or i == len(rest) or rest[i:i + 1] not in (b":", b"-"):
        return None, b"", b""
    return int(rest[:i]), rest[i:i + 1], rest[i + 1:]


class _Output:
    """The model-facing lines, with the match and byte caps of the config."""

    def __init__(self, cfg, context: bool):
        self.cfg, self.context = cfg, context
        self.lines: list[str] = []
        self.matches = self.bytes = 0
        self.capped = False
        self.last: tuple[str, int] | None = None

    def add(self, line: str) -> bool:
        self.bytes += len(line) + 1
        if self.bytes > self.cfg.grep_max_output_bytes:
            self.capped = True
            return False
        self.lines.append(line)
        return True

    def count_match(self) -> bool:
        self.matches += 1
        if self.matches > self.cfg.grep_max_matches:
            self.capped = True
            return False
        return True

    def file(self, path: str) -> bool:
        return self.count_match() and self.add(path)

    def line(self, path: str, n: int, is_match: bool, text: str) -> bool:
        if len(text) > self.cfg.max_line_chars:
            text = text[:self.cfg.max_line_chars] + " ..."
        if is_match and not self.count_match():
            return False
        if self.context and self.last is not None and (self.last[0] != path or n > self.last[1] + 1):
            self.add("--")
        self.last = (path, n)
        sep = ":" if is_match else "-"
        return self.add(f"{path}{sep}{n}{sep}{text}")


def _output_cap(cfg) -> int:
    """Bytes of rg output that always suffice to fill the caps: a kept line costs at most
    4 bytes per character (UTF-8), and rg cuts longer lines at 4 x max_line_chars bytes."""
    return 4 * (cfg.grep_max_output_bytes + 4 * cfg.max_line_chars) + 65_536


async def _run_rg(box, cmd: list[str], target: str | None, cap: int) -> tuple[int | None, bytes, str]:
    """(rg's exit status, or None if `target` does not exist; its output, cut at cap; its stderr)."""
    cfg = box.config
    limits = dataclasses.replace(cfg.terminal_limits, timeout_s=cfg.grep_timeout_s, network=False,
                                 output_bytes=cap * 4 // 3 + 64)
    result = await box.workspace.aexec(["bash", "-c", _SCRIPT, "grep", target or "", str(cap), *cmd],
                                       limits=limits)
    if result.timed_out:
        raise ToolError("timeout", f"grep took longer than {cfg.grep_timeout_s:.0f} s; narrow it with path or glob")
    if result.oom_killed:
        raise ToolError("oom", "grep ran out of memory; narrow it with path or glob")
    encoded, _, status = result.stdout.rpartition(" ")
    if status == "missing":
        return None, b"", ""
    try:
        return int(status), base64.b64decode(encoded, validate=True), result.stderr
    except (ValueError, binascii.Error):
        raise ToolError("internal_error", f"grep in the sandbox failed: {(result.stderr or result.stdout)[:2000]}")


async def grep(box, args: dict) -> str:
    cfg = box.config
    path = args.get("path")
    parts = resolve(box.root, path) if path else ()
    target = display(parts) if parts else None
    cap = _output_cap(cfg)
    files_only = bool(args.get("files_with_matches"))
    code, raw, stderr = await _run_rg(box, _rg_args(args, target, 4 * cfg.max_line_chars), target, cap)
    if code is None:
        raise ToolError("not_found", f"{path!r} does not exist")
    if code in (126, 127):
        raise ToolError("setup", _RG_MISSING)
    cut = len(raw) >= cap
    if cut:  # the last record may be incomplete
        raw = raw[:raw.rfind(b"\0" if files_only else b"\n") + 1]
    out = _Output(cfg, bool(args.get("context_lines")))
    for path_, n, is_match, text in _records(raw, files_only):
        if not (out.file(path_) if files_only else out.line(path_, n, is_match, text)):
            break
    if code == 2 and not out.lines:
        raise ToolError("invalid_arguments", f"ripgrep failed: {stderr.strip()[:2000] or 'exit code 2'}")
    if not out.lines:
        where = f" under {target}" if target else ""
        return f"No matches for {args['pattern']!r}{where}."
    if out.capped or cut:
        out.lines.append(f"[results capped at {cfg.grep_max_matches} matches / {cfg.grep_max_output_bytes:,} "
                         "bytes; narrow the search with path, glob or a more specific pattern]")
    return "\n".join(out.lines)


GREP_TOOL = ToolSpec(
    "grep",
    "Search file contents with ripgrep (Rust regex syntax). Prints `path:line:text` for matches and "
    "`path-line-text` for context lines. Skips .git and gitignored files.",
    params(["pattern"],
           pattern={"type": "string", "maxLength": MAX_PATTERN_CHARS,
                    "description": "Regular expression (or literal text with fixed_strings)."},
           path={"type": "string", "description": "File or directory to search (default: the whole workspace)."},
           glob={"type": "string", "maxLength": 1_000,
                 "description": "Only search files matching this glob, e.g. '*.py' or '!tests/**'."},
           context_lines={"type": "integer", "minimum": 0, "description": "Lines of context around each match."},
           case_insensitive={"type": "boolean", "description": "Ignore case (default false)."},
           fixed_strings={"type": "boolean", "description": "Treat pattern as literal text (default false)."},
           files_with_matches={"type": "boolean", "description": "Only list the paths of matching files."}),
    grep)
