"""Resource limits and the process runner shared by every backend.

One exec = one launcher process tree, started through a tiny `/bin/sh` preamble that first
moves itself into a fresh per-exec cgroup and sets rlimits, then `exec`s the backend
(bwrap or runsc). Everything the command starts inherits the cgroup, so

- memory: cgroup memory limit (v1 `memory.limit_in_bytes` + `memsw`, or v2 `memory.max`);
  `oom_killed` is read from the cgroup's `oom_kill` counter. Without a usable cgroup,
  RLIMIT_AS caps each process instead (a per-process, address-space bound: coarser, and
  an OOM then shows up as a failed allocation, not as `oom_killed`).
- pids: cgroup `pids.max`; without a cgroup, RLIMIT_NPROC (which the kernel does not
  enforce for host uid 0, so the fallback only helps non-root callers).
- file size: RLIMIT_FSIZE (a write past it fails with EFBIG / SIGXFSZ).
- wall time: on expiry the launcher's process group and every process left in the cgroup
  get SIGKILL; the result has `timed_out=True` and `exit_code=None`.
- output: stdout and stderr are read concurrently, each kept up to `output_bytes`; the rest
  is drained and dropped (`output_truncated=True`), so a flood can neither hang the caller
  nor fill its memory.

After the launcher exits, every process still in the cgroup is killed and the cgroup is
removed: no process an exec started outlives it (the backends add a pid namespace, whose
init's death kills the rest, as a second line). The sync (`run`) and asyncio (`arun`)
paths share everything but the I/O loop: `arun` uses asyncio subprocesses, never threads
that block the loop.

Cgroups are created under `<controller>/opencomposer/<pid>.<n>`, beside (not inside) the
caller's own cgroup, so sandbox memory is not charged to the caller. Set
OPENCOMPOSER_CGROUPS=off to force the rlimit fallback.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import select
import selectors
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

from opencomposer.errors import SandboxError
from opencomposer.sandbox.base import ExecResult, Limits

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PARENT = "opencomposer"
_READ_CHUNK = 1 << 16
_SETUP_FAILED = "opencomposer-sandbox setup failed:"
_counter = itertools.count()


# ---------------------------------------------------------------- cgroups


@dataclass(frozen=True)
class CgroupLayout:
    """Where per-exec cgroups go: v1 has one parent dir per controller, v2 one for both."""

    version: int
    memory: Path | None
    pids: Path | None


@lru_cache(maxsize=1)
def _detect_layout() -> CgroupLayout | None:
    if (CGROUP_ROOT / "cgroup.controllers").exists():  # pure v2 (unified) hierarchy
        try:
            enabled = (CGROUP_ROOT / "cgroup.subtree_control").read_text().split()
            wanted = [c for c in ("memory", "pids") if c not in enabled]
            if wanted:
                (CGROUP_ROOT / "cgroup.subtree_control").write_text(" ".join("+" + c for c in wanted))
            parent = CGROUP_ROOT / CGROUP_PARENT
            parent.mkdir(exist_ok=True)
            (parent / "cgroup.subtree_control").write_text("+memory +pids")
            return CgroupLayout(2, parent, parent)
        except OSError:
            return None
    dirs: dict[str, Path | None] = {"memory": None, "pids": None}
    for ctrl, probe in (("memory", "memory.limit_in_bytes"), ("pids", "pids.max")):
        parent = CGROUP_ROOT / ctrl / CGROUP_PARENT
        try:
            if (CGROUP_ROOT / ctrl / "cgroup.procs").exists():
                parent.mkdir(exist_ok=True)
                if (parent / probe).exists():  # the controller really is attached here
                    dirs[ctrl] = parent
        except OSError:
            pass
    if not any(dirs.values()):
        return None
    return CgroupLayout(1, dirs["memory"], dirs["pids"])


def cgroup_layout() -> CgroupLayout | None:
    """The machine's usable cgroup layout, or None (then limits fall back to rlimits)."""
    if os.environ.get("OPENCOMPOSER_CGROUPS", "").lower() in ("off", "0", "no"):
        return None
    return _detect_layout()


