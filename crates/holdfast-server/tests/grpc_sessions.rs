//! The session protocol against one in-process node, spoken with the generated gRPC client: what a client
//! library relies on. Multi-node behaviour (forwarding, failover, resumption) is tested with real processes
//! in the repository's tests/ folder.

use std::collections::BTreeMap;
use std::time::Duration;

use holdfast_proto::v1::{
    EventKind, Heartbeat, LocksClient, Open, RequestKind, Resume, SessionAcquire, SessionEvent, SessionRelease,
    SessionRequest,
};
use holdfast_server::node::FrontLimits;
use holdfast_server::Config;
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
        let config = Config {
            id: 1,
            members: BTreeMap::from([(1, peer.local_addr().unwrap().to_string())]),
            data_dir: dir.path().to_owned(),
            limits: FrontLimits { ttl_ms_min: 100, ttl_ms_max: 60_000, wait_ms_max: 60_000 },
            heartbeat_ms: 50,
            election_timeout_ms: 200,
            snapshot_every_entries: 1000,
            queue_hold: holdfast_server::proposer::QUEUE_HOLD,
            join: false,
            admin_key: None,
            tls: None,
            auth: Default::default(),
            cache_bytes: holdfast_store::CACHE_BYTES_DEFAULT,
            clock: holdfast_server::WallClock::system(),
            rng_seed: None,
            bugs: holdfast_server::Bugs::default(),
        };
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
    RequestKind::Acquire(SessionAcquire { name: name.into(), wait })
}

async fn opened(stream: &mut Stream) -> u64 {
    match stream.next().await {
        EventKind::Opened(o) => o.session_id,
        other => panic!("expected Opened, got {other:?}"),
    }
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
    let holder_id = opened(&mut holder).await;
    holder.send(acquire("job", true)).await;
    let EventKind::Acquired(held) = holder.next().await else { panic!("holder holds job") };
    holder.send(RequestKind::Heartbeat(Heartbeat { seq: 7 })).await;
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
    // The expired session cannot be resumed.
    let (tx, rx) = mpsc::channel(1);
    tx.send(SessionRequest { kind: Some(RequestKind::Resume(Resume { session_id: holder_id })) }).await.unwrap();
    let mut events = client.session(ReceiverStream::new(rx)).await.unwrap().into_inner();
    let status = events.message().await.expect_err("resuming an expired session fails");
    assert_eq!(status.code(), tonic::Code::NotFound);
    assert_eq!(status.metadata().get("holdfast-problem").unwrap(), "urn:holdfast:session-gone");
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
    let id = opened(&mut first).await;
    first.send(acquire("a", true)).await;
    let EventKind::Acquired(a) = first.next().await else { panic!("holds a") };
    first.send(acquire("b", true)).await;
    assert!(matches!(first.next().await, EventKind::Waiting(_)));
    drop(first); // the stream breaks; the session lives on

    let mut resumed = Stream::open(&mut client, RequestKind::Resume(Resume { session_id: id })).await;
    assert_eq!(opened(&mut resumed).await, id);
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
    let request = |owner: &str| AcquireRequest { name: "job".into(), owner: owner.into(), ttl_ms: 30_000, wait_ms: 0 };
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
    let id = opened(&mut old).await;
    let mut new = Stream::open(&mut client, RequestKind::Resume(Resume { session_id: id })).await;
    assert_eq!(opened(&mut new).await, id);
    // The old stream, still open, must not go on acting for the session.
    let ended = tokio::time::timeout(BOUND, old.events.message()).await.expect("the old stream ends in time");
    assert_eq!(ended.expect_err("the old stream ends with an error").code(), tonic::Code::Aborted);
    node.stop().await;
}
