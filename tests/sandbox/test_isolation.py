"""One adversarial test per isolation property of the bwrap backend (see the threat model
in opencomposer/sandbox/__init__.py). Each runs the attack inside the sandbox and checks
the outcome from the host."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import uuid
from pathlib import Path

import pytest
from sandbox_util import host_processes_with

from opencomposer.sandbox import Limits
from opencomposer.sandbox.limits import CGROUP_PARENT, CGROUP_ROOT


@pytest.fixture
def ws(backend, project):
    workspace = backend.image_from_dir(project).workspace()
    yield workspace
    workspace.close()


def _own_cgroups() -> list[Path]:
    prefix = f"{os.getpid()}."
    return [d for c in ("memory", "pids") if (CGROUP_ROOT / c / CGROUP_PARENT).is_dir()
            for d in (CGROUP_ROOT / c / CGROUP_PARENT).iterdir() if d.name.startswith(prefix)]


def test_secrets_in_host_root_and_tmp_are_invisible(ws):
    token = uuid.uuid4().hex
    secrets = [Path("/root") / f".oc_secret_{token}", Path("/tmp") / f"oc_secret_{token}"]
    for s in secrets:
        s.write_text("s3cr3t")
    try:
        r = ws.exec(["sh", "-c", f"cat {secrets[0]} {secrets[1]}; ls /root /home; ls /tmp; "
                     f"grep -rs s3cr3t /etc /usr/local /workspace /tmp; echo done"])
    finally:
        for s in secrets:
            s.unlink()
    assert "s3cr3t" not in r.stdout
    assert "No such file" in r.stderr and token not in r.stdout
    assert r.stdout.rstrip().endswith("done")
    shadow = ws.exec(["sh", "-c", "ls /etc/shadow /etc/ssh /etc/ssl/private 2>&1; echo $?"]).stdout
    assert shadow.rstrip().endswith("2") and "No such file" in shadow


def test_host_environment_is_not_inherited(ws, monkeypatch):
    monkeypatch.setenv("OC_SECRET", "leaked-value")
    r = ws.exec(["env"], env={"CHOSEN": "yes"})
    assert "leaked-value" not in r.stdout and "OC_SECRET" not in r.stdout
    assert "CHOSEN=yes" in r.stdout and "PATH=" in r.stdout
    assert set(line.split("=")[0] for line in r.stdout.splitlines()) <= {
        "PATH", "HOME", "LANG", "TERM", "USER", "PWD", "SHLVL", "_", "CHOSEN"}


def _serve_once(server: socket.socket) -> None:
    try:
        conn, _ = server.accept()
        conn.sendall(b"host-service")
        conn.close()
    except OSError:
        pass


def test_no_network_reaches_host_services(ws):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    threading.Thread(target=_serve_once, args=(server,), daemon=True).start()
    probe = ["python3", "-c", f"import socket; s = socket.create_connection(('127.0.0.1', {port}), 2); "
             "print(s.recv(100).decode())"]
    try:
        blocked = ws.exec(probe)
        interfaces = ws.exec(["sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1"]).stdout.split()
        allowed = ws.exec(probe, limits=Limits(network=True))  # control: the probe itself works
    finally:
        server.close()
    assert blocked.exit_code != 0 and "host-service" not in blocked.stdout
    assert "Connection refused" in blocked.stderr or "unreachable" in blocked.stderr
    assert interfaces == ["lo"]
    assert allowed.stdout == "host-service\n"


def test_writes_outside_the_workspace_fail(ws, tmp_path):
    host_target = tmp_path / "written_from_sandbox"
    r = ws.exec(["sh", "-c", f"""
        for p in /usr/oc_x /usr/bin/oc_x /etc/oc_x /etc/passwd /oc_x /root/oc_x /home/oc_x {host_target}; do
            (echo pwned > "$p") 2>/dev/null && echo "WROTE $p"
        done
        echo x > /workspace/ok && echo x > /tmp/ok && echo fine"""])
    assert "WROTE" not in r.stdout and r.stdout.strip() == "fine"
    assert not host_target.exists() and not Path("/usr/oc_x").exists() and not Path("/oc_x").exists()
    privileged = ws.exec(["sh", "-c", "mount -t tmpfs x /workspace 2>&1; unshare -U true 2>&1; "
                          "grep CapEff /proc/self/status"])
    assert "CapEff:\t0000000000000000" in privileged.stdout


def test_risky_syscalls_are_filtered(ws):
    probe = ("import ctypes; libc = ctypes.CDLL(None, use_errno=True)\n"
             "for nr in (321, 425, 250, 298, 175, 39):  # bpf io_uring_setup keyctl perf init_module getpid\n"
             "    r = libc.syscall(nr, 0, 0, 0); print(nr, r, ctypes.get_errno() if r == -1 else 0)")
    r = ws.exec(["python3", "-c", probe])
    results = {int(a): (int(b), int(c)) for a, b, c in (line.split() for line in r.stdout.splitlines())}
    assert all(results[nr] == (-1, 1) for nr in (321, 425, 250, 298, 175)), r.stdout  # EPERM
    assert results[39][0] > 0  # ordinary syscalls still work


def test_fork_bomb_is_contained_by_the_pids_limit(ws):
    marker = f"bomb{uuid.uuid4().hex[:8]}"
    r = ws.exec(["bash", "-c", f"bomb() {{ bomb | bomb & }}; bomb; sleep 2; echo {marker}"],
                limits=Limits(pids=64, timeout_s=20))
    assert r.exit_code is not None or r.timed_out
    assert host_processes_with(marker) == [] and _own_cgroups() == []
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork
    alive = ws.exec(["sh", "-c", "echo still fine"])
    assert alive.stdout == "still fine\n"


def test_memory_hog_is_oom_killed(ws):
    r = ws.exec(["python3", "-c", "x = bytearray(1 << 30); print('allocated')"], limits=Limits(memory_mb=128))
    assert r.oom_killed and r.exit_code is None and "allocated" not in r.stdout


def test_timeout_kills_the_whole_process_tree(ws):
    marker = "987654.5"
    r = ws.exec(["sh", "-c", f"sleep {marker} & (sleep {marker} &) ; sleep {marker}"],
                limits=Limits(timeout_s=1))
    assert r.timed_out and r.exit_code is None
    assert host_processes_with(marker) == [] and _own_cgroups() == []


def test_orphaned_daemons_are_gone_when_exec_returns(ws):
    marker = "876543.25"
    r = ws.exec(["sh", "-c", f"setsid nohup sleep {marker} > /dev/null 2>&1 & echo started"])
    assert r.ok and r.stdout == "started\n" and not r.timed_out
    assert host_processes_with(marker) == [] and _own_cgroups() == []


def test_output_flood_is_truncated_without_hanging(ws):
    r = ws.exec(["python3", "-c", "import sys; sys.stdout.write('x' * 50_000_000); sys.stderr.write('e' * 3_000_000)"],
                limits=Limits(output_bytes=10_000, timeout_s=60))
    assert r.ok and r.output_truncated
    assert r.stdout == "x" * 10_000 and r.stderr == "e" * 10_000
    endless = ws.exec(["yes"], limits=Limits(output_bytes=1000, timeout_s=1))
    assert endless.timed_out and endless.stdout == "y\n" * 500


def test_only_the_sandbox_processes_are_visible(ws):
    r = ws.exec(["sh", "-c", "for p in /proc/[0-9]*; do echo ${p#/proc/} $(tr '\\0' ' ' < $p/cmdline); done"])
    pids = {int(line.split()[0]) for line in r.stdout.splitlines()}
    assert len(pids) <= 4 and max(pids) < 10, r.stdout  # a fresh pid namespace: init, sh, its children
    programs = {line.split()[1] for line in r.stdout.splitlines() if len(line.split()) > 1}
    assert programs <= {"bwrap", "sh", "tr"}, r.stdout  # no host process (this test's included)


def test_devices_are_minimal(ws):
    listing = set(ws.exec(["ls", "/dev"]).stdout.split())
    assert listing <= {"null", "zero", "full", "random", "urandom", "tty", "pts", "ptmx", "shm",
                       "stdin", "stdout", "stderr", "fd", "core", "console"}
    assert {"null", "zero", "urandom"} <= listing
    r = ws.exec(["sh", "-c", "ls /dev/sda /dev/vda /dev/kvm /dev/mem /sys/block 2>&1; cat /dev/vda 2>&1 | head -c 10"])
    assert r.stdout.count("No such file") >= 5


HOST_SYSCTLS = ("kernel/core_pattern", "kernel/randomize_va_space", "kernel/pid_max", "vm/overcommit_memory",
                "fs/suid_dumpable", "kernel/modprobe")
"""Host-wide kernel settings the sandbox's uid 0 could write through procfs (core_pattern or
modprobe pointed at a workspace file would run it as host root)."""

# Opened for writing and closed again, never written: an open alone changes nothing.
KERNEL_WRITABLE = ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches", "/proc/sys/kernel/sysrq",
                   "/proc/sysrq-trigger", "/proc/irq/default_smp_affinity", "/proc/sys/net/core/somaxconn")

_OPEN_FOR_WRITE = """
import errno, os, sys
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_WRONLY))  # never write: the open is the test
        print("OPENED", path)
    except OSError as e:
        print(errno.errorcode[e.errno], path)
