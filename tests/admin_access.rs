//! Who may call what: walks the table "Who may call what" in docs/security.md against a real node, cell by
//! cell, from loopback and from another network namespace, under each of the four settings the table has.
//!
//! The node runs in a network namespace of the test's own (a veth pair with a /30 of its own; nothing
//! leaves the machine), listening on 0.0.0.0 there. A caller on its loopback is a thread that entered the
//! namespace (`setns`); a remote caller is the test itself, in the host's namespace, whose connections
//! arrive from the veth's address. Making a namespace needs root, so the test is ignored by default and
//! `tests/run` runs it when it is root and has `ip` (it installs iproute2 when missing).

use std::fs::File;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use holdfast_proto::v1::{self, LocksClient};
use tokio_stream::StreamExt;

use crate::common;

const ADMIN_KEY: &str = "admin-access-test-key-0123";
const CLIENT_PORT: u16 = 7070;
const BOUND: Duration = Duration::from_secs(30);
/// The sentence the node logs at start when its client port is open beyond loopback with no key at all.
const OPEN_WARNING: &str = "reachable beyond loopback with neither --auth nor --admin-key";

/// The four settings the table has columns for, in the order of its columns.
const SETTINGS: [&[&str]; 4] = [&[], &["--auth"], &["--admin-key", ADMIN_KEY], &["--auth", "--admin-key", ADMIN_KEY]];

/// Who the table says may call an endpoint under one setting.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Who {
    Anyone,
    Loopback,
    ApiKey,
    AdminKey,
    Nobody,
}

impl Who {
    fn parse(cell: &str) -> Who {
        match cell.trim() {
            "anyone" => Who::Anyone,
            "loopback" => Who::Loopback,
            "API key" => Who::ApiKey,
            "admin key" => Who::AdminKey,
            "nobody" => Who::Nobody,
            other => panic!("docs/security.md: {other:?} is not one of the table's words"),
        }
    }
}

/// One row of the table: an HTTP endpoint, a gRPC method, or both, and who may call them per setting.
#[derive(Debug)]
struct Row {
    http: Option<String>,
    grpc: Option<String>,
    who: [Who; 4],
}

/// The rows of the table under "## Who may call what" in docs/security.md.
fn table() -> Vec<Row> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/security.md");
    let doc = std::fs::read_to_string(&path).expect("read docs/security.md");
    let section = doc.split("## Who may call what").nth(1).expect("docs/security.md has \"Who may call what\"");
    let code = |cell: &str| {
        let cell = cell.trim();
        (!cell.is_empty()).then(|| cell.trim_matches('`').to_owned())
    };
    let rows: Vec<Row> = section
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2) // the header and its rule
        .map(|line| {
            let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
            assert_eq!(cells.len(), 6, "docs/security.md: a row of the table has 6 cells: {line}");
            Row { http: code(cells[0]), grpc: code(cells[1]), who: [2, 3, 4, 5].map(|i| Who::parse(cells[i])) }
        })
        .collect();
    assert!(rows.len() >= 10, "docs/security.md: the table has its rows: {rows:?}");
    rows
}

// --- the namespace ---

/// A network namespace with a veth pair to the host's: removed (with the pair) when dropped.
struct Netns {
    name: String,
    /// The host's end of the pair: what a remote caller's connections come from.
    host_ip: String,
    /// The namespace's end: where the node is reached from the host.
    inner_ip: String,
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("run ip");
    assert!(status.success(), "ip {}: {status}", args.join(" "));
}

impl Netns {
    fn create() -> Netns {
        let pid = std::process::id();
        // A /30 of 10.250.0.0/16 picked by the process id, so that two runs at once do not collide.
        let base = (pid % 16_384) * 4;
        let addr = |last: u32| format!("10.250.{}.{}", base / 256, base % 256 + last);
        let netns = Netns { name: format!("hf-admin-{pid}"), host_ip: addr(1), inner_ip: addr(2) };
        let (host_end, inner_end) = (format!("hfa{pid}h"), format!("hfa{pid}n"));
        ip(&["netns", "add", &netns.name]);
        ip(&["link", "add", &host_end, "type", "veth", "peer", "name", &inner_end]);
        ip(&["link", "set", &inner_end, "netns", &netns.name]);
        ip(&["addr", "add", &format!("{}/30", netns.host_ip), "dev", &host_end]);
        ip(&["link", "set", &host_end, "up"]);
        let inside = |args: &[&str]| ip(&[&["netns", "exec", &netns.name, "ip"], args].concat());
        inside(&["addr", "add", &format!("{}/30", netns.inner_ip), "dev", &inner_end]);
        inside(&["link", "set", &inner_end, "up"]);
        inside(&["link", "set", "lo", "up"]);
        netns
    }

