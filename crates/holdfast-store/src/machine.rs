//! The state machine's backend-independent half, shared by the disk store ([`crate::StateMachineStore`])
//! and the memory store ([`crate::MemStateMachine`]): applying entries to the lock state (and telling the
//! observer), tracking how far the state has got (last applied log id, membership), turning the state into
//! snapshot bytes and back, and the order of a snapshot build and install. A backend adds only where the
//! current snapshot is kept, as a [`SnapshotStore`].

use std::sync::{Arc, Mutex, RwLock};

use holdfast_core::LockState;
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, Snapshot, SnapshotMeta, StorageError, StorageIOError,
    StoredMembership,
};

use crate::covered::CoveredSender;
use crate::durable::Durable;
use crate::runtime::blocking;
use crate::snapshot::{SnapshotData, Summary};
use crate::{ApplyObserver, NodeId, Response, SharedState, StoreError, TypeConfig};

/// A snapshot's metadata.
pub(crate) type Meta = SnapshotMeta<NodeId, BasicNode>;

/// The last applied log id and the membership as of it, as `RaftStateMachine::applied_state` answers.
pub(crate) type AppliedState = (Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>);

/// A snapshot a store found when it was opened: its metadata, the lock state restored from it, and the
/// length of its bytes.
pub(crate) type Restored = (Meta, LockState, u64);

/// Where a backend keeps the current snapshot (its metadata and the bytes of [`LockState::snapshot`]).
pub(crate) trait SnapshotStore: Send + Sync + 'static {
    /// A number this store has not returned since it was opened, past those its snapshot files were
    /// named after: with the log position, it makes a snapshot id. A number handed out before a restart
    /// for a snapshot that was not kept may come again; the id then names the same state only if the
    /// position is the same, and the same position holds the same state on every node.
    fn next_seq(&self) -> Result<u64, StoreError>;

    /// A new, empty place for a snapshot's bytes: one being built, or received from the leader. Not the
    /// current snapshot until saved; gone when dropped unsaved.
    fn create(&self) -> Result<SnapshotData, StoreError>;

    /// The current snapshot, if one was stored.
    async fn load(&self) -> Result<Option<(Meta, SnapshotData)>, StoreError>;

    /// Makes `meta` and `data` (written in full; `summary` is of its bytes) the current snapshot, durable
    /// before this returns, unless `replace` keeps the stored one; true if it did. Bytes that were not
    /// made by this store's [`SnapshotStore::create`] are copied into a place that was. Saves and loads are serialised: each sees the whole of the one before. Gives
    /// the bytes back, as kept (or, if they were not, as they were given).
    async fn save(
        &self,
        meta: &Meta,
        data: SnapshotData,
        summary: Summary,
        replace: Replace,
    ) -> Result<(bool, SnapshotData), StoreError>;
}

/// Whether a snapshot save replaces a stored snapshot that covers more of the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replace {
    /// Yes: openraft installs what the leader sent, and has checked it is not stale.
    Always,
    /// No: snapshots are built in a task of their own, so a build can finish after a newer
    /// snapshot was installed; it must not replace it.
    IfNotOlder,
}

impl Replace {
    /// Whether a save of `new` goes ahead over `stored`.
    pub(crate) fn replaces(self, stored: Option<&Meta>, new: &Meta) -> bool {
        match (self, stored) {
            (Replace::Always, _) | (Replace::IfNotOlder, None) => true,
            (Replace::IfNotOlder, Some(stored)) => stored.last_log_id <= new.last_log_id,
        }
    }
}

/// How far the lock state has got: the Raft side of it.
#[derive(Debug, Clone, Default)]
struct Progress {
    last_applied: Option<LogId<NodeId>>,
    last_membership: StoredMembership<NodeId, BasicNode>,
}

impl Progress {
    /// Where a state restored from the snapshot `meta` describes has got.
    fn of(meta: &Meta) -> Self {
        Self { last_applied: meta.last_log_id, last_membership: meta.last_membership.clone() }
    }
}

