//! ③ Route: a request goes to the leader. On the leader it is served here; a follower forwards it
//! ([`forward`]), gathering its heartbeats, writes and reads' barriers into batches ([`batches`],
//! [`gather`]), and answers reads from its own state once a barrier told it how far to apply.
//!
//! Imports `leader`, `apply`, `election`, `peer` and the leaves; nothing above.

pub mod batches;
pub mod forward;
pub mod gather;

use std::future::Future;
use std::sync::Arc;

use holdfast_core::{Grant, SessionId, SessionView, Token};
use holdfast_store::{NodeId, SharedState, TypeConfig};
use openraft::Raft;
use tokio::sync::oneshot;
use tokio::time::Instant;

use self::batches::Batches;
use self::gather::Gather;
use crate::apply::events::{Events, WAITER_PING};
use crate::election::Elections;
use crate::faults::Bugs;
use crate::leader::membership::MEMBERSHIP_TIMEOUT;
use crate::leader::Leader;
use crate::load::Load;
use crate::metrics::Metrics;
use crate::peer::client::Peers;
use crate::peer::protocol::{ForwardRequest, HeartbeatReply, NodeError, Query, QueryReply, Request, Written};

/// A follower's heartbeat batches under way to the leader at once, at most (see [`Router::heartbeat`]).
const HEARTBEAT_SENDERS: usize = 4;
/// Heartbeats in one batch, at most. With [`HEARTBEAT_SENDERS`] batches under way, this many times theirs
/// is what a follower passes on in one round trip to the leader: at 1,024, 120,000 heartbeats a second
/// would need round trips under 35 ms. 40,000 sessions through one follower opened in 21.2 s against
/// 25.5 s at 1,024, acknowledged p99 within 25.6 ms against 51.2 ms
/// (docs/perf-notes/2026-12-06-overload.md).
const HEARTBEATS_PER_BATCH: usize = 8192;
/// A follower's write batches under way to the leader at once, at most (see [`Router::write`]).
const WRITE_SENDERS: usize = 8;
/// Writes in one forwarded batch, at most.
const WRITES_PER_BATCH: usize = 256;
/// A follower's barriers under way to the leader at once, at most (see [`Router::read`]).
const BARRIER_SENDERS: usize = 4;
/// Reads that wait for one barrier, at most. A barrier is the same one request however many wait for it.
const READS_PER_BARRIER: usize = 4096;

/// What a heartbeat's sender does with its answer ([`Router::heartbeat`]): called on the batch's task.
pub type Beaten = gather::Reply<Result<HeartbeatReply, NodeError>>;

/// What [`Router::watch`] found for a queued claim.
pub enum Watch {
    /// The claim holds the lock.
    Granted(Grant),
    /// Still queued: the receiver is sent the grant, or dropped if the claim leaves the queue.
    Waiting(oneshot::Receiver<Grant>),
    /// Neither held nor queued any more.
    Gone,
}

/// Takes every request to the leader: this node's own [`Leader`], or the leader's over the peer port.
pub struct Router {
    raft: Raft<TypeConfig>,
    state: SharedState,
    events: Arc<Events>,
    elections: Arc<Elections>,
    leader: Arc<Leader>,
    peers: Arc<Peers>,
    metrics: Arc<Metrics>,
    /// This node's lag: a follower counts its runtime lag in the wait of the heartbeats it passes on.
    load: Arc<Load>,
    bugs: Bugs,
    /// Heartbeats of sessions attached here, with their arrival, gathered for the leader (this node or
    /// another); each answer is acted on in the batch's task.
    heartbeats: Gather<(SessionId, Instant), Result<HeartbeatReply, NodeError>>,
    /// Writes of clients attached here, gathered for the leader while this node follows.
    writes: Gather<Request, Result<Written, NodeError>>,
    /// Reads (and session views) answered here while this node follows, waiting for a barrier through the
    /// leader: how far to apply before answering ([`Router::read_index`]).
    barriers: Gather<(), Result<u64, NodeError>>,
    /// Whether the leader reads batches.
    batches: Batches,
    /// The last time a request of this node's was not served through the leader: no leader was known (none
    /// elected, or gone silent), or the one asked failed it (no longer leading, unreachable, no answer in
    /// time). A heartbeat's wait counts from then at the latest, so that a failover is not taken for load
    /// ([`Router::waited_while_served`]).
    unserved: std::sync::Mutex<Instant>,
}