"""


def _writable(ws, paths) -> list[str]:
    r = ws.exec(["python3", "-c", _OPEN_FOR_WRITE, *paths])
    lines = r.stdout.splitlines()
    assert len(lines) == len(paths), r.stdout + r.stderr
    assert all(line.split()[0] in ("OPENED", "EROFS", "EACCES", "EPERM", "ENOENT") for line in lines), r.stdout
    return [line.split()[1] for line in lines if line.startswith("OPENED")]


def test_host_kernel_settings_cannot_be_rewritten(ws):
    present = [s for s in HOST_SYSCTLS if Path(f"/proc/sys/{s}").exists()]
    before = {s: Path(f"/proc/sys/{s}").read_text() for s in present}
    # writes of the value read back: a success changes nothing, but proves the hole
    r = ws.exec(["sh", "-c", 'for s in "$@"; do v=$(cat /proc/sys/$s); echo "$v" > /proc/sys/$s && echo "WROTE $s"; done',
                 "probe", *present])
    assert "WROTE" not in r.stdout, r.stdout
    assert r.stderr.count("Read-only file system") == len(present), r.stderr
    assert {s: Path(f"/proc/sys/{s}").read_text() for s in present} == before


def test_kernel_writable_proc_files_refuse_opening_for_write(ws):
    present = [p for p in KERNEL_WRITABLE if Path(p).exists()]
    pci = sorted(Path("/proc/bus/pci").rglob("*.*"))[:1]  # PCI config space, if the host has a bus
    paths = [*present, *map(str, pci)]
    assert len(paths) >= 4
    assert _writable(ws, paths) == []


def test_proc_sys_via_other_paths_is_read_only_too(ws):
    # the same files through the sandbox's own root links and its init's (bwrap's) root
    paths = [f"{prefix}/proc/sys/kernel/core_pattern" for prefix in ("/proc/self/root", "/proc/1/root",
                                                                       "/proc/thread-self/root", "/proc/1/cwd/..")]
    paths += ["/proc/1/root/proc/sys/vm/overcommit_memory", "/proc/self/cwd/../proc/sys/fs/suid_dumpable"]
    assert _writable(ws, paths) == []


def test_proc_stays_read_only_after_trying_to_remount_it(ws):
    attempts = ws.exec(["sh", "-c", """
        mount -o remount,rw /proc/sys 2>&1; mount -o remount,bind,rw /proc/sys 2>&1
        umount /proc/sys 2>&1; umount -l /proc/sys 2>&1; mount -t proc proc /tmp 2>&1
        unshare -Urm sh -c 'umount -l /proc/sys && echo UNMOUNTED' 2>&1
        python3 -c '
