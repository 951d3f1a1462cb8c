//! Sessions: a stream that owns its claims, kept alive by heartbeats, and the locks it holds.
//!
//! A [`Session`] is a handle to a background task that owns the gRPC stream. Handles talk to the task through
//! a channel of [`Command`]s; the task answers each through a oneshot. The task alone:
//!
//! - sends a heartbeat every lease/4 and keeps the lease by the client's own clock ([`LeaseClock`]): the
//!   session, and every lock it holds, is confirmed until `send instant of the last acknowledged heartbeat +
//!   lease`. When that instant passes without a newer ack, every lock is declared lost at once (its
//!   [`CancellationToken`] is cancelled), whatever the network is doing;
//! - reconnects when the stream breaks (or stops acknowledging heartbeats for half a lease), to the next
//!   endpoint with backoff, and sends `Resume`; the server keeps the session's locks and queue places. Then
//!   it sends again every request that had no answer;
//! - after a resume, checks the server's account against its own: a lock the client thinks it holds but the
//!   server did not report again by the first heartbeat ack is declared lost (and released, in case);
//! - releases every grant nobody is waiting for (a caller that gave up, a grant that arrived late): a lock
//!   no handle knows about must not stay held.
//!
//! Claims are kept per lock name: a session holds or waits for a lock at most once, and the server answers
//! by name.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use holdfast_proto::v1::{
    self, Close, EventKind, Heartbeat, Open, RequestKind, Resume, SessionAcquire, SessionEvent, SessionRelease,
    SessionRequest,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{sleep_until, Instant, MissedTickBehavior};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::lease::{heartbeat_interval, next_tick, LeaseClock};
use crate::pool::{Pool, Retry};
use crate::types::{millis_ceil, AcquireOptions, HolderInfo};

/// `Lost` reasons that say the whole session is over, not just one lock.
const SESSION_OVER_REASONS: [&str; 3] = ["expired", "session-closed", "session-gone"];

/// A lock session: a connection to the cluster that owns its claims.
///
/// Made by [`Client::session`](crate::Client::session). The session heartbeats in the background and
/// survives the loss of the node it talks to (it resumes on another, keeping its locks and queue places, as
/// long as its lease has not run out by the client's clock).
///
/// Handles are cheap to clone and all refer to the same session. The session ends when
/// [`close`](Self::close) is called, when its lease runs out, or when every handle and every [`HeldLock`] of
/// it is dropped (it is then closed in the background).
#[derive(Clone)]
pub struct Session {
    shared: Arc<Shared>,
    commands: mpsc::UnboundedSender<Command>,
    pool: Arc<Pool>,
}

/// A lock held by a session.
///
/// Ownership is confirmed only while [`lost`](Self::lost) is not cancelled: pass the
/// [`fence`](Self::fence) to whatever the lock protects, so that it can turn away a holder that was too slow
/// to notice it lost the lock.
///
/// Dropping a `HeldLock` releases the lock in the background; [`release`](Self::release) does it and waits
/// for the server's answer.
pub struct HeldLock {
    name: String,
    fence: u64,
    token: String,
    value: Vec<u8>,
    pool: Arc<Pool>,
    lost: CancellationToken,
    shared: Arc<Shared>,
    commands: mpsc::UnboundedSender<Command>,
    released: bool,
}

/// What the handles and the task share.
struct Shared {
    id: u64,
    lease: Duration,
    /// Cancelled when the session ends, for whatever reason; every lock's token is a child of it.
    ended: CancellationToken,
    /// The lease is confirmed until `base + confirmed_until_ns`, so that `is_lost` can read the clock
    /// instead of trusting a timer to have fired on time.
    base: Instant,
    confirmed_until_ns: AtomicU64,
    next_ticket: AtomicU64,
}

impl Shared {
    fn set_confirmed_until(&self, until: Instant) {
        let ns = u64::try_from(until.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX);
        self.confirmed_until_ns.fetch_max(ns, Ordering::Release);
    }

    fn confirmed_until(&self) -> Instant {
        self.base + Duration::from_nanos(self.confirmed_until_ns.load(Ordering::Acquire))
    }

    fn is_confirmed_now(&self) -> bool {
        !self.ended.is_cancelled() && Instant::now() < self.confirmed_until()
    }

    fn ticket(&self) -> u64 {
        self.next_ticket.fetch_add(1, Ordering::Relaxed)
    }
}

/// A request from a handle to the session task.
enum Command {
    /// Ask for `name`. `ticket` tells this request apart from earlier and later ones for the same name.
    Acquire { name: String, ticket: u64, wait: bool, ask: AcquireOptions, reply: AcquireReply },
    /// The caller of the `Acquire` with `ticket` stopped waiting (timeout, or its future was dropped).
    Abandon { name: String, ticket: u64 },
    /// Let go of the grant of `name` whose token is `token` (and of nothing newer).
    Release { name: String, token: String, reply: Option<oneshot::Sender<Result<(), Error>>> },
    /// End the session.
    Close { reply: oneshot::Sender<Result<(), Error>> },
}

type AcquireReply = oneshot::Sender<Result<Answer, Error>>;

/// The final answer to an `Acquire`.
enum Answer {
    Granted { fence: u64, token: String, value: Vec<u8>, lost: CancellationToken },
    Busy { holder: Option<HolderInfo> },
}

