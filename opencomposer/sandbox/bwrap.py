"""The default backend: bubblewrap (Debian's `bwrap` 0.8) over overlayfs workspaces.

Each exec is a fresh `bwrap` (~5 ms) with new user, pid, mount, ipc, uts, cgroup and
(unless `Limits.network`) network namespaces, all capabilities dropped, nested user
namespaces disabled, `--new-session` (no TIOCSTI into the caller's terminal) and
`--die-with-parent`, and a seccomp filter that makes ~35 rarely needed, often exploited
syscalls fail with EPERM (eBPF, io_uring, perf, keyrings, module loading, mounts,
namespaces; see BLOCKED_SYSCALLS_X86_64). The sandbox's file system is built from nothing:

    /usr (and /bin, /lib*, /sbin as on the host)  read-only bind of the host's
    /etc        read-only: a small copy of safe host files (dynamic loader cache, CA
                certificates, alternatives, python config, resolv.conf...) plus generated
                passwd/group/hosts/nsswitch.conf/profile; never shadow, ssh, ssl/private
    /workspace  the workspace root, read-write (the only persistent writable path)
    /tmp        private tmpfs, sized to the memory limit
    /proc       fresh procfs of the new pid namespace (only the sandbox's own processes);
                /proc/sys and the other kernel-writable entries read-only, kernel
                address and key listings masked (see PROC_READONLY, PROC_MASKED)
    /dev        minimal: null, zero, full, random, urandom, tty, pts, shm
    /           read-only tmpfs; nothing else of the host (no /root, /home, host /tmp, /var, /sys)

The environment is cleared and set to a small PATH/HOME/LANG plus what the caller passes.

The sandbox's uid 0 is the host's uid 0 (bwrap run by root maps `0 0 1`): without
capabilities it cannot mount, load modules or bypass permission checks, but it still owns
every root-owned file it can reach, and procfs lets the owner of /proc/sys/* write host
kernel settings (core_pattern would run a file of our choosing as host root on the next
crash). So what procfs exposes for writing is covered by read-only binds.
"""

from __future__ import annotations

import hashlib
import os
import platform
import posixpath
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

from opencomposer.errors import SandboxError, SetupError
from opencomposer.sandbox.base import WORKSPACE_MOUNT, Limits
from opencomposer.sandbox.layers import OverlayBackend
from opencomposer.sandbox.limits import LaunchSpec
from opencomposer.sandbox.trees import remove_tree

BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
    "USER": "root",
}
"""The whole environment of a sandboxed command, before the caller's `env` is added."""

HOST_ETC = (
    "alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone",
    "ssl/certs", "ssl/openssl.cnf", "ca-certificates", "ca-certificates.conf", "resolv.conf",
    "protocols", "services", "mime.types", "python3", "python3.11", "os-release",
    "debian_version", "gitconfig", "inputrc", "terminfo", "magic", "networks", "host.conf",
    "gai.conf", "shells",
)
"""Host /etc entries copied into the sandbox's /etc: enough for python3, bash, coreutils,
git and DNS; nothing with secrets (no shadow, ssh, ssl/private, pip.conf, npmrc)."""

GENERATED_ETC = {
    "passwd": "root:x:0:0:root:/tmp:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "group": "root:x:0:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
    "hostname": "sandbox\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n",
    # bash -l must not reset the caller's PATH (Debian's /etc/profile does)
    "profile": "# opencomposer sandbox: intentionally empty\n",
}


def build_etc(store_root: Path) -> Path:
    """The sandbox /etc for this host, built once per distinct host content under the store."""
    entries = [e for e in HOST_ETC if os.path.lexists(f"/etc/{e}")]
    key = hashlib.sha256(repr(sorted(GENERATED_ETC.items())).encode())
    for e in entries:
        st = os.stat(f"/etc/{e}")
        key.update(f"{e}:{st.st_mtime_ns}:{st.st_size}".encode())
    target = store_root / f"etc-{key.hexdigest()[:12]}"
    if target.is_dir():
        return target
    store_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="etc.", suffix=".tmp", dir=store_root))
    for e in entries:
        dest = tmp / e
        dest.parent.mkdir(parents=True, exist_ok=True)
        # -H: os-release and friends are symlinks out of /etc; copy what they point to
        subprocess.run(["cp", "-a", "-H", f"/etc/{e}", str(dest)], check=True, capture_output=True)
    for name, text in GENERATED_ETC.items():
        (tmp / name).write_text(text)
    try:
        tmp.rename(target)
    except OSError:  # another process built it first
        remove_tree(tmp)
    return target


SECCOMP_FD = 9

BLOCKED_SYSCALLS_X86_64 = {
    "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
    "keyctl": 250, "add_key": 248, "request_key": 249, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "open_by_handle_at": 304, "mount": 165,
    "umount2": 166, "pivot_root": 155, "swapon": 167, "swapoff": 168, "reboot": 169,
    "unshare": 272, "setns": 308, "acct": 163, "syslog": 103, "uselib": 134, "quotactl": 179,
    "lookup_dcookie": 212, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "mount_setattr": 442,
}
"""Syscalls that fail with EPERM in the sandbox: kernel attack surface no build, test or
editor needs (module loading, eBPF, perf, io_uring, keyrings, mounts, namespaces)."""


