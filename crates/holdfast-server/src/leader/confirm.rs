//! [`Confirmer`]: the leader's quorum rounds. One round confirms, for every heartbeat and read that arrived
//! before it began, that this node still leads, and that it applied everything committed before.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast_store::{SharedState, TypeConfig};
use openraft::error::{CheckIsLeaderError, RaftError};
use openraft::Raft;
use tokio::time::Instant;

use crate::election::Elections;
use crate::metrics::Metrics;
use crate::peer::protocol::{NodeError, REQUEST_TIMEOUT};

/// The shortest time between two leadership confirmation rounds for heartbeats alone. Back to back, rounds
/// ran about a thousand times a second under 10,000 sessions, each a message to every follower; spaced, a
/// heartbeat waits at most this much longer for its acknowledgement (a lease is 100s of ms at least). A
/// read does not wait for the spacing ([`Confirmer::confirm_leader`]).
const CONFIRM_SPACING: Duration = Duration::from_millis(5);

/// What a confirmation round found: the leader floor still to apply (if any), or why leadership was not
/// confirmed.
pub type Confirmed = Result<Option<u64>, NodeError>;

/// Batches leadership confirmations: one quorum round answers every heartbeat and read that arrived
/// before it began.
pub struct Confirmer {
    raft: Raft<TypeConfig>,
    state: SharedState,
    elections: Arc<Elections>,
    metrics: Arc<Metrics>,
    wake: tokio::sync::Notify,
    /// A read waits: the next round begins as soon as the last one ended, not [`CONFIRM_SPACING`] after it
    /// began.
    hurry: tokio::sync::Notify,
    /// When the last round began, and what it found: whether this node still leads, and if so the leader
    /// floor it had not applied yet when the round ended (read once per round, not per waiter).
    rounds: tokio::sync::watch::Sender<Option<(Instant, Confirmed)>>,
    /// The term this node leads (as far as it knows) and its last log index when it first confirmed its
    /// leadership in it since it started: see [`Confirmer::leader_floor`].
    floor: Mutex<Option<(u64, u64)>>,
}

impl Confirmer {
    pub fn new(raft: Raft<TypeConfig>, state: SharedState, elections: Arc<Elections>, metrics: Arc<Metrics>) -> Self {
        Confirmer {
            raft,
            state,
            elections,
            metrics,
            wake: tokio::sync::Notify::new(),
            hurry: tokio::sync::Notify::new(),
            rounds: tokio::sync::watch::channel(None).0,
            floor: Mutex::new(None),
        }
    }

    /// Confirms with a quorum that this node is still the leader, and that it applied everything
    /// committed before now (openraft's `ensure_linearizable`, and [`Confirmer::leader_floor`]).
    ///
    /// The confirmation is a round of the confirmer's, the first to begin after this call, shared with
    /// every read and heartbeat that came before it: a round is a message to every follower and back, and
    /// one each cost every leader-confirmed read (a `get`, a busy answer to a try-lock) that much
    /// (docs/perf-notes/2026-12-03-reads-in-shared-rounds.md).
    pub async fn confirm_leader(&self) -> Result<(), NodeError> {
        // Almost always applied already: only a leader restarted in its term waits here.
        match self.confirmed_since(Instant::now(), true).await? {
            Some(floor) => crate::apply::wait_applied(&self.raft, &self.state, floor).await,
            None => Ok(()),
        }
    }

    /// Waits for a quorum round that began at or after `since`, and answers what it found: whether it
    /// confirmed this node's leadership, and the leader floor not applied yet then
    /// ([`Confirmer::floor_to_apply`]). With `hurry`, that round begins as soon as the one under way ended,
    /// without the spacing heartbeats keep.
    pub async fn confirmed_since(&self, since: Instant, hurry: bool) -> Confirmed {
        let mut rounds = self.rounds.subscribe();
        self.wake.notify_one();
        if hurry {
            self.hurry.notify_one();
        }
        let round = tokio::time::timeout(
            REQUEST_TIMEOUT,
            rounds.wait_for(|round| round.as_ref().is_some_and(|(began, _)| *began >= since)),
        )
        .await
        .map_err(|_| NodeError::Timeout(REQUEST_TIMEOUT))?
        .map_err(|_| NodeError::Unavailable("shutting down".into()))?;
        match &*round {
            Some((_, found)) => found.clone(),
            None => unreachable!("waited for a round"),
        }
    }

