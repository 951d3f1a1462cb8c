//! A node whose disk changed what it had synced, on a real 3-node cluster: the node finds the damage, says
//! which file and where, and stays out rather than serve or cut what the cluster committed; the others keep
//! serving, and no grant is lost.

use std::path::{Path, PathBuf};

use crate::common::{Cluster, Grant, EXIT_BOUND};

/// A cluster whose leader granted 40 locks named `PREFIX-N`, and one of its followers, stopped once it
/// had applied them all and snapshot its state. The read through the follower applies there everything
/// the leader had applied (a barrier), and the snapshot flushes its record of the commit: entries through
/// it were synced there.
async fn stopped_follower_after_grants(prefix: &str) -> (Cluster, usize, usize, Vec<Grant>) {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    let mut grants = Vec::new();
    for i in 0..40 {
        let reply = cluster.acquire(leader, &format!("{prefix}-{i}"), "holder", "300s").await;
        grants.push(Grant::from_reply(&reply, "an acquire before the damage"));
    }
    cluster.get(follower, &format!("/v1/locks/{prefix}-39")).await.ok("a read through the follower");
    cluster.post(follower, "/v1/cluster/snapshot").await.ok("a snapshot of the follower");
    cluster.stop(follower);
    (cluster, leader, follower, grants)
}

/// Flips the bits of the byte at `at` in `file`; answers the file's bytes as left.
fn flip(file: &Path, at: impl FnOnce(usize) -> usize) -> Vec<u8> {
    let mut bytes = std::fs::read(file).expect("read the file to damage");
    let at = at(bytes.len());
    bytes[at] ^= 0xff;
    std::fs::write(file, &bytes).expect("write the damaged file");
    bytes
}

/// Starts the damaged `follower` again, checks that it exits with an error, and answers the line of its
/// log that holds `said`, which must also name `file`.
fn refusal(cluster: &mut Cluster, follower: usize, said: &str, file: &Path) -> String {
    cluster.respawn(follower);
    let status = cluster.wait_exited(follower, EXIT_BOUND);
    assert!(!status.success(), "the damaged follower exited with {status}");
    let log = cluster.log(follower);
    let refused = log.lines().find(|line| line.contains(said)).map(str::to_owned).unwrap_or_else(|| {
        let tail = log.lines().rev().take(20).collect::<Vec<_>>().join("\n");
        panic!("the follower's log does not say {said:?}: {tail}")
    });
    let name = file.file_name().expect("a file name").to_string_lossy().into_owned();
    assert!(refused.contains(&name), "the error names the damaged file: {refused}");
    refused
}

/// Every grant in `grants` is still held under its fence, as node `other` answers.
async fn still_held(cluster: &Cluster, other: usize, grants: &[Grant]) {
    for grant in grants {
        let held = cluster.get(other, &format!("/v1/locks/{}", grant.name)).await;
        let fence = held.ok("a read of a lock granted before the damage")["holder"]["fence"].as_u64();
        assert_eq!(fence, Some(grant.fence), "{} is still held under its fence", grant.name);
    }
}

/// The newest log segment of the node whose data directory is `data_dir`, and how many bytes of it were
/// written (the rest of its allocated space is zeros).
fn newest_segment(data_dir: &Path) -> (PathBuf, usize) {
    let mut segments: Vec<PathBuf> = std::fs::read_dir(data_dir.join("raft-log"))
        .expect("read the node's log directory")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.file_name().is_some_and(|name| name.to_string_lossy().starts_with("segment-")))
        .collect();
    segments.sort();
    let path = segments.pop().expect("the node has a log segment");
    let bytes = std::fs::read(&path).expect("read the segment");
    let written = bytes.iter().rposition(|&b| b != 0).map_or(0, |last| last + 1);
    (path, written)
}

/// Eight bits flipped in the middle of a stopped follower's newest log segment, among entries the
/// cluster committed and the follower had synced: restarted, the follower refuses to open its log, with an
/// error naming the segment's file and the byte of the bad record, and exits; it cuts nothing (the file is
/// as the test left it). Until it refused them, such bits were taken for a crash's torn tail: the log was
/// cut there, the committed entries after it dropped, and openraft failed to start with no cause given.
/// The two other nodes keep serving, every lock granted before is still held under its fence, and a new
/// grant's fence is above them all.
#[tokio::test]
async fn a_follower_with_flipped_bits_among_committed_entries_stops_naming_the_file_and_byte() {
    let (mut cluster, leader, follower, grants) = stopped_follower_after_grants("damage").await;
    let (segment, written) = newest_segment(cluster.data_dir(follower));
    let bytes = flip(&segment, |_| written / 2);

    let refused = refusal(&mut cluster, follower, "has a bad record at byte", &segment);
    assert!(refused.contains("were committed"), "the error says why it is not a torn tail: {refused}");
    assert_eq!(std::fs::read(&segment).expect("read the segment again"), bytes, "the follower cut nothing");

    let other = cluster.other_than(&[leader, follower]);
    still_held(&cluster, other, &grants).await;
    let newest = grants.iter().map(|grant| grant.fence).max().expect("grants");
    let after = Grant::from_reply(&cluster.acquire(other, "damage-after", "later", "60s").await, "an acquire after");
    assert!(after.fence > newest, "fence {} after {newest}", after.fence);
}

/// The snapshot file of a stopped follower with bits flipped in its middle: restarted, the follower refuses
/// to restore it, with an error naming the file, and exits; the others keep serving every lock.
#[tokio::test]
async fn a_follower_with_a_damaged_snapshot_file_stops_naming_the_file() {
    let (mut cluster, leader, follower, grants) = stopped_follower_after_grants("snap").await;
    let snapshots = cluster.data_dir(follower).join("snapshots");
    let files: Vec<PathBuf> =
        std::fs::read_dir(&snapshots).expect("read snapshots/").map(|entry| entry.expect("an entry").path()).collect();
    let [file] = &files[..] else { panic!("one snapshot file, found {files:?}") };
    flip(file, |len| len / 2);

    refusal(&mut cluster, follower, "the stored snapshot is corrupt", file);
    let other = cluster.other_than(&[leader, follower]);
    still_held(&cluster, other, &grants).await;
}

/// The vote's file of a stopped follower with a bit flipped: restarted, the follower refuses to start
/// rather than vote without knowing what it voted, with an error naming the file; the others serve.
#[tokio::test]
async fn a_follower_with_a_damaged_vote_file_stops_naming_the_file() {
    let (mut cluster, leader, follower, grants) = stopped_follower_after_grants("vote").await;
    let file = cluster.data_dir(follower).join("vote");
    flip(&file, |len| len - 1);

    refusal(&mut cluster, follower, "vote file:", &file);
    let other = cluster.other_than(&[leader, follower]);
    still_held(&cluster, other, &grants).await;
}
