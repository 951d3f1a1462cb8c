//! Damaged data replaced by a member's: a stored snapshot found damaged, replaced by a peer's (what the
//! damaged node reads of its own records, [`recorded_snapshot`]; what a peer serves of its current snapshot,
//! [`SnapshotSource`]; the replacement itself, [`replace_snapshot`]); and a log found damaged, cut at the
//! damage ([`cut_damaged_log`]), to be filled again from the leader by Raft.
//!
//! Why a damaged log may be cut. The entries after the damage may include some this node acknowledged and
//! the cluster committed with its acknowledgement. Without them, a vote of this node could elect a
//! candidate that lacks them, and they would be lost. So the cut is recorded first, durably (the
//! `recovering` file, [`Recovering`]), and while it is recorded the node grants no vote or pre-vote and
//! does not campaign: its server learns the last log index of a leader whose term is at least that of
//! the node's own vote (a leader of that term or later holds every entry the node could have acknowledged
//! and the cluster committed), waits until its own log reaches it, and only then removes the file
//! ([`Recovering::caught_up`]). openraft 0.9 lets a follower's log go back below what its leader matched
//! with the `loosen-follower-log-revert` feature, which the workspace turns on: the leader then searches
//! for the follower's end again instead of asserting.
//!
//! Why replacing a snapshot is safe. A snapshot covers only applied, so committed, entries; a peer's
//! snapshot through log id `S` holds the state every node reaches at `S`. The damaged node's log is left as
//! it was when it holds `S` itself: its entries after `S` (which it may have acknowledged, and which a
//! leader may count as matched) stay, and its last log id, which its votes compare, does not move. When its
//! log does not hold `S` (shorter, or another entry at that index), every entry of it that the cluster
//! committed lies below `S`'s index and is in the snapshot, and those after it were never committed (nor
//! can be: they follow an entry that lost to `S`'s): the log is emptied, as an install of a leader's
//! snapshot past a follower's log does, and openraft's start purges it through `S`. No entry the node
//! acknowledged and the cluster committed is lost, so no vote of it needs holding, and a leader's matched
//! index for it (below `S` then, since the leader holds `S`) does not go past its log. The log is emptied
//! before the snapshot is saved: a crash between leaves the damaged snapshot recorded, and the next start
//! fetches again, before the node takes part in anything.

use std::path::Path;
use std::sync::Arc;

use openraft::{BasicNode, LogId, SnapshotMeta};
use serde::{Deserialize, Serialize};

use crate::fs::{Fs, Open, RealFs};
use crate::machine::Meta;
use crate::records::RecordsFile;
use crate::runtime::blocking;
use crate::sealed;
use crate::snapshot::Summary;
use crate::{snapshot, state_machine, wal, NodeId, StoreError, FORMAT};

/// A piece of a node's current snapshot, as a peer whose own is damaged fetches it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotPiece {
    /// The snapshot's metadata: the same in every piece of one snapshot.
    pub meta: SnapshotMeta<NodeId, BasicNode>,
    /// The length of the snapshot's bytes, in all.
    pub len: u64,
    /// The CRC-32 of all of its bytes, as recorded with it.
    pub crc: u32,
    /// Where in the snapshot's bytes this piece begins.
    pub offset: u64,
    /// The piece's bytes.
    pub bytes: Vec<u8>,
}

/// A node's current snapshot, read by the piece for a peer; clones share the store.
#[derive(Clone)]
pub struct SnapshotSource {
    fs: Arc<dyn Fs>,
    records: RecordsFile,
    dir: std::path::PathBuf,
}

impl SnapshotSource {
    pub(crate) fn new(fs: Arc<dyn Fs>, records: RecordsFile, dir: &Path) -> Self {
        Self { fs, records, dir: dir.to_owned() }
    }

    /// The log index through which the current snapshot covers the log (`None`: no snapshot stored).
    pub fn index(&self) -> Option<u64> {
        self.records.get().snapshot.and_then(|stored| stored.meta.last_log_id).map(|id| id.index)
    }

    /// Up to `max` bytes from `offset` of the current snapshot, if it covers the log through `through`;
    /// `None` if none is stored or it covers less. Blocks on disk IO. A snapshot replaced meanwhile (its
    /// file removed) is an error; asked again, the answer is of the new one.
    pub async fn piece(&self, through: u64, offset: u64, max: usize) -> Result<Option<SnapshotPiece>, StoreError> {
        blocking(|| self.read_piece(through, offset, max))
    }

