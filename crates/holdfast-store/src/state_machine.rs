//! [`StateMachineStore`]: the lock state in memory, and its snapshot in the `snapshot` tree.

use std::io::Cursor;
use std::sync::{Arc, Mutex, RwLock};

use holdfast_core::LockState;
use openraft::storage::RaftStateMachine;
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};

use crate::{flush, keys, ApplyObserver, NodeId, Response, SharedState, StoreError, TypeConfig};

type Meta = SnapshotMeta<NodeId, BasicNode>;

/// The lock state machine of one node: applies committed entries, builds and installs snapshots.
pub struct StateMachineStore {
    machine: Arc<Machine>,
}

/// Builds snapshots of a [`StateMachineStore`] while it goes on applying; clones share the machine.
#[derive(Clone)]
pub struct SnapshotBuilder {
    machine: Arc<Machine>,
}

/// How far the lock state has got: the Raft side of it.
#[derive(Debug, Clone, Default)]
struct Progress {
    last_applied: Option<LogId<NodeId>>,
    last_membership: StoredMembership<NodeId, BasicNode>,
}

struct Machine {
    db: sled::Db,
    snapshots: sled::Tree,
    state: SharedState,
    /// Changed only while `state`'s write lock is held, so that whoever holds `state` (read or
    /// write) sees the progress that produced it. Lock order: `state`, then `progress`.
    progress: Mutex<Progress>,
    observer: Arc<dyn ApplyObserver>,
    /// Serialises writes (and reads) of the `snapshot` tree. Snapshots are built in a task of their
    /// own, so a build can finish after a newer snapshot was installed; it must not replace it.
    snapshot_io: tokio::sync::Mutex<()>,
}

impl StateMachineStore {
    /// The lock state, for readers; the state machine writes it on apply.
    pub fn state(&self) -> SharedState {
        self.machine.state.clone()
    }

    /// Restores the lock state and progress from the stored snapshot, if there is one.
    pub(crate) fn open(
        db: sled::Db,
        snapshots: sled::Tree,
        observer: Arc<dyn ApplyObserver>,
    ) -> Result<Self, StoreError> {
        let (state, progress) = match read_snapshot(&snapshots)? {
            Some((meta, data)) => {
                let state = restore(&data)?;
                (state, Progress { last_applied: meta.last_log_id, last_membership: meta.last_membership })
            }
            None => (LockState::new(), Progress::default()),
        };
        let restored = progress.last_applied.is_some();
        let state = Arc::new(RwLock::new(state));
        let machine = Machine {
            db,
            snapshots,
            state,
            progress: Mutex::new(progress),
            observer,
            snapshot_io: tokio::sync::Mutex::new(()),
        };
        if restored {
            let state = machine.state.read().map_err(|_| StoreError::Poisoned)?;
            machine.observer.restored(&state);
        }
        Ok(Self { machine: Arc::new(machine) })
    }
}

