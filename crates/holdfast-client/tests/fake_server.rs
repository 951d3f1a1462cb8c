//! The session machinery against an in-process fake of the gRPC API: grants, queues and hand-overs, the lease
//! kept by the client's clock, resuming after a broken stream, and the checks after a resume.
//!
//! The fake is a small single-node model of the server's session protocol (not of its Raft or its limits),
//! with knobs to stop acknowledging heartbeats, break streams, and forget sessions or holds. Tests wait for
//! events with a bound; none sleeps for a fixed time.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast_client::{Client, Error, PROBLEM_METADATA};
use holdfast_proto::v1::{self, EventKind, Locks, LocksServer, RequestKind, SessionEvent, SessionRequest};
use tokio::sync::{mpsc, watch};
use tokio::time::{timeout, Instant};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

/// How long a test waits for something that should happen promptly.
const BOUND: Duration = Duration::from_secs(5);

type Outbox = mpsc::Sender<Result<SessionEvent, Status>>;

/// What tests can wait for.
#[derive(Debug, Clone, Default)]
struct Seen {
    opens: u32,
    resumes: u32,
    heartbeats: u32,
    /// (session, name) of every release request, in order.
    releases: Vec<(u64, String)>,
    closes: u32,
    /// `Calls` streams opened.
    call_streams: u32,
    /// (id, lock name) of every acquire on a `Calls` stream, in order.
    calls: Vec<(u64, String)>,
    /// The ids of the cancels on `Calls` streams, in order.
    cancels: Vec<u64>,
    /// Unary acquires.
    unary_acquires: u32,
}

#[derive(Default)]
struct State {
    ack_heartbeats: bool,
    next_id: u64,
    next_fence: u64,
    sessions: BTreeSet<u64>,
    /// name → (session, fence, token)
    holds: BTreeMap<String, (u64, u64, String)>,
    waiters: BTreeMap<String, VecDeque<u64>>,
    /// The current stream of each session.
    streams: BTreeMap<u64, Outbox>,
    /// Whether `Calls` answers UNIMPLEMENTED, as an older server's does.
    no_calls: bool,
    /// The open `Calls` streams' answers.
    call_streams: Vec<mpsc::Sender<Result<v1::CallResult, Status>>>,
    /// Whether a `Calls` stream is accepted only once its first call came.
    headers_after_first_call: bool,
    /// How long an open is answered after it came (a node that was catching up).
    open_delay: Duration,
}

#[derive(Clone)]
struct Fake {
    state: Arc<Mutex<State>>,
    seen: Arc<watch::Sender<Seen>>,
}

fn event(kind: EventKind) -> Result<SessionEvent, Status> {
    Ok(SessionEvent { kind: Some(kind) })
}

/// The secret the fake gives session `id` when it opens.
fn secret_of(id: u64) -> String {
    format!("{:032x}", u128::from(id) * 0x9e37_79b9)
}

fn session_gone() -> Status {
    let mut metadata = tonic::metadata::MetadataMap::new();
    metadata.insert(PROBLEM_METADATA, "urn:holdfast:session-gone".parse().unwrap());
    Status::with_metadata(tonic::Code::NotFound, "session gone", metadata)
}

impl Fake {
    fn new() -> Fake {
        let state = State { ack_heartbeats: true, next_id: 100, next_fence: 1, ..State::default() };
        Fake { state: Arc::new(Mutex::new(state)), seen: Arc::new(watch::channel(Seen::default()).0) }
    }

    fn note(&self, f: impl FnOnce(&mut Seen)) {
        self.seen.send_modify(f);
    }

    async fn wait_for(&self, what: &str, f: impl Fn(&Seen) -> bool) -> Seen {
        let seen = async { self.seen.subscribe().wait_for(|s| f(s)).await.map(|s| s.clone()) };
        timeout(BOUND, seen).await.unwrap_or_else(|_| panic!("timed out waiting for {what}")).expect("the fake lives")
    }

    fn ack_heartbeats(&self, ack: bool) {
        self.state.lock().unwrap().ack_heartbeats = ack;
    }

