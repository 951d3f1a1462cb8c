//! The container image and the Compose cluster, under faults, with clients that use a fenced resource.
//!
//! Builds the image (`cluster/image.sh`, from this build's binary, with `deploy/docker/rootfs.sh`), starts
//! `cluster/docker-compose.yml` as a project of its own on free ports of 127.0.0.1, and runs [`CLIENTS`]
//! client tasks in this process. Each takes one lock through any node that answers, and while holding it
//! does a read-modify-write of a counter on a [`Resource`] that refuses a fence lower than the highest it
//! has seen. Some iterations stall past the lock's TTL before writing, as a paused process would, so the
//! resource must turn stale holders away. With the clients running, the test kills the leader's container
//! (and starts it again), cuts the leader off the network (and reconnects it), and restarts every node in
//! turn; after each fault it requires a grant within [`RECOVERY_BOUND`] and prints how long grants stopped.
//! At the end it checks the resource's history: fences never went down, no two grants shared a fence, and
//! the counter lost no increment.
//!
//! It needs a Docker engine and Docker Compose (the plugin or docker-compose 1.27+), hence `#[ignore]`:
//! `tests/run` runs it when `docker info` answers. The project is always taken down (`down -v`), also when
//! the test fails; on failure the containers' logs are printed first. With `HOLDFAST_TEST_KEEP` set, it is
//! left running instead, for a look at it (the test prints the command that takes it down).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::wait_for;

/// The nodes of cluster/docker-compose.yml: services `holdfast-1` to `holdfast-3`, Raft ids 1 to 3.
const NODES: usize = 3;
/// The tag the test builds; not `holdfast:local`, so that a developer's own image is left alone.
const IMAGE: &str = "holdfast:test";
/// The one lock every client wants.
const LOCK: &str = "containers-counter";
/// Its TTL, as sent and as a duration.
const TTL_PARAM: &str = "2s";
const TTL: Duration = Duration::from_secs(2);
/// How long an acquire waits in the lock's queue.
const WAIT_PARAM: &str = "3s";
const WAIT: Duration = Duration::from_secs(3);
/// Client tasks.
const CLIENTS: usize = 3;
/// Every this many iterations, a client stalls between its read and its write.
const STALL_EVERY: u64 = 4;
/// How long a stalled client sleeps: past its TTL, so that the lock has moved on when it writes.
const STALL: Duration = Duration::from_millis(2_700);

/// How long the nodes may take, once their containers run, until every one answers /readyz with 200.
const START_BOUND: Duration = Duration::from_secs(60);
/// One docker or compose command.
const DOCKER_BOUND: Duration = Duration::from_secs(60);
/// How long the cluster may take to grant the lock again after a fault.
const RECOVERY_BOUND: Duration = Duration::from_secs(30);
/// How long a restarted or reconnected node may take to answer /readyz with 200 again.
const READY_BOUND: Duration = Duration::from_secs(30);
/// How long every container may take to report `healthy` (its HEALTHCHECK runs every 10 s).
const HEALTHY_BOUND: Duration = Duration::from_secs(40);
/// How long the clients may take to finish their iteration once told to stop.
const CLIENT_STOP_BOUND: Duration = Duration::from_secs(30);
/// `docker stop` timeout: SIGTERM, then SIGKILL after this.
const STOP_TIMEOUT_S: u64 = 10;

/// Grants wanted before the first fault and after the last one.
const GRANTS_BEFORE_FAULTS: usize = 10;
const GRANTS_AFTER_FAULTS: usize = 5;

/// An acquire may take its `wait` plus the time the leader needs to answer; past this the client gives up
/// on that node (the outcome is then unknown: a grant nobody learned of runs out after its TTL).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(WAIT.as_secs() + 3);
/// Any other request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// How long to connect to a published port (a stopped container's port refuses at once).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// A client's pause after no node could serve it, before it tries them all again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

// ----- the fenced resource -----

/// What a client did to the resource.
#[derive(Debug, Clone, Copy, PartialEq)]
enum OpKind {
    Read,
    Write,
}

