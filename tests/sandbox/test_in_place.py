"""In-place workspaces (a user's own checkout, `opencomposer tool call --workspace DIR`),
attacked from inside the sandbox: what a command leaves there runs later *outside* any
sandbox, as the user, so git's config and hooks, virtualenvs and setuid bits are guarded.
Also: the overlay store must not hand sandbox-written setuid files to other host users."""

from __future__ import annotations

import os
import stat
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from sandbox_util import tree_state

from opencomposer.sandbox import get_backend

BACKENDS = ["bwrap", "gvisor"]


@pytest.fixture
def checkout(project: Path) -> Path:
    """The project as a user's git checkout with two virtualenvs beside the code."""
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    for venv in (".venv", "venv"):
        site = project / venv / "lib" / "python3.11" / "site-packages"
        site.mkdir(parents=True)
        (project / venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
        (site / "ok.pth").write_text("")
    (project / "notes").mkdir()  # an ordinary dir: stays writable
    return project


@pytest.fixture(params=BACKENDS)
def in_place(request, store, checkout):
    ws = get_backend(request.param, store).workspace_in_place(checkout)
    yield ws
    ws.close()


def test_git_dir_cannot_be_changed_from_the_sandbox(in_place, checkout):
    before = tree_state(checkout / ".git")
    r = in_place.exec(["sh", "-c", """
        git config core.fsmonitor 'touch /workspace/PWNED' 2>&1
        echo '[core] fsmonitor = touch /workspace/PWNED' >> .git/config 2>&1
        printf '#!/bin/sh\ntouch /workspace/PWNED\n' > .git/hooks/pre-commit 2>&1
        mv .git/config .git/config.old 2>&1; mv .git gone 2>&1; rm -rf .git 2>&1
        cp -r .git evil 2>&1 && mv evil .git 2>&1
        ln -sf /workspace/evil .git/config 2>&1; echo done"""])
    assert r.stdout.rstrip().endswith("done"), r.stdout + r.stderr
    assert tree_state(checkout / ".git") == before
    assert "fsmonitor" not in (checkout / ".git" / "config").read_text()
    assert (checkout / "notes").is_dir() and in_place.exec(["touch", "notes/written"]).ok  # the rest is writable
    assert in_place.readonly_paths == (".git", ".venv", "venv")


def test_a_worktree_gitdir_file_cannot_be_redirected(store, project):
    (project / ".git").write_text("gitdir: /elsewhere/.git/worktrees/project\n")
    ws = get_backend("bwrap", store).workspace_in_place(project)
    r = ws.exec(["sh", "-c", "mkdir evil; echo 'gitdir: evil' > .git 2>&1; rm -f .git 2>&1; "
                             "mv evil .git 2>&1; cat .git"])
    assert r.stdout.endswith("gitdir: /elsewhere/.git/worktrees/project\n"), r.stdout
    assert (project / ".git").read_text() == "gitdir: /elsewhere/.git/worktrees/project\n"
    assert ws.readonly_paths == (".git",)


def test_virtualenvs_cannot_be_given_code_to_run(in_place, checkout):
    before = {v: tree_state(checkout / v) for v in (".venv", "venv")}
    r = in_place.exec(["sh", "-c", """
        for v in .venv venv; do
            echo 'import os; os.system("touch /workspace/PWNED")' > $v/lib/python3.11/site-packages/evil.pth
            echo 'include-system-site-packages = true' >> $v/pyvenv.cfg
            mkdir -p $v/bin && printf '#!/bin/sh\n' > $v/bin/python; rm -rf $v
        done 2>/dev/null; echo done"""])
    assert r.stdout == "done\n"
    assert {v: tree_state(checkout / v) for v in (".venv", "venv")} == before
    assert in_place.exec(["sh", "-c", "mkdir newenv && touch newenv/pyvenv.cfg"]).ok  # made now: not protected


def test_setuid_and_setgid_files_do_not_survive_the_exec(in_place, checkout, tmp_path):
    mine = checkout / "users_own_tool"  # setuid before the exec: the user's business, left alone
    mine.write_text("#!/bin/sh\n")
    mine.chmod(0o4755)
    outside = tmp_path / f"host_setuid_{uuid.uuid4().hex[:6]}"  # a link target out of the tree
    outside.write_text("#!/bin/sh\n")
    time.sleep(0.2)
    outside.chmod(0o4755)
    r = in_place.exec(["sh", "-c", f"""
        cp /bin/sh rootshell && chmod 4755 rootshell
        cp /bin/sh groupshell && chmod 2755 groupshell
        mkdir -p a/b/c && cp /bin/sh a/b/c/both && chmod 6711 a/b/c/both
        python3 -c 'import os; os.close(os.open("created_setuid", os.O_CREAT | os.O_WRONLY, 0o4755))'
        ln -s {outside} link_out && chmod 4755 notes 2>/dev/null; echo done"""])
    assert r.stdout == "done\n", r.stderr
    for rel in ("rootshell", "groupshell", "a/b/c/both", "created_setuid"):
        mode = (checkout / rel).lstat().st_mode
        assert not mode & (stat.S_ISUID | stat.S_ISGID), (rel, oct(mode))
        assert mode & 0o111 or rel == "created_setuid"  # only the bits went, not the file
    assert mine.stat().st_mode & stat.S_ISUID
    assert outside.stat().st_mode & stat.S_ISUID  # the link was not followed


def test_setuid_files_deeper_than_path_max_are_stripped(store, project):
    ws = get_backend("bwrap", store).workspace_in_place(project)
    r = ws.exec(["python3", "-c", """
import os
fd = os.open(".", os.O_RDONLY)
for _ in range(30):  # 30 x 200 bytes: past PATH_MAX
    os.mkdir("d" * 199, dir_fd=fd)
    sub = os.open("d" * 199, os.O_RDONLY, dir_fd=fd); os.close(fd); fd = sub
os.close(os.open("deep_setuid", os.O_CREAT | os.O_WRONLY, 0o755, dir_fd=fd))
os.chmod("deep_setuid", 0o4755, dir_fd=fd)
print(oct(os.stat("deep_setuid", dir_fd=fd).st_mode))"""])
    assert r.stdout == "0o104755\n", r.stderr
    found = subprocess.run(["find", str(project), "-name", "deep_setuid", "-perm", "/6000"],
                           capture_output=True, text=True)
    assert found.stdout == "" and "deep_setuid" in subprocess.run(
        ["find", str(project), "-name", "deep_setuid"], capture_output=True, text=True).stdout
    subprocess.run(["rm", "-rf", str(project / ("d" * 199))], check=True)


def test_setuid_files_in_the_overlay_store_are_out_of_other_users_reach(tmp_path, project):
    shared = Path("/dev/shm") / f"oc-test-{uuid.uuid4().hex[:8]}"  # parents any user can traverse
    ws = get_backend("bwrap", shared / "store").image_from_dir(project).workspace()
    try:
        r = ws.exec(["sh", "-c", "cp /bin/sh rootshell && chmod 4755 rootshell && echo ok"])
        assert r.stdout == "ok\n"
        upper_file = ws.root.parent / "upper" / "rootshell"
        assert upper_file.stat().st_mode & stat.S_ISUID  # the store holds a setuid-root file...
        probe = subprocess.run(["python3", "-c", f"import os; os.stat({str(upper_file)!r}); print('REACHED')"],
                               user=65534, group=65534, extra_groups=[], cwd="/", capture_output=True, text=True)
        assert "REACHED" not in probe.stdout and "PermissionError" in probe.stderr  # ...no one else reaches
        assert stat.S_IMODE((shared / "store").stat().st_mode) == 0o700
    finally:
        ws.close()
        subprocess.run(["rm", "-rf", str(shared)], check=True)
