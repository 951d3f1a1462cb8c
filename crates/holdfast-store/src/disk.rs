//! [`Disk`]: the store's disk as the node needs to know it: whether it has room, with a reserve held there
//! for the writes a node cannot put off, and whether the log's syncs still finish.
//!
//! A disk that fills up, or whose syncs stop finishing, must not make the node acknowledge what it did not
//! store, nor stop it for good (a Raft write error is fatal to openraft), nor hold the whole cluster up. A thread looks at
//! the disk every [`CHECK_EVERY`]; while the disk is **full** or **stalled** ([`DiskState`]), the log
//! takes no more appends: each waits ([`Disk::wait_writable`]), and openraft's core waits with it. So a
//! follower acknowledges nothing, and a leader sends no heartbeats, and its followers elect another
//! (holdfast-server's `leader/disk.rs` makes an idle leader append, so that it stops too).
//!
//! **Full.** The store keeps `reserve` bytes allocated in a file of its own (`reserve`, a ballast) while
//! there is room, and reads the file system's free space (`statvfs`). Once fewer than a quarter of the
//! reserve are free, or a write of the log found no room, the ballast is removed, which gives its bytes
//! back to what must still be written (the store's records, the vote, a snapshot, which shortens the log).
//! Once twice the reserve is free, the ballast is allocated again first, then the appends go on. A
//! reserve of 0 keeps no ballast: the log waits only when a write finds no room, and goes on once a
//! segment's worth is free.
//!
//! **Stalled.** The log's oldest write still waiting for its sync (a leader's own entries, acknowledged
//! before their sync), or a sync under way, has waited `stall` or more. A leader whose fsync takes seconds
//! would otherwise keep leading a cluster that applies nothing meanwhile (nothing applies before the
//! leader's copy is durable: see the `durable` module). It goes on once the syncs catch up.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::StoreError;

/// How often the disk is looked at.
pub const CHECK_EVERY: Duration = Duration::from_millis(250);

/// The ballast's file, in the store's directory.
pub(crate) const BALLAST: &str = "reserve";

/// The store's disk at the last look.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskState {
    /// Bytes free for the node's user on the file system of the store's directory.
    pub free: u64,
    /// The disk has no room: the log waits for it (see the module docs).
    pub full: bool,
    /// How long the log's oldest unsynced write or unfinished sync had waited, if one had waited `stall`
    /// or more: the log waits for its syncs to catch up.
    pub stalled: Option<Duration>,
}

impl DiskState {
    /// Whether the log may take appends.
    pub fn writable(&self) -> bool {
        !self.full && self.stalled.is_none()
    }
}

/// Since when the log's oldest write waiting for its sync, or its sync under way, has waited.
pub(crate) type WaitingSince = Box<dyn Fn() -> Option<Instant> + Send + Sync>;

/// The disk under one store's directory; clones watch the same.
#[derive(Clone)]
pub struct Disk {
    shared: Arc<Shared>,
}

struct Shared {
    dir: PathBuf,
    ballast: PathBuf,
    reserve: u64,
    /// A wait for syncs this long or longer is a stall; `None`: syncs are not watched.
    stall: Option<Duration>,
    /// The log's syncs, once the log is open.
    syncs: std::sync::OnceLock<WaitingSince>,
    /// Run by the watching thread after each look (see [`Disk::after_each_look`]).
    chore: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
    state: watch::Sender<DiskState>,
    /// Whether the last look found the disk writable: what an append checks first, without the watch.
    writable: AtomicBool,
    /// Set when the node stops: appends that wait for the disk give up.
    closed: AtomicBool,
    /// One look at a time: a look may remove or allocate the ballast.
    looking: Mutex<()>,
}

/// Whether `e` says the file system (or the user's quota on it) has no room.
pub(crate) fn is_no_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// Bytes free for an unprivileged user on the file system holding `dir`.
fn free_bytes(dir: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: `statvfs` fills the struct it is given, which lives for the call; `path` is a C string.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}

impl Disk {
    /// Watches the disk under `dir` (the store's directory, which exists), keeping `reserve` bytes there
    /// while there is room, and taking a wait for syncs of `stall` or more as a stall: a look now, then one
    /// every [`CHECK_EVERY`] on a thread of its own, until the last clone is dropped.
    pub(crate) fn watch(dir: &Path, reserve: u64, stall: Option<Duration>) -> Result<Disk, StoreError> {
        let disk = Disk::look_once(dir, reserve, stall)?;
        let weak = Arc::downgrade(&disk.shared);
        std::thread::Builder::new()
            .name("holdfast-disk".into())
            .spawn(move || loop {
                std::thread::sleep(CHECK_EVERY);
                let Some(shared) = weak.upgrade() else { return };
                if let Err(e) = (Disk { shared: shared.clone() }).look(false) {
                    tracing::warn!(%e, "cannot read the free space of the data directory");
                }
                if let Some(chore) = shared.chore.get() {
                    chore();
                }
            })
            .map_err(StoreError::Io)?;
        Ok(disk)
    }

