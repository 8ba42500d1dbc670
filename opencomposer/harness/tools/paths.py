"""Confine every file-tool path to the workspace root, on the host, race-safely.

File tools run on the host against `workspace.root` (not in the sandbox), so a path a
model writes must never reach a host file outside that tree. Three layers of defence:

1. `resolve()` maps the model's path to components under the root, resolving symlinks
   itself the way the kernel would inside the sandbox (where the root is /workspace, so
   a link to `/workspace/src` made by a command works for the file tools too): `..` that
   climbs out, absolute host paths, and symlinks (at any depth, a symlinked parent
   directory included) whose target lies outside are refused with
   `path_outside_workspace`. Symlinks whose target stays inside are followed.
2. The resolved components are then opened one at a time from a file descriptor of the
   root with `O_NOFOLLOW` (`openat` semantics via `dir_fd`). If anything swapped a
   component for a symlink after step 1 (a concurrent command in the same turn), the open
   fails instead of escaping.
3. Writes (write_file, edit_file, delete_file) are refused with `path_read_only` under the
   workspace's `readonly_paths` (an in-place workspace's `.git` and top-level virtualenvs,
   where a planted hook or .pth file would run later on the host), checked by
   `check_writable` on the resolved components, so that a symlink to `.git` elsewhere in the
   tree does not get around it; step 2 then opens exactly those components.

Absolute paths: `/workspace/...` is accepted and mapped to the root, because that is where
the agent's terminal commands see the tree; every other absolute path is refused, the
workspace's host path included (the model should not know or use host paths).

Races (covered, tested with a command that keeps exchanging a directory with a symlink to a
host directory while the tools run): resolution reads each link once and opens nothing by
name, so a swap makes the open fail (`path_outside_workspace` or `not_found`), never escape.

Not covered: hard links planted in the tree by the workspace's owner before the agent
starts (inside the sandbox, linking to a file on another mount fails with EXDEV). A parent
swapped for a link to a host directory can let `resolve()` read a host symlink's target,
which steers it only to another path inside the workspace (then checked and opened as any
other) or to an error; nothing outside is opened. grep runs in the sandbox instead (grep.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat as stat_mod
from typing import Iterator

from opencomposer.harness.tools.base import ToolError
from opencomposer.sandbox.base import WORKSPACE_MOUNT

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _outside(path: str, why: str) -> ToolError:
    return ToolError("path_outside_workspace",
                     f"{path!r} {why}; use a path relative to the workspace root (or under {WORKSPACE_MOUNT}/)")


_MAX_LINKS = 40  # as the kernel's MAXSYMLINKS


def resolve(root: str, path: str, *, follow_final: bool = True) -> tuple[str, ...]:
    """Components of `path` under `root` (a realpath), symlinks resolved as the sandbox sees them.

    Resolution is done here, component by component, as the kernel would inside the sandbox
    (root = /workspace): a relative symlink continues from its directory, an absolute one
    into /workspace/... restarts at the root, any other absolute target and any `..` above
    the root are outside. With follow_final=False the last component is not followed (delete
    a link, not its target). () is the root itself.
    """
    if not isinstance(path, str) or not path.strip():
        raise ToolError("invalid_arguments", "argument 'path' must be a non-empty path")
    if "\x00" in path:
        raise ToolError("invalid_arguments", "argument 'path' contains a NUL byte")
    rel = path.strip()
    if rel.startswith("/"):
        if rel != WORKSPACE_MOUNT and not rel.startswith(WORKSPACE_MOUNT + "/"):
            raise _outside(path, "is an absolute path outside the workspace")
        rel = rel[len(WORKSPACE_MOUNT):]
    todo = [c for c in rel.split("/") if c not in ("", ".")]
    if not follow_final and (not todo or todo[-1] == ".."):
        raise ToolError("invalid_arguments", f"{path!r} does not name a file")
    out: list[str] = []
    links = 0
    while todo:
        name = todo.pop(0)
        if name == "..":
            if not out:
                raise _outside(path, "climbs out of the workspace with '..'")
            out.pop()
            continue
        target = _readlink(os.path.join(root, *out, name)) if todo or follow_final else None
        if target is not None:
            links += 1
            if links > _MAX_LINKS:
                raise ToolError("invalid_arguments", f"{path!r}: too many levels of symbolic links")
            if target.startswith("/"):
                if target != WORKSPACE_MOUNT and not target.startswith(WORKSPACE_MOUNT + "/"):
                    raise _outside(path, "resolves through a symlink to a location outside the workspace")
                out, target = [], target[len(WORKSPACE_MOUNT):]
            todo[:0] = [c for c in target.split("/") if c not in ("", ".")]
            continue
        out.append(name)
    return tuple(out)


def _readlink(host: str) -> str | None:
    """The target if `host` is a symlink, else None. One call, no islink() first: a command
    can swap a link and a directory between two calls (EINVAL); what is not a link here is
    opened later as a plain name, with O_NOFOLLOW, so a swap after this point fails there."""
    try:
        return os.readlink(host)
    except OSError:
        return None


def check_writable(readonly_paths: tuple[str, ...], parts: tuple[str, ...], path: str) -> None:
    """Refuse a write at resolved `parts` under any of `readonly_paths` (relative paths, compared
    component by component and case-exactly: `.gitignore` and `.GIT` are not `.git`)."""
    for ro in readonly_paths:
        ro_parts = tuple(c for c in ro.split("/") if c not in ("", "."))
        if ro_parts and parts[:len(ro_parts)] == ro_parts:
            where = "is" if len(parts) == len(ro_parts) else "is under"
            raise ToolError("path_read_only", f"{path!r} {where} {ro}, which is read-only in this workspace "
                            "(an in-place workspace protects the checkout's git metadata and virtualenvs); "
                            "tools and commands may read it but not change it")


def display(parts: tuple[str, ...]) -> str:
    """How a resolved path is shown to the model."""
    return "/".join(parts) if parts else "."


def _os_error(e: OSError, path: str) -> ToolError:
    if e.errno == errno.ENOENT:
        return ToolError("not_found", f"{path!r} does not exist")
    if e.errno == errno.ELOOP:  # a component became a symlink after resolve(): refuse
        return _outside(path, "changed into a symlink while being opened")
    if e.errno == errno.ENOTDIR:
        return ToolError("not_a_directory", f"a parent of {path!r} is not a directory")
    if e.errno == errno.EISDIR:
        return ToolError("is_a_directory", f"{path!r} is a directory")
    return ToolError("internal_error", f"{path!r}: {os.strerror(e.errno or 0)}")


@contextlib.contextmanager
def open_dir(root: str, parts: tuple[str, ...], *, path: str, create: bool = False) -> Iterator[int]:
    """A directory fd for root/parts, opened component by component with O_NOFOLLOW.

    With create=True missing directories are made (write_file's "creates parents").
    """
    fd = os.open(root, _DIR_FLAGS)
    try:
        for name in parts:
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, 0o755, dir_fd=fd)
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except NotADirectoryError:  # O_DIRECTORY|O_NOFOLLOW on a symlink says ENOTDIR
                if stat_mod.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise OSError(errno.ELOOP, "symlink") from None
                raise
            os.close(fd)
            fd = nfd
    except OSError as e:
        os.close(fd)
        raise _os_error(e, path) from None
    try:
        yield fd
    finally:
        os.close(fd)


def read_bytes(root: str, parts: tuple[str, ...], *, path: str, max_bytes: int) -> bytes:
    """The bytes of a regular file under root, refusing symlinks, dirs, devices, FIFOs, huge files."""
    if not parts:
        raise ToolError("is_a_directory", f"{path!r} is the workspace root, a directory")
    with open_dir(root, parts[:-1], path=path) as dfd:
        try:
            st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
        except OSError as e:
            raise _os_error(e, path) from None
        if stat_mod.S_ISDIR(st.st_mode):
            raise ToolError("is_a_directory", f"{path!r} is a directory; use list_dir")
        if stat_mod.S_ISLNK(st.st_mode):
            raise _outside(path, "changed into a symlink while being opened")
        if not stat_mod.S_ISREG(st.st_mode):
            raise ToolError("not_a_file", f"{path!r} is not a regular file (device, socket or pipe)")
        if st.st_size > max_bytes:
            raise ToolError("too_large", f"{path!r} is {st.st_size:,} bytes, over the {max_bytes:,}-byte "
                            "limit; use grep or run_terminal_cmd (head, sed -n) to look inside")
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as e:
            raise _os_error(e, path) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat_mod.S_ISREG(st.st_mode):
            raise ToolError("not_a_file", f"{path!r} is not a regular file")
        return f.read(min(st.st_size, max_bytes) + 1)[:max_bytes]  # read(n) allocates n bytes up front


def write_bytes(root: str, parts: tuple[str, ...], data: bytes, *, path: str) -> bool:
    """Atomically replace (or create) root/parts with data, creating parents; True if it existed.

    Written to a temporary file in the same directory, then renamed over the target, so a
    concurrent reader sees the old or the new content, never half of it. Keeps the file mode.
    """
    if not parts:
        raise ToolError("is_a_directory", f"{path!r} is the workspace root, a directory")
    name = parts[-1]
    with open_dir(root, parts[:-1], path=path, create=True) as dfd:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat_mod.S_ISDIR(st.st_mode):
                raise ToolError("is_a_directory", f"{path!r} is a directory")
            if stat_mod.S_ISLNK(st.st_mode):
                raise _outside(path, "changed into a symlink while being written")
            if not stat_mod.S_ISREG(st.st_mode):
                raise ToolError("not_a_file", f"{path!r} is not a regular file")
        mode = stat_mod.S_IMODE(st.st_mode) if st else 0o644
        tmp = f".{name}.oc-tmp-{os.getpid()}-{id(data):x}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                os.fchmod(f.fileno(), mode)  # O_CREAT's mode is filtered by the umask
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        return st is not None