    /// Runs leadership confirmation rounds on demand until `shutdown`; one round answers every heartbeat
    /// and read that arrived before it began.
    pub async fn run(&self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = shutdown.changed() => return,
            }
            let began = Instant::now();
            let found = self.confirm_round().await.map(|()| self.floor_to_apply());
            self.rounds.send_replace(Some((began, found)));
            // At most one round per CONFIRM_SPACING while only heartbeats wait: those that arrive meanwhile
            // share the next one. A read waiting cuts the spacing short.
            tokio::select! {
                () = tokio::time::sleep_until(began + CONFIRM_SPACING) => {}
                () = self.hurry.notified() => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    /// One quorum round: whether this node still leads, once it applied everything committed before the
    /// round began (openraft's `ensure_linearizable`).
    async fn confirm_round(&self) -> Result<(), NodeError> {
        self.metrics.confirmations.inc();
        let confirmed = tokio::time::timeout(REQUEST_TIMEOUT, self.raft.ensure_linearizable())
            .await
            .map_err(|_| NodeError::Timeout(REQUEST_TIMEOUT))?;
        match confirmed {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                Err(NodeError::NotLeader { leader: f.leader_id })
            }
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e))) => {
                Err(NodeError::NotLeader { leader: None })
                    .inspect_err(|_| tracing::debug!(%e, "leadership not confirmed"))
            }
            Err(RaftError::Fatal(e)) => Err(NodeError::Unavailable(e.to_string())),
        }
    }

    /// The log index this node must have applied before it answers anything from its state as leader: its
    /// last log index when it first confirmed its leadership in the current term since it started.
    ///
    /// openraft's `ensure_linearizable` waits only until the leader applied its commit index, or its first
    /// entry of the term. A node that restarts while it leads is leader again at once, in the same term
    /// (openraft 0.9 restores a committed vote for itself), with the commit index it last stored, which may
    /// be behind (it is not flushed on its own), and no new entry of its own. Writes that were committed and
    /// acknowledged before the restart were then not applied yet when it confirmed its leadership, and a
    /// session resumed through it was told it held a lock its own acknowledged release had let go (the
    /// simulation, every node crashed). Every committed entry is in the leader's log, so
    /// its whole log at its first confirmation covers them.
    fn leader_floor(&self) -> u64 {
        let (term, last, leads) = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            (m.current_term, m.last_log_index.unwrap_or(0), m.current_leader == Some(self.elections.id()))
        };
        if !leads {
            // Deposed since it confirmed: nothing to wait for (its log's tail may never commit), and no
            // floor to record for a term it does not lead.
            return 0;
        }
        let mut floor = self.floor.lock().expect("leader floor poisoned");
        match *floor {
            Some((t, index)) if t == term => index,
            _ => {
                *floor = Some((term, last));
                last
            }
        }
    }

    /// The leader floor, if this node has not applied it yet.
    ///
    /// Raft's applied index, not the lock state's: the state counts only the entries that carry lock
    /// commands, and the floor is often a new leader's blank entry, which the state never counts. Compared
    /// with the state's index, a leader that had taken no lock command since its election never reached
    /// its floor: it acknowledged no session heartbeat until some client wrote, and a session attached to
    /// a follower lost its lock after the leader's crash (holdfast-sim's `tests/failover.rs`).
    fn floor_to_apply(&self) -> Option<u64> {
        let floor = self.leader_floor();
        let applied = self.raft.metrics().borrow().last_applied.map_or(0, |applied| applied.index);
        (applied < floor).then_some(floor)
    }
}