def seccomp_program() -> bytes | None:
    """A classic-BPF seccomp filter (what `bwrap --seccomp FD` reads), or None off x86-64.

    Program: foreign architectures (i386 via int 0x80) and the x32 ABI get EPERM, each
    blocked syscall number gets EPERM, everything else is allowed.
    """
    if platform.machine() != "x86_64":
        return None
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, eperm = 0x7FFF0000, 0x00050000 | 1
    nrs = sorted(BLOCKED_SYSCALLS_X86_64.values())
    prog = [(ld_abs, 0, 0, 4),                    # A = seccomp_data.arch
            (jeq, 1, 0, 0xC000003E),              # AUDIT_ARCH_X86_64 ? skip : deny
            (ret, 0, 0, eperm),
            (ld_abs, 0, 0, 0),                    # A = seccomp_data.nr
            (jge, len(nrs) + 1, 0, 0x40000000)]   # x32 ABI -> deny
    prog += [(jeq, len(nrs) - i, 0, nr) for i, nr in enumerate(nrs)]  # match -> the deny below
    prog += [(ret, 0, 0, allow), (ret, 0, 0, eperm)]
    return b"".join(struct.pack("<HBBI", *insn) for insn in prog)


def write_seccomp(store_root: Path) -> Path | None:
    """The compiled filter as a file in the store (the launcher opens it as bwrap's --seccomp fd)."""
    program = seccomp_program()
    if program is None:
        return None
    path = store_root / "seccomp.bpf"
    if not path.exists() or path.read_bytes() != program:
        fd, name = tempfile.mkstemp(prefix="seccomp.", suffix=".tmp", dir=store_root)
        tmp = Path(name)
        with os.fdopen(fd, "wb") as f:
            f.write(program)
        tmp.rename(path)
    return path


PROC_READONLY = ("sys", "sysrq-trigger", "fs", "acpi", "asound", "scsi")
"""/proc entries that write to the host kernel (sysctls, sysrq, nfsd, ACPI wakeup, sound and
SCSI drivers) and check only that the writer is uid 0: bound read-only over the fresh procfs.
runc's readonlyPaths plus the dirs it masks; /proc/irq and /proc/bus (also on its list)
bwrap binds read-only itself. It does so for /proc/sys too, but only if access(W_OK) on
the directory succeeds, and /proc/sys is mode 0555 while its files are 0644: it never does."""

PROC_MASKED = ("kcore", "keys", "timer_list", "kallsyms", "sched_debug", "latency_stats", "timer_stats")
"""/proc files that describe the host kernel (memory image, every key's description, kernel
symbol addresses, timers and scheduler state of all host processes): /dev/null over them."""


def _proc_covers() -> list[str]:
    """bwrap args for PROC_READONLY and PROC_MASKED, for the entries this kernel has.

    The read-only sources come from the host's procfs: /proc/sys (and the others) are one
    tree per kernel, whose sysctls resolve per namespace of the reader (the sandbox's own
    net/ipc/uts values), so the bind shows the sandbox what its own procfs would.
    """
    args = []
    for name in PROC_READONLY:
        if os.path.lexists(f"/proc/{name}"):
            args += ["--ro-bind", f"/proc/{name}", f"/proc/{name}"]
    for name in PROC_MASKED:
        if os.path.lexists(f"/proc/{name}"):
            args += ["--ro-bind", "/dev/null", f"/proc/{name}"]
    return args


def _root_links() -> list[str]:
    """/bin, /lib, /lib64, /sbin as the host has them (symlinks into /usr on merged-usr systems)."""
    args = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = f"/{name}"
        if os.path.islink(host):
            args += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            args += ["--ro-bind", host, host]
    return args


def sandbox_cwd(cwd: str) -> str:
    return posixpath.normpath(posixpath.join(WORKSPACE_MOUNT, cwd))


def command_argv(cmd: Sequence[str] | str) -> list[str]:
    if isinstance(cmd, str):
        return ["bash", "-lc", cmd]
    if not cmd:
        raise SandboxError("empty command")
    return list(cmd)


class BwrapBackend(OverlayBackend):
    """Overlay workspaces + bubblewrap namespaces. See the module docstring for the sandbox layout."""

    name = "bwrap"

    def __init__(self, store_dir: Path | str | None = None):
        super().__init__(store_dir)
        self.etc = build_etc(self.store.root)
        self.seccomp = write_seccomp(self.store.root)
        self._fixed = [
            "bwrap", "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--disable-userns", "--cap-drop", "ALL",
            "--die-with-parent", "--new-session", "--hostname", "sandbox",
            "--ro-bind", "/usr", "/usr", *_root_links(), "--ro-bind", str(self.etc), "/etc",
            "--proc", "/proc", *_proc_covers(), "--dev", "/dev",
        ]
        if self.seccomp is not None:
            self._fixed += ["--seccomp", str(SECCOMP_FD)]

    def check(self) -> None:
        if shutil.which("bwrap") is None:
            raise SetupError("bubblewrap is not installed: run `apt-get install -y bubblewrap` "
                             "(or `make setup`)")

    def launch_spec(self, root: Path, cmd: Sequence[str] | str, limits: Limits, cwd: str,
                    env: dict[str, str] | None, readonly: Sequence[str] = ()) -> LaunchSpec:
        argv = list(self._fixed)
        if not limits.network:
            argv.append("--unshare-net")
        argv += ["--size", str(limits.memory_mb << 20), "--tmpfs", "/tmp", "--bind", str(root), WORKSPACE_MOUNT]
        for rel in readonly:  # over the read-write bind: a mount point cannot be renamed or removed either
            argv += ["--ro-bind", str(root / rel), f"{WORKSPACE_MOUNT}/{rel}"]
        argv += ["--remount-ro", "/", "--chdir", sandbox_cwd(cwd), "--clearenv"]
        for key, value in {**BASE_ENV, **(env or {})}.items():
            argv += ["--setenv", key, value]
        return LaunchSpec(argv=[*argv, "--", *command_argv(cmd)], env=dict(BASE_ENV),
                          open_fds={SECCOMP_FD: self.seccomp} if self.seccomp else {})
