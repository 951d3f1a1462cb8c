//! Shared harness for the integration tests: a cluster of real `holdfast server` processes on 127.0.0.1.
//!
//! Each [`Cluster`] owns its processes, ports and data directories (in a [`TempDir`]). Nodes are numbered
//! from 1, like their Raft ids. Every wait is bounded and polls a condition ([`wait_for`]); none sleeps and
//! hopes. When a test panics, dropping the cluster prints the tail of every node's log before killing it.

use std::fs::OpenOptions;
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

/// How long a whole cluster may take to start until every node answers `/readyz` with 200.
pub const START_BOUND: Duration = Duration::from_secs(30);
/// How long one node may take to become ready again after a restart.
pub const READY_BOUND: Duration = Duration::from_secs(30);
/// How long the cluster may take to (re-)elect a leader, e.g. after the leader was killed.
pub const ELECTION_BOUND: Duration = Duration::from_secs(20);
/// How long a process may take to exit after SIGKILL or SIGTERM.
pub const EXIT_BOUND: Duration = Duration::from_secs(10);
/// Interval between two polls of a condition.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Timeout of one ordinary HTTP request (long polls set their own).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Lines of each node's log printed when a test fails.
const LOG_TAIL_LINES: usize = 60;
/// Attempts at starting a cluster when a node could not bind a port that was free a moment earlier.
const START_ATTEMPTS: usize = 3;

/// The value of the sample `series` (name with labels, exactly as exposed) in a metrics page.
pub fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Polls `check` every [`POLL_INTERVAL`] until it returns `Ok`, and returns that value.
///
/// `check` answers `Err(observation)` while the condition does not hold yet; when `bound` passes, this
/// panics with `what` and the last observation, so a failure says what was awaited and what was seen.
pub async fn wait_for<T>(bound: Duration, what: &str, mut check: impl AsyncFnMut() -> Result<T, String>) -> T {
    let start = Instant::now();
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) => {
                if start.elapsed() >= bound {
                    panic!("timed out after {bound:?} waiting for {what}; last seen: {last}");
                }
            }
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// An HTTP answer, with the parts the tests look at.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub content_type: Option<String>,
    pub retry_after: Option<String>,
    /// The body as JSON, or as a JSON string when it is not JSON.
    pub body: Value,
}

impl Reply {
    /// The body of a 200 answer; panics with the whole reply otherwise.
    pub fn ok(&self, what: &str) -> &Value {
        assert_eq!(self.status, 200, "{what}: expected 200, got {self:#?}");
        &self.body
    }

    /// Asserts that this is an `application/problem+json` error with `status` and `urn:holdfast:{slug}`.
    pub fn assert_problem(&self, status: u16, slug: &str, what: &str) {
        self.assert_problem_like(status, what);
        assert_eq!(self.problem_type(), format!("urn:holdfast:{slug}"), "{what}: wrong problem type in {self:#?}");
    }

    /// Asserts that this is an `application/problem+json` error with `status`, whatever its type.
    pub fn assert_problem_like(&self, status: u16, what: &str) {
        assert_eq!(self.status, status, "{what}: wrong status in {self:#?}");
        let content_type = self.content_type.as_deref().unwrap_or("");
        assert!(
            content_type.starts_with("application/problem+json"),
            "{what}: expected content-type application/problem+json in {self:#?}"
        );
        assert_eq!(
            self.body["status"].as_u64(),
            Some(u64::from(status)),
            "{what}: the problem's status field must match the HTTP status in {self:#?}"
        );
        assert!(self.body["title"].is_string(), "{what}: the problem has no title in {self:#?}");
        assert!(
            self.problem_type().starts_with("urn:holdfast:"),
            "{what}: the problem's type is not urn:holdfast:… in {self:#?}"
        );
    }

    /// The problem's `type` field, or "" when there is none.
    pub fn problem_type(&self) -> &str {
        self.body["type"].as_str().unwrap_or("")
    }
}

/// A grant as answered by acquire and renew.
#[derive(Debug, Clone)]
pub struct Grant {
    pub name: String,
    pub owner: String,
    pub token: String,
    pub fence: u64,
    pub expires_at_ms: u64,
    pub ttl_ms: u64,
}

