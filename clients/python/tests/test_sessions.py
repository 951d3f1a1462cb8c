"""Session locks against a real 3-node cluster: FIFO hand-over between processes, a holder killed with -9,
try-locks, timeouts, semaphores and refusals."""

import gc
import threading
import time
from typing import List

import pytest
from cluster import Cluster, wait_for
from conftest import HolderProc

import holdfast


def waiters(cluster: Cluster, name: str) -> List[dict]:
    lock = cluster.read_lock(name)
    return lock["waiters"] if lock else []


def test_the_lock_goes_to_the_waiting_process_the_moment_the_holder_releases(
    cluster: Cluster, name: str, holders: list
) -> None:
    first = HolderProc(name, 2.0, cluster.endpoints)
    holders.append(first)
    first_fence, first_session = first.acquired()
    second = HolderProc(name, 2.0, list(reversed(cluster.endpoints)))
    holders.append(second)
    wait_for("the second process in the queue", lambda: waiters(cluster, name))
    assert second.lines.empty(), "the second process must wait while the first holds the lock"
    first.release()
    first.expect("released")
    second_fence, second_session = second.acquired()
    assert second_fence > first_fence and second_session != first_session
    lock = cluster.read_lock(name)
    assert lock is not None and lock["holder"]["fence"] == second_fence
    second.release()
    second.expect("released")
    assert cluster.read_lock(name) is None


def test_a_holder_killed_with_sigkill_is_replaced_after_its_lease_not_before(
    cluster: Cluster, client: holdfast.Client, name: str, holders: list
) -> None:
    lease = 2.0
    victim = HolderProc(name, lease, cluster.endpoints)
    holders.append(victim)
    victim_fence, victim_session = victim.acquired()
    successor = client.lock(name, lease=lease)
    got: List[bool] = []
    waiting = threading.Thread(target=lambda: got.append(successor.acquire()))
    waiting.start()
    wait_for("the successor in the queue", lambda: waiters(cluster, name))
    victim.kill()
    # Right after the kill the cluster still gives the lock to the dead holder's session: its lease lives on.
    lock = cluster.read_lock(name)
    assert lock is not None and lock["holder"]["fence"] == victim_fence
    assert not got, "the successor must not be granted before the dead holder's lease ran out"
    waiting.join(timeout=lease * 5)
    assert got == [True]
    assert successor.fence > victim_fence
    info = client.get(name)
    assert info is not None and info.holder is not None
    assert info.holder.fence == successor.fence and info.holder.session_id == successor.session_id != victim_session
    successor.release()


def test_a_try_lock_of_a_taken_lock_raises_busy_with_the_holder(client: holdfast.Client, name: str) -> None:
    with client.lock(name, lease=2.0) as held:
        other = holdfast.Client(client.endpoints, owner="other")
        with pytest.raises(holdfast.LockBusy) as busy:
            with other.lock(name, blocking=False):
                pytest.fail("the body must not run")
        assert busy.value.holder is not None
        assert (busy.value.holder.owner, busy.value.holder.fence) == ("pytest", held.fence)
        assert busy.value.holder.session_id == held.session_id
        assert other.lock(name).acquire(blocking=False) is False
    assert held.lost.is_set()  # released at the end of the with
    assert client.get(name) is None


def test_a_timeout_raises_lock_timeout_and_withdraws_from_the_queue(
    client: holdfast.Client, cluster: Cluster, name: str
) -> None:
    with client.lock(name, lease=2.0) as held:
        started = time.monotonic()
        with pytest.raises(holdfast.LockTimeout):
            with client.lock(name, timeout=0.5):
                pytest.fail("the body must not run")
        assert time.monotonic() - started >= 0.5
        assert waiters(cluster, name) == []
        assert client.lock(name).acquire(timeout=0.2) is False
        assert waiters(cluster, name) == []
        assert cluster.read_lock(name)["holder"]["fence"] == held.fence  # type: ignore[index]
        assert not held.lost.is_set()


def test_a_semaphore_of_two_holds_two_and_queues_the_third(
    client: holdfast.Client, cluster: Cluster, name: str
) -> None:
    one = client.lock(name, lease=2.0, limit=2)
    two = client.lock(name, lease=2.0, limit=2)
    three = client.lock(name, lease=2.0, limit=2)
    assert one.acquire() and two.acquire()
    fences = {one.fence, two.fence}
    assert len(fences) == 2
    assert three.acquire(blocking=False) is False
    got: List[bool] = []
    waiting = threading.Thread(target=lambda: got.append(three.acquire()))
    waiting.start()
    wait_for("the third in the queue", lambda: waiters(cluster, name))
    info = client.get(name)
    assert info is not None and info.limit == 2
    assert {h.fence for h in info.holders} == fences
    assert not got
    one.release()
    waiting.join(timeout=10)
    assert got == [True] and three.fence > max(fences)
    info = client.get(name)
    assert info is not None and {h.session_id for h in info.holders} == {two.session_id, three.session_id}
    two.release()
    three.release()
    assert client.get(name) is None


@pytest.mark.parametrize(
    "bad",
    [{"name": "bad name"}, {"lease": 0.1}, {"lease": -1}, {"limit": 2000}, {"value": b"v" * 2000}],
    ids=lambda bad: next(iter(bad)),
)
def test_bad_session_arguments_are_refused_and_change_nothing(
    client: holdfast.Client, cluster: Cluster, name: str, bad: dict
) -> None:
    args = {"name": name, **bad}
    lock = client.lock(args.pop("name"), **args)
    with pytest.raises(holdfast.InvalidArgument) as refused:
        lock.acquire()
    assert str(refused.value)
    assert not lock.locked()
    assert cluster.read_lock(name) is None


def test_another_limit_than_the_names_is_refused(client: holdfast.Client, name: str) -> None:
    with client.lock(name, lease=2.0, limit=2) as held:
        with pytest.raises(holdfast.LimitMismatch):
            client.lock(name, lease=2.0, limit=3).acquire()
        info = client.get(name)
        assert info is not None and [h.fence for h in info.holders] == [held.fence] and info.waiters == []


def test_a_lock_is_reacquired_after_release_with_a_fresh_lost_event(client: holdfast.Client, name: str) -> None:
    lock = client.lock(name, lease=2.0)
    assert lock.acquire()
    first_fence, first_lost = lock.fence, lock.lost
    lock.release()
    assert first_lost.is_set() and not lock.locked()
    assert lock.acquire()
    assert lock.fence > first_fence and not lock.lost.is_set()
    lock.release()


def test_a_lock_dropped_without_a_release_is_handed_over(client: holdfast.Client, cluster: Cluster, name: str) -> None:
    lock = client.lock(name, lease=30.0)  # a long lease: only a close can free it in time
    assert lock.acquire()
    fence = lock.fence
    del lock
    gc.collect()
    successor = client.lock(name, lease=2.0)
    assert successor.acquire(timeout=10)
    assert successor.fence > fence
    successor.release()
