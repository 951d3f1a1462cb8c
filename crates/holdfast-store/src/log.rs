//! The Raft log's backend-independent half, shared by the disk store ([`crate::LogStore`]) and the
//! memory store ([`crate::MemLogStore`]): reading a range of indexes, the log state, and when an append
//! is acknowledged.

use std::io;
use std::ops::{Bound, RangeBounds};

use openraft::storage::LogFlushed;
use openraft::{Entry, LogId, LogState, StorageError, StorageIOError, Vote};

use crate::{NodeId, StoreError, TypeConfig};

/// The log indexes in `range`, as the first and the end after the last (`None`: no end); `None` if
/// `range` holds no index.
pub(crate) fn index_range(range: &impl RangeBounds<u64>) -> Option<(u64, Option<u64>)> {
    let start = match range.start_bound() {
        Bound::Included(&i) => i,
        Bound::Excluded(&i) => i.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&i) => i.checked_add(1),
        Bound::Excluded(&i) => Some(i),
        Bound::Unbounded => None,
    };
    match end {
        Some(end) if end <= start => None,
        _ => Some((start, end)),
    }
}

/// The state of a log whose last purge ended at `last_purged` and whose last entry is `last_entry`:
/// with every entry purged, the log ends where the purge did.
pub(crate) fn log_state(last_purged: Option<LogId<NodeId>>, last_entry: Option<LogId<NodeId>>) -> LogState<TypeConfig> {
    LogState { last_purged_log_id: last_purged, last_log_id: last_entry.or(last_purged) }
}

/// Whether an append of `entries` is node `own`'s own, as leader: entries of the leader the last saved
/// `vote` is for, and that leader is `own`. A node's entries come back to it from a later leader only
/// after it saved that leader's vote, so those are judged a follower's. `own` `None`: nothing is.
pub(crate) fn own_leader_append(
    own: Option<NodeId>,
    vote: Option<&Vote<NodeId>>,
    entries: &[Entry<TypeConfig>],
) -> bool {
    let (Some(own), Some(vote)) = (own, vote) else { return false };
    // In openraft's default (not single-term-leader) mode an entry's leader id is the vote's leader id.
    let leader = vote.leader_id();
    leader.voted_for() == Some(own) && entries.iter().all(|entry| entry.log_id.leader_id == *leader)
}

/// The vote a node restarts with, given the `vote` it saved: its own vote as leader comes back not
/// committed when its own appends are acknowledged before their sync (`own` is its id).
///
/// openraft 0.9 restarts a node whose saved vote is its own committed one as leader at once, in the same
/// term. Such a leader's own entries that a crash lost before their sync may live on in a follower's log,
/// and the restarted leader would then write other entries under the same log ids (same term, same index):
/// the follower, finding a log id it holds, keeps its own entry, and the replicas diverge. Not committed,
/// the vote restarts the node as a follower, which campaigns for a new term; nobody else can lead the old
/// one, so nothing is lost by it but the restart's election.
pub(crate) fn restarted_vote(own: Option<NodeId>, vote: Vote<NodeId>) -> Vote<NodeId> {
    match own {
        Some(own) if vote.is_committed() && vote.leader_id().voted_for() == Some(own) => {
            Vote::new(vote.leader_id().get_term(), own)
        }
        _ => vote,
    }
}

/// Finishes an append whose entries were written (and made durable) with `written`: tells openraft
/// through `callback`, then answers the `append` call.
///
/// The callback tells openraft the entries are on disk (it then counts them towards a quorum), so
/// the backend fires it only after its flush, through this.
#[allow(
    clippy::result_large_err,
    reason = "the body of an openraft trait method, whose error is openraft's `StorageError`"
)]
pub(crate) fn complete_append(
    written: Result<(), StoreError>,
    callback: LogFlushed<TypeConfig>,
) -> Result<(), StorageError<NodeId>> {
    match written {
        Ok(()) => {
            callback.log_io_completed(Ok(()));
            Ok(())
        }
        Err(e) => {
            callback.log_io_completed(Err(io::Error::other(e.to_string())));
            Err(StorageIOError::write_logs(&e).into())
        }
    }
}

/// What a leader's replication is given to send after the entry before `start`: `entries` if they begin at
/// `start`, else nothing. openraft 0.9 sends what its replication reads as following the `prev` it asked
/// from, and a replication task left from an older membership is not held back by a purge: it can ask for
/// entries purged meanwhile, and a read that began at the first entry left would reach the follower as if it
/// followed `prev` (the simulation's seed 507: a leader removing itself while a follower caught up; the
/// follower's debug assertion stopped it). openraft sends an empty answer as a heartbeat, which changes
/// nothing on the follower, and its next request begins past the purge.
pub(crate) fn sent_from(start: u64, entries: Vec<Entry<TypeConfig>>) -> Vec<Entry<TypeConfig>> {
    match entries.first() {
        Some(first) if first.log_id.index != start => {
            tracing::warn!(start, first = first.log_id.index, "entries asked for to send were purged meanwhile");
            Vec::new()
        }
        _ => entries,
    }
}

