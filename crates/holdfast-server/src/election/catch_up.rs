//! A node whose damaged log was cut catches up before it votes again (holdfast-store's `refetched` module
//! says why it must not vote until then): it learns the last log index of a leader whose term is at least
//! that of its own vote, waits until it has applied that far (Raft's replication fills its log again, or
//! installs a snapshot), then removes its store's record of the cut and takes part in elections again.

use std::time::Duration;

use holdfast_store::{NodeId, Recovering};
use openraft::raft::VoteResponse;

use super::Elections;
use crate::peer::client::CallError;
use crate::peer::codec::Call;
use crate::peer::protocol::LogEnd;

/// How long a member may take to say where its log ends.
const ASK_TIMEOUT: Duration = Duration::from_secs(1);
/// The pause after a round in which no member answered as a leader of a recent enough term.
const ASK_PAUSE: Duration = Duration::from_millis(250);
/// How often the wait for the log looks again even if Raft's metrics did not change.
const LOOK_AGAIN: Duration = Duration::from_millis(250);

impl Elections {
    /// Holds this node's votes while its log, cut as `recovering` says, catches up with a leader's (see the
    /// module docs); then releases them and removes the store's record of the cut. Ends early on `stop`,
    /// votes still held (the record stays, and the next start catches up again).
    pub async fn catch_up(&self, recovering: Recovering, mut stop: tokio::sync::watch::Receiver<bool>) {
        self.hold(Some(recovering.cut.clone()));
        let own_term = self.raft.metrics().borrow().vote.leader_id().term;
        let caught_up = async {
            let (leader, target) = self.leaders_log_end(own_term).await;
            tracing::info!(leader, target, cut = %recovering.cut, "catching up to the leader's log before voting again");
            // Applied is durable (nothing is applied before it is) and committed: the node's log and
            // snapshot then hold every entry through the target, whether appended again or installed.
            let mut metrics = self.raft.metrics();
            while metrics.borrow().last_applied.is_none_or(|applied| applied.index < target) {
                let _ = tokio::time::timeout(LOOK_AGAIN, metrics.changed()).await;
            }
            target
        };
        let target = tokio::select! {
            _ = stop.changed() => return,
            target = caught_up => target,
        };
        match recovering.caught_up().await {
            Ok(()) => {
                self.hold(None);
                tracing::info!(target, "caught up after the damaged log was cut: this node votes again");
            }
            Err(e) => {
                tracing::error!(error = %e, "caught up, but cannot remove the record of the cut: votes stay held")
            }
        }
    }

    /// What this node answers a candidate while its votes are held: not granted, with its own vote and its
    /// last durable entry, as a voter that refused.
    pub fn refused_vote(&self) -> VoteResponse<NodeId> {
        let vote = self.raft.metrics().borrow().vote;
        VoteResponse::new(vote, self.durable.last(), false)
    }

    /// Holds this node's votes (`cut`: what was cut where), or releases them (`None`).
    pub fn hold(&self, cut: Option<String>) {
        self.metrics.storage_catching_up.set(i64::from(cut.is_some()));
        *self.held.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = cut;
    }

    /// The id and last log index of a member that leads in a term of at least `term`, asking every member
    /// in turn, round after round, until one does.
    async fn leaders_log_end(&self, term: u64) -> (NodeId, u64) {
        loop {
            let membership = self.raft.metrics().borrow().membership_config.clone();
            for (&id, node) in membership.membership().nodes().filter(|(id, _)| **id != self.id) {
                let answer: Result<LogEnd, CallError> =
                    self.peers.call(id, &node.addr, Call::LogEnd, &(), ASK_TIMEOUT).await;
                match answer {
                    Ok(LogEnd { leader: true, term: its, last_index }) if its >= term => return (id, last_index),
                    Ok(end) => tracing::debug!(peer = id, ?end, term, "not a leader of a recent enough term"),
                    Err(e) => tracing::debug!(peer = id, %e, "no answer to where its log ends"),
                }
            }
            tokio::time::sleep(ASK_PAUSE).await;
        }
    }
}
