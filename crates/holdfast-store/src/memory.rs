//! The memory store, for simulations: [`MemLogStore`] and [`MemStateMachine`] keep the disk store's
//! behaviour and contract (see "Durability" in the crate docs) on a [`MemDisk`] in memory.
//!
//! A simulation runs whole clusters in one thread, in simulated time, so nothing here blocks, spawns,
//! or reads a clock: every call does its work at once, and reports its flushes as taking no time.
//!
//! A [`MemDisk`] models what a crash keeps. Every write goes first to what reads see, and is durable
//! only once flushed; each call flushes exactly where the disk store flushes, so a correct disk that
//! crashes loses only the `committed` record written since the last flush. [`MemDisk::crash`] forgets
//! what was not yet durable; opening the disk again is the node's restart.

use std::collections::BTreeMap;
use std::ops::RangeBounds;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{Entry, LogId, LogState, OptionalSend, StorageError, StorageIOError, Vote};

use crate::covered::Covered;
use crate::durable::{Durable, Synced, SyncedSender};
use crate::machine::{Machine, Meta, Replace, SnapshotStore};
use crate::snapshot::{self, SnapshotData, Summary};
use crate::{log, ApplyObserver, NodeId, SharedState, StoreError, TypeConfig};

/// What survives a simulated crash of a node: what its acknowledged calls made durable. Clone shares it.
#[derive(Clone, Default)]
pub struct MemDisk {
    disk: Arc<Mutex<Disk>>,
}

#[derive(Default)]
struct Disk {
    /// What reads see: every write, flushed or not.
    current: Records,
    /// What a crash keeps: the writes up to the last flush.
    durable: Records,
    /// The writes since the last flush, oldest first: `current` is `durable` with these applied.
    unflushed: Vec<Write>,
    /// The last snapshot sequence number handed out. Never forgotten, not even by a crash (the disk
    /// store numbers on from its snapshot files; see [`crate::machine`]'s `next_seq`).
    snapshot_seq: u64,
    /// Moved on by every open and every crash: a store opened before the latest belongs to a node
    /// that is gone, and is refused.
    epoch: u64,
    /// The broken variant: see [`MemDisk::acking_before_flush`].
    acks_before_flush: bool,
    /// How long installing a snapshot from the leader takes: see [`MemDisk::slow_snapshot_installs`].
    install_time: Duration,
}

/// What the disk store keeps in its trees.
#[derive(Clone, Default)]
struct Records {
    /// The Raft log, by index.
    log: BTreeMap<u64, Entry<TypeConfig>>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
    /// The log id of the last entry removed by a purge.
    last_purged: Option<LogId<NodeId>>,
    /// The current snapshot: its metadata and data (shared, not copied, between `current`,
    /// `durable` and the write that made it).
    snapshot: Option<Arc<(Meta, Vec<u8>)>>,
}

/// One write to a [`Disk`].
enum Write {
    /// Entries, added to the log or replacing those at their indexes.
    Append(Vec<Entry<TypeConfig>>),
    /// A leader's own entries, acknowledged before they are durable (see
    /// [`MemLogStore::acknowledge_own_appends`]): added as `Append` adds them.
    LeaderAppend(Vec<Entry<TypeConfig>>),
    /// Removes the entries from index `since` on.
    Truncate {
        since: u64,
    },
    /// Records `upto` as the last purged log id and removes the entries up to it.
    Purge {
        upto: LogId<NodeId>,
    },
    Vote(Vote<NodeId>),
    Committed(Option<LogId<NodeId>>),
    Snapshot(Arc<(Meta, Vec<u8>)>),
}

impl Records {
    fn apply(&mut self, write: &Write) {
        match write {
            Write::Append(entries) | Write::LeaderAppend(entries) => {
                self.log.extend(entries.iter().map(|entry| (entry.log_id.index, entry.clone())));
            }
            Write::Truncate { since } => drop(self.log.split_off(since)),
            Write::Purge { upto } => {
                self.last_purged = Some(*upto);
                self.log = match upto.index.checked_add(1) {
                    Some(after) => self.log.split_off(&after),
                    None => BTreeMap::new(),
                };
            }
            Write::Vote(vote) => self.vote = Some(*vote),
            Write::Committed(committed) => self.committed = *committed,
            Write::Snapshot(snapshot) => self.snapshot = Some(snapshot.clone()),
        }
    }
}

impl Disk {
    /// Writes `write` where reads see it; durable at the next flush.
    fn write(&mut self, write: Write) {
        self.current.apply(&write);
        self.unflushed.push(write);
    }

    /// Makes every write so far durable.
    fn flush(&mut self) {
        for write in self.unflushed.drain(..) {
            self.durable.apply(&write);
        }
    }

