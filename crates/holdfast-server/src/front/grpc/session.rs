//! The session stream (`Locks.Session`): a connection that owns its claims.
//!
//! A session's stream may run through any node. The node turns the stream's requests into writes through
//! the leader, forwards heartbeats to the leader (which keeps the lease in memory), and pushes what its own
//! apply path tells it: grants of queued claims and the end of holds it did not ask to end (lost locks).
//! When the stream breaks, the session lives on until its lease runs out; the client may resume it through
//! any node.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use holdfast_core::{Outcome, SessionId, SessionSecret, SessionView, Token};
use holdfast_proto::v1::{self, Acquired, EventKind, RequestKind, SessionEvent, SessionRequest};
use tokio_stream::Stream;
use tonic::{Status, Streaming};

use super::request::{malformed, or_anonymous};
use crate::api::auth;
use crate::api::error::ApiError;
use crate::api::{locks, Api};
use crate::apply::events::{Notes, SessionNote};
use crate::front::proto::holder;
use crate::peer::protocol::{NodeError, Request, Written};

/// Events a session stream may have queued for a slow client before the node stops reading its requests.
pub const SESSION_OUTBOX: usize = 256;

pub type EventStream = Pin<Box<dyn Stream<Item = Result<SessionEvent, Status>> + Send>>;

fn event(kind: EventKind) -> Result<SessionEvent, Status> {
    Ok(SessionEvent { kind: Some(kind) })
}

fn acquired(name: &str, fence: u64, token: Token, value: Vec<u8>) -> Result<SessionEvent, Status> {
    event(EventKind::Acquired(Acquired { name: name.to_owned(), fence, token: token.to_string(), value }))
}

fn session_error(name: &str, e: &ApiError) -> Result<SessionEvent, Status> {
    let status = Status::from(e.clone());
    let problem = status
        .metadata()
        .get(crate::front::problem::PROBLEM_METADATA)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("urn:holdfast:internal")
        .to_owned();
    event(EventKind::Error(v1::SessionError {
        name: name.to_owned(),
        r#type: problem,
        detail: status.message().into(),
    }))
}

/// What a session stream does next ([`SessionStream::next_step`]).
enum Step {
    Message(Result<Option<SessionRequest>, Status>),
    Note(Option<Box<SessionNote>>),
}

/// A claim of this stream's session: its token, and its fence once granted.
struct Claim {
    token: Token,
    fence: Option<u64>,
}

/// A stream's claims by (stored) name. A list, not a map: most sessions hold one lock or a few, and a map's
/// first node was about 500 bytes of every stream that held anything, for as long as the session stayed.
/// At most `limits::CLAIMS_PER_SESSION_MAX` (1,024) claims, so a lookup stays short.
#[derive(Default)]
struct Claims(Vec<(String, Claim)>);

impl Claims {
    fn position(&self, name: &str) -> Option<usize> {
        self.0.iter().position(|(n, _)| n == name)
    }

    fn get(&self, name: &str) -> Option<&Claim> {
        self.position(name).map(|i| &self.0[i].1)
    }

    fn get_mut(&mut self, name: &str) -> Option<&mut Claim> {
        self.position(name).map(|i| &mut self.0[i].1)
    }

    fn insert(&mut self, name: String, claim: Claim) {
        match self.position(&name) {
            Some(i) => self.0[i].1 = claim,
            None => {
                // Room for one at first: a list's first growth makes room for four, where most sessions hold one.
                if self.0.is_empty() {
                    self.0.reserve_exact(1);
                }
                self.0.push((name, claim))
            }
        }
    }

    fn remove(&mut self, name: &str) -> Option<Claim> {
        self.position(name).map(|i| self.0.swap_remove(i).1)
    }
}

/// Where a stream's events wait for the client, [`SESSION_OUTBOX`] at most. A stream keeps it for as long as
/// its session is open, so it is futures' channel, about 150 bytes (heap-profiled) where tokio's kept 800 (its
/// cache-padded ends and a first block of 32 slots), and the events are boxed.
pub type Outbox = futures_channel::mpsc::Sender<Box<Result<SessionEvent, Status>>>;