/// The lock state of one node, how far it has got, and where its snapshot is kept.
pub(crate) struct Machine<S> {
    state: SharedState,
    /// Changed only while `state`'s write lock is held, so that whoever holds `state` (read or
    /// write) sees the progress that produced it. Lock order: `state`, then `progress`.
    progress: Mutex<Progress>,
    observer: Arc<dyn ApplyObserver>,
    snapshots: S,
    /// How far the node's log is durable: nothing is applied before it is (see the `durable` module).
    durable: Durable,
    /// Told of every snapshot received and stored, for the log's purges to wait on (see the `covered`
    /// module).
    covered: CoveredSender,
}

impl<S: SnapshotStore> Machine<S> {
    /// A machine at `stored`, the snapshot `snapshots` holds, restored (and the observer told), or empty
    /// without one: openraft then re-applies only the log after it.
    pub(crate) fn open(
        snapshots: S,
        stored: Option<Restored>,
        observer: Arc<dyn ApplyObserver>,
        durable: Durable,
        covered: CoveredSender,
    ) -> Result<Self, StoreError> {
        let (state, progress, stored) = match stored {
            Some((meta, state, len)) => (state, Progress::of(&meta), Some((meta, len))),
            None => (LockState::new(), Progress::default(), None),
        };
        let restored = progress.last_applied.is_some();
        let machine = Self {
            state: Arc::new(RwLock::new(state)),
            progress: Mutex::new(progress),
            observer,
            snapshots,
            durable,
            covered,
        };
        if restored {
            let state = machine.state.read().map_err(|_| StoreError::Poisoned)?;
            machine.observer.restored(&state);
        }
        if let Some((meta, len)) = stored {
            machine.stored(&meta, len, false);
        }
        Ok(machine)
    }

    /// The lock state, for readers; the machine writes it on apply.
    pub(crate) fn state(&self) -> SharedState {
        self.state.clone()
    }

    /// Where the current snapshot is kept.
    pub(crate) fn snapshots(&self) -> &S {
        &self.snapshots
    }

    fn progress(&self) -> Result<Progress, StoreError> {
        Ok(self.progress.lock().map_err(|_| StoreError::Poisoned)?.clone())
    }