import ctypes; libc = ctypes.CDLL(None, use_errno=True)
MS_REMOUNT, MS_BIND, MNT_DETACH = 32, 4096, 2
print("mount", libc.mount(b"none", b"/proc/sys", None, MS_REMOUNT | MS_BIND, None), ctypes.get_errno())
print("umount2", libc.umount2(b"/proc/sys", MNT_DETACH), ctypes.get_errno())
print("fsopen", libc.syscall(430, b"proc", 0), ctypes.get_errno())
print("open_tree", libc.syscall(428, -100, b"/proc/sys", 1), ctypes.get_errno())'
    """])
    assert "UNMOUNTED" not in attempts.stdout
    for call in ("mount", "umount2", "fsopen", "open_tree"):
        assert f"{call} -1 1\n" in attempts.stdout, attempts.stdout  # EPERM from the seccomp filter
    assert _writable(ws, ["/proc/sys/kernel/core_pattern", "/proc/sys/kernel/pid_max"]) == []


def test_host_kernel_listings_are_masked(ws):
    present = [p for p in ("/proc/kallsyms", "/proc/keys", "/proc/timer_list", "/proc/kcore", "/proc/sched_debug")
               if Path(p).exists()]
    r = ws.exec(["sh", "-c", 'for p in "$@"; do head -c 64 "$p" 2>/dev/null | wc -c; done', "probe", *present])
    assert present and r.stdout.split() == ["0"] * len(present), r.stdout
