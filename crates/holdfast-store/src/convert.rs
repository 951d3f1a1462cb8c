//! Reading a directory of formats 1 to 4, whose records are in sled, so that [`crate::open_with`] can
//! write them as format 5's own files.
//!
//! The steps, each durable before the next, so that a crash anywhere leaves a directory the next open
//! converts again from the start (sled's records are never changed but for the format, and are still
//! there):
//! 1. a format-1 log is moved from sled's `log` tree into `raft-log/` (see [`convert_format_1`]);
//! 2. a format-3 snapshot's bytes (in sled's `snapshot` tree) are written to `snapshots/0.snapshot`;
//! 3. sled's copy of the vote is written to the `vote` file where it is the later vote;
//! 4. sled records format 5, flushed: from then on, builds of formats 2 to 4 refuse the directory (a build
//!    of format 1 would too);
//! 5. the caller writes `records` (see the `records` module).
//!
//! A new directory goes through the same steps with an empty sled: the sled database it leaves behind,
//! which records format 5 and nothing else, makes an older build refuse the directory rather than take it
//! for a new one. Once `records` exists, the store never opens sled again.

use std::path::Path;

use openraft::{LogId, Vote};
use serde::{Deserialize, Serialize};

use crate::fs::RealFs;
use crate::machine::Meta;
use crate::records::{Records, StoredSnapshot};
use crate::snapshot::Summary;
use crate::{codec, NodeId, StoreError, TypeConfig, FORMAT};

/// Tree names and the keys of the records in them, as formats 1 to 4 wrote them.
mod keys {
    /// Format 1 kept the Raft log here; format 2 keeps it in files (see `wal`).
    pub const LOG_TREE_FORMAT_1: &str = "log";
    pub const META_TREE: &str = "meta";
    pub const SNAPSHOT_TREE: &str = "snapshot";

    pub const FORMAT: &str = "format";
    pub const VOTE: &str = "vote";
    pub const COMMITTED: &str = "committed";
    pub const LAST_PURGED: &str = "last_purged";

    pub const SNAPSHOT_META: &str = "meta";
    /// Format 3 kept a snapshot's bytes here; format 4 keeps them in a file, named under `SNAPSHOT_FILE`.
    pub const SNAPSHOT_DATA_FORMAT_3: &str = "data";
    pub const SNAPSHOT_FILE: &str = "file";
}

/// The name of sled's main file in a directory it made: whether there is one tells an older directory.
pub(crate) const SLED_FILE: &str = "db";

/// The name format 5 gives a format-3 snapshot moved out of sled.
const FORMAT_3_SNAPSHOT: &str = "0.snapshot";

/// What a directory's sled held, as format 5 keeps it.
pub(crate) struct Converted {
    pub(crate) records: Records,
    pub(crate) committed: Option<LogId<NodeId>>,
}

/// The snapshot file a format-4 `file` record names.
#[derive(Deserialize, Serialize)]
struct StoredFile {
    name: String,
    summary: Summary,
}

/// Steps 1 to 4 of the module docs on the directory `dir` (the real file system's), with sled's page
/// cache bounded by `cache_bytes` while it is open.
pub(crate) fn from_sled(dir: &Path, cache_bytes: u64) -> Result<Converted, StoreError> {
    let db = sled::Config::new().path(dir).cache_capacity(cache_bytes).open()?;
    let meta = db.open_tree(keys::META_TREE)?;
    let get = |key: &str| -> Result<Option<sled::IVec>, StoreError> { Ok(meta.get(key)?) };
    let purged: Option<LogId<NodeId>> = get(keys::LAST_PURGED)?.map(|b| bincode::deserialize(&b)).transpose()?;
    let found: Option<u32> = get(keys::FORMAT)?.map(|b| bincode::deserialize(&b)).transpose()?;
    match found {
        None | Some(2..=FORMAT) => {}
        Some(1) => convert_format_1(&db, &dir.join(crate::wal::DIR))?,
        Some(found) => return Err(StoreError::Format { found, expected: FORMAT }),
    }
    let committed: Option<Option<LogId<NodeId>>> =
        get(keys::COMMITTED)?.map(|b| bincode::deserialize(&b)).transpose()?;
    let snapshot = snapshot_of(&db.open_tree(keys::SNAPSHOT_TREE)?, &dir.join(crate::state_machine::DIR))?;
    let copy: Option<Vote<NodeId>> = get(keys::VOTE)?.map(|b| bincode::deserialize(&b)).transpose()?;
    if let Some(copy) = copy {
        if crate::vote::read(&RealFs, dir)?.is_none_or(|file| copy > file) {
            crate::vote::write(&RealFs, dir, &copy)?;
        }
    }
    if found != Some(FORMAT) {
        meta.insert(keys::FORMAT, bincode::serialize(&FORMAT)?)?;
        db.flush()?;
        match found {
            None => {}
            Some(found) => tracing::info!(
                "converted the storage directory from format {found} (records in sled) to format {FORMAT} (records \
                 in files of its own); builds of format {found} cannot read it"
            ),
        }
    }
    let records = Records { format: FORMAT, purged, snapshot };
    Ok(Converted { records, committed: committed.flatten() })
}

