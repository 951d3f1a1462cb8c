//! The Raft log's backend-independent half, shared by the disk store ([`crate::LogStore`]) and the
//! memory store ([`crate::MemLogStore`]): reading a range of indexes, the log state, and when an append
//! is acknowledged.

use std::io;
use std::ops::{Bound, RangeBounds};

use openraft::storage::LogFlushed;
use openraft::{LogId, LogState, StorageError, StorageIOError};

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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn index_range_is_none_when_empty() {
        assert_eq!(index_range(&(5..5)), None);
        assert_eq!(index_range(&(Bound::Included(6), Bound::Excluded(5))), None);
        assert_eq!(index_range(&(Bound::Excluded(u64::MAX), Bound::Unbounded)), None);
    }
}