    /// Runs `f` on a thread of its own inside the namespace: every socket it makes is the namespace's.
    fn inside<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let handle = File::open(format!("/var/run/netns/{}", self.name)).expect("open the namespace");
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: setns on this thread only, with a namespace file we hold open.
                    let entered = unsafe { libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) };
                    assert_eq!(entered, 0, "setns: {}", std::io::Error::last_os_error());
                    f()
                })
                .join()
                .expect("the thread inside the namespace")
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// Runs `future` on a runtime of its own (on the calling thread, and so in its namespace).
fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(future)
}

// --- the node ---

struct Node {
    child: Child,
    log: PathBuf,
}

impl Node {
    /// Starts a node inside `netns` with `flags`, on `data_dir`, and waits until it is ready.
    fn start(netns: &Netns, data_dir: &Path, log: PathBuf, flags: &[&str]) -> Node {
        let stderr = File::create(&log).expect("create the node's log");
        let child = Command::new("ip")
            .args(["netns", "exec", &netns.name, env!("CARGO_BIN_EXE_holdfast"), "server", "--id", "1"])
            .args(["--members", "1=127.0.0.1:7071", "--peer-addr", "127.0.0.1:7071"])
            .arg("--client-addr")
            .arg(format!("0.0.0.0:{CLIENT_PORT}"))
            .arg("--data-dir")
            .arg(data_dir)
            .args(flags)
            .env("RUST_LOG", "info,openraft=warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(stderr.try_clone().unwrap())
            .stderr(stderr)
            .spawn()
            .expect("start a node in the namespace");
        let node = Node { child, log };
        let ready = netns.inside(|| {
            block_on(async {
                let http = http_client();
                let deadline = Instant::now() + BOUND;
                while Instant::now() < deadline {
                    let url = format!("http://127.0.0.1:{CLIENT_PORT}/readyz");
                    if http.get(&url).send().await.is_ok_and(|r| r.status().is_success()) {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                false
            })
        });
        assert!(ready, "the node became ready with {flags:?}; its log:\n{}", node.log_text());
        node
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn stop(mut self) {
        // SAFETY: a signal to our own child (ip execs into the node, so this is the node's pid).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().expect("the node stops");
        assert!(status.success(), "the node stopped cleanly: {status}; its log:\n{}", self.log_text());
    }
}

fn http_client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(BOUND).build().unwrap()
}

// --- calls ---

/// What a caller presents.
#[derive(Debug, Clone, Copy)]
enum Credential<'a> {
    None,
    ApiKey(&'a str),
    AdminKey,
}

impl Credential<'_> {
    fn bearer(&self) -> Option<String> {
        match self {
            Credential::None => None,
            Credential::ApiKey(key) => Some(format!("Bearer {key}")),
            Credential::AdminKey => Some(format!("Bearer {ADMIN_KEY}")),
        }
    }
}

/// Whether a call was let through (any answer but a refusal), with what it was answered, for messages.
#[derive(Debug)]
struct Answer {
    allowed: bool,
    said: String,
}

/// Calls the HTTP endpoint `endpoint` ("METHOD /path" as the table has it) at `addr`, with requests that
/// fail fast past the access check when allowed (a lock that is not held, a member id 0).
async fn call_http(addr: SocketAddr, endpoint: &str, credential: Credential<'_>) -> Answer {
    let (method, path) = endpoint.split_once(' ').expect("METHOD /path");
    let path = match (method, path) {
        ("POST", "/v1/locks/{name}") => "/v1/locks/admin-access?ttl=60s".to_owned(),
        ("POST", "/v1/locks/{name}/renew") => format!("/v1/locks/admin-access/renew?token={}", "0".repeat(32)),
        ("DELETE", "/v1/locks/{name}") => format!("/v1/locks/not-held?token={}", "0".repeat(32)),
        ("GET", "/v1/locks/{name}") => "/v1/locks/admin-access".to_owned(),
        ("DELETE", "/v1/keys/{tenant}") => "/v1/keys/0000000000000001".to_owned(),
        ("POST", "/v1/cluster/members") => "/v1/cluster/members?id=0&addr=nowhere".to_owned(),
        ("DELETE", "/v1/cluster/members/{id}") => "/v1/cluster/members/99".to_owned(),
        (_, path) if !path.contains('{') => path.to_owned(),
        _ => panic!("the test does not know how to call {endpoint}: teach call_http"),
    };
    let mut request = http_client().request(method.parse().unwrap(), format!("http://{addr}{path}"));
    if let Some(bearer) = credential.bearer() {
        request = request.header("authorization", bearer);
    }
    let reply = request.send().await.unwrap_or_else(|e| panic!("{endpoint} answers: {e}"));
    let status = reply.status().as_u16();
    let body = reply.text().await.unwrap_or_default();
    Answer { allowed: status != 401 && status != 403, said: format!("{status} {body}") }
}

/// Calls the gRPC method `method` at `addr`, as [`call_http`] does.
async fn call_grpc(addr: SocketAddr, method: &str, credential: Credential<'_>) -> Answer {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    fn request<T>(message: T, credential: Credential<'_>) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(bearer) = credential.bearer() {
            request.metadata_mut().insert("authorization", bearer.parse().unwrap());
        }
        request
    }
    let mut client = LocksClient::new(channel.clone());
    let answer: Result<String, tonic::Status> = match method {
        "Acquire" => {
            let acquire = v1::AcquireRequest { name: "admin-access-grpc".into(), ttl_ms: 60_000, ..Default::default() };
            client.acquire(request(acquire, credential)).await.map(|r| format!("{:?}", r.into_inner()))
        }
        "Renew" => {
            let renew = v1::RenewRequest { name: "admin-access-grpc".into(), token: "0".repeat(32), ttl_ms: 0 };
            client.renew(request(renew, credential)).await.map(|r| format!("{:?}", r.into_inner()))
        }
        "Release" => {
            let release = v1::ReleaseRequest { name: "not-held".into(), token: "0".repeat(32) };
            client.release(request(release, credential)).await.map(|r| format!("{:?}", r.into_inner()))
        }
        "Get" => {
            let get = v1::GetRequest { name: "admin-access-grpc".into() };
            client.get(request(get, credential)).await.map(|r| format!("{:?}", r.into_inner()))
        }
        "List" => {
            client.list(request(v1::ListRequest::default(), credential)).await.map(|r| format!("{:?}", r.into_inner()))
        }
        "Session" => {
            let open = v1::Open { owner: "admin-access".into(), lease_ms: 5_000 };
            let first = v1::SessionRequest { kind: Some(v1::RequestKind::Open(open)) };
            let close = v1::SessionRequest { kind: Some(v1::RequestKind::Close(v1::Close {})) };
            match client.session(request(tokio_stream::iter([first, close]), credential)).await {
                Ok(events) => match events.into_inner().next().await {
                    Some(Ok(event)) => Ok(format!("{event:?}")),
                    Some(Err(status)) => Err(status),
                    None => Ok("the stream ended".into()),
                },
                Err(status) => Err(status),
            }
        }
        "Calls" => {
            let get = v1::Call { id: 1, kind: Some(v1::CallKind::Get(v1::GetRequest { name: "x".into() })) };
            match client.calls(request(tokio_stream::iter([get]), credential)).await {
                Ok(results) => match results.into_inner().next().await {
                    Some(Ok(result)) => Ok(format!("{result:?}")),
                    Some(Err(status)) => Err(status),
                    None => Ok("the stream ended".into()),
                },
                Err(status) => Err(status),
            }
        }
        "ClusterStatus" => client
            .cluster_status(request(v1::ClusterStatusRequest {}, credential))
            .await
            .map(|r| format!("{:?}", r.into_inner())),
        "AddMember" => {
            let add = v1::AddMemberRequest { id: 0, addr: "nowhere".into() };
            client.add_member(request(add, credential)).await.map(|r| format!("{:?}", r.into_inner()))
        }
        "RemoveMember" => client
            .remove_member(request(v1::RemoveMemberRequest { id: 99 }, credential))
            .await
            .map(|r| format!("{:?}", r.into_inner())),
        "Snapshot" => {
            client.snapshot(request(v1::SnapshotRequest {}, credential)).await.map(|r| format!("{:?}", r.into_inner()))
        }
        "grpc.health.v1.Health/Check" => {
            let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
            let check = tonic_health::pb::HealthCheckRequest { service: String::new() };
            health.check(request(check, credential)).await.map(|r| format!("{:?}", r.into_inner()))
        }
        other => panic!("the test does not know how to call gRPC {other}: teach call_grpc"),
    };
    match answer {
        Ok(said) => Answer { allowed: true, said },
        Err(status) => {
            let refused = matches!(status.code(), tonic::Code::Unauthenticated | tonic::Code::PermissionDenied);
            Answer { allowed: !refused, said: format!("{:?}: {}", status.code(), status.message()) }
        }
    }
}

