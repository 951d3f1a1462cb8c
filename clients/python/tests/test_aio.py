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


def test_an_async_watch_sees_each_change_and_a_timed_out_step_loses_nothing(cluster: Cluster, name: str) -> None:
    async def scenario() -> None:
        client = holdfast.aio.Client(cluster.endpoints, owner="aio")
        async with client.watch(name) as watch:
            first = await watch.__anext__()
            assert first.initial and first.holder is None
            # A step whose awaiting is cancelled goes on: its state is the next one answered.
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(watch.__anext__(), 0.2)
            hold = await client.acquire(name, ttl=30, value="v1")
            granted = await asyncio.wait_for(watch.__anext__(), 10)
            assert granted.holder is not None and granted.holder.fence == hold.fence
            await hold.set_value(b"v2")
            assert hold.value == b"v2"
            revalued = await asyncio.wait_for(watch.__anext__(), 10)
            assert revalued.holder is not None and revalued.holder.value == b"v2"
            await hold.release()
            freed = await asyncio.wait_for(watch.__anext__(), 10)
            assert freed.holder is None and freed.revision > revalued.revision > granted.revision
            assert watch.revision == freed.revision
        assert [state async for state in watch] == []  # ended at the exit of `async with`
        assert [lock async for lock in client.locks(name)] == []

    run(scenario)


def test_async_candidates_lead_in_turn_and_observers_see_each_leader(cluster: Cluster, name: str) -> None:
    async def scenario() -> None:
        client = holdfast.aio.Client(cluster.endpoints, owner="aio")
        leaders = client.observe(name)
        assert await leaders.__anext__() is None
        first = await client.campaign(name, "first", lease=30.0)
        assert await leaders.__anext__() == holdfast.Leader(b"first", first.fence, "aio")
        second_campaign = asyncio.create_task(client.campaign(name, b"second", lease=2.0, owner="aio-2"))
        while not (cluster.read_lock(name) or {}).get("waiters"):
            await asyncio.sleep(0.05)
        await first.proclaim("first-2")
        assert await leaders.__anext__() == holdfast.Leader(b"first-2", first.fence, "aio")
        await first.resign()
        assert first.lost.is_set()
        second = await asyncio.wait_for(second_campaign, 5)  # at once: the first's lease is 30 s
        assert second.fence > first.fence and await client.leader(name) == holdfast.Leader(
            b"second", second.fence, "aio-2"
        )
        assert await leaders.__anext__() == holdfast.Leader(b"second", second.fence, "aio-2")
        async with second:
            pass
        assert await leaders.__anext__() is None
        leaders.cancel()
        assert [leader async for leader in leaders] == []

    run(scenario)


def test_a_cancelled_campaign_leaves_the_queue(cluster: Cluster, name: str) -> None:
    async def scenario() -> None:
        client = holdfast.aio.Client(cluster.endpoints, owner="aio")
        async with await client.campaign(name, "leader", lease=2.0) as leadership:
            waiting = asyncio.create_task(client.campaign(name, "candidate", lease=2.0))
            while not (cluster.read_lock(name) or {}).get("waiters"):
                await asyncio.sleep(0.05)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            while (cluster.read_lock(name) or {}).get("waiters"):
                await asyncio.sleep(0.05)
            assert await client.leader(name) == holdfast.Leader(b"leader", leadership.fence, "aio")
        assert leadership.is_lost() and await client.leader(name) is None

    run(scenario)
