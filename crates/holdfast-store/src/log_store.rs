//! [`LogStore`]: the Raft log, the vote and the committed log id, in the `log` and `meta` trees.

use std::fmt::Debug;
use std::ops::RangeBounds;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{Entry, LogId, LogState, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{flush, keys, log, ApplyObserver, NodeId, StoreError, TypeConfig};

/// The Raft log, the vote and the committed log id of one node; clones share the same trees.
#[derive(Clone)]
pub struct LogStore {
    db: sled::Db,
    log: sled::Tree,
    meta: sled::Tree,
    /// Told how long each flush took.
    observer: std::sync::Arc<dyn ApplyObserver>,
    /// The last committed index openraft saved, for status reports (0: none yet).
    committed_index: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// A log key: the index, big-endian, so that sled's byte order is index order.
fn key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

impl LogStore {
    pub(crate) fn new(
        db: sled::Db,
        log: sled::Tree,
        meta: sled::Tree,
        observer: std::sync::Arc<dyn ApplyObserver>,
    ) -> Self {
        Self { db, log, meta, observer, committed_index: Default::default() }
    }

    /// The last committed log index this node knows of, kept current as openraft reports commits; for
    /// status pages and readiness (0 before the first).
    pub fn committed_index(&self) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
        self.committed_index.clone()
    }

    fn read_meta<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, StoreError> {
        match self.meta.get(key)? {
            Some(bytes) => Ok(Some(bincode::deserialize(&bytes)?)),
            None => Ok(None),
        }
    }

    fn write_meta<T: Serialize>(&self, key: &str, value: &T) -> Result<(), StoreError> {
        self.meta.insert(key, bincode::serialize(value)?)?;
        Ok(())
    }

    fn entries(&self, range: impl RangeBounds<u64>) -> Result<Vec<Entry<TypeConfig>>, StoreError> {
        let keys = match log::index_range(&range) {
            None => return Ok(Vec::new()),
            Some((start, Some(end))) => self.log.range(key(start)..key(end)),
            Some((start, None)) => self.log.range(key(start)..),
        };
        keys.values().map(|value| Ok(bincode::deserialize(&value?)?)).collect()
    }

    fn log_state(&self) -> Result<LogState<TypeConfig>, StoreError> {
        let last_purged: Option<LogId<NodeId>> = self.read_meta(keys::LAST_PURGED)?;
        let last_entry = match self.log.last()? {
            Some((_, value)) => Some(bincode::deserialize::<Entry<TypeConfig>>(&value)?.log_id),
            None => None,
        };
        Ok(log::log_state(last_purged, last_entry))
    }

    fn write_entries(&self, entries: impl IntoIterator<Item = Entry<TypeConfig>>) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for entry in entries {
            batch.insert(&key(entry.log_id.index), bincode::serialize(&entry)?);
        }
        self.log.apply_batch(batch)?;
        Ok(())
    }

    /// Deletes the entries with an index in `range`, in one batch.
    fn delete(&self, range: impl RangeBounds<[u8; 8]>) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for k in self.log.range(range).keys() {
            batch.remove(k?);
        }
        self.log.apply_batch(batch)?;
        Ok(())
    }

    async fn append_flushed(&self, entries: impl IntoIterator<Item = Entry<TypeConfig>>) -> Result<(), StoreError> {
        self.write_entries(entries)?;
        flush(&self.db, self.observer.as_ref()).await
    }

    async fn truncate_flushed(&self, since: u64) -> Result<(), StoreError> {
        self.delete(key(since)..)?;
        flush(&self.db, self.observer.as_ref()).await
    }

    async fn purge_flushed(&self, upto: LogId<NodeId>) -> Result<(), StoreError> {
        // `last_purged` first: if the node stops between the two writes, the log still says where
        // it starts, and the next purge deletes what is left below it.
        self.write_meta(keys::LAST_PURGED, &upto)?;
        self.delete(..=key(upto.index))?;
        flush(&self.db, self.observer.as_ref()).await
    }

    async fn save_vote_flushed(&self, vote: &Vote<NodeId>) -> Result<(), StoreError> {
        self.write_meta(keys::VOTE, vote)?;
        flush(&self.db, self.observer.as_ref()).await
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        Ok(self.entries(range).map_err(|e| StorageIOError::read_logs(&e))?)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        Ok(self.log_state().map_err(|e| StorageIOError::read_logs(&e))?)
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        Ok(self.save_vote_flushed(vote).await.map_err(|e| StorageIOError::write_vote(&e))?)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        Ok(self.read_meta(keys::VOTE).map_err(|e| StorageIOError::read_vote(&e))?)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), StorageError<NodeId>> {
        // Not flushed on its own: see "Durability" in the crate docs.
        let index = committed.map_or(0, |c| c.index);
        self.committed_index.store(index, std::sync::atomic::Ordering::Relaxed);
        Ok(self.write_meta(keys::COMMITTED, &committed).map_err(|e| StorageIOError::write(&e))?)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        let committed: Option<Option<LogId<NodeId>>> =
            self.read_meta(keys::COMMITTED).map_err(|e| StorageIOError::read(&e))?;
        Ok(committed.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        log::complete_append(self.append_flushed(entries).await, callback)
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        Ok(self.truncate_flushed(log_id.index).await.map_err(|e| StorageIOError::write_logs(&e))?)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        Ok(self.purge_flushed(log_id).await.map_err(|e| StorageIOError::write_logs(&e))?)
    }
}