/// The lock state in `data`, checked: a snapshot that breaks an invariant is a bug, not an input to
/// run with.
fn restore(data: &[u8]) -> Result<LockState, StoreError> {
    let state = LockState::restore(data)?;
    state.check_invariants();
    Ok(state)
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

impl Machine {
    fn progress(&self) -> Result<Progress, StoreError> {
        Ok(self.progress.lock().map_err(|_| StoreError::Poisoned)?.clone())
    }

    fn apply(&self, entry: Entry<TypeConfig>) -> Result<Response, StoreError> {
        let mut state = self.state.write().map_err(|_| StoreError::Poisoned)?;
        let mut progress = self.progress.lock().map_err(|_| StoreError::Poisoned)?;
        let log_id = entry.log_id;
        let response = match entry.payload {
            EntryPayload::Normal(entry) => {
                let applied = state.apply(log_id.index, &entry);
                self.observer.applied(&state, log_id.index, &entry, &applied);
                Response { at_ms: applied.at_ms, outcome: Some(applied.outcome) }
            }
            EntryPayload::Blank => Response { at_ms: state.now_ms(), outcome: None },
            EntryPayload::Membership(membership) => {
                progress.last_membership = StoredMembership::new(Some(log_id), membership);
                Response { at_ms: state.now_ms(), outcome: None }
            }
        };
        progress.last_applied = Some(log_id);
        Ok(response)
    }

    async fn build_snapshot(&self) -> Result<Snapshot<TypeConfig>, StoreError> {
        let (data, progress) = {
            let state = self.state.read().map_err(|_| StoreError::Poisoned)?;
            (state.snapshot(), self.progress()?)
        };
        // sled's id generator is persistent, so an id is never reused, even across restarts.
        let seq = self.db.generate_id()?;
        let snapshot_id = match &progress.last_applied {
            Some(id) => format!("{}-{}-{}", id.leader_id.term, id.index, seq),
            None => format!("none-{seq}"),
        };
        let meta = Meta { last_log_id: progress.last_applied, last_membership: progress.last_membership, snapshot_id };
        self.persist_snapshot(&meta, &data, Replace::IfNotOlder).await?;
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }

    /// Writes `meta` and `data` as the current snapshot and flushes them.
    async fn persist_snapshot(&self, meta: &Meta, data: &[u8], replace: Replace) -> Result<(), StoreError> {
        let _io = self.snapshot_io.lock().await;
        if replace == Replace::IfNotOlder {
            if let Some(current) = self.snapshots.get(keys::SNAPSHOT_META)? {
                let current: Meta = bincode::deserialize(&current)?;
                if current.last_log_id > meta.last_log_id {
                    return Ok(());
                }
            }
        }
        let mut batch = sled::Batch::default();
        batch.insert(keys::SNAPSHOT_META, bincode::serialize(meta)?);
        batch.insert(keys::SNAPSHOT_DATA, data);
        self.snapshots.apply_batch(batch)?;
        flush(&self.db, self.observer.as_ref()).await
    }

    /// Replaces the lock state and progress with a snapshot's.
    fn replace(&self, meta: &Meta, new_state: LockState) -> Result<(), StoreError> {
        let mut state = self.state.write().map_err(|_| StoreError::Poisoned)?;
        let mut progress = self.progress.lock().map_err(|_| StoreError::Poisoned)?;
        *state = new_state;
        *progress = Progress { last_applied: meta.last_log_id, last_membership: meta.last_membership.clone() };
        self.observer.restored(&state);
        Ok(())
    }

    async fn current_snapshot(&self) -> Result<Option<Snapshot<TypeConfig>>, StoreError> {
        let _io = self.snapshot_io.lock().await;
        Ok(read_snapshot(&self.snapshots)?.map(|(meta, data)| Snapshot { meta, snapshot: Box::new(Cursor::new(data)) }))
    }
}

/// Whether a snapshot write replaces a stored snapshot that covers more of the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replace {
    /// Yes: openraft installs what the leader sent, and has checked it is not stale.
    Always,
    /// No: a build that finished late keeps the newer snapshot.
    IfNotOlder,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        Ok(self.machine.build_snapshot().await.map_err(|e| StorageIOError::write_snapshot(None, &e))?)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), StorageError<NodeId>> {
        let progress = self.machine.progress().map_err(|e| StorageIOError::read_state_machine(&e))?;
        Ok((progress.last_applied, progress.last_membership))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // One entry at a time under the write lock, so readers get in between the entries of a long
        // re-apply.
        let mut responses = Vec::new();
        for entry in entries {
            let log_id = entry.log_id;
            responses.push(self.machine.apply(entry).map_err(|e| StorageIOError::apply(log_id, &e))?);
        }
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder { machine: self.machine.clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let signature = || Some(meta.signature());
        let data = snapshot.into_inner();
        let new_state = restore(&data).map_err(|e| StorageIOError::read_snapshot(signature(), &e))?;
        // On disk first: once the state is replaced, openraft may purge the log the snapshot covers.
        self.machine
            .persist_snapshot(meta, &data, Replace::Always)
            .await
            .map_err(|e| StorageIOError::write_snapshot(signature(), &e))?;
        self.machine.replace(meta, new_state).map_err(|e| StorageIOError::write_state_machine(&e))?;
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        Ok(self.machine.current_snapshot().await.map_err(|e| StorageIOError::read_snapshot(None, &e))?)
    }
}
