"""Sessions when nodes die: resuming through another node, and `lost` when the cluster is cut away. Each
test has a cluster of its own."""

import threading
from typing import List

import pytest
from cluster import Cluster

import holdfast


@pytest.mark.parametrize("role", ["follower", "leader"])
def test_a_session_resumes_on_another_node_when_its_node_is_killed(own_cluster: Cluster, role: str) -> None:
    # 3 s: more than failover (about 0.8 s) times 4/3, as docs/grpc-api.md "Choosing a lease" asks.
    lease = 3.0
    leader = own_cluster.leader()
    victim = leader if role == "leader" else next(i for i in sorted(own_cluster.client_ports) if i != leader)
    others = [own_cluster.client_addr(i) for i in sorted(own_cluster.client_ports) if i != victim]
    # The session's stream runs through the victim, the first endpoint.
    client = holdfast.Client([own_cluster.client_addr(victim), *others], owner="resumer")
    lost_calls: List[str] = []
    lock = client.lock("resume-me", lease=lease, on_lost=lambda held: lost_calls.append(held.name))
    assert lock.acquire()
    fence, session_id = lock.fence, lock.session_id
    own_cluster.kill(victim)
    # Longer than the lease: the session lives only if heartbeats reached the cluster through another node.
    assert not lock.lost.wait(lease * 2)
    reader = holdfast.Client(others)
    info = reader.get("resume-me")
    assert info is not None and info.holder is not None
    assert (info.holder.fence, info.holder.session_id) == (fence, session_id)
    # A release through the resumed stream hands the lock over at once.
    waiting = reader.lock("resume-me", lease=lease)
    got: List[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiting.acquire()))
    thread.start()
    lock.release()
    thread.join(timeout=10)
    assert got == [True] and waiting.fence > fence
    waiting.release()
    assert lost_calls == []


def test_lost_is_set_when_the_cluster_is_cut_away(own_cluster: Cluster) -> None:
    lease = 2.0
    client = holdfast.Client(own_cluster.endpoints, owner="cut-away")
    lost = threading.Event()
    lock = client.lock("cut", lease=lease, on_lost=lambda held: lost.set())
    assert lock.acquire()
    leader = own_cluster.leader()
    # Without a quorum no heartbeat can be acknowledged: the lease must run out by the client's clock.
    for i in sorted(own_cluster.client_ports):
        if i != leader:
            own_cluster.kill(i)
    assert lock.lost.wait(lease * 2), "lost must be set within about a lease of the last acknowledged heartbeat"
    assert lost.wait(5), "on_lost must be called"
    assert not lock.locked()
