"""Watches against real 3-node clusters: a lock's states in revision order through acquire, queueing, a new
value, hand-over and release; a resume through another node when the watch's node is killed; a prefix's
watch; lists; cancelling; refusals."""

import threading
from types import SimpleNamespace
from typing import Callable, List, Optional

import pytest
from cluster import Cluster
from conftest import Collector

import holdfast
from holdfast.v1 import locks_pb2


def strictly_increasing(revisions: List[int]) -> bool:
    return all(a < b for a, b in zip(revisions, revisions[1:]))


def test_a_watch_sees_acquire_queueing_a_value_hand_over_and_release_in_revision_order(
    client: holdfast.Client, name: str, collectors: Callable[..., Collector]
) -> None:
    watch = collectors(client.watch(name))
    first = watch.next()
    assert first.initial and first.name == name and first.holder is None and first.waiters == []

    a = client.lock(name, lease=2.0, owner="a", value=b"10.0.0.1")
    assert a.acquire()
    granted = watch.next()
    assert not granted.initial and granted.holder is not None
    assert (granted.holder.owner, granted.holder.fence, granted.holder.session_id, granted.holder.value) == (
        "a",
        a.fence,
        a.session_id,
        b"10.0.0.1",
    )

    b = client.lock(name, lease=2.0, owner="b")
    got: List[bool] = []
    waiting = threading.Thread(target=lambda: got.append(b.acquire()))
    waiting.start()
    queued = watch.next()
    assert [w.owner for w in queued.waiters] == ["b"] and queued.holder is not None and queued.holder.owner == "a"

    a.set_value("10.0.0.2")
    revalued = watch.next()
    assert revalued.holder is not None and (revalued.holder.fence, revalued.holder.value) == (a.fence, b"10.0.0.2")

    a_fence = a.fence
    a.release()
    handed = watch.next()
    assert handed.holder is not None and handed.holder.owner == "b" and handed.waiters == []
    waiting.join(timeout=10)
    assert got == [True] and handed.holder.fence == b.fence > a_fence

    b.release()
    freed = watch.next()
    assert freed.holder is None and freed.waiters == [] and not freed.initial
    states = [first, granted, queued, revalued, handed, freed]
    assert strictly_increasing([s.revision for s in states[1:]]), [s.revision for s in states]
    assert watch.items.empty(), "one state per change, none twice"


def test_a_watch_resumes_through_another_node_when_its_node_is_killed(
    own_cluster: Cluster, collectors: Callable[..., Collector]
) -> None:
    name = "watched"
    # The watch streams from the leader, its first endpoint; the writer never talks to it.
    victim = own_cluster.leader()
    others = [own_cluster.client_addr(i) for i in sorted(own_cluster.client_ports) if i != victim]
    watcher = holdfast.Client([own_cluster.client_addr(victim), *others])
    writer = holdfast.Client(others, owner="writer")
    watch = watcher.watch(name)
    states = collectors(watch)
    assert states.next().initial
    before = writer.acquire(name, ttl=30, owner="before")
    held = states.next()
    assert held.holder is not None and held.holder.fence == before.fence

    own_cluster.kill(victim)
    # Changes while the watch has no stream (and the cluster elects a new leader): the resumed watch must
    # come to the lock as it is now, whether it sees each change or only the last.
    before.release()
    after = writer.acquire(name, ttl=30, owner="after")
    seen = states.until("the state after the kill", lambda s: s.holder is not None and s.holder.owner == "after", 20)
    assert watch.resumes >= 1
    assert all(s.holder is None for s in seen[:-1]), seen
    assert seen[-1].holder.fence == after.fence > before.fence

    # The resumed stream goes on: the next change comes as a change, none repeated.
    after.release()
    freed = states.next()
    assert freed.holder is None and not freed.initial
    revisions = [held.revision, *(s.revision for s in seen), freed.revision]
    assert strictly_increasing(revisions), revisions
    assert watch.revision == freed.revision


def test_a_prefix_watch_sees_every_lock_under_it_and_none_other(
    client: holdfast.Client, name: str, collectors: Callable[..., Collector]
) -> None:
    prefix = f"{name}:"
    early = client.acquire(f"{prefix}a", ttl=30)
    outside = client.acquire(f"{name}-outside", ttl=30)
    watch = collectors(client.watch(prefix, prefix=True))
    first = watch.next()
    assert first.initial and first.name == f"{prefix}a" and first.holder is not None
    assert first.holder.fence == early.fence

    with client.lock(f"{prefix}b", lease=2.0) as b:
        taken = watch.next()
        assert (taken.name, taken.initial) == (f"{prefix}b", False)
        assert taken.holder is not None and taken.holder.fence == b.fence
        outside.release()  # not under the prefix: never seen
        early.release()
        freed_a = watch.next()
        assert freed_a.name == f"{prefix}a" and freed_a.holder is None
    freed_b = watch.next()
    assert freed_b.name == f"{prefix}b" and freed_b.holder is None
    assert strictly_increasing([first.revision, taken.revision, freed_a.revision, freed_b.revision])


