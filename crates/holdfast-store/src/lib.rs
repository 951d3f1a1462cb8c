//! holdfast's openraft storage: the Raft log, snapshots, the vote and the store's records in files of their
//! own, for nodes; everything in memory for simulations; and the async runtime holdfast runs openraft on.
//!
//! CONTRACT (used by holdfast-server and holdfast-sim; keep these names and signatures):
//! - [`TypeConfig`], [`NodeId`], [`Response`], [`ApplyObserver`], [`open`], [`LogStore`],
//!   [`StateMachineStore`] and [`StateMachineStore::state`];
//! - [`open_memory`], [`MemDisk`], [`MemLogStore`], [`MemStateMachine`] and [`MemStateMachine::state`];
//! - [`Runtime`] (`TypeConfig`'s async runtime) and [`seed_thread_rng`].
//!
//! This crate must not depend on the server, the network or any front end.
//!
//! # Modules
//!
//! - `durable`: how far a node's log is durable ([`Durable`]), for a leader that acknowledges its own
//!   appends before their sync.
//! - `log_store`, `wal` and `state_machine`: the node's store ([`open`]): the log in `wal`'s segment
//!   files, snapshots in files of their own, the vote (`vote`), the purge point, the current snapshot's
//!   record and the commit (`records`), each in a file sealed with its length and CRC (`sealed`), every
//!   file operation through the `fs` seam, so that a test file system that loses what was not synced can
//!   stand in for the real one.
//! - `convert`: reading a directory of an older format, whose records were in sled.
//! - `refetched`: a damaged snapshot replaced by a peer's ([`replace_snapshot`]), and a node's current
//!   snapshot read by the piece for such a peer ([`SnapshotSource`]); a damaged log cut at the damage
//!   ([`cut_damaged_log`]), its node not voting until it caught up ([`Recovering`]).
//! - `snapshot`: [`SnapshotData`], a snapshot's bytes as openraft moves them, in a file or in memory,
//!   and their encoding and decoding as a stream.
//! - `memory`: the memory store ([`open_memory`]), the same behaviour and contract on a [`MemDisk`].
//! - `log` and `machine`: what the two stores share, so that they cannot drift apart: reading a
//!   range of the log and its state, when an append is acknowledged; applying an entry to the lock
//!   state (and telling the observer), tracking the last applied log id and membership, snapshot
//!   bytes to state and back, and the order of a snapshot build and install. A store adds only where
//!   its records are kept and when they are flushed.
//! - `disk`: [`Disk`], the store's disk: a reserve, and appends that wait while the disk is full or its
//!   syncs stall, rather than fail or hold the cluster up.
//! - `runtime`: [`Runtime`], openraft's tokio runtime with a random source a simulation can seed.
//! - [`codec`]: bincode decoding with bounds on how deep a value nests and how much memory its elements
//!   take, for the log's records and (in holdfast-server) the peer protocol's frames, which carry the
//!   same entries.
//!
//! # Layout (format 5)
//!
//! Under the directory given to [`open`]:
//!
//! - `raft-log/`: the Raft log, as segment files of CRC-checked records, one `openraft::Entry` (bincode 1)
//!   each; see the `wal` module for the record format and how a crash's torn tail is cut.
//! - `snapshots/`: the current snapshot's bytes (those of [`holdfast_core::LockState::snapshot`]), as one
//!   file, `<n>.snapshot`; while a snapshot is built or received from the leader, its file `<n>.new` beside
//!   it. Any other file there is left from a crash and removed when the directory is opened.
//! - `records`: the format (5), the log id of the last entry removed by a purge, and the current snapshot
//!   (its `SnapshotMeta`, its file's name, and the length and CRC-32 of its bytes, checked when it is read
//!   at open); `records.new` while they are replaced (see the `records` module).
//! - `committed`: the last committed log id, written in place.
//! - `vote`: the vote (see the `vote` module); `vote.new` while one is saved.
//! - `recovering`: only after the log was cut at damage, until the node caught up (see the `refetched`
//!   module); `recovering.new` while it is written.
//! - `reserve`: disk space held while there is room, and given back when the disk fills up (see the
//!   `disk` module).
//! - sled's files (`db`, `conf`, `blobs/`): the records of formats 1 to 4, read once when such a directory
//!   is converted, and never opened again; in a new directory, a sled database that records format 5 and
//!   nothing else, so that a build of an older format refuses the directory rather than take it for an
//!   empty one.
//!
//! Formats 1 to 4 kept the records in sled (format 1 the log too, in a `log` tree; format 3 a snapshot's
//! bytes too). [`open`] converts such a directory to format 5 (see the `convert` module), durably, before
//! anything is appended or stored; a crash part-way converts again on the next open. Every file of the
//! store's own is sealed with a length and a CRC: damage refuses the open and names the file, where sled
//! recovered what it could without a word.
//!
//! The lock state itself lives in memory ([`SharedState`]). It is not written on apply: it is
//! rebuilt on [`open`] from the snapshot, and openraft re-applies the log after the snapshot up to
//! the persisted committed log id.
//!
//! # Durability
//!
//! Each of these is on disk before the call acknowledges it:
//!
//! - appended entries: written and `fdatasync`ed before the append callback fires (and before `append`
//!   returns): on the calling thread, or, while the node's observer asks for it
//!   ([`ApplyObserver::sync_aside`]), by the log's own thread while the caller awaits it; except, in a store
//!   opened for it ([`LogStore::acknowledge_own_appends`]), a leader's own entries, which are written,
//!   acknowledged, and synced by the log's own thread; the `durable` module ([`Durable`]) says what then
//!   waits for that sync (apply, the commit index a leader sends, the saved `committed`) and why that is
//!   safe;
//! - a truncation: later segment files deleted and the directory synced, the segment holding the first
//!   removed entry cut and synced, before `truncate` returns;
//! - a purge: the purge point in `records` first (replaced durably), then the segment files it covers
//!   deleted, before `purge` returns; entries at or below `last_purged` are never read back, so a crash in between never leaves a
//!   log that seems to start at 0. While a snapshot from the leader is on its way, a purge past the stored
//!   snapshot first waits until it is stored (the `covered` module: openraft 0.9 purges before it is);
//! - a vote, in its file (written, synced, renamed into place, the directory synced), before `save_vote`
//!   returns;
//! - a snapshot, before `build_snapshot` or `install_snapshot` returns: its file written and synced
//!   (`<n>.new`), renamed to `<n>.snapshot` and the directory synced, then its name and metadata in
//!   `records`, replaced durably; only then is the file of the snapshot before it removed. A crash anywhere in between leaves
//!   the earlier snapshot whole and named, and an unnamed file that the next open removes. No purge goes
//!   past the stored snapshot (openraft's own after a build come after the snapshot is stored; after a
//!   leader's snapshot the purge waits for it), so the snapshot and the log after it always rebuild the
//!   state.
//!
//! `committed` is written in place and not synced with the write: the disk's watching thread syncs it
//! when it changed, every 250 ms, as sled's background flush did every 500 ms when sled held it. It only
//! lets a restarted node re-apply at once, and the log's open tell rot from a torn tail below it; losing
//! the latest one, or finding it damaged by a crash in the middle of its write, delays the re-apply until
//! the leader's next message and is otherwise harmless. It is never ahead of what the log holds durably
//! (see `durable`).
//!
//! # The memory store
//!
//! [`open_memory`] opens a node's storage on a [`MemDisk`], which models what a crash keeps: every
//! call makes durable exactly what the disk store flushes, and [`MemDisk::crash`] forgets the rest
//! (the latest `committed`, with no background flush to save it, and a leader's own entries not yet
//! flushed). Reopening the disk is a restart, and restores as [`open`] does; a leader's own entries
//! become durable at the next flush of any kind, or when an apply waits for them. It never blocks, spawns or reads a clock, so whole
//! clusters run on it in one thread in simulated time; flushes are reported as taking no time.
//! [`MemDisk::acking_before_flush`] is a deliberately broken disk that loses acknowledged appends in
//! a crash, to show a simulation's checkers catch it.
//!
//! # The runtime
//!
//! openraft draws election timeouts from its runtime's random source. [`Runtime`] is
//! `openraft::TokioRuntime` but for that source, which draws from a generator seeded by
//! [`seed_thread_rng`] on threads that call it (a simulation's), so a seed replays the same
//! elections; other threads draw from `rand::thread_rng()`.

