//! [`LogStore`]: the Raft log (in the [`Wal`]'s segment files), the vote (in its file), and the committed
//! log id and the last purged log id (in the store's records, see the `records` module).

use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{Entry, LogId, LogState, OptionalSend, StorageError, StorageIOError, Vote};

use crate::covered::Covered;
use crate::disk::{is_no_space, Disk};
use crate::durable::Durable;
use crate::fs::Fs;
use crate::records::RecordsFile;
use crate::runtime::blocking;
use crate::wal::Wal;
use crate::{log, ApplyObserver, NodeId, StoreError, TypeConfig};

/// The Raft log, the vote and the committed log id of one node; clones share the same files.
#[derive(Clone)]
pub struct LogStore {
    fs: Arc<dyn Fs>,
    /// The store's directory, where the vote's file is.
    dir: PathBuf,
    wal: Arc<Wal>,
    records: RecordsFile,
    /// The last purged log id, as recorded in the records (read on every log read, so kept here too).
    purged: Arc<Mutex<Option<LogId<NodeId>>>>,
    /// The last committed log id found at open, or saved since.
    committed: Arc<Mutex<Option<LogId<NodeId>>>>,
    /// Told how long each flush took.
    observer: Arc<dyn ApplyObserver>,
    /// The last committed index openraft saved, for status reports (0: none yet).
    committed_index: Arc<std::sync::atomic::AtomicU64>,
    /// This node's id, if its own appends as leader are acknowledged before their sync
    /// ([`LogStore::acknowledge_own_appends`]).
    own: Option<NodeId>,
    /// The last vote saved: whose entries an append holds is judged by it.
    vote: Arc<Mutex<Option<Vote<NodeId>>>>,
    /// How far the log is durable (the log's own, followed once rather than per commit).
    durable: Durable,
    /// How far the stored snapshot covers the log, and whether a leader's snapshot is on its way: a purge
    /// then goes no further than the stored snapshot (see the `covered` module).
    covered: Covered,
    /// The disk: appends wait while it is full or its syncs stall (see the `disk` module).
    disk: Disk,
}

impl LogStore {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        fs: Arc<dyn Fs>,
        dir: &Path,
        wal: Wal,
        records: RecordsFile,
        committed: Option<LogId<NodeId>>,
        observer: Arc<dyn ApplyObserver>,
        vote: Option<Vote<NodeId>>,
        covered: Covered,
        disk: Disk,
    ) -> Self {
        let wal = Arc::new(wal);
        let syncs = Arc::downgrade(&wal);
        disk.watch_syncs(Box::new(move || syncs.upgrade().and_then(|wal| wal.waiting_since())));
        let synced = records.clone();
        disk.after_each_look(Box::new(move || synced.sync_committed()));
        Self {
            fs,
            dir: dir.to_owned(),
            durable: wal.durable(),
            wal,
            purged: Arc::new(Mutex::new(records.get().purged)),
            records,
            committed: Arc::new(Mutex::new(committed)),
            observer,
            committed_index: Default::default(),
            own: None,
            vote: Arc::new(Mutex::new(vote)),
            covered,
            disk,
        }
    }

    /// Has this store acknowledge node `id`'s own appends as leader once they are written, and sync them in
    /// the background, in parallel with its followers' syncs; the node then applies, tells its followers
    /// and saves as committed only what its log holds durably ([`LogStore::durable`]). See the `durable`
    /// module for why that is safe. Every other append (a follower's) is synced before it is acknowledged.
    pub fn acknowledge_own_appends(mut self, id: NodeId) -> Self {
        self.own = Some(id);
        self
    }

    /// The cut of this store's damaged log, if its node has not caught up since ([`crate::cut_damaged_log`]):
    /// until it has, the node must not vote.
    pub fn recovering(&self) -> Result<Option<crate::Recovering>, StoreError> {
        crate::Recovering::read(self.fs.clone(), &self.dir)
    }

    /// How far this node's log is durable.
    pub fn durable(&self) -> Durable {
        self.durable.clone()
    }

    /// The disk under the store's directory: its room and its syncs.
    pub fn disk(&self) -> Disk {
        self.disk.clone()
    }

    /// The last committed log index this node knows of, kept current as openraft reports commits; for
    /// status pages and readiness (0 before the first).
    pub fn committed_index(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.committed_index.clone()
    }

    /// Whether the last vote saved is this node's own, as a leader's (or a candidate's) is.
    fn leads(&self) -> bool {
        let vote = *self.vote.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        matches!((self.own, vote), (Some(own), Some(vote)) if vote.leader_id().voted_for() == Some(own))
    }

    fn purged(&self) -> Option<LogId<NodeId>> {
        *self.purged.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn entries(&self, range: impl RangeBounds<u64>) -> Result<Vec<Entry<TypeConfig>>, StoreError> {
        let Some((start, end)) = log::index_range(&range) else { return Ok(Vec::new()) };
        // Purged entries may still sit in the log's first segment; they are never read back.
        let floor = self.purged().map_or(0, |purged| purged.index + 1);
        self.wal.read(start.max(floor), end)
    }

    fn log_state(&self) -> LogState<TypeConfig> {
        let purged = self.purged();
        let last = self.wal.last().filter(|last| purged.is_none_or(|purged| last.index > purged.index));
        log::log_state(purged, last)
    }

    /// Appends `entries` once the disk is writable (neither full nor stalled), and again each time a write
    /// finds no room: nothing is acknowledged that the log could not store, and openraft, which stops for
    /// good on a storage error, waits instead (see the `disk` module).
    async fn append_flushed(&self, entries: Vec<Entry<TypeConfig>>) -> Result<(), StoreError> {
        loop {
            self.disk.wait_writable().await?;
            match self.append_now(&entries) {
                // A write that found no room changed nothing; a sync that did has failed for good.
                Err(StoreError::Io(e)) if is_no_space(&e) && !self.wal.failed() => self.disk.no_space(),
                Err(e) => return Err(e),
                Ok(Appended::Acknowledged) => return Ok(()),
                Ok(Appended::OnceDurableThrough(last)) => return self.durable.reached(last).await,
            }
        }
    }

    fn append_now(&self, entries: &[Entry<TypeConfig>]) -> Result<Appended, StoreError> {
        let vote = *self.vote.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if log::own_leader_append(self.own, vote.as_ref(), entries) {
            // Written now, synced by the log's own thread: see `acknowledge_own_appends`.
            self.wal.append_unsynced(entries, &self.observer)?;
            return Ok(Appended::Acknowledged);
        }
        // A follower's. openraft's core, the only caller, waits for the sync in any case.
        if let Some(last) = entries.last().filter(|_| self.observer.sync_aside()) {
            // The node asks for it while many of its clients' calls wait on it: written now and synced by the
            // log's own thread, the worker meanwhile passing their answers on; acknowledged once durable.
            self.wal.append_unsynced(entries, &self.observer)?;
            return Ok(Appended::OnceDurableThrough(last.log_id.index));
        }
        // In place, blocking this worker thread for one write and one fdatasync: handing the sync to another
        // thread costs a thread wake-up each way per append, and where the worker has nothing else to do
        // measured 7-10 % fewer cycles/s at 64 clients and 0.3 ms more per 1-client cycle
        // (docs/perf-notes/2026-12-01-log-files-and-mimalloc.md). Tasks queued on this worker meanwhile are
        // stolen by the others, if there are others.
        let started = std::time::Instant::now();
        self.wal.append(entries)?;
        self.observer.flushed(started.elapsed());
        Ok(Appended::Acknowledged)
    }

    async fn purge_flushed(&self, upto: LogId<NodeId>) -> Result<(), StoreError> {
        // Not past the stored snapshot: after a leader's snapshot, openraft purges before it is stored.
        self.covered.reached(upto.index).await?;
        // The records first, durably: if the node stops before the segments go, the log still says where
        // it starts, and the next purge deletes what is left below it.
        let started = std::time::Instant::now();
        blocking(|| self.records.update(|records| records.purged = Some(upto)))?;
        self.observer.flushed(started.elapsed());
        *self.purged.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(upto);
        blocking(|| self.wal.purge(upto.index))
    }

    async fn save_vote_flushed(&self, vote: &Vote<NodeId>) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        blocking(|| crate::vote::write(self.fs.as_ref(), &self.dir, vote))?;
        self.observer.flushed(started.elapsed());
        *self.vote.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(*vote);
        Ok(())
    }
}