/// A session's stream, attached to its session. Boxed, and the task that serves it holds little else: it
/// lives as long as the session's stream, and an async function keeps its arguments and every future it
/// awaits in place (at 2.2 KiB a stream, this task was the largest part of a session's memory on the node
/// holding its stream; docs/perf-notes/2026-12-06-a-session-in-2-kib.md).
struct SessionStream {
    api: Arc<Api>,
    /// The tenant's namespace: names in `claims` are stored names; events show the client's names.
    scope: auth::Scope,
    id: SessionId,
    claims: Claims,
    tx: Outbox,
    inbound: Streaming<SessionRequest>,
    notes: Notes,
    /// When this stream last told the node's load how late its client sees its heartbeats: once a
    /// `load::WINDOW` at most, so that no client counts for more than one session.
    late_told: Option<tokio::time::Instant>,
}

impl Drop for SessionStream {
    /// Detaches the stream from its session, however it ended (its task may be dropped unfinished).
    fn drop(&mut self) {
        self.notes.close();
        self.api.detach(self.id);
    }
}

/// What a session stream's task starts from.
pub struct Start {
    pub api: Arc<Api>,
    pub scope: auth::Scope,
    pub inbound: Streaming<SessionRequest>,
    /// Where the stream's events wait for the client; the stream's end, if it ends in error, too.
    pub tx: Outbox,
}

/// Serves a session stream from its first request to its end. The task lives as long as the session's
/// stream and is as large as the largest future it awaits in place, so everything but the wait for the next
/// request or note is boxed: attaching (here), and the stream's rarer requests ([`SessionStream::run`]).
pub async fn serve_session(start: Box<Start>) {
    let Some(mut stream) = Box::pin(attached(start)).await else { return };
    if let Err(status) = stream.run().await {
        // Without waiting in place, for the same reason: only a client that leaves its events unread waits.
        queue(stream.tx.clone(), Box::new(Err(status)));
    }
}

/// The stream attached to its session ([`attach`]); `None` if it could not be, the client told why.
async fn attached(start: Box<Start>) -> Option<Box<SessionStream>> {
    let tx = start.tx.clone();
    attach(start).await.map_err(|status| queue(tx, Box::new(Err(status)))).ok()
}

/// Puts `event` in the outbox without waiting in place, from a heartbeat's batch or a stream's end: only a
/// client that leaves [`SESSION_OUTBOX`] events unread waits for room, in a task of its own.
fn queue(mut tx: Outbox, event: Box<Result<SessionEvent, Status>>) {
    if let Err(e) = tx.try_send(event) {
        if e.is_full() {
            let event = e.into_inner();
            tokio::spawn(async move {
                if std::future::poll_fn(|cx| tx.poll_ready(cx)).await.is_ok() {
                    let _ = tx.start_send(event);
                }
            });
        }
    }
}

/// Opens or resumes the session a stream's first request names, attaches the stream to it, and tells the
/// client so.
async fn attach(start: Box<Start>) -> Result<Box<SessionStream>, Status> {
    let Start { api, scope, mut inbound, tx } = *start;
    let first = inbound.message().await.map_err(|status| malformed(&status).unwrap_or(status))?.and_then(|m| m.kind);
    let (mut stream, opened, resumed) = match first {
        Some(RequestKind::Open(open)) => {
            let owner = or_anonymous(open.owner);
            locks::check_owner(&owner)?;
            locks::check_ttl(&api, open.lease_ms)?;
            api.admit_session()?;
            let owner = scope.inner(&owner);
            let written =
                api.write(Request::OpenSession { owner, lease_ms: open.lease_ms }).await.map_err(ApiError::from)?;
            let (id, secret) = match (written.outcome(), written.secret) {
                (Outcome::SessionOpened { id }, Some(secret)) => (*id, secret),
                (Outcome::Rejected(reject), _) => return Err(ApiError::from(reject.clone()).into()),
                (other, _) => return Err(ApiError::unexpected(other).into()),
            };
            api.wait_applied(written.index).await.map_err(ApiError::from)?;
            let notes = api.attach(id);
            let opened = v1::Opened { session_id: id, lease_ms: open.lease_ms, secret: secret.to_string() };
            let claims = Claims::default();
            (SessionStream { api, scope, id, claims, tx, inbound, notes, late_told: None }, opened, None)
        }
        Some(RequestKind::Resume(resume)) => {
            let id = resume.session_id;
            let secret = resume_secret(&resume.secret)?;
            // Another tenant's session does not exist for this one, and a session is taken over only with
            // its secret (its id is in every read of its locks): both checked before attaching, so that a
            // stranger's stream never displaces the holder's, and a refused one changes nothing.
            let found = api
                .session_view(id, |view| {
                    if !scope.owns(&view.owner) {
                        return Err(ApiError::SessionGone { id });
                    }
                    if view.secret.is_none() {
                        let detail =
                            format!("session {id} was opened by a build without session secrets and cannot be resumed");
                        return Err(ApiError::Forbidden { slug: "wrong-session-secret", detail });
                    }
                    if !view.proven_by(&secret) {
                        let detail =
                            format!("the secret is not session {id}'s: Resume needs the one its Opened carried");
                        return Err(ApiError::Forbidden { slug: "wrong-session-secret", detail });
                    }
                    Ok(api.attach_viewed(id))
                })
                .await
                .map_err(ApiError::from)?;
            let Some((view, attached)) = found else {
                return Err(ApiError::SessionGone { id }.into());
            };
            let notes = attached?;
            let opened = v1::Opened { session_id: id, lease_ms: view.lease_ms, secret: String::new() };
            let claims = Claims::default();
            let mut stream = SessionStream { api, scope, id, claims, tx, inbound, notes, late_told: None };
            stream.adopt(&view);
            (stream, opened, Some(view))
        }
        _ => {
            return Err(
                ApiError::invalid("invalid-session", "a session stream starts with Open or Resume".into()).into()
            )
        }
    };
    tracing::debug!(session = stream.id, resumed = resumed.is_some(), "session stream attached");
    stream.greet(opened, resumed).await?;
    Ok(Box::new(stream))
}

