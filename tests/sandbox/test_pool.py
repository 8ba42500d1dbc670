"""WorkspacePool: fresh workspaces, warm spares, the size bound, shutdown."""

from __future__ import annotations

import asyncio

import pytest

from opencomposer.errors import SandboxError
from opencomposer.sandbox.layers import mounts_under
from opencomposer.sandbox.pool import WorkspacePool


async def test_rollouts_get_fresh_isolated_workspaces_from_warm_spares(backend, project, store):
    pool = WorkspacePool(max_size=16, warm_per_image=2)
    image = backend.image_from_dir(project)

    async def rollout(i: int) -> str:
        async with pool.workspace(image) as ws:
            r = await ws.aexec(["sh", "-c", f"cat state 2>/dev/null; echo {i} > state; cat state"])
            return r.stdout

    outs = await asyncio.gather(*(rollout(i) for i in range(12)))
    assert outs == [f"{i}\n" for i in range(12)]  # nobody saw another rollout's file
    await asyncio.sleep(0)  # the top-up runs between acquires
    assert pool.stats().leased == 0 and pool.stats().warm == 2
    async with pool.workspace(image) as ws:
        assert pool.stats().served_warm == 1 and not (ws.root / "state").exists()
        await asyncio.sleep(0)
        assert pool.stats().warm == 2  # topped up again
    await pool.aclose()
    assert mounts_under(store) == []


async def test_pool_is_bounded_and_waiters_resume_on_release(backend, project):
    pool = WorkspacePool(max_size=2, warm_per_image=0)
    image = backend.image_from_dir(project)
    a, b = await pool.acquire(image), await pool.acquire(image)
    third = asyncio.create_task(pool.acquire(image))
    await asyncio.sleep(0.05)
    assert not third.done() and pool.stats().leased == 2
    await pool.release(a)
    c = await asyncio.wait_for(third, 5)
    assert c.root != a.root and pool.stats().leased == 2
    await pool.aclose()
    with pytest.raises(SandboxError, match="closed"):
        await pool.acquire(image)


async def test_full_pool_evicts_warm_spares_of_other_images(backend, project, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    pool = WorkspacePool(max_size=2, warm_per_image=2)
    first = backend.image_from_dir(project)
    ws = await pool.acquire(first)
    await asyncio.sleep(0)  # let the top-up fill the last slot with a warm spare
    assert pool.stats().warm == 1
    ws2 = await asyncio.wait_for(pool.acquire(backend.image_from_dir(other)), 5)
    assert (ws2.root / "README.md").exists() is False
    await pool.release(ws)
    await pool.release(ws2)
    await pool.aclose()