/// What a [`Router`] is made of: the node's shared parts.
pub struct Parts {
    pub raft: Raft<TypeConfig>,
    pub state: SharedState,
    pub events: Arc<Events>,
    pub elections: Arc<Elections>,
    pub leader: Arc<Leader>,
    pub peers: Arc<Peers>,
    pub metrics: Arc<Metrics>,
    pub load: Arc<Load>,
    pub bugs: Bugs,
}

impl Router {
    pub fn new(parts: Parts) -> Self {
        let Parts { raft, state, events, elections, leader, peers, metrics, load, bugs } = parts;
        Router {
            raft,
            state,
            events,
            elections,
            leader,
            peers,
            metrics,
            load,
            bugs,
            heartbeats: Gather::new(HEARTBEAT_SENDERS, HEARTBEATS_PER_BATCH),
            writes: Gather::new(WRITE_SENDERS, WRITES_PER_BATCH),
            barriers: Gather::new(BARRIER_SENDERS, READS_PER_BARRIER),
            batches: Batches::default(),
            unserved: std::sync::Mutex::new(Instant::now()),
        }
    }

    /// Applies `request` through the leader (this node, or forwarded), waiting until it is committed and
    /// applied. Retries only where nothing was delivered: while no leader is known, or when the contacted
    /// node was not (or no longer) the leader.
    ///
    /// A follower whose leader reads batches gathers its clients' writes and forwards them in batches, at
    /// most [`WRITE_SENDERS`] under way at once: one by one, each took a frame each way and a forwarding slot
    /// (docs/perf-notes/2026-12-03-sessions-through-a-follower.md). A write is never sent twice: a
    /// batch whose connection breaks leaves each of its writes with an unknown outcome, as a lone write's
    /// would.
    ///
    /// Each write waiting here is counted: with many, this node syncs its appends as a follower aside
    /// ([`crate::apply::waiting`]).
    pub async fn write(self: &Arc<Self>, request: Request) -> Result<Written, NodeError> {
        let _waiting = self.events.waiting().count();
        if !self.writes_in_batches() {
            // Boxed: a lone write's future is a kilobyte, and a batched one, the common case, would carry it.
            return Box::pin(self.write_alone(request)).await;
        }
        // Each batch's future boxed: it holds the lone writes it may fall back to, each as deep as a write.
        self.gathered(
            |router| &router.writes,
            |router, batch| Box::pin(async move { router.forward_writes(batch).await }),
            request,
        )
        .await
    }

    /// Answers `query` linearizably: its answer holds every write acknowledged before it arrived.
    ///
    /// The leader answers from its state once the first quorum round of its confirmer begun after the query
    /// arrived confirmed it still leads. A follower answers from its own state, once it applied all the
    /// leader had applied when such a round confirmed it: a read index ([`Router::read_index`]), one
    /// barrier through the leader for every read that arrived while the barriers before it were under way.
    /// Forwarded one by one, each read held a forwarding slot for a round trip and cost the leader a
    /// decode, an answer and an encode: 64 clients got 45,000-83,000 answers a second through a follower
    /// against 111,000-170,000 from the leader (docs/perf-notes/2026-12-03-follower-reads-and-hand-over-time.md).
    pub async fn read(self: &Arc<Self>, query: Query) -> Result<QueryReply, NodeError> {
        if self.elections.is_leader() {
            return match self.through_leader(&ForwardRequest::Read(query)).await? {
                crate::peer::protocol::ForwardReply::Read(reply) => Ok(reply),
                other => Err(NodeError::Unavailable(format!("the leader answered a read with {other:?}"))),
            };
        }
        if !self.bugs.unconfirmed_follower_reads() {
            let index = self.read_index().await?;
            self.wait_applied(index).await?;
        }
        Ok(crate::apply::answer_query(&self.state, query))
    }

