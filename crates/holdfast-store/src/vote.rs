//! The vote in a file of the store's own, `vote`, beside sled's copy.
//!
//! A node that forgets its vote, or finds an older one, may vote twice in a term, and two leaders of one
//! term may follow. sled keeps its own checksums but recovers what it can without a word: a byte flipped in
//! the middle of its file let a node open as if nothing had happened, and what it had recovered to was
//! checked by nothing. So the vote is also kept here, where damage is found and said: the file is the
//! bincode of the vote after its length and its CRC-32, written whole to `vote.new`, synced, renamed over
//! `vote` and the directory synced, so that a crash leaves the old vote or the new one, never a mix. A file
//! whose length or CRC does not match refuses the open, naming the file. sled's copy is still written after
//! the file's, for a build from before the file to read; the open takes it where there is no file (a
//! directory from such a build) or where it is the later vote (such a build ran on the directory since and
//! voted in sled alone): a vote only grows, so the later of the two never goes back.

use std::path::{Path, PathBuf};

use openraft::Vote;

use crate::fs::{Fs, Open};
use crate::{NodeId, StoreError};

/// The file's name in the store's directory.
pub(crate) const FILE: &str = "vote";
/// Bytes before the vote: its length and its CRC-32.
const HEADER: usize = 8;

/// The vote the file under `dir` holds; `None` if there is no file.
pub(crate) fn read(fs: &dyn Fs, dir: &Path) -> Result<Option<Vote<NodeId>>, StoreError> {
    let path = dir.join(FILE);
    let file = match fs.open(&path, Open::Existing) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::Vote(format!("{}: {e}", path.display()))),
    };
    let bytes = file
        .len()
        .and_then(|len| {
            let mut bytes = vec![0; len as usize];
            file.read_exact_at(&mut bytes, 0).map(|()| bytes)
        })
        .map_err(|e| StoreError::Vote(format!("{}: {e}", path.display())))?;
    decode(&bytes).map(Some).ok_or_else(|| {
        StoreError::Vote(format!("{} is damaged: its length or checksum does not match its bytes", path.display()))
    })
}

/// Writes `vote` to the file under `dir`, durably, replacing the one before. Blocks on disk IO.
pub(crate) fn write(fs: &dyn Fs, dir: &Path, vote: &Vote<NodeId>) -> Result<(), StoreError> {
    let new = dir.join(format!("{FILE}.new"));
    let failed = |path: &PathBuf, e: std::io::Error| StoreError::Vote(format!("{}: {e}", path.display()));
    let file = fs.open(&new, Open::Truncate).map_err(|e| failed(&new, e))?;
    file.write_all_at(&encode(vote)?, 0).and_then(|()| file.sync_all()).map_err(|e| failed(&new, e))?;
    let path = dir.join(FILE);
    fs.rename(&new, &path).map_err(|e| failed(&path, e))?;
    fs.sync_dir(dir).map_err(|e| failed(&dir.to_owned(), e))
}

fn encode(vote: &Vote<NodeId>) -> Result<Vec<u8>, StoreError> {
    let body = bincode::serialize(vote)?;
    let mut bytes = Vec::with_capacity(HEADER + body.len());
    bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    bytes.extend_from_slice(&body);
    Ok(bytes)
}

/// The vote in `bytes`, if they are one whole and intact.
fn decode(bytes: &[u8]) -> Option<Vote<NodeId>> {
    let (header, body) = bytes.split_at_checked(HEADER)?;
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
    (body.len() == len && crc32fast::hash(body) == crc).then(|| crate::codec::decode(body).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::{CrashFs, RealFs};

    #[test]
    fn a_vote_reads_back_as_written_and_replaces_the_one_before() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(&RealFs, dir.path()).unwrap(), None, "no file: no vote");
        write(&RealFs, dir.path(), &Vote::new(3, 1)).unwrap();
        assert_eq!(read(&RealFs, dir.path()).unwrap(), Some(Vote::new(3, 1)));
        write(&RealFs, dir.path(), &Vote::new_committed(4, 2)).unwrap();
        assert_eq!(read(&RealFs, dir.path()).unwrap(), Some(Vote::new_committed(4, 2)));
        assert!(!dir.path().join("vote.new").exists(), "renamed over the file");
    }

    #[test]
    fn a_damaged_or_cut_vote_file_refuses_the_open_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        write(&RealFs, dir.path(), &Vote::new_committed(4, 2)).unwrap();
        let path = dir.path().join(FILE);
        let bytes = std::fs::read(&path).unwrap();
        for damaged in [
            {
                let mut flipped = bytes.clone();
                flipped[HEADER + 1] ^= 0x10;
                flipped
            },
            bytes[..bytes.len() - 1].to_vec(),
            Vec::new(),
        ] {
            std::fs::write(&path, &damaged).unwrap();
            let Err(StoreError::Vote(what)) = read(&RealFs, dir.path()) else { panic!("a damaged vote was read") };
            assert!(what.contains(&path.display().to_string()) && what.contains("damaged"), "{what}");
        }
    }

    /// Writes vote 1, then vote 2 with the process dying after `ops` file operations, then cuts the power;
    /// answers whether the second write returned, and the vote read back after the crash.
    fn crash_during_a_write(seed: u64, ops: u64, lying: bool) -> (bool, Option<Vote<NodeId>>) {
        let fs = CrashFs::new(seed, lying);
        let dir = Path::new("/store");
        crate::fs::create_dirs(&fs, dir).unwrap();
        write(&fs, dir, &Vote::new(1, 1)).unwrap();
        fs.die_after(ops);
        let wrote = write(&fs, dir, &Vote::new_committed(2, 2)).is_ok();
        fs.crash();
        (wrote, read(&fs, dir).expect("a crash never leaves a damaged vote file"))
    }

    /// A power cut after any number of a vote write's file operations (open, write, sync, rename, directory
    /// sync), with a random part of what was not synced kept: the vote read back is the one before or the
    /// new one, and the new one once the write returned.
    #[test]
    fn a_crash_at_any_point_of_a_write_leaves_the_vote_before_or_the_new_one() {
        for seed in 0..600 {
            let (wrote, vote) = crash_during_a_write(seed, seed % 6, false);
            if wrote {
                assert_eq!(vote, Some(Vote::new_committed(2, 2)), "seed {seed}: an acknowledged vote was lost");
            } else {
                assert!(
                    vote == Some(Vote::new(1, 1)) || vote == Some(Vote::new_committed(2, 2)),
                    "seed {seed}: {vote:?}"
                );
            }
        }
    }

    /// The check above catches a store that does not sync: on a file system whose syncs do nothing, some
    /// acknowledged vote is gone after a crash.
    #[test]
    fn the_crash_check_catches_a_vote_acknowledged_without_its_sync() {
        let lost = (0..600).any(|seed| {
            let (wrote, vote) = crash_during_a_write(seed, 5, true);
            wrote && vote != Some(Vote::new_committed(2, 2))
        });
        assert!(lost, "no crash lost an acknowledged vote on a file system that syncs nothing");
    }
}
