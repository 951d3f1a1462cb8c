//! What operators see: Prometheus metrics that count what happened on every node, health that tells
//! "alive" from "ready" (HTTP and `grpc.health.v1`), the separate health port, systemd's readiness
//! notification, `holdfast healthcheck`, and JSON logs that trace Raft role changes.

use std::io::BufRead;
use std::net::TcpListener;
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::Duration;

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::common::{sample, wait_for, Cluster, ELECTION_BOUND, EXIT_BOUND, READY_BOUND};

async fn metrics(cluster: &Cluster, id: usize) -> Result<String, String> {
    let reply = cluster.try_get(id, "/metrics").await.map_err(|e| format!("node {id}: {e}"))?;
    let content_type = reply.content_type.clone().unwrap_or_default();
    if reply.status != 200 || !content_type.starts_with("application/openmetrics-text") {
        return Err(format!("node {id}: GET /metrics answered {reply:?}"));
    }
    Ok(reply.body.as_str().unwrap_or_default().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_grants_handovers_forwards_and_requests_on_every_node() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);

    // Through a follower: forwarded to the leader.
    let first = cluster.acquire(follower, "metrics-job", "metrics-owner-one", "30s").await;
    let token = first.ok("first acquire")["token"].as_str().unwrap().to_owned();
    let waiter = {
        let url =
            format!("{}/v1/locks/metrics-job?owner=metrics-owner-two&ttl=30s&wait=20s", cluster.client_url(leader));
        let http = cluster.http().clone();
        tokio::spawn(async move { http.post(url).send().await.map(|r| r.status().as_u16()) })
    };
    wait_for(ELECTION_BOUND, "the second owner to wait in the queue", async || {
        let view = cluster.lock(leader, "metrics-job").await;
        match view.body["waiters"].as_array().map(Vec::len) {
            Some(1) => Ok(()),
            _ => Err(format!("{view:?}")),
        }
    })
    .await;
    cluster.release(leader, "metrics-job", &token).await.ok("release by the first owner");
    assert_eq!(waiter.await.unwrap().unwrap(), 200, "the waiter is granted on release");

    // Every node applies the same entries, so every node counts the same grants and hand-over.
    for id in cluster.ids() {
        let page = wait_for(ELECTION_BOUND, "every node to count 2 grants and 1 hand-over", async || {
            let page = metrics(&cluster, id).await?;
            let counted = (sample(&page, "holdfast_grants_total"), sample(&page, "holdfast_handovers_total"));
            match counted {
                (Some(2.0), Some(1.0)) => Ok(page),
                _ => Err(format!("node {id}: (grants, handovers) = {counted:?}")),
            }
        })
        .await;
        assert_eq!(sample(&page, "holdfast_raft_has_leader"), Some(1.0), "node {id}");
        let is_leader = if id == leader { 1.0 } else { 0.0 };
        assert_eq!(sample(&page, "holdfast_raft_is_leader"), Some(is_leader), "node {id}");
        assert_eq!(sample(&page, "holdfast_locks_held"), Some(1.0), "node {id}: the waiter holds it now");
        assert_eq!(sample(&page, "holdfast_lock_waiters"), Some(0.0), "node {id}");
        assert!(sample(&page, "holdfast_raft_term").is_some_and(|t| t >= 1.0), "node {id}: {page}");
        assert!(sample(&page, "holdfast_storage_fsync_duration_seconds_count").is_some_and(|n| n >= 1.0));
        assert!(sample(&page, "holdfast_handover_latency_seconds_count") == Some(1.0), "node {id}: {page}");
        // Labels come from fixed sets: no lock name or owner ever appears.
        assert!(!page.contains("metrics-job") && !page.contains("metrics-owner"), "node {id} leaks a name:\n{page}");
    }
    let leader_page = metrics(&cluster, leader).await.unwrap();
    assert!(
        sample(&leader_page, "holdfast_raft_proposals_total{result=\"committed\"}").is_some_and(|n| n >= 3.0),
        "the leader proposed acquire, enqueue and release:\n{leader_page}"
    );
    let follower_page = metrics(&cluster, follower).await.unwrap();
    assert_eq!(
        sample(&follower_page, "holdfast_forwarded_requests_total{kind=\"write\"}"),
        Some(1.0),
        "the follower forwarded the first acquire:\n{follower_page}"
    );
    assert_eq!(
        sample(&follower_page, "holdfast_requests_total{api=\"http\",endpoint=\"POST /v1/locks/{name}\",code=\"200\"}"),
        Some(1.0),
        "the follower counted the acquire it answered:\n{follower_page}"
    );
    assert!(
        sample(&leader_page, "holdfast_requests_total{api=\"http\",endpoint=\"DELETE /v1/locks/{name}\",code=\"200\"}")
            == Some(1.0),
        "the leader counted the release:\n{leader_page}"
    );
}

