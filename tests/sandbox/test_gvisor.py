"""The gVisor backend behind the same Protocol: exec over layers, isolation, network, limits."""

from __future__ import annotations

import socket
import threading
import uuid
from pathlib import Path

import pytest
from sandbox_util import host_processes_with

from opencomposer.sandbox import Limits, get_backend


@pytest.fixture
def gvisor(store):
    return get_backend("gvisor", store)


@pytest.fixture
def ws(gvisor, project):
    workspace = gvisor.image_from_dir(project).workspace()
    yield workspace
    workspace.close()


def test_exec_over_layers_and_diff(ws, store):
    r = ws.exec(["sh", "-c", "cat README.md; echo added > new.txt; python3 -c 'print(6 * 7)'"])
    assert r.ok and r.stdout == "# demo\n\nA small project.\n42\n"
    assert (ws.root / "new.txt").read_text() == "added\n"
    assert "+++ b/new.txt\n@@ -0,0 +1 @@\n+added\n" in ws.diff()
    assert list((store / "run").iterdir()) == []  # per-exec OCI bundles are removed


def test_secrets_environment_and_writes_are_isolated(ws, monkeypatch, tmp_path):
    monkeypatch.setenv("OC_SECRET", "leaked-value")
    secret = Path("/root") / f".oc_secret_{uuid.uuid4().hex}"
    secret.write_text("s3cr3t")
    try:
        r = ws.exec(["sh", "-c", f"cat {secret}; env; echo x > /usr/oc_x; echo x > /etc/oc_x; "
                     f"echo x > {tmp_path}/oc_x; echo end"])
    finally:
        secret.unlink()
    assert "s3cr3t" not in r.stdout and "leaked-value" not in r.stdout and r.stdout.endswith("end\n")
    assert r.stderr.count("cannot create") == 3
    assert not (tmp_path / "oc_x").exists()


def _serve_once(server: socket.socket) -> None:
    try:
        conn, _ = server.accept()
        conn.sendall(b"host-service")
        conn.close()
    except OSError:
        pass


def test_no_network_unless_asked(ws):
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
        allowed = ws.exec(probe, limits=Limits(network=True))  # control: --network=host
    finally:
        server.close()
    assert blocked.exit_code != 0 and "host-service" not in blocked.stdout
    assert interfaces == ["lo"]
    assert allowed.stdout == "host-service\n"


def test_timeout_and_orphans_leave_no_process(ws, store):
    marker = "654321.5"
    r = ws.exec(["sh", "-c", f"sleep {marker} & sleep {marker}"], limits=Limits(timeout_s=1))
    assert r.timed_out and r.exit_code is None
    d = ws.exec(["sh", "-c", f"setsid nohup sleep {marker} > /dev/null 2>&1 & echo started"])
    assert d.ok and d.stdout == "started\n"
    assert host_processes_with(marker) == [] and host_processes_with(f"--root={store}") == []  # no runsc left


def test_memory_and_fork_bomb_limits(ws):
    hog = ws.exec(["python3", "-c", "x = bytearray(1 << 30); print('allocated')"], limits=Limits(memory_mb=256))
    assert hog.oom_killed and hog.exit_code is None
    bomb = ws.exec(["bash", "-c", "bomb() { bomb | bomb & }; bomb; sleep 1; echo survived"],
                   limits=Limits(pids=32, timeout_s=20))
    assert "Resource temporarily unavailable" in bomb.stderr or bomb.timed_out
    assert ws.exec(["echo", "ok"]).stdout == "ok\n"


def test_host_kernel_settings_cannot_be_rewritten(ws):
    sysctls = ("kernel/core_pattern", "kernel/randomize_va_space", "kernel/pid_max", "vm/overcommit_memory",
               "fs/suid_dumpable")
    before = {s: Path(f"/proc/sys/{s}").read_text() for s in sysctls}
    # writes of the value read back (gVisor's own /proc/sys is served by the Sentry)
    r = ws.exec(["sh", "-c", 'for s in "$@"; do v=$(cat /proc/sys/$s 2>/dev/null) && echo "$v" > /proc/sys/$s '
                             '&& echo "WROTE $s"; done; echo done', "probe", *sysctls])
    opens = ws.exec(["python3", "-c", "import os, sys\nfor p in sys.argv[1:]:\n    try:\n"
                     "        os.close(os.open(p, os.O_WRONLY)); print('OPENED', p)\n    except OSError:\n        pass",
                     "/proc/sys/kernel/core_pattern", "/proc/self/root/proc/sys/kernel/core_pattern",
                     "/proc/sysrq-trigger", "/proc/sys/vm/drop_caches"])
    assert "WROTE" not in r.stdout and r.stdout.endswith("done\n"), r.stdout
    assert "OPENED" not in opens.stdout, opens.stdout
    assert {s: Path(f"/proc/sys/{s}").read_text() for s in sysctls} == before
