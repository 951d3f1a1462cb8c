//! [`Fs`]: the file operations of the Raft log's segments and of the vote's file, behind a narrow seam, so
//! that a test file system can stand in for the real one ([`RealFs`]).
//!
//! The test file system ([`CrashFs`], for tests: the crate's own and those of [`crate::testing`]) keeps what a disk keeps across a power cut:
//! at a crash, each file holds what was synced, plus a random subset of the blocks written since (a disk
//! may have written some of them), cut or not to its unsynced length; a creation, removal or rename is kept only
//! if its directory was synced since, and a directory only if its parent was, with all it holds. So a store that acknowledges before it syncs, or that trusts a rename
//! whose directory it did not sync, loses what it acknowledged there, and the crash tests in `wal.rs` and
//! `vote.rs` see it.

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// How [`Fs::open`] opens a file: for reading and writing, always.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Open {
    /// The file must exist.
    Existing,
    /// The file must not exist; it is created empty.
    CreateNew,
    /// Created if missing, emptied if not.
    Truncate,
}

/// A file system, as the log and the vote use one.
pub(crate) trait Fs: Send + Sync + 'static {
    fn is_dir(&self, path: &Path) -> bool;
    /// Creates `dir`, whose parent exists (not durably: see [`create_dirs`]).
    fn create_dir(&self, dir: &Path) -> io::Result<()>;
    /// The names of the entries of `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<OsString>>;
    fn open(&self, path: &Path, how: Open) -> io::Result<Box<dyn FsFile>>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the creations, removals and renames of `dir`'s entries durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// Creates `dir` and whatever of its ancestors is missing, durably: each new directory's parent is synced,
/// so that a crash cannot take away a directory, and what was synced in it, after this returned.
pub(crate) fn create_dirs(fs: &dyn Fs, dir: &Path) -> io::Result<()> {
    let mut missing: Vec<&Path> = dir.ancestors().take_while(|d| !d.as_os_str().is_empty() && !fs.is_dir(d)).collect();
    missing.reverse();
    for new in missing {
        match fs.create_dir(new) {
            Ok(()) => {}
            // Made meanwhile by another opener: synced below all the same.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let parent = new.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        fs.sync_dir(parent)?;
    }
    Ok(())
}

/// An open file.
pub(crate) trait FsFile: Send + Sync {
    fn len(&self) -> io::Result<u64>;
    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()>;
    fn write_all_at(&self, buf: &[u8], at: u64) -> io::Result<()>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// `fallocate(2)` of the `len` bytes from `from` (growing the file to cover them).
    fn allocate(&self, from: u64, len: u64) -> io::Result<()>;
    /// Makes the file's bytes durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
    /// Makes the file's bytes and size durable (`fsync`).
    fn sync_all(&self) -> io::Result<()>;
}

/// The operating system's file system.
pub(crate) struct RealFs;

impl Fs for RealFs {
    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }

    fn create_dir(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<OsString>> {
        std::fs::read_dir(dir)?.map(|entry| entry.map(|entry| entry.file_name())).collect()
    }

    fn open(&self, path: &Path, how: Open) -> io::Result<Box<dyn FsFile>> {
        let mut options = std::fs::OpenOptions::new();
        options.read(true).write(true);
        match how {
            Open::Existing => {}
            Open::CreateNew => {
                options.create_new(true);
            }
            Open::Truncate => {
                options.create(true).truncate(true);
            }
        }
        Ok(Box::new(options.open(path)?))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        std::fs::File::open(dir)?.sync_all()
    }
}

impl FsFile for std::fs::File {
    fn len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, at)
    }

    fn write_all_at(&self, buf: &[u8], at: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, at)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        std::fs::File::set_len(self, len)
    }

    fn allocate(&self, from: u64, len: u64) -> io::Result<()> {
        crate::disk::fallocate(self, from, len)
    }

    fn sync_data(&self) -> io::Result<()> {
        std::fs::File::sync_data(self)
    }

    fn sync_all(&self) -> io::Result<()> {
        std::fs::File::sync_all(self)
    }
}

pub use crash::CrashFs;

