//! holdfast's openraft storage: the Raft log, the vote, and the lock state machine, on sled for nodes
//! and in memory for simulations; and the async runtime holdfast runs openraft on.
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
//! - `log_store` and `state_machine`: the sled store ([`open`]).
//! - `memory`: the memory store ([`open_memory`]), the same behaviour and contract on a [`MemDisk`].
//! - `log` and `machine`: what the two stores share, so that they cannot drift apart: reading a
//!   range of the log and its state, when an append is acknowledged; applying an entry to the lock
//!   state (and telling the observer), tracking the last applied log id and membership, snapshot
//!   bytes to state and back, and the order of a snapshot build and install. A store adds only where
//!   its records are kept and when they are flushed.
//! - `runtime`: [`Runtime`], openraft's tokio runtime with a random source a simulation can seed.
//!
//! # Layout
//!
//! One `sled::Db` per node, at the directory given to [`open`], with three trees. Every value is
//! bincode 1.
//!
//! - `log`: the Raft log. Key: the entry's index as a big-endian `u64` (so sled's key order is log
//!   order); value: the whole `openraft::Entry<TypeConfig>`.
//! - `meta`: `format` (this layout's version, checked on open), `vote`, `committed` and
//!   `last_purged` (the log id of the last entry removed by a purge).
//! - `snapshot`: the current snapshot, as `meta` (its `SnapshotMeta`) and `data` (the bytes of
//!   [`holdfast_core::LockState::snapshot`]), written together in one batch.
//!
//! The lock state itself lives in memory ([`SharedState`]). It is not written on apply: it is
//! rebuilt on [`open`] from the snapshot, and openraft re-applies the log after the snapshot up to
//! the persisted committed log id.
//!
//! # Durability
//!
//! Each of these is on disk (sled flushed and fsynced) before the call acknowledges it:
//!
//! - a vote, before `save_vote` returns;
//! - appended entries, before the append callback fires (and before `append` returns);
//! - a truncation or a purge, before `truncate`/`purge` returns; a purge records `last_purged`
//!   before it deletes, so a crash in between never leaves a log that seems to start at 0;
//! - a snapshot, before `build_snapshot` or `install_snapshot` returns. openraft purges only logs a
//!   snapshot covers, so the snapshot and the log after it always rebuild the state.
//!
//! `committed` is written but not flushed on its own (it rides on the next flush, and sled's
//! background flush runs every 500 ms): it only lets a restarted node re-apply at once; losing the
//! latest one delays that until the leader's next message and is otherwise harmless.
//!
//! Flushes run sled's blocking flush on tokio's blocking pool rather than sled's `flush_async`,
//! which hangs with eight or more flushes in flight in one process (see `flush`).
//!
//! # The memory store
//!
//! [`open_memory`] opens a node's storage on a [`MemDisk`], which models what a crash keeps: every
//! call makes durable exactly what the sled store flushes, and [`MemDisk::crash`] forgets the rest
//! (only the latest `committed`, with no background flush to save it). Reopening the disk is a
//! restart, and restores as [`open`] does. It never blocks, spawns or reads a clock, so whole
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

mod error;
mod log;
mod log_store;
mod machine;
pub mod memory;
mod runtime;
mod state_machine;

use std::path::Path;
use std::sync::{Arc, RwLock};

use holdfast_core::{Applied, LockState, Outcome};
use serde::{Deserialize, Serialize};

pub use error::StoreError;
pub use log_store::LogStore;
pub use memory::{open_memory, MemDisk, MemLogStore, MemStateMachine};
pub use runtime::{seed_thread_rng, Runtime};
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
        SnapshotData = std::io::Cursor<Vec<u8>>,
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

/// Told of every change to the lock state, on every node, while the state's write lock is held: it must
/// not take that lock itself.
pub trait ApplyObserver: Send + Sync + 'static {
    /// Command `cmd` of entry `index` was applied to `state` and did `applied`: once per entry, or once
    /// per command of a [`Command::Batch`](holdfast_core::Command::Batch) entry, in order.
    fn applied(&self, state: &LockState, index: u64, cmd: &holdfast_core::Command, applied: &Applied);
    /// `state` was replaced whole, from a snapshot (installed from the leader, or restored at start).
    fn restored(&self, state: &LockState);
    /// A flush (sled's write and fsync) that a log append, a vote or a snapshot waited for took `took`.
    /// Called without the state's lock held.
    fn flushed(&self, _took: std::time::Duration) {}
}