/// openraft's log reader for a store with a method `entries(range) -> Result<Vec<Entry>, StoreError>`: its
/// entries in `range`, and for replication only those that begin where asked ([`sent_from`]). One
/// definition for both stores.
macro_rules! raft_log_reader {
    ($store:ty) => {
        impl openraft::RaftLogReader<$crate::TypeConfig> for $store {
            async fn try_get_log_entries<
                RB: std::ops::RangeBounds<u64> + Clone + std::fmt::Debug + openraft::OptionalSend,
            >(
                &mut self,
                range: RB,
            ) -> Result<Vec<openraft::Entry<$crate::TypeConfig>>, openraft::StorageError<$crate::NodeId>> {
                Ok(self.entries(range).map_err(|e| openraft::StorageIOError::read_logs(&e))?)
            }

            async fn limited_get_log_entries(
                &mut self,
                start: u64,
                end: u64,
            ) -> Result<Vec<openraft::Entry<$crate::TypeConfig>>, openraft::StorageError<$crate::NodeId>> {
                let entries = self.entries(start..end).map_err(|e| openraft::StorageIOError::read_logs(&e))?;
                Ok($crate::log::sent_from(start, entries))
            }
        }
    };
}
pub(crate) use raft_log_reader;

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries read to be sent after the one before `start` go only if they begin there: a read that found
    /// the first ones purged answers nothing, which openraft sends as a heartbeat.
    #[test]
    fn entries_to_send_go_only_if_they_begin_where_asked() {
        let blank = |index| Entry::<TypeConfig> {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: openraft::EntryPayload::Blank,
        };
        let from_5: Vec<_> = (5..8).map(blank).collect();
        assert_eq!(sent_from(5, from_5.clone()), from_5);
        assert_eq!(sent_from(3, from_5), Vec::new(), "3 and 4 were purged meanwhile");
        assert_eq!(sent_from(3, Vec::new()), Vec::new());
    }

    #[test]
    fn index_range_is_start_and_exclusive_end() {
        assert_eq!(index_range(&(..)), Some((0, None)));
        assert_eq!(index_range(&(3..)), Some((3, None)));
        assert_eq!(index_range(&(3..7)), Some((3, Some(7))));
        assert_eq!(index_range(&(3..=7)), Some((3, Some(8))));
        assert_eq!(index_range(&(..=u64::MAX)), Some((0, None)));
        assert_eq!(index_range(&(Bound::Excluded(2), Bound::Included(4))), Some((3, Some(5))));
    }

    #[test]
    fn an_append_is_the_nodes_own_only_under_its_own_vote() {
        use openraft::{CommittedLeaderId, EntryPayload};
        let entry = |term, leader| Entry::<TypeConfig> {
            log_id: LogId::new(CommittedLeaderId::new(term, leader), 4),
            payload: EntryPayload::Blank,
        };
        let own = Vote::new_committed(3, 1);
        assert!(own_leader_append(Some(1), Some(&own), &[entry(3, 1)]));
        assert!(own_leader_append(Some(1), Some(&Vote::new(3, 1)), &[entry(3, 1)]), "a vote not yet committed");
        assert!(!own_leader_append(None, Some(&own), &[entry(3, 1)]), "not asked for");
        assert!(!own_leader_append(Some(1), None, &[entry(3, 1)]));
        assert!(!own_leader_append(Some(2), Some(&own), &[entry(3, 1)]), "another node's vote");
        // The node's own entries of an earlier term, sent back by a later leader: a follower's append.
        assert!(!own_leader_append(Some(1), Some(&Vote::new_committed(4, 2)), &[entry(3, 1)]));
        assert!(!own_leader_append(Some(1), Some(&own), &[entry(3, 1), entry(2, 1)]), "one is of another term");
    }

    #[test]
    fn a_leader_restarts_with_its_vote_not_committed_only_when_it_acknowledges_early() {
        let own = Vote::new_committed(3, 1);
        assert_eq!(restarted_vote(Some(1), own), Vote::new(3, 1));
        assert_eq!(restarted_vote(None, own), own);
        assert_eq!(restarted_vote(Some(2), own), own, "another node's leadership");
        assert_eq!(restarted_vote(Some(1), Vote::new(3, 1)), Vote::new(3, 1));
    }

    #[test]
    fn index_range_is_none_when_empty() {
        assert_eq!(index_range(&(5..5)), None);
        assert_eq!(index_range(&(Bound::Included(6), Bound::Excluded(5))), None);
        assert_eq!(index_range(&(Bound::Excluded(u64::MAX), Bound::Unbounded)), None);
    }
}
