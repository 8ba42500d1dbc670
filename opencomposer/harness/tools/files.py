"""File tools: read_file, edit_file, write_file, delete_file, list_dir, glob.

They run on the host against `box.root` (the workspace's writable tree) through
`paths.py`, which confines every path to that tree; blocking work runs in a thread so
that a turn's calls proceed concurrently. Text is UTF-8: a file with NUL bytes is binary
and refused; other undecodable bytes are shown as U+FFFD by read_file and make edit_file
refuse (it would corrupt them on write-back).

Writes are refused under the workspace's `readonly_paths` (see paths.py). Every step is
bounded: glob matches in linear time (globs.py), edit_file's "closest regions" search is
capped, and replace_all's result size is computed before the result is built.

Left out: directory deletion and moves (the terminal does those), notebooks, images.
"""

from __future__ import annotations

import asyncio
import difflib
import os
import re
import stat as stat_mod

from opencomposer.harness.tools.base import ToolError, ToolSpec, params, split_lines
from opencomposer.harness.tools.globs import Glob, GlobError
from opencomposer.harness.tools.paths import check_writable, display, open_dir, read_bytes, resolve, write_bytes

_VCS_DIRS = {".git", ".hg", ".svn"}


def _number(lines: list[str], first: int, max_chars: int) -> str:
    """`cat -n` style: right-aligned 1-based line numbers, a tab, the line (long lines cut)."""
    out = []
    for i, line in enumerate(lines, start=first):
        if len(line) > max_chars:
            line = line[:max_chars] + f" ... [{len(line) - max_chars} more characters]"
        out.append(f"{i:6d}\t{line}")
    return "\n".join(out)


def _writable(box, parts: tuple[str, ...], path: str) -> None:
    # `readonly_paths`: an in-place workspace's protected paths; () elsewhere (and on workspaces without it)
    check_writable(getattr(box.workspace, "readonly_paths", ()), parts, path)


def _read_text(box, path: str, *, strict: bool) -> tuple[tuple[str, ...], str, bool]:
    """(parts, text, decoded_cleanly) of a text file; binary files raise."""
    parts = resolve(box.root, path)
    data = read_bytes(box.root, parts, path=path, max_bytes=box.config.max_file_bytes)
    if b"\x00" in data[:65536]:
        raise ToolError("binary_file", f"{path!r} is a binary file; inspect it with run_terminal_cmd "
                        "(e.g. `file`, `xxd | head`)")
    try:
        return parts, data.decode("utf-8"), True
    except UnicodeDecodeError as e:
        if strict:
            raise ToolError("binary_file", f"{path!r} is not valid UTF-8 (byte {e.start}); "
                            "edit it with run_terminal_cmd instead") from None
        return parts, data.decode("utf-8", errors="replace"), False


# ---------------------------------------------------------------- read_file

def _read_file(box, args: dict) -> str:
    cfg = box.config
    parts, text, clean = _read_text(box, args["path"], strict=False)
    lines = split_lines(text)
    total = len(lines)
    start = args.get("start_line", 1)
    end = args.get("end_line")
    if total == 0:
        return f"{display(parts)} is empty (0 lines)."
    if start > total:
        raise ToolError("invalid_arguments", f"start_line={start} is past the end of {display(parts)} "
                        f"({total} lines)")
    if end is not None and end < start:
        raise ToolError("invalid_arguments", f"end_line={end} is before start_line={start}")
    end = min(end or total, total, start + cfg.max_read_lines - 1)
    shown, size = [], 0
    for line in lines[start - 1:end]:
        size += min(len(line), cfg.max_line_chars) + 8
        if shown and size > cfg.max_read_bytes:
            break
        shown.append(line)
    last = start + len(shown) - 1
    header = f"{display(parts)} (lines {start}-{last} of {total})"
    if not clean:
        header += " [not valid UTF-8: undecodable bytes shown as \ufffd]"
    body = _number(shown, start, cfg.max_line_chars)
    requested_end = args.get("end_line") or total
    if last < min(requested_end, total):
        body += (f"\n[truncated at {len(shown)} lines / {cfg.max_read_bytes:,} bytes per call: "
                 f"use start_line={last + 1} to read on]")
    return f"{header}\n{body}"


async def read_file(box, args: dict) -> str:
    return await asyncio.to_thread(_read_file, box, args)


# ---------------------------------------------------------------- edit_file

