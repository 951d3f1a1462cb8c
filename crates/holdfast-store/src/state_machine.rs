//! [`StateMachineStore`]: the lock state in memory ([`crate::machine`]), and its snapshot in the
//! `snapshot` tree.

use std::sync::Arc;

use crate::durable::Durable;
use crate::machine::{Bytes, Machine, Meta, Replace, SnapshotStore};
use crate::{flush, keys, ApplyObserver, SharedState, StoreError};

/// The lock state machine of one node: applies committed entries, builds and installs snapshots.
pub struct StateMachineStore {
    machine: Arc<Machine<SledSnapshots>>,
}

/// Builds snapshots of a [`StateMachineStore`] while it goes on applying; clones share the machine.
#[derive(Clone)]
pub struct SnapshotBuilder {
    machine: Arc<Machine<SledSnapshots>>,
}

/// The current snapshot, in the `snapshot` tree.
struct SledSnapshots {
    db: sled::Db,
    snapshots: sled::Tree,
    /// Told how long each flush took.
    observer: Arc<dyn ApplyObserver>,
    /// Serialises writes (and reads) of the `snapshot` tree: a save flushes between its check of the
    /// stored snapshot and its return, and a load reads two keys.
    io: tokio::sync::Mutex<()>,
}

impl StateMachineStore {
    /// The lock state, for readers; the state machine writes it on apply.
    pub fn state(&self) -> SharedState {
        self.machine.state()
    }

    /// Restores the lock state and progress from the stored snapshot, if there is one.
    pub(crate) fn open(
        db: sled::Db,
        snapshots: sled::Tree,
        observer: Arc<dyn ApplyObserver>,
        durable: Durable,
    ) -> Result<Self, StoreError> {
        let stored = read_snapshot(&snapshots)?;
        let snapshots = SledSnapshots { db, snapshots, observer: observer.clone(), io: tokio::sync::Mutex::new(()) };
        Ok(Self { machine: Arc::new(Machine::open(snapshots, stored, observer, durable)?) })
    }
}

/// The stored snapshot: its metadata and data.
fn read_snapshot(snapshots: &sled::Tree) -> Result<Option<(Meta, Vec<u8>)>, StoreError> {
    match (snapshots.get(keys::SNAPSHOT_META)?, snapshots.get(keys::SNAPSHOT_DATA)?) {
        (Some(meta), Some(data)) => Ok(Some((bincode::deserialize(&meta)?, data.to_vec()))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(StoreError::SnapshotIncomplete("data")),
        (None, Some(_)) => Err(StoreError::SnapshotIncomplete("meta")),
    }
}

impl SnapshotStore for SledSnapshots {
    fn next_seq(&self) -> Result<u64, StoreError> {
        // sled's id generator is persistent, so an id is never reused, even across restarts.
        Ok(self.db.generate_id()?)
    }

    async fn load(&self) -> Result<Option<(Meta, Vec<u8>)>, StoreError> {
        let _io = self.io.lock().await;
        read_snapshot(&self.snapshots)
    }

    async fn save(&self, meta: &Meta, data: Vec<u8>, replace: Replace) -> Result<(bool, Bytes), StoreError> {
        let _io = self.io.lock().await;
        let stored: Option<Meta> = match self.snapshots.get(keys::SNAPSHOT_META)? {
            Some(bytes) => Some(bincode::deserialize(&bytes)?),
            None => None,
        };
        if !replace.replaces(stored.as_ref(), meta) {
            return Ok((false, Box::new(data)));
        }
        // sled keeps a value in a buffer of its own, and writes it from another copy (its serialisation
        // of the value for its file). Made from `data`, which is then let go, the value is one of at most
        // two copies of the encoding in memory at once, not three; it is what is given back (sled's
        // buffer, shared). Measured at a million held locks (107 MiB encoded): see docs/benchmarks.md.
        let value = sled::IVec::from(data);
        let mut batch = sled::Batch::default();
        batch.insert(keys::SNAPSHOT_META, bincode::serialize(meta)?);
        batch.insert(keys::SNAPSHOT_DATA, value.clone());
        self.snapshots.apply_batch(batch)?;
        flush(&self.db, self.observer.as_ref()).await?;
        Ok((true, Box::new(value)))
    }
}

crate::machine::raft_state_machine!(StateMachineStore, SnapshotBuilder);