/// Moves a format-1 directory's log, kept in sled's `log` tree, into the log files, durably. A crash
/// part-way leaves format 1 recorded and the tree whole, and the next open starts the move again from
/// the beginning. The tree is dropped once format 5 is recorded.
fn convert_format_1(db: &sled::Db, wal_dir: &Path) -> Result<(), StoreError> {
    if wal_dir.exists() {
        std::fs::remove_dir_all(wal_dir).map_err(StoreError::Io)?;
    }
    let wal = crate::wal::Wal::open(wal_dir, None)?;
    let tree = db.open_tree(keys::LOG_TREE_FORMAT_1)?;
    let mut batch = Vec::new();
    for value in tree.iter().values() {
        batch.push(codec::decode::<openraft::Entry<TypeConfig>>(&value?)?);
        if batch.len() == 1024 {
            wal.append(&std::mem::take(&mut batch))?;
        }
    }
    wal.append(&batch)?;
    drop(wal);
    db.open_tree(keys::META_TREE)?.insert(keys::FORMAT, bincode::serialize(&FORMAT)?)?;
    db.flush()?;
    db.drop_tree(keys::LOG_TREE_FORMAT_1)?;
    db.flush()?;
    tracing::info!("moved the storage directory's log from sled (format 1) to log files");
    Ok(())
}

/// The snapshot sled's `snapshot` tree records: a format-4 file record as it is, a format-3 snapshot's
/// bytes written to a file of `dir` (synced, with the directory) first.
fn snapshot_of(tree: &sled::Tree, dir: &Path) -> Result<Option<StoredSnapshot>, StoreError> {
    let meta: Option<Meta> = tree.get(keys::SNAPSHOT_META)?.map(|b| bincode::deserialize(&b)).transpose()?;
    let file = tree.get(keys::SNAPSHOT_FILE)?;
    match (meta, file, tree.get(keys::SNAPSHOT_DATA_FORMAT_3)?) {
        (None, None, None) => Ok(None),
        (Some(meta), Some(file), None) => {
            let StoredFile { name, summary } = bincode::deserialize(&file)?;
            Ok(Some(StoredSnapshot { meta, name, summary }))
        }
        (Some(meta), None, Some(bytes)) => {
            let summary = Summary { len: bytes.len() as u64, crc: crc32fast::hash(&bytes) };
            crate::fs::create_dirs(&RealFs, dir).map_err(StoreError::SnapshotFile)?;
            let path = dir.join(FORMAT_3_SNAPSHOT);
            let written = std::fs::File::create(&path).and_then(|mut file| {
                std::io::Write::write_all(&mut file, &bytes)?;
                file.sync_all()
            });
            written.and_then(|()| std::fs::File::open(dir)?.sync_all()).map_err(StoreError::SnapshotFile)?;
            Ok(Some(StoredSnapshot { meta, name: FORMAT_3_SNAPSHOT.to_owned(), summary }))
        }
        (Some(_), None, None) => Err(StoreError::SnapshotIncomplete("file")),
        (None, _, _) => Err(StoreError::SnapshotIncomplete("meta")),
        (Some(_), Some(_), Some(_)) => Err(StoreError::SnapshotCorrupt("both a file and bytes are recorded".into())),
    }
}
