//! A node whose disk changed what it had synced, on a real 3-node cluster: the node finds the damage, says
//! which file and where, and stays out rather than serve or cut what the cluster committed; the others keep
//! serving, and no grant is lost.

use std::path::PathBuf;

use crate::common::{Cluster, Grant, EXIT_BOUND};

/// The newest log segment of the node whose data directory is `data_dir`, and how many bytes of it were
/// written (the rest of its allocated space is zeros).
fn newest_segment(data_dir: &std::path::Path) -> (PathBuf, usize) {
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
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    let mut grants = Vec::new();
    for i in 0..40 {
        let reply = cluster.acquire(leader, &format!("damage-{i}"), "holder", "300s").await;
        grants.push(Grant::from_reply(&reply, "an acquire before the damage"));
    }
    // A read through the follower applies there everything the leader had applied (a barrier), and a
    // snapshot taken there flushes its record of the commit: entries through it were synced here.
    cluster.get(follower, "/v1/locks/damage-39").await.ok("a read through the follower");
    cluster.post(follower, "/v1/cluster/snapshot").await.ok("a snapshot of the follower");
    cluster.stop(follower);

    let (segment, written) = newest_segment(cluster.data_dir(follower));
    let mut bytes = std::fs::read(&segment).expect("read the segment");
    let middle = written / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&segment, &bytes).expect("write the damaged segment");

    cluster.respawn(follower);
    let status = cluster.wait_exited(follower, EXIT_BOUND);
    assert!(!status.success(), "the damaged follower exited with {status}");
    let log = cluster.log(follower);
    let name = segment.file_name().expect("a file name").to_string_lossy().into_owned();
    let refused = log.lines().find(|line| line.contains("has a bad record at byte")).unwrap_or_else(|| {
        panic!(
            "the follower's log does not say where the damage is: {}",
            log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
        )
    });
    assert!(refused.contains(&name), "the error names the segment's file: {refused}");
    assert!(refused.contains("were committed"), "the error says why it is not a torn tail: {refused}");
    assert_eq!(std::fs::read(&segment).expect("read the segment again"), bytes, "the follower cut nothing");

    // The two others serve: every grant still held under its fence, and a new one above them all.
    let other = cluster.other_than(&[leader, follower]);
    for grant in &grants {
        let held = cluster.get(other, &format!("/v1/locks/{}", grant.name)).await;
        let fence = held.ok("a read of a lock granted before the damage")["holder"]["fence"].as_u64();
        assert_eq!(fence, Some(grant.fence), "{} is still held under its fence", grant.name);
    }
    let newest = grants.iter().map(|grant| grant.fence).max().expect("grants");
    let after = Grant::from_reply(&cluster.acquire(other, "damage-after", "later", "60s").await, "an acquire after");
    assert!(after.fence > newest, "fence {} after {newest}", after.fence);
}

/// The snapshot file of a stopped follower with bits flipped in its middle: restarted, the follower refuses
/// to restore it, with an error naming the file, and exits; the others keep serving every lock.
#[tokio::test]
async fn a_follower_with_a_damaged_snapshot_file_stops_naming_the_file() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    let mut grants = Vec::new();
    for i in 0..40 {
        let reply = cluster.acquire(leader, &format!("snap-{i}"), "holder", "300s").await;
        grants.push(Grant::from_reply(&reply, "an acquire before the damage"));
    }
    cluster.get(follower, "/v1/locks/snap-39").await.ok("a read through the follower");
    cluster.post(follower, "/v1/cluster/snapshot").await.ok("a snapshot of the follower");
    cluster.stop(follower);

    let snapshots = cluster.data_dir(follower).join("snapshots");
    let files: Vec<PathBuf> =
        std::fs::read_dir(&snapshots).expect("read snapshots/").map(|entry| entry.expect("an entry").path()).collect();
    let [file] = &files[..] else { panic!("one snapshot file, found {files:?}") };
    let mut bytes = std::fs::read(file).expect("read the snapshot file");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(file, &bytes).expect("write the damaged snapshot file");

    cluster.respawn(follower);
    let status = cluster.wait_exited(follower, EXIT_BOUND);
    assert!(!status.success(), "the damaged follower exited with {status}");
    let log = cluster.log(follower);
    let name = file.file_name().expect("a file name").to_string_lossy().into_owned();
    let refused = log.lines().find(|line| line.contains("the stored snapshot is corrupt")).unwrap_or_else(|| {
        panic!(
            "the follower's log does not say the snapshot is damaged: {}",
            log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
        )
    });
    assert!(refused.contains(&name), "the error names the snapshot's file: {refused}");

    let other = cluster.other_than(&[leader, follower]);
    for grant in &grants {
        let held = cluster.get(other, &format!("/v1/locks/{}", grant.name)).await;
        let fence = held.ok("a read of a lock granted before the damage")["holder"]["fence"].as_u64();
        assert_eq!(fence, Some(grant.fence), "{} is still held under its fence", grant.name);
    }
}

/// The vote's file of a stopped follower with a bit flipped: restarted, the follower refuses to start
/// rather than vote without knowing what it voted, with an error naming the file; the others serve.
#[tokio::test]
async fn a_follower_with_a_damaged_vote_file_stops_naming_the_file() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    let grant = Grant::from_reply(&cluster.acquire(leader, "vote-damage", "holder", "300s").await, "an acquire");
    cluster.stop(follower);

    let file = cluster.data_dir(follower).join("vote");
    let mut bytes = std::fs::read(&file).expect("the follower has a vote file");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&file, &bytes).expect("write the damaged vote file");

    cluster.respawn(follower);
    let status = cluster.wait_exited(follower, EXIT_BOUND);
    assert!(!status.success(), "the damaged follower exited with {status}");
    let log = cluster.log(follower);
    let refused = log.lines().find(|line| line.contains("vote file:")).unwrap_or_else(|| {
        panic!(
            "the follower's log does not say its vote is damaged: {}",
            log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
        )
    });
    assert!(refused.contains(&file.display().to_string()), "the error names the file: {refused}");

    let other = cluster.other_than(&[leader, follower]);
    let held = cluster.get(other, "/v1/locks/vote-damage").await;
    assert_eq!(held.ok("a read of the lock")["holder"]["fence"].as_u64(), Some(grant.fence));
}
