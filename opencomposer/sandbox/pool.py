"""A bounded pool of warm workspaces, serving many concurrent rollouts from one asyncio loop.

Each rollout gets a *fresh* workspace over its task image; a released workspace is closed,
never handed to another rollout (its upper dir holds the previous agent's edits). What the
pool keeps warm is the setup: up to `warm_per_image` already-mounted workspaces per image,
topped up right after each acquire, so a rollout starts without waiting for a mount (and,
for backends with a costlier setup, without waiting for that either).

    pool = WorkspacePool(max_size=64)
    async with pool.workspace(image) as ws:      # waits while 64 workspaces are out
        result = await ws.aexec(["pytest", "-q"])
    await pool.aclose()                          # closes leased and warm workspaces

`max_size` bounds leased + warm workspaces together; when the pool is full, a warm
workspace of another image is closed to make room, else `acquire` waits for a release.
Everything runs on the caller's loop; mounts take ~0.3 ms, so they are done inline, while
closing (deleting an upper dir that may hold a whole `pip install`) runs in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from dataclasses import dataclass
from typing import AsyncIterator

from opencomposer.errors import SandboxError
from opencomposer.sandbox.base import Image, Workspace


@dataclass
class PoolStats:
    leased: int
    warm: int
    created: int
    served_warm: int
    """Acquires that got an already-mounted workspace."""


class WorkspacePool:
    """Warm, bounded workspaces per image for one asyncio loop. See the module docstring."""

    def __init__(self, max_size: int = 64, warm_per_image: int = 2):
        if max_size < 1 or warm_per_image < 0:
            raise ValueError("max_size must be >= 1 and warm_per_image >= 0")
        self.max_size = max_size
        self.warm_per_image = warm_per_image
        self._warm: dict[tuple, list[Workspace]] = defaultdict(list)
        self._images: dict[tuple, Image] = {}
        self._leased: set[Workspace] = set()
        self._changed = asyncio.Condition()
        self._closed = False
        self._created = self._served_warm = 0

    def _key(self, image: Image) -> tuple:
        key = tuple(str(p) for p in image.layers)
        self._images.setdefault(key, image)
        return key

    def _total(self) -> int:
        return len(self._leased) + sum(len(v) for v in self._warm.values())

    def _evict_other_warm(self, key: tuple) -> bool:
        for other, spare in self._warm.items():
            if other != key and spare:
                spare.pop().close()
                return True
        return False

    def _top_up(self, key: tuple) -> None:
        spare = self._warm[key]
        while not self._closed and len(spare) < self.warm_per_image and self._total() < self.max_size:
            spare.append(self._images[key].workspace())
            self._created += 1

    async def acquire(self, image: Image) -> Workspace:
        """A fresh workspace over `image`; waits while the pool is full."""
        key = self._key(image)
        async with self._changed:
            while True:
                if self._closed:
                    raise SandboxError("the workspace pool is closed")
                if self._warm[key]:
                    ws = self._warm[key].pop()
                    self._served_warm += 1
                    break
                if self._total() < self.max_size or self._evict_other_warm(key):
                    ws = image.workspace()
                    self._created += 1
                    break
                await self._changed.wait()
            self._leased.add(ws)
        asyncio.get_running_loop().call_soon(self._top_up, key)
        return ws

    async def release(self, ws: Workspace) -> None:
        """Close a leased workspace (in a thread: deleting a big upper dir takes a while) and
        wake one waiting acquirer."""
        try:
            await asyncio.to_thread(ws.close)
        finally:  # a close that failed (SandboxError: gc retries) still frees the slot
            async with self._changed:
                self._leased.discard(ws)
                self._changed.notify()

    @contextlib.asynccontextmanager
    async def workspace(self, image: Image) -> AsyncIterator[Workspace]:
        ws = await self.acquire(image)
        try:
            yield ws
        finally:
            await self.release(ws)

    def stats(self) -> PoolStats:
        return PoolStats(len(self._leased), sum(len(v) for v in self._warm.values()),
                         self._created, self._served_warm)

    async def aclose(self) -> None:
        """Close every workspace (leased ones too: their rollouts are over) and refuse new acquires."""
        async with self._changed:
            self._closed = True
            spaces = [*self._leased, *(w for spare in self._warm.values() for w in spare)]
            results = await asyncio.gather(*(asyncio.to_thread(ws.close) for ws in spaces),
                                           return_exceptions=True)
            self._leased.clear()
            self._warm.clear()
            self._images.clear()
            self._changed.notify_all()
        for r in results:
            if isinstance(r, BaseException):
                raise r