/// One operation the resource was asked to do, in the order it saw them.
#[derive(Debug, Clone)]
struct Op {
    kind: OpKind,
    fence: u64,
    /// The token of the grant the client believed it held.
    token: String,
    accepted: bool,
    /// The client had stalled past its TTL before this write.
    stalled: bool,
}

/// A counter that accepts an operation only with a fence at least as high as the highest it has accepted,
/// reads included. A read-modify-write under fence 10 then loses no increment: if a newer holder (fence 11
/// or more) read or wrote the counter in between, the write under 10 is refused. Were only writes fenced,
/// a stale holder's write could land between a newer holder's read and write, and be overwritten.
#[derive(Debug, Default)]
struct Resource {
    highest: u64,
    value: u64,
    log: Vec<Op>,
}

impl Resource {
    fn admits(&self, fence: u64) -> bool {
        fence >= self.highest
    }

    /// The counter, or `None` if `fence` is stale.
    fn read(&mut self, fence: u64, token: &str) -> Option<u64> {
        let accepted = self.admits(fence);
        self.log.push(Op { kind: OpKind::Read, fence, token: token.to_string(), accepted, stalled: false });
        if accepted {
            self.highest = fence;
            Some(self.value)
        } else {
            None
        }
    }

    /// Sets the counter; `false` if `fence` is stale.
    fn write(&mut self, fence: u64, token: &str, value: u64, stalled: bool) -> bool {
        let accepted = self.admits(fence);
        self.log.push(Op { kind: OpKind::Write, fence, token: token.to_string(), accepted, stalled });
        if accepted {
            self.highest = fence;
            self.value = value;
        }
        accepted
    }
}

// ----- what the clients share with the test -----

/// A grant a client received.
#[derive(Debug, Clone)]
struct GrantRecord {
    client: usize,
    token: String,
    fence: u64,
    /// When the client had the answer.
    at: Instant,
}

#[derive(Default)]
struct Tally {
    granted: u64,
    busy: u64,
    /// Requests that got no answer from a node (refused, reset, timed out) or a 5xx.
    unavailable: u64,
}

struct Shared {
    stop: AtomicBool,
    resource: Mutex<Resource>,
    grants: Mutex<Vec<GrantRecord>>,
    tally: Mutex<Tally>,
    /// Answers no client should ever get (a 400, a 200 without a fence, …).
    unexpected: Mutex<Vec<String>>,
}

impl Shared {
    fn grant_times(&self) -> Vec<Instant> {
        let mut times: Vec<Instant> = self.grants.lock().unwrap().iter().map(|g| g.at).collect();
        times.sort();
        times
    }

    fn grants_count(&self) -> usize {
        self.grants.lock().unwrap().len()
    }
}

/// The outcome of one acquire through the first node that could serve it.
enum Acquired {
    Granted { token: String, fence: u64 },
    Busy,
    Unavailable,
}

/// One client: acquires, read-modify-writes the counter (sometimes stalling past the TTL), releases,
/// until told to stop.
async fn client(id: usize, http: reqwest::Client, urls: Vec<String>, shared: Arc<Shared>) {
    let mut iteration: u64 = 0;
    while !shared.stop.load(Ordering::SeqCst) {
        iteration += 1;
        let first = (id + iteration as usize) % urls.len();
        let owner = format!("client-{id}-{iteration}");
        match acquire(&http, &urls, first, &owner, &shared).await {
            Acquired::Granted { token, fence } => {
                shared.tally.lock().unwrap().granted += 1;
                shared.grants.lock().unwrap().push(GrantRecord {
                    client: id,
                    token: token.clone(),
                    fence,
                    at: Instant::now(),
                });
                let stall = iteration.is_multiple_of(STALL_EVERY);
                let read = shared.resource.lock().unwrap().read(fence, &token);
                if let Some(value) = read {
                    if stall {
                        // The point of this iteration: a holder that pauses (GC, swap, a stopped VM) and
                        // then acts on a lock it lost meanwhile.
                        tokio::time::sleep(STALL).await;
                    }
                    shared.resource.lock().unwrap().write(fence, &token, value + 1, stall);
                }
                release(&http, &urls, first, &token).await;
            }
            Acquired::Busy => shared.tally.lock().unwrap().busy += 1,
            Acquired::Unavailable => tokio::time::sleep(RETRY_PAUSE).await,
        }
    }
}

