//! The HTTP API against real 3-process clusters: mutual exclusion, fences, leases, long polls, bad input,
//! leader failure and whole-cluster restarts. Each test starts its own cluster (see `common`).

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{sample, wait_for, Cluster, Grant, Reply, ELECTION_BOUND};

/// Three nodes, as in the smallest production deployment.
const NODES: usize = 3;

/// The holder object of a `GET /v1/locks/{name}` answer, failing unless the lock is held.
fn holder(reply: &Reply, what: &str) -> Value {
    let body = reply.ok(what);
    let holder = &body["holder"];
    assert!(holder.is_object(), "{what}: lock is not held: {body}");
    holder.clone()
}

/// The owners in the `waiters` list of a `GET /v1/locks/{name}` answer (none for a 404).
fn waiter_owners(reply: &Reply) -> Result<Vec<String>, String> {
    match reply.status {
        404 => Ok(Vec::new()),
        200 => {
            let waiters =
                reply.body["waiters"].as_array().ok_or_else(|| format!("no waiters array in {}", reply.body))?;
            Ok(waiters.iter().map(|waiter| waiter["owner"].as_str().unwrap_or("?").to_string()).collect())
        }
        _ => Err(format!("GET lock answered {reply:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_parallel_acquires_over_three_nodes_grant_exactly_one() {
    let cluster = Cluster::start(NODES).await;
    let cluster = std::sync::Arc::new(cluster);
    let mut tasks = Vec::new();
    for i in 0..20 {
        let cluster = cluster.clone();
        let node = i % NODES + 1;
        tasks.push(tokio::spawn(async move {
            let owner = format!("w{i}");
            let reply = cluster.acquire(node, "contended", &owner, "60").await;
            (owner, node, reply)
        }));
    }
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.expect("acquire task"));
    }

    let granted: Vec<_> = replies.iter().filter(|(_, _, r)| r.status == 200).collect();
    let busy: Vec<_> = replies.iter().filter(|(_, _, r)| r.status == 409).collect();
    assert_eq!((granted.len(), busy.len()), (1, 19), "expected exactly one 200 and nineteen 409, got {replies:#?}");
    let (winner, _, reply) = granted[0];
    let grant = Grant::from_reply(reply, "the one grant");
    assert_eq!(&grant.owner, winner);
    assert_eq!(grant.name, "contended");
    for (owner, node, reply) in &busy {
        let what = format!("{owner} via node {node}");
        reply.assert_problem(409, "busy", &what);
        assert_eq!(
            reply.body["holder"]["owner"].as_str(),
            Some(winner.as_str()),
            "{what}: the busy answer must name the holder: {reply:#?}"
        );
        assert_eq!(
            reply.body["holder"]["fence"].as_u64(),
            Some(grant.fence),
            "{what}: the busy answer must carry the holder's fence: {reply:#?}"
        );
        assert!(reply.retry_after.is_some(), "{what}: a busy answer must have a Retry-After header: {reply:#?}");
    }
    // Read from the leader: whether a follower answers reads from its own (possibly lagging) copy is
    // not part of the contract.
    let leader = cluster.leader().await;
    let held = cluster.lock(leader, "contended").await;
    assert_eq!(holder(&held, "GET contended")["owner"].as_str(), Some(winner.as_str()));

    // Polling a held lock does not grow the log: the leader answers a busy try-lock from its state once
    // it confirmed its leadership, with no entry and no fsync.
    let log_index = |info: &Value| info["last_log_index"].as_u64().expect("last_log_index");
    let before = log_index(&cluster.cluster_info(leader).await);
    for i in 0..10 {
        let node = i % NODES + 1;
        cluster.acquire(node, "contended", "poller", "60").await.assert_problem(409, "busy", "a poll of a held lock");
    }
    let after = log_index(&cluster.cluster_info(leader).await);
    assert_eq!(before, after, "ten busy answers must not add log entries");
}

/// A follower forwards its clients' writes to a leader that reads batches in batches (`Node::write`): 200
/// one-call acquires of 200 locks sent at once through a follower are all granted, the leader holds every
/// one of them with the fence its client was told, and the follower forwarded them in fewer requests than
/// writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_a_follower_go_to_the_leader_in_batches_and_are_all_applied() {
    const WRITES: usize = 200;
    let cluster = std::sync::Arc::new(Cluster::start(NODES).await);
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    // A first write through the follower goes alone, and has it ask the leader whether it reads batches.
    let first = cluster.acquire(follower, "first", "w-first", "60").await;
    let first = Grant::from_reply(&first, "the first write through the follower").fence;
    wait_for(ELECTION_BOUND, "the leader to answer the follower's question about batches", async || {
        match cluster.metric(follower, "holdfast_forwarded_requests_total{kind=\"heartbeats\"}").await {
            Some(n) if n >= 1.0 => Ok(()),
            n => Err(format!("{n:?} batches of heartbeats forwarded")),
        }
    })
    .await;

    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..WRITES {
        let cluster = cluster.clone();
        tasks.spawn(
            async move { (i, cluster.acquire(follower, &format!("batched-{i}"), &format!("w{i}"), "60").await) },
        );
    }
    let mut fences = std::collections::BTreeMap::new();
    while let Some(done) = tasks.join_next().await {
        let (i, reply) = done.expect("an acquire task");
        let grant = Grant::from_reply(&reply, &format!("batched-{i}"));
        assert!(grant.fence > first, "batched-{i}: fence {} after the first write's {first}", grant.fence);
        fences.insert(i, grant.fence);
    }
    // Grants of locks proposed together share a log entry, and so a fence (its index).
    for (i, fence) in &fences {
        let held = cluster.lock(leader, &format!("batched-{i}")).await;
        assert_eq!(holder(&held, "GET through the leader")["fence"].as_u64(), Some(*fence), "batched-{i}");
    }
    let batches = cluster.metric(follower, "holdfast_forwarded_requests_total{kind=\"writes\"}").await.unwrap_or(0.0);
    eprintln!("{WRITES} writes through the follower in {batches} batches");
    assert!(batches > 0.0 && batches < WRITES as f64, "{WRITES} writes in {batches} batches");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_busy_answers_at_once_share_the_leaders_confirmation_rounds() {
    const READS: usize = 200;
    let cluster = std::sync::Arc::new(Cluster::start(NODES).await);
    let leader = cluster.leader().await;
    let held = Grant::from_reply(&cluster.acquire(leader, "watched", "holder", "60").await, "the held lock");
    let rounds = async || cluster.metric(leader, "holdfast_raft_leader_confirmations_total").await.unwrap_or(0.0);
    let before = rounds().await;
    // Half read the lock, half try to take it: each answer is the leader's, confirmed by a quorum round.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..READS {
        let cluster = cluster.clone();
        tasks.spawn(async move {
            if i % 2 == 0 {
                let reply = cluster.lock(leader, "watched").await;
                holder(&reply, "a read")["fence"].as_u64()
            } else {
                let reply = cluster.acquire(leader, "watched", &format!("late-{i}"), "60").await;
                reply.assert_problem(409, "busy", "a try-lock of the held lock");
                reply.body["holder"]["fence"].as_u64()
            }
        });
    }
    while let Some(fence) = tasks.join_next().await {
        assert_eq!(fence.expect("a read task"), Some(held.fence), "every answer shows the holder's fence");
    }
    let used = rounds().await - before;
    eprintln!("{READS} reads and busy answers in {used} confirmation rounds");
    assert!(used >= 1.0 && used <= (READS / 2) as f64, "{READS} answers took {used} rounds");
}