class Cgroup:
    """A per-exec cgroup: created with its limits, joined by the launcher, killed and removed after."""

    def __init__(self, layout: CgroupLayout, memory_bytes: int | None, pids: int | None):
        self.layout = layout
        name = f"{os.getpid()}.{next(_counter)}"
        self.dirs: list[Path] = []
        self.memory_dir: Path | None = None
        if layout.version == 2:
            d = layout.memory / name  # type: ignore[operator]
            d.mkdir()
            self.dirs = [d]
            self.memory_dir = d
            if memory_bytes is not None:
                (d / "memory.max").write_text(str(memory_bytes))
                _try_write(d / "memory.swap.max", "0")
            if pids is not None:
                (d / "pids.max").write_text(str(pids))
            self.has_memory, self.has_pids = memory_bytes is not None, pids is not None
            return
        self.has_memory = layout.memory is not None and memory_bytes is not None
        self.has_pids = layout.pids is not None and pids is not None
        try:
            if self.has_memory:
                d = layout.memory / name  # type: ignore[operator]
                d.mkdir()
                self.dirs.append(d)
                self.memory_dir = d
                (d / "memory.limit_in_bytes").write_text(str(memory_bytes))
                _try_write(d / "memory.memsw.limit_in_bytes", str(memory_bytes))  # no swap escape
            if self.has_pids:
                d = layout.pids / name  # type: ignore[operator]
                d.mkdir()
                self.dirs.append(d)
                (d / "pids.max").write_text(str(pids))
        except OSError as e:
            self.remove()
            raise SandboxError(f"could not set up cgroup {name}: {e}. "
                               "Set OPENCOMPOSER_CGROUPS=off to use rlimits instead.") from e

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs]

    def pids_inside(self) -> set[int]:
        found: set[int] = set()
        for f in self.procs_files:
            try:
                found.update(int(x) for x in f.read_text().split())
            except FileNotFoundError:
                pass
        return found

    def oom_kills(self) -> int:
        if self.memory_dir is None:
            return 0
        name = "memory.events" if self.layout.version == 2 else "memory.oom_control"
        try:
            for line in (self.memory_dir / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except FileNotFoundError:
            pass
        return 0

    def kill_all(self, timeout_s: float = 5.0) -> None:
        """SIGKILL everything in the cgroup and wait until it is empty.

        Waits on pidfds (woken the moment each process exits, no polling) and signals
        through them (no pid-reuse race). Processes can be left for a few ms after the
        launcher exits: bwrap's init is still tearing its namespaces down.
        """
        deadline = time.monotonic() + timeout_s
        if self.layout.version == 2 and self.dirs:
            _try_write(self.dirs[0] / "cgroup.kill", "1")
        while pids := self.pids_inside():
            poller, fds = select.poll(), []
            for pid in pids:
                try:
                    fd = os.pidfd_open(pid)
                except ProcessLookupError:
                    continue
                fds.append(fd)
                poller.register(fd, select.POLLIN)
                try:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                waiting = set(fds)
                while waiting:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise SandboxError(f"processes {sorted(pids)} survived SIGKILL in {self.dirs}")
                    for fd, _ in poller.poll(remaining * 1000):
                        poller.unregister(fd)
                        waiting.discard(fd)
            finally:
                for fd in fds:
                    os.close(fd)
            # all seen have exited; zombies stay listed until their dying parents are reaped
            time.sleep(0.0005)

    def remove(self) -> None:
        for d in self.dirs:
            for _ in range(1000):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as e:  # EBUSY while killed tasks finish exiting
                    if e.errno != errno.EBUSY:
                        raise
                    self.kill_all()
                    time.sleep(0.001)


def _try_write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError:
        pass


def remove_stale_cgroups() -> list[str]:
    """Kill and remove per-exec cgroups left by dead processes (after a crash). Returns their names."""
    layout = cgroup_layout()
    removed: list[str] = []
    if layout is None:
        return removed
    for parent in {p for p in (layout.memory, layout.pids) if p is not None}:
        for d in parent.iterdir():
            if not d.is_dir() or _pid_alive(d.name.split(".")[0]):
                continue
            try:
                pids = [int(x) for x in (d / "cgroup.procs").read_text().split()]
            except OSError:  # removed meanwhile (its owner's own cleanup, or another gc)
                continue
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for _ in range(1000):
                try:
                    d.rmdir()
                    removed.append(d.name)
                    break
                except OSError:
                    time.sleep(0.001)
    return removed


def _pid_alive(pid: str) -> bool:
    return pid.isdigit() and Path(f"/proc/{pid}").exists()


# ---------------------------------------------------------------- signals

_UNWIND_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
_installed_in: int | None = None
_unwinding = False


def exit_on_signals() -> None:
    """Make SIGTERM and SIGHUP unwind this process (SystemExit(128 + signal)) instead of
    ending it on the spot, and a second SIGINT not cut short what the first started.

    A process ended by a signal's default action runs no `finally`, no `with` exit and no
    atexit hook: the exec's cgroup, the workspace's overlay mount and dir, and gVisor's
    runsc processes would stay until the next gc. Unwinding, the running exec kills its
    sandbox and releases its cgroup (`run`), the caller's `close()` runs, and the
    workspaces' finalizers close the rest at exit. Only default dispositions are replaced
    (a program with handlers of its own keeps them), and only from the main thread, where
    Python runs handlers. Further signals while unwinding are ignored: cleanup takes ms.
    """
    global _installed_in
    if _installed_in == os.getpid() or threading.current_thread() is not threading.main_thread():
        return
    _installed_in = os.getpid()
    for signum in _UNWIND_SIGNALS:
        default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        if signal.getsignal(signum) is default:
            signal.signal(signum, _unwind)


def _unwind(signum: int, frame: object) -> None:
    global _unwinding
    if os.getpid() != _installed_in:  # a forked child that never asked for this: die as before
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if _unwinding:
        return
    _unwinding = True
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


# ---------------------------------------------------------------- launch


@dataclass
class LaunchSpec:
    """What a backend wants run for one exec. The runner adds the limits preamble."""

    argv: list[str]
    env: dict[str, str]
    cgroup_pids: bool = True
    """Enforce `Limits.pids` with the host pids cgroup (gVisor enforces it inside instead)."""
    rlimit_as: bool = True
    """Use RLIMIT_AS as the memory fallback (not for gVisor: its Go runtime reserves huge VM)."""
    rlimit_fsize: bool = True
    """Set RLIMIT_FSIZE on the launcher (gVisor sets it in the OCI spec instead)."""
    open_fds: dict[int, Path] = field(default_factory=dict)
    """Files the launcher opens read-only at these fd numbers before exec (bwrap's --seccomp)."""
    cleanup: Callable[[], None] | None = None
    """Called after the exec ends, whatever happened (e.g. runsc state removal)."""
    extra_kill: Callable[[], None] | None = None
    """Called on timeout before killing the process group (e.g. `runsc kill`)."""


@lru_cache(maxsize=1)
def _nproc_flag() -> str:
    # dash spells RLIMIT_NPROC `ulimit -p`; bash (and POSIX-mode bash as sh) `ulimit -u`
    return "-p" if os.path.basename(os.path.realpath("/bin/sh")) == "dash" else "-u"


@dataclass
class _Prepared:
    argv: list[str]
    cgroup: Cgroup | None
    spec: LaunchSpec
    started: float = field(default_factory=time.monotonic)


def _prepare(spec: LaunchSpec, limits: Limits) -> _Prepared:
    layout = cgroup_layout()
    cg = None
    if layout is not None:
        cg = Cgroup(layout, limits.memory_mb << 20, limits.pids if spec.cgroup_pids else None)
    lines = [f"{{ echo $$ > {shlex.quote(str(f))}; }} 2>/dev/null || "
             f"{{ echo '{_SETUP_FAILED} cannot join {f}' >&2; exit 125; }}" for f in (cg.procs_files if cg else [])]
    if spec.rlimit_fsize:
        lines.append(f"ulimit -f {limits.file_size_mb * 2048}")  # POSIX sh counts 512-byte blocks
    if (cg is None or not cg.has_memory) and spec.rlimit_as:
        lines.append(f"ulimit -v {limits.memory_mb * 1024}")
    if (cg is None or not cg.has_pids) and spec.cgroup_pids:
        lines.append(f"ulimit {_nproc_flag()} {limits.pids} 2>/dev/null")
    lines += [f"exec {fd}< {shlex.quote(str(path))}" for fd, path in spec.open_fds.items()]
    script = "; ".join(lines + ['exec "$@"'])
    return _Prepared(["/bin/sh", "-c", script, "oc-limits", *spec.argv], cg, spec)


def _kill_tree(prep: _Prepared, pid: int) -> None:
    if prep.spec.extra_kill is not None:
        try:
            prep.spec.extra_kill()
        except Exception:  # noqa: BLE001 - best effort; the cgroup/pgid kill below is authoritative
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if prep.cgroup is not None:
        prep.cgroup.kill_all()


def _release(prep: _Prepared) -> bool:
    """Kill what is left in the exec's cgroup, remove it, run the backend's cleanup. True if OOM-killed."""
    oom = False
    try:
        if prep.cgroup is not None:
            prep.cgroup.kill_all()  # orphans (daemons, gVisor helpers) die with the exec
            oom = prep.cgroup.oom_kills() > 0
            prep.cgroup.remove()
    finally:
        if prep.spec.cleanup is not None:
            prep.spec.cleanup()
    return oom


def _finish(prep: _Prepared, returncode: int | None, out: bytes, err: bytes, timed_out: bool,
            truncated: bool) -> ExecResult:
    oom = _release(prep)
    code = returncode
    if timed_out or (oom and code in (137, -9)):
        code = None
    elif code is not None and code < 0:
        code = 128 - code  # killed by a signal: report it the way a shell does
    if code == 125 and err.startswith(_SETUP_FAILED.encode()):
        raise SandboxError(err.decode(errors="replace").strip())
    return ExecResult(
        exit_code=code,
        stdout=out.decode(errors="replace"),
        stderr=err.decode(errors="replace"),
        timed_out=timed_out,
        oom_killed=oom,
        duration_s=time.monotonic() - prep.started,
        output_truncated=truncated,
    )


class _Capped:
    """Keeps the first `cap` bytes of a stream and counts what it dropped."""

    def __init__(self, cap: int):
        self.cap, self.parts, self.size, self.dropped = cap, [], 0, 0

    def add(self, data: bytes) -> None:
        room = self.cap - self.size
        if room > 0:
            self.parts.append(data[:room])
            self.size += min(room, len(data))
        self.dropped += max(0, len(data) - max(room, 0))

    def value(self) -> bytes:
        return b"".join(self.parts)


def run(spec: LaunchSpec, limits: Limits, stdin: bytes | None = None,
        running: set[Callable[[], None]] | None = None) -> ExecResult:
    """Run a launch spec to completion under `limits` (blocking).

    While it runs, a kill function sits in `running` so that the workspace's `close()` can
    end it from another thread.
    """
    prep = _prepare(spec, limits)
    try:
        proc = subprocess.Popen(prep.argv, env=spec.env, start_new_session=True, close_fds=True,
                                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except BaseException:
        _finish(prep, None, b"", b"", False, False)
        raise
    kill = lambda: _kill_tree(prep, proc.pid)  # noqa: E731
    if running is not None:
        running.add(kill)
    out, err = _Capped(limits.output_bytes), _Capped(limits.output_bytes)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)  # type: ignore[arg-type]
    sel.register(proc.stderr, selectors.EVENT_READ, err)  # type: ignore[arg-type]
    pending_in = memoryview(stdin or b"")
    if stdin:  # written as the command reads it: one that never reads cannot block us
        os.set_blocking(proc.stdin.fileno(), False)  # type: ignore[union-attr]
        sel.register(proc.stdin, selectors.EVENT_WRITE, "stdin")  # type: ignore[arg-type]
    pidfd = os.pidfd_open(proc.pid)
    sel.register(pidfd, selectors.EVENT_READ, None)
    deadline = prep.started + limits.timeout_s
    timed_out, exited, streams = False, False, 2
    try:
        while streams or not exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if timed_out:  # killed long ago and pipes still open: give up on them
                    break
                timed_out, deadline = True, time.monotonic() + 5.0
                _kill_tree(prep, proc.pid)
                continue
            for key, _ in sel.select(timeout=remaining):
                if key.data is None:  # the launcher exited: kill stragglers so the pipes close
                    exited = True
                    sel.unregister(pidfd)
                    proc.wait()
                    if prep.cgroup is not None:
                        prep.cgroup.kill_all()
                elif key.data == "stdin":
                    try:
                        pending_in = pending_in[os.write(key.fd, pending_in[:_READ_CHUNK]):]
                    except BrokenPipeError:
                        pending_in = pending_in[:0]
                    if not pending_in:
                        sel.unregister(key.fileobj)
                        proc.stdin.close()  # type: ignore[union-attr]
                elif chunk := os.read(key.fd, _READ_CHUNK):
                    key.data.add(chunk)
                else:
                    sel.unregister(key.fileobj)
                    streams -= 1
    except BaseException:  # interrupted (a signal, see exit_on_signals): nothing may outlive us
        _kill_tree(prep, proc.pid)
        proc.wait()
        _release(prep)
        raise
    finally:
        sel.close()
        os.close(pidfd)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        if proc.returncode is None:
            _kill_tree(prep, proc.pid)
            proc.wait()
        if running is not None:
            running.discard(kill)
    return _finish(prep, proc.returncode, out.value(), err.value(), timed_out,
                   bool(out.dropped or err.dropped))


async def arun(spec: LaunchSpec, limits: Limits, stdin: bytes | None = None,
               running: set[Callable[[], None]] | None = None) -> ExecResult:
    """`run` for asyncio callers: the loop keeps serving other rollouts while this one runs."""
    prep = _prepare(spec, limits)
    try:
        proc = await asyncio.create_subprocess_exec(
            *prep.argv, env=spec.env, start_new_session=True, close_fds=True,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except BaseException:
        _finish(prep, None, b"", b"", False, False)
        raise
    kill = lambda: _kill_tree(prep, proc.pid)  # noqa: E731
    if running is not None:
        running.add(kill)
    out, err = _Capped(limits.output_bytes), _Capped(limits.output_bytes)

    async def pump(stream: asyncio.StreamReader, sink: _Capped) -> None:
        while chunk := await stream.read(_READ_CHUNK):
            sink.add(chunk)

    async def feed() -> None:
        try:
            proc.stdin.write(stdin)  # type: ignore[arg-type, union-attr]
            await proc.stdin.drain()  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
        except (BrokenPipeError, ConnectionResetError):
            pass

    async def body() -> None:
        await proc.wait()
        if prep.cgroup is not None:  # orphans holding the pipes die now, so the pumps see EOF
            prep.cgroup.kill_all()

    tasks = [asyncio.ensure_future(body()),
             asyncio.ensure_future(pump(proc.stdout, out)),  # type: ignore[arg-type]
             asyncio.ensure_future(pump(proc.stderr, err))]  # type: ignore[arg-type]
    if stdin:
        tasks.append(asyncio.ensure_future(feed()))
    try:
        _, pending = await asyncio.wait(tasks, timeout=limits.timeout_s)
        timed_out = bool(pending)
        if timed_out:
            _kill_tree(prep, proc.pid)
            await proc.wait()
            await asyncio.wait(pending, timeout=2.0)
        elif tasks[0].exception() is not None:
            raise tasks[0].exception()  # type: ignore[misc]
    except BaseException:  # cancelled (or a kill failed): the sandbox must not outlive the rollout
        _kill_tree(prep, proc.pid)
        await asyncio.shield(proc.wait())
        _finish(prep, proc.returncode, b"", b"", False, False)
        raise
    finally:
        for t in tasks:
            t.cancel()
        if running is not None:
            running.discard(kill)
    return _finish(prep, proc.returncode, out.value(), err.value(), timed_out,
                   bool(out.dropped or err.dropped))