    /// How far this node must have applied the log before it answers a read that arrived before this call:
    /// the lock state's index on the leader once a quorum round begun after the call confirmed it still
    /// leads, from a barrier through the leader (this node itself, if it leads). Every write acknowledged
    /// before the call was applied on the leader by then. Calls made while [`BARRIER_SENDERS`] barriers are
    /// under way share the next one: the barrier is sent after all of them arrived.
    async fn read_index(self: &Arc<Self>) -> Result<u64, NodeError> {
        self.gathered(
            |router| &router.barriers,
            |router, reads| async move { router.forward_barrier(reads.len()).await },
            (),
        )
        .await
    }

    /// Keeps session `id` alive, and calls `beaten` with the answer: the leader extends its lease from when
    /// the heartbeat reached it, once a quorum round begun after that confirmed it is still leader.
    ///
    /// Heartbeats are gathered and sent to the leader in batches, at most [`HEARTBEAT_SENDERS`] under way
    /// at once, each carrying whatever arrived while the others were. On a follower, one forwarded
    /// heartbeat held a forwarding slot for a whole quorum round on the leader, and one by one a follower
    /// could pass on only about 8,000 a second, so that most of 10,000 sessions attached to it expired
    /// (docs/perf-notes/2026-12-03-sessions-through-a-follower.md). On the leader too: one batch is one
    /// read of the state and one wait for a round, and its answers are all given from the sender's task,
    /// so a connection's acknowledgements leave in one write rather than one each (at 100,000 sessions a
    /// write per acknowledgement was the leader's largest cost: docs/perf-notes/2026-12-06-memory-per-session.md).
    pub fn heartbeat(self: &Arc<Self>, id: SessionId, beaten: Beaten) {
        if self.heartbeats.push_with((id, Instant::now()), beaten) {
            let router = self.clone();
            drop(tokio::spawn(async move {
                router.heartbeats.send_all(|batch| router.clone().answer_heartbeats(batch)).await;
            }));
        }
    }

    /// Keeps the sessions of `batch` alive through the leader, an answer each in order: one by one to a
    /// leader that refused a batch lately (a build from before batches). The heartbeat lag (`load.rs`)
    /// includes the wait here: on the leader, the batch counts from its oldest heartbeat's arrival; a
    /// follower tells the leader how long that one waited ([`ForwardRequest::HeartbeatsWaited`]). Either
    /// way, only since a leader last left a request of this node's unserved ([`Router::waited_while_served`]).
    async fn answer_heartbeats(
        self: Arc<Self>,
        batch: Vec<(SessionId, Instant)>,
    ) -> Vec<Result<HeartbeatReply, NodeError>> {
        let oldest = batch.iter().map(|(_, received)| *received).min().unwrap_or_else(Instant::now);
        let ids: Vec<SessionId> = batch.into_iter().map(|(id, _)| id).collect();
        if self.elections.is_leader() {
            let counted_from = Instant::now() - self.waited_while_served(oldest);
            if let Ok(replies) = self.leader.keep_alive_all(&ids, oldest, counted_from).await {
                return replies.into_iter().map(Ok).collect();
            }
        }
        let leader = self.raft.metrics().borrow().current_leader;
        if leader != Some(self.elections.id()) && self.batches.refused(leader) {
            return futures_util::future::join_all(ids.into_iter().map(|id| self.heartbeat_alone(id))).await;
        }
        self.forward_heartbeats(ids, oldest).await
    }

    /// How long a heartbeat that arrived at `arrived` has waited here while a leader served this node: since
    /// its arrival, or since a request of this node's last went unserved, whichever is later. A follower
    /// whose requests wait on a leader that was cut off, or lost its office, counts nothing for that.
    pub fn waited_while_served(&self, arrived: Instant) -> std::time::Duration {
        let unserved = *self.unserved.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        Instant::now().saturating_duration_since(arrived.max(unserved))
    }

    /// Notes that a request of this node's was not served through the leader ([`Router::waited_while_served`]).
    fn mark_unserved(&self) {
        *self.unserved.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Instant::now();
    }

    /// Session `id` and its claims, as of a point no earlier than this call (confirmed by the leader and
    /// applied here), with `attach` run under the state lock so no entry is applied in between.
    pub async fn session_view<T>(
        self: &Arc<Self>,
        id: SessionId,
        attach: impl FnOnce(&SessionView) -> T,
    ) -> Result<Option<(SessionView, T)>, NodeError> {
        self.caught_up().await?;
        let state = crate::state::read(&self.state);
        Ok(state.session(id).map(|view| {
            let attached = attach(&view);
            (view, attached)
        }))
    }

