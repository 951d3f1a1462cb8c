//! Semaphores against real 3-process clusters: up to `limit` holders of one name at once through any node,
//! each with its own token and fence, the others queued in order and handed a freed place across a leader
//! kill; another limit than the name's is refused and changes nothing; `holdfast run --limit N` runs at
//! most N commands at once. Each test starts its own cluster (see `common`); every wait is bounded, and no
//! assertion depends on how long anything took.

use std::time::Duration;

use serde_json::Value;

use crate::common::{sh_wait_for_file, sh_write_file, wait_for, ClientProc, Cluster, Grant, Reply};

/// Three nodes, as in the smallest production deployment.
const NODES: usize = 3;
/// How long a queued acquire's request may take: its longest wait and a margin.
const REPLY_BOUND: Duration = Duration::from_secs(90);

/// A read of `name` through `node` once it shows `holders` holders and `waiters` waiters.
async fn shows(cluster: &Cluster, node: usize, name: &str, holders: usize, waiters: usize) -> Value {
    let what = format!("{name} with {holders} holders and {waiters} waiters");
    wait_for(Duration::from_secs(30), &what, async || {
        let read = cluster.lock(node, name).await;
        let count = |key: &str| read.body[key].as_array().map(Vec::len);
        match (count("holders"), count("waiters")) {
            (Some(h), Some(w)) if (h, w) == (holders, waiters) => Ok(read.body.clone()),
            _ => Err(format!("{read:#?}")),
        }
    })
    .await
}