async fn call(addr: SocketAddr, row: &Row, credential: Credential<'_>) -> Vec<(String, Answer)> {
    let mut answers = Vec::new();
    if let Some(endpoint) = &row.http {
        answers.push((endpoint.clone(), call_http(addr, endpoint, credential).await));
    }
    if let Some(method) = &row.grpc {
        answers.push((format!("gRPC {method}"), call_grpc(addr, method, credential).await));
    }
    answers
}

/// Where a call comes from.
#[derive(Debug, Clone, Copy)]
enum Origin {
    Loopback,
    Remote,
}

/// Checks every row of the table under the setting of column `column` (0-3), from loopback and remote,
/// with no credential, the admin key and a tenant's key (where the setting has them).
fn check_column(netns: &Netns, rows: &[Row], column: usize, api_key: Option<&str>) {
    let flags = SETTINGS[column];
    let admin_key_set = flags.contains(&"--admin-key");
    let mut credentials = vec![Credential::None];
    if admin_key_set {
        credentials.push(Credential::AdminKey);
    }
    if let Some(key) = api_key {
        credentials.push(Credential::ApiKey(key));
    }
    let remote_addr: SocketAddr = format!("{}:{CLIENT_PORT}", netns.inner_ip).parse().unwrap();
    let loopback_addr: SocketAddr = format!("127.0.0.1:{CLIENT_PORT}").parse().unwrap();
    for row in rows {
        let who = row.who[column];
        for from in [Origin::Loopback, Origin::Remote] {
            for &credential in &credentials {
                let answers = match from {
                    Origin::Loopback => netns.inside(|| block_on(call(loopback_addr, row, credential))),
                    Origin::Remote => block_on(call(remote_addr, row, credential)),
                };
                let expected = match (who, from, credential) {
                    (Who::Anyone, ..) => true,
                    (Who::Loopback, Origin::Loopback, _) => true,
                    (Who::Loopback, Origin::Remote, _) => false,
                    (Who::ApiKey, _, Credential::ApiKey(_)) => true,
                    (Who::ApiKey, ..) => false,
                    (Who::AdminKey, _, Credential::AdminKey) => true,
                    (Who::AdminKey, ..) => false,
                    (Who::Nobody, ..) => false,
                };
                for (what, answer) in answers {
                    assert_eq!(
                        answer.allowed, expected,
                        "{what} under {flags:?} from {from:?} with {credential:?}: the table says {who:?}; \
                         answered {}",
                        answer.said
                    );
                }
            }
        }
    }
}