/// `POST /v1/locks/LOCK?ttl=…&owner=…&wait=…` on each node in turn from `first`, until one answers with
/// a grant or a 409; a refused connection, a timeout or a 5xx means: try the next.
async fn acquire(http: &reqwest::Client, urls: &[String], first: usize, owner: &str, shared: &Shared) -> Acquired {
    for k in 0..urls.len() {
        let url = &urls[(first + k) % urls.len()];
        let request = http
            .post(format!("{url}/v1/locks/{LOCK}"))
            .query(&[("ttl", TTL_PARAM), ("owner", owner), ("wait", WAIT_PARAM)])
            .timeout(ACQUIRE_TIMEOUT);
        // No answer (refused, reset, timed out): try the next node.
        if let Ok(response) = request.send().await {
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            match status {
                200 => match (body["token"].as_str(), body["fence"].as_u64()) {
                    (Some(token), Some(fence)) => return Acquired::Granted { token: token.to_string(), fence },
                    _ => shared.unexpected.lock().unwrap().push(format!("a grant without token or fence: {body}")),
                },
                409 => return Acquired::Busy,
                // Unavailable (no leader, or the outcome is unknown): try the next node.
                500..=599 => {}
                _ => shared.unexpected.lock().unwrap().push(format!("acquire via {url}: {status} {body}")),
            }
        }
        shared.tally.lock().unwrap().unavailable += 1;
    }
    Acquired::Unavailable
}

/// `DELETE /v1/locks/LOCK?token=…`, best effort: a 409 (the hold already ended) is as good as a 200.
async fn release(http: &reqwest::Client, urls: &[String], first: usize, token: &str) {
    for k in 0..urls.len() {
        let url = &urls[(first + k) % urls.len()];
        let request = http.delete(format!("{url}/v1/locks/{LOCK}")).query(&[("token", token)]).timeout(REQUEST_TIMEOUT);
        if let Ok(response) = request.send().await {
            if matches!(response.status().as_u16(), 200 | 409) {
                return;
            }
        }
    }
}

// ----- docker and compose -----

/// The repository's root.
fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the repository's root")
}

