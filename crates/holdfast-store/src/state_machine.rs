//! [`StateMachineStore`]: the lock state in memory ([`crate::machine`]), and its snapshot in a file of
//! `snapshots/`, named in the `snapshot` tree.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::covered::CoveredSender;
use crate::durable::Durable;
use crate::machine::{Machine, Meta, Replace, Restored, SnapshotStore};
use crate::snapshot::{self, SnapshotData, Summary};
use crate::{flush, keys, ApplyObserver, SharedState, StoreError};

/// The directory of snapshot files, under the storage directory.
pub(crate) const DIR: &str = "snapshots";

/// The ending of the current snapshot's file name.
const KEPT: &str = "snapshot";

/// The ending of the name of a snapshot's file while it is built or received.
const NEW: &str = "new";

/// The lock state machine of one node: applies committed entries, builds and installs snapshots.
pub struct StateMachineStore {
    machine: Arc<Machine<DiskSnapshots>>,
}

/// Builds snapshots of a [`StateMachineStore`] while it goes on applying; clones share the machine.
#[derive(Clone)]
pub struct SnapshotBuilder {
    machine: Arc<Machine<DiskSnapshots>>,
}

/// The current snapshot: its bytes in a file of `dir`, its metadata and the file's name in the `snapshot`
/// tree.
struct DiskSnapshots {
    db: sled::Db,
    snapshots: sled::Tree,
    dir: PathBuf,
    /// Told how long each flush took.
    observer: Arc<dyn ApplyObserver>,
    /// Serialises saves and loads: a save flushes between its check of the stored snapshot and its
    /// return, and removes the file of the one before; a load reads two keys and opens the file.
    io: tokio::sync::Mutex<()>,
}

/// The snapshot file a `file` record names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct StoredFile {
    /// The file's name in `snapshots/`.
    name: String,
    /// Of the file's bytes.
    summary: Summary,
}

/// Where the `snapshot` tree says the current snapshot's bytes are.
enum Stored {
    None,
    /// In a file (format 4).
    File(Meta, StoredFile),
    /// In the tree itself (format 3), until the next snapshot is saved: read with [`tree_bytes`].
    InTree(Meta),
}

impl Stored {
    fn meta(&self) -> Option<&Meta> {
        match self {
            Stored::None => None,
            Stored::File(meta, _) | Stored::InTree(meta) => Some(meta),
        }
    }

    fn file_name(&self) -> Option<&str> {
        match self {
            Stored::File(_, file) => Some(&file.name),
            Stored::None | Stored::InTree(_) => None,
        }
    }
}

impl StateMachineStore {
    /// The lock state, for readers; the state machine writes it on apply.
    pub fn state(&self) -> SharedState {
        self.machine.state()
    }

    /// Restores the lock state and progress from the stored snapshot, if there is one, and removes the
    /// files in `dir` that are not the stored snapshot's (left by a crash).
    pub(crate) fn open(
        db: sled::Db,
        snapshots: sled::Tree,
        dir: &Path,
        observer: Arc<dyn ApplyObserver>,
        durable: Durable,
        covered: CoveredSender,
    ) -> Result<Self, StoreError> {
        crate::fs::create_dirs(&crate::fs::RealFs, dir).map_err(StoreError::SnapshotFile)?;
        let stored = read_stored(&snapshots)?;
        remove_other_files(dir, stored.file_name())?;
        let restored = restore(&snapshots, dir, stored)?;
        let snapshots =
            DiskSnapshots { db, snapshots, dir: dir.to_owned(), observer: observer.clone(), io: Default::default() };
        Ok(Self { machine: Arc::new(Machine::open(snapshots, restored, observer, durable, covered)?) })
    }
}

/// Syncs a directory, so that the files created, renamed or removed in it stay so after a crash.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Removes every file in `dir` but `keep`: snapshots built or received but never saved, or saved and then
/// replaced, when a crash came before they were removed.
fn remove_other_files(dir: &Path, keep: Option<&str>) -> Result<(), StoreError> {
    for entry in std::fs::read_dir(dir).map_err(StoreError::SnapshotFile)? {
        let entry = entry.map_err(StoreError::SnapshotFile)?;
        if Some(entry.file_name().as_os_str()) != keep.map(std::ffi::OsStr::new) {
            tracing::info!(file = %entry.path().display(), "removing a snapshot file left by a crash");
            std::fs::remove_file(entry.path()).map_err(StoreError::SnapshotFile)?;
        }
    }
    Ok(())
}