    /// The last applied log id and the membership it carries (`RaftStateMachine::applied_state`).
    #[allow(
        clippy::result_large_err,
        reason = "the body of an openraft trait method, whose error is openraft's `StorageError`"
    )]
    pub(crate) fn applied_state(&self) -> Result<AppliedState, StorageError<NodeId>> {
        let progress = self.progress().map_err(|e| StorageIOError::read_state_machine(&e))?;
        Ok((progress.last_applied, progress.last_membership))
    }

    /// Applies `entries` in order (`RaftStateMachine::apply`): one answer per entry, once the node's log is
    /// durable through the last (at once but on a leader whose own sync is still under way).
    pub(crate) async fn apply<I>(&self, entries: I) -> Result<Vec<Response>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
    {
        let entries: Vec<_> = entries.into_iter().collect();
        if let Some(last) = entries.last().map(|entry| entry.log_id) {
            self.durable.reached(last.index).await.map_err(|e| StorageIOError::apply(last, &e))?;
        }
        // One entry at a time under the write lock, so readers get in between the entries of a long
        // re-apply.
        let mut responses = Vec::new();
        for entry in entries {
            let log_id = entry.log_id;
            responses.push(self.apply_one(entry).map_err(|e| StorageIOError::apply(log_id, &e))?);
        }
        Ok(responses)
    }

    fn apply_one(&self, entry: Entry<TypeConfig>) -> Result<Response, StoreError> {
        let mut state = self.state.write().map_err(|_| StoreError::Poisoned)?;
        let mut progress = self.progress.lock().map_err(|_| StoreError::Poisoned)?;
        let log_id = entry.log_id;
        let response = match entry.payload {
            EntryPayload::Normal(entry) => {
                let outcome = state.apply_each(log_id.index, &entry, |state, cmd, applied| {
                    self.observer.applied(state, log_id.index, cmd, applied)
                });
                Response { at_ms: state.now_ms(), outcome: Some(outcome) }
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

    /// Snapshots the state as it is now, stores the snapshot (unless a newer one was stored
    /// meanwhile) and returns it (`RaftSnapshotBuilder::build_snapshot`).
    pub(crate) async fn build_snapshot(&self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let (meta, copy) = self.copy().map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        let signature = || Some(meta.signature());
        let mut data = self.snapshots.create().map_err(|e| StorageIOError::write_snapshot(signature(), &e))?;
        let summary = data.encode(copy).await.map_err(|e| StorageIOError::write_snapshot(signature(), &e))?;
        let (saved, data) = self
            .snapshots
            .save(&meta, data, summary, Replace::IfNotOlder)
            .await
            .map_err(|e| StorageIOError::write_snapshot(signature(), &e))?;
        if saved {
            self.stored(&meta, summary.len, false);
        }
        Ok(Snapshot { meta, snapshot: Box::new(data) })
    }

    /// A copy of the state and the metadata of a snapshot of it, read together.
    ///
    /// The state's lock is held only to copy it, which takes the same short time whatever its size
    /// (see [`LockState`]); the copy is encoded afterwards, off the async workers, while entries go on
    /// being applied. Encoding under the lock held every apply up for as long (a second or more for a
    /// million held locks), and with it every worker thread that then waited for the lock: the node
    /// stopped answering its peers, and its followers elected another leader.
    fn copy(&self) -> Result<(Meta, LockState), StoreError> {
        let (copy, progress) = {
            let state = self.state.read().map_err(|_| StoreError::Poisoned)?;
            (state.clone(), self.progress()?)
        };
        let seq = self.snapshots.next_seq()?;
        let snapshot_id = match &progress.last_applied {
            Some(id) => format!("{}-{}-{}", id.leader_id.term, id.index, seq),
            None => format!("none-{seq}"),
        };
        let meta = Meta { last_log_id: progress.last_applied, last_membership: progress.last_membership, snapshot_id };
        Ok((meta, copy))
    }

    /// Replaces the state with the snapshot `meta` and `snapshot` (`RaftStateMachine::install_snapshot`):
    /// checked, then stored, then installed.
    pub(crate) async fn install_snapshot(
        &self,
        meta: &Meta,
        mut snapshot: Box<SnapshotData>,
    ) -> Result<(), StorageError<NodeId>> {
        let signature = || Some(meta.signature());
        let (new_state, summary) =
            snapshot.decode().await.map_err(|e| StorageIOError::read_snapshot(signature(), &e))?;
        // Stored first: openraft purges the log the snapshot covers as soon as it has handed the
        // snapshot over, and the purge waits for this (see the `covered` module).
        self.snapshots
            .save(meta, *snapshot, summary, Replace::Always)
            .await
            .map_err(|e| StorageIOError::write_snapshot(signature(), &e))?;
        self.stored(meta, summary.len, true);
        self.replace(meta, new_state).map_err(|e| StorageIOError::write_state_machine(&e))?;
        Ok(())
    }

    /// A new, empty place for a snapshot the leader sends (`RaftStateMachine::begin_receiving_snapshot`).
    #[allow(
        clippy::result_large_err,
        reason = "the body of an openraft trait method, whose error is openraft's `StorageError`"
    )]
    pub(crate) fn receive_snapshot(&self) -> Result<Box<SnapshotData>, StorageError<NodeId>> {
        self.covered.receiving();
        Ok(Box::new(self.snapshots.create().map_err(|e| StorageIOError::write_snapshot(None, &e))?))
    }

    /// Tells the observer that the snapshot `meta` describes, `len` bytes, is now this node's current one;
    /// `installed`: the leader sent it.
    fn stored(&self, meta: &Meta, len: u64, installed: bool) {
        let index = meta.last_log_id.map_or(0, |id| id.index);
        self.covered.stored(index, installed);
        self.observer.snapshot_stored(index, len);
    }

    /// Replaces the lock state and progress with a snapshot's.
    ///
    /// Only the swap holds the state's lock. The work in proportion to the state, dropping the old one and
    /// the observer rebuilding its deadlines from the new one (a copy, taken in an instant), comes after,
    /// off the runtime's worker: nothing is applied meanwhile (apply and install are one task's, in turn),
    /// and the node goes on answering.
    fn replace(&self, meta: &Meta, new_state: LockState) -> Result<(), StoreError> {
        let installed = new_state.clone();
        let old = {
            let mut state = self.state.write().map_err(|_| StoreError::Poisoned)?;
            let mut progress = self.progress.lock().map_err(|_| StoreError::Poisoned)?;
            *progress = Progress::of(meta);
            std::mem::replace(&mut *state, new_state)
        };
        blocking(move || {
            drop(old);
            self.observer.restored(&installed);
        });
        Ok(())
    }

    /// The stored snapshot (`RaftStateMachine::get_current_snapshot`).
    pub(crate) async fn current_snapshot(&self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let stored = self.snapshots.load().await.map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(stored.map(|(meta, data)| Snapshot { meta, snapshot: Box::new(data) }))
    }
}