/// When an append that [`LogStore::append_now`] made may be acknowledged.
enum Appended {
    /// Now: it is durable, or it is a leader's own, acknowledged before its sync (see
    /// [`LogStore::acknowledge_own_appends`]).
    Acknowledged,
    /// Once the log is durable through this index: it is written, and the log's own thread syncs it.
    OnceDurableThrough(u64),
}

crate::log::raft_log_reader!(LogStore);

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        Ok(self.log_state())
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        Ok(self.save_vote_flushed(vote).await.map_err(|e| StorageIOError::write_vote(&e))?)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        // The vote the open read or the last one saved since.
        let vote = *self.vote.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        Ok(vote.map(|vote| log::restarted_vote(self.own, vote)))
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), StorageError<NodeId>> {
        // On a follower the commit index comes with the next entries, and openraft 0.9 saves it, reads
        // the newly committed entries back and hands them to the state machine right after it queued the
        // answer to those entries, in the same turn of its core, so the answer (which the leader waits
        // for) went out only after all of that, and after the apply
        // (docs/perf-notes/2026-12-03-fewer-syscalls-and-follower-answer.md). Yielding here
        // lets the connection's task send the answer first. A leader's commit is what its clients wait for.
        if !self.leads() {
            tokio::task::yield_now().await;
        }
        // Not flushed on its own: see "Durability" in the crate docs.
        let index = committed.map_or(0, |c| c.index);
        self.committed_index.store(index, std::sync::atomic::Ordering::Relaxed);
        if self.durable.clamp(committed) != committed {
            // Past the log's durable end: a restart may not find the entries (see the `durable` module).
            return Ok(());
        }
        *self.committed.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = committed;
        Ok(self.records.save_committed(committed).map_err(|e| StorageIOError::write(&e))?)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(*self.committed.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        log::complete_append(self.append_flushed(entries.into_iter().collect()).await, callback)
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let started = std::time::Instant::now();
        blocking(|| self.wal.truncate(log_id.index)).map_err(|e| StorageIOError::write_logs(&e))?;
        self.observer.flushed(started.elapsed());
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        Ok(self.purge_flushed(log_id).await.map_err(|e| StorageIOError::write_logs(&e))?)
    }
}