/// The fences of a read's holders, in the order shown.
fn fences(read: &Value) -> Vec<u64> {
    let holders = read["holders"].as_array().expect("holders");
    holders.iter().map(|h| h["fence"].as_u64().expect("a fence")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_admits_its_limit_through_any_node_and_hands_a_freed_place_to_its_waiter_across_a_leader_kill() {
    let mut cluster = Cluster::start(NODES).await;
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    let other = cluster.other_than(&[leader, follower]);

    // Limits outside 1..=1024 are refused and take nothing.
    for limit in ["0", "1025", "two"] {
        let refused = cluster.post(follower, &format!("/v1/locks/pool?ttl=30s&limit={limit}")).await;
        refused.assert_problem(400, "invalid-limit", &format!("limit={limit}"));
    }
    cluster.lock(leader, "pool").await.assert_problem(404, "not-found", "the semaphore after the refusals");

    // Three places, taken through each node.
    let mut grants = Vec::new();
    for (node, owner) in [(follower, "a"), (other, "b"), (leader, "c")] {
        let taken = cluster.post(node, &format!("/v1/locks/pool?ttl=60s&owner={owner}&limit=3")).await;
        grants.push(Grant::from_reply(&taken, "a place"));
    }
    let taken: Vec<u64> = grants.iter().map(|g| g.fence).collect();
    assert!(taken.windows(2).all(|w| w[0] < w[1]), "each place its own fence, growing: {taken:?}");
    let read = shows(&cluster, other, "pool", 3, 0).await;
    assert_eq!((fences(&read), read["limit"].as_u64()), (taken.clone(), Some(3)), "{read:#}");
    assert_eq!(read["holder"]["fence"].as_u64(), Some(taken[0]), "holder is the longest-held place: {read:#}");

    // Full: a try-lock is busy; another limit (or none, which is 1) is refused; neither changes anything.
    let busy = cluster.post(follower, "/v1/locks/pool?ttl=60s&owner=d&limit=3").await;
    busy.assert_problem(409, "busy", "a try-lock of the full semaphore");
    for path in ["/v1/locks/pool?ttl=60s&owner=d&limit=2&wait=30s", "/v1/locks/pool?ttl=60s&owner=d&wait=30s"] {
        cluster.post(other, path).await.assert_problem(409, "limit-mismatch", path);
    }
    shows(&cluster, leader, "pool", 3, 0).await;

    // A waiter queues through a follower; the leader dies; a place is released: the waiter takes it.
    let url = format!("{}/v1/locks/pool", cluster.client_url(other));
    let query = [("ttl", "60s"), ("owner", "next"), ("wait", "60s"), ("limit", "3")];
    let waiting = tokio::spawn(cluster.http().post(&url).query(&query).timeout(REPLY_BOUND).send());
    shows(&cluster, follower, "pool", 3, 1).await;
    cluster.kill(leader);
    let release = async || cluster.release(follower, "pool", &grants[1].token).await;
    cluster.until_available("the release", release).await.ok("the release of the middle place");
    let response = waiting.await.expect("the waiter's task").expect("the waiter's answer");
    let status = response.status().as_u16();
    let body = response.json().await.expect("JSON");
    let next = Grant::from_reply(&Reply { status, content_type: None, retry_after: None, body }, "the waiter's grant");
    assert_eq!(next.owner, "next");
    assert!(next.fence > taken[2], "a freed place is granted under a new fence: {} after {taken:?}", next.fence);
    let read = shows(&cluster, follower, "pool", 3, 0).await;
    assert_eq!(fences(&read), [taken[0], taken[2], next.fence], "{read:#}");

    // The killed node comes back with the same semaphore.
    cluster.restart(leader).await;
    let read = shows(&cluster, leader, "pool", 3, 0).await;
    assert_eq!(fences(&read), [taken[0], taken[2], next.fence], "{read:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holdfast_run_with_a_limit_runs_at_most_that_many_commands_at_once() {
    let cluster = Cluster::start(NODES).await;
    let work = tempfile::tempdir().expect("a work directory");
    let endpoints = cluster.endpoints();
    // Each command writes its fence, then waits for the test to let it finish.
    let script = |label: &str| {
        format!("{}; {}", sh_write_file(&format!("{label}.fence"), "$HOLDFAST_FENCE"), sh_wait_for_file("go"))
    };
    let args = ["--limit", "2", "--ttl", "5s", "--endpoints", &endpoints, "pool"];
    let mut runs: Vec<ClientProc> =
        ["r1", "r2", "r3"].iter().map(|label| ClientProc::run(work.path(), label, &args, &script(label))).collect();

    // Two hold places and run; the third waits in the queue, its command not started.
    let fence_of = |label: &str| -> Option<u64> {
        let text = std::fs::read_to_string(work.path().join(format!("{label}.fence"))).ok()?;
        Some(text.trim().parse().expect("a fence"))
    };
    let mut started: Vec<u64> = wait_for(Duration::from_secs(60), "two commands running", async || {
        let started: Vec<u64> = ["r1", "r2", "r3"].into_iter().filter_map(fence_of).collect();
        match started.len() {
            2 => Ok(started),
            n => Err(format!("{n} commands running")),
        }
    })
    .await;
    // Nobody lets go before the go file: a read showing a waiter now shows one that never ran.
    let leader = cluster.leader().await;
    let read = shows(&cluster, leader, "pool", 2, 1).await;
    started.sort_unstable();
    assert_eq!(started, fences(&read), "the commands that started are the holders: {read:#}");
    assert_eq!(read["limit"].as_u64(), Some(2));

    // Let them finish: the third takes a freed place and runs.
    std::fs::write(work.path().join("go"), "").expect("the go file");
    for run in &mut runs {
        assert_eq!(
            run.exit_code(Duration::from_secs(60), run.label().to_owned().as_str()).await,
            0,
            "{}",
            run.output()
        );
    }
    let fences: Vec<u64> = ["r1", "r2", "r3"].into_iter().map(|l| fence_of(l).expect("every command ran")).collect();
    let last = fences.iter().copied().max().expect("three");
    assert!(started.iter().all(|f| *f < last), "the third ran after a place was freed: {fences:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_on_different_nodes_share_a_semaphore_and_a_closed_session_hands_its_place_over() {
    use holdfast_client::{AcquireOptions, Client, Error};
    let cluster = Cluster::start(NODES).await;
    let client = |node: usize| Client::builder([cluster.client_addr(node).to_string()]).build().expect("a client");
    let places = |limit: u32| AcquireOptions { limit, ..AcquireOptions::default() };
    let mut sessions = Vec::new();
    for node in cluster.ids() {
        sessions.push(client(node).session(Duration::from_secs(5)).await.expect("a session"));
    }
    let first = sessions[0].lock_with("pool", None, places(2)).await.expect("the first place");
    let second = sessions[1].lock_with("pool", None, places(2)).await.expect("the second place");
    assert!(first.fence() < second.fence(), "{} then {}", first.fence(), second.fence());
    // Full: a try-lock is busy, another limit is refused, the third session queues.
    let busy = sessions[2].lock_with("pool", Some(Duration::ZERO), places(2)).await;
    assert!(matches!(busy, Err(Error::Busy { .. })), "{busy:?}");
    let one_shot = client(1).acquire_with("pool", Duration::from_secs(5), Duration::ZERO, places(3)).await;
    assert!(matches!(one_shot, Err(Error::LimitMismatch(_))), "{one_shot:?}");
    let waiting = {
        let third = sessions[2].clone();
        tokio::spawn(
            async move { third.lock_with("pool", None, AcquireOptions { limit: 2, ..Default::default() }).await },
        )
    };
    let leader = cluster.leader().await;
    shows(&cluster, leader, "pool", 2, 1).await;

    sessions[0].clone().close().await.expect("the close");
    let third = waiting.await.expect("the waiting task").expect("the third session's place");
    assert!(third.fence() > second.fence());
    let read = shows(&cluster, leader, "pool", 2, 0).await;
    assert_eq!(fences(&read), [second.fence(), third.fence()], "{read:#}");
    let info = client(leader).get("pool").await.expect("a read through the client").expect("held");
    let shown: Vec<u64> = info.holders.iter().map(|h| h.fence).collect();
    assert_eq!((shown, info.limit), (vec![second.fence(), third.fence()], 2));
}
