//! Fuzz targets for what a node parses from its clients (issue 33): the HTTP/JSON front and the gRPC front
//! of the client port, each against one real node started in this process (sled on a temporary
//! directory, listeners on 127.0.0.1:0).
//!
//! - HTTP: requests written byte by byte on a TCP connection (so that nothing is normalised or refused on
//!   the client's side): every method, every endpoint and made-up paths, lock names that are valid, too
//!   long, empty, with slashes, percent escapes (invalid UTF-8 among them), control characters and unicode,
//!   query strings with known, unknown, repeated and malformed parameters, `Content-Type` and
//!   `Authorization` headers, and random bodies. Every answer must be a success with a JSON body, or a
//!   well-formed `application/problem+json` (the documented plain-text health answers aside); never a 5xx
//!   but the documented 503; and a refused request must leave the lock table as it was.
//! - gRPC: valid messages of every method of `holdfast.v1.Locks` with random field values, encoded, then
//!   often truncated or mutated, and framed (sometimes wrongly) by hand, so that malformed protobuf reaches
//!   the server. Every answer must be a success that decodes, or a status with a code from the list at the
//!   top of `locks.proto` and a `holdfast-problem` entry; a refused call must change nothing.
//!
//! Every case is bounded ([`BOUND`]: a hang is a failure), and after every case the node must still answer
//! `/livez`, its task must still run, and none of its threads may have panicked. The node's limits keep the
//! run free of time: no hold or session expires while it lasts (the shortest TTL is an hour), and no
//! request may wait long (at most [`WAIT_MS_MAX`]). It has an admin key, which cases never send to the
//! membership calls, so that no case can change the membership.
//!
//! Each target runs [`CASES_DEFAULT`] cases; `HOLDFAST_FUZZ_CASES=N` runs `N` per target (for hours, in a
//! release build: `HOLDFAST_FUZZ_CASES=100000 cargo test -p holdfast-server --test fuzz_fronts --release`).
//! A failure is shrunk and its case saved in `fuzz_fronts.proptest-regressions`; an input that found a bug
//! is kept below as a test of its own, named for what it shows.

mod common;

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use holdfast_core::LockView;
use holdfast_proto::v1::{
    AcquireRequest, AddMemberRequest, Call, CallKind, CallResult, Cancel, Close, ClusterStatusRequest,
    ClusterStatusResponse, EventKind, GetRequest, Heartbeat, Hold, ListRequest, ListResponse, Lock, Open,
    ReleaseRequest, ReleaseResponse, RemoveMemberRequest, RenewRequest, RequestKind, ResultKind, Resume,
    SessionAcquire, SessionEvent, SessionRelease, SessionRequest, SnapshotRequest, SnapshotResponse,
};
use holdfast_server::{Config, Secret};
use holdfast_server::{FrontLimits, Node};
use proptest::prelude::*;
use proptest::sample::{select, Index};
use proptest::test_runner::{Config as RunnerConfig, FileFailurePersistence, TestCaseError, TestRunner};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::codegen::{http, Body as _, Service};
use tonic::transport::Channel;

/// Cases per target unless `HOLDFAST_FUZZ_CASES` says otherwise.
const CASES_DEFAULT: u32 = 256;

fn cases() -> u32 {
    match std::env::var("HOLDFAST_FUZZ_CASES") {
        Ok(n) => n.parse().expect("HOLDFAST_FUZZ_CASES is a number of cases"),
        Err(_) => CASES_DEFAULT,
    }
}

/// Bound on every request and every wait: generous for a loaded 2-core machine, and far beyond what any
/// request to this node may take (its longest wait is [`WAIT_MS_MAX`]).
const BOUND: Duration = Duration::from_secs(10);

/// The shortest TTL and session lease the node grants: an hour, so that nothing expires during a run.
const TTL_MS_MIN: u64 = 3_600_000;
const TTL_MS_MAX: u64 = 2 * TTL_MS_MIN;
/// The longest wait the node accepts, so that a random `wait` cannot stall a case.
const WAIT_MS_MAX: u64 = 200;
/// The node's bound on lock-delays (no hold expires in a run, so none takes effect).
const LOCK_DELAY_MS_MAX: u64 = 60_000;

const ADMIN_KEY: &str = "fuzz-admin-key";

/// gRPC codes a holdfast call may fail with: the list at the top of `locks.proto`.
const CODES_DOCUMENTED: [tonic::Code; 8] = [
    tonic::Code::InvalidArgument,
    tonic::Code::AlreadyExists,
    tonic::Code::FailedPrecondition,
    tonic::Code::NotFound,
    tonic::Code::PermissionDenied,
    tonic::Code::Unauthenticated,
    tonic::Code::ResourceExhausted,
    tonic::Code::Unavailable,
];

// --- the node ---

/// Names of the threads that panicked, for [`Fuzzed::check_alive`]: a handler's panic only ends its
/// connection's task, so the request just goes unanswered; the hook says where it came from.
static PANICKED: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn watch_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let name = std::thread::current().name().unwrap_or("unnamed").to_owned();
            PANICKED.lock().unwrap_or_else(|e| e.into_inner()).push(name);
            default(info);
        }));
    });
}

/// What the node handed out, so that cases can use it: holds (lock name and token; some since released),
/// and sessions with their secrets.
#[derive(Default)]
struct Known {
    holds: Vec<(String, String)>,
    sessions: Vec<(u64, String)>,
}

impl Known {
    fn hold(&self, i: &Index) -> Option<&(String, String)> {
        (!self.holds.is_empty()).then(|| &self.holds[i.index(self.holds.len())])
    }

    fn token(&self, i: &Index) -> String {
        self.hold(i).map_or_else(|| "0123456789abcdef0123456789abcdef".into(), |(_, token)| token.clone())
    }
}

/// Lock names cases pick from most often, so that they meet: busy answers, renews, releases, queues.
const NAMES: &[&str] = &["job-a", "job-b", "x", "A.b_c-d:e"];

/// One node, its own runtime, and what its cases learned from it.
struct Fuzzed {
    rt: tokio::runtime::Runtime,
    node: Arc<Node>,
    addr: String,
    /// The name of the runtime's threads: a panic on one of them is the node's.
    threads: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    known: Mutex<Known>,
    _dir: tempfile::TempDir,
}

/// Everything a client can observe of the lock state: the locks with holders and waiters, the sessions,
/// the API keys. (Not the state's clock and applied index, which a refused write moves on too.)
#[derive(Debug, PartialEq)]
struct Table {
    locks: Vec<LockView>,
    sessions: Vec<(u64, u64)>,
    keys: Vec<(u64, u64)>,
}

impl Fuzzed {
    fn start(label: &str) -> Fuzzed {
        watch_panics();
        let threads = format!("fuzz-node-{label}");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(threads.clone())
            .enable_all()
            .build()
            .expect("a runtime");
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().to_owned();
        let (addr, node, stop, task) = rt.block_on(async move {
            let client = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let peer = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = client.local_addr().unwrap().to_string();
            let config = Config {
                limits: FrontLimits {
                    ttl_ms_min: TTL_MS_MIN,
                    ttl_ms_max: TTL_MS_MAX,
                    wait_ms_max: WAIT_MS_MAX,
                    lock_delay_ms_max: LOCK_DELAY_MS_MAX,
                    overload_delay: holdfast_server::load::OVERLOAD_DELAY_DEFAULT,
                    // A share of the test runtime's time, which the tests' own work shares: never.
                    overload_busy: 1.0,
                },
                admin_key: Some(Secret(ADMIN_KEY.into())),
                ..common::one_node(peer.local_addr().unwrap().to_string(), data_dir.clone())
            };
            // As `holdfast_server::run` opens it, but through `serve`, which hands back the node: the cases
            // compare its lock state before and after each refused request.
            let storage = move |observer| {
                let options = holdfast_store::Options::default();
                holdfast_server::disk_storage(&data_dir, observer, 1, options)
            };
            let (started, node) = tokio::sync::oneshot::channel();
            // As `run` does: without TCP_NODELAY, every answer pushed on a stream waits ~40 ms for Nagle.
            let client = axum::serve::ListenerExt::tap_io(client, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let transport = holdfast_server::Transport {
                client,
                peer: tokio_stream::wrappers::TcpListenerStream::new(peer),
                health: None,
                tls: None,
                dialer: None,
                started: Some(started),
            };
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(holdfast_server::serve(config, storage, transport, async move {
                let _ = stopped.await;
            }));
            let node = tokio::time::timeout(BOUND, node).await.expect("the node starts in time").expect("it runs");
            let mut metrics = node.raft.metrics();
            // Readiness follows Raft's metrics alone on a single node: wait for them to change until it holds.
            tokio::time::timeout(BOUND, async {
                while node.api.readiness().is_err() {
                    metrics.changed().await.expect("raft runs");
                }
            })
            .await
            .expect("the node becomes ready");
            (addr, node, stop, task)
        });
        Fuzzed {
            rt,
            node,
            addr,
            threads,
            stop: Some(stop),
            task: Some(task),
            known: Mutex::new(Known::default()),
            _dir: dir,
        }
    }

    /// The lock table, with every lock's revision set to 0: a refused request may move a revision without
    /// changing anything else (a wait that ran out joined the queue and left it), and what moves a revision
    /// is the state machine's tests' to check, exactly.
    fn table(&self) -> Table {
        let state = self.node.state.read().expect("lock state poisoned");
        let locks = state.list("", None, usize::MAX).into_iter().map(|lock| LockView { revision: 0, ..lock });
        Table { locks: locks.collect(), sessions: state.sessions().collect(), keys: state.keys().collect() }
    }

    /// The node survived the case: it still answers `/livez`, its task runs, and none of its threads
    /// panicked.
    fn check_alive(&self) -> Result<(), TestCaseError> {
        let panicked: Vec<String> = PANICKED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|name| **name == self.threads)
            .cloned()
            .collect();
        prop_assert!(panicked.is_empty(), "the node panicked on {panicked:?}");
        prop_assert!(!self.task.as_ref().expect("running").is_finished(), "the node's task ended");
        let livez = b"GET /livez HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n";
        let answer = self.rt.block_on(http_raw(&self.addr, livez, false)).map_err(TestCaseError::fail)?;
        prop_assert_eq!(answer.status, 200, "/livez after the case");
        Ok(())
    }

    fn channel(&self) -> Channel {
        let url = format!("http://{}", self.addr);
        self.rt.block_on(async {
            let endpoint = tonic::transport::Endpoint::from_shared(url).expect("a URL");
            tokio::time::timeout(BOUND, endpoint.connect()).await.expect("connects in time").expect("connects")
        })
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().expect("not poisoned")
    }
}