/// The lock state of the stored snapshot, read from its file (checked against its length and checksum
/// before its invariants) or from the tree.
fn restore(snapshots: &sled::Tree, dir: &Path, stored: Stored) -> Result<Option<Restored>, StoreError> {
    match stored {
        Stored::None => Ok(None),
        Stored::File(meta, file) => {
            let path = dir.join(&file.name);
            let input = std::fs::File::open(&path).map_err(StoreError::SnapshotFile)?;
            // Bounded by the length recorded with it: a state that claims more is corrupt. Its invariants are
            // checked (asserted) only once its bytes are known to be the ones written: bytes the disk changed
            // can still decode, to a state that breaks one (a flipped bit in a fence panicked the open;
            // tests/fuzz_records.rs).
            // A decode that fails before the end is damage too: said with the file, as a CRC mismatch is.
            let recorded = format!("{} bytes with CRC {:08x}", file.summary.len, file.summary.crc);
            let (state, summary) = snapshot::decode_unchecked(input, file.summary.len).map_err(|e| {
                StoreError::SnapshotCorrupt(format!(
                    "{} does not read back ({e}), where {recorded} were stored",
                    path.display()
                ))
            })?;
            if summary != file.summary {
                let found = format!("{} has {} bytes with CRC {:08x}", path.display(), summary.len, summary.crc);
                return Err(StoreError::SnapshotCorrupt(format!("{found}, where {recorded} were stored")));
            }
            state.check_invariants();
            Ok(Some((meta, state, summary.len)))
        }
        Stored::InTree(meta) => {
            let bytes = tree_bytes(snapshots)?;
            let (state, summary) = snapshot::decode(&bytes[..], bytes.len() as u64)?;
            Ok(Some((meta, state, summary.len)))
        }
    }
}

/// The bytes of a snapshot kept in the tree (format 3).
fn tree_bytes(snapshots: &sled::Tree) -> Result<sled::IVec, StoreError> {
    snapshots.get(keys::SNAPSHOT_DATA_FORMAT_3)?.ok_or(StoreError::SnapshotIncomplete("data"))
}

/// What the `snapshot` tree records.
fn read_stored(snapshots: &sled::Tree) -> Result<Stored, StoreError> {
    let meta = match snapshots.get(keys::SNAPSHOT_META)? {
        Some(bytes) => Some(bincode::deserialize::<Meta>(&bytes)?),
        None => None,
    };
    let file = snapshots.get(keys::SNAPSHOT_FILE)?;
    match (meta, file, snapshots.contains_key(keys::SNAPSHOT_DATA_FORMAT_3)?) {
        (None, None, false) => Ok(Stored::None),
        (Some(meta), Some(file), false) => {
            let file: StoredFile = bincode::deserialize(&file)?;
            if !is_kept_name(&file.name) {
                let detail =
                    format!("the snapshot record names {:?}, which is no snapshot file of snapshots/", file.name);
                return Err(StoreError::SnapshotCorrupt(detail));
            }
            Ok(Stored::File(meta, file))
        }
        (Some(meta), None, true) => Ok(Stored::InTree(meta)),
        (Some(_), None, false) => Err(StoreError::SnapshotIncomplete("file")),
        (None, _, _) => Err(StoreError::SnapshotIncomplete("meta")),
        (Some(_), Some(_), true) => Err(StoreError::SnapshotCorrupt("both a file and bytes are recorded".into())),
    }
}

/// Whether `name` is one this store gives a kept snapshot's file (`N.snapshot`): a plain name in
/// `snapshots/`. A record naming anything else (`../x`, an absolute path) is damage, and following it would
/// read a file outside the directory, and the next save would remove that file as the replaced snapshot's.
fn is_kept_name(name: &str) -> bool {
    let number = name.strip_suffix(KEPT).and_then(|name| name.strip_suffix('.'));
    number.is_some_and(|number| !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()))
}

impl SnapshotStore for DiskSnapshots {
    fn next_seq(&self) -> Result<u64, StoreError> {
        // sled's id generator is persistent, so an id is never reused, even across restarts.
        Ok(self.db.generate_id()?)
    }

    fn create(&self) -> Result<SnapshotData, StoreError> {
        let path = self.dir.join(format!("{}.{NEW}", self.next_seq()?));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(StoreError::SnapshotFile)?;
        Ok(SnapshotData::in_file(file, path, true))
    }

