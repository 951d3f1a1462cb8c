//! Membership changes on real clusters: growing 3 → 5 → 3 while a lock is held and a client keeps
//! acquiring, replacing a node whose disk was lost under a new id, and the admin key that guards both.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::common::{wait_for, Cluster, Grant, Reply, READY_BOUND};

const ADMIN_KEY: &str = "test-admin-key-0123456789";

fn voters(body: &Value) -> BTreeSet<u64> {
    body["voters"].as_array().map(|v| v.iter().filter_map(Value::as_u64).collect()).unwrap_or_default()
}

async fn add(cluster: &Cluster, via: usize, id: usize, key: Option<&str>) -> Reply {
    let url = format!("{}/v1/cluster/members?id={id}&addr={}", cluster.client_url(via), cluster.peer_addr(id));
    let mut request = cluster.http().post(url).timeout(Duration::from_secs(70));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    cluster.send(request, &format!("add node {id}")).await
}

async fn remove(cluster: &Cluster, via: usize, id: usize, key: Option<&str>) -> Reply {
    let url = format!("{}/v1/cluster/members/{id}", cluster.client_url(via));
    let mut request = cluster.http().delete(url).timeout(Duration::from_secs(70));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    cluster.send(request, &format!("remove node {id}")).await
}

/// Waits until node `id` says the voters are `expected`.
async fn wait_voters(cluster: &Cluster, id: usize, expected: &[u64]) {
    let expected: BTreeSet<u64> = expected.iter().copied().collect();
    wait_for(READY_BOUND, &format!("node {id} to see voters {expected:?}"), async || {
        let reply = cluster.try_get(id, "/v1/cluster").await.map_err(|e| e.to_string())?;
        match voters(&reply.body) == expected {
            true => Ok(()),
            false => Err(format!("{}", reply.body)),
        }
    })
    .await;
}

