//! Lock-delay against real 3-process clusters: a one-shot hold that expires with a lock-delay is granted
//! to its waiter no earlier than the delay's end (leader time), through any node and across a leader kill;
//! a released one is handed over at once; a `holdfast run` killed with -9 leaves the delay its session asked
//! for; a delay past the node's bound is refused and changes nothing. Each test starts its own cluster (see
//! `common`); every wait is bounded, and no assertion depends on how long anything took.

use std::time::Duration;

use serde_json::Value;

use crate::common::{wait_for, ClientProc, Cluster, Grant, Reply};

/// Three nodes, as in the smallest production deployment.
const NODES: usize = 3;
/// How long a queued acquire's request may take: its longest wait and a margin.
const REPLY_BOUND: Duration = Duration::from_secs(90);

/// The `free_at_ms` of the holder a read of `name` shows, once the lock is in its lock-delay.
async fn in_delay(cluster: &Cluster, node: usize, name: &str) -> Value {
    wait_for(Duration::from_secs(30), "the lock in its lock-delay", async || {
        let read = cluster.lock(node, name).await;
        match read.body["holder"].get("free_at_ms") {
            Some(_) => Ok(read.body["holder"].clone()),
            None => Err(format!("not in its delay yet: {read:#?}")),
        }
    })
    .await
}

/// The reply to a request sent from a task of its own (the cluster stays with the test, which kills
/// nodes meanwhile).
async fn reply_of(task: tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>, what: &str) -> Reply {
    let response = task.await.expect("the request's task").unwrap_or_else(|e| panic!("{what}: {e}"));
    let status = response.status().as_u16();
    let body = response.json().await.unwrap_or_else(|e| panic!("{what}: not JSON: {e}"));
    Reply { status, content_type: None, retry_after: None, body }
}

/// An acquire of `name` through `node` that queues up to `wait` for the lock, sent from a task of its own.
fn queue(
    cluster: &Cluster,
    node: usize,
    name: &str,
    wait: &str,
) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
    let url = format!("{}/v1/locks/{name}", cluster.client_url(node));
    let request = cluster.http().post(&url).query(&[("ttl", "30s"), ("owner", "next"), ("wait", wait)]);
    tokio::spawn(request.timeout(REPLY_BOUND).send())
}

