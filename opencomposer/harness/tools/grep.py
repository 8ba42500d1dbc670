"""The grep tool: ripgrep over the workspace tree on the host.

ripgrep runs with `cwd=box.root` and a path that `paths.resolve` has confined to the
root. It does not follow symlinks while walking (no `-L`), reads no config file
(`--no-config`, empty environment), skips `.git` and gitignored files but searches other
hidden files. Its `--json` stream is read line by line and rg is killed as soon as the
match cap is reached, so a pattern like `.` over a large tree costs little.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil

from opencomposer.harness.tools.base import ToolError, ToolSpec, params
from opencomposer.harness.tools.paths import display, resolve

_RG_MISSING = ("ripgrep (`rg`) is not installed on the machine running the tools; the operator "
               "must install it (Debian: `apt-get install ripgrep`, or `make setup`). Meanwhile use "
               "run_terminal_cmd with `grep -rn`.")


def _text(obj: dict) -> str:
    """rg --json gives {"text": ...} for UTF-8 data and {"bytes": base64} otherwise."""
    if "text" in obj:
        return obj["text"]
    return base64.b64decode(obj["bytes"]).decode("utf-8", errors="replace")


def _rg_args(args: dict, target: str | None) -> list[str]:
    rg = shutil.which("rg")
    if rg is None:
        raise ToolError("setup", _RG_MISSING)
    cmd = [rg, "--no-config", "--hidden", "--glob", "!.git", "--no-messages"]
    if args.get("case_insensitive"):
        cmd.append("--ignore-case")
    if args.get("fixed_strings"):
        cmd.append("--fixed-strings")
    if args.get("glob"):
        cmd += ["--glob", args["glob"]]
    if args.get("files_with_matches"):
        cmd += ["--files-with-matches"]
    else:
        cmd += ["--json", "--context", str(args.get("context_lines", 0))]
    cmd += ["--regexp", args["pattern"], "--"]
    return cmd + ([target] if target else [])


async def _run_rg(cmd: list[str], cwd: str, on_line, timeout_s: float) -> tuple[int | None, str]:
    """Feed rg's stdout lines to on_line until it returns False; (exit code or None if stopped, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        *cmd, cwd=cwd, env={"PATH": "/usr/bin:/bin"}, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, limit=1 << 24)

    async def consume() -> bool:
        async for line in proc.stdout:
            if not on_line(line):
                return False
        return True

    finished = False
    try:
        finished = await asyncio.wait_for(consume(), timeout_s)
    except asyncio.TimeoutError:
        raise ToolError("timeout", f"grep took longer than {timeout_s:.0f} s; narrow it with path or glob") from None
    finally:
        # Kill only when stopping early: Popen.send_signal polls first, and a poll that reaps an
        # already finished rg makes asyncio's child watcher report exit code 255 instead of rg's.
        if not finished:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        stderr = (await proc.stderr.read()).decode("utf-8", errors="replace")
        await proc.wait()
    return (proc.returncode if finished else None), stderr


async def grep(box, args: dict) -> str:
    cfg = box.config
    path = args.get("path")
    parts = resolve(box.root, path) if path else ()
    target = display(parts) if parts else None
    if target and not os.path.exists(os.path.join(box.root, target)):
        raise ToolError("not_found", f"{path!r} does not exist")
    cmd = _rg_args(args, target)
    out: list[str] = []
    state = {"matches": 0, "bytes": 0, "capped": False, "last": None}

    def add(line: str) -> bool:
        state["bytes"] += len(line) + 1
        if state["bytes"] > cfg.grep_max_output_bytes:
            state["capped"] = True
            return False
        out.append(line)
        return True

    def on_files(raw: bytes) -> bool:
        state["matches"] += 1
        if state["matches"] > cfg.grep_max_matches:
            state["capped"] = True
            return False
        return add(raw.decode("utf-8", "replace").rstrip("\n").removeprefix("./"))

    def on_json(raw: bytes) -> bool:
        msg = json.loads(raw)
        kind = msg["type"]
        if kind not in ("match", "context"):
            return True
        data = msg["data"]
        file = _text(data["path"]).removeprefix("./")
        n = data["line_number"]
        line = _text(data["lines"]).rstrip("\r\n")
        if len(line) > cfg.max_line_chars:
            line = line[:cfg.max_line_chars] + " ..."
        if kind == "match":
            state["matches"] += 1
            if state["matches"] > cfg.grep_max_matches:
                state["capped"] = True
                return False
        last = state["last"]
        if last is not None and (last[0] != file or n > last[1] + 1) and args.get("context_lines"):
            add("--")
        state["last"] = (file, n)
        return add(f"{file}{':' if kind == 'match' else '-'}{n}{':' if kind == 'match' else '-'}{line}")

    code, stderr = await _run_rg(cmd, box.root, on_files if args.get("files_with_matches") else on_json,
                                 cfg.grep_timeout_s)
    if code == 2 and not out:
        raise ToolError("invalid_arguments", f"ripgrep failed: {stderr.strip()[:2000] or 'exit code 2'}")
    if not out:
        where = f" under {target}" if target else ""
        return f"No matches for {args['pattern']!r}{where}."
    if state["capped"]:
        out.append(f"[results capped at {cfg.grep_max_matches} matches / {cfg.grep_max_output_bytes:,} bytes; "
                   "narrow the search with path, glob or a more specific pattern]")
    return "\n".join(out)


GREP_TOOL = ToolSpec(
    "grep",
    "Search file contents with ripgrep (Rust regex syntax). Prints `path:line:text` for matches and "
    "`path-line-text` for context lines. Skips .git and gitignored files.",
    params(["pattern"],
           pattern={"type": "string", "description": "Regular expression (or literal text with fixed_strings)."},
           path={"type": "string", "description": "File or directory to search (default: the whole workspace)."},
           glob={"type": "string", "description": "Only search files matching this glob, e.g. '*.py' or '!tests/**'."},
           context_lines={"type": "integer", "minimum": 0, "description": "Lines of context around each match."},
           case_insensitive={"type": "boolean", "description": "Ignore case (default false)."},
           fixed_strings={"type": "boolean", "description": "Treat pattern as literal text (default false)."},
           files_with_matches={"type": "boolean", "description": "Only list the paths of matching files."}),
    grep)
