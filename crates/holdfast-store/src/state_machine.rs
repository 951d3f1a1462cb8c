//! [`StateMachineStore`]: the lock state in memory ([`crate::machine`]), and its snapshot in a file of
//! `snapshots/`, named in the store's records (see the `records` module).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::covered::CoveredSender;
use crate::durable::Durable;
use crate::fs::{Fs, Open};
use crate::machine::{Machine, Meta, Replace, Restored, SnapshotStore};
use crate::records::{RecordsFile, StoredSnapshot};
use crate::refetched::SnapshotSource;
use crate::runtime::blocking;
use crate::snapshot::{self, SnapshotData, Summary};
use crate::{ApplyObserver, SharedState, StoreError};

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

/// The current snapshot: its bytes in a file of `dir`, its metadata and the file's name in the records.
struct DiskSnapshots {
    fs: Arc<dyn Fs>,
    records: RecordsFile,
    dir: PathBuf,
    /// The number the next snapshot file is named after: one past the largest found at open.
    next: AtomicU64,
    /// Told how long each save took.
    observer: Arc<dyn ApplyObserver>,
    /// Serialises saves and loads: a save writes the records between its check of the stored snapshot
    /// and its return, and removes the file of the one before.
    io: tokio::sync::Mutex<()>,
}

impl StateMachineStore {
    /// The lock state, for readers; the state machine writes it on apply.
    pub fn state(&self) -> SharedState {
        self.machine.state()
    }

    /// The current snapshot, as peers whose own is damaged fetch it.
    pub fn source(&self) -> SnapshotSource {
        let snapshots = self.machine.snapshots();
        SnapshotSource::new(snapshots.fs.clone(), snapshots.records.clone(), &snapshots.dir)
    }

    /// Restores the lock state and progress from the stored snapshot, if there is one, and removes the
    /// files in `dir` that are not the stored snapshot's (left by a crash).
    pub(crate) fn open(
        fs: Arc<dyn Fs>,
        records: RecordsFile,
        dir: &Path,
        observer: Arc<dyn ApplyObserver>,
        durable: Durable,
        covered: CoveredSender,
    ) -> Result<Self, StoreError> {
        crate::fs::create_dirs(fs.as_ref(), dir).map_err(StoreError::SnapshotFile)?;
        let stored = records.get().snapshot;
        if let Some(stored) = &stored {
            check_name(&stored.name)?;
        }
        let next = remove_other_files(fs.as_ref(), dir, stored.as_ref().map(|s| s.name.as_str()))?;
        let restored = restore(fs.as_ref(), dir, stored)?;
        let snapshots = DiskSnapshots {
            fs,
            records,
            dir: dir.to_owned(),
            next: AtomicU64::new(next),
            observer: observer.clone(),
            io: Default::default(),
        };
        Ok(Self { machine: Arc::new(Machine::open(snapshots, restored, observer, durable, covered)?) })
    }
}

/// Makes `meta` and `bytes` (of `summary`) the snapshot `records` name, in `dir`, durably, in place of the
/// one they named (damaged: see the `refetched` module); removes that one's file, and any other.
pub(crate) async fn replace_stored(
    fs: Arc<dyn Fs>,
    records: RecordsFile,
    dir: &Path,
    meta: &Meta,
    bytes: Vec<u8>,
    summary: Summary,
) -> Result<(), StoreError> {
    crate::fs::create_dirs(fs.as_ref(), dir).map_err(StoreError::SnapshotFile)?;
    let stored = records.get().snapshot;
    let next = remove_other_files(fs.as_ref(), dir, stored.as_ref().map(|s| s.name.as_str()))?;
    let observer = Arc::new(crate::NoObserver);
    let snapshots = DiskSnapshots {
        fs,
        records,
        dir: dir.to_owned(),
        next: AtomicU64::new(next),
        observer,
        io: Default::default(),
    };
    snapshots.save(meta, SnapshotData::in_memory(bytes), summary, Replace::Always).await?;
    Ok(())
}

/// Removes every file in `dir` but `keep`: snapshots built or received but never saved, or saved and then
/// replaced, when a crash came before they were removed. Answers one past the largest number a file there
/// was named after, from which new files are numbered.
fn remove_other_files(fs: &dyn Fs, dir: &Path, keep: Option<&str>) -> Result<u64, StoreError> {
    let mut next = 0;
    for name in fs.list(dir).map_err(StoreError::SnapshotFile)? {
        let number = name.to_str().and_then(|name| name.split('.').next()).and_then(|n| n.parse::<u64>().ok());
        next = next.max(number.map_or(0, |n| n + 1));
        if Some(name.as_os_str()) != keep.map(std::ffi::OsStr::new) {
            let path = dir.join(&name);
            tracing::info!(file = %path.display(), "removing a snapshot file left by a crash");
            fs.remove(&path).map_err(StoreError::SnapshotFile)?;
        }
    }
    Ok(next)
}