    /// Appends `entries` before an acknowledgement: durable now, except on a broken disk.
    fn append(&mut self, entries: Vec<Entry<TypeConfig>>) {
        if self.acks_before_flush {
            // The flush comes first and covers only the writes before this append, which stays
            // unflushed until the next one.
            self.flush();
            self.write(Write::Append(entries));
        } else {
            self.write(Write::Append(entries));
            self.flush();
        }
    }
}

impl MemDisk {
    /// An empty disk.
    pub fn new() -> Self {
        Self::default()
    }

    /// A deliberately broken disk for the simulation's checker tests: appends are acknowledged before
    /// they are durable (they become durable only at the next flush: the next append or vote, or a
    /// truncate, purge or snapshot), so a crash loses acknowledged entries. It reports them durable too
    /// ([`MemLogStore::durable`]), so that nothing waits for a flush that never comes.
    pub fn acking_before_flush() -> Self {
        let disk = Disk { acks_before_flush: true, ..Disk::default() };
        Self { disk: Arc::new(Mutex::new(disk)) }
    }

    /// Makes every install of a snapshot the leader sent take `time` (simulated) from now on, crashes
    /// included, before the state is replaced: as decoding and storing a large state does (about a second
    /// at a million locks). The node answers the leader's last chunk only once it is done.
    pub fn slow_snapshot_installs(&self, time: Duration) {
        self.lock().install_time = time;
    }

    /// A crash: forgets everything not yet durable (in a correct disk, only the `committed` record
    /// written since the last flush, as the disk store's `committed` file, which is never synced on its own). The stores opened before
    /// it are refused from now on, as a crashed node's are gone; open the disk again to restart.
    pub fn crash(&self) {
        let mut disk = self.lock();
        let acks_before_flush = disk.acks_before_flush;
        assert!(
            acks_before_flush
                || disk.unflushed.iter().all(|write| matches!(write, Write::Committed(_) | Write::LeaderAppend(_))),
            "a correct memory disk flushes every write but `committed` and a leader's own entries before it \
             acknowledges it"
        );
        disk.unflushed.clear();
        disk.current = disk.durable.clone();
        disk.epoch += 1;
    }

    fn lock(&self) -> MutexGuard<'_, Disk> {
        // Only this module's own code runs under the lock (never an observer), so a poisoned lock is
        // a bug in it that has already panicked once.
        self.disk.lock().expect("no memory disk call panicked")
    }
}

/// One open of a [`MemDisk`]: shared by the log store and the state machine opened together.
#[derive(Clone)]
struct Opened {
    disk: MemDisk,
    /// The disk's epoch at the open.
    epoch: u64,
    /// Told of each flush, as taking no time.
    observer: Arc<dyn ApplyObserver>,
    /// How far the log is durable, published after every flush.
    synced: Arc<SyncedSender>,
}

impl Opened {
    /// The disk, locked, if no crash or later open has fenced this open off.
    fn lock(&self) -> Result<MutexGuard<'_, Disk>, StoreError> {
        let disk = self.disk.lock();
        if disk.epoch != self.epoch {
            return Err(StoreError::Stale);
        }
        Ok(disk)
    }

    fn read<T>(&self, read: impl FnOnce(&Records) -> T) -> Result<T, StoreError> {
        Ok(read(&self.lock()?.current))
    }

    /// Writes `write` without a flush: it rides on the next one.
    fn write(&self, write: Write) -> Result<(), StoreError> {
        self.lock()?.write(write);
        Ok(())
    }

    /// Runs `update` on the disk, then reports the flush it made to the observer (with the disk's
    /// lock released: the observer is not this module's code).
    fn flushing(&self, update: impl FnOnce(&mut Disk)) -> Result<(), StoreError> {
        {
            let mut disk = self.lock()?;
            update(&mut disk);
            self.publish(&disk);
        }
        self.observer.flushed(Duration::ZERO);
        Ok(())
    }

    /// Publishes how far `disk`'s log is durable: a flush makes all of it so, but a leader's own entries
    /// written since.
    fn publish(&self, disk: &Disk) {
        // The broken disk takes what it acknowledged for durable, here too.
        let durable = if disk.acks_before_flush { &disk.current } else { &disk.durable };
        // Truncations and purges are always flushed, so what reads see only ever extends this.
        let last = log::log_state(durable.last_purged, durable.log.last_key_value().map(|(_, e)| e.log_id)).last_log_id;
        let pending = disk.unflushed.iter().any(|write| matches!(write, Write::LeaderAppend(_)));
        self.synced.send_if_modified(|synced| {
            let changed = synced.last != last || synced.pending != pending;
            synced.last = last;
            synced.pending = pending;
            changed
        });
    }

    /// Flushes everything written: what [`Durable`] asks for when an apply waits for a leader's own
    /// entries. A store fenced off by a crash or a later open fails its waiters.
    fn sync_now(&self) {
        if let Err(e) = self.flushing(Disk::flush) {
            self.synced.send_modify(|synced| synced.failed = Some(e.to_string().into()));
        }
    }

    /// Writes `write` and flushes.
    fn write_flushed(&self, write: Write) -> Result<(), StoreError> {
        self.flushing(|disk| {
            disk.write(write);
            disk.flush();
        })
    }
}