/// Runs `program args…` (bounded by [`DOCKER_BOUND`]) and returns its stdout; panics with its output if
/// it fails.
async fn run(program: &str, args: &[&str], envs: &[(String, String)]) -> String {
    let mut command = tokio::process::Command::new(program);
    command.args(args).stdin(Stdio::null()).kill_on_drop(true);
    for (key, value) in envs {
        command.env(key, value);
    }
    let what = format!("{program} {}", args.join(" "));
    let output = tokio::time::timeout(DOCKER_BOUND, command.output())
        .await
        .unwrap_or_else(|_| panic!("`{what}` did not finish within {DOCKER_BOUND:?}"))
        .unwrap_or_else(|e| panic!("run `{what}`: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "`{what}` failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

async fn docker(args: &[&str]) -> String {
    run("docker", args, &[]).await
}

/// `docker compose`, or `docker-compose` where the plugin is missing.
fn compose_program() -> Vec<String> {
    let works = |program: &str, args: &[&str]| {
        std::process::Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    };
    if works("docker", &["compose", "version"]) {
        vec!["docker".into(), "compose".into()]
    } else if works("docker-compose", &["version"]) {
        vec!["docker-compose".into()]
    } else {
        panic!("neither `docker compose` nor `docker-compose` works on this machine");
    }
}

/// Free ports of 127.0.0.1, one per node (held together while they are chosen, so that they differ).
fn free_ports() -> Vec<u16> {
    let probes: Vec<TcpListener> =
        (0..NODES).map(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0 to find a free port")).collect();
    probes.iter().map(|probe| probe.local_addr().expect("a probe's address").port()).collect()
}

/// The Compose project: cluster/docker-compose.yml under a project name of its own. Dropping it prints
/// the containers' logs if the test is failing, and always takes the project down with its volumes.
struct Project {
    program: Vec<String>,
    file: String,
    name: String,
    env: Vec<(String, String)>,
    ports: Vec<u16>,
    /// Container ids of holdfast-1..3, once started.
    containers: Vec<String>,
}

impl Project {
    fn new() -> Project {
        let root = repo_root();
        let ports = free_ports();
        let mut env: Vec<(String, String)> = vec![
            ("HOLDFAST_IMAGE".into(), IMAGE.into()),
            // The test alone stops and starts the containers.
            ("HOLDFAST_RESTART".into(), "no".into()),
            ("RUST_LOG".into(), "info,openraft=warn".into()),
            ("HOLDFAST_LOG_FORMAT".into(), "text".into()),
        ];
        for (i, port) in ports.iter().enumerate() {
            env.push((format!("HOLDFAST_PORT_{}", i + 1), port.to_string()));
        }
        Project {
            program: compose_program(),
            file: root.join("cluster/docker-compose.yml").display().to_string(),
            name: format!("holdfast-ci-{}", std::process::id()),
            env,
            ports,
            containers: Vec::new(),
        }
    }

    /// The compose command line for `args`.
    fn argv<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        let mut argv: Vec<&str> = self.program[1..].iter().map(String::as_str).collect();
        argv.extend(["-f", self.file.as_str(), "-p", self.name.as_str()]);
        argv.extend(args);
        argv
    }

    async fn compose(&self, args: &[&str]) -> String {
        run(&self.program[0], &self.argv(args), &self.env).await
    }

    /// Blocking, for Drop.
    fn compose_blocking(&self, args: &[&str]) -> std::io::Result<std::process::Output> {
        std::process::Command::new(&self.program[0])
            .args(self.argv(args))
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .output()
    }

    fn url(&self, node: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[node - 1])
    }

    fn urls(&self) -> Vec<String> {
        (1..=NODES).map(|node| self.url(node)).collect()
    }

    fn container(&self, node: usize) -> &str {
        &self.containers[node - 1]
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        if std::thread::panicking() {
            match self.compose_blocking(&["logs", "--no-color", "--timestamps", "--tail", "150"]) {
                Ok(output) => eprintln!(
                    "----- containers' logs (last 150 lines each) -----\n{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ),
                Err(e) => eprintln!("compose logs: {e}"),
            }
        }
        if std::env::var_os("HOLDFAST_TEST_KEEP").is_some() {
            eprintln!(
                "HOLDFAST_TEST_KEEP is set: project {} is left running; take it down with\n  \
                 {} -f {} -p {} down -v",
                self.name,
                self.program.join(" "),
                self.file,
                self.name
            );
            return;
        }
        match self.compose_blocking(&["down", "-v", "-t", "5"]) {
            Ok(output) if output.status.success() => {}
            Ok(output) => eprintln!("compose down failed: {}", String::from_utf8_lossy(&output.stderr)),
            Err(e) => eprintln!("compose down: {e}"),
        }
    }
}

// ----- the cluster as the test sees it -----

/// Seconds since `start`, for the event lines.
fn secs(since: Instant, at: Instant) -> f64 {
    at.saturating_duration_since(since).as_secs_f64()
}

struct Harness {
    project: Project,
    http: reqwest::Client,
    shared: Arc<Shared>,
    start: Instant,
}

impl Harness {
    fn event(&self, text: &str) {
        eprintln!("[{:6.1}s] {text}", secs(self.start, Instant::now()));
    }

    async fn get(&self, node: usize, path: &str) -> Result<(u16, Value), String> {
        let url = format!("{}{path}", self.project.url(node));
        let response = self.http.get(&url).timeout(REQUEST_TIMEOUT).send().await.map_err(|e| format!("{url}: {e}"))?;
        let status = response.status().as_u16();
        let text = response.text().await.map_err(|e| format!("{url}: {e}"))?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }

    async fn ready(&self, node: usize) -> Result<(), String> {
        match self.get(node, "/readyz").await? {
            (200, _) => Ok(()),
            (status, body) => Err(format!("node {node}: /readyz answered {status} {body}")),
        }
    }

    async fn wait_ready(&self, node: usize, bound: Duration) {
        wait_for(bound, &format!("node {node} to answer /readyz with 200"), async || self.ready(node).await).await;
    }

    async fn wait_all_ready(&self, bound: Duration) {
        wait_for(bound, "every node to answer /readyz with 200", async || {
            for node in 1..=NODES {
                self.ready(node).await?;
            }
            Ok(())
        })
        .await;
    }

    /// The leader and its term: a node that says it leads, and that a majority of the nodes name as leader.
    async fn leader(&self) -> (usize, u64) {
        wait_for(RECOVERY_BOUND, "a leader that a majority of the nodes agree on", async || {
            let mut named: BTreeMap<u64, usize> = BTreeMap::new();
            let mut leading: Vec<(u64, u64)> = Vec::new();
            let mut seen = Vec::new();
            for node in 1..=NODES {
                match self.get(node, "/v1/cluster").await {
                    Ok((200, info)) => {
                        if let Some(leader) = info["leader"].as_u64() {
                            *named.entry(leader).or_default() += 1;
                        }
                        if info["state"] == "Leader" {
                            leading.push((info["id"].as_u64().unwrap_or(0), info["term"].as_u64().unwrap_or(0)));
                        }
                        seen.push(format!(
                            "node {node}: {} leader {} term {}",
                            info["state"], info["leader"], info["term"]
                        ));
                    }
                    Ok((status, body)) => seen.push(format!("node {node}: {status} {body}")),
                    Err(e) => seen.push(e),
                }
            }
            let agreed = named.iter().find(|(_, votes)| **votes > NODES / 2).map(|(id, _)| *id);
            match leading.iter().find(|(id, _)| Some(*id) == agreed) {
                Some((id, term)) => Ok((*id as usize, *term)),
                None => Err(seen.join("; ")),
            }
        })
        .await
    }

    /// Waits (bounded) for a grant received after `after`, and returns when it came.
    async fn grant_after(&self, after: Instant, bound: Duration, what: &str) -> Instant {
        wait_for(bound, what, async || {
            self.shared
                .grant_times()
                .into_iter()
                .find(|at| *at > after)
                .ok_or_else(|| format!("{} grants in all, none since the fault", self.shared.grants_count()))
        })
        .await
    }

    /// Waits (bounded) until the clients have `count` grants in all.
    async fn grants_reach(&self, count: usize, bound: Duration, what: &str) {
        wait_for(bound, what, async || {
            let now = self.shared.grants_count();
            if now >= count {
                Ok(())
            } else {
                Err(format!("{now} grants"))
            }
        })
        .await;
    }

    /// Prints what a fault cost: the time from the fault to the first grant after it, and the longest
    /// time without a grant from the last grant before the fault to the first grant after `settled`.
    fn report(&self, name: &str, fault: Instant, settled: Instant, after_settled: Instant) {
        let times = self.shared.grant_times();
        let first_after = times.iter().find(|at| **at > fault).copied().expect("a grant after the fault");
        let from = times.iter().rev().find(|at| **at <= fault).copied().unwrap_or(fault);
        let window: Vec<Instant> = times.iter().copied().filter(|at| *at >= from && *at <= after_settled).collect();
        let longest = window.windows(2).map(|pair| pair[1] - pair[0]).max().unwrap_or_default();
        // Stalled holders alone leave about a TTL without grants; list the longer gaps.
        let long_gaps: Vec<String> = window
            .windows(2)
            .filter(|pair| pair[1] - pair[0] > TTL + Duration::from_millis(500))
            .map(|pair| format!("{:.1}s-{:.1}s", secs(self.start, pair[0]), secs(self.start, pair[1])))
            .collect();
        eprintln!(
            "FAULT {name}: first grant {:.2}s after the fault; longest time without a grant {:.2}s \
             (looked at {:.1}s-{:.1}s; the fault at {:.1}s, settled at {:.1}s; gaps over {:.1}s: {long_gaps:?})",
            secs(fault, first_after),
            longest.as_secs_f64(),
            secs(self.start, from),
            secs(self.start, after_settled),
            secs(self.start, fault),
            secs(self.start, settled),
            (TTL + Duration::from_millis(500)).as_secs_f64(),
        );
    }

    /// The longest time without a grant among the grants so far (the baseline, before any fault).
    fn longest_gap(&self) -> Duration {
        self.shared.grant_times().windows(2).map(|pair| pair[1] - pair[0]).max().unwrap_or_default()
    }

    async fn inspect(&self, node: usize, format: &str) -> String {
        docker(&["inspect", "--format", format, self.project.container(node)]).await.trim().to_string()
    }
}

// ----- the test -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine; tests/run runs it when one answers"]
async fn a_compose_cluster_keeps_fences_safe_through_kills_partitions_and_restarts() {
    let start = Instant::now();
    let root = repo_root();

    // The image, from this build's binary, through the same scripts a developer uses.
    let built = run(
        &root.join("cluster/image.sh").display().to_string(),
        &[env!("CARGO_BIN_EXE_holdfast")],
        &[("HOLDFAST_IMAGE".into(), IMAGE.into())],
    )
    .await;
    eprint!("{built}");
    let size: u64 = docker(&["image", "inspect", "--format", "{{.Size}}", IMAGE]).await.trim().parse().expect("size");
    assert!(size < 100 << 20, "the image is {size} bytes; it should hold little more than the binary");

    let mut project = Project::new();
    let http = reqwest::Client::builder()
        // A proxy from the environment must not see requests to 127.0.0.1.
        .no_proxy()
        .connect_timeout(CONNECT_TIMEOUT)
        // A pooled connection to a container that was killed would only fail the next request.
        .pool_max_idle_per_host(0)
        .build()
        .expect("build the HTTP client");
    project.compose(&["up", "-d"]).await;
    for node in 1..=NODES {
        let service = format!("holdfast-{node}");
        let id = project.compose(&["ps", "-q", &service]).await.trim().to_string();
        assert!(!id.is_empty(), "no container for {service}");
        project.containers.push(id);
    }
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        resource: Mutex::new(Resource::default()),
        grants: Mutex::new(Vec::new()),
        tally: Mutex::new(Tally::default()),
        unexpected: Mutex::new(Vec::new()),
    });
    let h = Harness { project, http: http.clone(), shared: shared.clone(), start };
    h.event(&format!("project {} up on ports {:?}", h.project.name, h.project.ports));
    h.wait_all_ready(START_BOUND).await;
    h.event("every node is ready");

    // What the image promises: it runs as nonroot, and its nodes found each other by name (the member
    // list holds service names), so name resolution works inside the containers.
    for node in 1..=NODES {
        assert_eq!(h.inspect(node, "{{.Config.User}}").await, "65532:65532", "node {node} must run as nonroot");
    }

    let clients: Vec<_> =
        (0..CLIENTS).map(|id| tokio::spawn(client(id, http.clone(), h.project.urls(), shared.clone()))).collect();
    h.grants_reach(GRANTS_BEFORE_FAULTS, RECOVERY_BOUND, "the first grants").await;
    h.event(&format!(
        "{} grants before any fault; longest time without a grant so far {:.2}s (stalled holders cause ~{:.1}s)",
        shared.grants_count(),
        h.longest_gap().as_secs_f64(),
        TTL.as_secs_f64()
    ));

    // Each fault's moment is taken when its docker command has returned: grants that arrive while the
    // command runs may still come from before the fault took effect.

    // (a) The leader's container is killed (SIGKILL), then started again.
    let (leader, term) = h.leader().await;
    h.event(&format!("(a) killing node {leader}, the leader in term {term}"));
    docker(&["kill", "--signal", "KILL", h.project.container(leader)]).await;
    let fault = Instant::now();
    h.grant_after(fault, RECOVERY_BOUND, "a grant after the leader was killed").await;
    let (new_leader, term) = h.leader().await;
    h.event(&format!("(a) granted again without node {leader}, node {new_leader} leads in term {term}; starting it"));
    docker(&["start", h.project.container(leader)]).await;
    h.wait_ready(leader, READY_BOUND).await;
    let settled = Instant::now();
    let after = h.grant_after(settled, RECOVERY_BOUND, "a grant after the killed node came back").await;
    let (new_leader, term) = h.leader().await;
    h.event(&format!("(a) node {leader} is back and ready; node {new_leader} leads in term {term}"));
    h.report("(a) kill -9 the leader", fault, settled, after);

    // (b) The leader's container is cut off the network, then connected again (with its aliases, so that
    // the others find it by name again).
    let (leader, term) = h.leader().await;
    let container = h.project.container(leader).to_string();
    let networks: Value = serde_json::from_str(&h.inspect(leader, "{{json .NetworkSettings.Networks}}").await)
        .expect("the networks of a container as JSON");
    let networks = networks.as_object().expect("a map of networks");
    assert_eq!(networks.len(), 1, "node {leader} should be on the one network of the project: {networks:?}");
    let (network, settings) = networks.iter().next().expect("one network");
    let aliases: Vec<String> = settings["Aliases"]
        .as_array()
        .map(|list| list.iter().filter_map(|alias| alias.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    assert!(
        aliases.contains(&format!("holdfast-{leader}")),
        "node {leader}'s aliases {aliases:?} should hold its service name"
    );
    h.event(&format!("(b) disconnecting node {leader}, the leader in term {term}, from {network}"));
    docker(&["network", "disconnect", network, &container]).await;
    let fault = Instant::now();
    h.grant_after(fault, RECOVERY_BOUND, "a grant after the leader was cut off").await;
    let (new_leader, term) = h.leader().await;
    h.event(&format!(
        "(b) granted again without node {leader}, node {new_leader} leads in term {term}; reconnecting it"
    ));
    let mut connect = vec!["network", "connect"];
    for alias in &aliases {
        connect.extend(["--alias", alias.as_str()]);
    }
    connect.extend([network.as_str(), container.as_str()]);
    docker(&connect).await;
    h.wait_ready(leader, READY_BOUND).await;
    let settled = Instant::now();
    let after = h.grant_after(settled, RECOVERY_BOUND, "a grant after the cut-off node came back").await;
    let (new_leader, term) = h.leader().await;
    h.event(&format!("(b) node {leader} is back and ready; node {new_leader} leads in term {term}"));
    h.report("(b) cut the leader off the network", fault, settled, after);

    // (c) A rolling restart: each node in turn is stopped (SIGTERM) and started, and is ready again, with a
    // leader and a grant, before the next one goes. A stop's moment is when it is asked for: the node
    // stops serving at once.
    let whole = Instant::now();
    let mut after = whole;
    for node in 1..=NODES {
        let (leader, term) = h.leader().await;
        h.event(&format!("(c) restarting node {node}; node {leader} leads in term {term}"));
        let fault = Instant::now();
        let timeout = STOP_TIMEOUT_S.to_string();
        docker(&["stop", "-t", &timeout, h.project.container(node)]).await;
        let took = fault.elapsed();
        let code = h.inspect(node, "{{.State.ExitCode}}").await;
        h.event(&format!("(c) node {node} stopped in {:.2}s with exit code {code}", took.as_secs_f64()));
        assert_eq!(code, "0", "node {node} must exit 0 on SIGTERM (it took {took:?})");
        docker(&["start", h.project.container(node)]).await;
        h.wait_ready(node, READY_BOUND).await;
        let settled = Instant::now();
        after = h.grant_after(settled, RECOVERY_BOUND, &format!("a grant after node {node} was restarted")).await;
        let (leader, term) = h.leader().await;
        h.event(&format!("(c) node {node} is ready again; node {leader} leads in term {term}"));
        h.report(&format!("(c) restart node {node} of {NODES}"), fault, settled, after);
    }
    h.report("(c) rolling restart, all of it", whole, after, after);

    // The image's HEALTHCHECK (`holdfast healthcheck` against the health port) passes on every node,
    // while the clients go on.
    wait_for(HEALTHY_BOUND, "every container to be healthy", async || {
        let mut states = Vec::new();
        for node in 1..=NODES {
            states.push(h.inspect(node, "{{.State.Health.Status}}").await);
        }
        if states.iter().all(|state| state == "healthy") {
            Ok(())
        } else {
            Err(format!("{states:?}"))
        }
    })
    .await;
    h.event("every container is healthy");
    let count = shared.grants_count() + GRANTS_AFTER_FAULTS;
    h.grants_reach(count, RECOVERY_BOUND, "grants after the faults").await;

    shared.stop.store(true, Ordering::SeqCst);
    for task in clients {
        tokio::time::timeout(CLIENT_STOP_BOUND, task)
            .await
            .unwrap_or_else(|_| panic!("a client did not stop within {CLIENT_STOP_BOUND:?}"))
            .expect("a client task panicked");
    }
    h.event("clients stopped");

    check_history(&shared);
    h.event(&format!("done in {:.1}s", start.elapsed().as_secs_f64()));
}

/// The safety checks over everything the clients and the resource saw.
fn check_history(shared: &Shared) {
    let grants = shared.grants.lock().unwrap();
    let resource = shared.resource.lock().unwrap();
    let tally = shared.tally.lock().unwrap();

    // First what happened, then the checks.
    let per_client: Vec<usize> = (0..CLIENTS).map(|id| grants.iter().filter(|g| g.client == id).count()).collect();
    let writes =
        |accepted: bool| resource.log.iter().filter(move |op| op.kind == OpKind::Write && op.accepted == accepted);
    let accepted_writes = writes(true).count() as u64;
    let refused_writes = writes(false).count();
    let stale_refused = writes(false).filter(|op| op.stalled).count();
    let stale_accepted = writes(true).filter(|op| op.stalled).count();
    let refused_reads = resource.log.iter().filter(|op| op.kind == OpKind::Read && !op.accepted).count();
    eprintln!(
        "history: {} grants (per client {per_client:?}; {} busy answers, {} unavailable tries); counter {} after \
         {accepted_writes} accepted writes; {refused_writes} writes refused ({stale_refused} after a stall), \
         {refused_reads} reads refused; {stale_accepted} stalled writes accepted (nobody had taken the lock)",
        tally.granted, tally.busy, tally.unavailable, resource.value,
    );
    let unexpected = shared.unexpected.lock().unwrap();
    assert!(unexpected.is_empty(), "answers no client should get: {unexpected:#?}");

    // Grants: every fence and every token is unique, across all clients.
    let mut by_fence: HashMap<u64, &GrantRecord> = HashMap::new();
    for grant in grants.iter() {
        if let Some(other) = by_fence.insert(grant.fence, grant) {
            panic!("two grants with fence {}: {other:?} and {grant:?}", grant.fence);
        }
    }
    let tokens: HashSet<&str> = grants.iter().map(|g| g.token.as_str()).collect();
    assert_eq!(tokens.len(), grants.len(), "a token was granted twice");

    // The resource: the fences it accepted never went down, and each accepted fence belongs to one grant.
    let accepted: Vec<&Op> = resource.log.iter().filter(|op| op.accepted).collect();
    for pair in accepted.windows(2) {
        assert!(
            pair[1].fence >= pair[0].fence,
            "the resource accepted fence {} after fence {}: {:?} after {:?}",
            pair[1].fence,
            pair[0].fence,
            pair[1],
            pair[0]
        );
    }
    let mut token_of: HashMap<u64, &str> = HashMap::new();
    for op in &accepted {
        let token = *token_of.entry(op.fence).or_insert(op.token.as_str());
        assert_eq!(token, op.token, "the resource accepted two grants' operations under fence {}", op.fence);
        let grant = by_fence.get(&op.fence).unwrap_or_else(|| panic!("fence {} was never granted: {op:?}", op.fence));
        assert_eq!(grant.token, op.token, "fence {} was granted with another token: {op:?}", op.fence);
    }

    // No lost update: the counter is the number of accepted increments.
    assert_eq!(resource.value, accepted_writes, "lost update: the counter does not count every accepted increment");
    // The run exercised the fence: a stalled holder came back to a resource that had moved on.
    assert!(
        stale_refused > 0,
        "no stalled holder was refused: the run did not exercise the fence (or the resource accepts stale fences)"
    );
    assert!(per_client.iter().all(|&n| n > 0), "every client should have been granted the lock: {per_client:?}");
}