    fn read_piece(&self, through: u64, offset: u64, max: usize) -> Result<Option<SnapshotPiece>, StoreError> {
        let Some(stored) = self.records.get().snapshot else { return Ok(None) };
        if stored.meta.last_log_id.is_none_or(|id| id.index < through) {
            return Ok(None);
        }
        let file = self.fs.open(&self.dir.join(&stored.name), Open::Existing).map_err(StoreError::SnapshotFile)?;
        let Summary { len, crc } = stored.summary;
        let take = len.saturating_sub(offset).min(max as u64) as usize;
        let mut bytes = vec![0; take];
        file.read_exact_at(&mut bytes, offset).map_err(StoreError::SnapshotFile)?;
        Ok(Some(SnapshotPiece { meta: stored.meta, len, crc, offset, bytes }))
    }
}

/// The metadata of the snapshot recorded under `dir` (a node's data directory), read from the records
/// alone: what a node whose snapshot's bytes are damaged fetches a replacement for (its log position) and
/// from whom (its membership). `None` if no snapshot is recorded.
pub fn recorded_snapshot(dir: &Path) -> Result<Option<SnapshotMeta<NodeId, BasicNode>>, StoreError> {
    match RecordsFile::read(&RealFs, dir)? {
        Some(records) if records.format == FORMAT => Ok(records.snapshot.map(|stored| stored.meta)),
        Some(records) => Err(StoreError::Format { found: records.format, expected: FORMAT }),
        None => Ok(None),
    }
}

/// What [`replace_snapshot`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replaced {
    /// The log index the new snapshot covers the log through.
    pub index: u64,
    /// How many entries were removed from the log, which did not hold the snapshot's last entry (see the
    /// module docs); 0 if it did.
    pub removed: u64,
}

/// Makes `meta` and `bytes` (`len` long, with CRC `crc`, as the peer recorded them) the current snapshot of
/// the store under `dir`, in place of the one recorded there, which is damaged: checked (the bytes against
/// their length and CRC, then as a lock state), then the log emptied if it does not hold the snapshot's
/// last entry, then the snapshot stored durably. Refused, changing nothing, if the snapshot covers less
/// of the log than the recorded one. Call it before the store is opened, which then finds the new snapshot.
pub async fn replace_snapshot(
    dir: &Path,
    meta: &Meta,
    bytes: Vec<u8>,
    len: u64,
    crc: u32,
) -> Result<Replaced, StoreError> {
    replace_on(Arc::new(RealFs), wal::SEGMENT_BYTES, dir, meta, bytes, Summary { len, crc }).await
}

/// [`replace_snapshot`] on the file system `fs`, with log segments of `segment_bytes`.
pub(crate) async fn replace_on(
    fs: Arc<dyn Fs>,
    segment_bytes: u64,
    dir: &Path,
    meta: &Meta,
    bytes: Vec<u8>,
    sent: Summary,
) -> Result<Replaced, StoreError> {
    let Some(last) = meta.last_log_id else {
        return Err(StoreError::SnapshotCorrupt("a peer's snapshot covers no log".into()));
    };
    let records = match RecordsFile::read(fs.as_ref(), dir)? {
        Some(records) if records.format == FORMAT => records,
        Some(records) => return Err(StoreError::Format { found: records.format, expected: FORMAT }),
        None => return Err(StoreError::Records(format!("{} is missing", dir.join(crate::records::FILE).display()))),
    };
    if let Some(stored) = records.snapshot.as_ref().and_then(|stored| stored.meta.last_log_id) {
        if last < stored {
            return Err(StoreError::SnapshotCorrupt(format!(
                "a peer's snapshot through {last} covers less of the log than the recorded one, through {stored}"
            )));
        }
    }
    let (_, summary) = blocking(|| snapshot::decode(&bytes[..], bytes.len() as u64))?;
    if summary != sent {
        return Err(StoreError::SnapshotCorrupt(format!(
            "a peer's snapshot has {} bytes with CRC {:08x}, where it sent {} with CRC {:08x}",
            summary.len, summary.crc, sent.len, sent.crc
        )));
    }
    let committed = RecordsFile::read_committed(fs.as_ref(), dir)?;
    let removed = blocking(|| empty_log_without(fs.clone(), segment_bytes, dir, records.purged, committed, last))?;
    let records = RecordsFile::new(fs.clone(), dir, records, committed)?;
    state_machine::replace_stored(fs, records, &dir.join(state_machine::DIR), meta, bytes, summary).await?;
    Ok(Replaced { index: last.index, removed })
}

