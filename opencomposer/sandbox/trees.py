"""Host-side walks over trees that sandboxed code wrote: removal and setuid stripping.

Whatever a sandbox leaves in its workspace was shaped by untrusted code, and the host
walks it as root. Both walks here therefore

- hold one directory fd at a time and descend with `openat(O_NOFOLLOW)`, so no depth
  (a tree 100,000 levels deep, paths far beyond PATH_MAX) recurses or hits ENAMETOOLONG,
  and no fd limit is reached; they climb back with `..`, checking the device and inode
  of the directory they return to, and stop rather than act outside the tree if it was
  moved meanwhile;
- never follow a symlink: a link is an entry like any other (removed, or skipped);
- keep going past what they cannot handle, and report it at the end.

`remove_tree` is what every sandbox-written tree (workspace dirs, layers, runsc state)
goes through; use it too for trees a sandbox wrote that the host deletes elsewhere
(e.g. a task grader's workspace surgery). It never enters a mount point (bind mounts of
the same file system included), so a mount left under a workspace (an overlay `merged`
dir that would not unmount, a bind someone made) keeps what is behind it.

`strip_setid` runs after each exec in an in-place workspace (a user's own checkout): a
setuid-root file written there would run as root the next time the user runs it.

Left out: concurrent modification by live processes (callers run these after every
sandbox process is dead; a rename under the walk is detected, not prevented) and
file attributes other than immutable/append-only.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from opencomposer.errors import SandboxError

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS = 0x80086601, 0x40086602  # _IOR/_IOW('f', 1/2, long)
_FS_IMMUTABLE_FL, _FS_APPEND_FL = 0x10, 0x20
_SETID = stat.S_ISUID | stat.S_ISGID
_SYS_OPENAT2, _RESOLVE_NO_XDEV = 437, 0x01  # openat2(2): the same number on every Linux arch
_libc = ctypes.CDLL(None, use_errno=True)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_HOW_SAME_MOUNT = _OpenHow(_O_DIR, 0, _RESOLVE_NO_XDEV)
_have_openat2 = True


def _open_same_mount(dir_fd: int, name: str) -> int:
    """openat(dir_fd, name) for a directory, failing with EXDEV if `name` is a mount point.

    A bind mount of a directory of the same file system has the same st_dev, so only the
    kernel can tell (openat2's RESOLVE_NO_XDEV, Linux 5.6); older kernels fall back to
    comparing devices, which catches every other mount.
    """
    global _have_openat2
    if _have_openat2:
        fd = _libc.syscall(_SYS_OPENAT2, dir_fd, os.fsencode(name), ctypes.byref(_HOW_SAME_MOUNT),
                           ctypes.sizeof(_HOW_SAME_MOUNT))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.ENOSYS:
            raise OSError(err, os.strerror(err), name)
        _have_openat2 = False
    fd = os.open(name, _O_DIR, dir_fd=dir_fd)
    if os.fstat(fd).st_dev != os.fstat(dir_fd).st_dev:
        os.close(fd)
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), name)
    return fd


@dataclass
class _Frame:
    """A directory on the walk's path: who it is (to check `..` against) and what is left of it."""

    ident: tuple[int, int]
    pending: list[str]


@dataclass
class _Walk:
    """What a walk has to say: the path from its top to the current dir, and what failed."""

    top: str
    names: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def fail(self, name: str, why: str) -> None:
        if len(self.problems) < 1000:
            self.problems.append(f"{'/'.join([*self.names, name])[-200:]}: {why}")

    def raise_if_failed(self, what: str) -> None:
        if self.problems:
            shown = "; ".join(self.problems[:5])
            more = f" (and {len(self.problems) - 5} more)" if len(self.problems) > 5 else ""
            raise SandboxError(f"could not {what} {self.top}: {shown}{more}")


def _ident(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _walk(fd: int, walk: _Walk, visit: Callable[[int], list[str]],
          leave: Callable[[int, str], None] | None = None, one_fs: bool = True) -> None:
    """Depth-first over the directory open at `fd` (which this closes) and all below it.

    `visit(dir_fd)` handles a directory's entries and returns the subdirectories to enter;
    `leave(parent_fd, name)` runs once a subdirectory is done. With `one_fs`, mount points
    are reported and not entered.
    """
    cur = fd
    try:
        stack = [_Frame(_ident(cur), visit(cur))]
        while True:
            frame = stack[-1]
            if frame.pending:
                name = frame.pending.pop()
                child = _open_dir(cur, name, walk, one_fs)
                if child is None:
                    continue
                os.close(cur)
                cur = child
                walk.names.append(name)
                stack.append(_Frame(_ident(cur), visit(cur)))
                continue
            stack.pop()
            if not stack:
                return
            up = os.open("..", _O_DIR, dir_fd=cur)
            if _ident(up) != stack[-1].ident:
                os.close(up)
                raise SandboxError(f"{walk.top}/{'/'.join(walk.names)[-200:]} was moved while it was "
                                   "being walked; stopped there")
            os.close(cur)
            cur = up
            name = walk.names.pop()
            if leave is not None:
                leave(cur, name)
    finally:
        os.close(cur)


def _open_dir(parent_fd: int, name: str, walk: _Walk, one_fs: bool) -> int | None:
    """An fd for the subdirectory `name`, or None (then it was reported, or is gone, or is no dir now)."""
    def open_() -> int:
        return _open_same_mount(parent_fd, name) if one_fs else os.open(name, _O_DIR, dir_fd=parent_fd)

    try:
        return open_()
    except PermissionError:  # mode 000 and we are not root
        try:
            os.chmod(name, 0o700, dir_fd=parent_fd, follow_symlinks=False)
            return open_()
        except (OSError, NotImplementedError) as e:
            walk.fail(name, getattr(e, "strerror", None) or str(e))
    except FileNotFoundError:
        pass
    except OSError as e:
        if e.errno == errno.EXDEV:
            walk.fail(name, "a mount point: left alone, with what is behind it")
        elif e.errno not in (errno.ELOOP, errno.ENOTDIR):
            walk.fail(name, e.strerror)
    return None


def _clear_flags(fd: int) -> bool:
    """Drop immutable/append-only (which make unlink fail with EPERM even for root). True if set."""
    try:
        buf = fcntl.ioctl(fd, _FS_IOC_GETFLAGS, struct.pack("i", 0))
        flags = struct.unpack("i", buf)[0]
        if not flags & (_FS_IMMUTABLE_FL | _FS_APPEND_FL):
            return False
        fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("i", flags & ~(_FS_IMMUTABLE_FL | _FS_APPEND_FL)))
        return True
    except OSError:
        return False


def _loosen(dir_fd: int, name: str) -> bool:
    """Make `name` in `dir_fd` removable: clear flags on both, and give the dir u+rwx. True if
    anything may have changed."""
    changed = _clear_flags(dir_fd)
    try:
        mode = os.fstat(dir_fd).st_mode
        if mode & 0o700 != 0o700:
            os.fchmod(dir_fd, stat.S_IMODE(mode) | 0o700)
            changed = True
        st = os.lstat(name, dir_fd=dir_fd)
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):  # never open a fifo or device
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                changed = _clear_flags(fd) or changed
            finally:
                os.close(fd)
    except OSError:
        pass
    return changed


