"""Git-style unified diffs of an overlay workspace against its base, from its upper layers.

Only paths that appear in the workspace's own layers (its snapshot layers and its upper
dir) can differ from the base, so the cost is proportional to what the agent touched,
not to the size of the project. For each such path the old side is read from the base
view and the new side from the live merged view (the kernel resolves whiteouts and opaque
directories for us), and the pair is compared byte for byte.

Output is what `git diff --binary` would print, so `git apply` accepts it (and `patch -p1`
the text sections): `diff --git a/P b/P`, `new file mode` / `deleted file mode` /
`old mode`+`new mode`, `--- /dev/null` for added and `+++ /dev/null` for deleted files,
`\\ No newline at end of file` markers, symlinks as mode 120000 with their target as
content. Text sections carry no index line. Binary content (a NUL byte in the first 8000
bytes, or not UTF-8) is a `GIT binary patch` with full blob ids on its index line (git
refuses a binary patch without them) and both sides as zlib literals, so a patch that adds
or changes a binary file applies whole instead of being rejected.

Left out: rename detection (a rename is a delete plus an add), empty directories (git does
not track them), special files (fifos, devices), paths longer than PATH_MAX on the host (a
tree that deep cannot be opened by path, nor checked out by git), and quoting of unusual
path names.
"""

from __future__ import annotations

import base64
import difflib
import fnmatch
import hashlib
import os
import stat
import zlib
from pathlib import Path
from typing import Iterator, Sequence

DIFF_EXCLUDE = ("__pycache__", "*.pyc", ".pytest_cache", ".git", ".mypy_cache", ".ruff_cache")
"""Path components skipped by default: caches a test run leaves behind and git internals."""

_OPAQUE = "trusted.overlay.opaque"
_PATH_MAX = 4096


def _is_opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, _OPAQUE, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _walk_layer(layer: Path) -> Iterator[tuple[str, os.stat_result, bool]]:
    """(relative path, lstat, opaque) for every entry of one layer dir."""
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(layer / rel if rel else layer) as it:
            for entry in it:
                sub = f"{rel}/{entry.name}" if rel else entry.name
                if len(os.fsencode(layer / sub)) >= _PATH_MAX:
                    continue  # no system call takes this path; git could not check it out either
                st = entry.stat(follow_symlinks=False)
                is_dir = stat.S_ISDIR(st.st_mode)
                yield sub, st, is_dir and _is_opaque(layer / sub)
                if is_dir:
                    stack.append(sub)


def _files_under(root: Path, rel: str) -> Iterator[str]:
    """Regular files and symlinks at or below root/rel (rel itself if it is one)."""
    top = root / rel
    try:
        st = top.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        yield rel
        return
    for dirpath, dirnames, filenames in os.walk(top):
        base = os.path.relpath(dirpath, root)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            yield f"{base}/{name}"


def changed_candidates(upper_layers: Sequence[Path], base_root: Path) -> set[str]:
    """Every path that may differ between base and merged view: a superset, checked later."""
    found: set[str] = set()
    for layer in upper_layers:
        for rel, st, opaque in _walk_layer(layer):
            if stat.S_ISDIR(st.st_mode):
                if opaque:  # the dir hides everything below it in the base (or a base file it replaced)
                    found.update(_files_under(base_root, rel))
                continue
            found.add(rel)  # a file, symlink or whiteout: it may also hide a whole base dir
            found.update(_files_under(base_root, rel))
    return found


def _excluded(rel: str, exclude: Sequence[str]) -> bool:
    return any(fnmatch.fnmatch(part, pat) for part in rel.split("/") for pat in exclude)


def _read(root: Path, rel: str) -> tuple[str, bytes] | None:
    """(git mode, content) of a regular file or symlink, None if absent or another kind."""
    path = root / rel
    try:
        st = path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(st.st_mode):
        return "120000", os.readlink(path).encode()
    if not stat.S_ISREG(st.st_mode):
        return None
    return ("100755" if st.st_mode & 0o111 else "100644"), path.read_bytes()


def _is_binary(data: bytes) -> bool:
    if b"\0" in data[:8000]:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _lines(data: bytes) -> list[str]:
    # git splits on \n only (str.splitlines would also split on \r, \x0c, ...)
    parts = data.decode("utf-8").split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _range(start: int, stop: int) -> str:
    """A unified-diff hunk range: 1-based start and length; an empty range names the line before."""
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start if length == 0 else start + 1},{length}"