impl Drop for Fuzzed {
    fn drop(&mut self) {
        let _ = self.stop.take().expect("once").send(());
        let task = self.task.take().expect("once");
        if !std::thread::panicking() {
            self.rt
                .block_on(async { tokio::time::timeout(BOUND, task).await })
                .expect("the node stops in time")
                .expect("its task did not panic")
                .expect("it stops cleanly");
        }
    }
}

/// Runs `cases()` cases of `strategy` through `case`, panicking with the shrunk input on a failure.
fn fuzz<S: Strategy>(strategy: S, case: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    let config = RunnerConfig {
        cases: cases(),
        source_file: Some(file!()),
        // Beside this file: proptest's default looks for a crate root above it, which a tests/ folder has not.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        // Each shrinking step is a request to a live node; a few hundred find the small input well enough.
        max_shrink_iters: 512,
        ..RunnerConfig::default()
    };
    let mut runner = TestRunner::new(config);
    if let Err(e) = runner.run(&strategy, case) {
        panic!("{e}");
    }
}

// --- HTTP: a raw client ---

#[derive(Debug)]
struct HttpAnswer {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

impl HttpAnswer {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_slice())
    }

    fn content_type(&self) -> &str {
        self.header("content-type").and_then(|v| std::str::from_utf8(v).ok()).unwrap_or("")
    }
}

/// Sends `request` (a whole HTTP/1.1 request with `Connection: close`) and reads the answer to the end.
/// `Err` when there is no answer in time, or none at all (the connection closed first).
async fn http_raw(addr: &str, request: &[u8], head: bool) -> Result<HttpAnswer, String> {
    let exchange = async {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
        tcp.write_all(request).await.map_err(|e| format!("write: {e}"))?;
        // The write side stays open: a server may take a half-closed connection for one that went away.
        let mut bytes = Vec::new();
        tcp.read_to_end(&mut bytes).await.map_err(|e| format!("read: {e}"))?;
        Ok::<_, String>(bytes)
    };
    let bytes = tokio::time::timeout(BOUND, exchange).await.map_err(|_| "no answer in time: a hang".to_owned())??;
    parse_answer(&bytes, head)
}

fn parse_answer(bytes: &[u8], head: bool) -> Result<HttpAnswer, String> {
    let end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no answer, or an answer without a head: {:?}", String::from_utf8_lossy(bytes)))?;
    let head_text = std::str::from_utf8(&bytes[..end]).map_err(|_| "the answer's head is not UTF-8".to_owned())?;
    let mut lines = head_text.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| format!("a bad status line {status_line:?}"))?;
    let mut headers = Vec::new();
    for line in lines {
        let (name, value) = line.split_once(':').ok_or_else(|| format!("a bad header line {line:?}"))?;
        headers.push((name.to_owned(), value.trim().as_bytes().to_vec()));
    }
    let rest = &bytes[end + 4..];
    let mut answer = HttpAnswer { status, headers, body: Vec::new() };
    if head || status == 204 || status == 304 {
        return Ok(answer);
    }
    if answer.header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case(b"chunked")) {
        answer.body = dechunk(rest)?;
    } else if let Some(len) = answer.header("content-length") {
        let len: usize = std::str::from_utf8(len).ok().and_then(|l| l.parse().ok()).ok_or("a bad content-length")?;
        if rest.len() < len {
            return Err(format!("the body ended after {} of {len} bytes", rest.len()));
        }
        answer.body = rest[..len].to_vec();
    } else {
        answer.body = rest.to_vec();
    }
    Ok(answer)
}

fn dechunk(mut bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let line_end = bytes.windows(2).position(|w| w == b"\r\n").ok_or("a chunk without a size line")?;
        let size = std::str::from_utf8(&bytes[..line_end]).ok().and_then(|s| usize::from_str_radix(s.trim(), 16).ok());
        let size = size.ok_or("a bad chunk size")?;
        bytes = &bytes[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        if bytes.len() < size + 2 {
            return Err("a chunk cut short".into());
        }
        body.extend_from_slice(&bytes[..size]);
        bytes = &bytes[size + 2..];
    }
}

// --- HTTP: requests ---

/// A query parameter's value: text as sent (already percent-encoded), or a token the node handed out.
#[derive(Debug, Clone)]
enum Value {
    Text(String),
    KnownToken(Index),
}

/// A query string: `None`, no `?`; otherwise the parameters, or a raw query string instead of them.
type Query = Option<Result<Vec<(String, Value)>, String>>;

#[derive(Debug, Clone)]
enum Auth {
    None,
    /// The admin key; sent as a wrong one to the membership calls (see the module's doc).
    Admin,
    Value(Vec<u8>),
}

#[derive(Debug, Clone)]
struct HttpCase {
    method: String,
    /// The request target's path, as sent.
    path: String,
    query: Query,
    content_type: Option<String>,
    auth: Auth,
    body: Vec<u8>,
    /// A hold the node granted, whose lock this case names instead (and whose token it sends for every
    /// known token), so that releases and renews meet the lock they hold.
    hold: Option<Index>,
}

impl HttpCase {
    /// The path as the router sees it, without an absolute form's scheme and host.
    fn route_path(&self) -> &str {
        self.path.strip_prefix("http://fuzz").unwrap_or(&self.path)
    }

    fn is_membership(&self) -> bool {
        self.route_path().starts_with("/v1/cluster/members")
    }

    fn render(&self, known: &Known) -> Vec<u8> {
        let hold = self.hold.as_ref().and_then(|i| known.hold(i));
        let mut target = self.path.clone();
        if let Some((name, _)) = hold.filter(|_| target.starts_with("/v1/locks/")) {
            let suffix = ["/renew", "/value"].into_iter().find(|suffix| target.ends_with(suffix)).unwrap_or("");
            target = format!("/v1/locks/{name}{suffix}");
        }
        match &self.query {
            None => {}
            Some(Err(raw)) => {
                target.push('?');
                target.push_str(raw);
            }
            Some(Ok(params)) => {
                target.push('?');
                let pairs: Vec<String> = params
                    .iter()
                    .map(|(key, value)| {
                        let value = match value {
                            Value::Text(text) => text.clone(),
                            Value::KnownToken(i) => match hold {
                                Some((_, token)) => token.clone(),
                                None => known.token(i),
                            },
                        };
                        format!("{key}={value}")
                    })
                    .collect();
                target.push_str(&pairs.join("&"));
            }
        }
        let mut bytes =
            format!("{} {target} HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n", self.method).into_bytes();
        if let Some(content_type) = &self.content_type {
            bytes.extend_from_slice(format!("Content-Type: {content_type}\r\n").as_bytes());
        }
        let authorization: Option<Vec<u8>> = match &self.auth {
            Auth::None => None,
            Auth::Admin if self.is_membership() => Some(b"Bearer not-the-admin-key".to_vec()),
            Auth::Admin => Some(format!("Bearer {ADMIN_KEY}").into_bytes()),
            Auth::Value(value) => Some(value.clone()),
        };
        if let Some(value) = authorization {
            bytes.extend_from_slice(b"Authorization: ");
            bytes.extend_from_slice(&value);
            bytes.extend_from_slice(b"\r\n");
        }
        bytes.extend_from_slice(format!("Content-Length: {}\r\n\r\n", self.body.len()).as_bytes());
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

/// Percent-encodes every byte of `bytes` that is not unreserved: any bytes at all reach the server.
fn percent_encode(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Pieces of a path segment or a query value that parsers get wrong: escaped slashes, invalid UTF-8
/// (a lone continuation byte, a cut sequence, an overlong `/`, a surrogate), control characters, malformed
/// escapes, dot segments, unicode.
const ODD_PIECES: &[&str] = &[
    "a%2Fb",
    "%2F",
    "%2f",
    "%ff",
    "%c3%28",
    "%00",
    "%0a",
    "%0d%0a",
    "%7f",
    "%1b",
    "%e2%82",
    "%f0%9f%92",
    "%c0%af",
    "%ed%a0%80",
    "%",
    "%zz",
    "%4",
    "%%",
    "..",
    ".",
    "%2e%2e",
    "%2E",
    "%c3%a9",
    "%e6%97%a5%e6%9c%ac",
    "%f0%9f%94%92",
    "a%20b",
    "+",
    "%2B",
    "%3F",
    "%23",
    "%25",
    "%26",
    "%3D",
    "%ef%bb%bf",
    "%e2%80%8b",
    "a:b",
    ";",
    "@",
    "!",
    "~",
];

/// One path segment (or query value), as sent.
fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => select(NAMES).prop_map(str::to_owned),
        3 => "[A-Za-z0-9._:-]{1,12}",
        1 => (195usize..210).prop_map(|n| "n".repeat(n)),
        1 => Just(String::new()),
        3 => select(ODD_PIECES).prop_map(str::to_owned),
        2 => proptest::collection::vec(
            prop_oneof![select(ODD_PIECES).prop_map(str::to_owned), "[A-Za-z0-9._:-]{1,4}"],
            1..5
        )
        .prop_map(|pieces| pieces.concat()),
        2 => "[A-Za-z0-9%._~:@!$'()*+,;=-]{0,24}",
        1 => proptest::collection::vec(any::<u8>(), 0..12).prop_map(|b| percent_encode(&b)),
        1 => "\\PC{1,6}".prop_map(|s| percent_encode(s.as_bytes())),
    ]
}

fn member_id() -> impl Strategy<Value = String> {
    prop_oneof![
        select(&["0", "1", "2", "7", "18446744073709551615", "18446744073709551616", "-1", "+1", "0x1"][..])
            .prop_map(str::to_owned),
        segment(),
    ]
}

fn tenant() -> impl Strategy<Value = String> {
    prop_oneof!["[0-9a-f]{16}", "[0-9A-Fa-f]{15,17}", segment()]
}

fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => Just("/v1/locks".to_owned()),
        8 => segment().prop_map(|s| format!("/v1/locks/{s}")),
        4 => segment().prop_map(|s| format!("/v1/locks/{s}/renew")),
        1 => Just("/v1/cluster".to_owned()),
        1 => Just("/v1/cluster/members".to_owned()),
        1 => member_id().prop_map(|s| format!("/v1/cluster/members/{s}")),
        1 => Just("/v1/cluster/snapshot".to_owned()),
        1 => Just("/v1/keys".to_owned()),
        1 => tenant().prop_map(|s| format!("/v1/keys/{s}")),
        1 => Just("/v1/signup".to_owned()),
        1 => select(&["/livez", "/readyz", "/metrics"][..]).prop_map(str::to_owned),
        1 => select(&[
            "/", "/v1", "/v1/", "/v1/locks/", "//v1/locks", "/v1//locks", "/v1/locks//renew", "/v1/locks/x/",
            "/v1/locks/x/renew/", "/v1/locks/x/release", "/V1/LOCKS", "/livez/", "/v1/cluster/members/",
            "/v1/keys/", "/v2/locks", "/v1/locks/%2E%2E/cluster", "/v1/locks/../cluster", "/./v1/locks",
            "http://fuzz/v1/locks", "http://fuzz/v1/locks/job-a", "http://fuzz/livez",
        ][..])
        .prop_map(str::to_owned),
        2 => (segment(), segment()).prop_map(|(a, b)| format!("/v1/locks/{a}/{b}")),
        2 => proptest::collection::vec(segment(), 0..4).prop_map(|s| format!("/{}", s.join("/"))),
    ]
}