    /// The disk under `dir` as one look finds it, and no thread to look again.
    fn look_once(dir: &Path, reserve: u64, stall: Option<Duration>) -> Result<Disk, StoreError> {
        let disk = Disk::unwatched(dir, reserve, stall);
        disk.look(false).map_err(StoreError::Io)?;
        Ok(disk)
    }

    /// The disk under `dir`, never looked at: writable until a write finds no room. For a store on a test
    /// file system, which has no free space to read.
    pub(crate) fn unwatched(dir: &Path, reserve: u64, stall: Option<Duration>) -> Disk {
        let shared = Arc::new(Shared {
            dir: dir.to_owned(),
            ballast: dir.join(BALLAST),
            reserve,
            stall,
            syncs: std::sync::OnceLock::new(),
            chore: std::sync::OnceLock::new(),
            state: watch::Sender::new(DiskState::default()),
            writable: AtomicBool::new(true),
            closed: AtomicBool::new(false),
            looking: Mutex::new(()),
        });
        Disk { shared }
    }

    /// Has the watching thread run `chore` after each of its looks, every [`CHECK_EVERY`] (an unwatched
    /// disk never does).
    pub(crate) fn after_each_look(&self, chore: Box<dyn Fn() + Send + Sync>) {
        let _ = self.shared.chore.set(chore);
    }

    /// Has each look ask `syncs` how long the log's syncs have waited (once the log is open).
    pub(crate) fn watch_syncs(&self, syncs: WaitingSince) {
        let _ = self.shared.syncs.set(syncs);
    }

    /// The disk at the last look, followed as it changes.
    pub fn state(&self) -> watch::Receiver<DiskState> {
        self.shared.state.subscribe()
    }

    /// A wait for syncs this long or longer is a stall (`None`: syncs are not watched).
    pub fn stall(&self) -> Option<Duration> {
        self.shared.stall
    }

    /// The bytes kept in reserve while there is room.
    pub fn reserve(&self) -> u64 {
        self.shared.reserve
    }