impl Grant {
    /// Reads a grant from a 200 answer, checking that every documented field is there.
    pub fn from_reply(reply: &Reply, what: &str) -> Grant {
        let body = reply.ok(what);
        let field = |key: &str| body.get(key).unwrap_or_else(|| panic!("{what}: grant without `{key}`: {body}"));
        assert!(field("expires_at").is_string(), "{what}: expires_at must be an RFC 3339 string: {body}");
        let as_u64 = |key: &str| {
            field(key).as_u64().unwrap_or_else(|| panic!("{what}: `{key}` is not an unsigned integer: {body}"))
        };
        let as_str = |key: &str| {
            field(key).as_str().unwrap_or_else(|| panic!("{what}: `{key}` is not a string: {body}")).to_string()
        };
        Grant {
            name: as_str("name"),
            owner: as_str("owner"),
            token: as_str("token"),
            fence: as_u64("fence"),
            expires_at_ms: as_u64("expires_at_ms"),
            ttl_ms: as_u64("ttl_ms"),
        }
    }
}

/// One `holdfast server` process (or the place of one that is not running).
struct Node {
    id: usize,
    client_addr: SocketAddr,
    peer_addr: SocketAddr,
    data_dir: PathBuf,
    log_path: PathBuf,
    child: Option<Child>,
    /// Started with `--join` (waits to be added) rather than with the member list.
    join: bool,
}

/// A cluster of real `holdfast server` processes. Dropping it kills them all.
pub struct Cluster {
    bin: PathBuf,
    members: String,
    nodes: Vec<Node>,
    /// Flags every node gets besides the harness's own.
    extra_args: Vec<String>,
    /// `http`, or `https` for a cluster with TLS on its client port.
    scheme: &'static str,
    http: reqwest::Client,
    // Declared last so that it is removed after the processes are gone.
    dir: TempDir,
}

impl Cluster {
    /// Starts `n` nodes that all know each other and waits (bounded) until every one is ready.
    pub async fn start(n: usize) -> Cluster {
        Cluster::start_with(n, &[]).await
    }

    /// [`Cluster::start`], with `extra_args` given to every node (e.g. `--admin-key`).
    pub async fn start_with(n: usize, extra_args: &[&str]) -> Cluster {
        Cluster::start_tls(n, extra_args, None).await
    }

    /// [`Cluster::start_with`]; with `https`, the client port speaks TLS and the harness uses that client.
    pub async fn start_tls(n: usize, extra_args: &[&str], https: Option<reqwest::Client>) -> Cluster {
        assert!(n >= 1, "a cluster needs at least one node");
        let mut attempt = 1;
        loop {
            let mut cluster = Cluster::spawn(n, extra_args);
            if let Some(http) = &https {
                cluster.scheme = "https";
                cluster.http = http.clone();
            }
            match cluster.wait_all_ready().await {
                Ok(()) => return cluster,
                Err(reason) if attempt < START_ATTEMPTS && reason.contains("in use") => {
                    // Another process took one of our ports between the probe and the server's bind.
                    eprintln!("harness: cluster start attempt {attempt} failed ({reason}); retrying");
                    attempt += 1;
                }
                Err(reason) => {
                    cluster.print_log_tails();
                    panic!("cluster of {n} did not start: {reason}");
                }
            }
        }
    }

