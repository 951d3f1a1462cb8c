//! The vote in a file of the store's own, `vote`, sealed with its length and CRC-32 (see the `sealed`
//! module).
//!
//! A node that forgets its vote, or finds an older one, may vote twice in a term, and two leaders of one
//! term may follow. So the vote is replaced whole and durably (a crash leaves the old vote or the new one,
//! never a mix), and a file whose length or CRC does not match refuses the open, naming the file. Builds
//! of formats 2 to 4 also kept a copy in sled; the open of such a directory takes that copy where there is
//! no file or where it is the later vote (a vote only grows), once, when it converts the directory.

use std::path::Path;

use openraft::Vote;

use crate::fs::Fs;
use crate::sealed;
use crate::{NodeId, StoreError};

/// The file's name in the store's directory.
pub(crate) const FILE: &str = "vote";

/// The vote the file under `dir` holds; `None` if there is no file.
pub(crate) fn read(fs: &dyn Fs, dir: &Path) -> Result<Option<Vote<NodeId>>, StoreError> {
    sealed::read(fs, dir, FILE).map_err(|e| StoreError::Vote(e.to_string()))
}

/// Writes `vote` to the file under `dir`, durably, replacing the one before. Blocks on disk IO.
pub(crate) fn write(fs: &dyn Fs, dir: &Path, vote: &Vote<NodeId>) -> Result<(), StoreError> {
    sealed::replace(fs, dir, FILE, vote).map_err(|e| StoreError::Vote(e.to_string()))
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
                flipped[9] ^= 0x10;
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
