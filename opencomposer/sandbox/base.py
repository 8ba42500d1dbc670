"""The sandbox seam: plain dataclasses and the Protocols every backend implements.

A *layer* is a read-only directory tree. An *image* is an ordered stack of layers (lowest
first). A *workspace* is a writable copy-on-write view over an image: tools read and write
its files on the host through `workspace.root`, and commands run inside an isolated
sandbox where the same tree is mounted at `/workspace`.

Backends (bwrap, gVisor) implement `Backend`; the harness, tasks and RL code only see
`Image`, `Workspace`, `Limits` and `ExecResult`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

WORKSPACE_MOUNT = "/workspace"


@dataclass(frozen=True)
class Limits:
    """Resource limits for one exec. Every process the exec starts is gone when it returns."""

    timeout_s: float = 60.0
    """Wall-clock limit; the whole process tree is killed when it passes."""
    memory_mb: int = 2048
    """Memory limit for the whole process tree (cgroup), or per process (RLIMIT_AS fallback)."""
    pids: int = 256
    """Maximum number of processes/threads alive at once."""
    file_size_mb: int = 512
    """Largest file a process may write (RLIMIT_FSIZE)."""
    output_bytes: int = 1_000_000
    """stdout and stderr are each cut to this many bytes (the rest is drained and dropped)."""
    network: bool = False
    """Share the host network (for installs). Off by default: a private, empty network namespace."""


@dataclass
class ExecResult:
    """What one exec returned. `exit_code` is None when the process was killed by a limit."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    oom_killed: bool = False
    duration_s: float = 0.0
    output_truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.oom_killed

    def to_json(self) -> dict:
        return asdict(self)


@runtime_checkable
class Image(Protocol):
    """An immutable stack of read-only layers (lowest first)."""

    layers: tuple[Path, ...]

    def workspace(self) -> "Workspace":
        """A new writable workspace over this image (copy-on-write, no files copied)."""
        ...


@runtime_checkable
class Workspace(Protocol):
    """A writable copy-on-write view over an image, plus isolated command execution."""

    root: Path
    """Host path of the merged, writable tree. Tools edit files here; commands see it at /workspace."""
    image: Image
    """The image this workspace was created over (its base for `diff()`)."""
    readonly_paths: tuple[str, ...]
    """Paths relative to `root` that commands see read-only and host-side tools must not write
    (an in-place workspace's `.git` and virtualenvs; `()` for copy-on-write workspaces)."""

    def exec(self, cmd: Sequence[str] | str, *, limits: Limits | None = None, cwd: str = ".",
             env: dict[str, str] | None = None, stdin: bytes | None = None) -> ExecResult:
        """Run `cmd` (argv list, or a string for `bash -lc`) inside the sandbox, cwd relative to /workspace."""
        ...

    async def aexec(self, cmd: Sequence[str] | str, *, limits: Limits | None = None, cwd: str = ".",
                    env: dict[str, str] | None = None, stdin: bytes | None = None) -> ExecResult:
        """`exec` without blocking the event loop."""
        ...

    def snapshot(self) -> Image:
        """Freeze the current state into a new read-only layer; returns the image with it on top."""
        ...

    def fork(self, n: int) -> list["Workspace"]:
        """Snapshot, then n independent writable workspaces over the snapshot."""
        ...

    def diff(self) -> str:
        """Unified diff (git-style a/ b/ paths) of this workspace against its image."""
        ...

    def close(self) -> None:
        """Unmount and delete everything this workspace owns. Idempotent."""
        ...


class Backend(Protocol):
    """Creates images and workspaces. One class per backend (bwrap, gvisor)."""

    name: str

    def image_from_dir(self, path: Path | str) -> Image:
        """Freeze a host directory into a one-layer image (the directory itself is never modified)."""
        ...

    def image(self, layers: Sequence[Path]) -> Image:
        """An image over existing layer directories (lowest first)."""
        ...

    def workspace_in_place(self, path: Path | str) -> Workspace:
        """A workspace whose root IS `path`: commands see it read-write at /workspace.

        No copy-on-write: snapshot/fork/diff raise SandboxError. For one-off tool calls on a
        user's checkout (`opencomposer tool call --workspace DIR`)."""
        ...
