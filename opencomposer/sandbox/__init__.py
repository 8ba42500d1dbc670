"""Isolated, copy-on-write workspaces: where every rollout's commands run.

Composer 2 runs each rollout in its own Firecracker VM forked from a snapshot (Anyrun).
KVM guests do not boot on our machines, so opencomposer gets the same *interface* from
Linux primitives: overlayfs layers for cheap fork/snapshot/diff (layers.py), bubblewrap
namespaces for isolation (bwrap.py, the default), gVisor's user-space kernel for a
stronger boundary (gvisor.py), cgroups and rlimits for resources (limits.py), and a warm
pool served from one asyncio loop, locally (pool.py) or as one Ray actor per node
(ray_pool.py).

    backend = get_backend("bwrap")                 # or "gvisor"
    image = backend.image_from_dir("/path/to/project")
    ws = image.workspace()                         # ~0.3 ms, no files copied
    ws.exec(["python3", "-m", "pytest", "-q"], limits=Limits(timeout_s=60))
    forks = ws.fork(8)                             # snapshot + 8 writable views
    patch = forks[0].diff()                        # git-style unified diff vs the base
    for w in [ws, *forks]: w.close()

Requirements: root (overlay mounts use mount(2); cgroups v1 or v2 are used when writable,
rlimits otherwise), Debian's `bubblewrap` (and `runsc` for gVisor). The layer store lives
in $OPENCOMPOSER_SANDBOX_DIR (default /var/tmp/opencomposer/sandbox); on a tmpfs such as
/dev/shm, fork and snapshot are ~10x cheaper (no ext4 journal), at the price of RAM for
every written file. After a crash, `opencomposer sandbox gc` removes what was left.

Threat model: the code in the sandbox is *untrusted but not targeted*: model-written
commands that may be buggy, greedy or (through reward hacking) try to read the answers,
tamper with the grader or escape. We assume a stock Linux kernel without exploitable bugs.

What is covered (each has an adversarial test in tests/sandbox: test_isolation.py for
bwrap, test_gvisor.py, test_trees.py, test_in_place.py, test_sandbox_cli.py):
- secrets: nothing of the host file system is visible except /usr, a curated read-only
  /etc (no shadow, ssh keys, ssl/private, pip/npm credentials) and the workspace; no /root,
  /home, host /tmp, /var, /sys, /run. (Keeping hidden tests out of an image's layers is
  the task builder's job: whatever is in the layers is visible.)
- environment: the sandbox's environment is built from scratch (clearenv + PATH/HOME/LANG).
- network: a private network namespace with only `lo` unless `Limits.network=True`;
  host services on 127.0.0.1 are unreachable. gVisor: `--network=none`.
- writes: only /workspace (a copy-on-write overlay; the image's layers and the host dir
  behind `sandbox exec` are never modified; `workspace_in_place` is the one, explicit,
  exception) and a private /tmp are writable; / and system dirs are read-only mounts.
- host kernel settings: the sandbox's uid 0 is the host's, and procfs lets uid 0 write
  sysctls (core_pattern pointed at a workspace file would run it as host root at the next
  crash). bwrap binds /proc/sys, /proc/sysrq-trigger, /proc/fs, /proc/acpi (and bwrap
  itself /proc/irq, /proc/bus) read-only and masks /proc/kallsyms, keys, timer_list,
  kcore, sched_debug with /dev/null; the mounts cannot be undone (no mount syscalls, no
  capabilities) and cover every path to them (/proc/self/root, /proc/1/root...). gVisor
  serves its own /proc/sys, which refuses these writes.
- in-place workspaces (a user's checkout, where what a command leaves runs later outside
  any sandbox): `.git` and top-level virtualenvs (`readonly_paths`) are mounted read-only,
  so git hooks/config (`core.fsmonitor`) and `.pth` files cannot be planted; after every
  exec, setuid/setgid bits are cleared from the files it created or changed. The overlay
  store is mode 0700: setuid-root files in upper dirs are out of other host users' reach.
- cleanup: whatever tree a sandbox leaves (any depth, mode-000 dirs, fifos, sockets,
  immutable files, symlinks out, mount points) is removed without following a link or
  entering a mount (trees.remove_tree); gc never fails on it (it logs, and retries next
  time), and a CLI result is printed even when cleanup fails. SIGTERM, SIGHUP and SIGINT
  to a process using the backends kill its sandboxes and clean up before it exits.
- processes: a new pid namespace (the sandbox sees only its own processes), a per-exec
  cgroup (or process group) that is killed when the exec returns, so daemons, orphans and
  timed-out trees do not survive; `--die-with-parent` if the caller dies (SIGKILL: its
  mounts, dirs, cgroups and any runsc processes then wait for the next gc).
- resources: wall time, memory (oom_killed reported), pids (fork bombs), file size and
  output size (floods are truncated, never hang the caller).
- devices: a minimal /dev (null, zero, full, random, urandom, tty, pts, shm); no disks,
  no /dev/kvm, no host ttys.
- privilege: all capabilities dropped, no nested user namespaces, a seccomp filter that
  denies eBPF, io_uring, perf, keyrings, module loading and mount/namespace syscalls
  (bwrap.BLOCKED_SYSCALLS_X86_64), new session (no TIOCSTI),
  own uts and ipc namespaces (hostname, SysV IPC, POSIX message queues); abstract unix
  sockets are private with the network namespace.

What is NOT covered:
- kernel exploits: bwrap shares the host kernel; the seccomp deny-list only removes the
  riskiest interfaces (gVisor narrows this much further: its Sentry implements Linux in
  user space, and only a small syscall set reaches the host kernel).
- side channels (cache timing, Spectre-class), /proc/cpuinfo and /proc/meminfo-level
  host information, and CPU time fairness: there is no CPU quota; one sandbox can use
  every core until its wall-clock limit.
- disk usage: the overlay upper dir has no quota, only RLIMIT_FSIZE per file.
- `Limits.network=True` shares the host's network namespace: host services on
  127.0.0.1 and abstract unix sockets become reachable. Use it only for installs.
- /usr is the host's, /usr/local included: whatever is installed there is readable (but
  not writable); the bwrap init's command line (host store paths) is visible in /proc/1.
- the sandboxed processes run as host uid 0 inside a user namespace: they own the
  workspace files, and a kernel bug that escapes the namespaces would give root. Mapping
  them to an unprivileged host uid would leave them unable to write the root-owned layers
  and checkouts they work on. So any host interface that checks only "uid 0" and not a
  capability is a hole unless it is out of reach: read-only /proc/sys closes the procfs
  ones (the values stay readable: pid_max, core_pattern, kernel version), nothing else of
  the host is mounted writable, but a future kernel interface of that kind would need the
  same treatment.
- in-place workspaces, beyond `readonly_paths`: nested `.git` (a submodule's `gitdir:`
  file can be redirected, and `git status` recurses into submodules), virtualenvs below
  the top level, a `.git` or virtualenv the command creates (`git init` with an
  fsmonitor), a `.git` that is a symlink, and every other file that runs code later
  (Makefile, setup.py, tests, .envrc, .vscode/tasks.json, pre-commit config): the tree is
  writable by design, so review what a command changed. A setuid file exists from the
  moment the command makes it until the exec returns (other users who can reach the
  checkout could run it then), and "changed by the exec" is read from ctime, which a
  network file system with a skewed server clock (> 0.1 s) can get wrong.
- `diff()` of a workspace with paths longer than PATH_MAX fails (OSError): diff.py walks
  by path.
- gVisor (Debian's 2022 runsc): its pids and file-size limits are enforced by gVisor's own
  rlimits, its memory limit by the host cgroup around the whole sandbox; Debian 12's
  coreutils `ls -l`/`stat` fail there (statx with AT_NO_AUTOMOUNT is rejected by that
  release). See gvisor.py.
"""

from __future__ import annotations

from pathlib import Path

from opencomposer.errors import ConfigError
from opencomposer.sandbox.base import WORKSPACE_MOUNT, Backend, ExecResult, Image, Limits, Workspace

BACKENDS = ("bwrap", "gvisor")


def get_backend(name: str = "bwrap", store_dir: Path | str | None = None) -> Backend:
    """The sandbox backend called `name` ("bwrap" | "gvisor"), over the layer store at `store_dir`."""
    if name == "bwrap":
        from opencomposer.sandbox.bwrap import BwrapBackend

        return BwrapBackend(store_dir)
    if name == "gvisor":
        from opencomposer.sandbox.gvisor import GVisorBackend

        return GVisorBackend(store_dir)
    raise ConfigError(f"unknown sandbox backend {name!r}: choose one of {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "WORKSPACE_MOUNT", "Backend", "ExecResult", "Image", "Limits", "Workspace",
           "get_backend"]
