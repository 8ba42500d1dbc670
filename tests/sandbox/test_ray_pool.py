"""SandboxActor on a local Ray instance: plain-data exec, files, fork, diff, apply, cleanup."""

from __future__ import annotations

from pathlib import Path

import pytest

from opencomposer.sandbox.layers import mounts_under

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def ray_actor(tmp_path_factory):
    ray = pytest.importorskip("ray")
    from opencomposer.sandbox.ray_pool import actor_per_node

    store = tmp_path_factory.mktemp("ray_store")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        actors = actor_per_node(store_dir=str(store), max_size=8)
        assert len(actors) == 1  # one node here, one actor on it
        actor = next(iter(actors.values()))
        yield ray, actor, store
        ray.get(actor.shutdown.remote())
    finally:
        ray.shutdown()


def test_actor_serves_workspaces_with_plain_data(ray_actor, project):
    ray, actor, store = ray_actor
    ws = ray.get(actor.open.remote([str(project)]))
    result = ray.get(actor.exec.remote(ws, ["sh", "-c", "echo hi > note.txt; cat README.md"], {"timeout_s": 30}))
    assert result["exit_code"] == 0 and result["stdout"].startswith("# demo")
    ray.get(actor.write_file.remote(ws, "pkg/new.py", b"NEW = 1\n"))
    assert ray.get(actor.read_file.remote(ws, "note.txt")) == b"hi\n"
    lines_in = lambda w, path: (w.root / path).read_text().splitlines()  # noqa: E731 - shipped by value
    assert ray.get(actor.apply.remote(ws, lines_in, "pkg/new.py")) == ["NEW = 1"]
    forks = ray.get(actor.fork.remote(ws, 2))
    ray.get(actor.exec.remote(forks[0], ["sh", "-c", "echo fork0 > note.txt"]))
    assert ray.get(actor.read_file.remote(forks[1], "note.txt")) == b"hi\n"
    assert "+++ b/note.txt" in ray.get(actor.diff.remote(ws))
    assert "-hi\n+fork0\n" in ray.get(actor.diff.remote(forks[0]))
    with pytest.raises(ray.exceptions.RayTaskError, match="outside the workspace"):
        ray.get(actor.read_file.remote(ws, "../../../../etc/hostname"))
    for w in [ws, *forks]:
        ray.get(actor.close.remote(w))
    assert ray.get(actor.stats.remote())["open"] == 0
    ray.get(actor.shutdown.remote())
    assert mounts_under(Path(store)) == []