pub mod codec;
mod convert;
mod covered;
mod disk;
mod durable;
mod error;
mod fs;
mod log;
mod log_store;
mod machine;
pub mod memory;
mod records;
mod refetched;
mod runtime;
mod sealed;
mod snapshot;
mod state_machine;
mod vote;
mod wal;

use std::path::Path;
use std::sync::{Arc, RwLock};

use holdfast_core::{Applied, LockState, Outcome};

use serde::{Deserialize, Serialize};

pub use disk::{Disk, DiskState};
pub use durable::Durable;
pub use error::StoreError;
pub use log_store::LogStore;
pub use memory::{open_memory, MemDisk, MemLogStore, MemStateMachine};
use records::RecordsFile;
pub use refetched::{
    cut_damaged_log, recorded_snapshot, replace_snapshot, Recovering, Replaced, SnapshotPiece, SnapshotSource,
};
pub use runtime::{seed_thread_rng, Runtime};
pub use snapshot::SnapshotData;
pub use state_machine::{SnapshotBuilder, StateMachineStore};

/// A node's id in the cluster.
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// holdfast's openraft types: log entries carry leader-stamped lock commands.
    pub TypeConfig:
        D = holdfast_core::Entry,
        R = Response,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = SnapshotData,
        AsyncRuntime = Runtime,
);