/// TTLs and waits the node takes (an hour at least; a wait of at most 200 ms) and ones it must refuse.
const DURATIONS_VALID: &[&str] = &["1h", "90m", "2h", "3600", "7200", "1h30m", "0", "200ms", "0.2", "50ms"];
const DURATIONS_ODD: &[&str] = &[
    "2h1ms",
    "3600.5",
    "7201",
    "1",
    "0.5",
    "500ms",
    "-1",
    "1e400",
    "inf",
    "NaN",
    "1%20h",
    "",
    "%20",
    "99999999999999999999999",
    "1.5.5",
    "%ff",
    "5m",
    "201ms",
    "1d",
    "18446744073709551615ms",
    "3600000000000000000s",
    "1h%00",
    "+1h",
    "1h+",
    "%2B1h",
    "1H",
    "1hour",
    "60m0s",
    "٣",
];

fn duration_text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => select(DURATIONS_VALID).prop_map(str::to_owned),
        3 => select(DURATIONS_ODD).prop_map(str::to_owned),
        1 => "[0-9.a-z]{1,8}",
        1 => segment(),
    ]
}

fn token_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => any::<Index>().prop_map(Value::KnownToken),
        2 => "[0-9a-f]{32}".prop_map(Value::Text),
        1 => "[0-9A-F]{32}".prop_map(Value::Text),
        1 => "[0-9a-f]{31,33}".prop_map(Value::Text),
        1 => segment().prop_map(Value::Text),
    ]
}

/// Values for the parameter `key`: valid ones and ones it must refuse.
fn value_for(key: &str) -> BoxedStrategy<Value> {
    let text = |s: BoxedStrategy<String>| s.prop_map(Value::Text).boxed();
    match key {
        "ttl" | "wait" | "lock_delay" => text(duration_text().boxed()),
        "token" => token_value().boxed(),
        "owner" => text(
            prop_oneof![
                3 => select(&["worker-1", "", "a%20b", "a+b", "%c3%a9", "w%3Dx%26y"][..]).prop_map(str::to_owned),
                2 => select(&["%00", "%0a", "%7f", "%ff", "%c3%28", "%e2%80%8b", "%ed%a0%80"][..]).prop_map(str::to_owned),
                1 => (120usize..140).prop_map(|n| "o".repeat(n)),
                1 => segment(),
            ]
            .boxed(),
        ),
        "prefix" => text(prop_oneof![4 => segment(), 1 => (195usize..210).prop_map(|n| "p".repeat(n))].boxed()),
        // A lock name after which a list goes on, or a revision a watch waits past.
        "after" => text(
            prop_oneof![
                3 => segment(),
                1 => (195usize..210).prop_map(|n| "p".repeat(n)),
                2 => select(&["0", "1", "7", "18446744073709551615", "18446744073709551616", "-1", ""][..])
                    .prop_map(str::to_owned),
            ]
            .boxed(),
        ),
        "value" => text(
            prop_oneof![
                3 => select(&["10.0.0.1:7070", "", "a%20b", "%c3%a9", "%ff", "%00"][..]).prop_map(str::to_owned),
                1 => (1020usize..1030).prop_map(|n| "v".repeat(n)),
                1 => segment(),
            ]
            .boxed(),
        ),
        "limit" => text(
            prop_oneof![
                select(&["0", "1", "2", "100", "1000", "1001", "-1", "abc", "18446744073709551616", "1.5", "", "%31"][..])
                    .prop_map(str::to_owned),
                segment(),
            ]
            .boxed(),
        ),
        "id" => text(member_id().boxed()),
        "addr" => text(
            prop_oneof![
                select(&["h:1", "127.0.0.1:1", "%5B::1%5D:1", "", ":1", "h:", "h:99999", "h%3A1"][..])
                    .prop_map(str::to_owned),
                segment(),
            ]
            .boxed(),
        ),
        _ => text(segment().boxed()),
    }
}

const KEYS: &[&str] =
    &["ttl", "wait", "owner", "token", "prefix", "after", "limit", "id", "addr", "value", "lock_delay"];

/// Any parameter: one some endpoint takes, or an unknown one (a near miss of a known one among them).
fn param() -> impl Strategy<Value = (String, Value)> {
    let unknown = prop_oneof![
        select(&["", "TTL", "tt%6c", "ttl%00", "%ff", "t+tl", "owner[]", "a", "token%3D", "tll"][..])
            .prop_map(str::to_owned),
        "[a-z_]{1,8}",
        segment(),
    ];
    prop_oneof![
        3 => select(KEYS).prop_flat_map(|key| (Just(key.to_owned()), value_for(key))),
        1 => (unknown, segment().prop_map(Value::Text)),
    ]
}

/// A query string for an endpoint that takes `keys`: mostly its own parameters (some repeated), sometimes
/// any, sometimes a raw string.
fn query(keys: &'static [&'static str]) -> BoxedStrategy<Query> {
    let own = match keys {
        [] => param().boxed(),
        keys => prop_oneof![
            6 => select(keys).prop_flat_map(|key| (Just(key.to_owned()), value_for(key))),
            1 => param(),
        ]
        .boxed(),
    };
    prop_oneof![
        2 => Just(None),
        6 => proptest::collection::vec(own, 0..4).prop_map(|params| Some(Ok(params))),
        1 => raw_query().prop_map(|raw| Some(Err(raw))),
    ]
    .boxed()
}

fn raw_query() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9=&%+;._~-]{0,40}",
        select(
            &["", "&", "=", "&&", "==", "ttl", "ttl=", "=1h", "ttl==1h", "ttl=1h&", "&ttl=1h", "%", "%=%", "a=%zz"][..]
        )
        .prop_map(str::to_owned),
    ]
}

fn method() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => select(&["GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS"][..]).prop_map(str::to_owned),
        1 => select(&["TRACE", "CONNECT", "get", "post", "FOO", "PROPFIND"][..]).prop_map(str::to_owned),
        1 => "[A-Z]{1,10}",
    ]
}

/// A method, a path and the parameters its endpoint takes: mostly an endpoint with a method it takes (so
/// that cases get past the router), sometimes any method on any path.
fn endpoint() -> impl Strategy<Value = (String, String, &'static [&'static str])> {
    type Keys = &'static [&'static str];
    let own = |methods: &'static [&'static str], path: BoxedStrategy<String>, keys: Keys| {
        (select(methods), path).prop_map(move |(method, path)| (method.to_owned(), path, keys))
    };
    let fixed = |path: &'static str| Just(path.to_owned()).boxed();
    let lock = || segment().prop_map(|s| format!("/v1/locks/{s}")).boxed();
    prop_oneof![
        6 => own(&["POST"], lock(), &["ttl", "owner", "wait", "value", "lock_delay", "limit"]),
        3 => own(&["DELETE"], lock(), &["token"]),
        2 => own(&["GET", "HEAD"], lock(), &["after", "wait"]),
        2 => own(&["POST"], segment().prop_map(|s| format!("/v1/locks/{s}/value")).boxed(), &["token", "value"]),
        4 => own(&["POST"], segment().prop_map(|s| format!("/v1/locks/{s}/renew")).boxed(), &["token", "ttl"]),
        3 => own(&["GET", "HEAD"], fixed("/v1/locks"), &["prefix", "after", "limit"]),
        1 => own(&["GET", "HEAD"], fixed("/v1/cluster"), &[]),
        1 => own(&["POST"], fixed("/v1/cluster/members"), &["id", "addr"]),
        1 => own(&["DELETE"], member_id().prop_map(|s| format!("/v1/cluster/members/{s}")).boxed(), &[]),
        1 => own(&["POST"], fixed("/v1/cluster/snapshot"), &[]),
        1 => own(&["GET"], fixed("/v1/keys"), &[]),
        1 => own(&["DELETE"], tenant().prop_map(|s| format!("/v1/keys/{s}")).boxed(), &[]),
        1 => own(&["POST"], fixed("/v1/signup"), &[]),
        1 => own(&["GET", "HEAD"], select(&["/livez", "/readyz", "/metrics"][..]).prop_map(str::to_owned).boxed(), &[]),
        6 => (method(), path()).prop_map(|(method, path)| (method, path, KEYS)),
    ]
}

