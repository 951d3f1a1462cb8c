//! [`StoreError`]: what can go wrong below openraft. The trait impls turn it into openraft's
//! `StorageError` with the `StorageIOError` helper that names what was being read or written.

/// Why the store could not read or write.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The storage directory could not be created.
    #[error("cannot create the storage directory: {0}")]
    CreateDir(#[source] std::io::Error),
    /// sled failed to read, write or flush (an older format's directory, converted when opened).
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    /// A record does not encode or decode with bincode.
    #[error("bincode: {0}")]
    Codec(#[from] bincode::Error),
    /// The directory was written by a storage format this build does not know.
    #[error("storage format {found} is not supported (expected {expected})")]
    Format {
        /// The format the directory records.
        found: u32,
        /// The format this build writes.
        expected: u32,
    },
    /// A snapshot's lock state does not restore.
    #[error("snapshot: {0}")]
    Snapshot(#[from] holdfast_core::SnapshotError),
    /// The snapshot tree holds its metadata without its data, or the other way round.
    #[error("the stored snapshot is incomplete: {0} is missing")]
    SnapshotIncomplete(&'static str),
    /// A snapshot's file could not be created, read, written, synced or moved.
    #[error("snapshot file: {0}")]
    SnapshotFile(#[source] std::io::Error),
    /// A snapshot's bytes are not what was stored: a file whose length or checksum differ from those
    /// recorded with it, or bytes after the lock state.
    #[error("the stored snapshot is corrupt: {0}")]
    SnapshotCorrupt(String),
    /// The lock state's lock is poisoned: an earlier apply panicked while holding it.
    #[error("the lock state is poisoned: an earlier apply panicked")]
    Poisoned,
    /// A memory store's disk crashed, or was opened again, after this store opened it: the store
    /// belongs to a node that is gone (see [`crate::MemDisk::crash`]).
    #[error("the memory disk crashed or was opened again since this store opened it")]
    Stale,
    /// A file of the Raft log could not be read, written or synced.
    #[error("raft log file: {0}")]
    Io(#[source] std::io::Error),
    /// The Raft log's files hold something a crash cannot explain: a bad record before the last
    /// segment's end, or segments that do not follow each other.
    #[error("the raft log is corrupt: {0}")]
    LogCorrupt(String),
    /// A background sync of the Raft log failed (or its store is gone): whether the entries written
    /// since the last sync are on disk is unknown, so nothing after them is applied.
    #[error("the raft log's sync failed: {0}")]
    SyncFailed(String),
    /// The node's state machine is gone (the node is stopping) while a purge waited for its snapshot.
    #[error("the state machine is gone")]
    MachineGone,
    /// The store's records (the last purged log id, the current snapshot, the committed log id) could not
    /// be read or written, are damaged (a length or checksum that does not match), or are missing from a
    /// directory that holds a log.
    #[error("records: {0}")]
    Records(String),
    /// The vote's file could not be read or written, or is damaged (its length or checksum does not
    /// match): the node must not vote without knowing what it voted before.
    #[error("vote file: {0}")]
    Vote(String),
    /// The node stopped while an append waited for the disk to have room or its syncs to finish (see the
    /// `disk` module).
    #[error("disk: {0}")]
    DiskWait(String),
    /// A flush did not run to its end (the runtime is shutting down, or the flush panicked).
    #[error("flush task: {0}")]
    FlushTask(#[from] tokio::task::JoinError),
}
