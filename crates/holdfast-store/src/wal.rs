//! [`Wal`]: the Raft log as a directory of append-only segment files, written and fdatasynced by the
//! task that appends.
//!
//! Why not sled's `log` tree (the store's layout until format 2): every sled flush hands its buffer to
//! sled's IO thread pool, which wakes all of its idle threads (`notify_all`) for each one, and the
//! caller then hops through tokio's blocking pool as well. At 64 clients those wake-ups were about a
//! fifth of the machine's CPU, and the hops sat on every write's path twice (leader, then follower).
//! Here an append is one `pwrite` and one `fdatasync` on the calling thread, into space allocated in
//! advance so that the sync rarely has a file size to update. A leader's own appends
//! ([`Wal::append_unsynced`]) are only the `pwrite`: a thread of the log's own (`holdfast-log-sync`)
//! syncs every segment written since, and publishes how far the log is durable ([`Wal::durable`]).
//!
//! # Files
//!
//! `raft-log/segment-NNNNNNNNNN` (a sequence number, 10 digits), each a run of records:
//!
//! ```text
//! u32 LE  payload length (never 0)
//! u32 LE  CRC-32 (IEEE) of the payload
//! ...     payload: bincode 1 of the openraft::Entry
//! ```
//!
//! A segment's records have consecutive indexes. New segments are allocated [`SEGMENT_BYTES`] of zeros
//! (where the filesystem supports `fallocate`); a length of 0 marks the end of what was written. The
//! last segment is the one appended to; a new one starts when a batch does not fit, or when an append
//! does not follow the last entry (after a purge past the end, as a snapshot install does).
//!
//! # Crashes
//!
//! An append is acknowledged after its `fdatasync` (a leader's own, before: see the `durable` module for
//! why nothing acts on it until its sync), so what a crash can leave is a tail the sync did not
//! cover: a record cut short, or whole records not yet acknowledged. [`Wal::open`] keeps the records up
//! to the first that is short, fails its CRC, does not decode, or does not follow the one before, and
//! cuts the last segment there (zeroing the rest), so that garbage is never read back later. Earlier
//! segments were complete and synced before the next began: a bad record in one is corruption, and
//! refused. Truncating deletes later segments first (highest first, then syncs the directory) and cuts
//! the segment holding the first removed index last, so a crash part-way leaves a log that is a
//! prefix-closed run of entries, and the entries it removes never come back after it returned.
//! Purging deletes whole segments whose entries all lie at or below the purge point; the caller
//! records the purge point first, and reads never go below it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use openraft::{Entry, LogId};

use crate::durable::{Durable, Synced, SyncedSender};
use crate::fs::{Fs, FsFile, Open, RealFs};
use crate::{ApplyObserver, NodeId, StoreError, TypeConfig};

/// Bytes allocated for each new segment. A segment grows past this only to take one batch larger than
/// that whole space.
pub(crate) const SEGMENT_BYTES: u64 = 32 * 1024 * 1024;

/// Bytes before each record's payload: its length and its CRC.
const HEADER: usize = 8;

/// The directory under the store's directory that holds the segments.
pub(crate) const DIR: &str = "raft-log";

/// One segment file and the records it holds.
struct Segment {
    seq: u64,
    path: PathBuf,
    file: Arc<dyn FsFile>,
    /// The index of its first record; `None` while it holds none.
    first: Option<u64>,
    /// Where each record starts, and where the one after the last starts (`records.len() - 1` records).
    records: Vec<u64>,
}

impl Segment {
    fn len(&self) -> u64 {
        self.records.len() as u64 - 1
    }

    /// Bytes written: where the next record goes.
    fn end(&self) -> u64 {
        *self.records.last().expect("records holds at least the end")
    }

    /// The index after its last record, if it holds any.
    fn next(&self) -> Option<u64> {
        self.first.map(|first| first + self.len())
    }
}

/// The Raft log's directory of segment files.
pub(crate) struct Wal {
    fs: Arc<dyn Fs>,
    dir: PathBuf,
    /// Bytes allocated for each new segment: [`SEGMENT_BYTES`], but in tests.
    segment_bytes: u64,
    inner: Mutex<Inner>,
    /// Held by whoever syncs written entries, and across a truncation or purge: so that how far the log
    /// is durable is only ever published for the log as it is.
    syncing: Mutex<()>,
    /// How far the log is durable, for [`Durable`].
    synced: SyncedSender,
    /// Wakes the thread (or task) that syncs appends made by [`Wal::append_unsynced`]; started with the first.
    syncer: OnceLock<Syncer>,
    /// Whether that sync runs in a tokio task instead of a thread of its own, and how long the task's flush
    /// takes ([`Wal::syncing_in_a_task`]).
    sync_in_a_task: Option<Duration>,
}

/// How [`Wal::append_unsynced`] wakes what syncs its writes.
enum Syncer {
    Thread(SyncSender<()>),
    Task(tokio::sync::mpsc::Sender<()>),
}

struct Inner {
    /// The segments in order; the last is the one appended to, and there is always one.
    segments: Vec<Segment>,
    /// The log id of the last entry written, or `None` for an empty log.
    last: Option<LogId<NodeId>>,
    /// The index of the last purged entry, as given to [`Wal::open`] and [`Wal::purge`].
    purged: Option<u64>,
    /// Segments written since their last sync.
    dirty: Vec<Arc<dyn FsFile>>,
    /// Why a sync failed, once one did: nothing is written after that.
    failed: Option<Arc<str>>,
    /// Since when the oldest write still waiting for its sync (acknowledged before it), or the sync under
    /// way, has waited: what tells a stalled disk (see the `disk` module).
    waiting_since: Option<Instant>,
}

/// Whether a run of entries starting at `first` may come after the entry at index `before`: right after it,
/// or past it where a purge (up to `purged`) covers the gap, as after a snapshot install. Anything else
/// would leave segments that overlap or a gap.
fn may_follow(before: u64, first: u64, purged: Option<u64>) -> bool {
    first == before + 1 || (first > before && purged.is_some_and(|purged| first <= purged + 1))
}

/// The entries with indexes in `from..to` of `segment`, which holds them all, read in one go.
fn segment_entries(segment: &Segment, from: u64, to: u64) -> Result<Vec<Entry<TypeConfig>>, StoreError> {
    let first = segment.first.expect("the segment holds the entries");
    let (lo, hi) = (segment.records[(from - first) as usize], segment.records[(to - first) as usize]);
    let mut bytes = vec![0; (hi - lo) as usize];
    segment.file.read_exact_at(&mut bytes, lo).map_err(StoreError::Io)?;
    let mut entries = Vec::with_capacity((to - from) as usize);
    let mut at = 0;
    while at < bytes.len() {
        let (entry, len) = decode(&bytes[at..], segment.seq, lo + at as u64)?
            .ok_or_else(|| corrupt(format!("segment {} has a bad record at byte {}", segment.seq, lo + at as u64)))?;
        entries.push(entry);
        at += len;
    }
    Ok(entries)
}