/// A follower answers reads from its own state after a barrier through the leader (`Node::read`): 200
/// `get`s of a held lock sent at once through a follower all show its holder, none is forwarded, and they
/// share fewer barriers than reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_through_a_follower_share_barriers_and_are_answered_from_its_state() {
    const READS: usize = 200;
    let cluster = std::sync::Arc::new(Cluster::start(NODES).await);
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    let held = Grant::from_reply(&cluster.acquire(leader, "watched", "holder", "60").await, "the held lock");
    let forwarded = async |kind: &str| {
        let series = format!("holdfast_forwarded_requests_total{{kind=\"{kind}\"}}");
        cluster.metric(follower, &series).await.unwrap_or(0.0)
    };
    let barriers_before = forwarded("barrier").await;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..READS {
        let cluster = cluster.clone();
        tasks.spawn(async move { holder(&cluster.lock(follower, "watched").await, "a read")["fence"].as_u64() });
    }
    while let Some(fence) = tasks.join_next().await {
        assert_eq!(fence.expect("a read task"), Some(held.fence), "every answer shows the holder's fence");
    }
    let barriers = forwarded("barrier").await - barriers_before;
    eprintln!("{READS} reads through the follower after {barriers} barriers");
    assert_eq!(forwarded("read").await, 0.0, "no read is forwarded");
    assert!(barriers >= 1.0 && barriers <= (READS / 2) as f64, "{READS} reads took {barriers} barriers");
}