    /// Ends every session stream with UNAVAILABLE, as a node that dies does.
    fn break_streams(&self) {
        let streams = std::mem::take(&mut self.state.lock().unwrap().streams);
        for (_, tx) in streams {
            let _ = tx.try_send(Err(Status::unavailable("the fake broke the stream")));
        }
    }

    /// Ends every `Calls` stream with UNAVAILABLE, as a node that dies does.
    fn break_calls(&self) {
        let streams = std::mem::take(&mut self.state.lock().unwrap().call_streams);
        for tx in streams {
            let _ = tx.try_send(Err(Status::unavailable("the fake broke the calls stream")));
        }
    }

    /// The fake's answer to a one-shot acquire of `request.name`: granted, unless the name starts with
    /// `busy` (held by someone else). A name `late-MS-…` is answered after MS milliseconds; a name that
    /// starts with `slow` is never answered.
    fn one_shot(&self, request: &v1::AcquireRequest) -> Option<(Duration, v1::ResultKind)> {
        if request.name.starts_with("slow") {
            return None;
        }
        let delay = request.name.strip_prefix("late-").and_then(|rest| rest.split('-').next()?.parse().ok());
        let kind = if request.name.starts_with("busy") {
            let holder = v1::Holder { owner: "someone".into(), fence: 41, ..Default::default() };
            let code = tonic::Code::AlreadyExists as i32;
            let (message, problem) = ("held".into(), "urn:holdfast:busy".into());
            v1::ResultKind::Error(v1::CallError { code, message, problem, holder: Some(holder) })
        } else {
            let mut state = self.state.lock().unwrap();
            let fence = state.next_fence;
            state.next_fence += 1;
            let (name, owner, ttl_ms) = (request.name.clone(), request.owner.clone(), request.ttl_ms);
            v1::ResultKind::Hold(v1::Hold {
                name,
                owner,
                token: format!("token-{fence}"),
                fence,
                ttl_ms,
                ..Default::default()
            })
        };
        Some((Duration::from_millis(delay.unwrap_or(0)), kind))
    }