def unified(a: list[str], b: list[str], n: int = 3) -> Iterator[str]:
    """Hunks (`@@` headers and ` `/`-`/`+` lines) turning lines `a` into `b`, with n lines of context.

    The same hunks as `difflib.unified_diff(a, b, n=n)`: one SequenceMatcher over the whole
    files, so a task's committed patches (tasks/task.py writes them with this function) stay
    what difflib wrote. Trimming the common head and tail first would be faster on a
    one-line edit of a long file (~1 ms instead of ~25 ms at 10k lines) but can align
    repeated blocks differently.
    """
    matcher = difflib.SequenceMatcher(None, a, b)
    changes = [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]
    hunks: list[list[tuple[int, int, int, int]]] = []
    for change in changes:  # changes closer than 2n equal lines share a hunk
        if hunks and change[0] - hunks[-1][-1][1] <= 2 * n:
            hunks[-1].append(change)
        else:
            hunks.append([change])
    for hunk in hunks:
        a1, a2 = max(0, hunk[0][0] - n), min(len(a), hunk[-1][1] + n)
        b1, b2 = max(0, hunk[0][2] - n), min(len(b), hunk[-1][3] + n)
        yield f"@@ -{_range(a1, a2)} +{_range(b1, b2)} @@\n"
        i = a1
        for i1, i2, j1, j2 in hunk:
            yield from (" " + line for line in a[i:i1])  # equal lines before this change
            yield from ("-" + line for line in a[i1:i2])
            yield from ("+" + line for line in b[j1:j2])
            i = i2
        yield from (" " + line for line in a[i:a2])


_NO_BLOB = "0" * 40


def blob_id(data: bytes) -> str:
    """git's object id of a blob with this content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _literal(data: bytes) -> Iterator[str]:
    """One side of a GIT binary patch: zlib data in lines of up to 52 bytes, base85, each
    prefixed by its length (A-Z for 1-26, a-z for 27-52), then a blank line."""
    packed = zlib.compress(data)
    yield f"literal {len(data)}\n"
    for i in range(0, len(packed), 52):
        chunk = packed[i:i + 52]
        n = len(chunk)
        yield (chr(ord("A") + n - 1) if n <= 26 else chr(ord("a") + n - 27)) + base64.b85encode(chunk, pad=True).decode() + "\n"
    yield "\n"


def binary_section(old: tuple[str, bytes] | None, new: tuple[str, bytes] | None) -> str:
    """The index line and GIT binary patch (forward, then reverse) for one path."""
    old_id = blob_id(old[1]) if old else _NO_BLOB
    new_id = blob_id(new[1]) if new else _NO_BLOB
    mode = f" {new[0]}" if old and new and old[0] == new[0] else ""
    return "".join([f"index {old_id}..{new_id}{mode}\nGIT binary patch\n",
                    *_literal(new[1] if new else b""), *_literal(old[1] if old else b"")])


def file_diff(rel: str, old: tuple[str, bytes] | None, new: tuple[str, bytes] | None) -> str:
    """The `diff --git` section for one path ("" when both sides are equal)."""
    if old == new:
        return ""
    out = [f"diff --git a/{rel} b/{rel}\n"]
    if old is None:
        out.append(f"new file mode {new[0]}\n")  # type: ignore[index]
    elif new is None:
        out.append(f"deleted file mode {old[0]}\n")
    elif old[0] != new[0]:
        out.append(f"old mode {old[0]}\nnew mode {new[0]}\n")
    old_data = old[1] if old else b""
    new_data = new[1] if new else b""
    if old_data == new_data:
        return "".join(out)  # mode change, or an empty file added/deleted
    if _is_binary(old_data) or _is_binary(new_data):
        out.append(binary_section(old, new))
        return "".join(out)
    a = f"a/{rel}" if old else "/dev/null"
    b = f"b/{rel}" if new else "/dev/null"
    out.append(f"--- {a}\n+++ {b}\n")
    for line in unified(_lines(old_data), _lines(new_data)):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def layer_diff(base_root: Path, upper_layers: Sequence[Path], merged_root: Path,
               exclude: Sequence[str] = DIFF_EXCLUDE) -> str:
    """Diff of `merged_root` against `base_root`, looking only at paths in `upper_layers`."""
    parts = []
    for rel in sorted(changed_candidates(upper_layers, base_root)):
        if not _excluded(rel, exclude):
            parts.append(file_diff(rel, _read(base_root, rel), _read(merged_root, rel)))
    return "".join(parts)