/// A read through a follower shows every write acknowledged before it was sent, though the follower learns
/// of a commit after the leader (up to a few milliseconds later, with the next entries or the commit's own
/// notice): it waits until it applied what the leader had applied when its barrier was answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_through_a_follower_shows_every_write_acknowledged_before_it() {
    let cluster = Cluster::start(NODES).await;
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    for round in 0..30 {
        let grant = Grant::from_reply(&cluster.acquire(leader, "seen", "holder", "60").await, "an acquire");
        let read = cluster.lock(follower, "seen").await;
        assert_eq!(
            holder(&read, "a read after the grant")["fence"].as_u64(),
            Some(grant.fence),
            "round {round}: the follower showed {read:?} after the grant of fence {}",
            grant.fence
        );
        cluster.release(leader, "seen", &grant.token).await.ok("a release");
        let read = cluster.lock(follower, "seen").await;
        assert_eq!(read.status, 404, "round {round}: the follower showed {read:?} after the release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_keeps_a_held_lock_and_fences_keep_growing() {
    let mut cluster = Cluster::start(NODES).await;
    let leader = cluster.leader().await;
    let mut fences = Vec::new();

    // Some history before the lock under test, so that there are several fences to exceed.
    for i in 0..3 {
        let name = format!("before-{i}");
        let grant = Grant::from_reply(&cluster.acquire(i % NODES + 1, &name, "early", "60").await, &name);
        fences.push(grant.fence);
    }
    let held =
        Grant::from_reply(&cluster.acquire(leader, "survivor", "A", "60").await, "A acquires survivor via the leader");
    assert!(fences.iter().all(|&f| f < held.fence), "fences must grow: {fences:?} then {}", held.fence);
    fences.push(held.fence);

    cluster.kill(leader);
    let survivor = cluster.other_than(&[leader]);

    // The holder keeps its lock through the new leader.
    let renewed = cluster
        .until_available("A's renew via a surviving node", async || {
            cluster.renew(survivor, "survivor", &held.token, None).await
        })
        .await;
    let renewed_reply = renewed;
    let renewed = Grant::from_reply(&renewed_reply, "A renews survivor after the leader was killed");
    assert_eq!(renewed.fence, held.fence, "a renew keeps the fence");
    assert_eq!(renewed.owner, "A");
    assert_eq!(
        renewed.ttl_ms, held.ttl_ms,
        "a renew without ttl= keeps the hold's ttl: acquired {held:?}, then renewed {renewed_reply:?}"
    );
    assert!(
        renewed.expires_at_ms >= held.expires_at_ms,
        "a renew must not shorten the lease: acquired {held:?}, then renewed {renewed_reply:?}"
    );
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader, leader);

    // Others are turned away, through every surviving node.
    for id in cluster.running() {
        let reply = cluster.acquire(id, "survivor", "B", "60").await;
        reply.assert_problem(409, "busy", &format!("B acquires survivor via node {id}"));
        assert_eq!(reply.body["holder"]["fence"].as_u64(), Some(held.fence));
        assert_eq!(reply.body["holder"]["owner"].as_str(), Some("A"));
    }

    // Released through a surviving node; the next grant's fence exceeds all before it.
    let release_via = cluster.other_than(&[leader, new_leader]);
    let released = cluster.release(release_via, "survivor", &held.token).await;
    let body = released.ok("A releases survivor via a follower");
    assert_eq!(body["released"], Value::Bool(true), "{body}");
    assert_eq!(body["fence"].as_u64(), Some(held.fence), "{body}");

    let next = Grant::from_reply(
        &cluster.acquire(survivor, "survivor", "B", "60").await,
        "B acquires survivor after A released it",
    );
    let highest = fences.iter().copied().max().unwrap_or(0);
    assert!(next.fence > highest, "the next grant's fence {} must exceed every earlier fence {fences:?}", next.fence);

    // The old leader comes back as a follower and catches up on all of it.
    cluster.restart(leader).await;
    let seen = wait_for(ELECTION_BOUND, "the restarted old leader to show B as holder", async || {
        let reply = cluster.lock(leader, "survivor").await;
        match reply.body["holder"]["fence"].as_u64() {
            Some(fence) if reply.status == 200 && fence == next.fence => Ok(reply),
            _ => Err(format!("{reply:?}")),
        }
    })
    .await;
    assert_eq!(seen.body["holder"]["owner"].as_str(), Some("B"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_every_node_keeps_holders_tokens_and_fences() {
    let mut cluster = Cluster::start(NODES).await;
    let a = Grant::from_reply(&cluster.acquire(1, "kept-a", "A", "300").await, "A");
    let b = Grant::from_reply(&cluster.acquire(2, "kept-b", "B", "300").await, "B");
    let gone = Grant::from_reply(&cluster.acquire(3, "gone", "C", "300").await, "C");
    cluster.release(1, "gone", &gone.token).await.ok("C releases gone");
    let highest = a.fence.max(b.fence).max(gone.fence);

    cluster.kill_all();
    cluster.restart_all("after killing every node").await;
    cluster.leader().await;

    // Every node knows the holders as they were, with their fences and deadlines.
    for id in cluster.ids() {
        for grant in [&a, &b] {
            let reply = cluster.lock(id, &grant.name).await;
            let holder = holder(&reply, &format!("GET {} via node {id}", grant.name));
            assert_eq!(holder["owner"].as_str(), Some(grant.owner.as_str()));
            assert_eq!(holder["fence"].as_u64(), Some(grant.fence));
            let expires_at_ms = holder["expires_at_ms"].as_u64().unwrap_or(0);
            assert!(
                expires_at_ms >= grant.expires_at_ms,
                "node {id}: a restart must not shorten {}'s lease: {holder}",
                grant.name
            );
        }
        cluster.lock(id, "gone").await.assert_problem(404, "not-found", "a released lock stays released");
    }
    let busy = cluster.acquire(3, "kept-a", "D", "60").await;
    busy.assert_problem(409, "busy", "D acquires kept-a after the restart");
    assert_eq!(busy.body["holder"]["fence"].as_u64(), Some(a.fence));

    // Tokens still work: A renews, B releases.
    let renewed =
        Grant::from_reply(&cluster.renew(2, "kept-a", &a.token, None).await, "A renews kept-a after the restart");
    assert_eq!(renewed.fence, a.fence);
    let released = cluster.release(3, "kept-b", &b.token).await;
    assert_eq!(released.ok("B releases kept-b after the restart")["released"], Value::Bool(true));

    // The next grant's fence is larger than any fence handed out before the restart.
    let next = Grant::from_reply(&cluster.acquire(1, "kept-b", "E", "60").await, "E acquires kept-b");
    assert!(next.fence > highest, "fence {} after the restart must exceed {highest}", next.fence);
}

/// SIGKILL every node while acquires are in flight, so that the kill lands in the middle of appends on
/// every node's log: after the restart every acquire that was answered 200 is still held, with its fence,
/// and the holder's token still works. What the kill cut short (unanswered appends, a torn tail) may or may
/// not have taken effect, but never breaks the log: every node restarts on its files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_every_node_mid_write_loses_no_acknowledged_grant() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let mut cluster = Cluster::start(NODES).await;
    let leader = cluster.leader().await;
    let acknowledged = Arc::new(Mutex::new(Vec::<Grant>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for writer in 0..16 {
        let (http, url) = (cluster.http().clone(), cluster.client_url(leader));
        let (acknowledged, stop) = (acknowledged.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("crash-{writer}-{i}");
                i += 1;
                let request = http.post(format!("{url}/v1/locks/{name}")).query(&[("ttl", "300"), ("owner", "w")]);
                let Ok(response) = request.send().await else { continue };
                if response.status() != 200 {
                    continue;
                }
                let Ok(body) = response.json::<Value>().await else { continue };
                let reply = Reply { status: 200, content_type: None, retry_after: None, body };
                acknowledged.lock().unwrap().push(Grant::from_reply(&reply, &format!("acquire {name}")));
            }
        }));
    }
    wait_for(Duration::from_secs(30), "300 acknowledged acquires", async || {
        let n = acknowledged.lock().unwrap().len();
        if n >= 300 {
            Ok(())
        } else {
            Err(format!("{n} so far"))
        }
    })
    .await;
    // The writers keep going while every node dies.
    cluster.kill_all();
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.expect("a writer panicked");
    }
    let acknowledged = std::mem::take(&mut *acknowledged.lock().unwrap());

    cluster.restart_all("after killing every node mid-write").await;
    cluster.leader().await;
    for (i, grant) in acknowledged.iter().enumerate() {
        let id = 1 + i % NODES;
        let reply = cluster.lock(id, &grant.name).await;
        let holder = holder(&reply, &format!("GET {} via node {id} after the kill", grant.name));
        assert_eq!(holder["fence"].as_u64(), Some(grant.fence), "{}: {holder}", grant.name);
        assert_eq!(holder["owner"].as_str(), Some("w"), "{}: {holder}", grant.name);
    }
    // The holder's token still works (shown for the last one acknowledged).
    let last = acknowledged.last().expect("acquires were acknowledged");
    let renewed = Grant::from_reply(&cluster.renew(1, &last.name, &last.token, None).await, "renew after the kill");
    assert_eq!(renewed.fence, last.fence);
}