/// Empties the log under `dir` (its entries after `purged`) unless it holds the entry `last`, durably;
/// answers how many entries it removed.
fn empty_log_without(
    fs: Arc<dyn Fs>,
    segment_bytes: u64,
    dir: &Path,
    purged: Option<LogId<NodeId>>,
    committed: Option<LogId<NodeId>>,
    last: LogId<NodeId>,
) -> Result<u64, StoreError> {
    let committed_index = committed.map_or(0, |committed| committed.index);
    let wal = wal::Wal::open_on(fs, segment_bytes, &dir.join(wal::DIR), purged, committed_index)?;
    let holds_last = wal.read(last.index, Some(last.index + 1))?.first().map(|entry| entry.log_id) == Some(last);
    let first = purged.map_or(0, |purged| purged.index + 1);
    match (holds_last, wal.last()) {
        (false, Some(end)) if end.index >= first => {
            wal.truncate(first)?;
            Ok(end.index + 1 - first)
        }
        _ => Ok(0),
    }
}

/// The file of a store whose damaged log was cut, while its node has not caught up since.
const RECOVERING: &str = "recovering";

/// What the `recovering` file holds.
#[derive(Debug, Serialize, Deserialize)]
struct Cut {
    /// What was cut where.
    what: String,
}

/// A store whose damaged log was cut ([`cut_damaged_log`]), while its node has not caught up since: it
/// must not vote (see the module docs).
#[derive(Clone)]
pub struct Recovering {
    fs: Arc<dyn Fs>,
    dir: std::path::PathBuf,
    /// What was cut where.
    pub cut: String,
}

impl std::fmt::Debug for Recovering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recovering").field("dir", &self.dir).field("cut", &self.cut).finish()
    }
}

impl Recovering {
    /// Whether the store under `dir` cut its log and has not caught up since: its `recovering` file. A
    /// damaged one counts: the node must still not vote.
    pub(crate) fn read(fs: Arc<dyn Fs>, dir: &Path) -> Result<Option<Recovering>, StoreError> {
        let cut = match sealed::read::<Cut>(fs.as_ref(), dir, RECOVERING) {
            Ok(None) => return Ok(None),
            Ok(Some(Cut { what })) => what,
            Err(damaged @ sealed::Failed::Damaged(_)) => format!("unknown ({damaged})"),
            Err(e) => return Err(StoreError::Records(e.to_string())),
        };
        Ok(Some(Recovering { fs, dir: dir.to_owned(), cut }))
    }

    /// The node's log reached what its leader held when it asked: it may vote again. Removes the file,
    /// durably.
    pub async fn caught_up(&self) -> Result<(), StoreError> {
        blocking(|| {
            let path = self.dir.join(RECOVERING);
            match self.fs.remove(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            self.fs.sync_dir(&self.dir)
        })
        .map_err(|e| StoreError::Records(format!("removing {}: {e}", self.dir.join(RECOVERING).display())))
    }
}

/// Cuts the log of the store under `dir` at its first damage (see the `wal` module's `cut_at_damage`),
/// after recording, durably, that its node must not vote until it has caught up ([`Recovering`]) and
/// resetting its saved commit to none (the log may now end before it). Answers what was cut where, or
/// that the log ended before the saved commit with nothing damaged. Call it before the store is opened,
/// which then opens the log as cut and reports the store as recovering.
pub async fn cut_damaged_log(dir: &Path) -> Result<String, StoreError> {
    cut_on(Arc::new(RealFs), dir).await
}

/// [`cut_damaged_log`] on the file system `fs`.
pub(crate) async fn cut_on(fs: Arc<dyn Fs>, dir: &Path) -> Result<String, StoreError> {
    let records = match RecordsFile::read(fs.as_ref(), dir)? {
        Some(records) if records.format == FORMAT => records,
        Some(records) => return Err(StoreError::Format { found: records.format, expected: FORMAT }),
        None => return Err(StoreError::Records(format!("{} is missing", dir.join(crate::records::FILE).display()))),
    };
    blocking(|| {
        let before = Cut { what: "the log was being cut at its damage".into() };
        sealed::replace(fs.as_ref(), dir, RECOVERING, &before).map_err(|e| StoreError::Records(e.to_string()))?;
        let purged = records.purged;
        RecordsFile::new(fs.clone(), dir, records, None)?.sync_committed();
        let what = wal::cut_at_damage(fs.as_ref(), &dir.join(wal::DIR), purged)?
            .unwrap_or_else(|| "nothing was damaged, but the log ended before the saved commit".into());
        let cut = Cut { what: what.clone() };
        sealed::replace(fs.as_ref(), dir, RECOVERING, &cut).map_err(|e| StoreError::Records(e.to_string()))?;
        Ok(what)
    })
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, Entry, EntryPayload};