    async fn load(&self) -> Result<Option<(Meta, SnapshotData)>, StoreError> {
        let _io = self.io.lock().await;
        match read_stored(&self.snapshots)? {
            Stored::None => Ok(None),
            Stored::File(meta, file) => {
                let path = self.dir.join(&file.name);
                let opened = std::fs::File::open(&path).map_err(StoreError::SnapshotFile)?;
                Ok(Some((meta, SnapshotData::in_file(opened, path, false))))
            }
            Stored::InTree(meta) => Ok(Some((meta, SnapshotData::in_memory(tree_bytes(&self.snapshots)?.to_vec())))),
        }
    }

    async fn save(
        &self,
        meta: &Meta,
        mut data: SnapshotData,
        summary: Summary,
        replace: Replace,
    ) -> Result<(bool, SnapshotData), StoreError> {
        let _io = self.io.lock().await;
        let stored = read_stored(&self.snapshots)?;
        if !replace.replaces(stored.meta(), meta) {
            return Ok((false, data));
        }
        if !data.is_new_in(&self.dir) {
            // Bytes this store did not make for a new snapshot (openraft's storage suite installs the
            // leader's current snapshot itself): the store keeps a copy of its own.
            let mut copy = self.create()?;
            data.copy_to(&mut copy).await?;
            data = copy;
        }
        let new = data.path().expect("a new snapshot of this store's is in a file").to_owned();
        // The bytes, then the name, then the record: a crash before the record is flushed leaves the
        // snapshot before this one current and whole, and a file the next open removes.
        data.sync().await?;
        let kept = new.with_extension(KEPT);
        let (from, to, dir) = (new.clone(), kept.clone(), self.dir.clone());
        tokio::task::spawn_blocking(move || std::fs::rename(from, to).and_then(|()| sync_dir(&dir)))
            .await?
            .map_err(StoreError::SnapshotFile)?;
        data.kept_at(kept.clone());
        let name = kept.file_name().and_then(|name| name.to_str()).expect("a name made of a number and an ending");
        let mut batch = sled::Batch::default();
        batch.insert(keys::SNAPSHOT_META, bincode::serialize(meta)?);
        batch.insert(keys::SNAPSHOT_FILE, bincode::serialize(&StoredFile { name: name.to_owned(), summary })?);
        batch.remove(keys::SNAPSHOT_DATA_FORMAT_3);
        self.snapshots.apply_batch(batch)?;
        flush(&self.db, self.observer.as_ref()).await?;
        if let Some(replaced) = stored.file_name().filter(|replaced| *replaced != name) {
            // Its bytes may still be read, through a handle opened earlier, by a transfer to a follower.
            if let Err(e) = std::fs::remove_file(self.dir.join(replaced)) {
                tracing::warn!(file = replaced, "cannot remove the replaced snapshot's file (the next open will): {e}");
            }
        }
        Ok((true, data))
    }
}

crate::machine::raft_state_machine!(StateMachineStore, SnapshotBuilder);

#[cfg(test)]
mod tests {
    use super::*;

    /// A `snapshot` tree recording a snapshot file named `name`.
    fn tree_naming(db: &sled::Db, name: &str) -> sled::Tree {
        let tree = db.open_tree(keys::SNAPSHOT_TREE).unwrap();
        tree.insert(keys::SNAPSHOT_META, bincode::serialize(&Meta::default()).unwrap()).unwrap();
        let file = StoredFile { name: name.to_owned(), summary: Summary { len: 4, crc: 0 } };
        tree.insert(keys::SNAPSHOT_FILE, bincode::serialize(&file).unwrap()).unwrap();
        tree
    }

    /// A record whose file name leads out of `snapshots/` (a damaged record) is refused when read, so that
    /// nothing opens the file it names nor, on the next save, removes it.
    #[test]
    fn a_snapshot_record_naming_a_file_outside_snapshots_is_refused() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        for name in ["../victim", "/etc/passwd", "7.snapshot/../../victim", "x.snapshot", ".snapshot", "7.new", ""] {
            let tree = tree_naming(&db, name);
            let Err(StoreError::SnapshotCorrupt(what)) = read_stored(&tree) else { panic!("{name:?} was taken") };
            assert!(what.contains(&format!("{name:?}")), "{what}");
        }
        let tree = tree_naming(&db, "42.snapshot");
        assert!(matches!(read_stored(&tree), Ok(Stored::File(_, file)) if file.name == "42.snapshot"));
    }
}