/// The lock state of the stored snapshot, read from its file, checked against its length and checksum
/// before its invariants.
fn restore(fs: &dyn Fs, dir: &Path, stored: Option<StoredSnapshot>) -> Result<Option<Restored>, StoreError> {
    let Some(StoredSnapshot { meta, name, summary: recorded }) = stored else { return Ok(None) };
    let path = dir.join(&name);
    let file = fs.open(&path, Open::Existing).map_err(StoreError::SnapshotFile)?;
    // Bounded by the length recorded with it: a state that claims more is corrupt. Its invariants are
    // checked (asserted) only once its bytes are known to be the ones written: bytes the disk changed can
    // still decode, to a state that breaks one (a flipped bit in a fence panicked the open;
    // tests/fuzz_records.rs). A decode that fails before the end is damage too: said with the file, as a
    // CRC mismatch is.
    let stored = format!("{} bytes with CRC {:08x}", recorded.len, recorded.crc);
    let (state, summary) = snapshot::decode_unchecked(snapshot::At::new(file.as_ref()), recorded.len).map_err(|e| {
        StoreError::SnapshotCorrupt(format!("{} does not read back ({e}), where {stored} were stored", path.display()))
    })?;
    if summary != recorded {
        let found = format!("{} has {} bytes with CRC {:08x}", path.display(), summary.len, summary.crc);
        return Err(StoreError::SnapshotCorrupt(format!("{found}, where {stored} were stored")));
    }
    state.check_invariants();
    Ok(Some((meta, state, summary.len)))
}

/// Refuses a snapshot record that names anything but a kept snapshot's file (`N.snapshot`, a plain name
/// in `snapshots/`): following it would read a file outside the directory, and the next save would
/// remove that file as the replaced snapshot's.
fn check_name(name: &str) -> Result<(), StoreError> {
    let number = name.strip_suffix(KEPT).and_then(|name| name.strip_suffix('.'));
    if number.is_some_and(|number| !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit())) {
        return Ok(());
    }
    let detail = format!("the snapshot record names {name:?}, which is no snapshot file of snapshots/");
    Err(StoreError::SnapshotCorrupt(detail))
}

impl SnapshotStore for DiskSnapshots {
    fn next_seq(&self) -> Result<u64, StoreError> {
        Ok(self.next.fetch_add(1, Ordering::Relaxed))
    }

    fn create(&self) -> Result<SnapshotData, StoreError> {
        let path = self.dir.join(format!("{}.{NEW}", self.next_seq()?));
        let file = self.fs.open(&path, Open::CreateNew).map_err(StoreError::SnapshotFile)?;
        Ok(SnapshotData::in_file(self.fs.clone(), file, path, true))
    }

    async fn load(&self) -> Result<Option<(Meta, SnapshotData)>, StoreError> {
        let _io = self.io.lock().await;
        let Some(stored) = self.records.get().snapshot else { return Ok(None) };
        let path = self.dir.join(&stored.name);
        let opened = self.fs.open(&path, Open::Existing).map_err(StoreError::SnapshotFile)?;
        Ok(Some((stored.meta, SnapshotData::in_file(self.fs.clone(), opened, path, false))))
    }

    async fn save(
        &self,
        meta: &Meta,
        mut data: SnapshotData,
        summary: Summary,
        replace: Replace,
    ) -> Result<(bool, SnapshotData), StoreError> {
        let _io = self.io.lock().await;
        let stored = self.records.get().snapshot;
        if !replace.replaces(stored.as_ref().map(|stored| &stored.meta), meta) {
            return Ok((false, data));
        }
        if !data.is_new_in(&self.dir) {
            // Bytes this store did not make for a new snapshot (openraft's storage suite installs the
            // leader's current snapshot itself): the store keeps a copy of its own.
            let mut copy = self.create()?;
            data.copy_to(&mut copy).await?;
            data = copy;
        }
        let started = std::time::Instant::now();
        let new = data.path().expect("a new snapshot of this store's is in a file").to_owned();
        // The bytes, then the name, then the record: a crash before the record is written leaves the
        // snapshot before this one current and whole, and a file the next open removes.
        data.sync().await?;
        let kept = new.with_extension(KEPT);
        blocking(|| self.fs.rename(&new, &kept).and_then(|()| self.fs.sync_dir(&self.dir)))
            .map_err(StoreError::SnapshotFile)?;
        data.kept_at(kept.clone());
        let name = kept.file_name().and_then(|name| name.to_str()).expect("a name made of a number and an ending");
        let record = StoredSnapshot { meta: meta.clone(), name: name.to_owned(), summary };
        blocking(|| self.records.update(|records| records.snapshot = Some(record)))?;
        self.observer.flushed(started.elapsed());
        if let Some(replaced) = stored.map(|stored| stored.name).filter(|replaced| replaced != name) {
            // Its bytes may still be read, through a handle opened earlier, by a transfer to a follower.
            if let Err(e) = self.fs.remove(&self.dir.join(&replaced)) {
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

    /// A record whose file name leads out of `snapshots/` (a damaged record) is refused when read, so that
    /// nothing opens the file it names nor, on the next save, removes it.
    #[test]
    fn a_snapshot_record_naming_a_file_outside_snapshots_is_refused() {
        for name in ["../victim", "/etc/passwd", "7.snapshot/../../victim", "x.snapshot", ".snapshot", "7.new", ""] {
            let Err(StoreError::SnapshotCorrupt(what)) = check_name(name) else { panic!("{name:?} was taken") };
            assert!(what.contains(&format!("{name:?}")), "{what}");
        }
        assert!(check_name("42.snapshot").is_ok());
    }
}
