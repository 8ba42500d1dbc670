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
