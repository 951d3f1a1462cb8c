"""Elections against a real 3-node cluster: two candidates, the second leading at once when the first
resigns and one lease after the first is killed with -9; growing fences; observers and `leader()` seeing
each leader and each proclaimed value; a campaign's timeout; a leader cut off from the quorum losing
leadership (`lost`, `on_lost`) and refusing to proclaim."""

import threading
import time
from typing import Any, Callable, List, Union

import pytest
from cluster import Cluster, wait_for
from conftest import Collector, HolderProc

import holdfast
from holdfast import Leader


def campaign_in_thread(client: holdfast.Client, name: str, value: Union[bytes, str], **options: Any) -> tuple:
    """Campaigns on a thread; answers (the thread, the list its Leadership lands in)."""
    won: List[holdfast.Leadership] = []
    thread = threading.Thread(target=lambda: won.append(client.campaign(name, value, **options)), daemon=True)
    thread.start()
    return thread, won


def candidates_waiting(client: holdfast.Client, name: str) -> int:
    info = client.get(name)
    return len(info.waiters) if info else 0


def test_the_next_candidate_leads_at_once_when_the_leader_resigns(
    client: holdfast.Client, name: str, collectors: Callable[..., Collector]
) -> None:
    leaders = collectors(client.observe(name))
    assert leaders.next() is None and client.leader(name) is None

    # A long lease: only the resign can hand leadership over within the bounds below.
    first = client.campaign(name, "10.0.0.1:8080", lease=30.0, owner="first")
    assert leaders.next() == Leader(b"10.0.0.1:8080", first.fence, "first") == client.leader(name)
    thread, won = campaign_in_thread(client, name, b"10.0.0.2:8080", lease=2.0, owner="second")
    wait_for("the second candidate in the queue", lambda: candidates_waiting(client, name))

    # A candidate joining the queue is no new leader; a proclaimed value is.
    first.proclaim("10.0.0.1:9090")
    assert first.value == b"10.0.0.1:9090"
    assert leaders.next() == Leader(b"10.0.0.1:9090", first.fence, "first") == client.leader(name)

    first.resign()
    assert first.lost.is_set() and first.is_lost()
    thread.join(timeout=5)
    assert won, "the second candidate must lead as soon as the first resigns"
    second = won[0]
    assert second.fence > first.fence and not second.lost.is_set()
    assert leaders.next() == Leader(b"10.0.0.2:8080", second.fence, "second") == client.leader(name)
    with pytest.raises(holdfast.SessionLost):
        first.proclaim("10.0.0.1:1")

    with second:  # resigns at exit
        pass
    assert leaders.next() is None and client.leader(name) is None
    assert leaders.items.empty()


def test_a_leader_killed_with_sigkill_is_replaced_one_lease_later(
    cluster: Cluster, client: holdfast.Client, name: str, holders: list, collectors: Callable[..., Collector]
) -> None:
    lease = 2.0
    leaders = collectors(client.observe(name))
    assert leaders.next() is None
    first = HolderProc(name, lease, cluster.endpoints, options=["--campaign", "first-addr"])
    holders.append(first)
    first_fence, _ = first.acquired()
    assert leaders.next() == Leader(b"first-addr", first_fence, f"holder-{name}")
    thread, won = campaign_in_thread(client, name, "second-addr", lease=lease, owner="second")
    wait_for("the second candidate in the queue", lambda: candidates_waiting(client, name))

    first.kill()
    killed_at = time.monotonic()
    # The dead leader's session lives on until its lease runs out on the cluster.
    assert client.leader(name) == Leader(b"first-addr", first_fence, f"holder-{name}")
    thread.join(timeout=lease * 5)
    assert won, "the second candidate must lead once the dead leader's lease ran out"
    # Heartbeats go every lease/4: the cluster's lease ends at least 3/4 of a lease after the kill.
    assert time.monotonic() - killed_at > lease / 2
    second = won[0]
    assert second.fence > first_fence
    seen = leaders.until("the second leader", lambda leader: leader is not None, timeout=5)
    assert seen == [Leader(b"second-addr", second.fence, "second")]
    second.resign()
    assert leaders.next() is None


def test_a_campaign_that_times_out_leaves_the_queue(client: holdfast.Client, name: str) -> None:
    with client.campaign(name, "a", lease=2.0) as leadership:
        started = time.monotonic()
        with pytest.raises(holdfast.LockTimeout):
            client.campaign(name, "b", lease=2.0, timeout=0.3)
        assert time.monotonic() - started >= 0.3
        assert candidates_waiting(client, name) == 0
        assert client.leader(name) == Leader(b"a", leadership.fence, "pytest")
    assert leadership.lost.is_set() and client.leader(name) is None


@pytest.mark.parametrize(
    "args, error",
    [
        ({"value": b"v" * 1025}, holdfast.InvalidArgument),
        ({"value": 42}, TypeError),
        ({"lease": -1.0}, holdfast.InvalidArgument),
        ({"timeout": -1.0}, ValueError),
    ],
    ids=["long-value", "not-bytes", "negative-lease", "negative-timeout"],
)
def test_bad_campaign_arguments_are_refused_before_anything_is_sent(args: dict, error: type) -> None:
    client = holdfast.Client("127.0.0.1:1")  # no node: anything sent would fail with Unavailable
    with pytest.raises(error):
        client.campaign(**{"name": "e", "value": b"v", **args})



def test_leadership_lost_with_the_quorum_sets_lost_and_calls_on_lost(own_cluster: Cluster) -> None:
    lease = 2.0
    client = holdfast.Client(own_cluster.endpoints, owner="cut-away")
    called: List[holdfast.Leadership] = []
    on_lost = threading.Event()

    def lost(leadership: holdfast.Leadership) -> None:
        called.append(leadership)
        on_lost.set()

    leadership = client.campaign("cut", "me", lease=lease, on_lost=lost)
    leader = own_cluster.leader()
    # Without a quorum no heartbeat can be acknowledged: the lease must run out by the client's clock.
    for i in sorted(own_cluster.client_ports):
        if i != leader:
            own_cluster.kill(i)
    assert leadership.lost.wait(lease * 2) and on_lost.wait(5)
    assert called == [leadership] and leadership.is_lost()
    with pytest.raises(holdfast.SessionLost):
        leadership.proclaim("too late")
    with pytest.raises(holdfast.SessionLost):
        leadership.resign()
