//! The session protocol and the `Calls` stream against one in-process node, spoken with the generated gRPC
//! client: what a client library relies on. Multi-node behaviour (forwarding, failover, resumption) is
//! tested with real processes in the repository's tests/ folder.

use std::collections::BTreeMap;
use std::time::Duration;

mod common;

use holdfast_proto::v1::{
    EventKind, Heartbeat, LocksClient, Open, RequestKind, Resume, SessionAcquire, SessionEvent, SessionRelease,
    SessionRequest,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// Bound on every wait in these tests: generous for a loaded 2-core machine.
const BOUND: Duration = Duration::from_secs(10);

struct Node {
    addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    _dir: tempfile::TempDir,
}

impl Node {
    async fn start() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let client = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = client.local_addr().unwrap().to_string();
        let config = common::one_node(peer.local_addr().unwrap().to_string(), dir.path().to_owned());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(holdfast_server::run(
            config,
            holdfast_server::Listeners { client, peer, health: None },
            async move {
                let _ = stopped.await;
            },
        ));
        let node = Node { addr, stop: Some(stop), task, _dir: dir };
        let url = format!("http://{}/readyz", node.addr);
        tokio::time::timeout(BOUND, async {
            while !reqwest::get(&url).await.is_ok_and(|r| r.status().is_success()) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the node becomes ready");
        node
    }

    async fn client(&self) -> LocksClient<Channel> {
        LocksClient::connect(format!("http://{}", self.addr)).await.unwrap()
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(BOUND, self.task).await.expect("the node stops").unwrap().unwrap();
    }
}

/// One session stream: requests in, events out.
struct Stream {
    tx: mpsc::Sender<SessionRequest>,
    events: tonic::Streaming<SessionEvent>,
}

impl Stream {
    async fn open(client: &mut LocksClient<Channel>, first: RequestKind) -> Stream {
        let (tx, rx) = mpsc::channel(16);
        tx.send(SessionRequest { kind: Some(first) }).await.unwrap();
        let events = client.session(ReceiverStream::new(rx)).await.unwrap().into_inner();
        Stream { tx, events }
    }

    async fn send(&self, kind: RequestKind) {
        self.tx.send(SessionRequest { kind: Some(kind) }).await.unwrap();
    }

    async fn next(&mut self) -> EventKind {
        let event = tokio::time::timeout(BOUND, self.events.message()).await.expect("an event in time");
        event.expect("the stream is healthy").expect("the stream goes on").kind.expect("an event has a kind")
    }

    /// The next event that is not a heartbeat acknowledgement.
    async fn next_not_ack(&mut self) -> EventKind {
        loop {
            match self.next().await {
                EventKind::HeartbeatAck(_) => continue,
                other => return other,
            }
        }
    }
}

fn open(owner: &str, lease_ms: u64) -> RequestKind {
    RequestKind::Open(Open { owner: owner.into(), lease_ms })
}

fn acquire(name: &str, wait: bool) -> RequestKind {
    RequestKind::Acquire(SessionAcquire { name: name.into(), wait, value: vec![], lock_delay_ms: 0, limit: 0 })
}

/// The session's id and secret from its `Opened`.
async fn opened(stream: &mut Stream) -> (u64, String) {
    match stream.next().await {
        EventKind::Opened(o) => (o.session_id, o.secret),
        other => panic!("expected Opened, got {other:?}"),
    }
}

fn resume(session_id: u64, secret: &str) -> RequestKind {
    RequestKind::Resume(Resume { session_id, secret: secret.into() })
}

/// The status a session stream opened with `first` ends with, before any event.
async fn refused(client: &mut LocksClient<Channel>, first: RequestKind) -> tonic::Status {
    let (tx, rx) = mpsc::channel(1);
    tx.send(SessionRequest { kind: Some(first) }).await.unwrap();
    let mut events = client.session(ReceiverStream::new(rx)).await.unwrap().into_inner();
    let message = tokio::time::timeout(BOUND, events.message()).await.expect("an answer in time");
    message.expect_err("the stream is refused")
}

fn problem(status: &tonic::Status) -> &str {
    status.metadata().get("holdfast-problem").unwrap().to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_granted_in_fifo_order_the_moment_the_holder_releases() {
    let node = Node::start().await;
    let mut client = node.client().await;
    let mut a = Stream::open(&mut client, open("a", 10_000)).await;
    let mut b = Stream::open(&mut client, open("b", 10_000)).await;
    let mut c = Stream::open(&mut client, open("c", 10_000)).await;
    for s in [&mut a, &mut b, &mut c] {
        opened(s).await;
    }
    a.send(acquire("job", true)).await;
    let EventKind::Acquired(first) = a.next().await else { panic!("a holds job") };
    b.send(acquire("job", true)).await;
    match b.next().await {
        EventKind::Waiting(w) => {
            assert_eq!((w.name.as_str(), w.position, w.holder.unwrap().fence), ("job", 1, first.fence))
        }
        other => panic!("b waits: {other:?}"),
    }
    c.send(acquire("job", true)).await;
    assert!(matches!(c.next().await, EventKind::Waiting(w) if w.position == 2));
    // A try-lock does not queue.
    let mut d = Stream::open(&mut client, open("d", 10_000)).await;
    opened(&mut d).await;
    d.send(acquire("job", false)).await;
    assert!(matches!(d.next().await, EventKind::Busy(busy) if busy.holder.as_ref().unwrap().fence == first.fence));

    a.send(RequestKind::Release(SessionRelease { name: "job".into() })).await;
    assert!(matches!(a.next().await, EventKind::Released(r) if r.name == "job"));
    // The hand-over is pushed to b at once, with a larger fence; c stays queued.
    let EventKind::Acquired(second) = b.next().await else { panic!("b is granted job") };
    assert!(second.fence > first.fence, "fence {} after {}", second.fence, first.fence);
    b.send(RequestKind::Close(Default::default())).await;
    let EventKind::Acquired(third) = c.next().await else { panic!("c is granted job when b closes") };
    assert!(third.fence > second.fence);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_are_acknowledged_and_a_silent_session_loses_its_lock_after_its_lease() {
    let node = Node::start().await;
    let mut client = node.client().await;
    let mut holder = Stream::open(&mut client, open("holder", 600)).await;
    let (holder_id, holder_secret) = opened(&mut holder).await;
    holder.send(acquire("job", true)).await;
    let EventKind::Acquired(held) = holder.next().await else { panic!("holder holds job") };
    holder.send(RequestKind::Heartbeat(Heartbeat { seq: 7, late_ms: 0 })).await;
    match holder.next().await {
        EventKind::HeartbeatAck(ack) => assert_eq!((ack.seq, ack.held, ack.waiting), (7, 1, 0)),
        other => panic!("expected an ack: {other:?}"),
    }
    let mut waiter = Stream::open(&mut client, open("waiter", 10_000)).await;
    opened(&mut waiter).await;
    waiter.send(acquire("job", true)).await;
    assert!(matches!(waiter.next().await, EventKind::Waiting(_)));
    // The holder goes silent: after its lease the leader expires it, the holder's stream hears Lost, and the
    // waiter is granted.
    let silent_since = tokio::time::Instant::now();
    let EventKind::Acquired(next) = waiter.next_not_ack().await else { panic!("waiter is granted") };
    assert!(silent_since.elapsed() >= Duration::from_millis(300), "granted before the lease could run out");
    assert!(next.fence > held.fence);
    assert!(matches!(holder.next().await, EventKind::Lost(l) if l.name == "job"));
    // The expired session cannot be resumed, even with its secret.
    let status = refused(&mut client, resume(holder_id, &holder_secret)).await;
    assert_eq!(status.code(), tonic::Code::NotFound);
    assert_eq!(problem(&status), "urn:holdfast:session-gone");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_resumed_on_a_new_stream_keeps_its_locks_and_queue_places() {
    let node = Node::start().await;
    let mut client = node.client().await;
    let mut other = Stream::open(&mut client, open("other", 10_000)).await;
    opened(&mut other).await;
    other.send(acquire("b", true)).await;
    assert!(matches!(other.next().await, EventKind::Acquired(_)));

    let mut first = Stream::open(&mut client, open("mine", 5_000)).await;
    let (id, secret) = opened(&mut first).await;
    first.send(acquire("a", true)).await;
    let EventKind::Acquired(a) = first.next().await else { panic!("holds a") };
    first.send(acquire("b", true)).await;
    assert!(matches!(first.next().await, EventKind::Waiting(_)));
    drop(first); // the stream breaks; the session lives on

    let mut resumed = Stream::open(&mut client, resume(id, &secret)).await;
    // The secret is given once, to the opener: a resumed stream's Opened carries none.
    assert_eq!(opened(&mut resumed).await, (id, String::new()));
    assert!(
        matches!(resumed.next().await, EventKind::Acquired(x) if x.name == "a" && x.fence == a.fence && x.token == a.token)
    );
    assert!(matches!(resumed.next().await, EventKind::Waiting(w) if w.name == "b" && w.position == 1));
    // The queue place is real: when the other session lets go, the resumed stream is granted.
    other.send(RequestKind::Release(SessionRelease { name: "b".into() })).await;
    assert!(matches!(resumed.next_not_ack().await, EventKind::Acquired(x) if x.name == "b"));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cannot_be_taken_over_with_what_a_read_of_its_lock_shows() {
    use holdfast_proto::v1::{GetRequest, ReleaseRequest};
    let node = Node::start().await;
    let mut client = node.client().await;
    let mut holder = Stream::open(&mut client, open("holder", 5_000)).await;
    let (id, secret) = opened(&mut holder).await;
    assert_eq!(secret.len(), 32, "a secret of 128 bits, in hex: {secret:?}");
    holder.send(acquire("job", true)).await;
    let EventKind::Acquired(held) = holder.next().await else { panic!("the holder holds job") };
    let mut waiter = Stream::open(&mut client, open("waiter", 5_000)).await;
    let (waiter_id, waiter_secret) = opened(&mut waiter).await;
    assert_ne!(waiter_secret, secret, "every session has its own secret");
    waiter.send(acquire("job", true)).await;
    assert!(matches!(waiter.next().await, EventKind::Waiting(w) if w.position == 1));

    // Everything a stranger can read of the lock, through gRPC and HTTP.
    let read = client.get(GetRequest { name: "job".into() }).await.unwrap().into_inner();
    let shown = read.holder.clone().unwrap();
    assert_eq!((shown.session_id, shown.fence, read.waiters[0].session_id), (id, held.fence, waiter_id));
    let http = reqwest::get(format!("http://{}/v1/locks/job", node.addr)).await.unwrap().text().await.unwrap();
    assert!(!http.contains(&secret) && !http.contains(&held.token), "a read shows no secret: {http}");
    assert!(!format!("{read:?}").contains(&secret), "a read shows no secret: {read:?}");

    // Resuming with the public id alone, with guesses made of what was read, or with the waiter's own
    // secret: refused, before the stream attaches.
    let guesses = ["".to_owned(), format!("{id:032x}"), format!("{:032x}", shown.fence), waiter_secret.clone()];
    for guess in &guesses {
        let status = refused(&mut client, resume(id, guess)).await;
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "secret {guess:?}: {status:?}");
        assert_eq!(problem(&status), "urn:holdfast:wrong-session-secret");
    }
    let status = refused(&mut client, resume(id, "not hex")).await;
    assert_eq!((status.code(), problem(&status)), (tonic::Code::InvalidArgument, "urn:holdfast:invalid-secret"));
    // A one-shot release needs the hold's token, which no read shows.
    for token in [format!("{id:032x}"), format!("{:032x}", shown.fence)] {
        let status = client.release(ReleaseRequest { name: "job".into(), token }).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    }

    // Nothing changed: the holder's stream was not displaced, it still holds, the waiter still waits.
    holder.send(RequestKind::Heartbeat(Heartbeat { seq: 1, late_ms: 0 })).await;
    assert!(matches!(holder.next().await, EventKind::HeartbeatAck(ack) if ack.seq == 1 && ack.held == 1));
    let after = client.get(GetRequest { name: "job".into() }).await.unwrap().into_inner();
    assert_eq!(after, read);
    // And the real holder still lets go as usual; the waiter is next.
    holder.send(RequestKind::Release(SessionRelease { name: "job".into() })).await;
    assert!(matches!(holder.next().await, EventKind::Released(_)));
    assert!(matches!(waiter.next_not_ack().await, EventKind::Acquired(a) if a.fence > held.fence));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_session_requests_get_clear_errors_and_change_nothing() {
    let node = Node::start().await;
    let mut client = node.client().await;
    // A lease outside the bounds is refused before anything is proposed.
    let (tx, rx) = mpsc::channel(1);
    tx.send(SessionRequest { kind: Some(open("x", 5)) }).await.unwrap();
    let status = client.session(ReceiverStream::new(rx)).await.unwrap().into_inner().message().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(status.metadata().get("holdfast-problem").unwrap(), "urn:holdfast:invalid-ttl");

    let mut s = Stream::open(&mut client, open("x", 5_000)).await;
    opened(&mut s).await;
    s.send(acquire("no/slash", true)).await;
    assert!(matches!(s.next().await, EventKind::Error(e) if e.r#type == "urn:holdfast:invalid-name"));
    s.send(RequestKind::Release(SessionRelease { name: "never-held".into() })).await;
    assert!(matches!(s.next().await, EventKind::Error(e) if e.r#type == "urn:holdfast:not-holder"));
    let listed = client.list(holdfast_proto::v1::ListRequest::default()).await.unwrap().into_inner();
    assert!(listed.locks.is_empty(), "nothing was taken: {listed:?}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_one_shot_acquire_names_the_holder_in_its_status() {
    use holdfast_proto::v1::{AcquireRequest, Holder};
    let node = Node::start().await;
    let mut client = node.client().await;
    let request = |owner: &str| AcquireRequest {
        name: "job".into(),
        owner: owner.into(),
        ttl_ms: 30_000,
        wait_ms: 0,
        value: vec![],
        lock_delay_ms: 0,
        limit: 0,
    };
    let held = client.acquire(request("first")).await.expect("first acquire").into_inner();
    let status = client.acquire(request("second")).await.expect_err("the lock is held");
    assert_eq!(status.code(), tonic::Code::AlreadyExists);
    assert_eq!(status.metadata().get("holdfast-problem").unwrap(), "urn:holdfast:busy");
    let bytes = status.metadata().get_bin("holdfast-holder-bin").expect("the holder is named").to_bytes().unwrap();
    let holder = <Holder as prost::Message>::decode(bytes).expect("a Holder message");
    assert_eq!((holder.owner.as_str(), holder.fence, holder.expires_at_ms), ("first", held.fence, held.expires_at_ms));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_session_is_resumed_elsewhere_on_the_node_is_ended() {
    let node = Node::start().await;
    let mut client = node.client().await;
    let mut old = Stream::open(&mut client, open("mover", 5_000)).await;
    let (id, secret) = opened(&mut old).await;
    let mut new = Stream::open(&mut client, resume(id, &secret)).await;
    assert_eq!(opened(&mut new).await.0, id);
    // The old stream, still open, must not go on acting for the session.
    let ended = tokio::time::timeout(BOUND, old.events.message()).await.expect("the old stream ends in time");
    assert_eq!(ended.expect_err("the old stream ends with an error").code(), tonic::Code::Aborted);
    node.stop().await;
}

// ---- the Calls stream ----

/// One `Calls` stream: calls in, results out.
struct Calls {
    tx: mpsc::Sender<holdfast_proto::v1::Call>,
    results: tonic::Streaming<holdfast_proto::v1::CallResult>,
}

impl Calls {
    async fn open(client: &mut LocksClient<Channel>) -> Calls {
        let (tx, rx) = mpsc::channel(16);
        let results = client.calls(ReceiverStream::new(rx)).await.unwrap().into_inner();
        Calls { tx, results }
    }

    async fn send(&self, id: u64, kind: holdfast_proto::v1::CallKind) {
        self.tx.send(holdfast_proto::v1::Call { id, kind: Some(kind) }).await.unwrap();
    }

    /// Takes `name` for `owner` with call `id` (nothing else outstanding) and returns the hold.
    async fn hold(&mut self, id: u64, name: &str, owner: &str) -> holdfast_proto::v1::Hold {
        self.send(id, call_acquire(name, owner, 0)).await;
        match self.next().await {
            (answered, holdfast_proto::v1::ResultKind::Hold(hold)) if answered == id => hold,
            other => panic!("expected a hold for call {id}, got {other:?}"),
        }
    }

    /// The next result: its id and kind.
    async fn next(&mut self) -> (u64, holdfast_proto::v1::ResultKind) {
        let result = tokio::time::timeout(BOUND, self.results.message()).await.expect("a result in time");
        let result = result.expect("the stream is healthy").expect("the stream goes on");
        (result.id, result.kind.expect("a result has a kind"))
    }
}

fn call_acquire(name: &str, owner: &str, wait_ms: u64) -> holdfast_proto::v1::CallKind {
    let request = holdfast_proto::v1::AcquireRequest {
        name: name.into(),
        owner: owner.into(),
        ttl_ms: 30_000,
        wait_ms,
        value: vec![],
        lock_delay_ms: 0,
        limit: 0,
    };
    holdfast_proto::v1::CallKind::Acquire(request)
}

fn call_release(name: &str, token: &str) -> holdfast_proto::v1::CallKind {
    holdfast_proto::v1::CallKind::Release(holdfast_proto::v1::ReleaseRequest { name: name.into(), token: token.into() })
}

fn call_get(name: &str) -> holdfast_proto::v1::CallKind {
    holdfast_proto::v1::CallKind::Get(holdfast_proto::v1::GetRequest { name: name.into() })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_on_one_stream_answer_as_their_unary_twins_under_their_own_ids() {
    use holdfast_proto::v1::{CallKind, RenewRequest, ResultKind};
    let node = Node::start().await;
    let mut client = node.client().await;
    let mut calls = Calls::open(&mut client).await;

    let a = calls.hold(7, "a", "alpha").await;
    assert_eq!((a.name.as_str(), a.owner.as_str(), a.ttl_ms), ("a", "alpha", 30_000));

    // A busy lock: the error the unary call would have, holder included.
    calls.send(8, call_acquire("a", "beta", 0)).await;
    let (id, ResultKind::Error(busy)) = calls.next().await else { panic!("expected an error") };
    assert_eq!(id, 8);
    assert_eq!((busy.code, busy.problem.as_str()), (tonic::Code::AlreadyExists as i32, "urn:holdfast:busy"));
    let holder = busy.holder.expect("the holder is named");
    assert_eq!((holder.owner.as_str(), holder.fence), ("alpha", a.fence));

    // An acquire that waits is answered after a later call on the same stream.
    calls.send(9, call_acquire("a", "gamma", 10_000)).await;
    calls.send(10, CallKind::Renew(RenewRequest { name: "a".into(), token: a.token.clone(), ttl_ms: 20_000 })).await;
    let (id, ResultKind::Hold(renewed)) = calls.next().await else { panic!("expected the renewal") };
    assert_eq!((id, renewed.ttl_ms, renewed.fence), (10, 20_000, a.fence));
    calls.send(11, call_release("a", &a.token)).await;
    let mut answers = BTreeMap::new();
    for _ in 0..2 {
        let (id, kind) = calls.next().await;
        answers.insert(id, kind);
    }
    let Some(ResultKind::Released(released)) = answers.remove(&11) else { panic!("expected the release: {answers:?}") };
    assert_eq!((released.name.as_str(), released.fence), ("a", a.fence));
    let Some(ResultKind::Hold(handed)) = answers.remove(&9) else { panic!("expected the waiter's grant: {answers:?}") };
    assert_eq!(handed.owner, "gamma");
    assert!(handed.fence > a.fence, "a new fence: {} after {}", handed.fence, a.fence);

    calls.send(12, call_get("a")).await;
    let (id, ResultKind::Lock(lock)) = calls.next().await else { panic!("expected the lock") };
    assert_eq!((id, lock.holder.unwrap().owner.as_str()), (12, "gamma"));

    // Bad input gets the unary call's error and changes nothing.
    calls.send(13, call_release("a", "not-a-token")).await;
    let (id, ResultKind::Error(bad)) = calls.next().await else { panic!("expected an error") };
    assert_eq!(
        (id, bad.code, bad.problem.as_str()),
        (13, tonic::Code::InvalidArgument as i32, "urn:holdfast:invalid-token")
    );
    calls.send(14, call_get("nobody-holds-this")).await;
    let (id, ResultKind::Error(missing)) = calls.next().await else { panic!("expected an error") };
    assert_eq!((id, missing.code), (14, tonic::Code::NotFound as i32));
    // A call without a kind (or one this server does not know) is refused alone; the stream goes on.
    calls.tx.send(holdfast_proto::v1::Call { id: 15, kind: None }).await.unwrap();
    let (id, ResultKind::Error(unknown)) = calls.next().await else { panic!("expected an error") };
    assert_eq!((id, unknown.problem.as_str()), (15, "urn:holdfast:invalid-call"));
    let lock = client.get(holdfast_proto::v1::GetRequest { name: "a".into() }).await.unwrap().into_inner();
    assert_eq!(lock.holder.unwrap().fence, handed.fence);

    // Each call is counted under its own endpoint.
    let metrics = reqwest::get(format!("http://{}/metrics", node.addr)).await.unwrap().text().await.unwrap();
    for series in [
        r#"holdfast_requests_total{api="grpc",endpoint="/holdfast.v1.Locks/Calls/Acquire",code="0"} 2"#,
        r#"holdfast_requests_total{api="grpc",endpoint="/holdfast.v1.Locks/Calls/Acquire",code="6"} 1"#,
        r#"holdfast_requests_total{api="grpc",endpoint="/holdfast.v1.Locks/Calls/Release",code="3"} 1"#,
    ] {
        assert!(metrics.contains(series), "{series} in\n{metrics}");
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_is_dropped_unanswered_and_leaves_the_queue() {
    use holdfast_proto::v1::{CallKind, Cancel, ResultKind};
    let node = Node::start().await;
    let mut client = node.client().await;
    let mut calls = Calls::open(&mut client).await;
    let held = calls.hold(1, "q", "holder").await;
    calls.send(2, call_acquire("q", "waiter", 30_000)).await;
    let queued = || async {
        let lock = node.client().await.get(holdfast_proto::v1::GetRequest { name: "q".into() }).await.unwrap();
        lock.into_inner().waiters.len()
    };
    tokio::time::timeout(BOUND, async {
        while queued().await == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the waiter queues");
    calls.send(2, CallKind::Cancel(Cancel {})).await;
    // Cancelling frees the id, and a cancel of a call that is not outstanding does nothing.
    calls.send(2, call_get("q")).await;
    calls.send(99, CallKind::Cancel(Cancel {})).await;
    let (2, ResultKind::Lock(lock)) = calls.next().await else { panic!("expected the lock, not the cancelled call") };
    assert_eq!(lock.holder.unwrap().owner, "holder");
    // The waiter's queue place went with its call: a release frees the lock for nobody.
    calls.send(3, call_release("q", &held.token)).await;
    let (3, ResultKind::Released(_)) = calls.next().await else { panic!("expected the release") };
    calls.send(4, call_get("q")).await;
    let (4, ResultKind::Error(free)) = calls.next().await else { panic!("nobody holds the lock now") };
    assert_eq!(free.code, tonic::Code::NotFound as i32);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ends_after_its_last_answer_and_on_a_reused_outstanding_id() {
    use holdfast_proto::v1::ResultKind;
    let node = Node::start().await;
    let mut client = node.client().await;

    // The client ends its side with a call outstanding: the call is answered, then the stream ends.
    let mut calls = Calls::open(&mut client).await;
    let held = calls.hold(1, "h", "holder").await;
    calls.send(2, call_acquire("h", "waiter", 30_000)).await;
    let Calls { tx, mut results } = calls;
    drop(tx);
    let mut other = Calls::open(&mut client).await;
    other.send(1, call_release("h", &held.token)).await;
    let (1, ResultKind::Released(_)) = other.next().await else { panic!("expected the release") };
    let last = tokio::time::timeout(BOUND, results.message()).await.expect("in time").expect("healthy");
    let last = last.expect("the outstanding call's answer");
    assert!(matches!((last.id, last.kind), (2, Some(ResultKind::Hold(_)))), "the waiter was granted");
    let end = tokio::time::timeout(BOUND, results.message()).await.expect("in time");
    assert!(matches!(end, Ok(None)), "then the stream ends: {end:?}");

    // An id still outstanding, used again, ends the stream with INVALID_ARGUMENT.
    other.hold(5, "busy", "one").await;
    other.send(6, call_acquire("busy", "two", 30_000)).await;
    other.send(6, call_get("busy")).await;
    let status = tokio::time::timeout(BOUND, async {
        loop {
            match other.results.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the stream ended without an error"),
                Err(status) => return status,
            }
        }
    })
    .await
    .expect("in time");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("call id 6"), "{status:?}");
    node.stop().await;
}

/// Whether a new session opened now is refused as overloaded (and is closed at once if it opened).
async fn open_refused_as_overloaded(client: &mut LocksClient<Channel>) -> bool {
    let (tx, rx) = mpsc::channel(2);
    tx.send(SessionRequest { kind: Some(open("newcomer", 10_000)) }).await.unwrap();
    let mut events = client.session(ReceiverStream::new(rx)).await.unwrap().into_inner();
    match tokio::time::timeout(BOUND, events.message()).await.expect("an answer in time") {
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
            assert_eq!(problem(&status), "urn:holdfast:overloaded", "{status:?}");
            assert!(status.message().contains("behind"), "the refusal says how late: {status:?}");
            true
        }
        Ok(_) => {
            let _ = tx.send(SessionRequest { kind: Some(RequestKind::Close(Default::default())) }).await;
            false
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_that_see_their_heartbeats_late_make_the_node_refuse_new_ones_until_they_see_them_on_time() {
    let node = Node::start().await;
    let mut client = node.client().await;
    // As many sessions as the node needs to take their word (`load::LATE_SESSIONS_MIN`).
    let mut streams = Vec::new();
    for i in 0..holdfast_server::load::LATE_SESSIONS_MIN {
        let mut stream = Stream::open(&mut client, open(&format!("s{i}"), 30_000)).await;
        opened(&mut stream).await;
        streams.push(stream);
    }
    // Each heartbeats once a window (a stream is heard once a window), telling the node how late it sees
    // its heartbeats: 3 s, then 5 ms. Each heartbeat is acknowledged: what the node has, it serves.
    let mut seq = 0;
    let mut beat_all = async |streams: &mut Vec<Stream>, late_ms: u32| {
        seq += 1;
        for stream in streams.iter() {
            stream.send(RequestKind::Heartbeat(Heartbeat { seq, late_ms })).await;
        }
        for stream in streams.iter_mut() {
            match stream.next().await {
                EventKind::HeartbeatAck(ack) => assert_eq!(ack.seq, seq),
                other => panic!("expected the heartbeat's acknowledgement, got {other:?}"),
            }
        }
    };
    // The node counts a session's lateness only since its own start: it is refused within a few windows.
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        beat_all(&mut streams, 3_000).await;
        if open_refused_as_overloaded(&mut client).await {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "new sessions were never refused");
        tokio::time::sleep(holdfast_server::load::WINDOW).await;
    }
    // Once the sessions see their heartbeats on time, the lateness they told is forgotten in two windows.
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        tokio::time::sleep(holdfast_server::load::WINDOW).await;
        beat_all(&mut streams, 5).await;
        if !open_refused_as_overloaded(&mut client).await {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "new sessions were refused after the sessions caught up");
    }
    node.stop().await;
}
