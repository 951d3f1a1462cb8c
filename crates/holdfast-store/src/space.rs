//! [`Space`]: room on the file system under the store's directory, and a reserve held there for the
//! writes a node cannot put off.
//!
//! A full disk must not make the node acknowledge what it could not store, nor stop it for good: a Raft
//! write error is fatal to openraft, and sled, once a write of its own fails, refuses everything until it
//! is opened again. So the store keeps `reserve` bytes allocated in a file of its own (`reserve`, a
//! ballast) while there is room, and watches the file system's free space (`statvfs`, every
//! [`CHECK_EVERY`]):
//!
//! - **Low**: fewer than a quarter of the reserve are free, or a write of the log found no space. The
//!   ballast is removed, which gives its bytes back to what must still be written (sled's records, the
//!   vote, a snapshot, which shortens the log), and the log takes no more appends: each waits until the
//!   disk is no longer low. A follower then acknowledges nothing; a leader stops too, and its followers,
//!   hearing nothing, elect another.
//! - **No longer low**: twice the reserve is free. The ballast is allocated again first, then the waiting
//!   appends go on: the node catches up by itself.
//!
//! A reserve of 0 keeps no ballast: the log still waits when a write finds no space, and goes on once a
//! segment's worth is free.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::StoreError;

/// How often the free space is read.
pub const CHECK_EVERY: Duration = Duration::from_millis(250);

/// The ballast's file, in the store's directory.
pub(crate) const BALLAST: &str = "reserve";

/// What the store knows of its disk's room.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Room {
    /// Bytes free for the node's user on the file system of the store's directory, at the last look.
    pub free: u64,
    /// Whether the log waits for space (see the module docs).
    pub low: bool,
}

/// The room under one store's directory; clones watch the same.
#[derive(Clone)]
pub struct Space {
    shared: Arc<Shared>,
}

struct Shared {
    dir: PathBuf,
    ballast: PathBuf,
    reserve: u64,
    room: watch::Sender<Room>,
    /// Set when the node stops: appends that wait for space give up.
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

impl Space {
    /// Watches the room under `dir` (the store's directory, which exists), keeping `reserve` bytes there
    /// while there is room: a look now, then one every [`CHECK_EVERY`] on a thread of its own, until the
    /// last clone is dropped.
    pub(crate) fn watch(dir: &Path, reserve: u64) -> Result<Space, StoreError> {
        let space = Space::look_once(dir, reserve)?;
        let weak = Arc::downgrade(&space.shared);
        std::thread::Builder::new()
            .name("holdfast-disk-space".into())
            .spawn(move || loop {
                std::thread::sleep(CHECK_EVERY);
                let Some(shared) = weak.upgrade() else { return };
                if let Err(e) = (Space { shared }).look(false) {
                    tracing::warn!(%e, "cannot read the free space of the data directory");
                }
            })
            .map_err(StoreError::Io)?;
        Ok(space)
    }

    /// The room under `dir` as one look finds it, and no thread to look again.
    fn look_once(dir: &Path, reserve: u64) -> Result<Space, StoreError> {
        let shared = Arc::new(Shared {
            dir: dir.to_owned(),
            ballast: dir.join(BALLAST),
            reserve,
            room: watch::Sender::new(Room::default()),
            closed: AtomicBool::new(false),
            looking: Mutex::new(()),
        });
        let space = Space { shared };
        space.look(false).map_err(StoreError::Io)?;
        Ok(space)
    }

    /// The room at the last look, followed as it changes.
    pub fn room(&self) -> watch::Receiver<Room> {
        self.shared.room.subscribe()
    }

    /// The bytes kept in reserve while there is room.
    pub fn reserve(&self) -> u64 {
        self.shared.reserve
    }

    /// The directory whose file system is watched.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Stops every wait for space, now and later: for a node that stops.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        self.shared.room.send_modify(|_| {});
    }

    /// Reads the free space, and moves between low and not low (see the module docs); `full`: a write
    /// just found no space, so the disk is low whatever it reads.
    fn look(&self, full: bool) -> io::Result<()> {
        let s = &self.shared;
        let _looking = s.looking.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let was_low = s.room.borrow().low;
        let mut free = free_bytes(&s.dir)?;
        let low = if full || free < s.reserve / 4 {
            if !was_low {
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
        } else if was_low {
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
        s.room.send_if_modified(|room| {
            let changed = *room != Room { free, low };
            *room = Room { free, low };
            changed
        });
        Ok(())
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

    /// A write of the log found no space: the disk is low from now on, until it reads otherwise.
    pub(crate) fn no_space(&self) {
        if let Err(e) = self.look(true) {
            tracing::warn!(%e, "cannot read the free space of the data directory");
        }
    }

    /// Waits until the disk is not low (at once when it is not); an error if the node stops meanwhile.
    pub(crate) async fn wait_for_room(&self) -> Result<(), StoreError> {
        let mut room = self.room();
        loop {
            if self.shared.closed.load(Ordering::Relaxed) {
                return Err(StoreError::NoSpace(format!(
                    "the node stopped while its log waited for room under {}",
                    self.shared.dir.display()
                )));
            }
            if !room.borrow_and_update().low {
                return Ok(());
            }
            if room.changed().await.is_err() {
                return Err(StoreError::NoSpace("the disk space watch is gone".into()));
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
        let space = Space::look_once(dir.path(), 1024 * 1024).unwrap();
        let ballast = dir.path().join(BALLAST);
        assert_eq!(std::fs::metadata(&ballast).unwrap().len(), 1024 * 1024, "the reserve is allocated");
        assert!(!space.room().borrow().low);
        space.wait_for_room().await.expect("not low: no wait");

        space.no_space();
        assert!(space.room().borrow().low, "a write that found no space makes the disk low");
        assert!(!ballast.exists(), "the reserve is given back");
        let waiting = tokio::spawn({
            let space = space.clone();
            async move { space.wait_for_room().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "an append waits while the disk is low");
        // The next look finds room (this disk is not full), allocates the reserve again and lets the wait go.
        space.look(false).unwrap();
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
        let space = Space::look_once(dir.path(), u64::MAX / 4).unwrap();
        space.no_space();
        let waiting = tokio::spawn({
            let space = space.clone();
            async move { space.wait_for_room().await }
        });
        space.close();
        let result = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("the wait ends").unwrap();
        assert!(matches!(result, Err(StoreError::NoSpace(_))), "{result:?}");
    }
}