fn corrupt(what: String) -> StoreError {
    StoreError::LogCorrupt(what)
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("segment-{seq:010}"))
}

/// Gives `file` its blocks from `from` up to `segment_bytes`, so that later syncs need not record a new
/// size. A filesystem without `fallocate` just lets the file grow; an error only if there is no room.
fn allocate(file: &dyn FsFile, from: u64, segment_bytes: u64) -> io::Result<()> {
    match file.allocate(from, segment_bytes.saturating_sub(from)) {
        Err(e) if crate::disk::is_no_space(&e) => Err(e),
        _ => Ok(()),
    }
}

/// Encodes `entry` as one record onto `buf`.
fn encode(entry: &Entry<TypeConfig>, buf: &mut Vec<u8>) -> Result<(), StoreError> {
    let start = buf.len();
    buf.extend_from_slice(&[0; HEADER]);
    bincode::serialize_into(&mut *buf, entry)?;
    let payload = &buf[start + HEADER..];
    let len = u32::try_from(payload.len()).map_err(|_| corrupt(format!("entry {} is over 4 GiB", entry.log_id)))?;
    let crc = crc32fast::hash(payload);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Decodes the record at the start of `bytes` (byte `at` of segment `seq`, for the error): its entry and
/// its whole length; `Ok(None)` if there is no whole, intact record there (a torn write). A record that is
/// intact (its checksum matches) but does not decode is an error, not a tail to cut: it was written whole,
/// by a build that knows an entry this one does not (a newer `Command`), and cutting it would drop
/// entries that may be committed.
pub(crate) fn decode(bytes: &[u8], seq: u64, at: u64) -> Result<Option<(Entry<TypeConfig>, usize)>, StoreError> {
    let Some(header) = bytes.get(..HEADER) else { return Ok(None) };
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
    let Some(payload) = HEADER.checked_add(len).and_then(|end| bytes.get(HEADER..end)) else { return Ok(None) };
    if len == 0 || crc32fast::hash(payload) != crc {
        return Ok(None);
    }
    let entry = crate::codec::decode(payload).map_err(|e| {
        corrupt(format!("segment {seq}, byte {at}: an intact record does not decode ({e}): written by a newer build?"))
    })?;
    Ok(Some((entry, HEADER + len)))
}

/// The offset of the first byte of `file` that is not zero, if any: read a buffer at a time.
fn first_written_byte(file: &dyn FsFile) -> Result<Option<u64>, StoreError> {
    let size = file.len().map_err(StoreError::Io)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut at = 0u64;
    while at < size {
        let n = buf.len().min((size - at) as usize);
        file.read_exact_at(&mut buf[..n], at).map_err(StoreError::Io)?;
        if let Some(i) = buf[..n].iter().position(|&b| b != 0) {
            return Ok(Some(at + i as u64));
        }
        at += n as u64;
    }
    Ok(None)
}

/// Reads a segment's records from its start: the segment and the last log id it holds. Stops at the first
/// record that is not whole and intact or does not follow the one before; `torn` is set when that is
/// something other than the zeros after the end. Reads record by record, not the allocated space after.
fn scan(fs: &dyn Fs, seq: u64, path: PathBuf) -> Result<(Segment, Option<LogId<NodeId>>, bool), StoreError> {
    let file: Arc<dyn FsFile> = fs.open(&path, Open::Existing).map_err(StoreError::Io)?.into();
    let size = file.len().map_err(StoreError::Io)?;
    let mut records = vec![0u64];
    let (mut first, mut last) = (None, None::<LogId<NodeId>>);
    let mut at = 0u64;
    let mut record = Vec::new();
    let torn = loop {
        let mut header = [0u8; HEADER];
        let available = size.saturating_sub(at).min(HEADER as u64) as usize;
        file.read_exact_at(&mut header[..available], at).map_err(StoreError::Io)?;
        let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as u64;
        if available < HEADER || len == 0 || at + HEADER as u64 + len > size {
            break header.iter().any(|&b| b != 0);
        }
        record.resize(HEADER + len as usize, 0);
        file.read_exact_at(&mut record, at).map_err(StoreError::Io)?;
        let Some((entry, _)) = decode(&record, seq, at)? else { break true };
        if last.is_some_and(|last| entry.log_id.index != last.index + 1) {
            break true;
        }
        first.get_or_insert(entry.log_id.index);
        last = Some(entry.log_id);
        at += record.len() as u64;
        records.push(at);
    };
    Ok((Segment { seq, path, file, first, records }, last, torn))
}

/// Cuts the log under `dir` (of a store that purged through `purged`) at its first damage: a bad record
/// before the last segment's end or in the last segment, a segment that does not follow the one before, or
/// one before the last with bytes but no first record. The records before the damage stay; the segment
/// holding it is cut at the bad record (or removed, when none of it is good), and every later segment is
/// removed, durably. Answers what was cut where (`None`: nothing was damaged). An intact record that does
/// not decode is an error, as at open: nothing is cut. Blocks on disk IO.
pub(crate) fn cut_at_damage(
    fs: &dyn Fs,
    dir: &Path,
    purged: Option<LogId<NodeId>>,
) -> Result<Option<String>, StoreError> {
    let mut seqs: Vec<u64> = fs
        .list(dir)
        .map_err(StoreError::Io)?
        .into_iter()
        .filter_map(|name| name.to_string_lossy().strip_prefix("segment-").and_then(|s| s.parse().ok()))
        .collect();
    seqs.sort_unstable();
    let mut last = None::<LogId<NodeId>>;
    let mut cut = None;
    for (i, &seq) in seqs.iter().enumerate() {
        let (segment, segment_last, torn) = scan(fs, seq, segment_path(dir, seq))?;
        let path = segment.path.display().to_string();
        let follows = match (last, segment.first) {
            (Some(before), Some(first)) => may_follow(before.index, first, purged.map(|p| p.index)),
            _ => true,
        };
        let is_last = i + 1 == seqs.len();
        if !follows {
            cut = Some((i, 0, format!("{path} does not follow the segment before it")));
        } else if segment.first.is_none() && !is_last && first_written_byte(segment.file.as_ref())?.is_some() {
            cut = Some((i, 0, format!("{path} has no record at its start but bytes after it")));
        } else if torn {
            cut = Some((i, segment.end(), format!("{path} has a bad record at byte {}", segment.end())));
        }
        if cut.is_some() {
            break;
        }
        last = segment_last.or(last);
    }
    let Some((at, keep, what)) = cut else { return Ok(None) };
    // The later segments first, the highest first, so that a crash part-way leaves a prefix of the log.
    for &seq in seqs[at + 1..].iter().rev() {
        fs.remove(&segment_path(dir, seq)).map_err(StoreError::Io)?;
    }
    let damaged = segment_path(dir, seqs[at]);
    if keep == 0 {
        fs.remove(&damaged).map_err(StoreError::Io)?;
    } else {
        let file = fs.open(&damaged, Open::Existing).map_err(StoreError::Io)?;
        file.set_len(keep).and_then(|()| file.sync_all()).map_err(StoreError::Io)?;
    }
    fs.sync_dir(dir).map_err(StoreError::Io)?;
    Ok(Some(what))
}

impl Wal {
    /// Opens the log under `dir` (creating it), given the last purged log id: a gap between two segments
    /// is allowed only where every entry before it was purged.
    pub(crate) fn open(dir: &Path, purged: Option<LogId<NodeId>>) -> Result<Self, StoreError> {
        Self::open_committed(dir, purged, 0)
    }

    /// [`Wal::open`], knowing that entries through `committed` were committed and synced here before the
    /// commit was recorded: a bad record that would cut the log below it is damage, not a torn tail (which
    /// holds only entries not yet synced), and the log refuses to open, cutting nothing.
    pub(crate) fn open_committed(
        dir: &Path,
        purged: Option<LogId<NodeId>>,
        committed: u64,
    ) -> Result<Self, StoreError> {
        Self::open_on(Arc::new(RealFs), SEGMENT_BYTES, dir, purged, committed)
    }

    /// [`Wal::open_committed`] on the file system `fs`, with segments of `segment_bytes`.
    pub(crate) fn open_on(
        fs: Arc<dyn Fs>,
        segment_bytes: u64,
        dir: &Path,
        purged: Option<LogId<NodeId>>,
        committed: u64,
    ) -> Result<Self, StoreError> {
        // Durably: a log whose directory a crash took away would take every entry with it.
        crate::fs::create_dirs(fs.as_ref(), dir).map_err(StoreError::CreateDir)?;
        let mut seqs = Vec::new();
        for name in fs.list(dir).map_err(StoreError::Io)? {
            let name = name.to_string_lossy();
            if let Some(seq) = name.strip_prefix("segment-").and_then(|s| s.parse::<u64>().ok()) {
                seqs.push(seq);
            }
        }
        seqs.sort_unstable();
        let mut segments: Vec<Segment> = Vec::new();
        let mut last = None::<LogId<NodeId>>;
        let count = seqs.len();
        let mut torn_at = None;
        for (i, seq) in seqs.into_iter().enumerate() {
            let (segment, segment_last, torn) = scan(fs.as_ref(), seq, segment_path(dir, seq))?;
            let is_last = i + 1 == count;
            if torn && !is_last {
                return Err(corrupt(format!("segment {seq} has a bad record at byte {}", segment.end())));
            }
            if torn {
                torn_at = Some((segment.path.clone(), segment.end()));
            }
            let Some(first) = segment.first else {
                if is_last {
                    segments.push(segment);
                } else if let Some(at) = first_written_byte(segment.file.as_ref())? {
                    // A segment before the last was whole and synced before the next began: a first record
                    // it does not start with, but bytes after it, is damage, not a rotation that crashed.
                    return Err(corrupt(format!(
                        "segment {seq} ({}) has no record at its start but bytes at offset {at}",
                        segment.path.display()
                    )));
                } else {
                    // Made by a rotation that crashed before its first append; a later one took over.
                    fs.remove(&segment.path).map_err(StoreError::Io)?;
                }
                continue;
            };
            if let Some(before) = last {
                if !may_follow(before.index, first, purged.map(|p| p.index)) {
                    return Err(corrupt(format!(
                        "segment {seq} starts at index {first}, after index {}",
                        before.index
                    )));
                }
            }
            last = segment_last;
            segments.push(segment);
        }
        let end = last.map_or(0, |last| last.index).max(purged.map_or(0, |purged| purged.index));
        if end < committed {
            let found = match &torn_at {
                Some((path, at)) => format!("{} has a bad record at byte {at}", path.display()),
                None => "its segments end there".to_owned(),
            };
            return Err(corrupt(format!(
                "the log ends at entry {end} ({found}), but entries through {committed} were committed and \
                 synced here: damage, not a torn write; nothing was cut"
            )));
        }
        // A process that stopped before its background sync leaves written entries that the kernel
        // holds but may not have on disk: they are synced before anything counts them as durable.
        for segment in &segments {
            segment.file.sync_data().map_err(StoreError::Io)?;
        }
        let inner = Inner {
            segments,
            last,
            purged: purged.map(|p| p.index),
            dirty: Vec::new(),
            failed: None,
            waiting_since: None,
        };
        let wal = Wal {
            fs,
            dir: dir.to_owned(),
            segment_bytes,
            inner: Mutex::new(inner),
            syncing: Mutex::new(()),
            synced: SyncedSender::new(Synced { last, pending: false, failed: None }),
            syncer: OnceLock::new(),
            sync_in_a_task: None,
        };
        let mut inner = wal.inner();
        let segments = &mut inner.segments;
        match segments.last() {
            // Cut what follows the last intact record, so that nothing after it is ever read back.
            Some(active) => {
                let end = active.end();
                active.file.set_len(end).map_err(StoreError::Io)?;
                // Space it had before the cut; if the disk has no room for it now, appends find out.
                let _ = allocate(active.file.as_ref(), end, wal.segment_bytes);
                active.file.sync_all().map_err(StoreError::Io)?;
            }
            None => wal.start_segment(segments, 0)?,
        }
        drop(inner);
        Ok(wal)
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The log id of the last entry in the log (purged ones included), if any.
    pub(crate) fn last(&self) -> Option<LogId<NodeId>> {
        self.inner().last
    }

    /// Creates segment `seq`, allocated and durable, as the last one. Where the disk has no room for it,
    /// removes what it made and answers the error, so that a later try can make it again.
    fn start_segment(&self, segments: &mut Vec<Segment>, seq: u64) -> Result<(), StoreError> {
        let path = segment_path(&self.dir, seq);
        let file: Arc<dyn FsFile> = self.fs.open(&path, Open::CreateNew).map_err(StoreError::Io)?.into();
        let made = allocate(file.as_ref(), 0, self.segment_bytes)
            .and_then(|()| file.sync_all())
            .and_then(|()| self.fs.sync_dir(&self.dir));
        if let Err(e) = made {
            drop(file);
            // Not in the log yet, and empty: a crash before this removal leaves an empty last segment,
            // which the next open takes as one.
            let _ = self.fs.remove(&path);
            return Err(StoreError::Io(e));
        }
        segments.push(Segment { seq, path, file, first: None, records: vec![0] });
        Ok(())
    }

    /// How far the log is durable, followed as it changes.
    pub(crate) fn durable(&self) -> Durable {
        Durable::new(self.synced.subscribe(), None)
    }

    /// Appends `entries` (consecutive indexes) and makes them durable (with everything written before them)
    /// before it returns. Blocks on disk IO.
    pub(crate) fn append(&self, entries: &[Entry<TypeConfig>]) -> Result<(), StoreError> {
        self.write(entries, false)?;
        let syncing = self.syncing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.sync_written(&syncing)
    }

    /// Appends `entries` and returns once they are written, before they are durable: a thread of the log's
    /// own syncs them (telling `observer` how long each sync took), and [`Wal::durable`] tells when it has.
    /// Blocks on the write only.
    pub(crate) fn append_unsynced(
        self: &Arc<Self>,
        entries: &[Entry<TypeConfig>],
        observer: &Arc<dyn ApplyObserver>,
    ) -> Result<(), StoreError> {
        // Published as pending before the append returns: an apply of these entries waits for their sync.
        self.write(entries, true)?;
        let syncer = self.syncer.get_or_init(|| match self.sync_in_a_task {
            Some(flush) => self.start_sync_task(observer.clone(), flush),
            None => self.start_syncer(observer.clone()),
        });
        // Full: the syncer is woken already, and syncs whatever is written when it runs.
        let stopped = match syncer {
            Syncer::Thread(wake) => matches!(wake.try_send(()), Err(TrySendError::Disconnected(()))),
            Syncer::Task(wake) => matches!(wake.try_send(()), Err(tokio::sync::mpsc::error::TrySendError::Closed(()))),
        };
        match stopped {
            true => Err(StoreError::SyncFailed("the log's sync thread stopped".into())),
            false => Ok(()),
        }
    }

    /// Has [`Wal::append_unsynced`]'s writes synced by a tokio task instead of a thread of its own: for a
    /// log on a test file system under a single-threaded runtime (a simulation's), where a thread would run
    /// outside the runtime's schedule. The task's syncs block its runtime for as long as they take, and each
    /// waits `flush` of the runtime's time first: a simulation's file system syncs at once, where a disk's
    /// flush takes a while, during which what was written is not yet durable.
    pub(crate) fn syncing_in_a_task(mut self, flush: Duration) -> Self {
        self.sync_in_a_task = Some(flush);
        self
    }

    /// Syncs what was written since the last sync, and tells `observer` how long it took; false once a sync
    /// failed (nothing is synced after it).
    fn sync_once(&self, observer: &Arc<dyn ApplyObserver>) -> bool {
        let started = std::time::Instant::now();
        let syncing = self.syncing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Err(e) = self.sync_written(&syncing) {
            tracing::error!(%e, "syncing the raft log failed: this node applies nothing more");
            return false;
        }
        drop(syncing);
        observer.flushed(started.elapsed());
        true
    }

    /// [`Wal::start_syncer`] in a tokio task of the current runtime (see [`Wal::syncing_in_a_task`]).
    fn start_sync_task(self: &Arc<Self>, observer: Arc<dyn ApplyObserver>, flush: Duration) -> Syncer {
        let (wake, mut woken) = tokio::sync::mpsc::channel::<()>(1);
        let wal: Weak<Wal> = Arc::downgrade(self);
        tokio::spawn(async move {
            while woken.recv().await.is_some() {
                if !flush.is_zero() {
                    tokio::time::sleep(flush).await;
                }
                let Some(wal) = wal.upgrade() else { return };
                if !wal.sync_once(&observer) {
                    return;
                }
            }
        });
        Syncer::Task(wake)
    }

    /// Starts the thread that syncs what [`Wal::append_unsynced`] wrote, each time it is woken; it ends when
    /// the log is dropped.
    fn start_syncer(self: &Arc<Self>, observer: Arc<dyn ApplyObserver>) -> Syncer {
        let (wake, woken) = sync_channel::<()>(1);
        let wal: Weak<Wal> = Arc::downgrade(self);
        let spawned = std::thread::Builder::new().name("holdfast-log-sync".into()).spawn(move || {
            while woken.recv().is_ok() {
                let Some(wal) = wal.upgrade() else { return };
                if !wal.sync_once(&observer) {
                    return;
                }
            }
        });
        if let Err(e) = spawned {
            // The sender is dropped with the receiver the thread never got: the append reports it.
            tracing::error!(%e, "cannot start the raft log's sync thread");
        }
        Syncer::Thread(wake)
    }

    /// Whether a sync failed: nothing is written or synced any more.
    pub(crate) fn failed(&self) -> bool {
        self.inner().failed.is_some()
    }

    /// Since when the log's oldest write waiting for its sync, or its sync under way, has waited; `None`
    /// while nothing waits.
    pub(crate) fn waiting_since(&self) -> Option<Instant> {
        self.inner().waiting_since
    }

    /// Syncs every segment written since its last sync, then publishes the log as durable through its
    /// last entry as of the start. The caller holds `syncing`.
    fn sync_written(&self, _syncing: &MutexGuard<'_, ()>) -> Result<(), StoreError> {
        let started = Instant::now();
        let (dirty, last) = {
            let mut inner = self.inner();
            if let Some(why) = &inner.failed {
                return Err(StoreError::SyncFailed(why.to_string()));
            }
            inner.waiting_since.get_or_insert(started);
            (std::mem::take(&mut inner.dirty), inner.last)
        };
        for file in &dirty {
            if let Err(e) = file.sync_data() {
                // An fsync that failed may have dropped the pages it could not write (and a retry
                // reports success): whatever was written is of unknown durability for good.
                let why: Arc<str> = format!("fdatasync: {e}").into();
                let mut inner = self.inner();
                inner.failed = Some(why.clone());
                // Nothing waits for a sync any more: what comes next fails, it is not a stall.
                inner.waiting_since = None;
                drop(inner);
                self.synced.send_modify(|synced| synced.failed = Some(why));
                return Err(StoreError::Io(e));
            }
        }
        let mut inner = self.inner();
        // What was written since the sync began waits since then, at the most.
        inner.waiting_since = (inner.last != last).then_some(started);
        self.publish_synced(&inner, last);
        Ok(())
    }

    /// Publishes the log as durable through `last` (with `syncing` held, and `inner` locked so that no
    /// append comes in between): entries written after it are still pending.
    fn publish_synced(&self, inner: &Inner, last: Option<LogId<NodeId>>) {
        let pending = inner.last != last;
        self.synced.send_if_modified(|synced| {
            let changed = synced.last != last || synced.pending != pending;
            synced.last = last;
            synced.pending = pending;
            changed
        });
    }

    /// Writes `entries` (consecutive indexes) after the log's last entry, where reads see them, and marks
    /// their segment as needing a sync; `pending`: published as acknowledged before their sync.
    fn write(&self, entries: &[Entry<TypeConfig>], pending: bool) -> Result<(), StoreError> {
        let mut buf = Vec::new();
        let mut ends = Vec::new();
        let (mut first, mut last) = (None::<u64>, None::<LogId<NodeId>>);
        for entry in entries {
            if let Some(last) = last {
                if entry.log_id.index != last.index + 1 {
                    return Err(corrupt(format!("append of index {} after {}", entry.log_id.index, last.index)));
                }
            }
            encode(entry, &mut buf)?;
            ends.push(buf.len() as u64);
            first.get_or_insert(entry.log_id.index);
            last = Some(entry.log_id);
        }
        let (Some(first), Some(last)) = (first, last) else { return Ok(()) };
        // Where the batch goes, decided under the lock; written without it, beyond the end that readers see.
        let (file, at) = {
            let mut inner = self.inner();
            if let Some(why) = &inner.failed {
                return Err(StoreError::SyncFailed(why.to_string()));
            }
            // openraft truncates before it appends over entries it has, and appends past the end only after
            // a purge that covers the gap; anything else, no later open would accept.
            if let Some(before) = inner.last.filter(|before| !may_follow(before.index, first, inner.purged)) {
                return Err(corrupt(format!("append of index {first} after the log's last entry {}", before.index)));
            }
            let segments = &mut inner.segments;
            let active = segments.last().expect("a log always has a segment");
            let follows = active.next().is_none_or(|next| next == first);
            let fits = active.end() + buf.len() as u64 <= self.segment_bytes;
            if active.first.is_some() && (!follows || !fits) {
                let seq = active.seq + 1;
                self.start_segment(segments, seq)?;
            }
            let active = segments.last().expect("a log always has a segment");
            (active.file.clone(), active.end())
        };
        file.write_all_at(&buf, at).map_err(StoreError::Io)?;

        let mut inner = self.inner();
        let active = inner.segments.last_mut().expect("a log always has a segment");
        active.first.get_or_insert(first);
        active.records.extend(ends.into_iter().map(|end| at + end));
        inner.last = Some(last);
        if !inner.dirty.iter().any(|dirty| Arc::ptr_eq(dirty, &file)) {
            inner.dirty.push(file);
        }
        if pending {
            inner.waiting_since.get_or_insert_with(Instant::now);
            self.synced.send_if_modified(|synced| !std::mem::replace(&mut synced.pending, true));
        }
        Ok(())
    }

    /// The entries with indexes in `start..end` (`end` `None`: to the last), in order; fewer if the log
    /// does not hold them all.
    pub(crate) fn read(&self, start: u64, end: Option<u64>) -> Result<Vec<Entry<TypeConfig>>, StoreError> {
        let inner = self.inner();
        let mut entries = Vec::new();
        for segment in &inner.segments {
            let (Some(first), Some(next)) = (segment.first, segment.next()) else { continue };
            let from = start.max(first);
            let to = end.map_or(next, |end| end.min(next));
            if from < to {
                entries.extend(segment_entries(segment, from, to)?);
            }
        }
        Ok(entries)
    }

    /// Removes the entries from index `since` on, durably, before it returns. Blocks on disk IO.
    pub(crate) fn truncate(&self, since: u64) -> Result<(), StoreError> {
        // What was written before is synced first, so that the log left is durable as a whole.
        let syncing = self.syncing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.sync_written(&syncing)?;
        let mut inner = self.inner();
        let segments = &mut inner.segments;
        // Whole segments first, the highest first, so that a crash part-way leaves a prefix of the log.
        let mut removed = false;
        while segments.len() > 1 && segments.last().is_some_and(|s| s.first.is_none_or(|first| first >= since)) {
            let segment = segments.pop().expect("checked");
            self.fs.remove(&segment.path).map_err(StoreError::Io)?;
            removed = true;
        }
        if removed {
            self.fs.sync_dir(&self.dir).map_err(StoreError::Io)?;
        }
        let active = segments.last_mut().expect("a log always has a segment");
        if let (Some(first), Some(next)) = (active.first, active.next()) {
            if since < next {
                let keep = since.saturating_sub(first) as usize;
                let end = active.records[keep];
                active.file.set_len(end).map_err(StoreError::Io)?;
                // Space it had before the cut; if the disk has no room for it now, appends find out.
                let _ = allocate(active.file.as_ref(), end, self.segment_bytes);
                active.file.sync_all().map_err(StoreError::Io)?;
                active.records.truncate(keep + 1);
                if keep == 0 {
                    active.first = None;
                }
            }
        }
        inner.last = match inner.segments.iter().rev().find_map(|s| s.next().map(|next| (s, next))) {
            Some((segment, next)) => segment_entries(segment, next - 1, next)?.pop().map(|entry| entry.log_id),
            None => None,
        };
        let last = inner.last;
        self.publish_synced(&inner, last);
        Ok(())
    }

    /// Deletes the segments all of whose entries are at or below `upto` (never the last one). The caller
    /// has already recorded `upto` as purged, durably, and reads nothing at or below it.
    pub(crate) fn purge(&self, upto: u64) -> Result<(), StoreError> {
        // Not while a sync is under way: it may hold a segment this deletes.
        let _syncing = self.syncing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut inner = self.inner();
        inner.purged = Some(inner.purged.map_or(upto, |purged| purged.max(upto)));
        let segments = &mut inner.segments;
        let mut removed = false;
        while segments.len() > 1 && segments[0].next().is_none_or(|next| next <= upto + 1) {
            let segment = segments.remove(0);
            self.fs.remove(&segment.path).map_err(StoreError::Io)?;
            removed = true;
        }
        if removed {
            self.fs.sync_dir(&self.dir).map_err(StoreError::Io)?;
        }
        Ok(())
    }

    /// How many segment files the log has (for tests).
    #[cfg(test)]
    fn segment_count(&self) -> usize {
        self.inner().segments.len()
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;
    use crate::fs::CrashFs;

    fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
        let cmd = holdfast_core::Command::Release { name: format!("lock-{index}"), token: holdfast_core::Token(7) };
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(holdfast_core::Entry { at_ms: index, cmd }),
        }
    }

    fn entries(term: u64, indexes: std::ops::RangeInclusive<u64>) -> Vec<Entry<TypeConfig>> {
        indexes.map(|i| entry(term, i)).collect()
    }

    fn indexes(wal: &Wal, start: u64, end: Option<u64>) -> Vec<u64> {
        wal.read(start, end).unwrap().iter().map(|e| e.log_id.index).collect()
    }

    /// A log in `dir` with entries 1..=3, a purge past its end to 9 (as a snapshot install makes), then
    /// 10..=12, which start a second segment.
    fn across_a_purge(dir: &Path) -> Wal {
        let wal = Wal::open(dir, None).unwrap();
        wal.append(&entries(1, 1..=3)).unwrap();
        wal.purge(9).unwrap();
        wal.append(&entries(1, 10..=12)).unwrap();
        wal
    }

    #[test]
    fn unsynced_appends_are_read_at_once_and_published_durable_by_the_sync_thread() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Arc::new(Wal::open(dir.path(), None).unwrap());
        let durable = wal.durable();
        wal.append(&entries(1, 1..=2)).unwrap();
        assert_eq!(durable.last().map(|id| id.index), Some(2), "a synced append is durable when it returns");
        let observer: Arc<dyn ApplyObserver> = Arc::new(crate::NoObserver);
        wal.append_unsynced(&entries(1, 3..=5), &observer).unwrap();
        assert_eq!(indexes(&wal, 1, None), vec![1, 2, 3, 4, 5]);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        runtime.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(10), durable.reached(5)).await.unwrap().unwrap();
        });
        // Truncating unsynced entries: the log is durable through what is left.
        wal.append_unsynced(&entries(1, 6..=7), &observer).unwrap();
        wal.truncate(6).unwrap();
        assert_eq!(durable.last().map(|id| id.index), Some(5));
        drop(wal);
        let reopened = Wal::open(dir.path(), None).unwrap();
        assert_eq!(indexes(&reopened, 1, None), vec![1, 2, 3, 4, 5]);
        assert_eq!(reopened.durable().last().map(|id| id.index), Some(5));
    }

    fn only_segment(dir: &Path) -> PathBuf {
        let mut files: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(files.len(), 1, "{files:?}");
        files.pop().unwrap()
    }

    #[test]
    fn appended_entries_read_back_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::open(dir.path(), None).unwrap();
        assert_eq!(wal.last(), None);
        wal.append(&entries(1, 1..=3)).unwrap();
        wal.append(&[entry(2, 4)]).unwrap();
        assert_eq!(indexes(&wal, 0, None), [1, 2, 3, 4]);
        assert_eq!(indexes(&wal, 2, Some(4)), [2, 3]);
        assert_eq!(wal.read(2, Some(3)).unwrap(), [entry(1, 2)]);
        drop(wal);
        let wal = Wal::open(dir.path(), None).unwrap();
        assert_eq!(indexes(&wal, 0, None), [1, 2, 3, 4]);
        assert_eq!(wal.last(), Some(entry(2, 4).log_id));
        wal.append(&[entry(2, 5)]).unwrap();
        assert_eq!(indexes(&wal, 4, None), [4, 5]);
    }

    /// A crash can leave any prefix of the bytes written after the last sync. Whatever the cut, reopening
    /// keeps exactly the whole records before it, and later appends read back without the garbage.
    #[test]
    fn a_torn_tail_is_cut_at_the_last_whole_record() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::open(dir.path(), None).unwrap();
        wal.append(&entries(1, 1..=3)).unwrap();
        let ends = wal.inner().segments[0].records.clone();
        drop(wal);
        let path = only_segment(dir.path());
        let written = std::fs::read(&path).unwrap()[..ends[3] as usize].to_vec();
        for cut in (ends[1]..=ends[3]).step_by(5) {
            let mut bytes = written[..cut as usize].to_vec();
            // What the torn write left past the cut: garbage, not zeros.
            bytes.extend(std::iter::repeat_n(0xA5, 40));
            std::fs::write(&path, &bytes).unwrap();
            let wal = Wal::open(dir.path(), None).unwrap();
            let whole = ends.iter().filter(|&&end| end > 0 && end <= cut).count() as u64;
            assert_eq!(indexes(&wal, 0, None), (1..=whole).collect::<Vec<_>>(), "cut at {cut}");
            wal.append(&[entry(2, whole + 1)]).unwrap();
            drop(wal);
            let wal = Wal::open(dir.path(), None).unwrap();
            assert_eq!(indexes(&wal, 0, None), (1..=whole + 1).collect::<Vec<_>>(), "cut at {cut}, appended");
        }
    }

    #[test]
    fn an_append_over_or_past_the_last_entry_is_refused_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::open(dir.path(), None).unwrap();
        wal.append(&entries(1, 1..=3)).unwrap();
        assert!(matches!(wal.append(&[entry(2, 3)]), Err(StoreError::LogCorrupt(_))));
        assert!(matches!(wal.append(&[entry(2, 5), entry(2, 7)]), Err(StoreError::LogCorrupt(_))));
        // A gap after the last entry, with no purge to cover it.
        assert!(matches!(wal.append(&[entry(2, 5)]), Err(StoreError::LogCorrupt(_))));
        assert_eq!(wal.read(0, None).unwrap(), (1..=3).map(|i| entry(1, i)).collect::<Vec<_>>());
        wal.append(&[entry(2, 4)]).unwrap();
        assert_eq!(wal.last(), Some(entry(2, 4).log_id));
    }

    /// A log of entries 1..=3 in `dir` with a bit flipped in the second record's payload: its segment's
    /// path, its bytes as left, and where the second record starts.
    fn second_record_flipped(dir: &Path) -> (PathBuf, Vec<u8>, u64) {
        let wal = Wal::open(dir, None).unwrap();
        wal.append(&entries(1, 1..=3)).unwrap();
        let second = wal.inner().segments[0].records[1];
        drop(wal);
        let path = only_segment(dir);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[second as usize + HEADER + 3] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        (path, bytes, second)
    }

    #[test]
    fn a_flipped_bit_ends_the_log_at_the_record_before() {
        let dir = tempfile::tempdir().unwrap();
        second_record_flipped(dir.path());
        let wal = Wal::open(dir.path(), None).unwrap();
        assert_eq!(indexes(&wal, 0, None), [1]);
    }

    /// A bad record among entries this node synced and recorded as committed is damage, not a torn tail:
    /// the log refuses to open, naming the file and the byte, and cuts nothing. Below the commit, the
    /// same bad record is a tail that may be cut.
    #[test]
    fn a_bad_record_among_committed_entries_is_refused_not_cut() {
        let dir = tempfile::tempdir().unwrap();
        let (path, bytes, second) = second_record_flipped(dir.path());
        let Err(StoreError::LogCorrupt(what)) = Wal::open_committed(dir.path(), None, 3) else { panic!("opened") };
        let expected = format!("the log ends at entry 1 ({} has a bad record at byte {second})", path.display());
        assert!(what.starts_with(&expected), "{what}");
        assert!(what.contains("entries through 3 were committed"), "{what}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "nothing was cut");
        // Committed only through 1: what follows may be a torn tail, and is cut.
        let wal = Wal::open_committed(dir.path(), None, 1).unwrap();
        assert_eq!(indexes(&wal, 0, None), [1]);
    }

    /// A record whose checksum matches but whose entry this build cannot decode (as a newer build's entry
    /// would be) makes the log refuse to open, rather than be cut there like a torn write.
    #[test]
    fn an_intact_record_that_does_not_decode_is_refused_not_cut() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::open(dir.path(), None).unwrap();
        wal.append(&entries(1, 1..=3)).unwrap();
        let end = wal.inner().segments[0].end();
        drop(wal);
        let path = only_segment(dir.path());
        let mut bytes = std::fs::read(&path).unwrap();
        // A record after the last: a well-formed header and checksum over bytes that are no entry.
        let payload = [0xffu8; 24];
        let mut record = (payload.len() as u32).to_le_bytes().to_vec();
        record.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        record.extend_from_slice(&payload);
        bytes[end as usize..end as usize + record.len()].copy_from_slice(&record);
        std::fs::write(&path, &bytes).unwrap();
        let Err(StoreError::LogCorrupt(what)) = Wal::open(dir.path(), None) else { panic!("the log opened") };
        assert!(what.starts_with(&format!("segment 0, byte {end}: an intact record does not decode")), "{what}");
        // And nothing was cut: without the record, the three entries are all there.
        bytes[end as usize..end as usize + record.len()].fill(0);
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(indexes(&Wal::open(dir.path(), None).unwrap(), 0, None), [1, 2, 3]);
    }

    /// A segment before the last whose first record's header was zeroed (a disk's damage) still holds
    /// records after it: the log refuses to open, naming the segment and where its bytes are, and deletes
    /// nothing. A segment before the last that is all zeros (a rotation that crashed before its first
    /// append) is still removed.
    #[test]
    fn a_segment_before_the_last_without_a_first_record_but_with_bytes_is_refused_not_removed() {
        let dir = tempfile::tempdir().unwrap();
        drop(across_a_purge(dir.path()));
        let first = segment_path(dir.path(), 0);
        let mut bytes = std::fs::read(&first).unwrap();
        bytes[..HEADER].fill(0);
        std::fs::write(&first, &bytes).unwrap();
        let purged = Some(entry(1, 9).log_id);
        let Err(StoreError::LogCorrupt(what)) = Wal::open(dir.path(), purged) else { panic!("the log opened") };
        let at = bytes.iter().position(|&b| b != 0).unwrap();
        assert!(what.starts_with("segment 0 ("), "{what}");
        assert!(what.ends_with(&format!("has no record at its start but bytes at offset {at}")), "{what}");
        assert!(first.exists(), "the damaged segment was kept");

        // All zeros: a rotation that crashed; removed, and the log opens with what the next one holds.
        std::fs::write(&first, vec![0u8; bytes.len()]).unwrap();
        let wal = Wal::open(dir.path(), purged).unwrap();
        assert!(!first.exists());
        assert_eq!(indexes(&wal, 0, None), [10, 11, 12]);
    }

    #[test]
    fn truncate_removes_entries_for_good_across_segments() {
        let dir = tempfile::tempdir().unwrap();
        let wal = across_a_purge(dir.path());
        assert_eq!(wal.segment_count(), 2);
        wal.truncate(11).unwrap();
        assert_eq!(wal.last(), Some(entry(1, 10).log_id));
        wal.truncate(3).unwrap();
        assert_eq!(wal.segment_count(), 1);
        assert_eq!(indexes(&wal, 0, None), [1, 2]);
        assert_eq!(wal.last(), Some(entry(1, 2).log_id));
        wal.append(&[entry(3, 3)]).unwrap();
        drop(wal);
        let wal = Wal::open(dir.path(), None).unwrap();
        assert_eq!(wal.read(0, None).unwrap(), [entry(1, 1), entry(1, 2), entry(3, 3)]);
        wal.truncate(1).unwrap();
        assert_eq!(wal.last(), None);
        drop(wal);
        assert_eq!(Wal::open(dir.path(), None).unwrap().read(0, None).unwrap(), []);
    }

    #[test]
    fn purge_deletes_whole_segments_and_a_gap_is_allowed_only_below_the_purge() {
        let dir = tempfile::tempdir().unwrap();
        drop(across_a_purge(dir.path()));
        // Nothing says entries 4..=9 were purged: the gap is refused.
        assert!(matches!(Wal::open(dir.path(), None), Err(StoreError::LogCorrupt(_))));
        let purged = Some(entry(1, 9).log_id);
        let wal = Wal::open(dir.path(), purged).unwrap();
        wal.purge(9).unwrap();
        assert_eq!(wal.segment_count(), 1);
        assert_eq!(indexes(&wal, 0, None), [10, 11, 12]);
        // The last segment is kept even when all of it is purged.
        wal.purge(12).unwrap();
        assert_eq!(wal.segment_count(), 1);
        assert_eq!(wal.last(), Some(entry(1, 12).log_id));
    }

    /// Random runs of appends, truncations and purges (past the end too), each ending in a crash part-way
    /// through one more append: either a random prefix of its bytes reached the file, then garbage, or all
    /// of it but its first record (pages written out of order). Reopened, the log is exactly what was
    /// acknowledged plus whole records of the torn batch, and after one more append it is that plus the
    /// new entry, with nothing stale behind it. 300 seeded runs; a failure names its seed.
    #[test]
    fn random_runs_ending_in_a_torn_append_reopen_to_what_was_acknowledged() {
        use rand::{Rng, SeedableRng};
        for seed in 0..300u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let dir = tempfile::tempdir().unwrap();
            let wal = Wal::open(dir.path(), None).unwrap();
            // The model: every entry acknowledged and not truncated, and the purge point.
            let (mut model, mut purged) = (Vec::<Entry<TypeConfig>>::new(), None::<LogId<NodeId>>);
            let mut term = 1;
            for _ in 0..rng.gen_range(1..40) {
                let next = model.last().map_or(purged.map_or(1, |p| p.index + 1), |e| e.log_id.index + 1);
                match rng.gen_range(0..10) {
                    0..=5 => {
                        let batch: Vec<_> = (next..next + rng.gen_range(1..5)).map(|i| entry(term, i)).collect();
                        wal.append(&batch).unwrap();
                        model.extend(batch);
                    }
                    6 | 7 if !model.is_empty() => {
                        let since = rng.gen_range(model[0].log_id.index..=next);
                        wal.truncate(since).unwrap();
                        model.retain(|e| e.log_id.index < since);
                        term += 1;
                    }
                    _ => {
                        // Up to a few past the end, as a snapshot install does.
                        let upto = rng.gen_range(purged.map_or(0, |p| p.index)..next + 3);
                        let id = LogId::new(CommittedLeaderId::new(term, 1), upto);
                        purged = Some(id);
                        wal.purge(upto).unwrap();
                        model.retain(|e| e.log_id.index > upto);
                    }
                }
            }
            // The torn append: where it would go, and a prefix of its bytes, then garbage.
            let next = model.last().map_or(purged.map_or(1, |p| p.index + 1), |e| e.log_id.index + 1);
            let torn: Vec<_> = (next..next + rng.gen_range(1..4)).map(|i| entry(term, i)).collect();
            let mut bytes = Vec::new();
            for e in &torn {
                encode(e, &mut bytes).unwrap();
            }
            let (file, at) = {
                let inner = wal.inner();
                let active = inner.segments.last().unwrap();
                let follows = active.next().is_none_or(|n| n == next);
                // A torn append into a segment it would not go to is not a case; skip the seed's crash.
                (follows.then(|| active.file.clone()), active.end())
            };
            if let Some(file) = file {
                let written = if rng.gen_bool(0.3) {
                    // The disk wrote the batch's later pages but not its first: the first record is still
                    // zeros, the ones after it whole. Nothing of the batch may come back, now or after the
                    // next append (the same size, so a stale record would line up behind it).
                    let first_len = HEADER + bincode::serialized_size(&torn[0]).unwrap() as usize;
                    let mut written = bytes.clone();
                    written[..first_len].fill(0);
                    written
                } else {
                    let cut = rng.gen_range(0..=bytes.len());
                    let mut written = bytes[..cut].to_vec();
                    written.extend((0..rng.gen_range(0..20)).map(|_| rng.gen::<u8>() | 1));
                    written
                };
                file.write_all_at(&written, at).unwrap();
            }
            drop(wal);

            let wal = Wal::open(dir.path(), purged).unwrap();
            let floor = purged.map_or(0, |p| p.index + 1);
            let read = wal.read(floor, None).unwrap();
            assert!(read.len() >= model.len(), "seed {seed}: lost acknowledged entries");
            assert_eq!(read[..model.len()], model[..], "seed {seed}");
            let survived = &read[model.len()..];
            assert_eq!(survived, &torn[..survived.len()], "seed {seed}: only whole records of the torn append");
            // It takes appends again, after what it kept.
            let after = read.last().map_or(next, |e| e.log_id.index + 1);
            wal.append(&[entry(term + 1, after)]).unwrap();
            drop(wal);
            let wal = Wal::open(dir.path(), purged).unwrap();
            let mut expected = read.clone();
            expected.push(entry(term + 1, after));
            assert_eq!(wal.read(floor, None).unwrap(), expected, "seed {seed}: after one more append");
        }
    }

    #[test]
    fn a_batch_larger_than_the_room_left_starts_a_new_segment() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::open(dir.path(), None).unwrap();
        let big = |index| {
            let cmd = holdfast_core::Command::Release { name: "x".repeat(1 << 20), token: holdfast_core::Token(7) };
            Entry {
                log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
                payload: EntryPayload::Normal(holdfast_core::Entry { at_ms: index, cmd }),
            }
        };
        let per_segment = SEGMENT_BYTES / (1 << 20);
        for i in 1..=per_segment + 2 {
            wal.append(&[big(i)]).unwrap();
        }
        assert_eq!(wal.segment_count(), 2);
        drop(wal);
        let wal = Wal::open(dir.path(), None).unwrap();
        assert_eq!(indexes(&wal, per_segment - 1, None), (per_segment - 1..=per_segment + 2).collect::<Vec<_>>());
    }

    /// What one seeded run did to a log on a [`CrashFs`] before its power cut, for the check after it.
    struct CrashRun {
        /// The log as written, after its truncations: each index's log id; with the batch of an append
        /// the process died in, which it may or may not have written.
        written: Vec<LogId<NodeId>>,
        /// Every entry through this index was acknowledged durable, and not removed since.
        acked: u64,
        /// The purge point, recorded (by the caller, durably) before each purge.
        purged: Option<LogId<NodeId>>,
    }

    /// Appends (synced, or written and synced later, as a leader's own), truncations and purges at random,
    /// on segments of 8 KiB, until the process dies at a random file operation or the run ends.
    fn crash_run(fs: &Arc<CrashFs>, dir: &Path, rng: &mut rand::rngs::StdRng) -> CrashRun {
        use rand::Rng;
        let mut run = CrashRun { written: Vec::new(), acked: 0, purged: None };
        let wal = Wal::open_on(fs.clone(), 8192, dir, None, 0).unwrap();
        fs.die_after(rng.gen_range(0..400));
        let mut term = 1;
        for _ in 0..100 {
            let next = run.written.len() as u64 + 1;
            let batch: Vec<_> = (next..next + rng.gen_range(1..8)).map(|i| entry(term, i)).collect();
            let ids: Vec<_> = batch.iter().map(|e| e.log_id).collect();
            let appends = rng.gen_range(0..10);
            // Truncations reach back at most 20 entries past the acknowledged end, and never below a purge.
            let floor = run.purged.map_or(1, |p| p.index + 1).max(run.acked.saturating_sub(20)).max(1);
            let done = match appends {
                0..=5 => wal.append(&batch).map(|()| {
                    run.written.extend(&ids);
                    run.acked = run.written.len() as u64;
                }),
                6 | 7 => wal.write(&batch, true).and_then(|()| {
                    run.written.extend(&ids);
                    let syncing = wal.syncing.lock().unwrap();
                    wal.sync_written(&syncing)?;
                    run.acked = run.written.len() as u64;
                    Ok(())
                }),
                8 if next > floor => {
                    let since = rng.gen_range(floor..=next - 1);
                    // A truncation part-way may have removed any of the entries from `since` on.
                    run.acked = run.acked.min(since - 1);
                    wal.truncate(since).map(|()| {
                        run.written.truncate(since as usize - 1);
                        term += 1;
                    })
                }
                _ if run.acked > 0 => {
                    let upto = rng.gen_range(1..=run.acked);
                    run.purged = Some(run.written[upto as usize - 1]).max(run.purged);
                    wal.purge(run.purged.expect("set").index)
                }
                _ => Ok(()),
            };
            if done.is_err() {
                // The process died part-way: whatever that call wrote is unacknowledged, and an append's
                // entries may be there or not.
                if appends <= 7 && run.written.len() as u64 + 1 == next {
                    run.written.extend(ids);
                }
                break;
            }
        }
        drop(wal);
        run
    }

    /// Cuts the power after a [`crash_run`] and reopens the log: every entry acknowledged and not removed
    /// is there under its log id, and nothing else but entries written after it (no removed entry comes
    /// back, none is changed). An error says what was wrong.
    fn check_crash_run(seed: u64, lying: bool) -> Result<(), String> {
        use rand::{Rng, SeedableRng};
        let fs = Arc::new(CrashFs::new(seed, lying));
        let dir = Path::new("/store/raft-log");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let run = crash_run(&fs, dir, &mut rng);
        fs.crash();
        let floor = run.purged.map_or(1, |p| p.index + 1);
        // The store records a commit only once the log is durable through it.
        let committed = if run.acked >= floor { rng.gen_range(floor..=run.acked) } else { 0 };
        let wal = Wal::open_on(fs.clone(), 8192, dir, run.purged, committed).map_err(|e| format!("reopen: {e}"))?;
        let read: Vec<LogId<NodeId>> =
            wal.read(floor, None).map_err(|e| e.to_string())?.iter().map(|e| e.log_id).collect();
        let expected = run.written.get(floor as usize - 1..).unwrap_or_default();
        if read.len() as u64 + floor <= run.acked {
            return Err(format!(
                "acknowledged through {} but the log holds {floor}..{}",
                run.acked,
                floor + read.len() as u64
            ));
        }
        if !expected.starts_with(&read) {
            return Err(format!("read {read:?}, not a prefix of what was written: {expected:?}"));
        }
        Ok(())
    }

    /// Seeded runs on a file system that loses, at a power cut, what was not synced (but a random part of
    /// it) and the directory changes not synced, with the process dying at a random file operation: after
    /// the crash the log holds every acknowledged entry, and brings back no entry it removed.
    #[test]
    fn a_crash_at_any_point_loses_nothing_acknowledged_and_brings_back_nothing_removed() {
        let seeds = std::env::var("HOLDFAST_CRASH_SEEDS").ok().and_then(|n| n.parse().ok()).unwrap_or(300u64);
        for seed in 0..seeds {
            check_crash_run(seed, false).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        }
    }

    /// The check above catches a log acknowledged without its sync: on a file system whose syncs do
    /// nothing, some run loses an acknowledged entry.
    #[test]
    fn the_crash_check_catches_a_log_acknowledged_without_its_sync() {
        assert!((0..300).any(|seed| check_crash_run(seed, true).is_err()), "no run lost an acknowledged entry");
    }
}