/// Opens (or creates) a node's storage on `disk`, as [`crate::open`] does on a directory: if a snapshot
/// is stored, the lock state, last applied log id and membership are restored from it (and `observer`
/// is told), so that openraft re-applies only the log after it.
///
/// Opening again, as a restart does, fences off the stores of the earlier open: their calls fail
/// with [`StoreError::Stale`].
pub fn open_memory(disk: &MemDisk, observer: Arc<dyn ApplyObserver>) -> (MemLogStore, MemStateMachine) {
    let (epoch, stored) = {
        let mut locked = disk.lock();
        locked.epoch += 1;
        (locked.epoch, locked.current.snapshot.as_deref().cloned())
    };
    let synced = Arc::new(SyncedSender::new(Synced::default()));
    let opened = Opened { disk: disk.clone(), epoch, observer: observer.clone(), synced };
    // A restart without a crash finds what the node wrote (as the kernel keeps it), and syncs it first,
    // as the disk store's open syncs its log files (unreported, as there).
    {
        let mut locked = disk.lock();
        locked.flush();
        opened.publish(&locked);
    }
    let durable = {
        let opened = opened.clone();
        Durable::new(opened.synced.subscribe(), Some(Arc::new(move || opened.sync_now())))
    };
    let restored = stored.map(|(meta, data)| {
        let (state, summary) = snapshot::decode(data.as_slice(), data.len() as u64)
            .expect("a stored snapshot restores: its bytes are a state that passed its invariant checks");
        (meta, state, summary.len)
    });
    let (covered_sender, covered) = crate::covered::covered();
    let machine =
        Machine::open(MemSnapshots { opened: opened.clone() }, restored, observer, durable.clone(), covered_sender)
            .expect("opening a machine on a restored state fails only on a poisoned lock");
    let log_store = MemLogStore { opened, committed_index: Default::default(), own: None, durable, covered };
    (log_store, MemStateMachine { machine: Arc::new(machine) })
}

/// The Raft log, the vote and the committed log id of one node, on a [`MemDisk`]; clones share them.
#[derive(Clone)]
pub struct MemLogStore {
    opened: Opened,
    /// The last committed index openraft saved, for status reports (0: none yet).
    committed_index: Arc<AtomicU64>,
    /// This node's id, if its own appends as leader are acknowledged before they are durable.
    own: Option<NodeId>,
    /// How far the log is durable: the same as the state machine's.
    durable: Durable,
    /// How far the stored snapshot covers the log, and whether a leader's snapshot is on its way: a purge
    /// then goes no further than the stored snapshot (see the `covered` module).
    covered: Covered,
}

impl MemLogStore {
    /// Acknowledges node `id`'s own appends as leader before they are durable, as
    /// [`crate::LogStore::acknowledge_own_appends`] does: they become durable at the next flush of any
    /// kind, or when an apply waits for them, and a crash before that loses them.
    pub fn acknowledge_own_appends(mut self, id: NodeId) -> Self {
        self.own = Some(id);
        self
    }

    /// How far this node's log is durable.
    pub fn durable(&self) -> Durable {
        self.durable.clone()
    }

    /// The last committed log index this node knows of, kept current as openraft reports commits; for
    /// status pages and readiness (0 before the first). As [`crate::LogStore::committed_index`].
    pub fn committed_index(&self) -> Arc<AtomicU64> {
        self.committed_index.clone()
    }

    fn entries(&self, range: impl RangeBounds<u64>) -> Result<Vec<Entry<TypeConfig>>, StoreError> {
        let Some((start, end)) = log::index_range(&range) else {
            return Ok(Vec::new());
        };
        self.opened.read(|records| {
            let entries = match end {
                Some(end) => records.log.range(start..end),
                None => records.log.range(start..),
            };
            entries.map(|(_, entry)| entry.clone()).collect()
        })
    }
}

crate::log::raft_log_reader!(MemLogStore);

