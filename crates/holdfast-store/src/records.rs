//! The store's records (format 5) in sealed files of its own (see the `sealed` module):
//!
//! - `records`: the format, the last purged log id, and the current snapshot (its metadata, its file's
//!   name, and the length and CRC-32 of its bytes), replaced whole and durably on each purge and each
//!   stored snapshot, which are rare (one per `--snapshot-every` entries);
//! - `committed`: the last committed log id, written in place on each commit and synced apart from it, at
//!   most every 250 ms (by the disk's watching thread): it only lets a restarted node re-apply at once, and
//!   tells the log's open how far its entries were synced, so a crash may lose the latest one (the node
//!   then re-applies at the leader's next message), or leave it damaged, which the open reports and
//!   ignores.
//!
//! Until format 5 these were sled's (`meta` and `snapshot` trees); the `convert` module reads them from
//! there once.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::LogId;
use serde::{Deserialize, Serialize};

use crate::fs::Fs;
use crate::machine::Meta;
use crate::sealed::{self, Overwritten};
use crate::snapshot::Summary;
use crate::{NodeId, StoreError};

/// The name of the records' file in the store's directory.
pub(crate) const FILE: &str = "records";
/// The name of the committed log id's file.
pub(crate) const COMMITTED: &str = "committed";

/// What `records` holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Records {
    /// The layout's version: [`crate::FORMAT`].
    pub(crate) format: u32,
    /// The log id of the last entry removed by a purge.
    pub(crate) purged: Option<LogId<NodeId>>,
    /// The current snapshot.
    pub(crate) snapshot: Option<StoredSnapshot>,
}

/// The current snapshot's record: its metadata and where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredSnapshot {
    pub(crate) meta: Meta,
    /// The file's name in `snapshots/`.
    pub(crate) name: String,
    /// Of the file's bytes.
    pub(crate) summary: Summary,
}

/// The committed log id as `committed` holds it: always the same size, so that a write in place leaves
/// nothing of the one before (see [`Overwritten::write`]).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Committed {
    some: bool,
    term: u64,
    node: NodeId,
    index: u64,
}

impl From<Option<LogId<NodeId>>> for Committed {
    fn from(id: Option<LogId<NodeId>>) -> Self {
        match id {
            Some(id) => Committed { some: true, term: id.leader_id.term, node: id.leader_id.node_id, index: id.index },
            None => Committed { some: false, term: 0, node: 0, index: 0 },
        }
    }
}

impl From<Committed> for Option<LogId<NodeId>> {
    fn from(c: Committed) -> Self {
        c.some.then(|| LogId::new(openraft::CommittedLeaderId::new(c.term, c.node), c.index))
    }
}

/// The records of one store, shared by its log and its state machine: read once at open, kept here,
/// replaced on disk by [`RecordsFile::update`].
#[derive(Clone)]
pub(crate) struct RecordsFile {
    fs: Arc<dyn Fs>,
    dir: PathBuf,
    /// The records as last written; the lock also serialises updates.
    current: Arc<Mutex<Records>>,
    committed: Arc<Overwritten>,
    /// Whether `committed` was written since it was last synced.
    committed_unsynced: Arc<std::sync::atomic::AtomicBool>,
}

impl RecordsFile {
    /// Reads the records under `dir`; `None` if there is no `records` file.
    pub(crate) fn read(fs: &dyn Fs, dir: &Path) -> Result<Option<Records>, StoreError> {
        sealed::read(fs, dir, FILE).map_err(|e| StoreError::Records(e.to_string()))
    }

    /// Writes `records` under `dir` durably, replacing what was there. Blocks on disk IO.
    pub(crate) fn write(fs: &dyn Fs, dir: &Path, records: &Records) -> Result<(), StoreError> {
        sealed::replace(fs, dir, FILE, records).map_err(|e| StoreError::Records(e.to_string()))
    }