/// openraft's state machine and snapshot builder traits for a backend's pair of types, both holding the
/// shared [`Machine`] in a field `machine`: every method is the machine's. One definition for both stores,
/// which differ only in where the snapshot is kept.
macro_rules! raft_state_machine {
    ($store:ty, $builder:ident) => {
        impl openraft::RaftSnapshotBuilder<$crate::TypeConfig> for $builder {
            async fn build_snapshot(
                &mut self,
            ) -> Result<openraft::Snapshot<$crate::TypeConfig>, openraft::StorageError<$crate::NodeId>> {
                self.machine.build_snapshot().await
            }
        }

        impl openraft::storage::RaftStateMachine<$crate::TypeConfig> for $store {
            type SnapshotBuilder = $builder;

            async fn applied_state(
                &mut self,
            ) -> Result<$crate::machine::AppliedState, openraft::StorageError<$crate::NodeId>> {
                self.machine.applied_state()
            }

            async fn apply<I>(
                &mut self,
                entries: I,
            ) -> Result<Vec<$crate::Response>, openraft::StorageError<$crate::NodeId>>
            where
                I: IntoIterator<Item = openraft::Entry<$crate::TypeConfig>> + openraft::OptionalSend,
                I::IntoIter: openraft::OptionalSend,
            {
                self.machine.apply(entries).await
            }

            async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
                $builder { machine: self.machine.clone() }
            }

            async fn begin_receiving_snapshot(
                &mut self,
            ) -> Result<Box<$crate::SnapshotData>, openraft::StorageError<$crate::NodeId>> {
                self.machine.receive_snapshot()
            }

            async fn install_snapshot(
                &mut self,
                meta: &$crate::machine::Meta,
                snapshot: Box<$crate::SnapshotData>,
            ) -> Result<(), openraft::StorageError<$crate::NodeId>> {
                self.machine.install_snapshot(meta, snapshot).await
            }

            async fn get_current_snapshot(
                &mut self,
            ) -> Result<Option<openraft::Snapshot<$crate::TypeConfig>>, openraft::StorageError<$crate::NodeId>> {
                self.machine.current_snapshot().await
            }
        }
    };
}
pub(crate) use raft_state_machine;

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use super::*;

    fn meta(index: Option<u64>) -> Meta {
        let last_log_id = index.map(|i| LogId::new(CommittedLeaderId::new(1, 1), i));
        Meta { last_log_id, last_membership: Default::default(), snapshot_id: String::new() }
    }

    #[test]
    fn late_build_keeps_newer_snapshot_but_install_replaces_it() {
        let (older, newer) = (meta(Some(3)), meta(Some(5)));
        assert!(!Replace::IfNotOlder.replaces(Some(&newer), &older));
        assert!(Replace::IfNotOlder.replaces(Some(&older), &newer));
        assert!(Replace::IfNotOlder.replaces(Some(&newer), &newer));
        assert!(Replace::IfNotOlder.replaces(None, &meta(None)));
        assert!(Replace::Always.replaces(Some(&newer), &older));
    }
}