    /// Handles one call of a `Calls` stream, answering on `tx`.
    fn on_call(&self, call: v1::Call, tx: &mpsc::Sender<Result<v1::CallResult, Status>>) {
        let id = call.id;
        let answer = match call.kind {
            Some(v1::CallKind::Cancel(_)) => {
                self.note(|s| s.cancels.push(id));
                return;
            }
            Some(v1::CallKind::Acquire(request)) => {
                self.note(|s| s.calls.push((id, request.name.clone())));
                self.one_shot(&request)
            }
            _ => {
                let code = tonic::Code::Unimplemented as i32;
                let error = v1::CallError { code, message: "fake".into(), ..Default::default() };
                Some((Duration::ZERO, v1::ResultKind::Error(error)))
            }
        };
        if let Some((delay, kind)) = answer {
            let tx = tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = tx.send(Ok(v1::CallResult { id, kind: Some(kind) })).await;
            });
        }
    }

    /// Forgets a session (it expired while its client was away), without telling anyone.
    fn forget_session(&self, id: u64) {
        let mut state = self.state.lock().unwrap();
        state.sessions.remove(&id);
        state.holds.retain(|_, (s, _, _)| *s != id);
    }

    /// Drops a hold without telling its session (a server bug, or an event the client missed).
    fn drop_hold(&self, name: &str) {
        self.state.lock().unwrap().holds.remove(name);
    }

    fn holder(&self, name: &str) -> Option<u64> {
        self.state.lock().unwrap().holds.get(name).map(|(s, _, _)| *s)
    }

    fn waiters(&self, name: &str) -> Vec<u64> {
        self.state.lock().unwrap().waiters.get(name).map(|q| q.iter().copied().collect()).unwrap_or_default()
    }

    /// Grants `name` to `session` and returns the event, under the state lock.
    fn grant(state: &mut State, name: &str, session: u64) -> Result<SessionEvent, Status> {
        let fence = state.next_fence;
        state.next_fence += 1;
        let token = format!("token-{fence}");
        state.holds.insert(name.to_owned(), (session, fence, token.clone()));
        event(EventKind::Acquired(v1::Acquired { name: name.to_owned(), fence, token, value: vec![] }))
    }

    /// Ends `session`'s claim on `name` and hands the lock to the next waiter. True if it had one.
    fn end_claim(state: &mut State, name: &str, session: u64) -> bool {
        if let Some(queue) = state.waiters.get_mut(name) {
            if let Some(i) = queue.iter().position(|s| *s == session) {
                queue.remove(i);
                return true;
            }
        }
        if state.holds.get(name).is_none_or(|(s, _, _)| *s != session) {
            return false;
        }
        state.holds.remove(name);
        if let Some(next) = state.waiters.get_mut(name).and_then(|q| q.pop_front()) {
            let granted = Fake::grant(state, name, next);
            if let Some(tx) = state.streams.get(&next) {
                let _ = tx.try_send(granted);
            }
        }
        true
    }

    fn handle(&self, session: u64, kind: RequestKind, tx: &Outbox) -> bool {
        let mut state = self.state.lock().unwrap();
        if !state.sessions.contains(&session) {
            let _ = tx.try_send(Err(session_gone()));
            return true;
        }
        match kind {
            RequestKind::Acquire(a) => {
                let answer = match state.holds.get(&a.name).cloned() {
                    None => Fake::grant(&mut state, &a.name, session),
                    Some((s, fence, token)) if s == session => {
                        event(EventKind::Acquired(v1::Acquired { name: a.name, fence, token, value: a.value }))
                    }
                    Some(_) if !a.wait => event(EventKind::Busy(v1::Busy { name: a.name, holder: None })),
                    Some(_) => {
                        let queue = state.waiters.entry(a.name.clone()).or_default();
                        if !queue.contains(&session) {
                            queue.push_back(session);
                        }
                        let position = queue.iter().position(|s| *s == session).unwrap() as u64 + 1;
                        event(EventKind::Waiting(v1::Waiting { name: a.name, position, holder: None }))
                    }
                };
                let _ = tx.try_send(answer);
            }
            RequestKind::Release(r) => {
                self.note(|s| s.releases.push((session, r.name.clone())));
                let answer = match Fake::end_claim(&mut state, &r.name, session) {
                    true => event(EventKind::Released(v1::Released { name: r.name })),
                    false => event(EventKind::Error(v1::SessionError {
                        name: r.name,
                        r#type: "urn:holdfast:not-holder".into(),
                        detail: "not held".into(),
                    })),
                };
                let _ = tx.try_send(answer);
            }
            RequestKind::Heartbeat(h) => {
                self.note(|s| s.heartbeats += 1);
                if state.ack_heartbeats {
                    let held = state.holds.values().filter(|(s, _, _)| *s == session).count() as u32;
                    let ack = v1::HeartbeatAck { seq: h.seq, held, waiting: 0 };
                    let _ = tx.try_send(event(EventKind::HeartbeatAck(ack)));
                }
            }
            RequestKind::Close(_) => {
                self.note(|s| s.closes += 1);
                state.sessions.remove(&session);
                let names: Vec<String> = state.holds.keys().cloned().collect();
                for name in names {
                    Fake::end_claim(&mut state, &name, session);
                }
                for queue in state.waiters.values_mut() {
                    queue.retain(|s| *s != session);
                }
                state.streams.remove(&session);
                return true;
            }
            RequestKind::Open(_) | RequestKind::Resume(_) => {
                let _ = tx.try_send(Err(Status::invalid_argument("already open")));
                return true;
            }
            // The client sets values with one-shot calls, never on the session stream.
            RequestKind::SetValue(_) => {
                let _ = tx.try_send(Err(Status::unimplemented("fake")));
                return true;
            }
        }
        false
    }
}

#[tonic::async_trait]
impl Locks for Fake {
    type SessionStream = ReceiverStream<Result<SessionEvent, Status>>;
    type CallsStream = ReceiverStream<Result<v1::CallResult, Status>>;
    type WatchStream = ReceiverStream<Result<v1::WatchEvent, Status>>;