mod crash {
    use std::collections::{BTreeMap, BTreeSet, HashMap};
    use std::ffi::OsString;
    use std::io;
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex, MutexGuard};

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::{Fs, FsFile, Open};

    /// The unit a crash keeps or loses of what was written since a file's last sync: smaller than a page
    /// cache's 4 KiB, so that the tests' small segments hold several.
    const PAGE: usize = 1024;

    /// An in-memory file system that forgets, at [`CrashFs::crash`], what a power cut may take (see the
    /// module docs); `lying`: its syncs make nothing durable, as a store that skipped them would leave it.
    pub struct CrashFs {
        state: Arc<Mutex<State>>,
    }

    struct State {
        rng: StdRng,
        lying: bool,
        /// Bumped by each crash: handles opened before it fail, as the dead process's would.
        generation: u64,
        /// Operations left before the process "dies": every one after fails. `None`: no death planned.
        ops_left: Option<u64>,
        next_inode: u64,
        /// The files' directory entries as the running process sees them, and as they are durable.
        names: BTreeMap<PathBuf, u64>,
        durable_names: BTreeMap<PathBuf, u64>,
        /// The directories, likewise (`/` is always there).
        dirs: BTreeSet<PathBuf>,
        durable_dirs: BTreeSet<PathBuf>,
        files: HashMap<u64, Contents>,
    }

    #[derive(Clone, Default)]
    struct Contents {
        current: Vec<u8>,
        durable: Vec<u8>,
    }

    struct Handle {
        state: Arc<Mutex<State>>,
        inode: u64,
        generation: u64,
    }

    fn dead() -> io::Error {
        io::Error::other("the process died (a planned crash point)")
    }

    fn root(path: &Path) -> bool {
        path.parent().is_none()
    }

    impl State {
        fn is_dir(&self, path: &Path) -> bool {
            root(path) || self.dirs.contains(path)
        }

        /// An error unless `path`'s directory exists.
        fn in_a_dir(&self, path: &Path) -> io::Result<()> {
            match path.parent() {
                Some(parent) if self.is_dir(parent) => Ok(()),
                _ => Err(io::ErrorKind::NotFound.into()),
            }
        }

        /// Counts one operation; an error once the process has "died".
        fn step(&mut self) -> io::Result<()> {
            match &mut self.ops_left {
                Some(0) => Err(dead()),
                Some(left) => {
                    *left -= 1;
                    Ok(())
                }
                None => Ok(()),
            }
        }
    }

    impl CrashFs {
        pub fn new(seed: u64, lying: bool) -> CrashFs {
            CrashFs {
                state: Arc::new(Mutex::new(State {
                    rng: StdRng::seed_from_u64(seed),
                    lying,
                    generation: 0,
                    ops_left: None,
                    next_inode: 0,
                    names: BTreeMap::new(),
                    durable_names: BTreeMap::new(),
                    dirs: BTreeSet::new(),
                    durable_dirs: BTreeSet::new(),
                    files: HashMap::new(),
                })),
            }
        }

        fn state(&self) -> MutexGuard<'_, State> {
            self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
        }

        /// After `ops` more operations, every one fails, as if the process died there.
        pub fn die_after(&self, ops: u64) {
            self.state().ops_left = Some(ops);
        }

        /// A power cut: the entries and bytes that were not made durable are lost, but for a random subset
        /// of the pages written since each file's last sync; handles opened before fail from now on.
        pub fn crash(&self) {
            let mut s = self.state();
            s.generation += 1;
            s.ops_left = None;
            // What survives: durable entries whose directories all survived.
            let mut dirs = BTreeSet::new();
            for dir in s.durable_dirs.clone() {
                if dir.parent().is_some_and(|parent| root(parent) || dirs.contains(parent)) {
                    dirs.insert(dir);
                }
            }
            let kept = |path: &PathBuf| path.parent().is_some_and(|parent| root(parent) || dirs.contains(parent));
            s.names = s.durable_names.iter().filter(|(path, _)| kept(path)).map(|(p, i)| (p.clone(), *i)).collect();
            s.durable_names = s.names.clone();
            s.dirs = dirs.clone();
            s.durable_dirs = dirs;
            let live: Vec<u64> = s.names.values().copied().collect();
            let mut files = HashMap::new();
            for inode in live {
                let contents = s.files.get(&inode).cloned().unwrap_or_default();
                let kept = survive(&mut s.rng, &contents);
                files.insert(inode, Contents { current: kept.clone(), durable: kept });
            }
            s.files = files;
        }
    }

    /// What a crash leaves of a file: its durable bytes, with each page written since taken from the
    /// newer bytes or not, at random, and its length either one.
    fn survive(rng: &mut StdRng, contents: &Contents) -> Vec<u8> {
        let Contents { current, durable } = contents;
        let len = if rng.gen_bool(0.5) { current.len() } else { durable.len() };
        let mut kept = vec![0u8; len];
        for start in (0..len).step_by(PAGE) {
            let end = (start + PAGE).min(len);
            let newer = rng.gen_bool(0.5);
            for (i, byte) in kept[start..end].iter_mut().enumerate() {
                let at = start + i;
                let (mine, other) = if newer { (current, durable) } else { (durable, current) };
                *byte = mine.get(at).or_else(|| other.get(at)).copied().unwrap_or(0);
            }
        }
        kept
    }

    impl Fs for CrashFs {
        fn is_dir(&self, path: &Path) -> bool {
            self.state().is_dir(path)
        }

        fn create_dir(&self, dir: &Path) -> io::Result<()> {
            let mut s = self.state();
            s.step()?;
            s.in_a_dir(dir)?;
            if s.is_dir(dir) || s.names.contains_key(dir) {
                return Err(io::ErrorKind::AlreadyExists.into());
            }
            s.dirs.insert(dir.to_owned());
            Ok(())
        }

        fn list(&self, dir: &Path) -> io::Result<Vec<OsString>> {
            let mut s = self.state();
            s.step()?;
            if !s.is_dir(dir) {
                return Err(io::ErrorKind::NotFound.into());
            }
            Ok(s.names
                .keys()
                .filter(|path| path.parent() == Some(dir))
                .filter_map(|p| p.file_name())
                .map(Into::into)
                .collect())
        }

        fn open(&self, path: &Path, how: Open) -> io::Result<Box<dyn FsFile>> {
            let mut s = self.state();
            s.step()?;
            let inode = match (s.names.get(path).copied(), how) {
                (Some(_), Open::CreateNew) => return Err(io::ErrorKind::AlreadyExists.into()),
                (None, Open::Existing) => return Err(io::ErrorKind::NotFound.into()),
                (Some(inode), Open::Truncate) => {
                    s.files.entry(inode).or_default().current.clear();
                    inode
                }
                (Some(inode), Open::Existing) => inode,
                (None, Open::CreateNew | Open::Truncate) => {
                    s.in_a_dir(path)?;
                    let inode = s.next_inode;
                    s.next_inode += 1;
                    s.files.insert(inode, Contents::default());
                    s.names.insert(path.to_owned(), inode);
                    inode
                }
            };
            Ok(Box::new(Handle { state: self.state.clone(), inode, generation: s.generation }))
        }

        fn remove(&self, path: &Path) -> io::Result<()> {
            let mut s = self.state();
            s.step()?;
            s.names.remove(path).map(|_| ()).ok_or_else(|| io::ErrorKind::NotFound.into())
        }

        fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
            let mut s = self.state();
            s.step()?;
            s.in_a_dir(to)?;
            let inode = s.names.remove(from).ok_or(io::Error::from(io::ErrorKind::NotFound))?;
            s.names.insert(to.to_owned(), inode);
            Ok(())
        }

        fn sync_dir(&self, dir: &Path) -> io::Result<()> {
            let mut s = self.state();
            s.step()?;
            if !s.is_dir(dir) {
                return Err(io::ErrorKind::NotFound.into());
            }
            if s.lying {
                return Ok(());
            }
            let in_dir = |path: &PathBuf| path.parent() == Some(dir);
            s.durable_names.retain(|path, _| !in_dir(path));
            let now: Vec<(PathBuf, u64)> =
                s.names.iter().filter(|(p, _)| in_dir(p)).map(|(p, i)| (p.clone(), *i)).collect();
            s.durable_names.extend(now);
            s.durable_dirs.retain(|path| !in_dir(path));
            let now: Vec<PathBuf> = s.dirs.iter().filter(|p| in_dir(p)).cloned().collect();
            s.durable_dirs.extend(now);
            Ok(())
        }
    }

    impl Handle {
        /// Runs `f` on the file's contents, unless the process died or crashed since the file was opened.
        fn with<T>(&self, f: impl FnOnce(&mut Contents, bool) -> io::Result<T>) -> io::Result<T> {
            let mut s = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if s.generation != self.generation {
                return Err(dead());
            }
            s.step()?;
            let lying = s.lying;
            let contents = s.files.entry(self.inode).or_default();
            f(contents, lying)
        }
    }

    impl FsFile for Handle {
        fn len(&self) -> io::Result<u64> {
            self.with(|c, _| Ok(c.current.len() as u64))
        }

        fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
            self.with(|c, _| {
                let at = at as usize;
                let bytes = c.current.get(at..at + buf.len()).ok_or(io::Error::from(io::ErrorKind::UnexpectedEof))?;
                buf.copy_from_slice(bytes);
                Ok(())
            })
        }

        fn write_all_at(&self, buf: &[u8], at: u64) -> io::Result<()> {
            self.with(|c, _| {
                let end = at as usize + buf.len();
                if c.current.len() < end {
                    c.current.resize(end, 0);
                }
                c.current[at as usize..end].copy_from_slice(buf);
                Ok(())
            })
        }

        fn set_len(&self, len: u64) -> io::Result<()> {
            self.with(|c, _| {
                c.current.resize(len as usize, 0);
                Ok(())
            })
        }

        fn allocate(&self, from: u64, len: u64) -> io::Result<()> {
            self.with(|c, _| {
                let end = (from + len) as usize;
                if c.current.len() < end {
                    c.current.resize(end, 0);
                }
                Ok(())
            })
        }

        fn sync_data(&self) -> io::Result<()> {
            self.with(|c, lying| {
                if !lying {
                    c.durable = c.current.clone();
                }
                Ok(())
            })
        }

        fn sync_all(&self) -> io::Result<()> {
            self.sync_data()
        }
    }
}
