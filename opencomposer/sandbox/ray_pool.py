"""The workspace pool as Ray actors, one per node, so rollouts scale out over a cluster.

Workspaces are mounts on one machine, so a rollout's tool calls must run on the node that
holds its workspace. `SandboxActor` owns a `WorkspacePool` on its node and exposes it with
plain-data methods (ids, strings, bytes, dicts), all async so that one actor serves
hundreds of concurrent rollouts from its event loop:

    actors = actor_per_node(backend="bwrap")           # {node_id: handle}, pinned by node id
    a = next(iter(actors.values()))
    ws = ray.get(a.open.remote(["/data/task-17/image"]))  # layer dirs on that node
    ray.get(a.exec.remote(ws, ["pytest", "-q"], {"timeout_s": 60}))   # ExecResult as a dict
    ray.get(a.apply.remote(ws, some_tool_fn, args))    # run any fn(workspace, ...) next to the files
    patch = ray.get(a.diff.remote(ws)); ray.get(a.close.remote(ws))

`apply` is how harness tools run remotely: the function is shipped (cloudpickle) and called
with the live Workspace in a worker thread. Actors are named
`opencomposer-sandbox-<node id>` in namespace `opencomposer`, so any driver finds the
existing one (`get_if_exists`); they reserve no CPU (the rollouts' commands use it).
Left out: moving a workspace between nodes (re-create it from the same layers instead).
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Callable, Sequence

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from opencomposer.errors import SandboxError
from opencomposer.sandbox.base import Image, Limits, Workspace
from opencomposer.sandbox.pool import WorkspacePool

NAMESPACE = "opencomposer"


def _limits(spec: dict | None) -> Limits:
    known = {f.name for f in fields(Limits)}
    unknown = set(spec or {}) - known
    if unknown:
        raise SandboxError(f"unknown limits {sorted(unknown)}; known: {sorted(known)}")
    return Limits(**(spec or {}))


@ray.remote(num_cpus=0, max_concurrency=1000)
class SandboxActor:
    """One node's sandboxes. Every method takes and returns plain data."""

    def __init__(self, backend: str = "bwrap", store_dir: str | None = None, max_size: int = 64,
                 warm_per_image: int = 2):
        from opencomposer.sandbox import get_backend

        self.backend = get_backend(backend, store_dir)
        self.pool = WorkspacePool(max_size=max_size, warm_per_image=warm_per_image)
        self._images: dict[tuple[str, ...], Image] = {}
        self._spaces: dict[str, Workspace] = {}
        self._pooled: set[str] = set()
        self._ids = itertools.count()

    def _image(self, layers: Sequence[str]) -> Image:
        key = tuple(str(Path(p).resolve()) for p in layers)
        if key not in self._images:
            self._images[key] = self.backend.image(list(key))
        return self._images[key]

    def _ws(self, ws_id: str) -> Workspace:
        try:
            return self._spaces[ws_id]
        except KeyError:
            raise SandboxError(f"no open workspace {ws_id!r} on this node") from None

    def _register(self, ws: Workspace) -> str:
        ws_id = f"ws{next(self._ids)}"
        self._spaces[ws_id] = ws
        return ws_id

    def _path(self, ws_id: str, rel: str) -> Path:
        root = self._ws(ws_id).root
        path = (root / rel).resolve()
        if path != root and root not in path.parents:
            raise SandboxError(f"{rel!r} is outside the workspace")
        return path

    async def open(self, layers: Sequence[str]) -> str:
        """A fresh workspace over the image made of `layers` (lowest first, dirs on this node)."""
        ws = await self.pool.acquire(self._image(layers))
        ws_id = self._register(ws)
        self._pooled.add(ws_id)
        return ws_id

    async def exec(self, ws_id: str, cmd: Sequence[str] | str, limits: dict | None = None, cwd: str = ".",
                   env: dict[str, str] | None = None, stdin: bytes | None = None) -> dict:
        result = await self._ws(ws_id).aexec(cmd, limits=_limits(limits), cwd=cwd, env=env, stdin=stdin)
        return asdict(result)

    async def read_file(self, ws_id: str, path: str) -> bytes:
        return await asyncio.to_thread(self._path(ws_id, path).read_bytes)

    async def write_file(self, ws_id: str, path: str, data: bytes) -> None:
        target = self._path(ws_id, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(target.write_bytes, data)

    async def apply(self, ws_id: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(workspace, *args, **kwargs)` in a worker thread on this node; returns its result."""
        return await asyncio.to_thread(fn, self._ws(ws_id), *args, **kwargs)

    async def diff(self, ws_id: str) -> str:
        return await asyncio.to_thread(self._ws(ws_id).diff)

    async def fork(self, ws_id: str, n: int) -> list[str]:
        """Snapshot the workspace and open n workspaces over the snapshot (outside the pool bound)."""
        return [self._register(ws) for ws in self._ws(ws_id).fork(n)]

    async def close(self, ws_id: str) -> None:
        ws = self._spaces.pop(ws_id, None)
        if ws is None:
            return
        if ws_id in self._pooled:
            self._pooled.discard(ws_id)
            await self.pool.release(ws)
        else:
            ws.close()

    async def stats(self) -> dict:
        return {"open": len(self._spaces), **asdict(self.pool.stats())}

    async def shutdown(self) -> None:
        """Close every workspace and release every image (call before killing the actor)."""
        for ws in self._spaces.values():
            ws.close()
        self._spaces.clear()
        self._pooled.clear()
        await self.pool.aclose()
        self._images.clear()


def actor_per_node(backend: str = "bwrap", store_dir: str | None = None, max_size: int = 64,
                   warm_per_image: int = 2) -> dict[str, ray.actor.ActorHandle]:
    """One `SandboxActor` on every alive node, pinned there (created, or found by name)."""
    actors = {}
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        node_id = node["NodeID"]
        actors[node_id] = SandboxActor.options(
            name=f"opencomposer-sandbox-{node_id}", namespace=NAMESPACE, get_if_exists=True,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(backend, store_dir, max_size, warm_per_image)
    return actors