_TOKEN = re.compile(r"\w+|[^\w\s]")
_LINE_TOKENS = 64
"""Tokens of a line that count for similarity (a minified line would otherwise cost its length)."""
_SEARCH_MAX_LINES, _SEARCH_MAX_TOKENS = 400, 2_000
"""A longer old_string gets no closest-region search (its cost grows with old_string x file)."""
_EXACT_MAX_PAIRS = 250_000
"""difflib's exact `ratio` is quadratic in the worst case: windows x old_string tokens above
this are ranked by `quick_ratio` alone."""


def _tokens(text: str) -> list[list[str]]:
    return [_TOKEN.findall(line)[:_LINE_TOKENS] for line in split_lines(text)]


def _closest_regions(text: str, old: str, k: int = 3) -> list[tuple[int, int, float]] | None:
    """The k windows of the file most similar to `old`: (first_line, last_line, ratio), 1-based;
    None if old is too long to search for (over _SEARCH_MAX_LINES lines or _SEARCH_MAX_TOKENS).

    Windows have as many lines as `old` and are compared as token sequences (words and
    punctuation; whitespace ignored, so a wrong indentation still finds its region; the first
    _LINE_TOKENS of each line). Windows are ranked by difflib's `quick_ratio` (a multiset
    upper bound of `ratio`), then the best 20 get the exact `ratio` (if their size allows).
    On big inputs (file lines x old lines > 100k, or file tokens x old lines > 1M) the
    candidate windows come from anchors: the file lines most similar to old's first, middle
    and last non-blank lines, each giving the window it would start. The work is linear in
    the file, times a constant set by the caps above.
    """
    otoks = _tokens(old) or [[]]
    n = len(otoks)
    if n > _SEARCH_MAX_LINES or sum(map(len, otoks)) > _SEARCH_MAX_TOKENS:
        return None
    ltoks = _tokens(text)
    starts = range(max(1, len(ltoks) - n + 1))
    sm = difflib.SequenceMatcher(autojunk=False)
    if len(ltoks) * n > 100_000 or sum(map(len, ltoks)) * n > 1_000_000:
        nonblank = [i for i, t in enumerate(otoks) if t] or [0]
        cands = set()
        for a in {nonblank[0], nonblank[len(nonblank) // 2], nonblank[-1]}:
            sm.set_seq2(otoks[a])
            scored = []
            for j, toks in enumerate(ltoks):
                sm.set_seq1(toks)
                scored.append((sm.quick_ratio(), j))
            cands |= {min(max(0, j - a), starts[-1]) for _, j in sorted(scored, reverse=True)[:20]}
        starts = sorted(cands)
    old_flat = [t for toks in otoks for t in toks]
    sm.set_seq2(old_flat)  # seq2 is the one difflib caches

    def window(i: int) -> list[str]:
        return [t for toks in ltoks[i:i + n] for t in toks]

    scored = []
    for i in starts:
        sm.set_seq1(window(i))
        scored.append((sm.quick_ratio(), i))
    scored.sort(reverse=True)
    best = []
    for quick, i in scored[:max(20, k)]:
        w = window(i)
        sm.set_seq1(w)
        best.append((sm.ratio() if len(w) * len(old_flat) <= _EXACT_MAX_PAIRS else quick, i))
    best.sort(key=lambda t: (-t[0], t[1]))
    picked: list[tuple[int, int, float]] = []
    for ratio, i in best:
        if ratio < 0.3 or len(picked) == k:
            break
        if all(abs(i + 1 - a) >= n for a, _, _ in picked):  # no overlapping windows
            picked.append((i + 1, min(i + n, len(ltoks)), ratio))
    return picked


def _edited_size(text: str, old: str, new: str, count: int) -> int:
    """UTF-8 bytes of `text` with `count` non-overlapping `old` replaced by `new`, without building it."""
    return len(text.encode("utf-8")) + count * (len(new.encode("utf-8")) - len(old.encode("utf-8")))


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _edit_file(box, args: dict) -> str:
    cfg = box.config
    path, old, new = args["path"], args["old_string"], args["new_string"]
    if old == "":
        raise ToolError("invalid_arguments", "old_string is empty; to create or overwrite a file use write_file")
    if old == new:
        raise ToolError("invalid_arguments", "old_string and new_string are identical: nothing to change")
    parts, text, _ = _read_text(box, path, strict=True)
    _writable(box, parts, path)  # on the very components written below
    if "\r\n" in text and "\r" not in old:  # the model writes \n; keep the file's CRLF endings
        old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
    count = text.count(old)
    shown = display(parts)
    if count == 0:
        regions = _closest_regions(text, old)
        lines = split_lines(text)
        msg = f"old_string was not found in {shown}."
        if regions is None:
            raise ToolError("no_match", msg + f" It is too long ({old.count(chr(10)) + 1:,} lines) to look for "
                            "similar regions: read_file the region you mean and copy a shorter, exact old_string.")
        if not regions:
            raise ToolError("no_match", msg + " No similar region either: read_file the file first.")
        msg += " The closest regions are:\n"
        for a, b, ratio in regions:
            where = f"line {a}" if a == b else f"lines {a}-{b}"
            msg += f"\n--- {where} ({ratio:.0%} similar):\n{_number(lines[a - 1:b], a, cfg.max_line_chars)}\n"
        msg += "\nCopy the text exactly (whitespace and indentation included) and retry."
        raise ToolError("no_match", msg)
    if count > 1 and not args.get("replace_all", False):
        at, starts = [], 0
        while (pos := text.find(old, starts)) != -1 and len(at) < 20:
            at.append(_line_of(text, pos))
            starts = pos + 1
        raise ToolError("ambiguous_match", f"old_string occurs {count} times in {shown} (starting at lines "
                        f"{', '.join(map(str, at))}). Include more surrounding lines so that it matches "
                        "exactly once, or set replace_all=true to replace every occurrence.")
    first = _line_of(text, text.find(old))
    size = _edited_size(text, old, new, count)
    if size > cfg.max_write_bytes:  # computed, not built: replace_all can multiply the file
        raise ToolError("too_large", f"the edited file would be {size:,} bytes, over {cfg.max_write_bytes:,}")
    updated = text.replace(old, new) if count > 1 else text.replace(old, new, 1)
    data = updated.encode("utf-8")
    write_bytes(box.root, parts, data, path=path)
    new_lines = split_lines(updated)
    a = max(1, first - 2)
    b = min(len(new_lines), first + new.count("\n") + 2, a + 40)
    what = f"{count} replacements" if count > 1 else "1 replacement"
    return (f"Edited {shown}: {what}. Lines {a}-{b} now read:\n"
            f"{_number(new_lines[a - 1:b], a, cfg.max_line_chars)}")


async def edit_file(box, args: dict) -> str:
    return await asyncio.to_thread(_edit_file, box, args)


# ---------------------------------------------------------------- write_file / delete_file

def _write_file(box, args: dict) -> str:
    data = args["content"].encode("utf-8")
    if len(data) > box.config.max_write_bytes:
        raise ToolError("too_large", f"content is {len(data):,} bytes, over the {box.config.max_write_bytes:,}-byte limit")
    parts = resolve(box.root, args["path"])
    _writable(box, parts, args["path"])
    existed = write_bytes(box.root, parts, data, path=args["path"])
    n_lines = args["content"].count("\n") + (0 if args["content"].endswith("\n") or not data else 1)
    return f"{'Overwrote' if existed else 'Created'} {display(parts)} ({n_lines} lines, {len(data):,} bytes)."


async def write_file(box, args: dict) -> str:
    return await asyncio.to_thread(_write_file, box, args)


def _delete_file(box, args: dict) -> str:
    path = args["path"]
    parts = resolve(box.root, path, follow_final=False)  # delete a symlink itself, never its target
    _writable(box, parts, path)
    with open_dir(box.root, parts[:-1], path=path) as dfd:
        try:
            st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            raise ToolError("not_found", f"{path!r} does not exist") from None
        if stat_mod.S_ISDIR(st.st_mode):
            raise ToolError("is_a_directory", f"{path!r} is a directory; delete_file removes files only "
                            "(use run_terminal_cmd `rm -r` for directories)")
        os.unlink(parts[-1], dir_fd=dfd)
    return f"Deleted {display(parts)}."


async def delete_file(box, args: dict) -> str:
    return await asyncio.to_thread(_delete_file, box, args)


# ---------------------------------------------------------------- list_dir

def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _list_dir(box, args: dict) -> str:
    path = args.get("path", ".")
    parts = resolve(box.root, path)
    rows = []
    with open_dir(box.root, parts, path=path) as dfd:
        for name in os.listdir(dfd):
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:  # deleted while listing
                continue
            if stat_mod.S_ISDIR(st.st_mode):
                rows.append((0, name, f"dir   {name}/"))
            elif stat_mod.S_ISLNK(st.st_mode):  # shown, never followed
                try:
                    rows.append((1, name, f"link  {name} -> {os.readlink(name, dir_fd=dfd)}"))
                except OSError:  # replaced since the stat
                    continue
            elif stat_mod.S_ISREG(st.st_mode):
                rows.append((1, name, f"file  {name}  ({_size(st.st_size)})"))
            else:
                rows.append((1, name, f"other {name}"))
    rows.sort()
    cap = box.config.max_list_entries
    where = display(parts)
    out = [f"{where}/ ({len(rows)} {'entry' if len(rows) == 1 else 'entries'})" if rows else f"{where}/ is empty"]
    out += [r[2] for r in rows[:cap]]
    if len(rows) > cap:
        out.append(f"[{len(rows) - cap} more entries not shown; use glob to narrow down]")
    return "\n".join(out)


async def list_dir(box, args: dict) -> str:
    return await asyncio.to_thread(_list_dir, box, args)


# ---------------------------------------------------------------- glob

def _glob(box, args: dict) -> str:
    pattern = args["pattern"].strip()
    if not pattern:
        raise ToolError("invalid_arguments", "argument 'pattern' is empty")
    if pattern.startswith("/") or pattern.split("/")[0] == "..":
        raise ToolError("invalid_arguments", "pattern must be relative (set 'path' to search a subdirectory)")
    if "/" not in pattern.rstrip("/"):  # like .gitignore: a bare name pattern matches at any depth
        pattern = "**/" + pattern
    try:
        matcher = Glob(pattern.rstrip("/"))
    except GlobError as e:
        raise ToolError("invalid_arguments", f"invalid glob pattern: {e}") from None
    path = args.get("path", ".")
    parts = resolve(box.root, path)
    found = []
    with open_dir(box.root, parts, path=path) as dfd:
        # fwalk with follow_symlinks=False never descends into a symlinked directory
        for top, dirs, files, _ in os.fwalk(".", dir_fd=dfd, follow_symlinks=False):
            dirs[:] = sorted(d for d in dirs if d not in _VCS_DIRS)
            rel_top = "" if top == "." else top[2:] + "/"
            found += [rel_top + d + "/" for d in dirs if matcher.match(rel_top + d)]
            found += [rel_top + f for f in files if matcher.match(rel_top + f)]
    found.sort()
    cap = box.config.max_glob_results
    prefix = "" if not parts else display(parts) + "/"
    if not found:
        return f"No paths match {args['pattern']!r} under {display(parts)}/."
    out = [prefix + p for p in found[:cap]]
    if len(found) > cap:
        out.append(f"[{len(found) - cap} more matches not shown ({len(found)} in all); narrow the pattern]")
    return "\n".join(out)


async def glob(box, args: dict) -> str:
    return await asyncio.to_thread(_glob, box, args)


# ---------------------------------------------------------------- schemas

_PATH = {"type": "string", "description": "File path relative to the workspace root (or under /workspace/)."}

FILE_TOOLS = [
    ToolSpec("read_file",
             "Read a text file with 1-based line numbers (`cat -n` style). Reads at most a few hundred "
             "lines per call; for longer files pass start_line/end_line.",
             params(["path"], path=_PATH,
                    start_line={"type": "integer", "minimum": 1, "description": "First line to read (1-based)."},
                    end_line={"type": "integer", "minimum": 1, "description": "Last line to read (inclusive)."}),
             read_file),
    ToolSpec("edit_file",
             "Replace an exact string in a file. old_string must match the file exactly (whitespace and "
             "indentation included, without the line-number prefix read_file shows) and occur exactly "
             "once; include enough surrounding lines to make it unique, or set replace_all.",
             params(["path", "old_string", "new_string"], path=_PATH,
                    old_string={"type": "string", "description": "The exact text to replace."},
                    new_string={"type": "string", "description": "The replacement text."},
                    replace_all={"type": "boolean", "description": "Replace every occurrence (default false)."}),
             edit_file, mutates_files=True),
    ToolSpec("write_file",
             "Create a file, or overwrite it entirely, with the given content. Parent directories are "
             "created. Prefer edit_file to change part of an existing file.",
             params(["path", "content"], path=_PATH,
                    content={"type": "string", "description": "The complete new content of the file."}),
             write_file, mutates_files=True),
    ToolSpec("delete_file", "Delete a file (or a symlink itself). Directories are not deleted.",
             params(["path"], path=_PATH), delete_file, mutates_files=True),
    ToolSpec("list_dir",
             "List a directory: subdirectories first, then files with their sizes; symlinks are shown "
             "with their targets.",
             params([], path={"type": "string", "description": "Directory relative to the workspace root (default: the root)."}),
             list_dir),
    ToolSpec("glob",
             "Find files and directories by glob pattern, sorted by path. `*` matches within a path "
             "component, `**/` any number of directories, `{a,b}` alternatives; a pattern without '/' "
             "matches names at any depth (`*.py` finds every Python file).",
             params(["pattern"], pattern={"type": "string", "maxLength": 1_000,
                                          "description": "Glob, e.g. 'src/**/*.py' or 'test_*.py'."},
                    path={"type": "string", "description": "Directory to search under (default: the root)."}),
             glob),
]