/// What applying one log entry answers its proposer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// The entry's time (leader time, ms since the Unix epoch).
    pub at_ms: u64,
    /// The lock state's answer; `None` for Raft's own blank and membership entries.
    pub outcome: Option<Outcome>,
}

/// The lock state, shared between the state machine (which writes it on apply) and readers.
pub type SharedState = Arc<RwLock<LockState>>;

/// Told of every change to the lock state, on every node: of each applied command while the state's write
/// lock is held (so it must not take that lock itself), and of a state replaced whole just after the
/// replacement, without that lock.
pub trait ApplyObserver: Send + Sync + 'static {
    /// Command `cmd` of entry `index` was applied to `state` and did `applied`: once per entry, or once
    /// per command of a [`Command::Batch`](holdfast_core::Command::Batch) entry, in order.
    fn applied(&self, state: &LockState, index: u64, cmd: &holdfast_core::Command, applied: &Applied);
    /// `state` was replaced whole, from a snapshot (installed from the leader, or restored at start). Called
    /// after the replacement and before anything more is applied, with a copy of the new state and
    /// without the state's lock: readers may already see the new state.
    fn restored(&self, state: &LockState);
    /// A sync that a log append, truncation or purge, a vote or a snapshot waited for took `took` (the
    /// writes and syncs of the files it changed).
    /// Called without the state's lock held.
    fn flushed(&self, _took: std::time::Duration) {}
    /// The node's current snapshot is now the one of the log up to `index`, `bytes` long: built here,
    /// installed from the leader, or found at start. Called without the state's lock held.
    fn snapshot_stored(&self, _index: u64, _bytes: u64) {}
    /// Whether the node's append as a follower is synced by the log's own thread, acknowledged once
    /// durable, rather than in place on the calling worker thread. A node says yes while many clients'
    /// calls wait on it, so that its worker passes their answers on during the sync; in place (the
    /// default) costs no thread wake-ups. Asked once per append.
    fn sync_aside(&self) -> bool {
        false
    }
}

/// An observer that ignores every change: for tests and tools that only need the storage.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl ApplyObserver for NoObserver {
    fn applied(&self, _state: &LockState, _index: u64, _cmd: &holdfast_core::Command, _applied: &Applied) {}

    fn restored(&self, _state: &LockState) {}
}

/// The version of the layout described in the crate docs. A directory of formats 1 to 4 (records in sled)
/// is converted when opened (see the `convert` module); any other is refused.
const FORMAT: u32 = 5;

/// The decoders of what the store reads back from its files, as the store calls them, for its fuzz tests
/// (`tests/fuzz_records.rs`): not part of the store's API.
#[doc(hidden)]
pub mod decoders {
    use holdfast_core::LockState;
    use openraft::Entry;

    use crate::{StoreError, TypeConfig};