/// An observer that ignores every change: for tests and tools that only need the storage.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl ApplyObserver for NoObserver {
    fn applied(&self, _state: &LockState, _index: u64, _cmd: &holdfast_core::Command, _applied: &Applied) {}

    fn restored(&self, _state: &LockState) {}
}

/// The version of the layout described in the crate docs; a directory with another one is refused.
const FORMAT: u32 = 1;

/// Tree names and the keys of the fixed records in them.
mod keys {
    pub const LOG_TREE: &str = "log";
    pub const META_TREE: &str = "meta";
    pub const SNAPSHOT_TREE: &str = "snapshot";

    pub const FORMAT: &str = "format";
    pub const VOTE: &str = "vote";
    pub const COMMITTED: &str = "committed";
    pub const LAST_PURGED: &str = "last_purged";

    pub const SNAPSHOT_META: &str = "meta";
    pub const SNAPSHOT_DATA: &str = "data";
}

/// Opens (or creates) the node's storage under `dir`.
///
/// If a snapshot is stored, the lock state, last applied log id and membership are restored from it
/// (and `observer` is told), so that openraft re-applies only the log after it.
pub fn open(dir: &Path, observer: Arc<dyn ApplyObserver>) -> Result<(LogStore, StateMachineStore), StoreError> {
    open_with_cache(dir, observer, CACHE_BYTES_DEFAULT)
}

/// sled's page cache when nobody says otherwise: sled's own default, 1 GiB. The cache grows only as the
/// data does (100,000 held locks left nodes at about 200 MiB resident with 1 GiB or 64 MiB alike); a
/// smaller bound is for nodes with little memory.
pub const CACHE_BYTES_DEFAULT: u64 = 1024 * 1024 * 1024;

/// [`open`], with sled's page cache bounded to `cache_bytes`.
pub fn open_with_cache(
    dir: &Path,
    observer: Arc<dyn ApplyObserver>,
    cache_bytes: u64,
) -> Result<(LogStore, StateMachineStore), StoreError> {
    std::fs::create_dir_all(dir).map_err(StoreError::CreateDir)?;
    let db = sled::Config::new().path(dir).cache_capacity(cache_bytes).open()?;
    let meta = db.open_tree(keys::META_TREE)?;
    match meta.get(keys::FORMAT)? {
        Some(bytes) => {
            let found: u32 = bincode::deserialize(&bytes)?;
            if found != FORMAT {
                return Err(StoreError::Format { found, expected: FORMAT });
            }
        }
        // A new directory. Not flushed here: if it is lost, the next open writes it again.
        None => {
            meta.insert(keys::FORMAT, bincode::serialize(&FORMAT)?)?;
        }
    }
    let log = db.open_tree(keys::LOG_TREE)?;
    let snapshots = db.open_tree(keys::SNAPSHOT_TREE)?;
    let log_store = LogStore::new(db.clone(), log, meta, observer.clone());
    let state_machine = StateMachineStore::open(db, snapshots, observer)?;
    Ok((log_store, state_machine))
}

/// Makes everything written to `db` so far durable: sled's blocking flush (write and fsync), run on
/// tokio's blocking pool so the calling task only awaits.
///
/// Not sled's `flush_async`: in sled 0.34 (0.34.7 included, the last release) it never completes
/// once about eight flushes are in flight in one process, because its IO thread pool ends up waiting
/// on itself (spacejam/sled#1241, #1308, fixed only on sled's unreleased main branch). A process
/// that runs several nodes, as the simulations and in-process cluster tests do, gets there easily.
async fn flush(db: &sled::Db, observer: &dyn ApplyObserver) -> Result<(), StoreError> {
    let db = db.clone();
    let started = std::time::Instant::now();
    tokio::task::spawn_blocking(move || db.flush()).await??;
    observer.flushed(started.elapsed());
    Ok(())
}
