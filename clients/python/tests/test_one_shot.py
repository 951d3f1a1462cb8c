"""One-shot TTL holds against a real 3-node cluster: acquire, renew, release, get, and refusals."""

import threading

import pytest
from cluster import Cluster, wait_for

import holdfast


def test_acquire_renew_release_and_get_through_any_node(cluster: Cluster, name: str) -> None:
    first = holdfast.Client(cluster.endpoints[0], owner="w1")
    third = holdfast.Client(cluster.endpoints[2])
    hold = first.acquire(name, ttl=30, value=b"10.0.0.1:8080")
    assert len(hold.token) == 32 and hold.fence > 0 and hold.owner == "w1"
    info = third.get(name)
    assert info is not None and info.holder is not None
    assert (info.holder.owner, info.holder.fence, info.holder.value) == ("w1", hold.fence, b"10.0.0.1:8080")
    assert info.holder.ttl_ms == 30_000 and info.holder.session_id is None and info.limit == 1
    fence = hold.fence
    hold.renew(ttl=60)
    assert hold.fence == fence and hold.ttl_ms == 60_000
    assert hold.release() == fence
    assert third.get(name) is None
    with pytest.raises(holdfast.NotHolder):
        hold.release()
    with pytest.raises(holdfast.NotHolder):
        hold.renew()


def test_a_busy_acquire_names_the_holder(client: holdfast.Client, name: str) -> None:
    with client.acquire(name, ttl=30, owner="worker-1") as hold:
        with pytest.raises(holdfast.LockBusy) as busy:
            client.acquire(name, ttl=30, owner="worker-2")
        assert busy.value.holder is not None
        assert (busy.value.holder.owner, busy.value.holder.fence) == ("worker-1", hold.fence)
        assert "worker-1" in str(busy.value)
    assert client.get(name) is None


def test_a_waiting_acquire_is_granted_at_the_release_with_a_larger_fence(client: holdfast.Client, name: str) -> None:
    first = client.acquire(name, ttl=30)
    granted = []
    waiter = threading.Thread(target=lambda: granted.append(client.acquire(name, ttl=30, wait=20, owner="w2")))
    waiter.start()
    wait_for("the waiter in the queue", lambda: (client.get(name) or holdfast.LockInfo(name, None)).waiters)
    first.release()
    waiter.join(timeout=20)
    assert granted and granted[0].fence > first.fence and granted[0].owner == "w2"
    granted[0].release()


@pytest.mark.parametrize(
    "bad",
    [
        {"name": "no spaces allowed"},
        {"name": "x" * 201},
        {"ttl": 0.1},
        {"ttl": 10 * 24 * 3600},
        {"ttl": -1},
        {"limit": 2000},
        {"wait": 3600},
        {"value": b"v" * 2000},
        {"owner": "bad\nowner"},
    ],
    ids=lambda bad: next(iter(bad)),
)
def test_bad_arguments_are_refused_and_change_nothing(
    client: holdfast.Client, cluster: Cluster, name: str, bad: dict
) -> None:
    args = {"name": name, "ttl": 30.0, **bad}
    with pytest.raises(holdfast.InvalidArgument) as refused:
        client.acquire(args.pop("name"), **args)
    assert str(refused.value)  # says what was wrong
    assert client.get(name) is None
    assert cluster.read_lock(name) is None


def test_another_limit_than_the_locks_is_refused_and_changes_nothing(client: holdfast.Client, name: str) -> None:
    hold = client.acquire(name, ttl=30, limit=2)
    before = client.get(name)
    with pytest.raises(holdfast.LimitMismatch):
        client.acquire(name, ttl=30, limit=3)
    assert client.get(name) == before
    hold.release()
