//! Sessions' leases, kept by the leader: heartbeats are not written to the log; the leader extends each
//! session's deadline in memory (`apply::events`) once a quorum round confirms it still leads.

use holdfast_core::SessionId;
use tokio::time::Instant;

use super::Leader;
use crate::peer::protocol::{HeartbeatReply, NodeError};

/// Sessions a heartbeat batch extends under one read of the lock state, at most.
const EXTENDED_UNDER_ONE_READ: usize = 512;

impl Leader {
    /// As leader: gives every hold, session and waiter a full lease from now (with `--max-clock-skew`, each
    /// TTL hold its stamped end plus the bound and the election), once per term. True if this call did it.
    pub fn promote(&self) -> bool {
        let term = self.raft.metrics().borrow().current_term;
        let promoted = self.events.promote(term, self.elections.followed(), self.bugs);
        if promoted && self.events.keeps_stamped_ends() {
            tracing::info!(
                term,
                "became leader; sessions and waiters get a full lease from now, TTL holds keep their ends"
            );
        } else if promoted {
            tracing::info!(term, "became leader; every hold, session and waiter gets a full lease from now");
        }
        promoted
    }

    /// The leader's side of a heartbeat that reached it at `received`.
    pub(super) async fn keep_alive(&self, id: SessionId, received: Instant) -> Result<HeartbeatReply, NodeError> {
        Ok(self.keep_alive_all(&[id], received, received).await?.pop().flatten())
    }

    /// Keeps the sessions `ids` alive from now, on heartbeats that reached this node at `received`: for each,
    /// how many locks it holds and waits for, or `None` if it is gone. One quorum round confirms them all.
    /// The heartbeat lag counts from `waiting_since` (`received`, or earlier if they waited on a follower).
    pub async fn keep_alive_all(
        &self,
        ids: &[SessionId],
        received: Instant,
        waiting_since: Instant,
    ) -> Result<Vec<HeartbeatReply>, NodeError> {
        self.elections.check_leader()?;
        // A heartbeat may reach a new leader before its keeper's next tick: the deadlines it kept as a
        // follower are stale, so promote first or a live session would be refused as gone.
        self.promote();
        let mut extended: Vec<HeartbeatReply> = Vec::with_capacity(ids.len());
        // How far the state was applied when it was first read: if no entry is applied by the end, no
        // session can have closed meanwhile.
        let mut applied = None;
        // A few hundred under each read of the state: applies wait no longer than that for a large batch.
        // The keeper's sessions and their counts follow the state as each entry is applied, under the
        // state's write lock: read under its read lock, they are the state's.
        for ids in ids.chunks(EXTENDED_UNDER_ONE_READ) {
            let state = crate::state::read(&self.state);
            applied.get_or_insert(state.applied_index());
            // Extended from now, after the client sent the heartbeat: the client, counting its lease from
            // when it sent it, never believes in a lease longer than the leader's.
            let mut extending = self.events.extending();
            extended.extend(ids.iter().map(|&id| extending.extend(id)));
        }
        // Acknowledged only once a quorum round begun after the heartbeats arrived confirms this node still
        // leads: a deposed leader's extension is worthless, so it must not be acknowledged.
        if extended.iter().any(Option::is_some) && !self.bugs.unconfirmed_heartbeats() {
            // Not confirmed until this node applied its floor, either: a heartbeat is answered from its state.
            if !matches!(self.confirmer.confirmed_since(received, false).await, Ok(None)) {
                return Err(NodeError::NotLeader { leader: None });
            }
            self.load.confirmed(waiting_since.min(received));
        }
        // Belt and braces: a session may have been closed while the round ran, if anything was applied.
        let state = crate::state::read(&self.state);
        if applied == Some(state.applied_index()) {
            return Ok(extended);
        }
        let extending = self.events.extending();
        Ok(ids.iter().zip(extended).map(|(&id, counts)| counts.filter(|_| extending.is_open(id))).collect())
    }
}
