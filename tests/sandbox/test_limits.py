"""Limits: file size, stdin, exit codes, and the rlimit fallback when no cgroup is usable."""

from __future__ import annotations

import pytest
from sandbox_util import host_processes_with

from opencomposer.sandbox import Limits


@pytest.fixture
def ws(backend, project):
    workspace = backend.image_from_dir(project).workspace()
    yield workspace
    workspace.close()


def test_exit_codes_stdin_and_cwd(ws):
    assert ws.exec(["sh", "-c", "exit 7"]).exit_code == 7
    r = ws.exec(["sh", "-c", "pwd; cat"], cwd="pkg", stdin=b"from stdin")
    assert r.stdout == "/workspace/pkg\nfrom stdin" and r.ok
    assert ws.exec("echo $0 via bash").stdout == "bash via bash\n"
    big = b"z" * 3_000_000
    assert ws.exec(["wc", "-c"], stdin=big).stdout.strip() == str(len(big))
    assert ws.exec(["true"], stdin=big, limits=Limits(timeout_s=10)).ok  # never reads: no hang
    killed = ws.exec(["sh", "-c", "kill -TERM $$"])
    assert killed.exit_code == 128 + 15 and not killed.timed_out


async def test_aexec_stdin_and_output_cap(ws):
    r = await ws.aexec(["wc", "-c"], stdin=b"q" * 2_000_000)
    assert r.stdout.strip() == "2000000"
    flood = await ws.aexec(["head", "-c", "5000000", "/dev/zero"], limits=Limits(output_bytes=1000))
    assert flood.ok and flood.output_truncated and len(flood.stdout) == 1000


def test_file_size_limit(ws):
    r = ws.exec(["sh", "-c", "head -c 3000000 /dev/zero > big; echo $?; wc -c < big"],
                limits=Limits(file_size_mb=1))
    assert r.stdout.split()[1] == str(1 << 20)
    assert (ws.root / "big").stat().st_size == 1 << 20


def test_rlimit_fallback_without_cgroups(ws, monkeypatch):
    monkeypatch.setenv("OPENCOMPOSER_CGROUPS", "off")
    r = ws.exec(["python3", "-c", "x = bytearray(1 << 30)"], limits=Limits(memory_mb=256))
    assert r.exit_code == 1 and "MemoryError" in r.stderr and not r.oom_killed
    marker = "765432.5"
    t = ws.exec(["sh", "-c", f"setsid sleep {marker} & sleep {marker}"], limits=Limits(timeout_s=1))
    assert t.timed_out and host_processes_with(marker) == []  # the pid namespace still reaps all


def test_cgroup_v2_files_on_a_fake_hierarchy(tmp_path, monkeypatch):
    """This machine has cgroup v1; check the v2 protocol (file names, values) on a fake tree."""
    from opencomposer.sandbox import limits as limits_mod

    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    (root / "cgroup.subtree_control").write_text("cpu\n")
    monkeypatch.setattr(limits_mod, "CGROUP_ROOT", root)
    limits_mod._detect_layout.cache_clear()
    try:
        layout = limits_mod.cgroup_layout()
        assert layout.version == 2 and layout.memory == layout.pids == root / "opencomposer"
        assert (root / "cgroup.subtree_control").read_text() == "+memory +pids"
        cg = limits_mod.Cgroup(layout, 256 << 20, 32)
        d = cg.dirs[0]
        assert (d / "memory.max").read_text() == str(256 << 20) and (d / "pids.max").read_text() == "32"
        assert (d / "memory.swap.max").read_text() == "0"
        (d / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
        assert cg.oom_kills() == 1 and cg.procs_files == [d / "cgroup.procs"]
    finally:
        limits_mod._detect_layout.cache_clear()
