//! Entries and an observer for the store tests.

// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use holdfast_core::{Acquire, Applied, Command, LockState, Token};
use holdfast_store::{ApplyObserver, NodeId, SharedState, SnapshotData, TypeConfig};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Membership};

pub fn log_id(term: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

pub fn blank(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry { log_id: log_id(term, index), payload: EntryPayload::Blank }
}

pub fn membership(term: u64, index: u64) -> Entry<TypeConfig> {
    let voters = [1, 2, 3].into_iter().collect();
    Entry { log_id: log_id(term, index), payload: EntryPayload::Membership(Membership::new(vec![voters], None)) }
}

/// Lock `name` asked for by `owner` with `token`: granted if free, else queued.
pub fn acquire(term: u64, index: u64, name: &str, owner: &str, token: u128) -> Entry<TypeConfig> {
    let cmd = Command::Acquire(Acquire {
        name: name.to_owned(),
        owner: owner.to_owned(),
        token: Token(token),
        ttl_ms: 30_000,
        wait_ms: 10_000,
        session: None,
    });
    let entry = holdfast_core::Entry { at_ms: 1_700_000_000_000 + index, cmd };
    Entry { log_id: log_id(term, index), payload: EntryPayload::Normal(entry) }
}

/// The lock state `entries` lead to, applied to a plain `LockState`: the model a store is compared with.
pub fn model(entries: &[Entry<TypeConfig>]) -> LockState {
    let mut model = LockState::new();
    for entry in entries {
        if let EntryPayload::Normal(e) = &entry.payload {
            model.apply(entry.log_id.index, e);
        }
    }
    model
}

pub fn state_bytes(state: &SharedState) -> Vec<u8> {
    state.read().expect("no apply panicked").snapshot()
}

/// The bytes of a snapshot, read as openraft reads them to send them.
pub async fn snapshot_bytes(data: &mut SnapshotData) -> std::io::Result<Vec<u8>> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    data.seek(std::io::SeekFrom::Start(0)).await?;
    let mut bytes = Vec::new();
    data.read_to_end(&mut bytes).await?;
    Ok(bytes)
}

/// Writes `bytes` into a snapshot being received as openraft does: a chunk at a time, each at its offset,
/// then a shutdown.
pub async fn receive(data: &mut SnapshotData, bytes: &[u8]) -> std::io::Result<()> {
    use tokio::io::{AsyncSeekExt, AsyncWriteExt};
    for (i, chunk) in bytes.chunks(7).enumerate() {
        data.seek(std::io::SeekFrom::Start(i as u64 * 7)).await?;
        data.write_all(chunk).await?;
    }
    data.shutdown().await
}

/// Counts what the store tells its observer.
#[derive(Default)]
pub struct Counting {
    pub applied: AtomicUsize,
    pub restored: AtomicUsize,
    pub flushed: AtomicUsize,
}

impl Counting {
    pub fn flushes(&self) -> usize {
        self.flushed.load(Ordering::SeqCst)
    }
}

impl ApplyObserver for Counting {
    fn applied(&self, _state: &LockState, _index: u64, _cmd: &holdfast_core::Command, _applied: &Applied) {
        self.applied.fetch_add(1, Ordering::SeqCst);
    }

    fn restored(&self, _state: &LockState) {
        self.restored.fetch_add(1, Ordering::SeqCst);
    }

    fn flushed(&self, _took: std::time::Duration) {
        self.flushed.fetch_add(1, Ordering::SeqCst);
    }
}