/// When a grant was made (leader time): its advertised end less its TTL.
fn granted_at_ms(grant: &Grant) -> u64 {
    grant.expires_at_ms - grant.ttl_ms
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_hold_with_a_lock_delay_goes_to_its_waiter_only_after_the_delay_even_across_a_leader_kill() {
    let mut cluster = Cluster::start(NODES).await;
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    let other = cluster.other_than(&[leader, follower]);

    // A delay past the node's bound (60 s by default) is refused and takes nothing.
    let refused = cluster.post(follower, "/v1/locks/job?ttl=5s&owner=greedy&lock_delay=2h").await;
    refused.assert_problem(400, "invalid-lock-delay", "a lock-delay of 2 h");
    cluster.lock(leader, "job").await.assert_problem(404, "not-found", "the lock after the refusal");

    // Held through a follower for 1 s, with a 4 s lock-delay, and never renewed (a paused holder).
    let taken = cluster.post(follower, "/v1/locks/job?ttl=1s&owner=paused&value=10.0.0.1&lock_delay=4s").await;
    let first = Grant::from_reply(&taken, "the acquire with a lock-delay");
    // Another node's client waits in the queue.
    let waiting = queue(&cluster, other, "job", "60s");

    // The hold expires: nobody holds the lock, and reads say since when it is free again.
    let holder = in_delay(&cluster, follower, "job").await;
    let free_at_ms = holder["free_at_ms"].as_u64().expect("free_at_ms");
    assert!(free_at_ms >= first.expires_at_ms + 4_000, "the delay runs from the expiry: {holder:#}");
    assert_eq!(holder["fence"].as_u64(), Some(first.fence), "the expired hold is shown: {holder:#}");
    assert_eq!(holder["value"], "", "the expired holder publishes nothing: {holder:#}");
    assert!(holder.get("expires_at").is_none(), "no live lease is shown: {holder:#}");
    // A try-lock is told who held it and when it is free; the expired holder's token lets go of nothing.
    let busy = cluster.post(leader, "/v1/locks/job?ttl=5s&owner=eager").await;
    busy.assert_problem(409, "busy", "a try-lock during the delay");
    assert_eq!(busy.body["holder"]["free_at_ms"].as_u64(), Some(free_at_ms), "{busy:#?}");
    cluster.release(other, "job", &first.token).await.assert_problem(409, "not-holder", "a release by the expired");

    // The leader dies during the delay (or just after it, which must not matter either).
    cluster.kill(leader);
    let next = Grant::from_reply(&reply_of(waiting, "the waiter").await, "the waiter's grant");
    assert_eq!(next.owner, "next");
    assert!(next.fence > first.fence, "fences grow: {} then {}", first.fence, next.fence);
    assert!(
        granted_at_ms(&next) >= free_at_ms,
        "granted at {} ms, before the lock-delay ended at {free_at_ms} ms",
        granted_at_ms(&next)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_hold_with_a_lock_delay_is_handed_over_at_once() {
    let cluster = Cluster::start(NODES).await;
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);

    let taken = cluster.post(leader, "/v1/locks/job?ttl=60s&owner=first&lock_delay=60s").await;
    let first = Grant::from_reply(&taken, "the acquire with a lock-delay");
    // A wait shorter than the delay: a grant within it is one the delay did not hold back.
    let waiting = queue(&cluster, follower, "job", "30s");
    wait_for(Duration::from_secs(20), "the waiter in the queue", async || {
        let read = cluster.lock(leader, "job").await;
        match read.body["waiters"].as_array().map(Vec::len) {
            Some(1) => Ok(()),
            _ => Err(format!("{read:#?}")),
        }
    })
    .await;
    cluster.release(leader, "job", &first.token).await.ok("the release");
    let next = Grant::from_reply(&reply_of(waiting, "the waiter").await, "the waiter's grant");
    assert_eq!((next.owner.as_str(), next.fence > first.fence), ("next", true));
    let read = cluster.lock(follower, "job").await;
    assert!(read.ok("read")["holder"].get("free_at").is_none(), "{read:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holdfast_run_killed_with_9_leaves_the_lock_delay_its_session_asked_for() {
    let cluster = Cluster::start(NODES).await;
    let work = tempfile::tempdir().expect("a work directory");
    let endpoints = cluster.endpoints();
    let args = ["--ttl", "1s", "--lock-delay", "3s", "--endpoints", &endpoints, "job"];
    let mut holder = ClientProc::run(work.path(), "holder", &args, "echo $HOLDFAST_FENCE > fence; sleep 600");
    let fence: u64 = crate::common::wait_for_file(&work.path().join("fence"), Duration::from_secs(30), "the fence")
        .await
        .trim()
        .parse()
        .expect("a fence");

    // The process and its session go silent: the session's lease runs out, and with it comes the delay.
    holder.kill();
    let leader = cluster.leader().await;
    let shown = in_delay(&cluster, leader, "job").await;
    assert_eq!(shown["fence"].as_u64(), Some(fence), "{shown:#}");
    let free_at_ms = shown["free_at_ms"].as_u64().expect("free_at_ms");

    let next = cluster.acquire_wait(cluster.other_than(&[leader]), "job", "next", "30s", 30).await;
    let next = Grant::from_reply(&next, "the next acquire");
    assert!(next.fence > fence);
    assert!(granted_at_ms(&next) >= free_at_ms, "granted at {} ms, free at {free_at_ms} ms", granted_at_ms(&next));
}