/// `--worker-threads` sets how many threads run a node's tasks (nodes sharing a machine take their share of
/// it), and the node reports the number it runs on. 3 differs from the default (one per CPU) on the 1-,
/// 2- and 4-core machines the tests run on.
/// Each member in `GET /v1/cluster`'s `peers` on node `id`: (matched index, ms since last heard).
async fn peers(cluster: &Cluster, id: usize) -> Vec<(String, Option<u64>, Option<u64>)> {
    let body = cluster.get(id, "/v1/cluster").await.ok("the cluster view").clone();
    let peers = body["peers"].as_object().unwrap_or_else(|| panic!("peers in {body}"));
    peers.iter().map(|(id, p)| (id.clone(), p["matched_index"].as_u64(), p["last_heard_ms"].as_u64())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_view_tells_how_far_each_member_matches_and_when_it_was_last_heard_from() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    let other = cluster.other_than(&[leader, follower]);
    cluster.acquire(follower, "job", "w1", "60").await.ok("an acquire");

    // The leader: every other member matched to its last entry, heard from within a few heartbeats.
    let view = cluster.get(leader, "/v1/cluster").await.ok("the leader's view").clone();
    let last = view["last_log_index"].as_u64().expect("a last log index");
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    assert!(view["now_ms"].as_u64().is_some_and(|now| now.abs_diff(wall) < 60_000), "now_ms: {view}");
    wait_for(ELECTION_BOUND, "both followers matched and heard from", async || {
        let seen = peers(&cluster, leader).await;
        let fine = seen.len() == 2
            && seen.iter().all(|(_, matched, heard)| *matched >= Some(last) && heard.is_some_and(|ms| ms < 1_000));
        if fine {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    })
    .await;
    // A follower: the leader heard from; nothing matched (only the leader knows that).
    let seen = peers(&cluster, follower).await;
    let of_leader = seen.iter().find(|(id, _, _)| *id == leader.to_string()).expect("the leader in a follower's peers");
    assert!(of_leader.2.is_some_and(|ms| ms < 1_000) && seen.iter().all(|p| p.1.is_none()), "{seen:?}");

    // A member killed: the leader stops hearing from it, and its silence grows.
    cluster.kill(other);
    wait_for(ELECTION_BOUND * 4, "the killed member's silence", async || {
        let seen = peers(&cluster, leader).await;
        match seen.iter().find(|(id, _, _)| *id == other.to_string()) {
            Some((_, _, Some(ms))) if *ms >= 1_000 => Ok(()),
            p => Err(format!("{p:?}")),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_runs_on_the_worker_threads_it_is_given() {
    let cluster = Cluster::start_with(1, &["--worker-threads", "3"]).await;
    let page = metrics(&cluster, 1).await.unwrap();
    assert_eq!(sample(&page, "holdfast_worker_threads"), Some(3.0), "{page}");
    cluster.acquire(1, "worker-threads", "w", "30s").await.ok("an acquire on the node");
}

async fn grpc_health(cluster: &Cluster, id: usize, service: &str) -> Result<ServingStatus, String> {
    let url = format!("http://{}", cluster.client_addr(id));
    let channel = tonic::transport::Endpoint::from_shared(url)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("node {id}: {e}"))?;
    let mut client = HealthClient::new(channel);
    let request = HealthCheckRequest { service: service.to_owned() };
    let reply = tokio::time::timeout(Duration::from_secs(2), client.check(request))
        .await
        .map_err(|_| format!("node {id}: health check timed out"))?
        .map_err(|e| format!("node {id}: {e}"))?;
    ServingStatus::try_from(reply.into_inner().status).map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quorum_a_node_is_alive_but_not_ready_over_http_and_grpc() {
    let mut cluster = Cluster::start(3).await;
    for id in cluster.ids() {
        for service in ["", "holdfast.v1.Locks"] {
            let status = wait_for(READY_BOUND, "grpc.health.v1 to say SERVING", async || {
                match grpc_health(&cluster, id, service).await? {
                    ServingStatus::Serving => Ok(ServingStatus::Serving),
                    other => Err(format!("node {id} {service:?}: {other:?}")),
                }
            })
            .await;
            assert_eq!(status, ServingStatus::Serving);
        }
    }

    // Two of three gone, the leader among them: no quorum, no leader. The survivor must stay alive (a
    // liveness probe that failed now would have Kubernetes restart a healthy node into a longer outage) and
    // stop being ready.
    let leader = cluster.leader().await;
    let survivor = cluster.other_than(&[leader]);
    let other = cluster.other_than(&[leader, survivor]);
    cluster.kill(leader);
    cluster.kill(other);
    wait_for(ELECTION_BOUND, "the survivor to report not ready", async || {
        let ready = cluster.try_get(survivor, "/readyz").await.map_err(|e| e.to_string())?;
        let grpc = grpc_health(&cluster, survivor, "").await?;
        match (ready.status, grpc) {
            (503, ServingStatus::NotServing) => Ok(()),
            seen => Err(format!("(/readyz, grpc health) = {seen:?}")),
        }
    })
    .await;
    let live = cluster.try_get(survivor, "/livez").await.unwrap();
    assert_eq!(live.status, 200, "liveness does not depend on quorum: {live:?}");
    let page = metrics(&cluster, survivor).await.unwrap();
    assert_eq!(sample(&page, "holdfast_raft_has_leader"), Some(0.0), "{page}");
    // A write through it reaches no leader; its answer says so, and that nothing was done (checked below).
    let refused = cluster.acquire(survivor, "without-quorum", "A", "60").await;
    refused.assert_problem(503, "unavailable", "an acquire without quorum");
    let detail = refused.body["detail"].as_str().unwrap_or_default();
    assert!(detail.ends_with("nothing was done"), "{refused:#?}");

    // Quorum back: ready again.
    cluster.respawn(other);
    cluster.wait_ready(survivor).await;
    let lock = cluster.get(survivor, "/v1/locks/without-quorum").await;
    lock.assert_problem(404, "not-found", "the lock the acquire without quorum named");
    wait_for(READY_BOUND, "grpc health to say SERVING again", async || {
        match grpc_health(&cluster, survivor, "").await? {
            ServingStatus::Serving => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// Two free ports on 127.0.0.1 (held until both are chosen, so they differ).
fn free_ports<const N: usize>() -> [u16; N] {
    let probes: Vec<TcpListener> = (0..N).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    std::array::from_fn(|i| probes[i].local_addr().unwrap().port())
}

fn healthcheck(url: &str) -> std::process::ExitStatus {
    Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(["healthcheck", "--url", url, "--timeout", "2s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run holdfast healthcheck")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_port_systemd_notification_healthcheck_and_json_logs() {
    let dir = tempfile::tempdir().unwrap();
    let [client, peer, health] = free_ports::<3>();
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(READY_BOUND)).unwrap();
    let log_path = dir.path().join("node.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .arg("server")
        .args(["--client-addr", &format!("127.0.0.1:{client}")])
        .args(["--peer-addr", &format!("127.0.0.1:{peer}")])
        .args(["--health-addr", &format!("127.0.0.1:{health}")])
        .args(["--log-format", "json"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("NOTIFY_SOCKET", &notify_path)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();

    let mut buf = [0u8; 256];
    let n = notify.recv(&mut buf).expect("systemd hears from the node within the bound");
    assert_eq!(&buf[..n], b"READY=1");

    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let health_url = format!("http://127.0.0.1:{health}");
    wait_for(READY_BOUND, "/readyz on the health port", async || {
        let status = http.get(format!("{health_url}/readyz")).send().await.map_err(|e| e.to_string())?.status();
        if status == 200 {
            Ok(())
        } else {
            Err(status.to_string())
        }
    })
    .await;
    let page = http.get(format!("{health_url}/metrics")).send().await.unwrap().text().await.unwrap();
    assert_eq!(sample(&page, "holdfast_raft_is_leader"), Some(1.0), "{page}");
    let api = http.get(format!("{health_url}/v1/locks")).send().await.unwrap().status();
    assert_eq!(api, 404, "the health port serves no API");

    assert!(healthcheck(&format!("{health_url}/livez")).success());
    assert!(healthcheck(&format!("http://127.0.0.1:{client}/readyz")).success());
    assert!(!healthcheck(&format!("{health_url}/nothing-here")).success(), "a 404 fails the check");
    let [closed] = free_ports::<1>();
    assert!(!healthcheck(&format!("http://127.0.0.1:{closed}/livez")).success(), "a closed port fails");

    let sent = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(sent.success());
    let n = notify.recv(&mut buf).expect("systemd hears the node stop");
    assert_eq!(&buf[..n], b"STOPPING=1");
    let exited = wait_for(EXIT_BOUND, "the node to exit after SIGTERM", async || {
        child.try_wait().map_err(|e| e.to_string())?.ok_or_else(|| "still running".to_string())
    })
    .await;
    assert!(exited.success(), "a clean stop exits 0: {exited}");

    // Every log line is one JSON object; the node's rise to leader is among them.
    let lines: Vec<serde_json::Value> = std::io::BufReader::new(std::fs::File::open(&log_path).unwrap())
        .lines()
        .map(|line| {
            let line = line.unwrap();
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"))
        })
        .collect();
    assert!(
        lines.iter().any(|l| l["fields"]["message"] == "raft role" && l["fields"]["state"] == "Leader"),
        "no role change to leader in the log: {lines:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_asked_for_is_stored_reported_and_found_again_after_a_restart() {
    const ADMIN_KEY: &str = "snapshot-test-admin-key";
    let mut cluster = Cluster::start_with(3, &["--admin-key", ADMIN_KEY]).await;
    let leader = cluster.leader().await;
    let mut last_fence = 0;
    for i in 0..20 {
        let reply = cluster.acquire(leader, &format!("snapshot-{i}"), "w", "1h").await;
        last_fence = reply.ok("acquire")["fence"].as_u64().expect("a fence");
    }
    let follower = cluster.other_than(&[leader]);
    // The follower snapshots what it has applied when asked: first let it apply the last grant.
    wait_for(READY_BOUND, "the follower to apply the last grant", async || {
        let applied = cluster.cluster_info(follower).await["applied_index"].as_u64().unwrap_or(0);
        if applied >= last_fence {
            Ok(())
        } else {
            Err(format!("applied {applied} < {last_fence}"))
        }
    })
    .await;
    let snapshot_url = format!("{}/v1/cluster/snapshot", cluster.client_url(follower));
    let gauges =
        |page: &str| (sample(page, "holdfast_storage_snapshot_bytes"), sample(page, "holdfast_storage_snapshot_index"));

    // Without the admin key, or with a parameter it does not take: refused, and no snapshot is taken.
    let refused = cluster.send(cluster.http().post(&snapshot_url), "snapshot without the admin key").await;
    refused.assert_problem(401, "unauthenticated", "snapshot without the admin key");
    let typo = cluster.http().post(format!("{snapshot_url}?force=1")).bearer_auth(ADMIN_KEY);
    cluster.send(typo, "snapshot with an unknown parameter").await.assert_problem(400, "invalid-query", "force=1");
    let page = metrics(&cluster, follower).await.unwrap();
    assert_eq!(gauges(&page), (Some(0.0), Some(0.0)), "no snapshot yet (the default is every 20,000 entries)");

    let reply = cluster.send(cluster.http().post(&snapshot_url).bearer_auth(ADMIN_KEY), "snapshot").await;
    let body = reply.ok("snapshot").clone();
    let (index, bytes) = (body["snapshot_index"].as_u64().unwrap(), body["snapshot_bytes"].as_u64().unwrap());
    assert_eq!(body["id"].as_u64(), Some(follower as u64), "{body}");
    assert!(index >= last_fence, "the snapshot covers every grant the follower had applied: {body}");
    assert!(bytes > 20 * "snapshot-0".len() as u64, "20 held locks take more than their names: {body}");
    let page = metrics(&cluster, follower).await.unwrap();
    assert_eq!(gauges(&page), (Some(bytes as f64), Some(index as f64)), "{page}");
    let info = cluster.cluster_info(follower).await;
    assert_eq!(info["snapshot_index"].as_u64(), Some(index), "openraft's view agrees: {info}");
    // Asked again with nothing new applied: the same snapshot, not another one.
    let again = cluster.send(cluster.http().post(&snapshot_url).bearer_auth(ADMIN_KEY), "snapshot again").await;
    assert_eq!(again.ok("snapshot again")["snapshot_index"].as_u64(), Some(index));

    // The same through gRPC, with `holdfast cluster snapshot`, on the leader.
    let cli = |key: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_holdfast"));
        command.args(["cluster", "snapshot", "--json", "--endpoints", &cluster.client_addr(leader).to_string()]);
        command.env_remove("HOLDFAST_ADMIN_KEY");
        if let Some(key) = key {
            command.args(["--admin-key", key]);
        }
        let output = command.output().expect("run holdfast cluster snapshot");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, _, stderr) = cli(None);
    assert_ne!(code, Some(0), "refused without the admin key: {stderr}");
    let (code, stdout, stderr) = cli(Some(ADMIN_KEY));
    assert_eq!(code, Some(0), "{stdout} {stderr}");
    let answer: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(answer["id"].as_u64(), Some(leader as u64), "{answer}");
    assert!(answer["snapshot_index"].as_u64().unwrap() >= last_fence, "{answer}");
    let page = metrics(&cluster, leader).await.unwrap();
    let (leader_bytes, leader_index) = (answer["snapshot_bytes"].as_f64(), answer["snapshot_index"].as_f64());
    assert_eq!(gauges(&page), (leader_bytes, leader_index), "{page}");

    // A restarted follower opens from it, and says so before it takes another.
    cluster.stop(follower);
    cluster.restart(follower).await;
    let page = metrics(&cluster, follower).await.unwrap();
    assert_eq!(gauges(&page), (Some(bytes as f64), Some(index as f64)), "after the restart: {page}");
    let lock = cluster
        .until_available("read a lock after the restart", async || cluster.lock(follower, "snapshot-19").await)
        .await;
    assert_eq!(lock.ok("the last lock")["holder"]["fence"].as_u64(), Some(last_fence));
}
