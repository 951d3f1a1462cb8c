"""The asyncio twin against a real 3-node cluster (each test runs its own event loop)."""

import asyncio

import pytest
from cluster import Cluster

import holdfast
import holdfast.aio


def run(coroutine_function, *args):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coroutine_function(*args), timeout=60))


def test_one_shot_calls(cluster: Cluster, name: str) -> None:
    async def scenario() -> None:
        async with holdfast.aio.Client(cluster.endpoints, owner="aio") as client:
            async with await client.acquire(name, ttl=30) as hold:
                info = await client.get(name)
                assert info is not None and info.holder is not None and info.holder.fence == hold.fence
                await hold.renew(ttl=60)
                assert hold.ttl_ms == 60_000
                with pytest.raises(holdfast.LockBusy) as busy:
                    await client.acquire(name, ttl=30, owner="other")
                assert busy.value.holder is not None and busy.value.holder.owner == "aio"
            assert await client.get(name) is None

    run(scenario)


def test_session_locks_hand_over_in_fifo_order(cluster: Cluster, name: str) -> None:
    async def scenario() -> None:
        client = holdfast.aio.Client(cluster.endpoints, owner="aio")
        first = client.lock(name, lease=2.0)
        assert await first.acquire()
        with pytest.raises(holdfast.LockBusy):
            async with client.lock(name, blocking=False):
                pytest.fail("the body must not run")
        second = client.lock(name, lease=2.0)
        waiting = asyncio.create_task(second.acquire())
        while not (cluster.read_lock(name) or {}).get("waiters"):
            await asyncio.sleep(0.05)
        assert not waiting.done()
        fence = first.fence
        await first.release()
        assert first.lost.is_set()
        assert await waiting is True
        assert second.fence > fence and not second.lost.is_set()
        await second.release()
        await asyncio.wait_for(second.lost.wait(), 5)

    run(scenario)


def test_a_cancelled_acquire_leaves_the_queue(cluster: Cluster, name: str) -> None:
    async def scenario() -> None:
        client = holdfast.aio.Client(cluster.endpoints, owner="aio")
        async with client.lock(name, lease=2.0) as held:
            waiting = asyncio.create_task(client.lock(name, lease=2.0).acquire())
            while not (cluster.read_lock(name) or {}).get("waiters"):
                await asyncio.sleep(0.05)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            while (cluster.read_lock(name) or {}).get("waiters"):
                await asyncio.sleep(0.05)
            assert cluster.read_lock(name)["holder"]["fence"] == held.fence  # type: ignore[index]
        assert await client.get(name) is None

    run(scenario)