    /// Returns once this node has applied every write acknowledged before the call (a read index through
    /// the leader, then this node's apply): its state may then be read as a linearizable read's would be.
    pub async fn caught_up(self: &Arc<Self>) -> Result<(), NodeError> {
        let index = self.read_index().await?;
        self.wait_applied(index).await
    }

    /// Waits until this node applied the log up to `index` ([`crate::apply::wait_applied`]).
    pub async fn wait_applied(&self, index: u64) -> Result<(), NodeError> {
        crate::apply::wait_applied(&self.raft, &self.state, index).await
    }

    /// Watches queued claim `token` on `name`, once this node has applied the entry (at `index`) that
    /// queued it.
    pub async fn watch(&self, name: &str, token: Token, index: u64) -> Result<Watch, NodeError> {
        self.wait_applied(index).await?;
        // Holding the state lock while registering means no grant can be applied in between.
        let state = crate::state::read(&self.state);
        if let Some(grant) = state.grant(name, token) {
            return Ok(Watch::Granted(grant));
        }
        if !state.is_waiting(name, token) {
            return Ok(Watch::Gone);
        }
        Ok(Watch::Waiting(self.events.watch(name, token)))
    }

    /// Adds node `id` at peer address `addr` through the leader; see [`ForwardRequest::AddMember`].
    pub async fn add(&self, id: NodeId, addr: String) -> Result<(), NodeError> {
        self.through_leader_within(&ForwardRequest::AddMember { id, addr }, MEMBERSHIP_TIMEOUT).await.map(|_| ())
    }

    /// Removes node `id` through the leader.
    pub async fn remove(&self, id: NodeId) -> Result<(), NodeError> {
        self.through_leader_within(&ForwardRequest::RemoveMember { id }, MEMBERSHIP_TIMEOUT).await.map(|_| ())
    }

    /// Tells the leader, every [`WAITER_PING`] until `shutdown`, which one-shot waiters still wait on this
    /// node, so that the waiters of a node that crashed leave their queues.
    pub async fn run_waiter_pings(&self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(WAITER_PING);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            let tokens = self.events.waiting_here();
            if !tokens.is_empty() {
                if let Err(e) = self.through_leader(&ForwardRequest::StillWaiting(tokens)).await {
                    tracing::debug!(%e, "could not tell the leader which requests still wait");
                }
            }
        }
    }

    /// Queues `item` in the gather `gather` picks, starting a sender that forwards its batches with
    /// `forward` when one is needed, and waits for the item's answer: the one follower batcher behind
    /// writes, heartbeats and barriers.
    async fn gathered<T, R, F>(
        self: &Arc<Self>,
        gather: fn(&Router) -> &Gather<T, Result<R, NodeError>>,
        forward: fn(Arc<Router>, Vec<T>) -> F,
        item: T,
    ) -> Result<R, NodeError>
    where
        T: Send + 'static,
        R: Send + 'static,
        F: Future<Output = Vec<Result<R, NodeError>>> + Send + 'static,
    {
        let router = self.clone();
        let sender = move || {
            drop(tokio::spawn(async move { gather(&router).send_all(|batch| forward(router.clone(), batch)).await }))
        };
        gather(self).ask(item, sender, shutting_down).await
    }

    /// Whether this node, following another, sends its writes to its leader in batches: only once the
    /// leader has answered one. When that is not known, asks the leader with an empty batch of heartbeats
    /// in the background (one question at a time), and its writes go one by one meanwhile.
    fn writes_in_batches(self: &Arc<Self>) -> bool {
        let leader = self.raft.metrics().borrow().current_leader;
        let Some(leader) = leader.filter(|leader| *leader != self.elections.id()) else { return false };
        if let Some(reads) = self.batches.reads(leader) {
            return reads;
        }
        if self.batches.start_asking() {
            let router = self.clone();
            tokio::spawn(async move {
                let _ = router.through_leader(&ForwardRequest::Heartbeats(Vec::new())).await;
                router.batches.done_asking();
            });
        }
        false
    }
}

/// The answer to a gathered request whose sender went away: only when the node stops.
fn shutting_down<T>() -> Result<T, NodeError> {
    Err(NodeError::Unavailable("shutting down".into()))
}