    use super::*;
    use crate::fs::CrashFs;
    use crate::records::Records;
    use crate::TypeConfig;

    /// Bytes per log segment: a few dozen blank entries fill one.
    const SEGMENT: u64 = 512;

    fn id(index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    /// A store under `dir` of `fs`, all of it synced: a log of entries 1..=40 in segments of 512 bytes,
    /// recorded as committed through 40, with a bit flipped in the first record of its second segment.
    fn damaged_store(fs: &Arc<CrashFs>, dir: &Path) {
        crate::fs::create_dirs(fs.as_ref(), dir).unwrap();
        RecordsFile::write(fs.as_ref(), dir, &Records { format: FORMAT, ..Default::default() }).unwrap();
        let log = dir.join(wal::DIR);
        let wal = wal::Wal::open_on(fs.clone(), SEGMENT, &log, None, 0).unwrap();
        for index in 1..=40 {
            let entry: Entry<TypeConfig> = Entry { log_id: id(index), payload: EntryPayload::Blank };
            wal.append(&[entry]).unwrap();
        }
        drop(wal);
        let records = RecordsFile::read(fs.as_ref(), dir).unwrap().unwrap();
        RecordsFile::new(fs.clone(), dir, records, Some(id(40))).unwrap().sync_committed();
        let mut segments = fs.list(&log).unwrap();
        segments.sort();
        assert!(segments.len() > 2, "the entries fill several segments");
        let file = fs.open(&log.join(&segments[1]), Open::Existing).unwrap();
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, 12).unwrap();
        file.write_all_at(&[byte[0] ^ 0xff], 12).unwrap();
        file.sync_all().unwrap();
    }

    /// The log under `dir` as the store opens it, given its saved commit.
    fn open_log(fs: &Arc<CrashFs>, dir: &Path) -> Result<Vec<u64>, StoreError> {
        let committed = RecordsFile::read_committed(fs.as_ref(), dir)?.map_or(0, |committed| committed.index);
        let wal = wal::Wal::open_on(fs.clone(), SEGMENT, &dir.join(wal::DIR), None, committed)?;
        Ok(wal.read(0, None)?.iter().map(|entry| entry.log_id.index).collect())
    }

    /// A power cut at any file operation of a cut of a damaged log never leaves a log that opens without
    /// the cut recorded: either the log is as it was (its open still refuses it, and a restart cuts it
    /// again), or the cut is recorded, so that its node holds its votes, and a restart's cut opens to the
    /// entries before the damage. (A cut that recorded itself only after cutting failed here: seed 47
    /// opened its cut log with no record.)
    #[tokio::test]
    async fn a_power_cut_during_a_cut_never_leaves_a_log_cut_without_its_record() {
        let dir = Path::new("/store");
        let mut recorded = 0;
        for seed in 0..256 {
            let fs = Arc::new(CrashFs::new(seed, false));
            damaged_store(&fs, dir);
            let before = open_log(&fs, dir);
            assert!(matches!(before, Err(StoreError::LogCorrupt(_))), "seed {seed}: {before:?}");
            fs.die_after(seed % 64);
            let _ = cut_on(fs.clone(), dir).await;
            fs.crash();
            if Recovering::read(fs.clone(), dir).unwrap().is_none() {
                let after = open_log(&fs, dir);
                assert!(
                    matches!(after, Err(StoreError::LogCorrupt(_))),
                    "seed {seed}: opened without the record: {after:?}"
                );
                continue;
            }
            recorded += 1;
            cut_on(fs.clone(), dir).await.unwrap_or_else(|e| panic!("seed {seed}: the cut again: {e}"));
            let kept = open_log(&fs, dir).unwrap_or_else(|e| panic!("seed {seed}: open after the cut: {e}"));
            assert!(kept.len() < 40 && kept.iter().copied().eq(1..=kept.len() as u64), "seed {seed}: {kept:?}");
        }
        assert!(recorded > 0 && recorded < 256, "the power cuts came both before and after the record: {recorded}");
    }
}
