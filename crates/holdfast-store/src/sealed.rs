//! Small records in files of the store's own, sealed with their length and CRC-32: the vote, the store's
//! records, the committed log id.
//!
//! A file holds the bincode of one value after its length and its CRC-32 (8 bytes, little-endian). A
//! record is replaced in one of two ways:
//! - [`replace`]: written whole to `<name>.new`, synced, renamed over `<name>` and the directory synced,
//!   so that a crash leaves the old value or the new one, never a mix, and the new one once it returned;
//! - [`Overwritten`]: written in place and synced apart from the write, for a value that may be lost (a
//!   crash then leaves the old value, the new one, or bytes that do not match their seal, which [`read`]
//!   reports as damage).
//!
//! sled, where these records were kept until format 5, has checksums of its own but recovers what it can
//! without a word: a byte flipped in the middle of its file let a node open as if nothing had happened. A
//! sealed file whose length or CRC does not match is found and said, naming the file.

use std::io;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::fs::{Fs, Open};

/// Bytes before the value: its length and its CRC-32.
const HEADER: usize = 8;

/// Why a sealed file could not be read or written.
#[derive(Debug)]
pub(crate) enum Failed {
    /// The file system failed, on the file named.
    Io(PathBuf, io::Error),
    /// The file's bytes are not one whole value that matches its seal.
    Damaged(PathBuf),
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Io(path, e) => write!(f, "{}: {e}", path.display()),
            Failed::Damaged(path) => {
                write!(f, "{} is damaged: its length or checksum does not match its bytes", path.display())
            }
        }
    }
}

/// The value in file `name` of `dir`; `None` if there is no such file.
pub(crate) fn read<T: DeserializeOwned>(fs: &dyn Fs, dir: &Path, name: &str) -> Result<Option<T>, Failed> {
    let path = dir.join(name);
    let file = match fs.open(&path, Open::Existing) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Failed::Io(path, e)),
    };
    let bytes = file
        .len()
        .and_then(|len| {
            let mut bytes = vec![0; len as usize];
            file.read_exact_at(&mut bytes, 0).map(|()| bytes)
        })
        .map_err(|e| Failed::Io(path.clone(), e))?;
    decode(&bytes).map(Some).ok_or(Failed::Damaged(path))
}

/// Replaces file `name` of `dir` with `value`, durably (see the module docs). Blocks on disk IO.
pub(crate) fn replace<T: Serialize>(fs: &dyn Fs, dir: &Path, name: &str, value: &T) -> Result<(), Failed> {
    let new = dir.join(format!("{name}.new"));
    let file = fs.open(&new, Open::Truncate).map_err(|e| Failed::Io(new.clone(), e))?;
    file.write_all_at(&encode(value), 0).and_then(|()| file.sync_all()).map_err(|e| Failed::Io(new.clone(), e))?;
    let path = dir.join(name);
    fs.rename(&new, &path).map_err(|e| Failed::Io(path, e))?;
    fs.sync_dir(dir).map_err(|e| Failed::Io(dir.to_owned(), e))
}

/// A file written in place by [`Overwritten::write`], and synced apart from its writes.
pub(crate) struct Overwritten {
    path: PathBuf,
    file: Box<dyn crate::fs::FsFile>,
}

impl Overwritten {
    /// Opens file `name` of `dir`, creating it if missing (not durably: a lost file reads as no value).
    pub(crate) fn open(fs: &dyn Fs, dir: &Path, name: &str) -> Result<Overwritten, Failed> {
        let path = dir.join(name);
        let file = match fs.open(&path, Open::Existing) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => fs.open(&path, Open::CreateNew),
            opened => opened,
        }
        .map_err(|e| Failed::Io(path.clone(), e))?;
        Ok(Overwritten { path, file })
    }

    /// Writes `value` over what the file held, not synced. A value is never shorter than the one before
    /// it in this store's use (a fixed-size encoding), so no bytes of an older one are left after it.
    pub(crate) fn write<T: Serialize>(&self, value: &T) -> Result<(), Failed> {
        self.file.write_all_at(&encode(value), 0).map_err(|e| Failed::Io(self.path.clone(), e))
    }

    /// Makes what was written durable.
    pub(crate) fn sync(&self) -> Result<(), Failed> {
        self.file.sync_data().map_err(|e| Failed::Io(self.path.clone(), e))
    }
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let body = bincode::serialize(value).expect("the store's records always encode");
    let mut bytes = Vec::with_capacity(HEADER + body.len());
    bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    bytes.extend_from_slice(&body);
    bytes
}

/// The value in `bytes`, if they are one whole and intact.
fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    let (header, body) = bytes.split_at_checked(HEADER)?;
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
    (body.len() == len && crc32fast::hash(body) == crc).then(|| crate::codec::decode(body).ok()).flatten()
}