impl Session {
    /// Opens a session with `lease` on the pool's preferred endpoint (falling back through the others).
    pub(crate) async fn open(pool: Arc<Pool>, lease: Duration) -> Result<Session, Error> {
        if lease < Duration::from_millis(1) {
            return Err(Error::InvalidArgument(format!("lease {lease:?} is shorter than 1 ms")));
        }
        let open = Open { owner: pool.config.owner.clone(), lease_ms: millis_ceil(lease) };
        let (conn, endpoint, opened, sent_at) = pool
            .call("open session", pool.retry(Duration::ZERO), |i, client| {
                let open = open.clone();
                async move {
                    let (conn, opened, sent_at) = open_stream(client, RequestKind::Open(open)).await?;
                    Ok((conn, i, opened, sent_at))
                }
            })
            .await?;
        // The server may grant a different lease within its bounds; count with the shorter of the two.
        let lease = match opened.lease_ms {
            0 => lease,
            ms => lease.min(Duration::from_millis(ms)),
        };
        let clock = LeaseClock::new(lease, sent_at);
        let shared = Arc::new(Shared {
            id: opened.session_id,
            lease,
            ended: CancellationToken::new(),
            base: sent_at,
            confirmed_until_ns: AtomicU64::new(0),
            next_ticket: AtomicU64::new(1),
        });
        shared.set_confirmed_until(clock.confirmed_until());
        if !clock.is_alive(Instant::now() + lease / 2) {
            // Opening took more than half the lease: what is left may run out before the first heartbeat
            // (sent a quarter of a lease after the open) can be answered, and a session handed to the caller
            // only to be lost at once is worse than an error it can retry. Let the server end it.
            let _ = conn.tx.send(request(RequestKind::Close(Close {})));
            return Err(Error::Unavailable(format!(
                "the session was opened too slowly (more than half its lease of {lease:?}) to be used"
            )));
        }
        tracing::debug!(session = opened.session_id, endpoint = %pool.endpoints()[endpoint], ?lease, "session opened");
        let (commands, command_rx) = mpsc::unbounded_channel();
        let task = Task {
            pool: pool.clone(),
            shared: shared.clone(),
            commands: command_rx,
            handles_gone: false,
            clock,
            claims: BTreeMap::new(),
            conn: Some(conn),
            secret: opened.secret,
            endpoint,
            replay: None,
            closing: None,
        };
        tokio::spawn(task.run());
        Ok(Session { shared, commands, pool })
    }

    /// The session's id, as the server knows it.
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// The lease the session is kept with (the shorter of the one asked for and the one the server granted).
    pub fn lease(&self) -> Duration {
        self.shared.lease
    }

    /// Cancelled when the session ends: closed, or lost (lease run out by the client's clock, expired or
    /// closed by the server, or not resumable). Every lock's [`HeldLock::lost`] is cancelled with it.
    pub fn ended(&self) -> CancellationToken {
        self.shared.ended.clone()
    }

    /// Whether the session is no longer confirmed alive right now. Reads the clock, so it turns true at the
    /// lease's end even if the background task has not run yet.
    pub fn is_lost(&self) -> bool {
        !self.shared.is_confirmed_now()
    }

    /// Takes the lock `name`, waiting in its FIFO queue for up to `wait` (`None`: as long as the session
    /// lives).
    ///
    /// On timeout the session leaves the queue (a grant that raced with the timeout is released) and this
    /// returns [`Error::Timeout`]. `Some(Duration::ZERO)` does not queue at all: it is a try-lock that fails
    /// with [`Error::Busy`] naming the holder. Dropping the returned future also leaves the queue.
    ///
    /// A session claims a lock once: asking again for a lock it holds or waits for fails with
    /// [`Error::InvalidArgument`]. Asking again for a lock it is still releasing waits for the release.
    pub async fn lock(&self, name: impl Into<String>, wait: Option<Duration>) -> Result<HeldLock, Error> {
        self.lock_with_value(name, wait, Vec::new()).await
    }

    /// [`lock`](Self::lock), publishing `value` (at most 1 KiB) while the session holds the lock: reads,
    /// busy answers and watches of the lock show it (an elected leader's address, for example).
    pub async fn lock_with_value(
        &self,
        name: impl Into<String>,
        wait: Option<Duration>,
        value: impl Into<Vec<u8>>,
    ) -> Result<HeldLock, Error> {
        self.lock_with(name, wait, AcquireOptions { value: value.into(), ..AcquireOptions::default() }).await
    }

    /// [`lock`](Self::lock) with [`AcquireOptions`]: a value to publish while the session holds the lock, a
    /// lock-delay if the session's lease runs out while it does.
    pub async fn lock_with(
        &self,
        name: impl Into<String>,
        wait: Option<Duration>,
        options: AcquireOptions,
    ) -> Result<HeldLock, Error> {
        let (name, value) = (name.into(), options);
        if wait == Some(Duration::ZERO) {
            return match self.acquire(name, false, None, value).await? {
                Ok(held) => Ok(held),
                Err(holder) => Err(Error::Busy { holder: holder.map(Box::new) }),
            };
        }
        let deadline = wait.map(|w| Instant::now() + w);
        match self.acquire(name, true, deadline, value).await? {
            Ok(held) => Ok(held),
            Err(holder) => Err(Error::Protocol(format!("a waiting acquire was answered Busy (holder {holder:?})"))),
        }
    }

    /// Takes the lock `name` if it is free; `Ok(None)` if someone else holds it.
    pub async fn try_lock(&self, name: impl Into<String>) -> Result<Option<HeldLock>, Error> {
        Ok(self.acquire(name.into(), false, None, AcquireOptions::default()).await?.ok())
    }