fn http_case() -> impl Strategy<Value = HttpCase> {
    let request = endpoint().prop_flat_map(|(method, path, keys)| (Just(method), Just(path), query(keys)));
    let content_type = prop_oneof![
        4 => Just(None),
        1 => select(&[
            "application/json", "text/plain", "application/x-www-form-urlencoded", "application/problem+json",
            "application/grpc", "multipart/form-data; boundary=x", "", "*/*",
        ][..])
        .prop_map(|s| Some(s.to_owned())),
        1 => "[ -~]{0,30}".prop_map(Some),
    ];
    let auth = prop_oneof![
        4 => Just(Auth::None),
        2 => Just(Auth::Admin),
        1 => select(&["Bearer wrong", "Bearer ", "Bearer", "Basic Zm9vOmJhcg==", "bearer fuzz-admin-key"][..])
            .prop_map(|s| Auth::Value(s.as_bytes().to_vec())),
        1 => "[ -~]{0,40}".prop_map(|s| Auth::Value(s.into_bytes())),
        // obs-text: bytes a header value may carry that are not ASCII.
        1 => proptest::collection::vec(0x80u8..=0xff, 1..8).prop_map(|b| Auth::Value([b"Bearer ".as_slice(), &b].concat())),
    ];
    let body = prop_oneof![
        4 => Just(Vec::new()),
        1 => proptest::collection::vec(any::<u8>(), 0..64),
        1 => Just(br#"{"ttl":"1h","owner":"json"}"#.to_vec()),
    ];
    (request, content_type, auth, body, proptest::option::weighted(0.4, any::<Index>())).prop_map(
        |((method, path, query), content_type, auth, body, hold)| HttpCase {
            method,
            path,
            query,
            content_type,
            auth,
            body,
            hold,
        },
    )
}

// --- HTTP: what every answer must be ---

fn is_health(path: &str) -> bool {
    matches!(path, "/livez" | "/readyz" | "/metrics")
}

/// The answer is one the API documents: a success with JSON (or a health page), or a problem document.
fn check_http_answer(case: &HttpCase, answer: &HttpAnswer) -> Result<(), TestCaseError> {
    let head = case.method == "HEAD";
    let status = answer.status;
    let content_type = answer.content_type();
    let health = is_health(case.route_path()) && matches!(case.method.as_str(), "GET" | "HEAD");
    prop_assert!(status >= 200, "an informational answer {status}");
    if health && (status == 200 || (status == 503 && case.route_path() == "/readyz")) {
        // The health pages are plain text (and OpenMetrics), for probes and scrapers.
        prop_assert!(
            content_type.starts_with("text/plain") || content_type.starts_with("application/openmetrics-text"),
            "a health page with content-type {content_type:?}"
        );
        return Ok(());
    }
    if status == 200 && matches!(case.method.as_str(), "GET" | "HEAD") {
        // The live page and its script and style (front/page): each with its own type.
        let page = match case.route_path() {
            "/" => Some("text/html; charset=utf-8"),
            "/ui/page.js" => Some("text/javascript; charset=utf-8"),
            "/ui/page.css" => Some("text/css; charset=utf-8"),
            _ => None,
        };
        if let Some(expected) = page {
            prop_assert!(
                content_type == expected,
                "the page's {} with content-type {content_type:?}",
                case.route_path()
            );
            return Ok(());
        }
    }
    if (200..300).contains(&status) {
        prop_assert!(content_type == "application/json", "a success with content-type {content_type:?}");
        if !head {
            let parsed: Result<serde_json::Value, _> = serde_json::from_slice(&answer.body);
            prop_assert!(
                parsed.is_ok(),
                "a success whose body is not JSON: {:?}",
                String::from_utf8_lossy(&answer.body)
            );
        }
        return Ok(());
    }
    prop_assert!(status < 500 || status == 503, "a 5xx that is not the documented 503: {status}");
    prop_assert!(
        content_type == "application/problem+json",
        "an error {status} with content-type {content_type:?}: {:?}",
        String::from_utf8_lossy(&answer.body)
    );
    if status == 405 {
        prop_assert!(answer.header("allow").is_some(), "a 405 without an Allow header");
    }
    if head {
        return Ok(());
    }
    let problem: serde_json::Value = serde_json::from_slice(&answer.body)
        .map_err(|e| TestCaseError::fail(format!("a problem that is not JSON ({e}): {:?}", answer.body)))?;
    check_problem(&problem, status)?;
    let slug = problem["type"].as_str().unwrap_or("");
    if status == 503 {
        prop_assert_eq!(slug, "urn:holdfast:unavailable");
    }
    if matches!(slug, "urn:holdfast:busy") || status == 429 || status == 503 {
        prop_assert!(answer.header("retry-after").is_some(), "{slug} without Retry-After");
    }
    Ok(())
}

/// A problem document as RFC 9457 and docs/http-api.md describe it.
fn check_problem(problem: &serde_json::Value, status: u16) -> Result<(), TestCaseError> {
    prop_assert!(problem.is_object(), "a problem that is not an object: {problem}");
    let slug = problem["type"].as_str().unwrap_or("");
    prop_assert!(slug.starts_with("urn:holdfast:") && slug.len() > 13, "a problem type {slug:?}");
    prop_assert!(problem["title"].is_string(), "a problem without a title: {problem}");
    prop_assert!(problem["detail"].is_string(), "a problem without a detail: {problem}");
    prop_assert_eq!(problem["status"].as_u64(), Some(u64::from(status)), "the problem's status: {}", problem);
    Ok(())
}

/// Sends `case`, checks its answer, and that a refused request changed nothing.
fn run_http_case(f: &Fuzzed, case: &HttpCase) -> Result<(), TestCaseError> {
    let request = case.render(&f.known());
    let before = f.table();
    let answer =
        f.rt.block_on(http_raw(&f.addr, &request, case.method == "HEAD"))
            .map_err(|e| TestCaseError::fail(format!("{e}; request: {:?}", String::from_utf8_lossy(&request))))?;
    let after = f.table();
    check_http_answer(case, &answer)
        .map_err(|e| TestCaseError::fail(format!("{e}; request: {:?}", String::from_utf8_lossy(&request))))?;
    if !(200..300).contains(&answer.status) {
        prop_assert_eq!(&before, &after, "a refused request ({}) changed the lock table", answer.status);
    }
    if answer.status == 200 && case.method == "POST" && case.route_path().starts_with("/v1/locks/") {
        let body: serde_json::Value = serde_json::from_slice(&answer.body).unwrap_or_default();
        if let (Some(name), Some(token)) = (body["name"].as_str(), body["token"].as_str()) {
            f.known().holds.push((name.to_owned(), token.to_owned()));
        }
    }
    f.check_alive()
}

#[test]
fn http_answers_are_json_or_problems_and_refusals_change_nothing() {
    let f = Fuzzed::start("http");
    fuzz(http_case(), |case| run_http_case(&f, &case));
}

/// A request that is not HTTP/1.1 as the grammar has it: raw bytes where only some may go (control
/// characters, spaces, non-ASCII in the request line; a header line without a colon, or with bytes a value
/// may not carry).
#[derive(Debug, Clone)]
struct Garbled {
    method: Vec<u8>,
    target: Vec<u8>,
    version: &'static str,
    header: Vec<u8>,
}

fn garbled() -> impl Strategy<Value = Garbled> {
    let raw = |len| proptest::collection::vec(prop_oneof![3 => 0x21u8..0x7f, 1 => any::<u8>()], len);
    let method = prop_oneof![
        4 => select(&["GET", "POST", "DELETE"][..]).prop_map(|m| m.as_bytes().to_vec()),
        1 => raw(0..8),
    ];
    let target = prop_oneof![
        3 => (select(&["/v1/locks/", "/v1/locks", "/livez", "/"][..]), raw(0..24)).prop_map(|(p, b)| [p.as_bytes(), &b].concat()),
        1 => raw(0..24),
    ];
    let version = select(&["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/9.9", "http/1.1", "HTTP/1.1 ", ""][..]);
    let header = prop_oneof![
        2 => Just(Vec::new()),
        1 => raw(0..40),
        1 => raw(0..24).prop_map(|b| [b"X-Fuzz: ".as_slice(), &b].concat()),
    ];
    (method, target, version, header).prop_map(|(method, target, version, header)| Garbled {
        method,
        target,
        version,
        header,
    })
}

impl Garbled {
    fn render(&self) -> Vec<u8> {
        let mut bytes = [self.method.as_slice(), b" ", &self.target, b" ", self.version.as_bytes(), b"\r\n"].concat();
        bytes.extend_from_slice(b"Host: fuzz\r\nConnection: close\r\n");
        // A line break inside the garbage would start a line of its own; it stays one line.
        let header: Vec<u8> = self.header.iter().map(|&b| if b == b'\r' || b == b'\n' { b'_' } else { b }).collect();
        if !header.is_empty() {
            bytes.extend_from_slice(&header);
            bytes.extend_from_slice(b"\r\n");
        }
        bytes.extend_from_slice(b"\r\n");
        bytes
    }
}

/// The parser (hyper's) refuses such requests before the router sees them, with its own plain `400` (or
/// by closing the connection): the node must never answer them with a 5xx, stall or stop.
#[test]
fn http_requests_that_are_not_http_are_refused_and_the_node_serves_on() {
    let f = Fuzzed::start("garbled");
    fuzz(garbled(), |case| {
        let request = case.render();
        let before = f.table();
        let answer = f.rt.block_on(http_raw(&f.addr, &request, false));
        let after = f.table();
        let shown = String::from_utf8_lossy(&request).into_owned();
        match answer {
            // The parser may close a connection it cannot make sense of without a word.
            Err(e) if !e.contains("hang") => {}
            Err(e) => return Err(TestCaseError::fail(format!("{e}; request: {shown:?}"))),
            Ok(answer) => {
                prop_assert!(answer.status < 500, "a {} to {shown:?}", answer.status);
                if answer.content_type() == "application/problem+json" {
                    let problem: serde_json::Value = serde_json::from_slice(&answer.body)
                        .map_err(|e| TestCaseError::fail(format!("a problem that is not JSON: {e}")))?;
                    check_problem(&problem, answer.status)?;
                }
                if !(200..300).contains(&answer.status) {
                    prop_assert_eq!(&before, &after, "a refused request changed the lock table: {:?}", shown);
                }
            }
        }
        f.check_alive()
    });
}

// --- gRPC: a raw client ---

#[derive(Debug)]
struct GrpcAnswer {
    http_status: u16,
    headers: http::HeaderMap,
    body: Vec<u8>,
    trailers: Option<http::HeaderMap>,
}

/// A call's end: its code, and the metadata its status came with.
struct Ending<'a> {
    code: tonic::Code,
    metadata: &'a http::HeaderMap,
}

impl GrpcAnswer {
    /// The status: in the headers of a trailers-only answer, else in the trailers.
    fn ending(&self) -> Result<Ending<'_>, String> {
        let metadata = match (&self.trailers, self.headers.contains_key("grpc-status")) {
            (_, true) => &self.headers,
            (Some(trailers), false) => trailers,
            (None, false) => return Err(format!("no grpc-status in {:?}", self.headers)),
        };
        let code = metadata
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i32>().ok())
            .ok_or_else(|| format!("no grpc-status in {metadata:?}"))?;
        Ok(Ending { code: tonic::Code::from(code), metadata })
    }

    /// The messages of the body, each unframed.
    fn messages(&self) -> Result<Vec<&[u8]>, String> {
        let mut rest = self.body.as_slice();
        let mut messages = Vec::new();
        while !rest.is_empty() {
            if rest.len() < 5 {
                return Err(format!("a frame cut in its prefix: {rest:?}"));
            }
            if rest[0] != 0 {
                return Err(format!("a compressed frame, though the client accepts none: {}", rest[0]));
            }
            let len = u32::from_be_bytes(rest[1..5].try_into().expect("4 bytes")) as usize;
            if rest.len() < 5 + len {
                return Err("a frame cut short".into());
            }
            messages.push(&rest[5..5 + len]);
            rest = &rest[5 + len..];
        }
        Ok(messages)
    }
}

