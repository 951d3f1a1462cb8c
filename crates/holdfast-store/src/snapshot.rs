//! [`SnapshotData`]: a snapshot's bytes as openraft moves them (built here, sent to a follower, received
//! from the leader), and their encoding and decoding as a stream.
//!
//! The disk store keeps a snapshot in a file of its own and reads and writes it a buffer at a time, so
//! that no node ever holds a whole encoding in memory (about 110 bytes per held lock: 107 MiB for a
//! million); the memory store keeps it in memory. Either way it is [`LockState::snapshot`]'s encoding,
//! byte for byte, and that is what travels between nodes.

use std::io::{self, Cursor, Read, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use holdfast_core::LockState;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

use crate::fs::{Fs, FsFile};
use crate::runtime::blocking;
use crate::StoreError;

/// The size of the buffer a snapshot is encoded through and decoded from.
const BUFFER_BYTES: usize = 1 << 20;

/// A snapshot's bytes ([`LockState::snapshot`]'s encoding of the lock state), in memory or in a file of
/// the node's storage: openraft's `SnapshotData`. openraft reads it to send it in chunks and writes
/// what it receives into one the store made.
pub struct SnapshotData {
    inner: Inner,
}

enum Inner {
    Memory(Cursor<Vec<u8>>),
    File(FileData),
}

struct FileData {
    fs: Arc<dyn Fs>,
    file: Box<dyn FsFile>,
    path: PathBuf,
    /// Where openraft's next read or write of a chunk goes (it seeks before each).
    pos: u64,
    /// Whether the file is removed when this is dropped: true until a store keeps it as its current
    /// snapshot, so that a build that was not kept, or a transfer the leader gave up, leaves nothing behind.
    temporary: bool,
}

impl Drop for FileData {
    fn drop(&mut self) {
        if self.temporary {
            if let Err(e) = self.fs.remove(&self.path) {
                tracing::warn!(path = %self.path.display(), "cannot remove an unused snapshot file: {e}");
            }
        }
    }
}

/// How many bytes a snapshot has and their CRC-32: the disk store keeps it beside the file's name, and
/// checks the file against it when it reads it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Summary {
    pub(crate) len: u64,
    pub(crate) crc: u32,
}

impl SnapshotData {
    /// `bytes`, in memory.
    pub(crate) fn in_memory(bytes: Vec<u8>) -> Self {
        Self { inner: Inner::Memory(Cursor::new(bytes)) }
    }

    /// The file `file` at `path` of `fs`; removed when dropped if `temporary` (see
    /// [`SnapshotData::kept_at`]).
    pub(crate) fn in_file(fs: Arc<dyn Fs>, file: Box<dyn FsFile>, path: PathBuf, temporary: bool) -> Self {
        Self { inner: Inner::File(FileData { fs, file, path, pos: 0, temporary }) }
    }

    /// Where the bytes are, if in a file.
    pub(crate) fn path(&self) -> Option<&Path> {
        match &self.inner {
            Inner::Memory(_) => None,
            Inner::File(data) => Some(&data.path),
        }
    }

    /// Whether the bytes are in a file made in `dir` for a new snapshot, not kept yet.
    pub(crate) fn is_new_in(&self, dir: &Path) -> bool {
        match &self.inner {
            Inner::Memory(_) => false,
            Inner::File(data) => data.temporary && data.path.parent() == Some(dir),
        }
    }

    /// Records that the file was moved to `path` and is kept there: it is no longer removed when dropped.
    pub(crate) fn kept_at(&mut self, path: PathBuf) {
        if let Inner::File(data) = &mut self.inner {
            data.path = path;
            data.temporary = false;
        }
    }

    /// Replaces the bytes with `state`'s snapshot; their summary. The encoding runs off the async
    /// workers (see [`blocking`]).
    pub(crate) async fn encode(&mut self, state: LockState) -> Result<Summary, StoreError> {
        match &mut self.inner {
            Inner::Memory(cursor) => {
                let bytes = blocking(move || state.snapshot());
                let summary = Summary { len: bytes.len() as u64, crc: crc32fast::hash(&bytes) };
                *cursor = Cursor::new(bytes);
                Ok(summary)
            }
            Inner::File(data) => blocking(|| {
                data.file.set_len(0).map_err(StoreError::SnapshotFile)?;
                encode(&state, At::new(data.file.as_ref()))
            }),
        }
    }

    /// The lock state the bytes hold, read from their start to their end, and their summary. The decoding
    /// runs off the async workers (see [`blocking`]).
    pub(crate) async fn decode(&mut self) -> Result<(LockState, Summary), StoreError> {
        match &mut self.inner {
            Inner::Memory(cursor) => blocking(|| {
                let bytes = cursor.get_ref().as_slice();
                decode(bytes, bytes.len() as u64)
            }),
            Inner::File(data) => blocking(|| {
                let len_bytes = data.file.len().map_err(StoreError::SnapshotFile)?;
                decode(At::new(data.file.as_ref()), len_bytes)
            }),
        }
    }