def test_list_pages_through_a_prefix_and_a_watch_after_its_revision_misses_nothing(
    client: holdfast.Client, name: str
) -> None:
    prefix = f"{name}:"
    holds = [client.acquire(f"{prefix}{i}", ttl=30) for i in range(5)]
    first = client.list(prefix, limit=2)
    assert [lock.name for lock in first.locks] == [f"{prefix}0", f"{prefix}1"] and first.next == f"{prefix}1"
    assert first.revision > 0
    every = list(client.locks(prefix, page_size=2))
    assert [(lock.name, lock.holder.fence if lock.holder else 0) for lock in every] == [
        (h.name, h.fence) for h in holds
    ]
    last = client.list(prefix, after=f"{prefix}3", limit=2)
    assert [lock.name for lock in last.locks] == [f"{prefix}4"] and last.next is None

    # Changed after the list was read: a watch after its revision begins with that change alone.
    holds[2].release()
    with client.watch(prefix, prefix=True, after=last.revision) as watch:
        state = next(watch)
        assert (state.name, state.holder, state.initial) == (f"{prefix}2", None, True)
    for hold in holds[:2] + holds[3:]:
        hold.release()
    assert client.list(prefix).locks == []


def test_cancel_ends_a_watch_that_waits_on_its_stream(client: holdfast.Client, name: str) -> None:
    watch = client.watch(name)
    states = Collector(watch)
    assert states.next().initial
    watch.cancel()
    states.thread.join(timeout=5)
    assert not states.thread.is_alive() and states.error is None
    assert list(watch) == []
    with client.watch(name) as scoped:
        assert next(scoped).initial
    with pytest.raises(StopIteration):
        next(scoped)


@pytest.mark.parametrize(
    "args, error",
    [
        ({"name": ""}, holdfast.InvalidArgument),
        ({"after": -1}, holdfast.InvalidArgument),
        ({"after": 1.5}, holdfast.InvalidArgument),
        ({"name": 42}, TypeError),
    ],
    ids=["no-name", "negative-after", "fractional-after", "not-a-str"],
)
def test_bad_watch_arguments_are_refused_before_anything_is_sent(args: dict, error: type) -> None:
    # A client of no node at all: anything sent would fail with Unavailable instead.
    client = holdfast.Client("127.0.0.1:1")
    with pytest.raises(error):
        client.watch(**{"name": "ok", **args})


def test_a_bad_name_is_refused_by_the_server_and_ends_the_watch(client: holdfast.Client) -> None:
    watch = client.watch("no spaces allowed")
    with pytest.raises(holdfast.InvalidArgument):
        next(watch)
    assert list(watch) == []


def test_a_watch_of_nodes_that_are_all_down_fails_with_unavailable() -> None:
    with pytest.raises(holdfast.Unavailable):
        next(holdfast.Client(["127.0.0.1:1", "127.0.0.1:2"]).watch("x"))



def event(name: str, revision: int, initial: bool, fence: int = 0) -> locks_pb2.WatchEvent:
    holder = locks_pb2.Holder(owner="o", fence=fence) if fence else None
    return locks_pb2.WatchEvent(lock=locks_pb2.Lock(name=name, revision=revision, holder=holder), initial=initial)


def answered(watch: holdfast.Watch, e: locks_pb2.WatchEvent) -> Optional[int]:
    state = watch._accept(e)
    return None if state is None else state.revision


def test_a_resumed_watch_answers_nothing_twice_and_resumes_after_the_last_revision() -> None:
    # What a stream answers, without a cluster: the rule that drops a resumed lock's unchanged first state.
    client = SimpleNamespace(_preferred=0)
    lock = holdfast.Watch(client, "l", prefix=False, after=0)  # type: ignore[arg-type]
    assert answered(lock, event("l", 5, True, fence=1)) == 5  # the first state, whatever it is
    assert answered(lock, event("l", 7, False, fence=2)) == 7
    assert answered(lock, event("l", 7, True, fence=2)) is None  # resumed: nothing changed meanwhile
    assert answered(lock, event("l", 9, True)) == 9 and lock.revision == 9  # resumed after changes
    prefix = holdfast.Watch(client, "p:", prefix=True, after=3)  # type: ignore[arg-type]
    # A prefix's watch begins with each lock changed since `after`, and resumes after the highest revision.
    assert [answered(prefix, event(n, r, True)) for n, r in [("p:a", 4), ("p:b", 6)]] == [4, 6]
    assert answered(prefix, event("p:a", 6, False)) == 6 and prefix.revision == 6
    with pytest.raises(holdfast.ProtocolError):
        prefix._accept(locks_pb2.WatchEvent(initial=True))