    /// Sends one acquire and waits for its final answer: the lock, or (for a try-lock) who holds it.
    async fn acquire(
        &self,
        name: String,
        wait: bool,
        deadline: Option<Instant>,
        ask: AcquireOptions,
    ) -> Result<Result<HeldLock, Option<HolderInfo>>, Error> {
        if self.shared.ended.is_cancelled() {
            return Err(Error::SessionLost);
        }
        let ticket = self.shared.ticket();
        let (reply, answer) = oneshot::channel();
        let command = Command::Acquire { name: name.clone(), ticket, wait, ask, reply };
        self.commands.send(command).map_err(|_| Error::SessionLost)?;
        let mut guard = AbandonGuard { commands: &self.commands, name: &name, ticket, armed: true };
        let answer = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, answer).await.map_err(|_| Error::Timeout)?,
            None => answer.await,
        };
        // The task dropped the reply: it ended, and with it the session.
        let answer = answer.map_err(|_| Error::SessionLost)?;
        guard.armed = false;
        drop(guard);
        Ok(match answer? {
            Answer::Granted { fence, token, value, lost } => Ok(HeldLock {
                name,
                fence,
                token,
                value,
                pool: self.pool.clone(),
                lost,
                shared: self.shared.clone(),
                commands: self.commands.clone(),
                released: false,
            }),
            Answer::Busy { holder } => Err(holder),
        })
    }

    /// Ends the session cleanly: its locks are handed to their next waiters at once, and its waits are
    /// withdrawn. Every [`HeldLock::lost`] is cancelled before the close is sent.
    ///
    /// Returns [`Error::SessionLost`] if the session had already ended some other way. If the cluster cannot
    /// be reached, gives up after the request timeout (the server then ends the session when its lease runs
    /// out).
    pub async fn close(self) -> Result<(), Error> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(Command::Close { reply }).map_err(|_| Error::SessionLost)?;
        answer.await.map_err(|_| Error::SessionLost)?
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.shared.id)
            .field("lease", &self.shared.lease)
            .field("lost", &self.is_lost())
            .finish()
    }
}

/// Tells the task that the caller of an acquire stopped waiting, unless disarmed: runs on timeout and when
/// the caller's future is dropped mid-wait.
struct AbandonGuard<'a> {
    commands: &'a mpsc::UnboundedSender<Command>,
    name: &'a str,
    ticket: u64,
    armed: bool,
}

impl Drop for AbandonGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.commands.send(Command::Abandon { name: self.name.to_owned(), ticket: self.ticket });
        }
    }
}

impl HeldLock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The grant's fence: it grows with every grant of every lock. Pass it to the protected resource so it
    /// can turn away a stale holder.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The grant's secret token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The value the lock publishes, as this holder last set it.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// Publishes `value` (at most 1 KiB) in place of the lock's value: one log entry, the fence stays, the
    /// lock's revision moves, and watchers see it. Fails with [`Error::NotHolder`] if the lock was lost.
    pub async fn set_value(&mut self, value: impl Into<Vec<u8>>) -> Result<(), Error> {
        if self.is_lost() {
            return Err(Error::SessionLost);
        }
        let value = value.into();
        crate::client::set_value_on(&self.pool, &self.name, &self.token, value.clone()).await?;
        self.value = value;
        Ok(())
    }

    /// Cancelled the moment ownership is no longer confirmed: the session's lease ran out by the client's
    /// clock without a newer heartbeat ack, the server reported the lock or session lost, the session was
    /// closed, or the lock is being released. The token fires from a timer, so it may fire a moment after
    /// the lease's end; [`is_lost`](Self::is_lost) reads the clock and does not lag.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Until when ownership is confirmed by this client's clock: the send instant of the last acknowledged
    /// heartbeat plus the lease (unless [`lost`](Self::lost) says otherwise sooner).
    pub fn confirmed_until(&self) -> Instant {
        self.shared.confirmed_until()
    }

    /// Whether ownership is no longer confirmed right now.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled() || !self.shared.is_confirmed_now()
    }

    /// Lets go of the lock and waits until the server confirms; the next waiter is granted at once.
    ///
    /// [`lost`](Self::lost) is cancelled before the release is sent. Returns [`Error::SessionLost`] if the
    /// lock had already been lost (then there is nothing left to release).
    pub async fn release(mut self) -> Result<(), Error> {
        self.released = true;
        let (reply, answer) = oneshot::channel();
        let command = Command::Release { name: self.name.clone(), token: self.token.clone(), reply: Some(reply) };
        self.commands.send(command).map_err(|_| Error::SessionLost)?;
        answer.await.map_err(|_| Error::SessionLost)?
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        if !self.released {
            let command = Command::Release { name: self.name.clone(), token: self.token.clone(), reply: None };
            // The session task releases it; if the task is gone, so is the session and the lock with it.
            let _ = self.commands.send(command);
        }
    }
}

impl std::fmt::Debug for HeldLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldLock")
            .field("name", &self.name)
            .field("fence", &self.fence)
            .field("session", &self.shared.id)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

// ---- the background task ----

/// One session stream: where requests go and events come from.
struct Conn {
    tx: mpsc::UnboundedSender<SessionRequest>,
    rx: tonic::Streaming<SessionEvent>,
}