    /// The log record at the start of `bytes` (see the `wal` module): its entry and its length, `None` if
    /// it is not whole and intact (a torn write), an error if it is intact but does not decode.
    pub fn log_record(bytes: &[u8]) -> Result<Option<(Entry<TypeConfig>, usize)>, StoreError> {
        crate::wal::decode(bytes, 0, 0)
    }

    /// The lock state in a snapshot's bytes, as an install of the leader's snapshot reads them.
    pub fn snapshot(bytes: &[u8]) -> Result<LockState, StoreError> {
        crate::snapshot::decode(bytes, bytes.len() as u64).map(|(state, _)| state)
    }
}

/// The store on a test file system, for tests of crash safety (this crate's and the simulation's): not part
/// of the store's API.
#[doc(hidden)]
pub mod testing {
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    pub use crate::fs::CrashFs;
    use crate::{ApplyObserver, Disk, LogStore, StateMachineStore, StoreError};

    /// Opens (or creates) a store under `dir` of `fs`, as [`crate::open`] does on the real file system, but
    /// with log segments of 16 KiB (so that a short run fills several), and a leader's own entries synced by
    /// a task of the calling runtime, not a thread (so that a single-threaded runtime schedules it, as a
    /// simulation needs); its disk is never looked at (no reserve, no stall watch), and a directory without
    /// records is a new one. Call it within a tokio runtime.
    pub fn open_on_crash_fs(
        fs: Arc<CrashFs>,
        dir: &Path,
        observer: Arc<dyn ApplyObserver>,
    ) -> Result<(LogStore, StateMachineStore), StoreError> {
        open_on_crash_fs_flushing(fs, dir, observer, Duration::ZERO)
    }

    /// [`open_on_crash_fs`] with each sync of the log's task taking `flush` of the runtime's time (a
    /// simulation's), as a disk's flush does: what the task syncs stays at risk from a crash meanwhile.
    /// The syncs that block their caller (a follower's append in place) still take none.
    pub fn open_on_crash_fs_flushing(
        fs: Arc<CrashFs>,
        dir: &Path,
        observer: Arc<dyn ApplyObserver>,
        flush: Duration,
    ) -> Result<(LogStore, StateMachineStore), StoreError> {
        let new = |_: &Path| {
            let records = crate::records::Records { format: crate::FORMAT, ..Default::default() };
            Ok(crate::convert::Converted { records, committed: None })
        };
        crate::open_on(fs, 16 * 1024, Some(flush), dir, observer, Disk::unwatched(dir, 0, None), new)
    }
}

/// Opens (or creates) the node's storage under `dir`, with the default [`Options`].
///
/// If a snapshot is stored, the lock state, last applied log id and membership are restored from it
/// (and `observer` is told), so that openraft re-applies only the log after it.
pub fn open(dir: &Path, observer: Arc<dyn ApplyObserver>) -> Result<(LogStore, StateMachineStore), StoreError> {
    open_with(dir, observer, Options::default())
}

/// sled's page cache, while a directory of formats 1 to 4 is read to be converted (see the `convert` module),
/// when nobody says otherwise: sled's own default, 1 GiB. The cache grows only as the data does; a smaller
/// bound is for nodes with little memory.
pub const CACHE_BYTES_DEFAULT: u64 = 1024 * 1024 * 1024;

/// The disk space kept in reserve when nobody says otherwise: room for the store's records, the vote and a
/// snapshot of some hundred thousand locks once the disk is full (see the `disk` module).
pub const DISK_RESERVE_DEFAULT: u64 = 64 * 1024 * 1024;

/// How long the log's syncs may keep a write waiting before the disk counts as stalled, when nobody says
/// otherwise: four times the default election timeout, past any sync a working disk takes under load
/// (etcd warns of a slow fdatasync from 1 s on), and short enough that a leader stuck on its disk hands
/// over within about a second and a half.
pub const DISK_STALL_DEFAULT: std::time::Duration = std::time::Duration::from_secs(1);