    /// Writes the bytes over what `to`, a file, held; a buffer at a time, off the async workers.
    pub(crate) async fn copy_to(&mut self, to: &mut SnapshotData) -> Result<(), StoreError> {
        let Inner::File(target) = &to.inner else {
            return Err(StoreError::SnapshotFile(io::Error::other("a snapshot is copied only into a file")));
        };
        let copy = |from: &mut dyn Read| -> io::Result<()> {
            target.file.set_len(0)?;
            let mut to = io::BufWriter::with_capacity(BUFFER_BYTES, At::new(target.file.as_ref()));
            io::copy(from, &mut to)?;
            to.flush()
        };
        match &mut self.inner {
            Inner::Memory(cursor) => blocking(|| copy(&mut cursor.get_ref().as_slice())),
            Inner::File(data) => blocking(|| copy(&mut At::new(data.file.as_ref()))),
        }
        .map_err(StoreError::SnapshotFile)
    }

    /// Makes the bytes durable: a file's contents and size are synced; bytes in memory have nowhere to go.
    pub(crate) async fn sync(&mut self) -> Result<(), StoreError> {
        match &mut self.inner {
            Inner::Memory(_) => Ok(()),
            Inner::File(data) => blocking(|| data.file.sync_all()).map_err(StoreError::SnapshotFile),
        }
    }

    /// The bytes, whole: for the memory store, which keeps them so.
    pub(crate) async fn into_bytes(mut self) -> Result<Vec<u8>, StoreError> {
        match &mut self.inner {
            Inner::Memory(cursor) => Ok(std::mem::take(cursor.get_mut())),
            Inner::File(data) => blocking(|| {
                let mut bytes = Vec::new();
                At::new(data.file.as_ref()).read_to_end(&mut bytes).map(|_| bytes)
            })
            .map_err(StoreError::SnapshotFile),
        }
    }
}

/// A blocking reader and writer of a snapshot's file, from its start.
pub(crate) struct At<'a> {
    file: &'a dyn FsFile,
    pos: u64,
    /// The file's length, for reads: looked up at the first.
    len: Option<u64>,
}

impl<'a> At<'a> {
    pub(crate) fn new(file: &'a dyn FsFile) -> Self {
        At { file, pos: 0, len: None }
    }
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let len = match self.len {
            Some(len) => len,
            None => *self.len.insert(self.file.len()?),
        };
        read_at(self.file, &mut self.pos, len, buf)
    }
}

impl Write for At<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write_all_at(buf, self.pos)?;
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads into `buf` what `file` (`len` long) holds from `pos` on, moving `pos` past it; 0 at the end.
fn read_at(file: &dyn FsFile, pos: &mut u64, len: u64, buf: &mut [u8]) -> io::Result<usize> {
    let n = (len.saturating_sub(*pos)).min(buf.len() as u64) as usize;
    file.read_exact_at(&mut buf[..n], *pos)?;
    *pos += n as u64;
    Ok(n)
}

// openraft reads and writes a snapshot's chunks through these, on the async workers: each read or write
// runs through `blocking`, as tokio's own files run theirs on its blocking pool.

impl AsyncRead for SnapshotData {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Memory(cursor) => Pin::new(cursor).poll_read(cx, buf),
            Inner::File(data) => Poll::Ready(blocking(|| {
                let len = data.file.len()?;
                let read = read_at(data.file.as_ref(), &mut data.pos, len, buf.initialize_unfilled())?;
                buf.advance(read);
                Ok(())
            })),
        }
    }
}

impl AsyncWrite for SnapshotData {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().inner {
            Inner::Memory(cursor) => Pin::new(cursor).poll_write(cx, buf),
            Inner::File(data) => Poll::Ready(blocking(|| {
                data.file.write_all_at(buf, data.pos)?;
                data.pos += buf.len() as u64;
                Ok(buf.len())
            })),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Memory(cursor) => Pin::new(cursor).poll_flush(cx),
            Inner::File(_) => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Memory(cursor) => Pin::new(cursor).poll_shutdown(cx),
            Inner::File(_) => Poll::Ready(Ok(())),
        }
    }
}

impl AsyncSeek for SnapshotData {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> io::Result<()> {
        match &mut self.get_mut().inner {
            Inner::Memory(cursor) => Pin::new(cursor).start_seek(position),
            Inner::File(data) => {
                let invalid = || io::Error::new(io::ErrorKind::InvalidInput, "a seek before the file's start");
                data.pos = match position {
                    SeekFrom::Start(at) => at,
                    SeekFrom::Current(by) => data.pos.checked_add_signed(by).ok_or_else(invalid)?,
                    SeekFrom::End(by) => data.file.len()?.checked_add_signed(by).ok_or_else(invalid)?,
                };
                Ok(())
            }
        }
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        match &mut self.get_mut().inner {
            Inner::Memory(cursor) => Pin::new(cursor).poll_complete(cx),
            Inner::File(data) => Poll::Ready(Ok(data.pos)),
        }
    }
}

