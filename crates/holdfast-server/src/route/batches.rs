//! What a follower knows of its leader's batches: whether the leader reads them (a leader of a build from
//! before batches closes the connection on one), whether it reads heartbeat batches that say how long they
//! waited (`ForwardRequest::HeartbeatsWaited`, newer still), and whether a question about it is on its way.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use holdfast_store::NodeId;
use tokio::time::Instant;

/// How long a follower forwards heartbeats and writes one by one after the leader closed the connection on
/// a batch, as a leader of a build from before batches does (it cannot decode the request).
pub const BATCHES_REFUSED_FOR: Duration = Duration::from_secs(30);

/// What a leader did with the last batch (of heartbeats or writes) a follower sent it.
#[derive(Debug, Clone, Copy)]
pub enum LeaderBatches {
    /// It answered: it reads batches.
    Read(NodeId),
    /// It closed the connection on it, as a build from before batches does: it is sent nothing in batches
    /// until then.
    Refused(NodeId, Instant),
}

/// What a follower knows of the batches its leaders read.
#[derive(Debug, Default)]
pub struct Batches {
    /// What the last leader sent a batch did with it.
    seen: Mutex<Option<LeaderBatches>>,
    /// The last leader that closed the connection on a `HeartbeatsWaited`, and until when it is sent plain
    /// `Heartbeats` instead.
    waited_refused: Mutex<Option<(NodeId, Instant)>>,
    /// Whether an empty batch is on its way to ask the leader whether it reads batches.
    asking: AtomicBool,
}

impl Batches {
    /// Whether `leader` reads batches, as far as this node has seen: `Some(false)` for
    /// [`BATCHES_REFUSED_FOR`] after it closed the connection on one.
    pub fn reads(&self, leader: NodeId) -> Option<bool> {
        match *self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) {
            Some(LeaderBatches::Read(by)) if by == leader => Some(true),
            Some(LeaderBatches::Refused(by, until)) if by == leader && Instant::now() < until => Some(false),
            _ => None,
        }
    }

    /// Records what a leader did with a batch.
    pub fn record(&self, seen: LeaderBatches) {
        *self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(seen);
    }

    /// Whether `leader` closed the connection on a batch not long ago (see [`BATCHES_REFUSED_FOR`]).
    pub fn refused(&self, leader: Option<NodeId>) -> bool {
        leader.is_some_and(|leader| self.reads(leader) == Some(false))
    }

    /// Whether `leader` may be sent a `HeartbeatsWaited`: unless it closed the connection on one less than
    /// [`BATCHES_REFUSED_FOR`] ago.
    pub fn reads_waited(&self, leader: NodeId) -> bool {
        let refused = *self.waited_refused.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        !refused.is_some_and(|(by, until)| by == leader && Instant::now() < until)
    }

    /// Records that `leader` closed the connection on a `HeartbeatsWaited`, as a build from before it does.
    pub fn refused_waited(&self, leader: NodeId) {
        let until = Instant::now() + BATCHES_REFUSED_FOR;
        *self.waited_refused.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some((leader, until));
    }

    /// Marks a question to the leader as on its way: true if none was.
    pub fn start_asking(&self) -> bool {
        !self.asking.swap(true, Ordering::AcqRel)
    }

    /// The question came back.
    pub fn done_asking(&self) {
        self.asking.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_leader_that_refused_waited_heartbeats_is_sent_plain_ones_for_a_while() {
        let batches = Batches::default();
        assert!(batches.reads_waited(1), "unknown: tried");
        batches.refused_waited(1);
        assert!(!batches.reads_waited(1), "refused: plain batches");
        assert!(batches.reads_waited(2), "another leader is tried");
        assert!(!batches.refused(Some(1)), "plain batches still go to it");
        tokio::time::advance(BATCHES_REFUSED_FOR).await;
        assert!(batches.reads_waited(1), "tried again after a while (it may have been upgraded)");
    }
}