/// Sends `body` as the request body of `method` and reads the whole answer, trailers included.
async fn grpc_raw(channel: &Channel, method: &str, body: Vec<u8>, auth: Option<&str>) -> Result<GrpcAnswer, String> {
    let mut request = http::Request::builder()
        .method("POST")
        .uri(format!("http://fuzz/holdfast.v1.Locks/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(auth) = auth {
        request = request.header("authorization", auth);
    }
    let request = request.body(tonic::body::Body::new(axum::body::Body::from(body))).expect("a request");
    let exchange = async {
        let mut channel = channel.clone();
        poll_fn(|cx| channel.poll_ready(cx)).await.map_err(|e| format!("the channel: {e}"))?;
        let response = channel.call(request).await.map_err(|e| format!("no answer: {e:?}"))?;
        let (parts, mut body) = response.into_parts();
        let (mut data, mut trailers) = (Vec::new(), None);
        while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            let frame = frame.map_err(|status| format!("the answer's body broke off: {status:?}"))?;
            match frame.into_data() {
                Ok(bytes) => data.extend_from_slice(&bytes),
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        Ok::<_, String>(GrpcAnswer { http_status: parts.status.as_u16(), headers: parts.headers, body: data, trailers })
    };
    tokio::time::timeout(BOUND, exchange).await.map_err(|_| "no answer in time: a hang".to_owned())?
}

/// A failed call's status is documented: a code from `locks.proto`'s list, and a `holdfast-problem`.
fn check_failure(ending: &Ending<'_>, what: &str) -> Result<(), TestCaseError> {
    let message = ending.metadata.get("grpc-message").and_then(|v| v.to_str().ok()).unwrap_or("");
    prop_assert!(
        CODES_DOCUMENTED.contains(&ending.code),
        "{what} failed with {:?} ({message:?}), not a documented code",
        ending.code
    );
    let problem = ending.metadata.get("holdfast-problem").and_then(|v| v.to_str().ok()).unwrap_or("");
    prop_assert!(
        problem.starts_with("urn:holdfast:") && problem.len() > 13,
        "{what} failed with {:?} ({message:?}) and problem {problem:?}",
        ending.code
    );
    Ok(())
}

// --- gRPC: messages, mutated and framed ---

/// How the encoded message is spoiled before it is framed.
#[derive(Debug, Clone)]
enum Mutation {
    None,
    Truncate(Index),
    /// XORs a byte with a mask (never 0).
    Flip(Index, u8),
    Set(Index, u8),
    Insert(Index, Vec<u8>),
    Remove(Index, u8),
    Append(Vec<u8>),
    Replace(Vec<u8>),
}

impl Mutation {
    fn apply(&self, mut bytes: Vec<u8>) -> Vec<u8> {
        let at = |i: &Index, len: usize| if len == 0 { 0 } else { i.index(len) };
        match self {
            Mutation::None => {}
            Mutation::Truncate(i) => bytes.truncate(at(i, bytes.len())),
            Mutation::Flip(i, mask) if !bytes.is_empty() => {
                let i = at(i, bytes.len());
                bytes[i] ^= (*mask).max(1);
            }
            Mutation::Set(i, value) if !bytes.is_empty() => {
                let i = at(i, bytes.len());
                bytes[i] = *value;
            }
            Mutation::Insert(i, more) => {
                let i = at(i, bytes.len() + 1);
                bytes.splice(i..i, more.iter().copied());
            }
            Mutation::Remove(i, n) if !bytes.is_empty() => {
                let i = at(i, bytes.len());
                let end = (i + usize::from(*n).max(1)).min(bytes.len());
                bytes.drain(i..end);
            }
            Mutation::Append(more) => bytes.extend_from_slice(more),
            Mutation::Replace(other) => bytes = other.clone(),
            Mutation::Flip(..) | Mutation::Set(..) | Mutation::Remove(..) => {}
        }
        bytes
    }
}

fn mutation() -> impl Strategy<Value = Mutation> {
    // Bytes that mean something to a protobuf decoder: tags of fields 1 to 6 of each wire type, long
    // varints, lengths beyond the end, groups, and invalid UTF-8 for string fields.
    let telling = proptest::collection::vec(
        prop_oneof![
            select(
                &[
                    0x08u8, 0x0a, 0x10, 0x12, 0x18, 0x1a, 0x22, 0x2a, 0x32, 0x0b, 0x0c, 0x0f, 0x80, 0xff, 0x7f, 0xc3,
                    0x28, 0x00
                ][..]
            ),
            any::<u8>(),
        ],
        1..12,
    );
    prop_oneof![
        4 => Just(Mutation::None),
        2 => any::<Index>().prop_map(Mutation::Truncate),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, m)| Mutation::Flip(i, m)),
        1 => (any::<Index>(), select(&[0x00u8, 0x7f, 0x80, 0xff, 0xc3, 0x28, 0x0f, 0x0b][..])).prop_map(|(i, v)| Mutation::Set(i, v)),
        2 => (any::<Index>(), telling.clone()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => (any::<Index>(), 1u8..8).prop_map(|(i, n)| Mutation::Remove(i, n)),
        1 => telling.clone().prop_map(Mutation::Append),
        1 => proptest::collection::vec(any::<u8>(), 0..48).prop_map(Mutation::Replace),
        1 => telling.prop_map(Mutation::Replace),
    ]
}

/// How a message is put in the request body.
#[derive(Debug, Clone)]
enum Framing {
    /// One frame: uncompressed, its true length.
    Proper,
    /// A length that is off by this much (the body ends early, or more follows).
    LengthOff(i8),
    /// A compression flag other than 0 (the client sent no `grpc-encoding`).
    Flag(u8),
    /// This length, whatever the message's.
    Length(u32),
    /// Only the first bytes of the frame's prefix.
    CutPrefix(Index),
    /// No frame at all: an empty body.
    Empty,
    /// The frame twice.
    Twice,
}

fn framing() -> impl Strategy<Value = Framing> {
    prop_oneof![
        12 => Just(Framing::Proper),
        1 => (-4i8..=4).prop_filter("off", |d| *d != 0).prop_map(Framing::LengthOff),
        1 => select(&[1u8, 2, 0x80, 0xff][..]).prop_map(Framing::Flag),
        1 => select(&[0u32, 4 << 20, (4 << 20) + 1, u32::MAX][..]).prop_map(Framing::Length),
        1 => any::<Index>().prop_map(Framing::CutPrefix),
        1 => Just(Framing::Empty),
        1 => Just(Framing::Twice),
    ]
}

fn frame(message: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(5 + message.len());
    bytes.push(0);
    bytes.extend_from_slice(&(message.len() as u32).to_be_bytes());
    bytes.extend_from_slice(message);
    bytes
}

impl Framing {
    fn apply(&self, message: &[u8]) -> Vec<u8> {
        let mut bytes = frame(message);
        match self {
            Framing::Proper => {}
            Framing::LengthOff(delta) => {
                let len = (message.len() as i64 + i64::from(*delta)).max(0) as u32;
                bytes[1..5].copy_from_slice(&len.to_be_bytes());
            }
            Framing::Flag(flag) => bytes[0] = *flag,
            Framing::Length(len) => bytes[1..5].copy_from_slice(&len.to_be_bytes()),
            Framing::CutPrefix(i) => bytes.truncate(i.index(5)),
            Framing::Empty => bytes.clear(),
            Framing::Twice => bytes.extend_from_slice(&frame(message)),
        }
        bytes
    }
}

/// A lock name as a gRPC client may send it (any UTF-8; invalid UTF-8 comes from mutations).
fn name_text() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => select(NAMES).prop_map(str::to_owned),
        2 => "[A-Za-z0-9._:-]{1,12}",
        1 => (199usize..203).prop_map(|n| "g".repeat(n)),
        1 => Just(String::new()),
        1 => select(&["a/b", "/", "..", "a b", "a\u{0}b", "\n", "\u{7f}", "é", "日本", "🔒", "%ff", "\u{feff}x", "x\u{200b}"][..])
            .prop_map(str::to_owned),
        1 => "\\PC{0,8}",
        1 => any::<String>(),
    ]
}

fn owner_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(&["worker-1", "", "a b", "é"][..]).prop_map(str::to_owned),
        1 => select(&["\u{0}", "\n", "x\u{1b}[31m", "\u{7f}"][..]).prop_map(str::to_owned),
        1 => (120usize..140).prop_map(|n| "o".repeat(n)),
        1 => any::<String>(),
    ]
}

fn ms(special: &'static [u64]) -> impl Strategy<Value = u64> {
    prop_oneof![3 => select(special), 1 => any::<u64>()]
}

const TTLS_MS: &[u64] = &[0, 1, TTL_MS_MIN - 1, TTL_MS_MIN, TTL_MS_MIN + 1, TTL_MS_MAX, TTL_MS_MAX + 1, u64::MAX];
const WAITS_MS: &[u64] = &[0, 0, 0, 1, 50, WAIT_MS_MAX, WAIT_MS_MAX + 1, u64::MAX];
/// Limits: a lock (unset or 1), semaphores, the largest, past it.
const LIMITS: &[u32] = &[
    0,
    1,
    1,
    2,
    3,
    holdfast_core::limits::SEMAPHORE_LIMIT_MAX,
    holdfast_core::limits::SEMAPHORE_LIMIT_MAX + 1,
    u32::MAX,
];
/// Lock-delays: none, within the node's bound, past it, past the hard bound.
const LOCK_DELAYS_MS: &[u64] =
    &[0, 0, 1, LOCK_DELAY_MS_MAX, LOCK_DELAY_MS_MAX + 1, holdfast_core::limits::LOCK_DELAY_MS_MAX + 1, u64::MAX];

/// A token field (resolved when the case runs): a hold the node granted, whose lock the call then names;
/// the token of one, with the call's own name; 32 hex digits, or other text.
#[derive(Debug, Clone)]
enum TokenText {
    Held(Index),
    Known(Index),
    Text(String),
}

impl TokenText {
    /// The name and token a call with `name` sends.
    fn resolve(&self, name: &str, known: &Known) -> (String, String) {
        match self {
            TokenText::Held(i) => match known.hold(i) {
                Some(hold) => hold.clone(),
                None => (name.to_owned(), known.token(i)),
            },
            TokenText::Known(i) => (name.to_owned(), known.token(i)),
            TokenText::Text(text) => (name.to_owned(), text.clone()),
        }
    }
}