impl std::fmt::Debug for SnapshotData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Inner::Memory(cursor) => write!(f, "SnapshotData({} bytes in memory)", cursor.get_ref().len()),
            Inner::File(data) => write!(f, "SnapshotData({})", data.path.display()),
        }
    }
}

/// Writes `state`'s snapshot to `out` a buffer at a time; what was written, summed.
pub(crate) fn encode(state: &LockState, out: impl Write) -> Result<Summary, StoreError> {
    let mut out = io::BufWriter::with_capacity(BUFFER_BYTES, Summing::new(out));
    state.write_snapshot(&mut out)?;
    let summing = out.into_inner().map_err(|e| StoreError::SnapshotFile(e.into_error()))?;
    Ok(summing.summary())
}

/// The lock state in a snapshot's bytes, read from `input` (`len_bytes` long) a buffer at a time up to its
/// end, and the summary of what was read. Bytes after the state are refused, and the state is checked: a
/// snapshot that breaks an invariant is a bug, not an input to run with.
pub(crate) fn decode(input: impl Read, len_bytes: u64) -> Result<(LockState, Summary), StoreError> {
    let (state, summary) = decode_unchecked(input, len_bytes)?;
    state.check_invariants();
    Ok((state, summary))
}

/// [`decode`] without the check of the state's invariants: for bytes that may not be what was written,
/// until their summary says they are (changed bytes can decode, to a state that breaks one).
pub(crate) fn decode_unchecked(input: impl Read, len_bytes: u64) -> Result<(LockState, Summary), StoreError> {
    let mut input = io::BufReader::with_capacity(BUFFER_BYTES, Summing::new(input));
    let state = LockState::read_snapshot(&mut input, len_bytes)?;
    let mut after = [0; 1];
    if input.read(&mut after).map_err(StoreError::SnapshotFile)? != 0 {
        return Err(StoreError::SnapshotCorrupt("bytes follow the lock state".into()));
    }
    Ok((state, input.into_inner().summary()))
}

/// A reader or writer that counts and sums the bytes that pass through it.
struct Summing<T> {
    inner: T,
    len: u64,
    crc: crc32fast::Hasher,
}

impl<T> Summing<T> {
    fn new(inner: T) -> Self {
        Self { inner, len: 0, crc: crc32fast::Hasher::new() }
    }

    fn summary(self) -> Summary {
        Summary { len: self.len, crc: self.crc.finalize() }
    }

    fn passed(&mut self, bytes: &[u8]) {
        self.len += bytes.len() as u64;
        self.crc.update(bytes);
    }
}

impl<W: Write> Write for Summing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.passed(&buf[..written]);
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Summing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.passed(&buf[..read]);
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use holdfast_core::{Command, Entry};

    use super::*;
    use crate::fs::{Open, RealFs};

    fn state() -> LockState {
        let mut state = LockState::new();
        for id in 1..=100 {
            let secret = holdfast_core::SessionSecret(holdfast_core::Token(id.into())).digest();
            let cmd = Command::OpenSession { id, owner: format!("worker-{id}"), lease_ms: 2_000, secret };
            state.apply(id, &Entry { at_ms: 1_000 + id, cmd });
        }
        state
    }

    #[test]
    fn a_stream_encoding_is_the_snapshot_and_its_summary_sums_it() {
        let state = state();
        let mut bytes = Vec::new();
        let summary = encode(&state, &mut bytes).unwrap();
        assert_eq!(bytes, state.snapshot());
        assert_eq!(summary, Summary { len: bytes.len() as u64, crc: crc32fast::hash(&bytes) });

        let (decoded, read) = decode(bytes.as_slice(), bytes.len() as u64).unwrap();
        assert_eq!(decoded.snapshot(), bytes);
        assert_eq!(read, summary);
    }

    #[test]
    fn bytes_after_the_state_are_refused() {
        let mut bytes = state().snapshot();
        bytes.push(0);
        let refused = decode(bytes.as_slice(), bytes.len() as u64).unwrap_err();
        assert_eq!(refused.to_string(), "the stored snapshot is corrupt: bytes follow the lock state");
    }

    #[tokio::test]
    async fn a_file_is_encoded_over_what_it_held_and_a_temporary_one_is_removed_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("1.new");
        std::fs::write(&path, vec![7; 100_000]).unwrap();
        let file = RealFs.open(&path, Open::Existing).unwrap();
        let mut data = SnapshotData::in_file(Arc::new(RealFs), file, path.clone(), true);
        let summary = data.encode(state()).await.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), state().snapshot(), "the earlier, longer contents are gone");
        let (decoded, read) = data.decode().await.unwrap();
        assert_eq!((decoded.snapshot(), read), (state().snapshot(), summary));
        drop(data);
        assert!(!path.exists());

        let kept_path = dir.path().join("1.snapshot");
        std::fs::write(&path, b"x").unwrap();
        let file = RealFs.open(&path, Open::Existing).unwrap();
        let mut kept = SnapshotData::in_file(Arc::new(RealFs), file, path.clone(), true);
        std::fs::rename(&path, &kept_path).unwrap();
        kept.kept_at(kept_path.clone());
        drop(kept);
        assert!(kept_path.exists());
    }
}
