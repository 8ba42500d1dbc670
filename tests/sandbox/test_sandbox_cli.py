"""The `opencomposer sandbox exec` contract (ARCHITECTURE.md) and `sandbox gc`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sandbox_util import host_processes_with, tree_state
from typer.testing import CliRunner

from opencomposer.sandbox.cli import app
from opencomposer.sandbox.layers import gc, mounts_under
from opencomposer.sandbox.limits import CGROUP_PARENT, CGROUP_ROOT

runner = CliRunner()


@pytest.fixture(autouse=True)
def private_store(store, monkeypatch):
    monkeypatch.setenv("OPENCOMPOSER_SANDBOX_DIR", str(store))


def test_json_contract_and_host_dir_unchanged(project):
    before = tree_state(project)
    r = runner.invoke(app, ["exec", "--workspace", str(project), "--json", "--",
                            "sh", "-c", "echo out; echo err >&2; echo x > README.md; rm -r pkg; touch new; exit 3"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert set(out) == {"exit_code", "stdout", "stderr", "timed_out", "oom_killed", "duration_s"}
    assert out["exit_code"] == 3 and out["stdout"] == "out\n" and out["stderr"] == "err\n"
    assert out["timed_out"] is False and out["oom_killed"] is False and out["duration_s"] > 0
    assert tree_state(project) == before


def test_limits_flags_report_timeout_and_oom(project):
    r = runner.invoke(app, ["exec", "--workspace", str(project), "--timeout", "1", "--json", "--", "sleep", "30"])
    out = json.loads(r.stdout)
    assert out["timed_out"] is True and out["exit_code"] is None
    r = runner.invoke(app, ["exec", "--workspace", str(project), "--memory-mb", "100", "--json", "--",
                            "python3", "-c", "bytearray(1 << 30)"])
    out = json.loads(r.stdout)
    assert out["oom_killed"] is True and out["exit_code"] is None
    r = runner.invoke(app, ["exec", "--workspace", str(project), "--pids", "8", "--json", "--",
                            "sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do sleep 1 & done; wait"])
    assert "fork" in json.loads(r.stdout)["stderr"] or "Resource" in json.loads(r.stdout)["stderr"]


def test_passthrough_mode_forwards_output_and_exit_code(project):
    r = runner.invoke(app, ["exec", "--workspace", str(project), "--", "sh", "-c", "cat README.md; exit 5"])
    assert r.exit_code == 5 and r.stdout == "# demo\n\nA small project.\n"
    r = runner.invoke(app, ["exec", "--workspace", str(project), "--timeout", "0.5", "--", "sleep", "10"])
    assert r.exit_code == 124


def test_network_flag_and_top_level_command(project):
    cmd = [sys.executable, "-m", "opencomposer.cli", "sandbox", "exec", "--workspace", str(project), "--json",
           "--network", "--", "sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1 | sort"]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    assert out["exit_code"] == 0 and len(out["stdout"].split()) > 1  # the host's interfaces, not only lo


def test_missing_bwrap_is_a_setup_error_with_the_fix(project, monkeypatch):
    import shutil
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    r = runner.invoke(app, ["exec", "--workspace", str(project), "--", "true"])
    assert r.exit_code == 125 and "apt-get install -y bubblewrap" in r.stderr


def test_gc_reports_what_it_removed(store):
    r = runner.invoke(app, ["gc", "--store", str(store)])
    assert r.exit_code == 0 and set(json.loads(r.stdout)) == {"mounts", "dirs", "cgroups"}


def _own_cgroups(pid: int) -> list[Path]:
    return [d for c in ("memory", "pids") if (CGROUP_ROOT / c / CGROUP_PARENT).is_dir()
            for d in (CGROUP_ROOT / c / CGROUP_PARENT).iterdir() if d.name.startswith(f"{pid}.")]


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _default_signal_dispositions() -> None:
    """The CLI as a terminal starts it: a suite run under `nohup` (SIGHUP ignored) or as a background
    job of a script (SIGINT ignored) passes those dispositions on, and the CLI rightly keeps them."""
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)


@pytest.mark.parametrize("backend", ["bwrap", "gvisor"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signalled_cli_leaves_no_process_mount_cgroup_or_dir(project, store, backend, signum):
    marker = "7654321.5"
    cmd = [sys.executable, "-m", "opencomposer.cli", "sandbox", "exec", "--workspace", str(project),
           "--backend", backend, "--", "sh", "-c", f"touch /workspace/started; sleep {marker}"]
    cli = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=_default_signal_dispositions)
    try:
        assert _wait_for(lambda: any(store.glob("ws/*/upper/started")), 60), "the command never started"
        assert mounts_under(store) and _own_cgroups(cli.pid)  # control: there is something to clean
        cli.send_signal(signum)
        _, err = cli.communicate(timeout=30)
        assert cli.returncode != 0 and "Traceback" not in err, err
        assert host_processes_with(marker) == [] and host_processes_with(f"--root={store}") == []  # no runsc
        assert mounts_under(store) == []
        assert _own_cgroups(cli.pid) == []
        assert list((store / "ws").iterdir()) == [] and list((store / "run").glob("*")) == []
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        gc(store)  # whatever the assertions found, the host is clean for the next test


def test_a_deep_tree_neither_loses_the_result_nor_breaks_later_execs(project, store):
    deep = ("import os\nfd = os.open('.', os.O_RDONLY)\nfor _ in range(1100):\n"
            "    os.mkdir('a', dir_fd=fd); sub = os.open('a', os.O_RDONLY, dir_fd=fd); os.close(fd); fd = sub\n"
            "print('deep')")
    r = subprocess.run([sys.executable, "-m", "opencomposer.cli", "sandbox", "exec", "--workspace", str(project),
                        "--json", "--", "python3", "-c", deep], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["stdout"] == "deep\n"
    assert list((store / "ws").iterdir()) == []
    again = runner.invoke(app, ["exec", "--workspace", str(project), "--", "echo", "still works"])
    assert again.exit_code == 0 and again.stdout == "still works\n"


def test_a_cleanup_failure_is_a_warning_and_the_result_is_kept(project, store, monkeypatch):
    from opencomposer.errors import SandboxError
    from opencomposer.sandbox import layers

    def failing_umount(target, lazy=False):
        raise SandboxError(f"umount {target} failed: simulated")

    monkeypatch.setattr(layers, "umount", failing_umount)
    try:
        r = runner.invoke(app, ["exec", "--workspace", str(project), "--json", "--", "sh", "-c", "echo out; exit 7"])
        plain = runner.invoke(app, ["exec", "--workspace", str(project), "--", "sh", "-c", "echo out; exit 7"])
    finally:
        monkeypatch.undo()
        gc(store, everything=True)  # the mounts the simulated failure left
    assert r.exit_code == 0 and json.loads(r.stdout)["exit_code"] == 7 and json.loads(r.stdout)["stdout"] == "out\n"
    assert "warning: cleanup failed" in r.stderr and "simulated" in r.stderr
    assert plain.exit_code == 7 and plain.stdout == "out\n" and "warning: cleanup failed" in plain.stderr


def test_a_signalled_tool_call_leaves_no_sandbox_behind(tmp_path, store):
    marker = "6543210.5"
    cli = subprocess.Popen([sys.executable, "-m", "opencomposer.cli", "tool", "call", "--workspace", str(tmp_path),
                            "run_terminal_cmd", json.dumps({"command": f"touch started; sleep {marker}"})],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert _wait_for(lambda: (tmp_path / "started").exists(), 60), "the command never started"
        assert host_processes_with(marker) and _own_cgroups(cli.pid)
        cli.send_signal(signal.SIGTERM)
        _, err = cli.communicate(timeout=30)
        assert cli.returncode != 0 and "Traceback" not in err, err
        assert host_processes_with(marker) == [] and _own_cgroups(cli.pid) == []
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        gc(store)