/// The secret a `Resume` presents: 32 hex digits. Missing is refused as a wrong secret would be (a client
/// from before secrets sends none); malformed is bad input.
fn resume_secret(text: &str) -> Result<SessionSecret, ApiError> {
    if text.is_empty() {
        let detail = "Resume needs the secret the session's Opened carried".into();
        return Err(ApiError::Forbidden { slug: "wrong-session-secret", detail });
    }
    text.parse().map_err(|_| ApiError::invalid("invalid-secret", "a session secret is 32 hex digits".into()))
}

impl SessionStream {
    /// Takes the session's claims from `view` (on resume).
    fn adopt(&mut self, view: &SessionView) {
        self.claims = Claims::default();
        for grant in &view.holds {
            self.claims.insert(grant.name.clone(), Claim { token: grant.token, fence: Some(grant.fence) });
        }
        for wait in &view.waits {
            self.claims.insert(wait.name.clone(), Claim { token: wait.token, fence: None });
        }
    }

    /// Writes `request` through the leader, in a box: a stream waits for its write in a future that holds just
    /// the box, not the write's kilobyte (see [`SessionStream::handle`]).
    fn write(&self, request: Request) -> Pin<Box<impl Future<Output = Result<Written, NodeError>> + Send + '_>> {
        Box::pin(self.api.write(request))
    }

    /// Sends `event`, with names, owners and details as the client knows them.
    async fn send(&mut self, event: Result<SessionEvent, Status>) -> Result<(), Status> {
        let event = event.map(|mut e| {
            if let Some(EventKind::Acquired(acquired)) = &mut e.kind {
                acquired.fence = self.api.told_fence(acquired.fence);
            }
            outer_event(&self.scope, e)
        });
        let gone = |_| Status::cancelled("the client went away");
        std::future::poll_fn(|cx| self.tx.poll_ready(cx)).await.map_err(gone)?;
        self.tx.start_send(Box::new(event)).map_err(gone)
    }

    /// The stream's next request, or a note about its session: the notes first (they are few, and no flood
    /// of requests may hold them up). A poll function rather than `select!`: the stream's task waits here for
    /// as long as the session is idle, and a task is as large as the largest future it waits in. The task's
    /// cell (tokio's, in steps of 128 bytes) is 256 bytes this way; with `select!` and each request matched
    /// in place it was 640 (`-Zprint-type-sizes`).
    fn next_step(&mut self) -> impl Future<Output = Step> + '_ {
        std::future::poll_fn(|cx| {
            if let Poll::Ready(note) = self.notes.poll_recv(cx) {
                return Poll::Ready(Step::Note(note));
            }
            Pin::new(&mut self.inbound).poll_next(cx).map(|message| Step::Message(message.transpose()))
        })
    }

    /// Serves the stream's requests and its session's notes until the stream or the session ends.
    async fn run(&mut self) -> Result<(), Status> {
        loop {
            let step = match self.next_step().await {
                // Heartbeats, most of what a stream hears, are handled in place; the rest in a box, the step
                // moved into it (a step kept in place would be most of the task).
                Step::Message(Ok(Some(SessionRequest { kind: Some(RequestKind::Heartbeat(beat)) })))
                    if self.api.scope_valid(&self.scope) =>
                {
                    self.heartbeat(beat);
                    continue;
                }
                step => step,
            };
            if Box::pin(self.act(step)).await? {
                return Ok(());
            }
        }
    }

    /// Acts on `step`, anything but a heartbeat: true if the stream ends with it.
    async fn act(&mut self, step: Step) -> Result<bool, Status> {
        match step {
            Step::Message(Ok(Some(SessionRequest { kind: Some(kind) }))) => self.handle(kind).await,
            Step::Message(Ok(Some(SessionRequest { kind: None }))) => {
                let e = ApiError::invalid("invalid-session", "an empty session request".into());
                self.send(session_error("", &e)).await.map(|()| false)
            }
            // The client went away: the session lives until its lease runs out, or is resumed. So it does
            // after a message that does not decode, but that stream ends as bad input.
            Step::Message(Ok(None)) => Ok(true),
            Step::Message(Err(status)) => malformed(&status).map_or(Ok(true), Err),
            Step::Note(Some(note)) => match *note {
                SessionNote::Gone => self.gone().await.map(|()| true),
                // No acknowledgement: the client's own clock decides when its lease is lost.
                SessionNote::HeartbeatFailed(e) => {
                    self.send(session_error("", &ApiError::from(e))).await.map(|()| false)
                }
                note => self.note(note).await.map(|()| false),
            },
            // Another stream on this node attached the same session (the client resumed it here): this one
            // must not go on acting for it.
            Step::Note(None) => Err(Status::aborted("the session was resumed on another stream")),
        }
    }

    /// Keeps the session alive on heartbeat `beat`, beside the stream's other requests: the node's
    /// heartbeat batch acknowledges it straight to the outbox (`Router::heartbeat`), so that a slow write on
    /// the stream never delays an acknowledgement. How late the client says it sees its heartbeats goes to
    /// the node's load, once a window at most (`Api::client_late`).
    fn heartbeat(&mut self, beat: v1::Heartbeat) {
        let (seq, api, tell, tx) = (beat.seq, self.api.clone(), self.notes.teller(), self.tx.clone());
        let received = tokio::time::Instant::now();
        if beat.late_ms > 0 && self.late_told.is_none_or(|told| received >= told + crate::load::WINDOW) {
            self.late_told = Some(received);
            self.api.client_late(std::time::Duration::from_millis(beat.late_ms.into()));
        }
        self.api.heartbeat(
            self.id,
            Box::new(move |reply| match reply {
                Ok(Some((held, waiting))) => {
                    api.metrics().heartbeat_duration.observe(received.elapsed().as_secs_f64());
                    queue(tx, Box::new(event(EventKind::HeartbeatAck(v1::HeartbeatAck { seq, held, waiting }))));
                }
                Ok(None) => tell(SessionNote::Gone),
                Err(e) => tell(SessionNote::HeartbeatFailed(e)),
            }),
        );
    }

    /// Tells the client its session is open and, if it resumed it, what it holds and waits for.
    async fn greet(&mut self, opened: v1::Opened, resumed: Option<SessionView>) -> Result<(), Status> {
        self.send(event(EventKind::Opened(opened))).await?;
        let Some(view) = resumed else { return Ok(()) };
        for grant in &view.holds {
            self.send(acquired(&grant.name, grant.fence, grant.token, grant.value.clone())).await?;
        }
        for wait in &view.waits {
            let waiting = v1::Waiting {
                name: wait.name.clone(),
                position: wait.position as u64,
                holder: Some(holder(&wait.holder)),
            };
            self.send(event(EventKind::Waiting(waiting))).await?;
        }
        Ok(())
    }

    /// Handles one request. True when the stream is done (the session closed). What it awaits is boxed, each
    /// in its own box: a stream waits here as long as its write takes (a fleet that stops closes every
    /// session at once), and this future then holds only the one it waits for.
    async fn handle(&mut self, kind: RequestKind) -> Result<bool, Status> {
        if !self.api.scope_valid(&self.scope) {
            // The key was revoked: the session ends now, handing its locks over, rather than at its lease.
            let _ = self.write(Request::CloseSession { id: self.id }).await;
            return Err(ApiError::Unauthenticated { detail: "the API key was revoked".into() }.into());
        }
        match kind {
            RequestKind::Heartbeat(beat) => self.heartbeat(beat),
            RequestKind::Acquire(acquire) => {
                let checked = locks::check_name(&acquire.name)
                    .and_then(|()| locks::check_value(&acquire.value))
                    .and_then(|()| locks::check_lock_delay(&self.api, acquire.lock_delay_ms))
                    .and_then(|_| locks::check_limit(acquire.limit.max(1)));
                match checked {
                    Err(e) => Box::pin(self.send(session_error(&acquire.name, &e))).await?,
                    Ok(_) => {
                        let acquire = v1::SessionAcquire { name: self.scope.inner(&acquire.name), ..acquire };
                        Box::pin(self.acquire(acquire)).await?
                    }
                }
            }
            RequestKind::SetValue(set) => {
                match locks::check_name(&set.name).and_then(|()| locks::check_value(&set.value)) {
                    Err(e) => Box::pin(self.send(session_error(&set.name, &e))).await?,
                    Ok(()) => Box::pin(self.set_value(self.scope.inner(&set.name), set.value)).await?,
                }
            }
            RequestKind::Release(release) => match locks::check_name(&release.name) {
                Err(e) => Box::pin(self.send(session_error(&release.name, &e))).await?,
                Ok(()) => Box::pin(self.release(self.scope.inner(&release.name))).await?,
            },
            RequestKind::Close(_) => {
                let written = self.write(Request::CloseSession { id: self.id }).await.map_err(ApiError::from)?;
                tracing::debug!(session = self.id, outcome = ?written.outcome(), "session closed");
                return Ok(true);
            }
            RequestKind::Open(_) | RequestKind::Resume(_) => {
                let e = ApiError::invalid("invalid-session", "the session is already open on this stream".into());
                Box::pin(self.send(session_error("", &e))).await?;
            }
        }
        Ok(false)
    }

    async fn set_value(&mut self, name: String, value: Vec<u8>) -> Result<(), Status> {
        let Some(Claim { token, fence: Some(_) }) = self.claims.get(&name) else {
            return self.send(session_error(&name, &ApiError::NotHolder { name: name.clone() })).await;
        };
        match self.write(Request::SetValue { name: name.clone(), token: *token, value }).await {
            Ok(written) => match written.outcome().clone() {
                Outcome::ValueSet(grant) => {
                    let set = v1::ValueSet { name, fence: grant.fence, value: grant.value };
                    self.send(event(EventKind::ValueSet(set))).await
                }
                Outcome::Rejected(reject) => self.send(session_error(&name, &ApiError::from(reject))).await,
                other => self.send(session_error(&name, &ApiError::unexpected(other))).await,
            },
            Err(e) => self.send(session_error(&name, &ApiError::from(e))).await,
        }
    }

    /// Asks for `acquire.name` (already in the session's scope).
    async fn acquire(&mut self, acquire: v1::SessionAcquire) -> Result<(), Status> {
        let v1::SessionAcquire { name, wait, value, lock_delay_ms, limit } = acquire;
        if let Some(claim) = self.claims.get(&name) {
            // Asked again: answer what the session already has.
            return match claim.fence {
                Some(fence) => self.send(acquired(&name, fence, claim.token, self.api.value_here(&name, fence))).await,
                None => {
                    let waiting = v1::Waiting { name, position: 0, holder: None };
                    self.send(event(EventKind::Waiting(waiting))).await
                }
            };
        }
        let limit = limit.max(1);
        let request = Request::SessionAcquire { id: self.id, name: name.clone(), wait, value, lock_delay_ms, limit };
        let written = match self.write(request).await {
            Ok(written) => written,
            // The outcome is unknown: learn from the leader what the session has now.
            Err(e) => return Box::pin(self.resync(&name, e)).await,
        };
        match written.outcome().clone() {
            Outcome::Granted(grant) => {
                self.claims.insert(name.clone(), Claim { token: grant.token, fence: Some(grant.fence) });
                self.send(acquired(&name, grant.fence, grant.token, grant.value)).await
            }
            Outcome::Queued { position, holder: h } => {
                let token = written.token.expect("the leader returns the token of an acquire");
                self.claims.insert(name.clone(), Claim { token, fence: None });
                let waiting = v1::Waiting { name, position: position as u64, holder: Some(holder(&h)) };
                self.send(event(EventKind::Waiting(waiting))).await
            }
            Outcome::Busy { holder: h } => {
                self.send(event(EventKind::Busy(v1::Busy { name, holder: Some(holder(&h)) }))).await
            }
            Outcome::Rejected(holdfast_core::Reject::NoSession(_)) => Box::pin(self.gone()).await,
            Outcome::Rejected(reject) => self.send(session_error(&name, &ApiError::from(reject))).await,
            other => self.send(session_error(&name, &ApiError::unexpected(other))).await,
        }
    }

    /// After a write whose outcome is unknown, re-reads the session's claims from the leader and reports
    /// where `name` stands.
    async fn resync(&mut self, name: &str, cause: NodeError) -> Result<(), Status> {
        match self.api.session_view(self.id, |_| ()).await {
            Ok(Some((view, ()))) => {
                self.adopt(&view);
                match self.claims.get(name) {
                    Some(Claim { token, fence: Some(fence) }) => {
                        self.send(acquired(name, *fence, *token, self.api.value_here(name, *fence))).await
                    }
                    Some(Claim { fence: None, .. }) => {
                        let waiting = v1::Waiting { name: name.to_owned(), position: 0, holder: None };
                        self.send(event(EventKind::Waiting(waiting))).await
                    }
                    None => self.send(session_error(name, &ApiError::from(cause))).await,
                }
            }
            Ok(None) => self.gone().await,
            Err(e) => self.send(session_error(name, &ApiError::from(e))).await,
        }
    }

    async fn release(&mut self, name: String) -> Result<(), Status> {
        let Some(claim) = self.claims.remove(&name) else {
            return self.send(session_error(&name, &ApiError::NotHolder { name: name.clone() })).await;
        };
        // Cancel both releases a hold (handing it to the next waiter in the same entry) and leaves a queue.
        match self.write(Request::Cancel { name: name.clone(), token: claim.token }).await {
            Ok(_) => self.send(event(EventKind::Released(v1::Released { name }))).await,
            Err(e) => {
                self.claims.insert(name.clone(), claim);
                self.send(session_error(&name, &ApiError::from(e))).await
            }
        }
    }

    async fn note(&mut self, note: SessionNote) -> Result<(), Status> {
        match note {
            SessionNote::Granted(grant) => {
                let Some(claim) = self.claims.get_mut(&grant.name) else { return Ok(()) };
                // Not this claim's grant, or a grant the stream already reported (its own acquire's answer).
                if claim.token != grant.token || claim.fence == Some(grant.fence) {
                    return Ok(());
                }
                claim.fence = Some(grant.fence);
                self.send(acquired(&grant.name, grant.fence, grant.token, grant.value)).await
            }
            // Handled by `run`.
            SessionNote::Gone | SessionNote::HeartbeatFailed(_) => Ok(()),
            SessionNote::Ended { name, fence } => {
                if self.claims.get(&name).is_some_and(|c| c.fence == Some(fence)) {
                    self.claims.remove(&name);
                    let lost = v1::Lost { name, reason: "expired".into() };
                    return self.send(event(EventKind::Lost(lost))).await;
                }
                Ok(())
            }
        }
    }

    /// The session is gone (expired or closed elsewhere): every lock it held is lost; the stream ends.
    async fn gone(&mut self) -> Result<(), Status> {
        let mut claims = std::mem::take(&mut self.claims).0;
        claims.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
        for (name, claim) in claims {
            if claim.fence.is_some() {
                self.send(event(EventKind::Lost(v1::Lost { name, reason: "session-gone".into() }))).await?;
            }
        }
        Err(ApiError::SessionGone { id: self.id }.into())
    }
}

/// `event` as a tenant sees it: its names and owners without the tenant's prefix.
fn outer_event(scope: &auth::Scope, mut event: SessionEvent) -> SessionEvent {
    let holder = |h: &mut Option<v1::Holder>| {
        if let Some(h) = h {
            h.owner = scope.outer(&h.owner);
        }
    };
    match &mut event.kind {
        Some(EventKind::Acquired(e)) => e.name = scope.outer(&e.name),
        Some(EventKind::Waiting(e)) => {
            e.name = scope.outer(&e.name);
            holder(&mut e.holder);
        }
        Some(EventKind::Busy(e)) => {
            e.name = scope.outer(&e.name);
            holder(&mut e.holder);
        }
        Some(EventKind::Released(e)) => e.name = scope.outer(&e.name),
        Some(EventKind::ValueSet(e)) => e.name = scope.outer(&e.name),
        Some(EventKind::Lost(e)) => e.name = scope.outer(&e.name),
        Some(EventKind::Error(e)) => {
            e.name = scope.outer(&e.name);
            e.detail = scope.strip(&e.detail);
        }
        Some(EventKind::Opened(_) | EventKind::HeartbeatAck(_)) | None => {}
    }
    event
}