    /// The last committed log id written under `dir`: `None` if there is none, or if what is there is
    /// damaged (which a crash in the middle of its write in place can leave, and which costs nothing but a
    /// later re-apply).
    pub(crate) fn read_committed(fs: &dyn Fs, dir: &Path) -> Result<Option<LogId<NodeId>>, StoreError> {
        match sealed::read::<Committed>(fs, dir, COMMITTED) {
            Ok(committed) => Ok(committed.and_then(Into::into)),
            Err(damaged @ sealed::Failed::Damaged(_)) => {
                tracing::warn!("{damaged}; the node re-applies the log once its leader says how far it is committed");
                Ok(None)
            }
            Err(e) => Err(StoreError::Records(e.to_string())),
        }
    }

    /// The records `records` and the last commit `committed`, as found under `dir` by the open, with the
    /// `committed` file opened for writes, and holding `committed` (a converted directory's, or a new one's
    /// first).
    pub(crate) fn new(
        fs: Arc<dyn Fs>,
        dir: &Path,
        records: Records,
        committed: Option<LogId<NodeId>>,
    ) -> Result<RecordsFile, StoreError> {
        let file = Overwritten::open(fs.as_ref(), dir, COMMITTED).map_err(|e| StoreError::Records(e.to_string()))?;
        let records = RecordsFile {
            fs,
            dir: dir.to_owned(),
            current: Arc::new(Mutex::new(records)),
            committed: Arc::new(file),
            committed_unsynced: Default::default(),
        };
        records.save_committed(committed)?;
        Ok(records)
    }

    /// The records as last written.
    pub(crate) fn get(&self) -> Records {
        self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Changes the records with `change` and writes them, durably, before returning. Blocks on disk IO;
    /// updates are serialised.
    pub(crate) fn update(&self, change: impl FnOnce(&mut Records)) -> Result<(), StoreError> {
        let mut current = self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut records = current.clone();
        change(&mut records);
        Self::write(self.fs.as_ref(), &self.dir, &records)?;
        *current = records;
        Ok(())
    }

    /// Writes the last committed log id, in place and not synced (see the module docs).
    pub(crate) fn save_committed(&self, committed: Option<LogId<NodeId>>) -> Result<(), StoreError> {
        self.committed.write(&Committed::from(committed)).map_err(|e| StoreError::Records(e.to_string()))?;
        self.committed_unsynced.store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Syncs the `committed` file if it was written since its last sync: run every 250 ms by the disk's
    /// watching thread, off the paths that wait, as sled's background flush did for the records it held.
    /// A failure is only logged: the value may be lost in any case.
    pub(crate) fn sync_committed(&self) {
        if self.committed_unsynced.swap(false, std::sync::atomic::Ordering::AcqRel) {
            if let Err(e) = self.committed.sync() {
                tracing::warn!("cannot sync the committed log id: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::CrashFs;

    fn id(index: u64) -> Option<LogId<NodeId>> {
        Some(LogId::new(openraft::CommittedLeaderId::new(1, 1), index))
    }

    /// A commit synced by `sync_committed` survives a power cut; one written after it may be lost, and a
    /// crash leaves one of the two, whole.
    #[test]
    fn a_synced_commit_survives_a_power_cut_and_a_later_one_may_not() {
        let dir = Path::new("/store");
        let mut lost = 0;
        for seed in 0..100 {
            let fs = Arc::new(CrashFs::new(seed, false));
            crate::fs::create_dirs(fs.as_ref(), dir).unwrap();
            let records = RecordsFile::new(fs.clone(), dir, Records::default(), None).unwrap();
            fs.sync_dir(dir).unwrap();
            records.save_committed(id(7)).unwrap();
            records.sync_committed();
            records.save_committed(id(9)).unwrap();
            fs.crash();
            let read = RecordsFile::read_committed(fs.as_ref(), dir).unwrap();
            assert!(read == id(7) || read == id(9), "seed {seed}: {read:?}");
            lost += usize::from(read == id(7));
        }
        assert!(lost > 0, "no power cut lost the unsynced commit: the check could not tell a sync from none");
    }
}