/// Makes a tenant's key with the admin key (under `--auth --admin-key`).
fn make_api_key(netns: &Netns) -> String {
    netns.inside(|| {
        block_on(async {
            let reply = http_client()
                .post(format!("http://127.0.0.1:{CLIENT_PORT}/v1/signup"))
                .bearer_auth(ADMIN_KEY)
                .send()
                .await
                .expect("signup answers");
            assert_eq!(reply.status(), 200, "the admin makes a key");
            let body: serde_json::Value = reply.json().await.unwrap();
            body["api_key"].as_str().expect("an api_key").to_owned()
        })
    })
}

#[test]
#[ignore = "makes a network namespace (root, iproute2): tests/run runs it with --ignored when it can"]
fn every_cell_of_the_access_table_holds_from_loopback_and_from_another_host() {
    let rows = table();
    let netns = Netns::create();
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    // `--auth --admin-key` first, to make a tenant's key that the `--auth` column uses after it (the node
    // keeps its data across the restarts).
    let mut api_key = None;
    for column in [3, 1, 2, 0] {
        let flags = SETTINGS[column];
        let node = Node::start(&netns, &data_dir, dir.path().join(format!("node-{column}.log")), flags);
        if column == 3 {
            api_key = Some(make_api_key(&netns));
        }
        let auth = flags.contains(&"--auth");
        check_column(&netns, &rows, column, api_key.as_deref().filter(|_| auth));
        // The warning at start: exactly when nothing guards a port open beyond loopback.
        let warned = node.log_text().contains(OPEN_WARNING);
        assert_eq!(warned, flags.is_empty(), "the open-port warning under {flags:?}; the log:\n{}", node.log_text());
        node.stop();
    }
}

/// The rule the table's test relies on, checked without a namespace: from loopback, admin calls without an
/// admin key are accepted; with a key set they need it there too. (The namespace test above shows the
/// remote side.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_from_loopback_need_the_admin_key_only_when_one_is_set() {
    let open = common::Cluster::start(1).await;
    let snapshot = format!("{}/v1/cluster/snapshot", open.client_url(1));
    open.send(open.http().post(&snapshot), "snapshot from loopback, no key set").await.ok("snapshot");
    let keyed = common::Cluster::start_with(1, &["--admin-key", ADMIN_KEY]).await;
    let snapshot = format!("{}/v1/cluster/snapshot", keyed.client_url(1));
    let refused = keyed.send(keyed.http().post(&snapshot), "snapshot from loopback without the key").await;
    refused.assert_problem(401, "unauthenticated", "snapshot from loopback without the key");
    keyed.send(keyed.http().post(&snapshot).bearer_auth(ADMIN_KEY), "snapshot with the key").await.ok("snapshot");
}