def _remove_entry(dir_fd: int, name: str, is_dir: bool, walk: _Walk) -> None:
    remove = os.rmdir if is_dir else os.unlink
    for retry in (True, False):
        try:
            remove(name, dir_fd=dir_fd)
            return
        except FileNotFoundError:
            return
        except PermissionError as e:
            if retry and _loosen(dir_fd, name):
                continue
            walk.fail(name, e.strerror)
        except OSError as e:
            walk.fail(name, e.strerror)
        return


def _unlink_all(walk: _Walk) -> Callable[[int], list[str]]:
    def visit(dir_fd: int) -> list[str]:
        try:
            with os.scandir(dir_fd) as it:
                entries = list(it)  # listed first: unlinking while reading a dir may skip entries
        except OSError as e:
            walk.fail(".", e.strerror)
            return []
        subdirs = []
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir:
                subdirs.append(entry.name)
            else:
                _remove_entry(dir_fd, entry.name, False, walk)
        return subdirs
    return visit


def remove_tree(path: Path | str, *, dir_fd: int | None = None) -> None:
    """Delete `path` and everything below it, whatever the sandbox made of it.

    Missing is fine (nothing to do). Depth, mode-000 dirs, immutable or append-only files,
    fifos, sockets and whiteouts are all removed; symlinks are removed, never followed;
    mount points are left alone (with what is behind them). `dir_fd`: `path` is relative to
    that directory (as `os.unlink(name, dir_fd=...)`). Raises SandboxError after removing
    everything it could, naming what it could not.
    """
    head, name = os.path.split(os.fspath(path).rstrip("/") or "/")
    try:
        parent = os.open(head or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    walk = _Walk(os.fspath(path))
    try:
        try:
            st = os.lstat(name, dir_fd=parent)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            top = _open_dir(parent, name, walk, one_fs=True)
            if top is not None:
                _walk(top, walk, _unlink_all(walk), lambda fd, sub: _remove_entry(fd, sub, True, walk))
                _remove_entry(parent, name, True, walk)
        else:
            _remove_entry(parent, name, False, walk)
    finally:
        os.close(parent)
    walk.raise_if_failed("remove all of")


def strip_setid(root: Path | str, since_ns: int) -> list[str]:
    """Clear setuid/setgid on every regular file under `root` whose inode changed at or after
    `since_ns` (ctime: a chmod, a write or a new file all set it, and no syscall sets it back).

    Files the user made setuid earlier are left as they are. Walks every directory (mounts
    included) without following symlinks; one lstat per file. Returns the paths it changed,
    relative to `root`; raises SandboxError naming what it could not change.
    """
    walk = _Walk(os.fspath(root))
    stripped: list[str] = []

    def visit(dir_fd: int) -> list[str]:
        subdirs = []
        try:
            with os.scandir(dir_fd) as it:
                entries = list(it)
        except OSError as e:
            walk.fail(".", e.strerror)
            return []
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(entry.name)
                elif entry.is_file(follow_symlinks=False):  # links, fifos, devices: setuid means nothing
                    st = entry.stat(follow_symlinks=False)
                    if st.st_mode & _SETID and st.st_ctime_ns >= since_ns:
                        os.chmod(entry.name, stat.S_IMODE(st.st_mode) & ~_SETID, dir_fd=dir_fd,
                                 follow_symlinks=False)
                        stripped.append("/".join([*walk.names, entry.name]))
            except FileNotFoundError:
                pass
            except (OSError, NotImplementedError) as e:
                walk.fail(entry.name, getattr(e, "strerror", None) or str(e))
        return subdirs

    _walk(os.open(root, _O_DIR), walk, visit, one_fs=False)
    walk.raise_if_failed("clear setuid/setgid bits under")
    return stripped