/// A follower that missed more than the leader keeps behind its snapshots catches up by installing a
/// snapshot: it purges its own log past its end and appends after the gap (a log that refused such an
/// append fails here). Killed with SIGKILL and restarted, it opens its log files and catches up again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_the_snapshots_catches_up_and_restarts_on_its_log() {
    let mut cluster = Cluster::start_with(NODES, &["--snapshot-every", "20"]).await;
    let leader = cluster.leader().await;
    let behind = cluster.other_than(&[leader]);
    cluster.kill(behind);
    // Enough entries for several snapshots; the leader keeps at most 20 entries behind the latest.
    for i in 0..120 {
        cluster.acquire(leader, &format!("snap-{i}"), "s", "300").await.ok("acquire while a follower is down");
    }
    // A leader holds its log back for a follower it last heard from less than 3 s ago (`purge.rs`,
    // FOLLOWER_GONE) and purges every 500 ms: once it has not heard from this one for 4 s, it has purged
    // what the follower misses, which now comes only in a snapshot.
    let gone = behind.to_string();
    wait_for(Duration::from_secs(20), "the leader to count the follower gone", async || {
        let info = cluster.cluster_info(leader).await;
        match info["peers"][&gone]["last_heard_ms"].as_u64() {
            Some(ms) if ms >= 4_000 => Ok(()),
            _ => Err(format!("{info}")),
        }
    })
    .await;
    let caught_up = async |cluster: &Cluster, what: &str| {
        let target = cluster.cluster_info(leader).await["last_log_index"].as_u64().unwrap_or(u64::MAX);
        wait_for(Duration::from_secs(20), what, async || {
            let info = cluster.cluster_info(behind).await;
            match info["applied_index"].as_u64() {
                Some(applied) if applied >= target => Ok(info),
                _ => Err(format!("{info}")),
            }
        })
        .await
    };
    cluster.restart(behind).await;
    let info = caught_up(&cluster, "the follower installs a snapshot and catches up").await;
    assert!(info["snapshot_index"].as_u64().is_some_and(|i| i > 20), "no snapshot installed: {info}");
    // Entries after the snapshot, appended after the gap the install left in its log.
    for i in 120..130 {
        cluster.acquire(leader, &format!("snap-{i}"), "s", "300").await.ok("acquire after the catch-up");
    }
    caught_up(&cluster, "the follower applies the entries after the snapshot").await;

    cluster.kill(behind);
    cluster.restart(behind).await;
    caught_up(&cluster, "the follower restarts on its log files and catches up").await;
    let reply = cluster.lock(behind, "snap-0").await;
    assert_eq!(holder(&reply, "snap-0 after the restart")["owner"].as_str(), Some("s"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenewed_lock_goes_to_the_next_acquirer_after_its_ttl_and_not_before() {
    let cluster = Cluster::start(NODES).await;
    let ttl = Duration::from_secs(2);
    // The instant before the acquire is sent: the lease cannot have started earlier than this.
    let sent = Instant::now();
    let a = Grant::from_reply(&cluster.acquire(1, "lapse", "A", "2s").await, "A acquires");
    assert_eq!(a.ttl_ms, 2000, "ttl=2s must mean 2000 ms");

    let mut attempts = 0u32;
    let b = wait_for(Duration::from_secs(15), "B to be granted the lapsed lock", async || {
        attempts += 1;
        let node = attempts as usize % 2 + 2;
        let reply = cluster.acquire(node, "lapse", "B", "60").await;
        match reply.status {
            200 => Ok((reply, sent.elapsed())),
            409 => {
                reply.assert_problem(409, "busy", "B's acquire while A holds");
                Err(format!("{reply:?}"))
            }
            _ => panic!("B's acquire via node {node}: unexpected {reply:#?}"),
        }
    })
    .await;
    let (reply, elapsed) = b;
    assert!(elapsed >= ttl, "B was granted {elapsed:?} after A's acquire was sent, before A's ttl of {ttl:?} ran out");
    let b = Grant::from_reply(&reply, "B acquires after A's lease ran out");
    assert!(b.fence > a.fence, "fence {} must exceed {}", b.fence, a.fence);

    // A's token is no longer any good.
    let renew = cluster.renew(1, "lapse", &a.token, None).await;
    assert!(renew.status == 409 || renew.status == 410, "A's renew after losing the lock must be refused: {renew:#?}");
    cluster.release(2, "lapse", &a.token).await.assert_problem(409, "not-holder", "A's release after losing the lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_extends_the_lease_and_refuses_wrong_or_expired_tokens() {
    let cluster = Cluster::start(NODES).await;
    let a = Grant::from_reply(&cluster.acquire(1, "renewed", "A", "60").await, "A");
    let renewed = Grant::from_reply(&cluster.renew(2, "renewed", &a.token, Some("120")).await, "A renews with ttl=120");
    assert_eq!(renewed.fence, a.fence);
    assert_eq!(renewed.ttl_ms, 120_000);
    assert!(
        renewed.expires_at_ms > a.expires_at_ms,
        "renew with a longer ttl must push the deadline out: {} then {}",
        a.expires_at_ms,
        renewed.expires_at_ms
    );

    // Another holder's token, valid in form, is refused.
    let other = Grant::from_reply(&cluster.acquire(3, "other", "B", "60").await, "B");
    cluster.renew(3, "renewed", &other.token, None).await.assert_problem(
        409,
        "not-holder",
        "renew with another lock's token",
    );
    cluster.release(1, "renewed", &other.token).await.assert_problem(
        409,
        "not-holder",
        "release with another lock's token",
    );

    // Releasing for real, then the old token is stale.
    cluster.release(3, "renewed", &a.token).await.ok("A releases");
    cluster.release(1, "renewed", &a.token).await.assert_problem(
        409,
        "not-holder",
        "a second release with the same token",
    );

    // A short lease that runs out cannot be renewed. Only reads while it runs out: a renew would extend it.
    let short = Grant::from_reply(&cluster.acquire(2, "short", "C", "500ms").await, "C");
    assert_eq!(short.ttl_ms, 500);
    wait_for(Duration::from_secs(15), "C's short lock to lapse", async || {
        let reply = cluster.lock(3, "short").await;
        if reply.status == 404 {
            Ok(())
        } else {
            Err(format!("{reply:?}"))
        }
    })
    .await;
    // The leader's Expire entry removed the hold, so the token no longer names anything: the answer says the
    // token does not hold the lock ("wrong, or its hold already ended"). 410 `expired` is only answered in the
    // moment between the advertised end and that Expire entry, which a test cannot hit on purpose.
    cluster.renew(1, "short", &short.token, None).await.assert_problem(
        409,
        "not-holder",
        "renew after the ttl ran out and the hold was removed",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_gets_the_lock_with_a_larger_fence_when_the_holder_releases() {
    let cluster = std::sync::Arc::new(Cluster::start(NODES).await);
    let a = Grant::from_reply(&cluster.acquire(1, "queued", "A", "60").await, "A");

    let waiting = {
        let cluster = cluster.clone();
        tokio::spawn(async move {
            let reply = cluster.acquire_wait(2, "queued", "B", "60", 20).await;
            (reply, Instant::now())
        })
    };
    wait_for(Duration::from_secs(10), "B to show as a waiter", async || {
        let owners = waiter_owners(&cluster.lock(3, "queued").await)?;
        if owners == ["B"] {
            Ok(())
        } else {
            Err(format!("waiters {owners:?}"))
        }
    })
    .await;

    let released_at = Instant::now();
    cluster.release(3, "queued", &a.token).await.ok("A releases");
    let (reply, answered_at) = waiting.await.expect("B's waiting task");
    let b = Grant::from_reply(&reply, "B's long poll");
    assert_eq!(b.owner, "B");
    assert!(b.fence > a.fence, "fence {} must exceed {}", b.fence, a.fence);
    let handover = answered_at.duration_since(released_at);
    assert!(
        handover < Duration::from_secs(5),
        "B was answered {handover:?} after A's release: the hand-over must not wait out anything"
    );
    let held = cluster.lock(cluster.leader().await, "queued").await;
    assert_eq!(holder(&held, "GET queued")["owner"].as_str(), Some("B"));
    assert_eq!(waiter_owners(&held), Ok(Vec::new()));

    // A waiter whose wait ends is answered busy.
    let started = Instant::now();
    let timed_out = cluster.acquire_wait(1, "queued", "C", "60", 1).await;
    timed_out.assert_problem(409, "busy", "C's wait=1s while B holds");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "C's wait=1s was answered after only {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_request_goes_away_leaves_the_queue() {
    let cluster = std::sync::Arc::new(Cluster::start(NODES).await);
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    let a = Grant::from_reply(&cluster.acquire(1, "abandoned", "A", "60").await, "A");

    // One waiter asks the leader, the other a follower (which forwards): both requests are dropped.
    let mut waiters = Vec::new();
    for (node, owner) in [(leader, "via-leader"), (follower, "via-follower")] {
        let cluster = cluster.clone();
        waiters.push(tokio::spawn(async move { cluster.acquire_wait(node, "abandoned", owner, "60", 30).await }));
    }
    wait_for(Duration::from_secs(10), "both waiters to be queued", async || {
        let mut owners = waiter_owners(&cluster.lock(1, "abandoned").await)?;
        owners.sort();
        if owners == ["via-follower", "via-leader"] {
            Ok(())
        } else {
            Err(format!("waiters {owners:?}"))
        }
    })
    .await;
    for waiter in &waiters {
        // Aborting the task drops the request and closes its connection.
        waiter.abort();
    }
    for waiter in waiters {
        match waiter.await {
            Err(e) if e.is_cancelled() => {}
            Err(e) => panic!("a waiting task failed: {e}"),
            Ok(reply) => panic!("a waiter was answered while A still held the lock: {reply:#?}"),
        }
    }

    wait_for(Duration::from_secs(10), "the queue to be empty", async || {
        let reply = cluster.lock(2, "abandoned").await;
        let owners = waiter_owners(&reply)?;
        if owners.is_empty() {
            Ok(())
        } else {
            Err(format!("waiters {owners:?}"))
        }
    })
    .await;

    // The lock is not handed to a waiter that is gone: a newcomer gets it as soon as A lets go.
    cluster.release(3, "abandoned", &a.token).await.ok("A releases");
    let c = Grant::from_reply(&cluster.acquire(2, "abandoned", "C", "60").await, "C acquires right after A released");
    assert!(c.fence > a.fence);
}

/// Queues `owner` on `name` with a long poll through node `via`, in a task whose request fails when that
/// node dies, and waits until `owner` shows in the queue.
async fn queue_waiter(
    cluster: &Cluster,
    via: usize,
    name: &str,
    owner: &str,
) -> tokio::task::JoinHandle<reqwest::Result<u16>> {
    let request = cluster
        .http()
        .post(format!("{}/v1/locks/{name}", cluster.client_url(via)))
        .query(&[("ttl", "60"), ("owner", owner), ("wait", "30s")])
        .timeout(Duration::from_secs(40));
    let task = tokio::spawn(async move { request.send().await.map(|response| response.status().as_u16()) });
    wait_for(Duration::from_secs(10), "the waiter to be queued", async || {
        let owners = waiter_owners(&cluster.lock(cluster.leader().await, name).await)?;
        if owners.iter().any(|o| o == owner) {
            Ok(())
        } else {
            Err(format!("waiters {owners:?}"))
        }
    })
    .await;
    task
}

/// Waits until `name` has no waiters, then checks that once `holder` lets go a newcomer gets the lock at
/// once: the lock must not be handed to a waiter that is gone (nobody would hold its token).
async fn assert_no_ghost_waiter(cluster: &Cluster, name: &str, holder: &Grant) {
    wait_for(Duration::from_secs(10), "the waiter whose request died to leave the queue", async || {
        let reply = cluster.lock(cluster.leader().await, name).await;
        let owners = waiter_owners(&reply)?;
        if owners.is_empty() {
            Ok(())
        } else {
            Err(format!("{reply:?}"))
        }
    })
    .await;
    let via = cluster.leader().await;
    cluster.release(via, name, &holder.token).await.ok("the holder releases");
    let next = cluster.acquire(via, name, "newcomer", "60").await;
    Grant::from_reply(&next, "a newcomer acquires right after the release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_node_is_killed_leaves_the_queue() {
    let mut cluster = Cluster::start(NODES).await;
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    let a = Grant::from_reply(&cluster.acquire(leader, "orphan", "A", "60").await, "A");
    let waiter = queue_waiter(&cluster, follower, "orphan", "B").await;

    cluster.kill(follower);
    let outcome = waiter.await.expect("the waiter's task");
    assert!(outcome.is_err(), "B's request must fail with its node: {outcome:?}");

    assert_no_ghost_waiter(&cluster, "orphan", &a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_whose_requests_died_in_a_full_restart_leave_the_queue() {
    let mut cluster = Cluster::start(NODES).await;
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    let a = Grant::from_reply(&cluster.acquire(leader, "orphans", "A", "300").await, "A");
    let via_leader = queue_waiter(&cluster, leader, "orphans", "B").await;
    let via_follower = queue_waiter(&cluster, follower, "orphans", "C").await;

    cluster.kill_all();
    cluster.restart_all("after killing every node with waiters queued").await;
    for waiter in [via_leader, via_follower] {
        let outcome = waiter.await.expect("a waiter's task");
        assert!(outcome.is_err(), "a waiter's request must fail with its node: {outcome:?}");
    }

    assert_no_ghost_waiter(&cluster, "orphans", &a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_problem_json_and_changes_nothing() {
    let cluster = Cluster::start(NODES).await;
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    let too_long = "x".repeat(201);
    let owner_129 = "o".repeat(129);
    let owner_huge = "o".repeat(16 * 1024);

    // (path with query, slug of the expected problem type)
    let posts: Vec<(String, &str)> = vec![
        (format!("/v1/locks/{too_long}?ttl=60&owner=w"), "invalid-name"),
        ("/v1/locks/bad%20name?ttl=60&owner=w".into(), "invalid-name"),
        ("/v1/locks/caf%C3%A9?ttl=60&owner=w".into(), "invalid-name"),
        ("/v1/locks/a%2Fb?ttl=60&owner=w".into(), "invalid-name"),
        ("/v1/locks/good?ttl=0&owner=w".into(), "invalid-ttl"),
        ("/v1/locks/good?ttl=abc&owner=w".into(), "invalid-ttl"),
        ("/v1/locks/good?ttl=-5&owner=w".into(), "invalid-ttl"),
        ("/v1/locks/good?ttl=100ms&owner=w".into(), "invalid-ttl"),
        ("/v1/locks/good?ttl=25h&owner=w".into(), "invalid-ttl"),
        ("/v1/locks/good?ttl=86401&owner=w".into(), "invalid-ttl"),
        (format!("/v1/locks/good?ttl=60&owner={owner_129}"), "invalid-owner"),
        (format!("/v1/locks/good?ttl=60&owner={owner_huge}"), "invalid-owner"),
        ("/v1/locks/good?ttl=60&owner=w&wait=6m".into(), "invalid-wait"),
        ("/v1/locks/good?ttl=60&owner=w&wait=soon".into(), "invalid-wait"),
    ];
    for node in [leader, follower] {
        for (path, slug) in &posts {
            let reply = cluster.post(node, path).await;
            let what = format!("POST {} via node {node}", &path[..path.len().min(80)]);
            reply.assert_problem(400, slug, &what);
        }
        for path in ["/v1/locks/good?token=%21%21not-a-token%21%21", "/v1/locks/good?token="] {
            let what = format!("DELETE {path} via node {node}");
            cluster.delete(node, path).await.assert_problem(400, "invalid-token", &what);
        }
        let path = "/v1/locks/good/renew?token=%21%21not-a-token%21%21";
        cluster.post(node, path).await.assert_problem(400, "invalid-token", &format!("POST {path} via node {node}"));
        let path = "/v1/locks/bad%20name";
        cluster.get(node, path).await.assert_problem(400, "invalid-name", &format!("GET {path} via node {node}"));
    }

    // Nothing was created, on any node.
    for id in cluster.ids() {
        let list = cluster.get(id, "/v1/locks").await;
        let body = list.ok("GET /v1/locks");
        assert_eq!(body["locks"], Value::Array(Vec::new()), "node {id}: {body}");
        cluster.lock(id, "good").await.assert_problem(404, "not-found", "GET a lock no valid request made");
    }
    // And the lock that bad requests named can still be taken normally.
    Grant::from_reply(&cluster.acquire(follower, "good", "w", "60").await, "a valid acquire");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_answers_and_all_agree_on_the_leader() {
    let cluster = Cluster::start(NODES).await;
    let leader = cluster.leader().await;

    for id in cluster.ids() {
        let live = cluster.get(id, "/livez").await;
        assert_eq!(live.status, 200, "node {id} /livez: {live:?}");
        let info = cluster.cluster_info(id).await;
        assert_eq!(info["id"].as_u64(), Some(id as u64), "node {id}: {info}");
        assert_eq!(info["leader"].as_u64(), Some(leader as u64), "node {id}: {info}");
        let state = if id == leader { "Leader" } else { "Follower" };
        assert_eq!(info["state"].as_str(), Some(state), "node {id}: {info}");
        assert!(info["term"].as_u64().is_some_and(|term| term >= 1), "node {id}: {info}");
        let members =
            info["members"].as_object().unwrap_or_else(|| panic!("node {id}: members is not an object: {info}"));
        assert_eq!(members.len(), NODES, "node {id}: {info}");
        for member in cluster.ids() {
            assert_eq!(
                members.get(&member.to_string()).and_then(Value::as_str),
                Some(cluster.peer_addr(member).to_string().as_str()),
                "node {id}: member {member}: {info}"
            );
        }
    }

    // Acquire through one follower, see it from the other, release through the leader.
    let followers: Vec<usize> = cluster.ids().filter(|&id| id != leader).collect();
    let grant =
        Grant::from_reply(&cluster.acquire(followers[0], "anywhere", "F", "60").await, "acquire via a follower");
    let seen = wait_for(Duration::from_secs(10), "the other follower to show the grant", async || {
        let reply = cluster.lock(followers[1], "anywhere").await;
        if reply.status == 200 {
            Ok(reply)
        } else {
            Err(format!("{reply:?}"))
        }
    })
    .await;
    let seen_holder = holder(&seen, "GET via the other follower");
    assert_eq!(seen_holder["owner"].as_str(), Some("F"));
    assert_eq!(seen_holder["fence"].as_u64(), Some(grant.fence));
    assert!(seen_holder["granted_at"].is_string(), "{seen_holder}");
    cluster.release(leader, "anywhere", &grant.token).await.ok("release via the leader");
    cluster.lock(leader, "anywhere").await.assert_problem(404, "not-found", "GET after release");

    // Checked last, so that a missing field does not hide the behaviour above.
    for id in cluster.ids() {
        let info = cluster.cluster_info(id).await;
        for key in ["last_log_index", "committed_index", "applied_index"] {
            assert!(info[key].as_u64().is_some(), "node {id}: {key} missing: {info}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_pages_through_locks_by_prefix() {
    let cluster = Cluster::start(NODES).await;
    for name in ["job:a1", "job:a2", "job:a3", "other"] {
        Grant::from_reply(&cluster.acquire(2, name, "L", "60").await, name);
    }
    let names = |reply: &Reply| -> Vec<String> {
        reply.ok("GET /v1/locks")["locks"]
            .as_array()
            .unwrap_or_else(|| panic!("no locks array: {reply:?}"))
            .iter()
            .map(|lock| lock["name"].as_str().unwrap_or("?").to_string())
            .collect()
    };

    // Reads go to the leader, which has applied every acknowledged write.
    let leader = cluster.leader().await;
    let all = cluster.get(leader, "/v1/locks").await;
    assert_eq!(names(&all), ["job:a1", "job:a2", "job:a3", "other"]);
    assert_eq!(all.body["next"], Value::Null);
    assert_eq!(all.body["locks"][0]["holder"]["owner"].as_str(), Some("L"));

    let page1 = cluster.get(leader, "/v1/locks?prefix=job:&limit=2").await;
    assert_eq!(names(&page1), ["job:a1", "job:a2"]);
    let next = page1.body["next"]
        .as_str()
        .unwrap_or_else(|| panic!("a full page must say where to go on: {page1:?}"))
        .to_string();
    let page2 = cluster.get(leader, &format!("/v1/locks?prefix=job:&limit=2&after={next}")).await;
    assert_eq!(names(&page2), ["job:a3"]);
    assert_eq!(page2.body["next"], Value::Null, "{page2:?}");
}

/// Under load the leader proposes one-lock commands that queued up together as one entry: grants of
/// different locks may then share a fence (the entry's index), while every lock still gets exactly what a
/// lone command would. Bursts of parallel acquires of distinct locks, and of parallel acquires, releases
/// and re-acquires of one lock, until a burst has been batched (bounded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_writes_share_log_entries_and_each_gets_its_own_answer() {
    const LOCKS: usize = 64;
    const BURSTS: usize = 5;
    let cluster = std::sync::Arc::new(Cluster::start(NODES).await);
    let leader = cluster.leader().await;
    let mut batched = false;
    for burst in 0..BURSTS {
        let acquires = (0..LOCKS).map(|i| {
            let cluster = cluster.clone();
            tokio::spawn(async move {
                let name = format!("batch-{burst}-{i}");
                let reply = cluster.acquire(leader, &name, &format!("w{i}"), "60").await;
                (name, Grant::from_reply(&reply, "acquire of a free lock"))
            })
        });
        let mut grants = Vec::new();
        for task in acquires.collect::<Vec<_>>() {
            grants.push(task.await.expect("acquire task"));
        }
        for (name, grant) in &grants {
            assert_eq!((&grant.name, grant.ttl_ms), (name, 60_000), "{grant:?}");
        }
        let mut fences: Vec<u64> = grants.iter().map(|(_, g)| g.fence).collect();
        fences.sort_unstable();
        fences.dedup();
        batched |= fences.len() < LOCKS;

        // Every token releases its own lock, and only its own: a release with another lock's token is
        // refused even when both travel in one entry.
        let releases = grants.iter().enumerate().map(|(i, (name, grant))| {
            let (cluster, name) = (cluster.clone(), name.clone());
            let (own, other) = (grant.token.clone(), grants[(i + 1) % LOCKS].1.token.clone());
            tokio::spawn(async move {
                let wrong = cluster.release(leader, &name, &other).await;
                let right = cluster.release(leader, &name, &own).await;
                (name, wrong, right)
            })
        });
        for task in releases.collect::<Vec<_>>() {
            let (name, wrong, right) = task.await.expect("release task");
            wrong.assert_problem(409, "not-holder", &format!("release of {name} with another lock's token"));
            right.ok(&format!("release of {name} with its token"));
            assert_eq!(cluster.lock(leader, &name).await.status, 404, "{name} was released");
        }
        if batched {
            break;
        }
    }
    assert!(batched, "{BURSTS} bursts of {LOCKS} parallel acquires never shared an entry");
    // The leader's histogram of commands per entry saw it too: more commands than entries.
    let page = cluster.metrics(leader).await;
    let value = |series: &str| sample(&page, series).unwrap_or_else(|| panic!("{series} missing from:\n{page}"));
    let (commands, entries) = (value("holdfast_raft_entry_commands_sum"), value("holdfast_raft_entry_commands_count"));
    assert!(commands > entries, "{commands} commands in {entries} entries: none batched");
}

/// A crowd's hand-over is one entry: an acquire that will queue (its lock is held) waits in the leader's
/// proposer for a command on its lock, and goes after the holder's release in the same entry (a
/// `Command::Group`). With a long `--queue-hold`, the test sees the acquire held back (a gauge) before it
/// releases the lock, so the two must share an entry; the release, not the hold's end, lets it go; the
/// waiter gets the lock under a fence above the released one; a try-lock is never held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_and_the_acquire_held_back_for_it_share_an_entry() {
    let cluster = std::sync::Arc::new(Cluster::start_with(NODES, &["--queue-hold", "10s"]).await);
    let leader = cluster.leader().await;
    let metric = async |series: &str| {
        let page = cluster.metrics(leader).await;
        sample(&page, series).unwrap_or_else(|| panic!("{series} missing from:\n{page}"))
    };
    let held = Grant::from_reply(&cluster.acquire(leader, "crowd", "first", "60").await, "acquire of a free lock");
    let busy = cluster.acquire(leader, "crowd", "impatient", "60").await;
    busy.assert_problem(409, "busy", "a try-lock of the held lock, answered at once");
    let entries_before = metric("holdfast_raft_entry_commands_count").await;
    let commands_before = metric("holdfast_raft_entry_commands_sum").await;
    let waiter = tokio::spawn({
        let cluster = cluster.clone();
        async move { cluster.acquire_wait(leader, "crowd", "second", "60", 10).await }
    });
    wait_for(Duration::from_secs(5), "the waiting acquire to be held back", async || {
        match metric("holdfast_raft_held_back_acquires").await {
            1.0 => Ok(()),
            seen => Err(format!("{seen} held back")),
        }
    })
    .await;
    cluster.release(leader, "crowd", &held.token).await.ok("release of the held lock");
    let next = Grant::from_reply(&waiter.await.expect("waiter task"), "the waiter's acquire");
    assert_eq!(next.owner, "second", "{next:?}");
    assert!(next.fence > held.fence, "{next:?} after {held:?}");
    let entries = metric("holdfast_raft_entry_commands_count").await - entries_before;
    let commands = metric("holdfast_raft_entry_commands_sum").await - commands_before;
    // One entry: the release let the acquire go (at the hold's end it would have gone alone).
    assert_eq!((entries, commands), (1.0, 2.0), "the release and the acquire in one entry");
    assert_eq!(metric("holdfast_raft_held_back_acquires").await, 0.0);
    cluster.release(leader, "crowd", &next.token).await.ok("the waiter's release");
}