    fn spawn(n: usize, extra_args: &[&str]) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("holdfast-test-")
            .tempdir()
            .expect("create a temporary directory for the cluster");
        // Hold every probe listener until all ports are chosen, so that no two nodes get the same port.
        let probes: Vec<TcpListener> = (0..2 * n)
            .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0 to find a free port"))
            .collect();
        let addrs: Vec<SocketAddr> =
            probes.iter().map(|probe| probe.local_addr().expect("local address of a probe listener")).collect();
        drop(probes);
        let nodes: Vec<Node> = (1..=n)
            .map(|id| Node {
                id,
                client_addr: addrs[2 * (id - 1)],
                peer_addr: addrs[2 * (id - 1) + 1],
                data_dir: dir.path().join(format!("node{id}")).join("data"),
                log_path: dir.path().join(format!("node{id}.log")),
                child: None,
                join: false,
            })
            .collect();
        let members = nodes.iter().map(|node| format!("{}={}", node.id, node.peer_addr)).collect::<Vec<_>>().join(",");
        let http = reqwest::Client::builder()
            // A proxy from the environment must not see requests to 127.0.0.1.
            .no_proxy()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .expect("build the HTTP client");
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_holdfast"));
        let extra_args = extra_args.iter().map(|arg| arg.to_string()).collect();
        let mut cluster = Cluster { bin, members, nodes, extra_args, scheme: "http", http, dir };
        for id in 1..=n {
            cluster.spawn_node(id);
        }
        cluster
    }

    fn spawn_node(&mut self, id: usize) {
        let bin = self.bin.clone();
        let members = self.members.clone();
        let extra_args = self.extra_args.clone();
        let node = self.node_mut(id);
        assert!(node.child.is_none(), "node {id} is already running");
        std::fs::create_dir_all(&node.data_dir).expect("create the node's data directory");
        let mut log =
            OpenOptions::new().create(true).append(true).open(&node.log_path).expect("open the node's log file");
        writeln!(log, "===== harness: starting node {id} =====").expect("write to the node's log");
        let stderr = log.try_clone().expect("clone the node's log file handle");
        let mut command = Command::new(&bin);
        command.arg("server").arg("--id").arg(id.to_string());
        match node.join {
            true => command.arg("--join"),
            false => command.arg("--members").arg(&members),
        };
        command
            .args(&extra_args)
            .arg("--client-addr")
            .arg(node.client_addr.to_string())
            .arg("--peer-addr")
            .arg(node.peer_addr.to_string())
            .arg("--data-dir")
            .arg(&node.data_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(stderr));
        // Settings from the environment of whoever runs the tests must not leak into the nodes.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HOLDFAST_") {
                command.env_remove(key);
            }
        }
        // openraft's info lines would crowd the holdfast ones out of the tail printed on failure.
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "info,openraft=warn");
        }
        // The logs go to files: no colour codes.
        command.env("NO_COLOR", "1");
        let child = command.spawn().unwrap_or_else(|e| panic!("spawn {} server: {e}", bin.display()));
        node.child = Some(child);
    }

    /// Starts a new node, with the next id and new ports, that joins the running cluster (`--join`): it
    /// waits until a member adds it. Answers its id.
    pub fn spawn_joining(&mut self) -> usize {
        let id = self.nodes.len() + 1;
        let probes: Vec<TcpListener> =
            (0..2).map(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0 to find a free port")).collect();
        let addr = |i: usize| probes[i].local_addr().expect("local address of a probe listener");
        let (client_addr, peer_addr) = (addr(0), addr(1));
        drop(probes);
        self.nodes.push(Node {
            id,
            client_addr,
            peer_addr,
            data_dir: self.dir.path().join(format!("node{id}")).join("data"),
            log_path: self.dir.path().join(format!("node{id}.log")),
            child: None,
            join: true,
        });
        self.spawn_node(id);
        id
    }

    /// The process id of running node `id`.
    pub fn pid(&self, id: usize) -> u32 {
        self.node(id).child.as_ref().unwrap_or_else(|| panic!("node {id} is not running")).id()
    }

    /// Deletes node `id`'s data directory (a lost disk); the node must not be running.
    pub fn wipe(&mut self, id: usize) {
        let node = self.node(id);
        assert!(node.child.is_none(), "wipe node {id}: stop it first");
        std::fs::remove_dir_all(&node.data_dir).expect("remove the node's data directory");
    }

    /// Node `id`'s data directory.
    pub fn data_dir(&self, id: usize) -> &Path {
        &self.node(id).data_dir
    }

    /// What node `id` has written to its log (stdout and stderr) over all its starts.
    pub fn log(&self, id: usize) -> String {
        std::fs::read_to_string(&self.node(id).log_path).unwrap_or_default()
    }

    /// The ids of all nodes, 1..=n.
    pub fn ids(&self) -> std::ops::RangeInclusive<usize> {
        1..=self.nodes.len()
    }

    /// The ids of the nodes whose process is running (as far as the harness knows).
    pub fn running(&self) -> Vec<usize> {
        self.nodes.iter().filter(|node| node.child.is_some()).map(|node| node.id).collect()
    }

    fn node(&self, id: usize) -> &Node {
        assert!((1..=self.nodes.len()).contains(&id), "no node {id} in a cluster of {}", self.nodes.len());
        &self.nodes[id - 1]
    }

    fn node_mut(&mut self, id: usize) -> &mut Node {
        assert!((1..=self.nodes.len()).contains(&id), "no node {id} in a cluster of {}", self.nodes.len());
        &mut self.nodes[id - 1]
    }

    /// `http://127.0.0.1:PORT` of node `id`'s client port, without a trailing slash.
    pub fn client_url(&self, id: usize) -> String {
        format!("{}://{}", self.scheme, self.node(id).client_addr)
    }

    /// Every node's client address, comma-separated, for a client's `--endpoints`.
    pub fn endpoints(&self) -> String {
        self.ids().map(|id| self.client_addr(id).to_string()).collect::<Vec<_>>().join(",")
    }

    /// `127.0.0.1:PORT` of node `id`'s client port.
    pub fn client_addr(&self, id: usize) -> SocketAddr {
        self.node(id).client_addr
    }

    /// `127.0.0.1:PORT` of node `id`'s peer port.
    pub fn peer_addr(&self, id: usize) -> SocketAddr {
        self.node(id).peer_addr
    }

    /// The harness's HTTP client (no proxy, [`REQUEST_TIMEOUT`] per request).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// Kills node `id` with SIGKILL and waits (bounded) until the process is gone.
    pub fn kill(&mut self, id: usize) -> ExitStatus {
        let node = self.node_mut(id);
        let mut child = node.child.take().unwrap_or_else(|| panic!("node {id} is not running"));
        // An error here means the process already exited; wait() below collects it either way.
        let _ = child.kill();
        wait_exit(&mut child, EXIT_BOUND).unwrap_or_else(|| panic!("node {id} still runs {EXIT_BOUND:?} after SIGKILL"))
    }

    /// Asks node `id` to stop with SIGTERM and waits (bounded) until it exits; panics if it does not.
    pub fn stop(&mut self, id: usize) -> ExitStatus {
        let node = self.node_mut(id);
        let mut child = node.child.take().unwrap_or_else(|| panic!("node {id} is not running"));
        let pid = child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().expect("run kill -TERM");
        assert!(sent.success(), "kill -TERM {pid} (node {id}) failed");
        match wait_exit(&mut child, EXIT_BOUND) {
            Some(status) => status,
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("node {id} did not exit within {EXIT_BOUND:?} of SIGTERM (killed it)");
            }
        }
    }

    /// Gives `args` in place of the extra arguments of every node started from now on (a restart, say).
    pub fn set_extra_args(&mut self, args: &[&str]) {
        self.extra_args = args.iter().map(|arg| arg.to_string()).collect();
    }

    /// Starts node `id` again with the same ports and data directory, and waits until it is ready.
    pub async fn restart(&mut self, id: usize) {
        self.spawn_node(id);
        self.wait_ready(id).await;
    }

    /// Starts node `id` again with the same ports and data directory, without waiting.
    pub fn respawn(&mut self, id: usize) {
        self.spawn_node(id);
    }

    /// Waits (bounded by [`READY_BOUND`]) until node `id` answers `/readyz` with 200.
    pub async fn wait_ready(&mut self, id: usize) {
        if let Err(reason) = self.wait_ready_within(&[id], READY_BOUND).await {
            panic!("node {id} did not become ready: {reason}");
        }
    }

    /// Kills every node with SIGKILL, as a power cut would stop them all at once.
    pub fn kill_all(&mut self) {
        for id in self.ids() {
            self.kill(id);
        }
    }

    /// Starts every node again on its data and waits until all are ready; fails the test, with `what`,
    /// if one is not.
    pub async fn restart_all(&mut self, what: &str) {
        for id in self.ids() {
            self.respawn(id);
        }
        if let Err(reason) = self.wait_all_ready().await {
            panic!("{what}: the restarted cluster did not become ready: {reason}");
        }
    }

    /// Waits (bounded by [`START_BOUND`]) until every running node answers `/readyz` with 200.
    pub async fn wait_all_ready(&mut self) -> Result<(), String> {
        let ids = self.running();
        self.wait_ready_within(&ids, START_BOUND).await
    }

    async fn wait_ready_within(&mut self, ids: &[usize], bound: Duration) -> Result<(), String> {
        let start = Instant::now();
        let mut pending: Vec<usize> = ids.to_vec();
        loop {
            // A node that exits while we wait will never be ready: say so at once, with its log.
            for &id in &pending {
                let node = self.node_mut(id);
                let child = node.child.as_mut().unwrap_or_else(|| panic!("node {id} is not running"));
                if let Some(status) = child.try_wait().expect("poll the node's process") {
                    node.child = None;
                    let tail = exit_tail(&node.log_path, 20);
                    return Err(format!("node {id} exited with {status} while starting:\n{tail}"));
                }
            }
            let mut still = Vec::new();
            for &id in &pending {
                let url = format!("{}/readyz", self.client_url(id));
                let ready = matches!(
                    self.http.get(&url).timeout(Duration::from_secs(2)).send().await,
                    Ok(response) if response.status().as_u16() == 200
                );
                if !ready {
                    still.push(id);
                }
            }
            pending = still;
            if pending.is_empty() {
                return Ok(());
            }
            if start.elapsed() >= bound {
                return Err(format!("nodes {pending:?} not ready (GET /readyz != 200) after {bound:?}"));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// The id of the leader: waits (bounded by [`ELECTION_BOUND`]) until a running node says it is the
    /// leader and every other running node that knows a leader names the same one.
    pub async fn leader(&self) -> usize {
        self.leader_among(&self.running()).await
    }

    /// [`Cluster::leader`], asking only the nodes `ids` (e.g. the members, when other nodes run that have
    /// not joined yet or were removed).
    pub async fn leader_among(&self, ids: &[usize]) -> usize {
        wait_for(ELECTION_BOUND, "a leader that every running node agrees on", async || {
            let mut seen = Vec::new();
            let mut leader = None;
            for &id in ids {
                let reply = match self.try_get(id, "/v1/cluster").await {
                    Ok(reply) if reply.status == 200 => reply,
                    Ok(reply) => return Err(format!("node {id}: {reply:?}")),
                    Err(e) => return Err(format!("node {id}: {e}")),
                };
                let body = reply.body;
                if body["state"] == "Leader" && body["leader"].as_u64() == Some(id as u64) {
                    leader = Some(id);
                }
                seen.push((id, body["leader"].clone(), body["state"].clone()));
            }
            let Some(leader) = leader else {
                return Err(format!("no node is leader: (id, leader, state) = {seen:?}"));
            };
            let agree = seen.iter().all(|(_, named, _)| named.as_u64() == Some(leader as u64));
            if agree {
                Ok(leader)
            } else {
                Err(format!("nodes disagree: (id, leader, state) = {seen:?}"))
            }
        })
        .await
    }

    /// The leader among the nodes other than `not`, once one of them says it leads (bounded by
    /// [`ELECTION_BOUND`]): for a test whose node `not` still thinks it leads.
    pub async fn leader_other_than(&self, not: usize) -> usize {
        let others: Vec<usize> = self.running().into_iter().filter(|&id| id != not).collect();
        wait_for(ELECTION_BOUND, &format!("a node other than {not} to lead"), async || {
            for &id in &others {
                if self.cluster_info(id).await["state"] == "Leader" {
                    return Ok(id);
                }
            }
            Err(format!("none of {others:?} leads yet"))
        })
        .await
    }

    /// What node `id` answers on `/readyz`: its status and its text.
    pub async fn readyz(&self, id: usize) -> (u16, String) {
        let reply = self.get(id, "/readyz").await;
        (reply.status, reply.body.as_str().unwrap_or_default().to_owned())
    }

    /// Checks that node `id` reads every one of `grants` held under its fence.
    pub async fn holds(&self, id: usize, grants: &[Grant]) {
        for grant in grants {
            let held = self.get(id, &format!("/v1/locks/{}", grant.name)).await;
            let fence = held.ok(&format!("a read of {} through node {id}", grant.name))["holder"]["fence"].as_u64();
            assert_eq!(fence, Some(grant.fence), "node {id}: {} is held under its fence", grant.name);
        }
    }

    /// A running node other than `not`, e.g. a follower when `not` is the leader.
    pub fn other_than(&self, not: &[usize]) -> usize {
        self.running()
            .into_iter()
            .find(|id| !not.contains(id))
            .unwrap_or_else(|| panic!("no running node other than {not:?}"))
    }

    // ----- HTTP -----

    /// Sends `request` and reads the reply; transport errors are returned.
    pub async fn try_send(&self, request: reqwest::RequestBuilder) -> reqwest::Result<Reply> {
        let response = request.send().await?;
        let status = response.status().as_u16();
        let header =
            |name: &str| response.headers().get(name).and_then(|value| value.to_str().ok()).map(str::to_string);
        let content_type = header("content-type");
        let retry_after = header("retry-after");
        let text = response.text().await?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok(Reply { status, content_type, retry_after, body })
    }

    /// Sends `request` and reads the reply; a transport error fails the test.
    pub async fn send(&self, request: reqwest::RequestBuilder, what: &str) -> Reply {
        self.try_send(request).await.unwrap_or_else(|e| panic!("{what}: request failed: {e}"))
    }

    /// `GET {path}` on node `id`, transport errors returned.
    pub async fn try_get(&self, id: usize, path: &str) -> reqwest::Result<Reply> {
        let url = format!("{}{path}", self.client_url(id));
        self.try_send(self.http.get(url)).await
    }

    /// `GET {path}` on node `id` (a path with its query string, e.g. `/v1/locks?prefix=a`).
    pub async fn get(&self, id: usize, path: &str) -> Reply {
        let url = format!("{}{path}", self.client_url(id));
        self.send(self.http.get(&url), &format!("GET {url}")).await
    }

    /// Node `id`'s metrics page.
    pub async fn metrics(&self, id: usize) -> String {
        self.get(id, "/metrics").await.body.as_str().unwrap_or_default().to_owned()
    }

    /// The value of `series` (name with labels, exactly as exposed) on node `id`'s metrics page, if it is
    /// there.
    pub async fn metric(&self, id: usize, series: &str) -> Option<f64> {
        sample(&self.metrics(id).await, series)
    }

    /// `POST {path}` on node `id`.
    pub async fn post(&self, id: usize, path: &str) -> Reply {
        let url = format!("{}{path}", self.client_url(id));
        self.send(self.http.post(&url), &format!("POST {url}")).await
    }

    /// `DELETE {path}` on node `id`.
    pub async fn delete(&self, id: usize, path: &str) -> Reply {
        let url = format!("{}{path}", self.client_url(id));
        self.send(self.http.delete(&url), &format!("DELETE {url}")).await
    }

    /// `POST /v1/locks/{name}?ttl={ttl}&owner={owner}` on node `id`.
    pub async fn acquire(&self, id: usize, name: &str, owner: &str, ttl: &str) -> Reply {
        let url = format!("{}/v1/locks/{name}", self.client_url(id));
        let request = self.http.post(&url).query(&[("ttl", ttl), ("owner", owner)]);
        self.send(request, &format!("acquire {name} as {owner} via node {id}")).await
    }

    /// Like [`Cluster::acquire`], with `wait={wait_s}s`; the request may take up to the wait and a margin.
    pub async fn acquire_wait(&self, id: usize, name: &str, owner: &str, ttl: &str, wait_s: u64) -> Reply {
        let url = format!("{}/v1/locks/{name}", self.client_url(id));
        let wait = format!("{wait_s}s");
        let request = self
            .http
            .post(&url)
            .query(&[("ttl", ttl), ("owner", owner), ("wait", wait.as_str())])
            .timeout(Duration::from_secs(wait_s) + REQUEST_TIMEOUT);
        self.send(request, &format!("acquire {name} as {owner} via node {id} with wait={wait}")).await
    }

    /// `DELETE /v1/locks/{name}?token={token}` on node `id`.
    pub async fn release(&self, id: usize, name: &str, token: &str) -> Reply {
        let url = format!("{}/v1/locks/{name}", self.client_url(id));
        let request = self.http.delete(&url).query(&[("token", token)]);
        self.send(request, &format!("release {name} via node {id}")).await
    }

    /// `POST /v1/locks/{name}/renew?token={token}[&ttl={ttl}]` on node `id`.
    pub async fn renew(&self, id: usize, name: &str, token: &str, ttl: Option<&str>) -> Reply {
        let url = format!("{}/v1/locks/{name}/renew", self.client_url(id));
        let mut request = self.http.post(&url).query(&[("token", token)]);
        if let Some(ttl) = ttl {
            request = request.query(&[("ttl", ttl)]);
        }
        self.send(request, &format!("renew {name} via node {id}")).await
    }

    /// `GET /v1/locks/{name}` on node `id`.
    pub async fn lock(&self, id: usize, name: &str) -> Reply {
        self.get(id, &format!("/v1/locks/{name}")).await
    }

    /// `GET /v1/cluster` on node `id`, as JSON; fails the test unless it answers 200.
    pub async fn cluster_info(&self, id: usize) -> Value {
        self.get(id, "/v1/cluster").await.ok(&format!("GET /v1/cluster on node {id}")).clone()
    }

    /// Sends what `request` builds until the answer is not 503 (no leader reachable, e.g. during an
    /// election), bounded by [`ELECTION_BOUND`]; returns the first other answer.
    pub async fn until_available(&self, what: &str, mut request: impl AsyncFnMut() -> Reply) -> Reply {
        wait_for(ELECTION_BOUND, &format!("{what} to be answered with something other than 503"), async || {
            let reply = request().await;
            if reply.status == 503 {
                Err(format!("{reply:?}"))
            } else {
                Ok(reply)
            }
        })
        .await
    }

    // ----- logs -----

    /// Prints the last lines of every node's log to stderr.
    pub fn print_log_tails(&self) {
        for node in &self.nodes {
            eprintln!(
                "----- node {} ({}; client {}, peer {}) last {LOG_TAIL_LINES} log lines -----\n{}",
                node.id,
                if node.child.is_some() { "running" } else { "not running" },
                node.client_addr,
                node.peer_addr,
                log_tail(&node.log_path, LOG_TAIL_LINES)
            );
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_log_tails();
            for node in &self.nodes {
                if let Some(child) = &node.child {
                    print_stacks_if_stuck(node.id, child.id(), node.client_addr);
                }
            }
            if std::env::var_os("HOLDFAST_TEST_KEEP").is_some() {
                let dir = std::mem::replace(&mut self.dir, TempDir::new().expect("temp dir"));
                eprintln!("harness: keeping {}", dir.keep().display());
            }
        }
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Prints the threads' stacks of node `id` (process `pid`) if it does not answer on its client port within
/// a second, as a node that hangs does not, and `gdb` is installed: a hang that happens once in many runs
/// then shows where it was.
fn print_stacks_if_stuck(id: usize, pid: u32, client_addr: SocketAddr) {
    use std::io::Read;
    let answers = || -> std::io::Result<bool> {
        let mut stream = std::net::TcpStream::connect_timeout(&client_addr, Duration::from_secs(1))?;
        stream.set_read_timeout(Some(Duration::from_secs(1)))?;
        // Plain HTTP; a TLS node answers it with an alert or closes the connection: either way, it answers.
        stream.write_all(b"GET /livez HTTP/1.0\r\n\r\n")?;
        let mut byte = [0u8; 1];
        match stream.read(&mut byte) {
            Ok(_) => Ok(true),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => Ok(false),
            Err(_) => Ok(true),
        }
    };
    // A node a test stopped (SIGSTOP) does not answer either, and is not stuck.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let stopped = stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'));
    if stopped || answers().unwrap_or(true) {
        return;
    }
    let dump = Command::new("gdb")
        .args(["-p", &pid.to_string(), "-batch", "-ex", "thread apply all bt"])
        .stdin(Stdio::null())
        .output();
    match dump {
        Ok(out) => eprintln!(
            "----- node {id} (pid {pid}) does not answer on {client_addr}: its threads -----\n{}",
            String::from_utf8_lossy(&out.stdout)
        ),
        Err(e) => eprintln!("----- node {id} (pid {pid}) does not answer on {client_addr} (no stacks: gdb: {e}) -----"),
    }
}

/// Waits for `child` to exit, at most `bound`; `None` if it is still running then.
fn wait_exit(child: &mut Child, bound: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("poll a child process") {
            return Some(status);
        }
        if start.elapsed() >= bound {
            return None;
        }
        // A blocking sleep is fine here: the process is about to exit, and Drop cannot await.
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The last `lines` lines of the file at `path` (or why it could not be read).
pub fn log_tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => last_lines(&String::from_utf8_lossy(&bytes), lines),
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// The last `lines` lines of the log at `path` of a node that exited, up to the backtrace of its error.
/// With `RUST_BACKTRACE` set (`.ci/run` sets it) the error (e.g. "Address already in use", which
/// [`Cluster::start_tls`] retries on) is followed by dozens of lines of backtrace that would push it out.
fn exit_tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let error = text.rsplit_once("\nStack backtrace:").map_or(&*text, |(before, _)| before);
            last_lines(error, lines)
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

fn last_lines(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ----- client processes -----

/// Lines of a client process's output printed when a test fails.
const CLIENT_OUTPUT_LINES: usize = 40;

/// A shell fragment that waits until `file` exists, polling every 50 ms, and gives up after about 60 s, so
/// that a command whose test failed does not run on for long.
pub fn sh_wait_for_file(file: &str) -> String {
    format!("i=0; while [ ! -e {file} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i + 1)); done")
}

/// A shell fragment that writes `words` (expanded by the shell) to `file` in one step: it is written under
/// another name and renamed, so a reader that sees `file` sees all of it.
pub fn sh_write_file(file: &str, words: &str) -> String {
    format!("echo {words} > {file}.tmp && mv {file}.tmp {file}")
}

/// Waits (bounded) until `path` exists and returns what it holds.
pub async fn wait_for_file(path: &Path, bound: Duration, what: &str) -> String {
    wait_for(bound, what, async || std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))).await
}

/// When `path` was last written, by the file system's clock (the wall clock).
pub fn modified(path: &Path) -> std::time::SystemTime {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("modification time of {}: {e}", path.display()))
}

/// A `holdfast` client process a test started (e.g. `holdfast run`), in the test's work directory, with its
/// stdout and stderr in `{label}.out` and `{label}.err` there.
///
/// A command started through [`ClientProc::run`] first writes its pid to `{label}.pid`; since `holdfast run`
/// starts its command as the leader of a process group, that pid names the command's group. When the test
/// kills the `holdfast` process itself ([`ClientProc::kill`]) or panics, dropping this kills that group
/// too, so that no command outlives its test.
pub struct ClientProc {
    label: String,
    dir: PathBuf,
    child: Child,
    status: Option<ExitStatus>,
    /// The test sent SIGKILL: the command's group may be left running.
    killed: bool,
}

impl ClientProc {
    /// Starts `holdfast ARGS…` in `dir`.
    pub fn start(dir: &Path, label: &str, args: &[String]) -> ClientProc {
        let bin = env!("CARGO_BIN_EXE_holdfast");
        let out = std::fs::File::create(dir.join(format!("{label}.out"))).expect("create the client's stdout file");
        let err = std::fs::File::create(dir.join(format!("{label}.err"))).expect("create the client's stderr file");
        let mut command = Command::new(bin);
        command.args(args).current_dir(dir).stdin(Stdio::null()).stdout(Stdio::from(out)).stderr(Stdio::from(err));
        // A process group of its own: a test that stops it (SIGSTOP) must not leave a stopped process in the
        // test runner's group, which, if that group is orphaned (a runner started without a terminal's job
        // control, or in a session of its own), the kernel sends SIGHUP and SIGCONT whenever another of its
        // members exits: `holdfast run` would forward the SIGHUP to its command and let go of the lock.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        // Settings from the environment of whoever runs the tests must not leak into the client.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HOLDFAST_") {
                command.env_remove(key);
            }
        }
        let child = command.spawn().unwrap_or_else(|e| panic!("spawn {bin} {args:?}: {e}"));
        ClientProc { label: label.to_string(), dir: dir.to_path_buf(), child, status: None, killed: false }
    }

    /// Starts `holdfast run RUN_ARGS… -- sh -c 'echo $$ > {label}.pid; SCRIPT'` in `dir`.
    pub fn run(dir: &Path, label: &str, run_args: &[&str], script: &str) -> ClientProc {
        let mut args: Vec<String> = vec!["run".into()];
        args.extend(run_args.iter().map(|arg| arg.to_string()));
        args.extend(["--".into(), "sh".into(), "-c".into(), format!("echo $$ > {label}.pid; {script}")]);
        ClientProc::start(dir, label, &args)
    }

    /// The `holdfast` process's pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The label the test gave this process.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The pid of the command (and so its process group), once it has written `{label}.pid`.
    pub fn command_pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.dir.join(format!("{}.pid", self.label))).ok()?;
        text.trim().parse().ok()
    }

    /// The exit status, if the process has exited (it is collected the first time it is seen).
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("poll a client process");
        }
        self.status
    }

    /// Waits (bounded) until the process exits.
    pub async fn wait_exit(&mut self, bound: Duration, what: &str) -> ExitStatus {
        wait_for(bound, what, async || {
            self.try_status().ok_or_else(|| format!("{} still runs; its output: {}", self.label, self.output()))
        })
        .await
    }

    /// Waits (bounded) until the process exits and returns its exit code; fails if a signal ended it.
    pub async fn exit_code(&mut self, bound: Duration, what: &str) -> i32 {
        let status = self.wait_exit(bound, what).await;
        status.code().unwrap_or_else(|| panic!("{what}: {} ended by {status}; output: {}", self.label, self.output()))
    }

    /// Sends `signal` to the `holdfast` process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory-safety preconditions.
        let sent = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(sent, 0, "kill({}, {signal}) for {}: {}", self.pid(), self.label, std::io::Error::last_os_error());
    }

    /// Sends SIGKILL to the `holdfast` process (not to its command). Returns at once; the process is
    /// collected by [`wait_exit`](Self::wait_exit) or on drop.
    pub fn kill(&mut self) {
        self.killed = true;
        self.signal(libc::SIGKILL);
    }

    /// Sends SIGKILL to the command's process group, if the command wrote its pid.
    pub fn kill_command_group(&self) {
        if let Some(pgid) = self.command_pid() {
            // SAFETY: killpg has no memory-safety preconditions; a group that is gone makes it fail (ESRCH).
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }

    /// The process's stdout and stderr so far.
    pub fn output(&self) -> String {
        let read = |ext: &str| log_tail(&self.dir.join(format!("{}.{ext}", self.label)), CLIENT_OUTPUT_LINES);
        format!("[stdout: {:?}; stderr: {:?}]", read("out"), read("err"))
    }

    /// Whether the process has written nothing at all to stdout or stderr.
    pub fn printed_nothing(&self) -> bool {
        ["out", "err"].iter().all(|ext| {
            std::fs::metadata(self.dir.join(format!("{}.{ext}", self.label))).map(|m| m.len() == 0).unwrap_or(true)
        })
    }
}

impl Drop for ClientProc {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        if panicking {
            eprintln!("----- client {} (pid {}) output -----\n{}", self.label, self.pid(), self.output());
        }
        if self.try_status().is_none() {
            self.killed = true;
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // A `holdfast` process that exited by itself has collected its command; only a killed one may have
        // left the command running.
        if self.killed || panicking {
            self.kill_command_group();
        }
    }
}