    /// The directory whose file system is watched.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Stops every wait for the disk, now and later: for a node that stops.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        self.shared.state.send_modify(|_| {});
    }

    /// Reads the free space and the syncs' wait, and moves between full and not, stalled and not (see the
    /// module docs); `no_room`: a write just found no room, so the disk is full whatever it reads.
    fn look(&self, no_room: bool) -> io::Result<()> {
        let s = &self.shared;
        let _looking = s.looking.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let was = *s.state.borrow();
        let (free, full) = self.look_at_room(no_room, was.full)?;
        let waited = s.syncs.get().and_then(|syncs| syncs()).map(|since| since.elapsed());
        let stalled = waited.filter(|waited| s.stall.is_some_and(|stall| *waited >= stall));
        match (was.stalled, stalled) {
            (None, Some(waited)) => tracing::warn!(
                waited_ms = waited.as_millis() as u64,
                "the raft log's sync has not finished: the log takes no more entries until it does"
            ),
            (Some(_), None) => tracing::info!("the raft log's syncs finish again"),
            _ => {}
        }
        let now = DiskState { free, full, stalled };
        s.writable.store(now.writable(), Ordering::Release);
        s.state.send_if_modified(|state| {
            // A stall's growing wait alone is not a change: watchers wake when it begins or ends.
            let changed = (state.free, state.full, state.stalled.is_some()) != (free, full, stalled.is_some());
            *state = now;
            changed
        });
        Ok(())
    }

    /// The free space, and whether the disk is full now that it was `was_full` (see the module docs).
    fn look_at_room(&self, no_room: bool, was_full: bool) -> io::Result<(u64, bool)> {
        let s = &self.shared;
        let mut free = free_bytes(&s.dir)?;
        let full = if no_room || free < s.reserve / 4 {
            if !was_full {
                self.remove_ballast();
                free = free_bytes(&s.dir)?;
                tracing::warn!(
                    free,
                    reserve = s.reserve,
                    dir = %s.dir.display(),
                    "the data directory's disk is full: the raft log takes no more entries until there is room"
                );
            }
            true
        } else if was_full {
            // Twice the reserve, or a new segment's worth when there is no reserve to keep.
            let enough = (2 * s.reserve).max(if s.reserve == 0 { crate::wal::SEGMENT_BYTES } else { 0 });
            if free < enough || !self.allocate_ballast()? {
                true
            } else {
                free = free_bytes(&s.dir)?;
                tracing::info!(free, dir = %s.dir.display(), "the data directory's disk has room again");
                false
            }
        } else {
            if free >= 2 * s.reserve && self.allocate_ballast()? {
                free = free_bytes(&s.dir)?;
            }
            false
        };
        Ok((free, full))
    }

    fn remove_ballast(&self) {
        match std::fs::remove_file(&self.shared.ballast) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(%e, "cannot remove the disk reserve {}", self.shared.ballast.display()),
        }
    }

    /// Makes the ballast hold the reserve (removing it for a reserve of 0); `false` if there was no room
    /// for it (nothing is left allocated then).
    fn allocate_ballast(&self) -> io::Result<bool> {
        let s = &self.shared;
        if s.reserve == 0 {
            self.remove_ballast();
            return Ok(true);
        }
        if std::fs::metadata(&s.ballast).is_ok_and(|m| m.len() == s.reserve) {
            return Ok(true);
        }
        let file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(&s.ballast)?;
        match allocate_whole(&file, s.reserve) {
            Ok(()) => Ok(true),
            Err(e) if is_no_space(&e) => {
                drop(file);
                self.remove_ballast();
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// A write of the log found no room: the disk is full from now on, until it reads otherwise.
    pub(crate) fn no_space(&self) {
        if let Err(e) = self.look(true) {
            tracing::warn!(%e, "cannot read the free space of the data directory");
        }
    }

    /// Waits until the log may take appends, neither full nor stalled (at once when it may); an error if
    /// the node stops meanwhile.
    pub(crate) async fn wait_writable(&self) -> Result<(), StoreError> {
        if self.shared.writable.load(Ordering::Acquire) && !self.shared.closed.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut state = self.state();
        loop {
            if self.shared.closed.load(Ordering::Relaxed) {
                return Err(StoreError::DiskWait(format!(
                    "the node stopped while its log waited for the disk under {}",
                    self.shared.dir.display()
                )));
            }
            if state.borrow_and_update().writable() {
                return Ok(());
            }
            if state.changed().await.is_err() {
                return Err(StoreError::DiskWait("the disk's watch is gone".into()));
            }
        }
    }
}

/// `fallocate(2)`: gives `file` blocks for the `len` bytes from `from`.
pub(crate) fn fallocate(file: &std::fs::File, from: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if len == 0 {
        return Ok(());
    }
    // SAFETY: a plain system call on a file descriptor `file` holds for its duration.
    match unsafe { libc::fallocate(file.as_raw_fd(), 0, from as libc::off_t, len as libc::off_t) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Allocates `len` bytes to `file`: with `fallocate` where the file system has it, by writing zeros where
/// it does not (so that the bytes are really taken).
fn allocate_whole(file: &std::fs::File, len: u64) -> io::Result<()> {
    match fallocate(file, 0, len) {
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {}
        done => return done,
    }
    use std::os::unix::fs::FileExt;
    let zeros = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    file.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reserve_is_kept_while_there_is_room_and_given_back_when_a_write_finds_none() {
        let dir = tempfile::tempdir().unwrap();
        let disk = Disk::look_once(dir.path(), 1024 * 1024, None).unwrap();
        let ballast = dir.path().join(BALLAST);
        assert_eq!(std::fs::metadata(&ballast).unwrap().len(), 1024 * 1024, "the reserve is allocated");
        assert!(!disk.state().borrow().full);
        disk.wait_writable().await.expect("not full: no wait");

        disk.no_space();
        assert!(disk.state().borrow().full, "a write that found no room makes the disk full");
        assert!(!ballast.exists(), "the reserve is given back");
        let waiting = tokio::spawn({
            let disk = disk.clone();
            async move { disk.wait_writable().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "an append waits while the disk is full");
        // The next look finds room (this disk is not full), allocates the reserve again and lets the wait go.
        disk.look(false).unwrap();
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the wait ends once the disk has room")
            .unwrap()
            .expect("room");
        assert!(ballast.exists(), "the reserve is back");
    }

    #[tokio::test]
    async fn a_wait_for_room_ends_with_an_error_when_the_node_stops() {
        let dir = tempfile::tempdir().unwrap();
        // A reserve no disk here has twice of: once low, it stays low.
        let disk = Disk::look_once(dir.path(), u64::MAX / 4, None).unwrap();
        disk.no_space();
        let waiting = tokio::spawn({
            let disk = disk.clone();
            async move { disk.wait_writable().await }
        });
        disk.close();
        let result = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("the wait ends").unwrap();
        assert!(matches!(result, Err(StoreError::DiskWait(_))), "{result:?}");
    }

    #[tokio::test]
    async fn a_sync_that_waits_past_the_stall_holds_appends_until_it_finishes() {
        let dir = tempfile::tempdir().unwrap();
        let disk = Disk::look_once(dir.path(), 0, Some(Duration::from_millis(500))).unwrap();
        let since = Arc::new(Mutex::new(None::<Instant>));
        disk.watch_syncs(Box::new({
            let since = since.clone();
            move || *since.lock().unwrap()
        }));
        *since.lock().unwrap() = Some(Instant::now());
        disk.look(false).unwrap();
        assert!(disk.state().borrow().writable(), "a sync under way for less than the stall is no stall");

        *since.lock().unwrap() = Some(Instant::now() - Duration::from_secs(2));
        disk.look(false).unwrap();
        let stalled = disk.state().borrow().stalled;
        assert!(stalled.is_some_and(|waited| waited >= Duration::from_secs(2)), "{stalled:?}");
        let waiting = tokio::spawn({
            let disk = disk.clone();
            async move { disk.wait_writable().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "an append waits while the syncs are stalled");
        *since.lock().unwrap() = None;
        disk.look(false).unwrap();
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the wait ends once the sync finished")
            .unwrap()
            .expect("writable");
    }
}