fn token_text() -> impl Strategy<Value = TokenText> {
    prop_oneof![
        4 => any::<Index>().prop_map(TokenText::Held),
        2 => any::<Index>().prop_map(TokenText::Known),
        2 => "[0-9a-f]{32}".prop_map(TokenText::Text),
        1 => "[0-9A-Fa-f]{30,34}".prop_map(TokenText::Text),
        1 => any::<String>().prop_map(TokenText::Text),
    ]
}

/// A unary call with its fields; tokens are resolved when the case runs.
#[derive(Debug, Clone)]
enum Unary {
    Acquire(AcquireRequest),
    Renew(RenewRequest, TokenText),
    Release(ReleaseRequest, TokenText),
    Get(GetRequest),
    List(ListRequest),
    ClusterStatus,
    AddMember(AddMemberRequest),
    RemoveMember(RemoveMemberRequest),
    Snapshot,
}

/// A lock's value: none, short bytes of any kind, or one byte too long.
fn value_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => Just(Vec::new()),
        3 => prop::collection::vec(any::<u8>(), 1..16),
        1 => Just(vec![b'v'; holdfast_core::limits::VALUE_LEN_MAX + 1]),
    ]
}

fn acquire_request() -> impl Strategy<Value = AcquireRequest> {
    let ask = (ms(TTLS_MS), ms(WAITS_MS), value_bytes(), ms(LOCK_DELAYS_MS), select(LIMITS));
    (name_text(), owner_text(), ask).prop_map(|(name, owner, (ttl_ms, wait_ms, value, lock_delay_ms, limit))| {
        AcquireRequest { name, owner, ttl_ms, wait_ms, value, lock_delay_ms, limit }
    })
}

fn renew_request() -> impl Strategy<Value = (RenewRequest, TokenText)> {
    (name_text(), token_text(), ms(TTLS_MS))
        .prop_map(|(name, token, ttl_ms)| (RenewRequest { name, token: String::new(), ttl_ms }, token))
}

fn release_request() -> impl Strategy<Value = (ReleaseRequest, TokenText)> {
    (name_text(), token_text()).prop_map(|(name, token)| (ReleaseRequest { name, token: String::new() }, token))
}

fn unary() -> impl Strategy<Value = Unary> {
    let id = || prop_oneof![select(&[0u64, 1, 2, 7, u64::MAX][..]), any::<u64>()];
    prop_oneof![
        4 => acquire_request().prop_map(Unary::Acquire),
        3 => renew_request().prop_map(|(r, t)| Unary::Renew(r, t)),
        3 => release_request().prop_map(|(r, t)| Unary::Release(r, t)),
        2 => name_text().prop_map(|name| Unary::Get(GetRequest { name })),
        2 => (
            prop_oneof![name_text(), (195usize..205).prop_map(|n| "p".repeat(n))],
            name_text(),
            prop_oneof![select(&[0u32, 1, 2, 1000, 1001, u32::MAX][..]), any::<u32>()],
        )
            .prop_map(|(prefix, after, limit)| Unary::List(ListRequest { prefix, after, limit })),
        1 => Just(Unary::ClusterStatus),
        1 => (id(), prop_oneof![select(&["h:1", "127.0.0.1:1", "", ":1", "h:"][..]).prop_map(str::to_owned), any::<String>()])
            .prop_map(|(id, addr)| Unary::AddMember(AddMemberRequest { id, addr })),
        1 => id().prop_map(|id| Unary::RemoveMember(RemoveMemberRequest { id })),
        1 => Just(Unary::Snapshot),
    ]
}

impl Unary {
    fn method(&self) -> &'static str {
        match self {
            Unary::Acquire(_) => "Acquire",
            Unary::Renew(..) => "Renew",
            Unary::Release(..) => "Release",
            Unary::Get(_) => "Get",
            Unary::List(_) => "List",
            Unary::ClusterStatus => "ClusterStatus",
            Unary::AddMember(_) => "AddMember",
            Unary::RemoveMember(_) => "RemoveMember",
            Unary::Snapshot => "Snapshot",
        }
    }

    fn is_membership(&self) -> bool {
        matches!(self, Unary::AddMember(_) | Unary::RemoveMember(_))
    }

    fn encode(&self, known: &Known) -> Vec<u8> {
        match self {
            Unary::Acquire(r) => r.encode_to_vec(),
            Unary::Renew(r, token) => {
                let (name, token) = token.resolve(&r.name, known);
                RenewRequest { name, token, ..r.clone() }.encode_to_vec()
            }
            Unary::Release(r, token) => {
                let (name, token) = token.resolve(&r.name, known);
                ReleaseRequest { name, token }.encode_to_vec()
            }
            Unary::Get(r) => r.encode_to_vec(),
            Unary::List(r) => r.encode_to_vec(),
            Unary::ClusterStatus => ClusterStatusRequest {}.encode_to_vec(),
            Unary::AddMember(r) => r.encode_to_vec(),
            Unary::RemoveMember(r) => r.encode_to_vec(),
            Unary::Snapshot => SnapshotRequest {}.encode_to_vec(),
        }
    }

    /// Checks that `message` decodes as this call's answer; returns the name and token of a hold.
    fn decode_answer(&self, message: &[u8]) -> Result<Option<(String, String)>, prost::DecodeError> {
        match self {
            Unary::Acquire(_) | Unary::Renew(..) => {
                let hold = Hold::decode(message)?;
                return Ok(Some((hold.name, hold.token)));
            }
            Unary::Release(..) => drop(ReleaseResponse::decode(message)?),
            Unary::Get(_) => drop(Lock::decode(message)?),
            Unary::List(_) => drop(ListResponse::decode(message)?),
            Unary::ClusterStatus | Unary::AddMember(_) | Unary::RemoveMember(_) => {
                drop(ClusterStatusResponse::decode(message)?)
            }
            Unary::Snapshot => drop(SnapshotResponse::decode(message)?),
        }
        Ok(None)
    }
}

/// The `authorization` metadata of a call: none, a wrong one, or the admin key (never to membership
/// calls, see the module's doc).
fn grpc_auth() -> impl Strategy<Value = Option<&'static str>> {
    select(&[None, None, Some("Bearer wrong"), Some("Basic Zm9v"), Some("Bearer fuzz-admin-key")][..])
}

