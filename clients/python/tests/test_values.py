"""Values and lock-delay against a real 3-node cluster: a new value on a one-shot hold and on a session's
lock (the fence stays; reads show it), refusals, and a session lock's lock-delay after its holder is killed."""

import threading
import time
from typing import List

import pytest
from cluster import Cluster, wait_for
from conftest import HolderProc

import holdfast


def test_a_one_shot_hold_publishes_a_new_value_with_the_same_fence(client: holdfast.Client, name: str) -> None:
    with client.acquire(name, ttl=30, value="10.0.0.1:8080") as hold:
        assert hold.value == b"10.0.0.1:8080"
        fence, expires_at_ms = hold.fence, hold.expires_at_ms
        assert hold.set_value(b"10.0.0.1:9090") is hold
        assert (hold.value, hold.fence, hold.expires_at_ms) == (b"10.0.0.1:9090", fence, expires_at_ms)
        info = client.get(name)
        assert info is not None and info.holder is not None
        assert (info.holder.value, info.holder.fence) == (b"10.0.0.1:9090", fence)
    with pytest.raises(holdfast.NotHolder):
        hold.set_value(b"after the release")


def test_a_session_lock_publishes_a_new_value_with_the_same_fence(client: holdfast.Client, name: str) -> None:
    with client.lock(name, lease=2.0, value=b"first") as held:
        held.set_value("second")
        assert held.value == b"second"
        info = client.get(name)
        assert info is not None and info.holder is not None
        assert (info.holder.value, info.holder.fence, info.holder.session_id) == (
            b"second",
            held.fence,
            held.session_id,
        )
    with pytest.raises(RuntimeError):  # released: nothing to set a value on
        held.set_value(b"third")


@pytest.mark.parametrize("value, error", [(b"v" * 1025, holdfast.InvalidArgument), (3.5, TypeError)])
def test_a_bad_value_is_refused_before_anything_is_sent(
    client: holdfast.Client, name: str, value: object, error: type
) -> None:
    with client.acquire(name, ttl=30, value=b"kept") as hold:
        with pytest.raises(error):
            hold.set_value(value)  # type: ignore[arg-type]
        info = client.get(name)
        assert info is not None and info.holder is not None and info.holder.value == b"kept"
    nowhere = holdfast.Client("127.0.0.1:1")  # no node: anything sent would fail with Unavailable
    with pytest.raises(error):
        nowhere.acquire(name, value=value)  # type: ignore[arg-type]
    with pytest.raises(error):
        nowhere.lock(name, value=value).acquire()  # type: ignore[arg-type]
    with pytest.raises(holdfast.InvalidArgument):
        nowhere.lock(name, lock_delay=-1).acquire()


def test_a_session_locks_lock_delay_keeps_it_from_everyone_after_the_holder_dies(
    cluster: Cluster, client: holdfast.Client, name: str, holders: list
) -> None:
    lease, delay = 2.0, 1.5
    victim = HolderProc(name, lease, cluster.endpoints, options=["--lock-delay", str(delay)])
    holders.append(victim)
    fence, _ = victim.acquired()
    successor = client.lock(name, lease=lease)
    got: List[bool] = []
    waiting = threading.Thread(target=lambda: got.append(successor.acquire()))
    waiting.start()
    wait_for("the successor in the queue", lambda: (client.get(name) or holdfast.LockInfo(name, None)).waiters)
    victim.kill()

    def in_delay() -> "holdfast.LockInfo | None":
        info = client.get(name)
        return info if info is not None and info.holder is not None and not info.holder.is_live else None

    delayed = wait_for("the lock in its lock-delay", in_delay, bound_s=lease * 3)
    assert delayed.holder.fence == fence and delayed.holder.free_at_ms
    assert not got, "nobody is granted the lock during its lock-delay"
    assert client.leader(name) is None
    waiting.join(timeout=delay * 5)
    assert got == [True] and successor.fence > fence
    # Granted when the delay ended (the leader's wall clock is this machine's), not when the lease did.
    assert time.time() * 1000 >= delayed.holder.free_at_ms
    successor.release()
