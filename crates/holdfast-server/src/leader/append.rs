//! [`Appender`]: the leader's one way into the log. It stamps each entry with leader time and waits until
//! the entry is committed and applied here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use holdfast_core::{Command, Entry};
use holdfast_store::{Response, SharedState, TypeConfig};
use openraft::error::{ClientWriteError, RaftError};
use openraft::Raft;
use tokio::sync::Semaphore;

use crate::clock::WallClock;
use crate::election::Elections;
use crate::metrics::{Metrics, ProposalResult};
use crate::peer::protocol::{NodeError, REQUEST_TIMEOUT};

/// Clients' writes proposed as entries of their own (opens and closes of sessions, the writes a batch cannot
/// take) that may wait for openraft at once. openraft's client write is a future of about 2.3 KiB: when a
/// fleet closed 250,000 sessions at once, those waiting on the leader peaked it half a GiB above what it
/// held with the sessions open. Past this many, a write waits for a place first, in a small future.
pub const WRITES_ALONE_IN_FLIGHT: usize = 4096;

/// Proposes entries as the leader.
pub struct Appender {
    raft: Raft<TypeConfig>,
    state: SharedState,
    elections: Arc<Elections>,
    metrics: Arc<Metrics>,
    /// Where the leader's stamps come from.
    clock: WallClock,
    /// The last time stamp this node issued as leader; stamps never go backwards.
    last_stamp_ms: AtomicU64,
    /// Places for clients' writes proposed alone ([`WRITES_ALONE_IN_FLIGHT`]).
    alone: Semaphore,
}

impl Appender {
    pub fn new(
        raft: Raft<TypeConfig>,
        state: SharedState,
        elections: Arc<Elections>,
        metrics: Arc<Metrics>,
        clock: WallClock,
    ) -> Self {
        let alone = Semaphore::new(WRITES_ALONE_IN_FLIGHT);
        Appender { raft, state, elections, metrics, clock, last_stamp_ms: AtomicU64::new(0), alone }
    }

    /// The leader's time now, as the wall clock says: what its keeper compares advertised ends with.
    pub fn wall_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The leader's stamp for a new entry: `max(last stamp, last applied time, wall clock)`.
    pub fn stamp(&self) -> u64 {
        let floor = self.clock.now_ms().max(crate::state::read(&self.state).now_ms());
        let previous = self.last_stamp_ms.fetch_max(floor, Ordering::SeqCst);
        previous.max(floor)
    }

    /// Proposes `cmd` stamped with leader time, as an entry of its own; returns its log index and the lock
    /// state's answer once it is committed and applied here. (Client writes of one-lock commands go
    /// through the [`Proposer`](super::proposer::Proposer) instead, which batches them.)
    pub async fn propose_command(&self, cmd: Command) -> Result<(u64, Response), NodeError> {
        self.propose_commands(cmd, 1).await
    }

    /// Proposes a client's `cmd` as an entry of its own, once one of [`WRITES_ALONE_IN_FLIGHT`] places is free
    /// (at most [`REQUEST_TIMEOUT`] of waiting, then nothing is proposed).
    pub async fn propose_alone(&self, cmd: Command) -> Result<(u64, Response), NodeError> {
        let waited = tokio::time::timeout(REQUEST_TIMEOUT, self.alone.acquire()).await;
        let _place = waited.map_err(|_| NodeError::Timeout(REQUEST_TIMEOUT))?.expect("never closed");
        // Boxed: openraft's client write is a large future, and the wait above should not carry it.
        Box::pin(self.propose_command(cmd)).await
    }

    /// Proposes `cmd`, which carries `count` client commands (a batch, or one), as one entry.
    pub async fn propose_commands(&self, cmd: Command, count: usize) -> Result<(u64, Response), NodeError> {
        self.elections.check_leader()?;
        let entry = Entry { at_ms: self.stamp(), cmd };
        let written = tokio::time::timeout(REQUEST_TIMEOUT, self.raft.client_write(entry)).await;
        let result = match &written {
            Ok(Ok(_)) => ProposalResult::Committed,
            _ => ProposalResult::Failed,
        };
        self.metrics.proposal(result, count);
        match written.map_err(|_| NodeError::Timeout(REQUEST_TIMEOUT))? {
            Ok(reply) => Ok((reply.log_id.index, reply.data)),
            // openraft also answers ForwardToLeader for an entry it appended and then had truncated by a
            // new leader; a copy may survive on another node and still commit, so this is not "nothing was
            // proposed" and must not be retried.
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => Err(NodeError::Unavailable(format!(
                "leadership moved to {:?} while the write was in flight; it may or may not have taken effect",
                f.leader_id
            ))),
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                Err(NodeError::Unavailable(e.to_string()))
            }
            Err(RaftError::Fatal(e)) => Err(NodeError::Unavailable(e.to_string())),
        }
    }
}