fn admin_safe(auth: Option<&'static str>, membership: bool) -> Option<&'static str> {
    match auth {
        Some(key) if membership && key.ends_with(ADMIN_KEY) => Some("Bearer not-the-admin-key"),
        other => other,
    }
}

#[derive(Debug, Clone)]
struct UnaryCase {
    call: Unary,
    mutation: Mutation,
    framing: Framing,
    auth: Option<&'static str>,
}

fn unary_case() -> impl Strategy<Value = UnaryCase> {
    (unary(), mutation(), framing(), grpc_auth()).prop_map(|(call, mutation, framing, auth)| UnaryCase {
        call,
        mutation,
        framing,
        auth,
    })
}

fn run_unary_case(f: &Fuzzed, channel: &Channel, case: &UnaryCase) -> Result<(), TestCaseError> {
    let message = case.mutation.apply(case.call.encode(&f.known()));
    let body = case.framing.apply(&message);
    let auth = admin_safe(case.auth, case.call.is_membership());
    let method = case.call.method();
    let before = f.table();
    let answer = f.rt.block_on(grpc_raw(channel, method, body, auth)).map_err(TestCaseError::fail)?;
    let after = f.table();
    prop_assert_eq!(answer.http_status, 200, "{} answered HTTP {}", method, answer.http_status);
    let ending = answer.ending().map_err(TestCaseError::fail)?;
    let messages = answer.messages().map_err(TestCaseError::fail)?;
    if ending.code == tonic::Code::Ok {
        prop_assert_eq!(messages.len(), 1, "{} succeeded with {} messages", method, messages.len());
        let token = case
            .call
            .decode_answer(messages[0])
            .map_err(|e| TestCaseError::fail(format!("{method} succeeded with an answer that does not decode: {e}")))?;
        f.known().holds.extend(token);
    } else {
        check_failure(&ending, method)?;
        prop_assert!(messages.is_empty(), "{} failed after {} messages", method, messages.len());
        prop_assert_eq!(&before, &after, "a refused {} ({:?}) changed the lock table", method, ending.code);
    }
    f.check_alive()
}

#[test]
fn grpc_unary_answers_are_documented_statuses_and_refusals_change_nothing() {
    let f = Fuzzed::start("unary");
    let channel = f.channel();
    fuzz(unary_case(), |case| run_unary_case(&f, &channel, &case));
}

// --- gRPC: the streams ---

/// A session request; a resume's session is one the node opened (resolved when the case runs) or made up.
#[derive(Debug, Clone)]
enum SessionMsg {
    Open(Open),
    Resume { known: Option<Index>, resume: Resume, with_secret: bool },
    Acquire(SessionAcquire),
    Release(SessionRelease),
    Heartbeat(Heartbeat),
    Close,
    Empty,
}

impl SessionMsg {
    fn encode(&self, known: &Known) -> Vec<u8> {
        let kind = match self {
            SessionMsg::Open(open) => Some(RequestKind::Open(open.clone())),
            SessionMsg::Resume { known: Some(i), resume, with_secret } if !known.sessions.is_empty() => {
                let (session_id, secret) = known.sessions[i.index(known.sessions.len())].clone();
                let secret = if *with_secret { secret } else { resume.secret.clone() };
                Some(RequestKind::Resume(Resume { session_id, secret }))
            }
            SessionMsg::Resume { resume, .. } => Some(RequestKind::Resume(resume.clone())),
            SessionMsg::Acquire(acquire) => Some(RequestKind::Acquire(acquire.clone())),
            SessionMsg::Release(release) => Some(RequestKind::Release(release.clone())),
            SessionMsg::Heartbeat(beat) => Some(RequestKind::Heartbeat(*beat)),
            SessionMsg::Close => Some(RequestKind::Close(Close {})),
            SessionMsg::Empty => None,
        };
        SessionRequest { kind }.encode_to_vec()
    }
}

fn session_msg() -> impl Strategy<Value = SessionMsg> {
    let lease_ms = ms(&[0, 1, TTL_MS_MIN - 1, TTL_MS_MIN, TTL_MS_MAX, TTL_MS_MAX + 1, u64::MAX]);
    let secret = prop_oneof![Just(String::new()), "[0-9a-f]{32}", "[0-9a-f]{31}", any::<String>(),];
    let resume = (proptest::option::of(any::<Index>()), any::<u64>(), secret, any::<bool>()).prop_map(
        |(known, session_id, secret, with_secret)| SessionMsg::Resume {
            known,
            resume: Resume { session_id, secret },
            with_secret,
        },
    );
    prop_oneof![
        3 => (owner_text(), lease_ms).prop_map(|(owner, lease_ms)| SessionMsg::Open(Open { owner, lease_ms })),
        2 => resume,
        4 => (name_text(), any::<bool>(), value_bytes(), ms(LOCK_DELAYS_MS), select(LIMITS)).prop_map(
            |(name, wait, value, lock_delay_ms, limit)| {
                SessionMsg::Acquire(SessionAcquire { name, wait, value, lock_delay_ms, limit })
            }
        ),
        2 => name_text().prop_map(|name| SessionMsg::Release(SessionRelease { name })),
        2 => (any::<u64>(), any::<u32>()).prop_map(|(seq, late_ms)| SessionMsg::Heartbeat(Heartbeat { seq, late_ms })),
        1 => Just(SessionMsg::Close),
        1 => Just(SessionMsg::Empty),
    ]
}

/// One message of a stream spoiled: which, how, and how it is framed.
#[derive(Debug, Clone)]
struct Spoil {
    at: Index,
    mutation: Mutation,
    framing: Framing,
}

fn spoil() -> impl Strategy<Value = Option<Spoil>> {
    proptest::option::of((any::<Index>(), mutation(), framing()).prop_map(|(at, mutation, framing)| Spoil {
        at,
        mutation,
        framing,
    }))
}

/// The body of a stream of `messages`, encoded and framed, one of them spoiled.
fn stream_body(messages: Vec<Vec<u8>>, spoil: &Option<Spoil>) -> Vec<u8> {
    let spoiled = spoil.as_ref().map(|spoil| (spoil.at.index(messages.len()), spoil));
    let mut body = Vec::new();
    for (i, bytes) in messages.into_iter().enumerate() {
        match spoiled {
            Some((at, spoil)) if at == i => body.extend(spoil.framing.apply(&spoil.mutation.apply(bytes))),
            _ => body.extend(frame(&bytes)),
        }
    }
    body
}

#[derive(Debug, Clone)]
struct SessionCase {
    messages: Vec<SessionMsg>,
    spoil: Option<Spoil>,
}

fn session_case() -> impl Strategy<Value = SessionCase> {
    let first = prop_oneof![
        6 => (owner_text(), select(&[TTL_MS_MIN, TTL_MS_MAX][..])).prop_map(|(owner, lease_ms)| SessionMsg::Open(Open { owner, lease_ms })),
        4 => session_msg(),
    ];
    (first, proptest::collection::vec(session_msg(), 0..6), spoil()).prop_map(|(first, rest, spoil)| {
        let mut messages = vec![first];
        messages.extend(rest);
        SessionCase { messages, spoil }
    })
}

fn run_session_case(f: &Fuzzed, channel: &Channel, case: &SessionCase) -> Result<(), TestCaseError> {
    let body = {
        let known = f.known();
        stream_body(case.messages.iter().map(|message| message.encode(&known)).collect(), &case.spoil)
    };
    let before = f.table();
    let answer = f.rt.block_on(grpc_raw(channel, "Session", body, None)).map_err(TestCaseError::fail)?;
    let after = f.table();
    prop_assert_eq!(answer.http_status, 200, "Session answered HTTP {}", answer.http_status);
    let ending = answer.ending().map_err(TestCaseError::fail)?;
    let messages = answer.messages().map_err(TestCaseError::fail)?;
    for message in &messages {
        let event = SessionEvent::decode(*message)
            .map_err(|e| TestCaseError::fail(format!("a session event that does not decode: {e}")))?;
        match event.kind {
            Some(EventKind::Error(e)) => {
                prop_assert!(e.r#type.starts_with("urn:holdfast:"), "a SessionError of type {:?}", e.r#type);
            }
            Some(EventKind::Opened(opened)) if !opened.secret.is_empty() => {
                f.known().sessions.push((opened.session_id, opened.secret));
            }
            Some(EventKind::Acquired(acquired)) => f.known().holds.push((acquired.name, acquired.token)),
            Some(_) => {}
            None => prop_assert!(false, "a session event without a kind"),
        }
    }
    if ending.code != tonic::Code::Ok {
        check_failure(&ending, "Session")?;
        if messages.is_empty() {
            prop_assert_eq!(&before, &after, "a refused session stream ({:?}) changed the lock table", ending.code);
        }
    }
    f.check_alive()
}

#[test]
fn grpc_session_streams_answer_documented_events_and_statuses() {
    let f = Fuzzed::start("session");
    let channel = f.channel();
    fuzz(session_case(), |case| run_session_case(&f, &channel, &case));
}

#[derive(Debug, Clone)]
enum CallMsg {
    Acquire(AcquireRequest),
    Renew(RenewRequest, TokenText),
    Release(ReleaseRequest, TokenText),
    Get(GetRequest),
    Cancel,
    Empty,
}

fn call_msg() -> impl Strategy<Value = CallMsg> {
    prop_oneof![
        4 => acquire_request().prop_map(CallMsg::Acquire),
        2 => renew_request().prop_map(|(r, t)| CallMsg::Renew(r, t)),
        2 => release_request().prop_map(|(r, t)| CallMsg::Release(r, t)),
        2 => name_text().prop_map(|name| CallMsg::Get(GetRequest { name })),
        1 => Just(CallMsg::Cancel),
        1 => Just(CallMsg::Empty),
    ]
}

#[derive(Debug, Clone)]
struct CallsCase {
    /// Each call with its id: `None` for its position in the stream.
    calls: Vec<(Option<u64>, CallMsg)>,
    spoil: Option<Spoil>,
}

fn calls_case() -> impl Strategy<Value = CallsCase> {
    // Mostly ids of their own, sometimes one of a few (so that one may be outstanding twice), or any.
    let id = prop_oneof![6 => Just(None), 1 => (0u64..4).prop_map(Some), 1 => any::<u64>().prop_map(Some)];
    (proptest::collection::vec((id, call_msg()), 1..8), spoil()).prop_map(|(calls, spoil)| CallsCase { calls, spoil })
}

impl CallMsg {
    fn encode(&self, id: u64, known: &Known) -> Vec<u8> {
        let kind = match self {
            CallMsg::Acquire(r) => Some(CallKind::Acquire(r.clone())),
            CallMsg::Renew(r, t) => {
                let (name, token) = t.resolve(&r.name, known);
                Some(CallKind::Renew(RenewRequest { name, token, ..r.clone() }))
            }
            CallMsg::Release(r, t) => {
                let (name, token) = t.resolve(&r.name, known);
                Some(CallKind::Release(ReleaseRequest { name, token }))
            }
            CallMsg::Get(r) => Some(CallKind::Get(r.clone())),
            CallMsg::Cancel => Some(CallKind::Cancel(Cancel {})),
            CallMsg::Empty => None,
        };
        Call { id, kind }.encode_to_vec()
    }
}

fn run_calls_case(f: &Fuzzed, channel: &Channel, case: &CallsCase) -> Result<(), TestCaseError> {
    let body = {
        let known = f.known();
        let calls = case.calls.iter().enumerate();
        stream_body(calls.map(|(i, (id, call))| call.encode(id.unwrap_or(i as u64), &known)).collect(), &case.spoil)
    };
    let before = f.table();
    let answer = f.rt.block_on(grpc_raw(channel, "Calls", body, None)).map_err(TestCaseError::fail)?;
    let after = f.table();
    prop_assert_eq!(answer.http_status, 200, "Calls answered HTTP {}", answer.http_status);
    let ending = answer.ending().map_err(TestCaseError::fail)?;
    let messages = answer.messages().map_err(TestCaseError::fail)?;
    let mut succeeded = false;
    for message in &messages {
        let result = CallResult::decode(*message)
            .map_err(|e| TestCaseError::fail(format!("a call result that does not decode: {e}")))?;
        match result.kind {
            Some(ResultKind::Error(e)) => {
                let code = tonic::Code::from(e.code);
                prop_assert!(CODES_DOCUMENTED.contains(&code), "a CallError with code {code:?} ({:?})", e.message);
                prop_assert!(e.problem.starts_with("urn:holdfast:"), "a CallError with problem {:?}", e.problem);
            }
            Some(ResultKind::Hold(hold)) => {
                succeeded = true;
                f.known().holds.push((hold.name, hold.token));
            }
            Some(_) => succeeded = true,
            None => prop_assert!(false, "a call result without a kind"),
        }
    }
    if ending.code != tonic::Code::Ok {
        check_failure(&ending, "Calls")?;
    }
    // A cancelled call that was already proposed keeps its outcome, unanswered.
    let cancelled = case.calls.iter().any(|(_, call)| matches!(call, CallMsg::Cancel));
    let answered_all = messages.len() == case.calls.len();
    if ending.code == tonic::Code::Ok && case.spoil.is_none() && !cancelled {
        prop_assert!(
            answered_all,
            "a Calls stream ended well with {} of {} calls answered",
            messages.len(),
            case.calls.len()
        );
    }
    // Calls left unanswered (the stream ended with an error) have unknown outcomes; answered ones that all
    // failed changed nothing.
    if answered_all && !succeeded && !cancelled {
        prop_assert_eq!(&before, &after, "Calls that all failed changed the lock table");
    }
    f.check_alive()
}

#[test]
fn grpc_calls_streams_answer_documented_results_and_statuses() {
    let f = Fuzzed::start("calls");
    let channel = f.channel();
    fuzz(calls_case(), |case| run_calls_case(&f, &channel, &case));
}

// --- what the fuzzing found: each input that found a bug, as a test of its own ---

impl Fuzzed {
    /// Sends `request_line` (`METHOD TARGET`) with no headers but `Host` and no body.
    fn http(&self, request_line: &str) -> HttpAnswer {
        let request = format!("{request_line} HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n");
        self.rt.block_on(http_raw(&self.addr, request.as_bytes(), false)).expect("an answer")
    }

    /// Takes `name` over HTTP; its token.
    fn take(&self, name: &str) -> String {
        let answer = self.http(&format!("POST /v1/locks/{name}"));
        assert_eq!(answer.status, 200, "{:?}", String::from_utf8_lossy(&answer.body));
        let body: serde_json::Value = serde_json::from_slice(&answer.body).expect("JSON");
        body["token"].as_str().expect("a token").to_owned()
    }
}

#[track_caller]
fn assert_problem(answer: &HttpAnswer, status: u16, problem_type: &str) {
    let body = String::from_utf8_lossy(&answer.body);
    assert_eq!((answer.status, answer.content_type()), (status, "application/problem+json"), "{body}");
    let problem: serde_json::Value = serde_json::from_slice(&answer.body).expect("a JSON problem");
    assert_eq!(problem["type"], problem_type, "{body}");
    assert_eq!(problem["status"], status, "{body}");
}

/// A path parameter that is not UTF-8 once percent-decoded was answered by axum's own rejection, in plain
/// text (`Invalid URL: Invalid UTF-8 in `name``). It is bad input of its kind, a problem like every other.
#[test]
fn http_path_parameter_not_utf8_is_a_problem_of_its_kind() {
    let f = Fuzzed::start("path-utf8");
    let token = "0123456789abcdef0123456789abcdef";
    for request in [
        "GET /v1/locks/%80".to_owned(),
        "POST /v1/locks/%c3%28".to_owned(),
        format!("DELETE /v1/locks/%ff?token={token}"),
        format!("POST /v1/locks/%ed%a0%80/renew?token={token}"),
    ] {
        assert_problem(&f.http(&request), 400, "urn:holdfast:invalid-name");
    }
    assert_problem(&f.http("DELETE /v1/keys/%ff"), 400, "urn:holdfast:invalid-tenant");
    assert_problem(&f.http("DELETE /v1/cluster/members/%c3%28"), 400, "urn:holdfast:invalid-member");
}

/// The query string was decoded lossily: `owner=%ff` took the lock for the owner U+FFFD, a value the
/// client never sent. A query that is not UTF-8 once percent-decoded is now refused, and takes nothing.
#[test]
fn http_query_not_utf8_is_refused_and_takes_nothing() {
    let f = Fuzzed::start("query-utf8");
    let before = f.table();
    assert_problem(&f.http("POST /v1/locks/job-a?owner=%ff"), 400, "urn:holdfast:invalid-query");
    assert_problem(&f.http("POST /v1/locks/job-a?owner=%c3%28"), 400, "urn:holdfast:invalid-query");
    assert_problem(&f.http("GET /v1/locks?prefix=%ed%a0%80"), 400, "urn:holdfast:invalid-query");
    assert_problem(&f.http("POST /v1/locks/job-a?%ff=1"), 400, "urn:holdfast:invalid-query");
    assert_eq!(f.table(), before);
    // Escapes that decode to UTF-8, `+` for a space, and a `%` that escapes nothing still arrive as sent.
    let answer = f.http("POST /v1/locks/job-a?owner=%c3%a9+w%zz");
    assert_eq!(answer.status, 200, "{:?}", String::from_utf8_lossy(&answer.body));
    let body: serde_json::Value = serde_json::from_slice(&answer.body).expect("JSON");
    assert_eq!(body["owner"], "é w%zz");
}

/// A parameter given twice was silently taken from its last copy (`ttl=1h&ttl=2h` held for two hours),
/// as a typo once fell back to a default. It is refused, and takes nothing.
#[test]
fn http_parameter_given_twice_is_refused() {
    let f = Fuzzed::start("query-twice");
    let before = f.table();
    assert_problem(&f.http("POST /v1/locks/job-a?ttl=1h&ttl=2h"), 400, "urn:holdfast:invalid-query");
    let token = f.take("job-b");
    let before_release = f.table();
    let twice = format!("DELETE /v1/locks/job-b?token={token}&token={token}");
    assert_problem(&f.http(&twice), 400, "urn:holdfast:invalid-query");
    assert_eq!(f.table(), before_release);
    assert_ne!(before, before_release, "job-b was taken");
}

/// A unary request whose body is not one well-formed message, each as the fuzzing sent it.
fn malformed_bodies() -> Vec<(&'static str, Vec<u8>)> {
    let acquire = AcquireRequest { name: "job-a".into(), ..Default::default() }.encode_to_vec();
    let mut compressed = frame(&acquire);
    compressed[0] = 1;
    let mut too_long = frame(&acquire);
    too_long[1..5].copy_from_slice(&((4u32 << 20) + 1).to_be_bytes());
    vec![
        // The name (field 1) is the byte 0xff: not UTF-8.
        ("a string that is not UTF-8", frame(&[0x0a, 0x01, 0xff])),
        ("a field cut short", frame(&acquire[..acquire.len() - 2])),
        ("tag 0", frame(&[0x00])),
        ("a frame cut short", frame(&acquire)[..6].to_vec()),
        ("no message", Vec::new()),
        ("a compressed flag without grpc-encoding", compressed),
        ("a frame larger than tonic takes", too_long),
    ]
}

/// tonic refuses a unary request whose body is not one well-formed message before holdfast sees it, with
/// INTERNAL (or OUT_OF_RANGE) and no problem type. [`holdfast_server::front::grpc::service`] answers it as bad
/// input: INVALID_ARGUMENT `invalid-message`, and nothing changes.
#[test]
fn grpc_service_answers_a_malformed_unary_request_invalid_message() {
    let f = Fuzzed::start("malformed-unary");
    let before = f.table();
    let mut service = holdfast_server::front::grpc::service(f.node.api.clone());
    for (what, body) in malformed_bodies() {
        let request = http::Request::builder()
            .method("POST")
            .uri("/holdfast.v1.Locks/Acquire")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(axum::body::Body::from(body))
            .expect("a request");
        let response = f.rt.block_on(async {
            poll_fn(|cx| Service::<http::Request<axum::body::Body>>::poll_ready(&mut service, cx))
                .await
                .expect("ready");
            tokio::time::timeout(BOUND, service.call(request)).await.expect("in time").expect("an answer")
        });
        let status = tonic::Status::from_header_map(response.headers()).expect("a trailers-only status");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{what}: {status:?}");
        let problem = response.headers().get("holdfast-problem");
        assert_eq!(problem.and_then(|v| v.to_str().ok()), Some("urn:holdfast:invalid-message"), "{what}");
    }
    assert_eq!(f.table(), before);
}

/// The same through the client port.
#[test]
fn grpc_port_answers_a_malformed_unary_request_invalid_message() {
    let f = Fuzzed::start("malformed-port");
    let channel = f.channel();
    for (what, body) in malformed_bodies() {
        let answer = f.rt.block_on(grpc_raw(&channel, "Acquire", body, None)).expect("an answer");
        let ending = answer.ending().expect("a status");
        assert_eq!(ending.code, tonic::Code::InvalidArgument, "{what}");
        let problem = ending.metadata.get("holdfast-problem").and_then(|v| v.to_str().ok());
        assert_eq!(problem, Some("urn:holdfast:invalid-message"), "{what}");
    }
}

/// A session stream whose first message did not decode ended with tonic's INTERNAL and no problem type;
/// one whose later message did not decode ended with OK, as if the client had gone. Both end with
/// INVALID_ARGUMENT `invalid-message`.
#[test]
fn grpc_session_message_that_does_not_decode_ends_the_stream_invalid_message() {
    let f = Fuzzed::start("malformed-session");
    let channel = f.channel();
    let open = SessionRequest { kind: Some(RequestKind::Open(Open { owner: "s".into(), lease_ms: TTL_MS_MIN })) };
    // An Acquire (field 3) whose name is the byte 0xff.
    let undecodable = frame(&[0x1a, 0x03, 0x0a, 0x01, 0xff]);
    let before = f.table();
    let answer = f.rt.block_on(grpc_raw(&channel, "Session", undecodable.clone(), None)).expect("an answer");
    let ending = answer.ending().expect("a status");
    assert_eq!(ending.code, tonic::Code::InvalidArgument);
    assert_eq!(
        ending.metadata.get("holdfast-problem").and_then(|v| v.to_str().ok()),
        Some("urn:holdfast:invalid-message")
    );
    assert_eq!(f.table(), before);

    let body = [frame(&open.encode_to_vec()), undecodable].concat();
    let answer = f.rt.block_on(grpc_raw(&channel, "Session", body, None)).expect("an answer");
    let events = answer.messages().expect("frames");
    assert!(matches!(SessionEvent::decode(events[0]).expect("an event").kind, Some(EventKind::Opened(_))));
    let ending = answer.ending().expect("a status");
    assert_eq!(ending.code, tonic::Code::InvalidArgument);
    assert_eq!(
        ending.metadata.get("holdfast-problem").and_then(|v| v.to_str().ok()),
        Some("urn:holdfast:invalid-message")
    );
}

/// The `Calls` stream of a call waiting in a queue (outstanding for [`WAIT_MS_MAX`]), then `more`.
fn calls_behind_a_waiting_call(f: &Fuzzed, more: Vec<u8>) -> GrpcAnswer {
    f.take("held");
    let waiting = Call {
        id: 1,
        kind: Some(CallKind::Acquire(AcquireRequest {
            name: "held".into(),
            wait_ms: WAIT_MS_MAX,
            ..Default::default()
        })),
    };
    let body = [frame(&waiting.encode_to_vec()), more].concat();
    f.rt.block_on(grpc_raw(&f.channel(), "Calls", body, None)).expect("an answer")
}

/// A call whose id is outstanding ends the `Calls` stream with INVALID_ARGUMENT, as documented, but the
/// status `calls.rs` makes for it has no `holdfast-problem`.
#[test]
fn grpc_calls_duplicate_id_ends_the_stream_with_a_problem() {
    let f = Fuzzed::start("calls-duplicate");
    let again = Call { id: 1, kind: Some(CallKind::Get(GetRequest { name: "held".into() })) };
    let answer = calls_behind_a_waiting_call(&f, frame(&again.encode_to_vec()));
    let ending = answer.ending().expect("a status");
    assert_eq!(ending.code, tonic::Code::InvalidArgument);
    assert!(ending.metadata.get("holdfast-problem").is_some(), "{:?}", ending.metadata);
}

/// A call that does not decode ends the `Calls` stream with OK, the calls outstanding dropped unanswered:
/// the client cannot tell their outcomes are unknown, which locks.proto says an error status tells it.
#[test]
fn grpc_calls_call_that_does_not_decode_ends_the_stream_with_an_error() {
    let f = Fuzzed::start("calls-undecodable");
    // A Get (field 5) whose name is the byte 0xff.
    let answer = calls_behind_a_waiting_call(&f, frame(&[0x08, 0x02, 0x2a, 0x03, 0x0a, 0x01, 0xff]));
    let ending = answer.ending().expect("a status");
    assert_ne!(
        ending.code,
        tonic::Code::Ok,
        "the waiting call went unanswered: {} results",
        answer.messages().expect("frames").len()
    );
    check_failure(&ending, "Calls").expect("a documented status");
}