impl RaftLogStorage<TypeConfig> for MemLogStore {
    type LogReader = MemLogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let state = self.opened.read(|records| {
            let last_entry = records.log.last_key_value().map(|(_, entry)| entry.log_id);
            log::log_state(records.last_purged, last_entry)
        });
        Ok(state.map_err(|e| StorageIOError::read_logs(&e))?)
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        Ok(self.opened.write_flushed(Write::Vote(*vote)).map_err(|e| StorageIOError::write_vote(&e))?)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        let vote = self.opened.read(|records| records.vote).map_err(|e| StorageIOError::read_vote(&e))?;
        Ok(vote.map(|vote| log::restarted_vote(self.own, vote)))
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), StorageError<NodeId>> {
        // Not flushed on its own, as in the disk store: see "Durability" in the crate docs.
        self.committed_index.store(committed.map_or(0, |c| c.index), Ordering::Relaxed);
        if self.durable.clamp(committed) != committed {
            // Past the log's durable end, as in the disk store.
            return Ok(());
        }
        Ok(self.opened.write(Write::Committed(committed)).map_err(|e| StorageIOError::write(&e))?)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(self.opened.read(|records| records.committed).map_err(|e| StorageIOError::read(&e))?)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<_> = entries.into_iter().collect();
        let (vote, broken) = {
            let disk = self.opened.lock().map_err(|e| StorageIOError::write_logs(&e))?;
            (disk.current.vote, disk.acks_before_flush)
        };
        // The broken disk acknowledges every append before its flush, and nothing waits for one.
        if !broken && log::own_leader_append(self.own, vote.as_ref(), &entries) {
            let written = self.opened.lock().map(|mut disk| {
                disk.write(Write::LeaderAppend(entries));
                self.opened.publish(&disk);
            });
            return log::complete_append(written, callback);
        }
        log::complete_append(self.opened.flushing(|disk| disk.append(entries)), callback)
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let truncate = Write::Truncate { since: log_id.index };
        Ok(self.opened.write_flushed(truncate).map_err(|e| StorageIOError::write_logs(&e))?)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.covered.reached(log_id.index).await.map_err(|e| StorageIOError::write_logs(&e))?;
        let purge = Write::Purge { upto: log_id };
        Ok(self.opened.write_flushed(purge).map_err(|e| StorageIOError::write_logs(&e))?)
    }
}

/// The lock state machine of one node, its snapshot on a [`MemDisk`]: applies committed entries,
/// builds and installs snapshots, as [`crate::StateMachineStore`] does.
pub struct MemStateMachine {
    machine: Arc<Machine<MemSnapshots>>,
}

/// Builds snapshots of a [`MemStateMachine`]; clones share the machine.
#[derive(Clone)]
pub struct MemSnapshotBuilder {
    machine: Arc<Machine<MemSnapshots>>,
}

/// The current snapshot, on the disk.
struct MemSnapshots {
    opened: Opened,
}

impl MemStateMachine {
    /// The lock state, for readers; the state machine writes it on apply.
    pub fn state(&self) -> SharedState {
        self.machine.state()
    }
}

impl SnapshotStore for MemSnapshots {
    fn next_seq(&self) -> Result<u64, StoreError> {
        let mut disk = self.opened.lock()?;
        disk.snapshot_seq += 1;
        Ok(disk.snapshot_seq)
    }

    fn create(&self) -> Result<SnapshotData, StoreError> {
        Ok(SnapshotData::in_memory(Vec::new()))
    }

    async fn load(&self) -> Result<Option<(Meta, SnapshotData)>, StoreError> {
        let stored = self.opened.read(|records| records.snapshot.as_deref().cloned())?;
        Ok(stored.map(|(meta, data)| (meta, SnapshotData::in_memory(data))))
    }

    async fn save(
        &self,
        meta: &Meta,
        data: SnapshotData,
        _summary: Summary,
        replace: Replace,
    ) -> Result<(bool, SnapshotData), StoreError> {
        let data = data.into_bytes().await?;
        let install_time = self.opened.lock()?.install_time;
        if replace == Replace::Always && !install_time.is_zero() {
            tokio::time::sleep(install_time).await;
        }
        // The check and the write happen under one hold of the disk's lock, so saves are serialised.
        let mut disk = self.opened.lock()?;
        let stored = disk.current.snapshot.as_deref().map(|(meta, _)| meta);
        if !replace.replaces(stored, meta) {
            return Ok((false, SnapshotData::in_memory(data)));
        }
        disk.write(Write::Snapshot(Arc::new((meta.clone(), data.clone()))));
        disk.flush();
        self.opened.publish(&disk);
        drop(disk);
        self.opened.observer.flushed(Duration::ZERO);
        Ok((true, SnapshotData::in_memory(data)))
    }
}

crate::machine::raft_state_machine!(MemStateMachine, MemSnapshotBuilder);