    /// Answers acquires as [`Fake::one_shot`] says, each in its own time; refuses the other calls.
    async fn calls(&self, request: Request<Streaming<v1::Call>>) -> Result<Response<Self::CallsStream>, Status> {
        let (tx, rx) = mpsc::channel(64);
        let headers_after_first_call = {
            let mut state = self.state.lock().unwrap();
            if state.no_calls {
                return Err(Status::unimplemented("this fake has no Calls stream"));
            }
            state.call_streams.push(tx.clone());
            state.headers_after_first_call
        };
        self.note(|s| s.call_streams += 1);
        let (fake, mut inbound) = (self.clone(), request.into_inner());
        if headers_after_first_call {
            // The stream is accepted only once its first call came: a client that waits for the
            // acceptance before it sends never gets it.
            match timeout(BOUND, inbound.message()).await {
                Ok(Ok(Some(call))) => fake.on_call(call, &tx),
                other => return Err(Status::invalid_argument(format!("no first call with the opening: {other:?}"))),
            }
        }
        tokio::spawn(async move {
            while let Ok(Some(call)) = inbound.message().await {
                fake.on_call(call, &tx);
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn session(
        &self,
        request: Request<Streaming<SessionRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(64);
        let fake = self.clone();
        tokio::spawn(async move {
            let first = inbound.message().await.ok().flatten().and_then(|m| m.kind);
            let session = {
                let mut state = fake.state.lock().unwrap();
                match first {
                    Some(RequestKind::Open(open)) => {
                        let id = state.next_id;
                        state.next_id += 1;
                        state.sessions.insert(id);
                        state.streams.insert(id, tx.clone());
                        let opened = v1::Opened { session_id: id, lease_ms: open.lease_ms, secret: secret_of(id) };
                        let (tx, delay) = (tx.clone(), state.open_delay);
                        tokio::spawn(async move {
                            tokio::time::sleep(delay).await;
                            let _ = tx.try_send(event(EventKind::Opened(opened)));
                        });
                        fake.note(|s| s.opens += 1);
                        id
                    }
                    Some(RequestKind::Resume(resume)) => {
                        let id = resume.session_id;
                        fake.note(|s| s.resumes += 1);
                        if !state.sessions.contains(&id) {
                            let _ = tx.try_send(Err(session_gone()));
                            return;
                        }
                        // As the real server: a resume without the secret the open gave is refused, so the
                        // resume tests below pass only if the client kept and sent it.
                        if resume.secret != secret_of(id) {
                            let _ = tx.try_send(Err(Status::permission_denied("wrong session secret")));
                            return;
                        }
                        state.streams.insert(id, tx.clone());
                        let opened = v1::Opened { session_id: id, lease_ms: 0, secret: String::new() };
                        let _ = tx.try_send(event(EventKind::Opened(opened)));
                        for (name, (s, fence, token)) in &state.holds {
                            if *s == id {
                                let acquired = v1::Acquired {
                                    name: name.clone(),
                                    fence: *fence,
                                    token: token.clone(),
                                    value: vec![],
                                };
                                let _ = tx.try_send(event(EventKind::Acquired(acquired)));
                            }
                        }
                        id
                    }
                    _ => {
                        let _ = tx.try_send(Err(Status::invalid_argument("open or resume first")));
                        return;
                    }
                }
            };
            while let Ok(Some(SessionRequest { kind: Some(kind) })) = inbound.message().await {
                // A broken stream (its outbox taken away) hears nothing more.
                let current = fake.state.lock().unwrap().streams.get(&session).is_some_and(|t| t.same_channel(&tx));
                if !current || fake.handle(session, kind, &tx) {
                    break;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    /// Grants as on a `Calls` stream, at once.
    async fn acquire(&self, request: Request<v1::AcquireRequest>) -> Result<Response<v1::Hold>, Status> {
        self.note(|s| s.unary_acquires += 1);
        match self.one_shot(request.get_ref()) {
            Some((_, v1::ResultKind::Hold(hold))) => Ok(Response::new(hold)),
            _ => Err(Status::unimplemented("the fake grants every unary acquire of a plain name")),
        }
    }

    async fn renew(&self, _: Request<v1::RenewRequest>) -> Result<Response<v1::Hold>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn release(&self, _: Request<v1::ReleaseRequest>) -> Result<Response<v1::ReleaseResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn set_value(&self, _: Request<v1::SetValueRequest>) -> Result<Response<v1::Hold>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn watch(&self, _: Request<v1::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn get(&self, _: Request<v1::GetRequest>) -> Result<Response<v1::Lock>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn list(&self, _: Request<v1::ListRequest>) -> Result<Response<v1::ListResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn cluster_status(
        &self,
        _: Request<v1::ClusterStatusRequest>,
    ) -> Result<Response<v1::ClusterStatusResponse>, Status> {
        Ok(Response::new(v1::ClusterStatusResponse { id: 1, leader: 1, state: "Leader".into(), ..Default::default() }))
    }

    /// Admits the key `fake-admin-key` only, and adds any id.
    async fn add_member(
        &self,
        request: Request<v1::AddMemberRequest>,
    ) -> Result<Response<v1::ClusterStatusResponse>, Status> {
        let key = request.metadata().get("authorization").and_then(|v| v.to_str().ok());
        if key != Some("Bearer fake-admin-key") {
            return Err(problem(tonic::Code::Unauthenticated, "unauthenticated", "wrong admin key"));
        }
        let id = request.into_inner().id;
        Ok(Response::new(v1::ClusterStatusResponse { id: 1, leader: 1, voters: vec![1, id], ..Default::default() }))
    }

    /// Knows no member to remove.
    async fn remove_member(
        &self,
        request: Request<v1::RemoveMemberRequest>,
    ) -> Result<Response<v1::ClusterStatusResponse>, Status> {
        let detail = format!("node {} is not a member", request.into_inner().id);
        Err(problem(tonic::Code::FailedPrecondition, "not-a-member", &detail))
    }

    async fn snapshot(&self, _request: Request<v1::SnapshotRequest>) -> Result<Response<v1::SnapshotResponse>, Status> {
        Err(Status::unimplemented("the fake server keeps no snapshots"))
    }
}

fn problem(code: tonic::Code, slug: &str, detail: &str) -> Status {
    let mut metadata = tonic::metadata::MetadataMap::new();
    metadata.insert(PROBLEM_METADATA, format!("urn:holdfast:{slug}").parse().unwrap());
    Status::with_metadata(code, detail, metadata)
}

/// A fake on a loopback port and a client connected to it.
async fn start() -> (Fake, Client) {
    let fake = Fake::new();
    let addr = serve(&fake).await;
    let client = Client::builder([addr])
        .owner("fake-test")
        .request_timeout(Duration::from_secs(2))
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    (fake, client)
}

/// Serves `fake` on a loopback port; returns its address.
async fn serve(fake: &Fake) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = LocksServer::new(fake.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    addr.to_string()
}

#[tokio::test]
async fn locks_are_granted_queued_and_handed_over_in_order() {
    let (fake, client) = start().await;
    let first = client.session(Duration::from_secs(2)).await.unwrap();
    let second = client.session(Duration::from_secs(2)).await.unwrap();
    let held = first.lock("a", None).await.unwrap();
    assert_eq!(fake.holder("a"), Some(first.id()));
    assert!(second.try_lock("a").await.unwrap().is_none());
    assert_eq!(second.lock("a", Some(Duration::ZERO)).await.unwrap_err(), Error::Busy { holder: None });
    let waiter = {
        let second = second.clone();
        tokio::spawn(async move { second.lock("a", None).await })
    };
    timeout(BOUND, async {
        while fake.waiters("a") != [second.id()] {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the second session queues");
    let lost = held.lost();
    let first_fence = held.fence();
    held.release().await.unwrap();
    assert!(lost.is_cancelled(), "a released lock's token is cancelled");
    let handed = timeout(BOUND, waiter).await.unwrap().unwrap().unwrap();
    assert!(handed.fence() > first_fence);
    assert_eq!(fake.holder("a"), Some(second.id()));
    // A session claims a lock once.
    assert!(matches!(second.try_lock("a").await, Err(Error::InvalidArgument(_))));
}

#[tokio::test]
async fn a_lock_is_lost_one_lease_after_the_last_acknowledged_heartbeat() {
    let (fake, client) = start().await;
    let lease = Duration::from_millis(800);
    let session = client.session(lease).await.unwrap();
    let held = session.lock("a", None).await.unwrap();
    // Acks flow: the lock outlives several leases.
    let beats = fake.seen.borrow().heartbeats;
    fake.wait_for("heartbeats", |s| s.heartbeats >= beats + 8).await;
    assert!(!held.is_lost());
    let stopped = Instant::now();
    fake.ack_heartbeats(false);
    timeout(BOUND, held.lost().cancelled()).await.expect("the lock is declared lost");
    let late = Instant::now().saturating_duration_since(stopped + lease);
    // Every heartbeat acked was sent before the acks stopped, so the lease ended by `stopped + lease`; the
    // token fires from a timer, hence the slack.
    assert!(late < Duration::from_millis(300), "lost {late:?} after the lease");
    assert!(held.is_lost() && session.is_lost());
    assert!(session.ended().is_cancelled());
    assert_eq!(session.lock("b", None).await.unwrap_err(), Error::SessionLost);
}

#[tokio::test]
async fn a_broken_stream_is_resumed_and_the_session_keeps_its_locks() {
    let (fake, client) = start().await;
    let session = client.session(Duration::from_secs(1)).await.unwrap();
    let held = session.lock("a", None).await.unwrap();
    fake.break_streams();
    let seen = fake.wait_for("a resume", |s| s.resumes >= 1).await;
    // Heartbeats on the new stream are acknowledged and keep the lease.
    fake.wait_for("heartbeats after the resume", |s| s.heartbeats >= seen.heartbeats + 8).await;
    assert!(!held.is_lost());
    assert_eq!(fake.holder("a"), Some(session.id()));
    // The session still works on the new stream.
    let b = session.lock("b", None).await.unwrap();
    assert!(b.fence() > held.fence());
    held.release().await.unwrap();
    assert_eq!(fake.holder("a"), None);
    session.close().await.unwrap();
    assert!(b.is_lost());
    assert_eq!(fake.holder("b"), None, "closing hands every lock over");
}

#[tokio::test]
async fn a_session_the_server_forgot_is_lost_at_its_resume() {
    let (fake, client) = start().await;
    let lease = Duration::from_secs(10);
    let session = client.session(lease).await.unwrap();
    let held = session.lock("a", None).await.unwrap();
    fake.forget_session(session.id());
    let broken = Instant::now();
    fake.break_streams();
    timeout(BOUND, held.lost().cancelled()).await.expect("the lock is declared lost");
    assert!(broken.elapsed() < lease / 2, "lost at the NOT_FOUND, not at the lease's end");
    assert_eq!(session.try_lock("b").await.unwrap_err(), Error::SessionLost);
    assert_eq!(session.close().await.unwrap_err(), Error::SessionLost);
}

#[tokio::test]
async fn a_lock_missing_from_the_report_after_a_resume_is_lost_and_the_others_are_kept() {
    let (fake, client) = start().await;
    let session = client.session(Duration::from_secs(2)).await.unwrap();
    let a = session.lock("a", None).await.unwrap();
    let b = session.lock("b", None).await.unwrap();
    fake.drop_hold("a");
    fake.break_streams();
    timeout(BOUND, a.lost().cancelled()).await.expect("the unreported lock is declared lost");
    // The client also releases it, in case the server does hold it after all.
    fake.wait_for("a release of the lost lock", |s| s.releases.iter().any(|(_, n)| n == "a")).await;
    assert!(!b.is_lost());
    assert!(!session.is_lost());
    b.release().await.unwrap();
    assert_eq!(a.release().await.unwrap_err(), Error::SessionLost, "a lost lock has nothing left to release");
}

/// A session whose open was answered after more than half its lease is refused: the rest of its lease
/// might run out before its first heartbeat is answered. (The client asks the server to close it, as a
/// courtesy: the server ends it at its lease in any case.)
#[tokio::test]
async fn a_session_opened_too_slowly_is_refused() {
    let (fake, client) = start().await;
    fake.state.lock().unwrap().open_delay = Duration::from_millis(300);
    let refused = client.session(Duration::from_millis(400)).await;
    assert!(matches!(&refused, Err(Error::Unavailable(detail)) if detail.contains("too slowly")), "{refused:?}");
}

#[tokio::test]
async fn a_wait_that_times_out_leaves_the_queue() {
    let (fake, client) = start().await;
    let first = client.session(Duration::from_secs(2)).await.unwrap();
    let second = client.session(Duration::from_secs(2)).await.unwrap();
    let _held = first.lock("a", None).await.unwrap();
    let started = Instant::now();
    let wait = Duration::from_millis(200);
    assert_eq!(second.lock("a", Some(wait)).await.unwrap_err(), Error::Timeout);
    assert!(started.elapsed() >= wait);
    fake.wait_for("the waiter's release", |s| s.releases.contains(&(second.id(), "a".into()))).await;
    assert!(fake.waiters("a").is_empty());
}

#[tokio::test]
async fn dropping_a_lock_or_every_handle_releases_in_the_background() {
    let (fake, client) = start().await;
    let session = client.session(Duration::from_secs(2)).await.unwrap();
    let held = session.lock("a", None).await.unwrap();
    drop(held);
    fake.wait_for("the release of the dropped lock", |s| s.releases.contains(&(session.id(), "a".into()))).await;
    assert_eq!(fake.holder("a"), None);
    // Taking it again right after the drop works (it waits for the release if needed).
    let again = session.lock("a", None).await.unwrap();
    assert_eq!(fake.holder("a"), Some(session.id()));
    drop(session);
    assert!(!again.is_lost(), "a held lock keeps its session alive");
    drop(again);
    fake.wait_for("the close of a session nobody uses", |s| s.closes >= 1).await;
}

#[tokio::test]
async fn with_lock_runs_the_work_and_closes() {
    let (fake, client) = start().await;
    let fence = client
        .with_lock("job", Duration::from_secs(2), |held| async move {
            assert!(!held.is_lost());
            held.fence()
        })
        .await
        .unwrap();
    assert!(fence > 0);
    assert_eq!(fake.holder("job"), None);
    assert_eq!(fake.seen.borrow().closes, 1);
    let (session, held) = client.try_lock("job", Duration::from_secs(2)).await.unwrap().expect("free");
    assert!(client.try_lock("job", Duration::from_secs(2)).await.unwrap().is_none());
    assert!(matches!(
        client.lock_timeout("job", Duration::from_secs(2), Duration::from_millis(50)).await,
        Err(Error::Timeout)
    ));
    held.release().await.unwrap();
    session.close().await.unwrap();
}

#[tokio::test]
async fn membership_calls_carry_the_admin_key_and_map_refusals() {
    let (_fake, client) = start().await;
    let status = client.add_member(4, "h4:7071", Some("fake-admin-key")).await.unwrap();
    assert_eq!(status.voters, vec![1, 4]);
    assert!(matches!(client.add_member(4, "h4:7071", None).await, Err(Error::Unauthenticated(_))));
    assert!(matches!(client.add_member(4, "h4:7071", Some("other")).await, Err(Error::Unauthenticated(_))));
    match client.remove_member(9, Some("fake-admin-key")).await {
        Err(Error::Refused(detail)) => assert!(detail.contains("not a member"), "{detail}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

// ---- one-shot calls on a `Calls` stream ----

#[tokio::test]
async fn one_shot_calls_share_one_stream_and_each_gets_its_own_answer_in_any_order() {
    let (fake, client) = start().await;
    // Answered in the reverse of the order they were sent: the later the call, the sooner its answer.
    let names: Vec<String> = (0..16).map(|i| format!("late-{}-{i}", (16 - i) * 10)).collect();
    let calls = names.iter().map(|name| client.acquire(name, Duration::from_secs(30), Duration::ZERO));
    let holds = timeout(BOUND, futures_util::future::join_all(calls)).await.expect("answered in time");
    for (name, hold) in names.iter().zip(holds) {
        let hold = hold.expect("granted");
        assert_eq!((&hold.name, hold.owner.as_str()), (name, "fake-test"));
    }
    let seen = fake.wait_for("every call", |s| s.calls.len() == 16).await;
    assert_eq!((seen.call_streams, seen.unary_acquires), (1, 0), "{seen:?}");
    // An error answer is the error of the unary call, holder included.
    match client.acquire("busy-1", Duration::from_secs(30), Duration::ZERO).await {
        Err(Error::Busy { holder: Some(holder) }) => assert_eq!((holder.owner.as_str(), holder.fence), ("someone", 41)),
        other => panic!("expected busy, got {other:?}"),
    }
}

#[tokio::test]
async fn a_call_given_up_is_cancelled_on_the_stream() {
    let fake = Fake::new();
    let client = Client::builder([serve(&fake).await])
        .request_timeout(Duration::from_millis(300))
        .max_attempts(1)
        .build()
        .unwrap();
    let answer = client.acquire("slow-1", Duration::from_secs(30), Duration::ZERO).await;
    assert!(matches!(answer, Err(Error::Unavailable(_))), "{answer:?}");
    let seen = fake.wait_for("the cancel", |s| !s.cancels.is_empty()).await;
    let id = seen.calls.iter().find(|(_, name)| name == "slow-1").expect("the call was sent").0;
    assert_eq!(seen.cancels, [id]);
    // An answered call is not cancelled.
    client.acquire("plain", Duration::from_secs(30), Duration::ZERO).await.expect("granted");
    let seen = fake.wait_for("the second call", |s| s.calls.len() == 2).await;
    assert_eq!(seen.cancels, [id]);
}

#[tokio::test]
async fn a_broken_stream_fails_the_calls_on_it_and_the_next_call_opens_another() {
    let fake = Fake::new();
    let client =
        Client::builder([serve(&fake).await]).request_timeout(Duration::from_secs(30)).max_attempts(1).build().unwrap();
    let waiting = tokio::spawn({
        let client = client.clone();
        async move { client.acquire("slow-2", Duration::from_secs(30), Duration::ZERO).await }
    });
    fake.wait_for("the call", |s| s.calls.len() == 1).await;
    fake.break_calls();
    match timeout(BOUND, waiting).await.expect("failed in time").unwrap() {
        Err(Error::Unavailable(why)) => assert!(why.contains("broke the calls stream"), "{why}"),
        other => panic!("expected unavailable, got {other:?}"),
    }
    let hold = client.acquire("after", Duration::from_secs(30), Duration::ZERO).await.expect("granted");
    assert_eq!(hold.name, "after");
    assert_eq!(fake.wait_for("a second stream", |s| s.call_streams == 2).await.calls.len(), 2);
}

#[tokio::test]
async fn a_node_without_a_calls_stream_gets_unary_calls() {
    let fake = Fake::new();
    fake.state.lock().unwrap().no_calls = true;
    let client = Client::builder([serve(&fake).await]).build().unwrap();
    for name in ["one", "two"] {
        let hold = client.acquire(name, Duration::from_secs(30), Duration::ZERO).await.expect("granted");
        assert_eq!(hold.name, name);
    }
    let seen = fake.wait_for("two unary acquires", |s| s.unary_acquires == 2).await;
    assert_eq!((seen.call_streams, seen.calls.len()), (0, 0));
}

#[tokio::test]
async fn the_first_call_travels_with_the_opening_of_the_stream() {
    let fake = Fake::new();
    fake.state.lock().unwrap().headers_after_first_call = true;
    let client = Client::builder([serve(&fake).await]).max_attempts(1).build().unwrap();
    let hold = timeout(BOUND, client.acquire("first", Duration::from_secs(30), Duration::ZERO)).await;
    assert_eq!(hold.expect("answered in time").expect("granted").name, "first");
    let hold = client.acquire("second", Duration::from_secs(30), Duration::ZERO).await.expect("granted");
    assert_eq!(hold.name, "second");
    assert_eq!(fake.wait_for("two calls", |s| s.calls.len() == 2).await.call_streams, 1);
}