/// How [`open_with`] opens a store.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// The most sled's page cache holds, in bytes, while a directory of formats 1 to 4 is converted.
    pub cache_bytes: u64,
    /// Bytes of disk kept in reserve while there is room, and given back when it runs out ([`Disk`]).
    pub disk_reserve: u64,
    /// A wait for the log's syncs this long or longer is a stall ([`Disk`]); `None`: not watched.
    pub disk_stall: Option<std::time::Duration>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cache_bytes: CACHE_BYTES_DEFAULT,
            disk_reserve: DISK_RESERVE_DEFAULT,
            disk_stall: Some(DISK_STALL_DEFAULT),
        }
    }
}

/// [`open`], with `options`.
pub fn open_with(
    dir: &Path,
    observer: Arc<dyn ApplyObserver>,
    options: Options,
) -> Result<(LogStore, StateMachineStore), StoreError> {
    fs::create_dirs(&fs::RealFs, dir).map_err(StoreError::CreateDir)?;
    // Before sled (which a first open still writes): a disk already full gives the reserve back.
    let disk = Disk::watch(dir, options.disk_reserve, options.disk_stall)?;
    let older = |dir: &Path| convert::from_sled(dir, options.cache_bytes);
    open_on(Arc::new(fs::RealFs), wal::SEGMENT_BYTES, None, dir, observer, disk, older)
}

/// [`open_with`] on the file system `fs`, with log segments of `segment_bytes` and `disk` watching it; `older`
/// reads a directory that has no `records` (see the `convert` module: a new directory, or one of an older
/// format). `sync_in_a_task`: a leader's own entries (and a follower's synced aside) are synced by a tokio
/// task, not a thread, each sync taking that long of the runtime's time (see `Wal::syncing_in_a_task`).
pub(crate) fn open_on(
    fs: Arc<dyn fs::Fs>,
    segment_bytes: u64,
    sync_in_a_task: Option<std::time::Duration>,
    dir: &Path,
    observer: Arc<dyn ApplyObserver>,
    disk: Disk,
    older: impl FnOnce(&Path) -> Result<convert::Converted, StoreError>,
) -> Result<(LogStore, StateMachineStore), StoreError> {
    fs::create_dirs(fs.as_ref(), dir).map_err(StoreError::CreateDir)?;
    let (records, committed) = match RecordsFile::read(fs.as_ref(), dir)? {
        Some(records) if records.format == FORMAT => (records, RecordsFile::read_committed(fs.as_ref(), dir)?),
        Some(records) => return Err(StoreError::Format { found: records.format, expected: FORMAT }),
        None => {
            // No records, no sled, and yet a log or a vote: the file that says where the log starts and which
            // snapshot is current is gone, and guessing could serve a state that lost acknowledged writes.
            let sled = fs.open(&dir.join(convert::SLED_FILE), fs::Open::Existing).is_ok();
            let written = [wal::DIR, vote::FILE].into_iter().find(|name| {
                let path = dir.join(name);
                fs.is_dir(&path) || fs.open(&path, fs::Open::Existing).is_ok()
            });
            if let (false, Some(written)) = (sled, written) {
                return Err(StoreError::Records(format!(
                    "{} is missing, but {written} is there: the directory lost the file that says where its log \
                     starts and which snapshot is current",
                    dir.join(records::FILE).display()
                )));
            }
            let converted = older(dir)?;
            RecordsFile::write(fs.as_ref(), dir, &converted.records)?;
            (converted.records, converted.committed)
        }
    };
    let records = RecordsFile::new(fs.clone(), dir, records, committed)?;
    // The last commit recorded here: entries through it were synced before it was (see `save_committed`).
    let committed_index = committed.map_or(0, |committed| committed.index);
    let purged = records.get().purged;
    let wal = wal::Wal::open_on(fs.clone(), segment_bytes, &dir.join(wal::DIR), purged, committed_index)?;
    let wal = match sync_in_a_task {
        Some(flush) => wal.syncing_in_a_task(flush),
        None => wal,
    };
    let vote = vote::read(fs.as_ref(), dir)?;
    let (covered_sender, covered) = covered::covered();
    let log_store =
        LogStore::new(fs.clone(), dir, wal, records.clone(), committed, observer.clone(), vote, covered, disk);
    let state_machine = StateMachineStore::open(
        fs,
        records,
        &dir.join(state_machine::DIR),
        observer,
        log_store.durable(),
        covered_sender,
    )?;
    Ok((log_store, state_machine))
}