/// A client that acquires and releases one lock in a loop through whichever of `endpoints` answers, and
/// records the fence of every acknowledged grant.
struct Load {
    stop: Arc<AtomicBool>,
    endpoints: Arc<Mutex<Vec<String>>>,
    fences: Arc<Mutex<Vec<u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    fn start(cluster: &Cluster, ids: &[usize]) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let endpoints = Arc::new(Mutex::new(ids.iter().map(|id| cluster.client_url(*id)).collect::<Vec<_>>()));
        let http = cluster.http().clone();
        let fences = Arc::new(Mutex::new(Vec::new()));
        let (task_stop, task_endpoints, task_fences) = (stop.clone(), endpoints.clone(), fences.clone());
        let task = tokio::spawn(async move {
            let mut turn = 0usize;
            while !task_stop.load(Ordering::Relaxed) {
                turn += 1;
                let base = {
                    let endpoints = task_endpoints.lock().unwrap();
                    endpoints[turn % endpoints.len()].clone()
                };
                let acquired = http.post(format!("{base}/v1/locks/load?ttl=10s&owner=load&wait=5s")).send().await;
                let Ok(response) = acquired else { continue };
                if response.status() != 200 {
                    // 503 while the leader changes: nothing was granted, or the grant's fate is unknown and
                    // its TTL frees the lock; the load goes on either way.
                    continue;
                }
                let body: Value = response.json().await.unwrap();
                task_fences.lock().unwrap().push(body["fence"].as_u64().unwrap());
                let token = body["token"].as_str().unwrap().to_owned();
                let _ = http.delete(format!("{base}/v1/locks/load?token={token}")).send().await;
            }
        });
        Load { stop, endpoints, fences, task }
    }

    /// Waits until the load was granted `more` times after now.
    async fn progress(&self, more: usize, what: &str) {
        let start = self.fences.lock().unwrap().len();
        wait_for(READY_BOUND, &format!("{more} more grants to the load {what}"), async || {
            let now = self.fences.lock().unwrap().len();
            if now >= start + more {
                Ok(())
            } else {
                Err(format!("{} more", now - start))
            }
        })
        .await;
    }

    fn use_nodes(&self, cluster: &Cluster, ids: &[usize]) {
        *self.endpoints.lock().unwrap() = ids.iter().map(|id| cluster.client_url(*id)).collect();
    }

    async fn finish(self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        self.fences.lock().unwrap().clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_to_five_to_three_under_load_keeps_every_grant_and_fences_grow() {
    let mut cluster = Cluster::start_with(3, &["--admin-key", ADMIN_KEY]).await;
    let held = Grant::from_reply(&cluster.acquire(1, "held-throughout", "keeper", "10m").await, "the long hold");
    let load = Load::start(&cluster, &[1, 2, 3]);
    load.progress(3, "on three nodes").await;

    let four = cluster.spawn_joining();
    let five = cluster.spawn_joining();
    assert_eq!((four, five), (4, 5));

    // The admin key guards membership: none, or a wrong one, changes nothing.
    add(&cluster, 1, four, None).await.assert_problem(401, "unauthenticated", "add without a key");
    add(&cluster, 1, four, Some("wrong-key-wrong-key")).await.assert_problem(401, "unauthenticated", "wrong key");
    remove(&cluster, 1, 3, None).await.assert_problem(401, "unauthenticated", "remove without a key");
    wait_voters(&cluster, 1, &[1, 2, 3]).await;

    // Grow: each new node catches up as a learner, then votes. Through a follower, so forwarded too.
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let follower = cluster.other_than(&[leader, 4, 5]);
    let grown = add(&cluster, follower, four, Some(ADMIN_KEY)).await;
    assert!(voters(grown.ok("add node 4")).contains(&4), "{grown:?}");
    add(&cluster, leader, five, Some(ADMIN_KEY)).await.ok("add node 5");
    for id in 1..=5 {
        wait_voters(&cluster, id, &[1, 2, 3, 4, 5]).await;
    }
    cluster.wait_ready(four).await;
    cluster.wait_ready(five).await;
    load.use_nodes(&cluster, &[1, 2, 3, 4, 5]);
    load.progress(5, "on five nodes").await;

    // Adding again at the same address is harmless; a taken id at another address, or a bad one, is refused.
    add(&cluster, 2, four, Some(ADMIN_KEY)).await.ok("adding a voter again");
    let taken = format!("{}/v1/cluster/members?id=4&addr=127.0.0.1:1", cluster.client_url(1));
    let reply = cluster.send(cluster.http().post(taken).bearer_auth(ADMIN_KEY), "add a taken id").await;
    reply.assert_problem(409, "member-exists", "a taken id");
    let bad = format!("{}/v1/cluster/members?id=0&addr=nowhere", cluster.client_url(1));
    let reply = cluster.send(cluster.http().post(bad).bearer_auth(ADMIN_KEY), "add id 0").await;
    reply.assert_problem(400, "invalid-member", "id 0");
    remove(&cluster, 1, 9, Some(ADMIN_KEY)).await.assert_problem(409, "not-a-member", "remove a stranger");

    // Shrink back to three by removing the two oldest nodes, the leader among them if it is one.
    load.use_nodes(&cluster, &[3, 4, 5]);
    remove(&cluster, 5, 1, Some(ADMIN_KEY)).await.ok("remove node 1");
    remove(&cluster, 4, 2, Some(ADMIN_KEY)).await.ok("remove node 2");
    for id in 3..=5 {
        wait_voters(&cluster, id, &[3, 4, 5]).await;
    }
    cluster.stop(1);
    cluster.stop(2);
    let leader = cluster.leader_among(&[3, 4, 5]).await;
    assert!([3, 4, 5].contains(&leader), "the leader is one of the remaining voters: {leader}");
    load.progress(3, "on the three that remain").await;

    // The remaining three still decide: a fresh grant, and the lock held since the start is still held by
    // the same grant.
    let fresh = Grant::from_reply(&cluster.acquire(4, "after-shrink", "late", "30s").await, "a grant after");
    assert!(fresh.fence > held.fence, "fences grow across membership changes");
    let view = cluster.lock(3, "held-throughout").await;
    assert_eq!(view.ok("the long hold")["holder"]["fence"].as_u64(), Some(held.fence), "{view:?}");

    let fences = load.finish().await;
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "one client's fences only grow: {fences:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_was_lost_is_replaced_under_a_new_id_with_the_cli() {
    let mut cluster = Cluster::start(3).await;
    let held = Grant::from_reply(&cluster.acquire(1, "kept", "keeper", "10m").await, "a hold before the loss");

    // Node 3's disk is gone. It must not come back under its old id (it would have forgotten its vote);
    // a new node takes its place under a new id.
    cluster.kill(3);
    cluster.wipe(3);
    let replacement = cluster.spawn_joining();
    let endpoints = format!("{},{}", cluster.client_addr(1), cluster.client_addr(2));
    let cli = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_holdfast"))
            .args(["cluster", "--endpoints", &endpoints, "--json"])
            .args(args)
            .env_remove("HOLDFAST_ADMIN_KEY")
            .output()
            .expect("run holdfast cluster");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        (output.status.code(), stdout, stderr)
    };
    let peer = cluster.peer_addr(replacement).to_string();
    let (code, stdout, stderr) = cli(&["add", &replacement.to_string(), &peer]);
    assert_eq!(code, Some(0), "cluster add: {stdout} {stderr}");
    let status: Value = serde_json::from_str(&stdout).unwrap();
    assert!(voters(&status).contains(&(replacement as u64)), "{status}");
    let (code, stdout, stderr) = cli(&["remove", "3"]);
    assert_eq!(code, Some(0), "cluster remove: {stdout} {stderr}");
    let (code, _, stderr) = cli(&["remove", "3"]);
    assert_eq!(code, Some(1), "removing a non-member again fails: {stderr}");
    assert!(stderr.contains("not a member"), "{stderr}");
    for id in [1, 2, replacement] {
        wait_voters(&cluster, id, &[1, 2, replacement as u64]).await;
    }
    cluster.wait_ready(replacement).await;

    // The replacement is a full voter: with node 1 gone too, nodes 2 and 4 are a majority and decide.
    cluster.kill(1);
    let leader = cluster.leader_among(&[2, replacement]).await;
    let fresh = Grant::from_reply(&cluster.acquire(leader, "after", "new", "30s").await, "a grant by 2 and 4");
    assert!(fresh.fence > held.fence);
    let view = cluster.lock(replacement, "kept").await;
    assert_eq!(view.ok("the hold from before")["holder"]["fence"].as_u64(), Some(held.fence), "{view:?}");
}