impl Conn {
    fn send(&self, kind: RequestKind) {
        // A send fails only when the stream is gone; its receiving side will report why.
        let _ = self.tx.send(request(kind));
    }
}

fn request(kind: RequestKind) -> SessionRequest {
    SessionRequest { kind: Some(kind) }
}

/// Opens a session stream with `first` (Open or Resume) and waits for its `Opened`. Returns the stream, the
/// answer and the instant the first request was sent.
async fn open_stream(
    mut client: crate::pool::NodeClient,
    first: RequestKind,
) -> Result<(Conn, v1::Opened, Instant), Error> {
    let (tx, rx) = mpsc::unbounded_channel();
    let sent_at = Instant::now();
    tx.send(request(first)).expect("the receiver is alive");
    let mut stream = client.session(UnboundedReceiverStream::new(rx)).await.map_err(Error::from)?.into_inner();
    match stream.message().await.map_err(Error::from)? {
        Some(SessionEvent { kind: Some(EventKind::Opened(opened)) }) => Ok((Conn { tx, rx: stream }, opened, sent_at)),
        Some(SessionEvent { kind: Some(EventKind::Error(e)) }) => {
            Err(Error::from_problem(None, Some(&e.r#type), &e.detail))
        }
        Some(other) => Err(Error::Protocol(format!("expected Opened first, got {other:?}"))),
        None => Err(Error::Unavailable("the stream ended before Opened".into())),
    }
}

/// What the session knows about one lock name.
enum Claim {
    /// Asked for; no answer yet (or its answer was lost with a broken stream: re-sent after a resume).
    Pending { ticket: u64, wait: bool, ask: AcquireOptions, reply: AcquireReply, resend: bool },
    /// In the lock's queue.
    Waiting { ticket: u64, reply: AcquireReply },
    /// Granted and handed to a `HeldLock`.
    Held { ticket: u64, fence: u64, token: String, lost: CancellationToken },
    /// The caller gave up before an answer came. Released once the answer says the session holds or waits;
    /// `next` is an acquire for the same name that came in meanwhile.
    Abandoned { next: Option<Deferred> },
    /// A release was sent; waiting for `Released`. `next` as above.
    Releasing { replies: Vec<oneshot::Sender<Result<(), Error>>>, next: Option<Deferred>, resend: bool },
}

/// An acquire that waits for an earlier claim on the same name to end.
struct Deferred {
    ticket: u64,
    wait: bool,
    ask: AcquireOptions,
    reply: AcquireReply,
}

/// After a resume: the server reports every lock the session holds or waits for, then answers heartbeats.
struct Replay {
    /// The first heartbeat sent on the new stream; its ack closes the report.
    barrier: Option<u64>,
    /// Names the server reported held or waited for.
    seen: BTreeSet<String>,
}

/// How a session ended.
enum End {
    Closed,
    Lost(String),
}

/// Why the connected phase stopped.
enum Step {
    /// The stream broke; the session may still be alive: resume it.
    Broken(String),
    End(End),
}

/// A close in progress: who waits for it and when to stop waiting.
struct Closing {
    replies: Vec<oneshot::Sender<Result<(), Error>>>,
    deadline: Instant,
    sent: bool,
}

struct Task {
    pool: Arc<Pool>,
    shared: Arc<Shared>,
    commands: mpsc::UnboundedReceiver<Command>,
    /// Every handle and lock was dropped: nobody can send commands any more.
    handles_gone: bool,
    clock: LeaseClock,
    claims: BTreeMap<String, Claim>,
    conn: Option<Conn>,
    /// What resuming the session takes, as the server's `Opened` gave it: given once, kept here only
    /// (never logged, never in a `Debug`).
    secret: String,
    /// The endpoint of the current (or last) stream.
    endpoint: usize,
    replay: Option<Replay>,
    closing: Option<Closing>,
}

impl Task {
    async fn run(mut self) {
        let end = loop {
            let step = match self.conn.is_some() {
                true => self.connected().await,
                false => self.reconnect().await,
            };
            match step {
                None => continue,
                Some(Step::Broken(why)) => {
                    let endpoint = &self.pool.endpoints()[self.endpoint];
                    tracing::info!(session = self.shared.id, endpoint, why, "session stream broke; resuming");
                    self.conn = None;
                    self.replay = None;
                    self.clock.forget_outstanding();
                }
                Some(Step::End(end)) => break end,
            }
        };
        self.finish(end).await;
    }

    /// Runs the stream until it breaks or the session ends.
    async fn connected(&mut self) -> Option<Step> {
        let lease = self.clock.lease();
        // A stream whose heartbeats go unanswered for half a lease is stuck (a node that hangs, a partition
        // the transport has not noticed): leave it while there is still half a lease to resume elsewhere.
        let stall_after = lease / 2;
        // The first heartbeat at once (a resume's report ends at its ack), the next ones on the client's grid
        // (`next_tick`), with the client's other sessions of this lease.
        let period = heartbeat_interval(lease);
        let mut heartbeat =
            tokio::time::interval_at(next_tick(Instant::now(), self.pool.beat_origin(period), period), period);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Skip);
        let closing = matches!(self.closing, Some(Closing { sent: true, .. }));
        // Not on a lease already run out: the loop below ends the session first, as it did when this tick
        // was the interval's first.
        if !closing && Instant::now() < self.clock.confirmed_until() {
            self.on_tick();
        }
        loop {
            let closing = self.closing.as_ref().map(|c| (c.sent, c.deadline));
            let close_sent = matches!(closing, Some((true, _)));
            let stall_at = self.clock.oldest_unacked().map(|at| at + stall_after);
            let conn = self.conn.as_mut().expect("connected");
            tokio::select! {
                biased;
                _ = sleep_until(self.clock.confirmed_until()) => {
                    return Some(Step::End(match close_sent {
                        true => End::Closed,
                        false => End::Lost("the lease ran out by the client's clock without a newer ack".into()),
                    }));
                }
                _ = sleep_until(closing.map_or_else(Instant::now, |(_, d)| d)), if close_sent => {
                    tracing::debug!(session = self.shared.id, "the server did not end the stream after Close");
                    return Some(Step::End(End::Closed));
                }
                message = conn.rx.message() => match message {
                    Ok(Some(event)) => {
                        if let Some(step) = self.on_event(event) {
                            return Some(step);
                        }
                    }
                    Ok(None) if close_sent => return Some(Step::End(End::Closed)),
                    Ok(None) => return Some(Step::Broken("the server ended the stream".into())),
                    Err(_) if close_sent => return Some(Step::End(End::Closed)),
                    Err(status) => {
                        let error = Error::from(status);
                        return Some(match error {
                            Error::NotFound | Error::SessionLost => {
                                Step::End(End::Lost(format!("the server ended the session: {error}")))
                            }
                            error => Step::Broken(error.to_string()),
                        });
                    }
                },
                command = self.commands.recv(), if !self.handles_gone => self.on_command(command),
                _ = heartbeat.tick(), if !close_sent => self.on_tick(),
                _ = sleep_until(stall_at.unwrap_or_else(Instant::now)), if stall_at.is_some() && !close_sent => {
                    return Some(Step::Broken(format!("no heartbeat ack within {stall_after:?}")));
                }
            }
        }
    }

    /// Resumes the session on another stream, handling commands meanwhile. `None` once resumed.
    async fn reconnect(&mut self) -> Option<Step> {
        let n = self.pool.endpoints().len();
        let plan = Retry {
            start: (self.endpoint + 1) % n,
            attempt_timeout: self.pool.config.request_timeout,
            // Past the lease's end there is nothing left to resume.
            deadline: self.clock.confirmed_until(),
            hard_deadline: true,
            max_attempts: u32::MAX,
        };
        let pool = self.pool.clone();
        let id = self.shared.id;
        let resume = Resume { session_id: id, secret: self.secret.clone() };
        let resume = async move {
            pool.call("resume session", plan, |i, client| {
                let resume = resume.clone();
                async move {
                    let (conn, _, _) = open_stream(client, RequestKind::Resume(resume)).await?;
                    Ok((conn, i))
                }
            })
            .await
        };
        tokio::pin!(resume);
        loop {
            let close_deadline = self.closing.as_ref().map(|c| c.deadline);
            tokio::select! {
                biased;
                _ = sleep_until(self.clock.confirmed_until()) => {
                    return Some(Step::End(match self.closing {
                        Some(_) => End::Closed,
                        None => End::Lost("the lease ran out by the client's clock while reconnecting".into()),
                    }));
                }
                _ = sleep_until(close_deadline.unwrap_or_else(Instant::now)), if close_deadline.is_some() => {
                    return Some(Step::End(End::Closed));
                }
                resumed = &mut resume => return match resumed {
                    Ok((conn, endpoint)) => {
                        tracing::info!(session = id, endpoint = %self.pool.endpoints()[endpoint], "session resumed");
                        self.conn = Some(conn);
                        self.endpoint = endpoint;
                        self.after_resume();
                        None
                    }
                    Err(Error::NotFound | Error::SessionLost) => {
                        Some(Step::End(End::Lost("the server no longer knows the session (expired or closed)".into())))
                    }
                    Err(e) => Some(Step::End(End::Lost(format!("could not resume the session: {e}")))),
                },
                command = self.commands.recv(), if !self.handles_gone => self.on_command(command),
            }
        }
    }

    /// On a new stream: close if asked to, else send again what had no answer, and start checking the
    /// server's report of what the session holds against what the client thinks it holds.
    fn after_resume(&mut self) {
        let conn = self.conn.as_ref().expect("connected");
        if let Some(closing) = &mut self.closing {
            conn.send(RequestKind::Close(Close {}));
            closing.sent = true;
            return;
        }
        self.replay = Some(Replay { barrier: None, seen: BTreeSet::new() });
        for (name, claim) in &mut self.claims {
            match claim {
                Claim::Pending { wait, ask, resend, .. } => {
                    *resend = false;
                    conn.send(acquire(name, *wait, ask));
                }
                // The server keeps the queue place and reports it; asking again is answered the same (a
                // session's repeated acquire is idempotent) and covers a report that never comes.
                Claim::Waiting { .. } => conn.send(acquire(name, true, &AcquireOptions::default())),
                Claim::Held { .. } => {}
                Claim::Releasing { resend, .. } => {
                    *resend = false;
                    conn.send(release(name));
                }
                Claim::Abandoned { next } => {
                    // The acquire's answer went with the old stream: release whatever it did.
                    let next = next.take();
                    *claim = Claim::Releasing { replies: Vec::new(), next, resend: false };
                    conn.send(release(name));
                }
            }
        }
    }

    fn send(&self, kind: RequestKind) {
        if let Some(conn) = &self.conn {
            conn.send(kind);
        }
    }

    fn on_tick(&mut self) {
        let Some(conn) = &self.conn else { return };
        let now = Instant::now();
        let late_ms = self.clock.late_ms(now);
        let seq = self.clock.on_send(now);
        conn.send(RequestKind::Heartbeat(Heartbeat { seq, late_ms }));
        if let Some(replay) = &mut self.replay {
            replay.barrier.get_or_insert(seq);
        }
        // Requests the server answered "unavailable" (no leader for a moment) go again, at heartbeat pace.
        for (name, claim) in &mut self.claims {
            match claim {
                Claim::Pending { wait, ask, resend: resend @ true, .. } => {
                    *resend = false;
                    conn.send(acquire(name, *wait, ask));
                }
                Claim::Releasing { resend: resend @ true, .. } => {
                    *resend = false;
                    conn.send(release(name));
                }
                _ => {}
            }
        }
    }

    fn on_command(&mut self, command: Option<Command>) {
        let Some(command) = command else {
            // Every handle and lock is gone: nobody can use the session any more.
            self.handles_gone = true;
            self.start_close(None);
            return;
        };
        match command {
            Command::Acquire { name, ticket, wait, ask, reply } => {
                if self.closing.is_some() {
                    let _ = reply.send(Err(Error::SessionLost));
                    return;
                }
                match self.claims.get_mut(&name) {
                    None => self.start_acquire(name, Deferred { ticket, wait, ask, reply }),
                    Some(Claim::Releasing { next: next @ None, .. } | Claim::Abandoned { next: next @ None }) => {
                        *next = Some(Deferred { ticket, wait, ask, reply });
                    }
                    Some(_) => {
                        let why = format!("this session already holds or waits for lock {name:?}");
                        let _ = reply.send(Err(Error::InvalidArgument(why)));
                    }
                }
            }
            Command::Abandon { name, ticket } => self.abandon(name, ticket),
            Command::Release { name, token, reply } => match self.claims.get(&name) {
                Some(Claim::Held { token: held, lost, .. }) if *held == token => {
                    lost.cancel();
                    self.begin_release(name, reply.into_iter().collect(), None);
                }
                _ => {
                    // That grant is already gone (lost, or released through another path).
                    if let Some(reply) = reply {
                        let _ = reply.send(Err(Error::SessionLost));
                    }
                }
            },
            Command::Close { reply } => self.start_close(Some(reply)),
        }
    }

    fn abandon(&mut self, name: String, ticket: u64) {
        let Some(claim) = self.claims.get_mut(&name) else { return };
        match claim {
            Claim::Pending { ticket: t, .. } if *t == ticket => *claim = Claim::Abandoned { next: None },
            Claim::Waiting { ticket: t, .. } if *t == ticket => self.begin_release(name, Vec::new(), None),
            // Granted, but the caller stopped listening before it took the lock.
            Claim::Held { ticket: t, lost, .. } if *t == ticket => {
                lost.cancel();
                self.begin_release(name, Vec::new(), None);
            }
            // An acquire that was queued behind an earlier claim on the name and never started.
            Claim::Releasing { next, .. } | Claim::Abandoned { next }
                if next.as_ref().is_some_and(|d| d.ticket == ticket) =>
            {
                *next = None;
            }
            _ => {}
        }
    }

    fn start_acquire(&mut self, name: String, d: Deferred) {
        self.send(acquire(&name, d.wait, &d.ask));
        let Deferred { ticket, wait, ask, reply } = d;
        self.claims.insert(name, Claim::Pending { ticket, wait, ask, reply, resend: false });
    }

    fn begin_release(
        &mut self,
        name: String,
        replies: Vec<oneshot::Sender<Result<(), Error>>>,
        next: Option<Deferred>,
    ) {
        self.send(release(&name));
        self.claims.insert(name, Claim::Releasing { replies, next, resend: false });
    }

    /// Starts a close (once): every lock's token is cancelled first, since the server hands them over the
    /// moment it applies the close.
    fn start_close(&mut self, reply: Option<oneshot::Sender<Result<(), Error>>>) {
        if let Some(closing) = &mut self.closing {
            closing.replies.extend(reply);
            return;
        }
        for (_, claim) in std::mem::take(&mut self.claims) {
            fail_claim(claim, || Error::SessionLost, Ok(()));
        }
        let deadline = Instant::now() + self.pool.config.request_timeout;
        let sent = self.conn.is_some();
        self.send(RequestKind::Close(Close {}));
        self.closing = Some(Closing { replies: reply.into_iter().collect(), deadline, sent });
    }

    fn on_event(&mut self, event: SessionEvent) -> Option<Step> {
        let Some(kind) = event.kind else {
            tracing::warn!(session = self.shared.id, "empty session event");
            return None;
        };
        if self.closing.is_some() {
            // Everything is being handed over; only the end of the stream matters now.
            return None;
        }
        match kind {
            EventKind::Opened(_) => tracing::warn!(session = self.shared.id, "unexpected Opened mid-stream"),
            EventKind::Acquired(a) => self.on_acquired(a.name, a.fence, a.token, a.value),
            // Values are set through one-shot calls (`HeldLock::set_value`); a server answers this only to a
            // session request this client does not send.
            EventKind::ValueSet(v) => tracing::warn!(session = self.shared.id, name = v.name, "unexpected ValueSet"),
            EventKind::Waiting(w) => self.on_waiting(w.name, w.position),
            EventKind::Busy(b) => self.on_busy(b.name, b.holder.map(HolderInfo::from)),
            EventKind::Released(r) => self.on_released(r.name),
            EventKind::HeartbeatAck(ack) => self.on_ack(ack),
            EventKind::Lost(l) => return self.on_lost(l.name, l.reason),
            EventKind::Error(e) => return self.on_error(e),
        }
        None
    }

    fn saw(&mut self, name: &str) {
        if let Some(replay) = &mut self.replay {
            replay.seen.insert(name.to_owned());
        }
    }

    fn on_acquired(&mut self, name: String, fence: u64, token: String, value: Vec<u8>) {
        self.saw(&name);
        match self.claims.remove(&name) {
            Some(Claim::Pending { ticket, reply, .. } | Claim::Waiting { ticket, reply }) => {
                let lost = self.shared.ended.child_token();
                let answer = Answer::Granted { fence, token: token.clone(), value, lost: lost.clone() };
                match reply.send(Ok(answer)) {
                    Ok(()) => {
                        self.claims.insert(name, Claim::Held { ticket, fence, token, lost });
                    }
                    Err(_) => {
                        // The caller stopped waiting just before the grant came.
                        lost.cancel();
                        self.begin_release(name, Vec::new(), None);
                    }
                }
            }
            Some(Claim::Held { ticket, fence: f, token: t, lost }) => {
                if f == fence && t == token {
                    // The server's report after a resume, or the answer to a re-sent acquire.
                    self.claims.insert(name, Claim::Held { ticket, fence, token, lost });
                } else {
                    tracing::warn!(
                        session = self.shared.id,
                        name,
                        fence,
                        held_fence = f,
                        "a second grant of a held lock; treating the lock as lost"
                    );
                    lost.cancel();
                    self.begin_release(name, Vec::new(), None);
                }
            }
            Some(Claim::Abandoned { next }) => self.begin_release(name, Vec::new(), next),
            // The report after a resume came before our release was applied.
            Some(claim @ Claim::Releasing { .. }) => {
                self.claims.insert(name, claim);
            }
            None => {
                tracing::debug!(session = self.shared.id, name, "a grant nobody waits for; releasing it");
                self.begin_release(name, Vec::new(), None);
            }
        }
    }

    fn on_waiting(&mut self, name: String, position: u64) {
        self.saw(&name);
        tracing::trace!(session = self.shared.id, name, position, "waiting");
        match self.claims.remove(&name) {
            Some(Claim::Pending { ticket, reply, .. }) => {
                self.claims.insert(name, Claim::Waiting { ticket, reply });
            }
            Some(claim @ (Claim::Waiting { .. } | Claim::Releasing { .. })) => {
                self.claims.insert(name, claim);
            }
            Some(Claim::Held { lost, .. }) => {
                tracing::warn!(
                    session = self.shared.id,
                    name,
                    "the server says the session waits for a lock it held; treating it as lost"
                );
                lost.cancel();
                self.begin_release(name, Vec::new(), None);
            }
            Some(Claim::Abandoned { next }) => self.begin_release(name, Vec::new(), next),
            None => self.begin_release(name, Vec::new(), None),
        }
    }

    fn on_busy(&mut self, name: String, holder: Option<HolderInfo>) {
        match self.claims.remove(&name) {
            Some(Claim::Pending { reply, .. }) => {
                let _ = reply.send(Ok(Answer::Busy { holder }));
            }
            Some(Claim::Abandoned { next }) => self.start_next(name, next),
            Some(claim) => {
                tracing::debug!(session = self.shared.id, name, "Busy for a lock not being tried; ignored");
                self.claims.insert(name, claim);
            }
            None => {}
        }
    }

    fn on_released(&mut self, name: String) {
        match self.claims.remove(&name) {
            Some(Claim::Releasing { replies, next, .. }) => {
                for reply in replies {
                    let _ = reply.send(Ok(()));
                }
                self.start_next(name, next);
            }
            Some(Claim::Abandoned { next }) => self.start_next(name, next),
            Some(claim) => {
                tracing::warn!(session = self.shared.id, name, "Released for a lock not being released");
                fail_claim(claim, || Error::Protocol("the server released a claim nobody released".into()), Ok(()));
            }
            None => {}
        }
    }

    fn on_ack(&mut self, ack: v1::HeartbeatAck) {
        if self.clock.on_ack(ack.seq, Instant::now()) {
            self.shared.set_confirmed_until(self.clock.confirmed_until());
        }
        let barrier_passed = self.replay.as_ref().is_some_and(|r| r.barrier.is_some_and(|b| ack.seq >= b));
        if !barrier_passed {
            return;
        }
        let replay = self.replay.take().expect("checked");
        let missing: Vec<String> = self
            .claims
            .iter()
            .filter(|(name, claim)| matches!(claim, Claim::Held { .. }) && !replay.seen.contains(*name))
            .map(|(name, _)| name.clone())
            .collect();
        for name in missing {
            tracing::warn!(
                session = self.shared.id,
                name,
                "the server did not report a held lock after resuming; treating it as lost"
            );
            if let Some(Claim::Held { lost, .. }) = self.claims.remove(&name) {
                lost.cancel();
            }
            self.begin_release(name, Vec::new(), None);
        }
        let held = self.claims.values().filter(|c| matches!(c, Claim::Held { .. })).count();
        if held != ack.held as usize {
            tracing::debug!(session = self.shared.id, held, server_held = ack.held, "held counts differ after resume");
        }
    }

    fn on_lost(&mut self, name: String, reason: String) -> Option<Step> {
        tracing::warn!(session = self.shared.id, name, reason, "the server reports a lock lost");
        let session_over = SESSION_OVER_REASONS.contains(&reason.as_str());
        match self.claims.remove(&name) {
            // Not ours any more, as its releaser wanted; an acquire queued behind it may go ahead.
            Some(Claim::Releasing { replies, next, .. }) if !session_over => {
                for reply in replies {
                    let _ = reply.send(Ok(()));
                }
                self.start_next(name, next);
            }
            Some(Claim::Abandoned { next }) if !session_over => self.start_next(name, next),
            Some(claim) => fail_claim(claim, || Error::SessionLost, Ok(())),
            None => {}
        }
        if session_over {
            return Some(Step::End(End::Lost(format!("the server reports the session over ({reason})"))));
        }
        None
    }

    fn on_error(&mut self, e: v1::SessionError) -> Option<Step> {
        let error = Error::from_problem(None, Some(&e.r#type), &e.detail);
        if error == Error::SessionLost {
            return Some(Step::End(End::Lost(format!("the server ended the session: {}", e.detail))));
        }
        if e.name.is_empty() {
            // A heartbeat the leader could not confirm, or a request with no name: the lease clock decides.
            tracing::debug!(session = self.shared.id, problem = e.r#type, detail = e.detail, "session error");
            return None;
        }
        let name = e.name;
        let Some(claim) = self.claims.remove(&name) else {
            tracing::debug!(session = self.shared.id, name, problem = e.r#type, "session error for an unknown claim");
            return None;
        };
        match claim {
            // No leader for a moment: the outcome is unknown; ask again at heartbeat pace. The session's lease
            // bounds how long this goes on.
            Claim::Pending { ticket, wait, ask, reply, .. } if error.is_retryable() => {
                self.claims.insert(name, Claim::Pending { ticket, wait, ask, reply, resend: true });
            }
            Claim::Releasing { replies, next, .. } if error.is_retryable() => {
                self.claims.insert(name, Claim::Releasing { replies, next, resend: true });
            }
            Claim::Pending { reply, .. } | Claim::Waiting { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            // The session does not hold it (not-holder): released as far as it matters.
            Claim::Releasing { replies, next, .. } => {
                for reply in replies {
                    let _ = reply.send(Ok(()));
                }
                self.start_next(name, next);
            }
            Claim::Abandoned { next } => self.start_next(name, next),
            claim @ Claim::Held { .. } => {
                tracing::warn!(
                    session = self.shared.id,
                    name,
                    problem = e.r#type,
                    detail = e.detail,
                    "session error for a held lock"
                );
                self.claims.insert(name, claim);
            }
        }
        None
    }

    fn start_next(&mut self, name: String, next: Option<Deferred>) {
        if let Some(d) = next {
            self.start_acquire(name, d);
        }
    }

    /// Ends the session: answers everyone and, if the session was lost while a stream is still up, closes it
    /// so that the server hands over anything it still thinks the session holds.
    async fn finish(mut self, end: End) {
        self.shared.ended.cancel();
        let lost = matches!(end, End::Lost(_));
        if let End::Lost(why) = &end {
            tracing::warn!(session = self.shared.id, why, "session lost; every lock it held is lost");
        }
        for (_, claim) in std::mem::take(&mut self.claims) {
            fail_claim(claim, || Error::SessionLost, Err(Error::SessionLost));
        }
        if let Some(closing) = self.closing.take() {
            for reply in closing.replies {
                let _ = reply.send(match lost {
                    true => Err(Error::SessionLost),
                    false => Ok(()),
                });
            }
        } else if let Some(mut conn) = self.conn.take() {
            conn.send(RequestKind::Close(Close {}));
            let deadline = Instant::now() + self.pool.config.request_timeout;
            // Wait (bounded) for the server to end the stream, so the Close is not cut off by our reset.
            let _ =
                tokio::time::timeout_at(deadline, async { while let Ok(Some(_)) = conn.rx.message().await {} }).await;
        }
        // Commands that arrive from now on find the channel closed and report the session lost.
    }
}

/// Answers a claim that ends without its lock: acquirers get `acquire_error`, releasers `release_result`,
/// and a held lock's token is cancelled.
fn fail_claim(claim: Claim, acquire_error: impl Fn() -> Error, release_result: Result<(), Error>) {
    let fail_deferred = |next: Option<Deferred>| {
        if let Some(d) = next {
            let _ = d.reply.send(Err(acquire_error()));
        }
    };
    match claim {
        Claim::Pending { reply, .. } | Claim::Waiting { reply, .. } => {
            let _ = reply.send(Err(acquire_error()));
        }
        Claim::Held { lost, .. } => lost.cancel(),
        Claim::Abandoned { next } => fail_deferred(next),
        Claim::Releasing { replies, next, .. } => {
            for reply in replies {
                let _ = reply.send(release_result.clone());
            }
            fail_deferred(next);
        }
    }
}

fn acquire(name: &str, wait: bool, ask: &AcquireOptions) -> RequestKind {
    RequestKind::Acquire(SessionAcquire {
        name: name.to_owned(),
        wait,
        value: ask.value.clone(),
        lock_delay_ms: millis_ceil(ask.lock_delay),
        limit: ask.limit,
    })
}

fn release(name: &str) -> RequestKind {
    RequestKind::Release(SessionRelease { name: name.to_owned() })
}
