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


class HostDir:
    def __init__(self, root):
        self.root = Path(root)


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


@pytest.fixture
def setup(tmp_path):
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
    box = ToolBox(HostDir(root), ToolConfig(search_cache_dir=tmp_path / "cache"), embedder=ToyEmbedder())
    return box, root, outside


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
