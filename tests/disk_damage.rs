//! A node whose disk changed what it had synced, on a real 3-node cluster: the node finds the damage and
//! says which file and where. A damaged log is cut there and the node votes only once it has caught up; a
//! damaged snapshot is replaced by a member's; a damaged vote or records file keeps the node out. The
//! others keep serving, and no grant is lost.

use std::path::{Path, PathBuf};

use crate::common::{wait_for, Cluster, Grant, ELECTION_BOUND, EXIT_BOUND};

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

/// Waits until the damaged `follower` (started again) says on `/readyz` that its storage refused to open,
/// with `said` and the name of `file`, and checks it is alive (`/livez` 200), says so in
/// `holdfast_storage_refused` (1), and answers a request with 503 problem+json.
async fn says_it_is_out(cluster: &Cluster, follower: usize, said: &str, file: &Path) {
    let name = file.file_name().expect("a file name").to_string_lossy().into_owned();
    let ready = wait_for(EXIT_BOUND, "the damaged follower to say why on /readyz", async || {
        match cluster.try_get(follower, "/readyz").await {
            Ok(reply) if reply.status == 503 && reply.body.as_str().is_some_and(|body| body.contains(said)) => {
                Ok(reply)
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let body = ready.body.as_str().unwrap_or_default().to_owned();
    assert!(body.contains("storage refused") && body.contains(&name), "/readyz names the damaged file: {body}");
    assert_eq!(cluster.get(follower, "/livez").await.status, 200, "alive while out");
    assert_eq!(cluster.metric(follower, "holdfast_storage_refused").await, Some(1.0));
    let write = cluster.acquire(follower, "through-the-damaged-node", "holder", "60s").await;
    write.assert_problem(503, "unavailable", "a write through a node whose storage refused to open");
}

/// The line of node `id`'s log that says `said`; panics with the log's tail if none does.
fn log_line(cluster: &Cluster, id: usize, said: &str) -> String {
    let log = cluster.log(id);
    log.lines().find(|line| line.contains(said)).map(str::to_owned).unwrap_or_else(|| {
        let tail = log.lines().rev().take(20).collect::<Vec<_>>().join("\n");
        panic!("node {id}'s log does not say {said:?}: {tail}")
    })
}

/// Starts the damaged `follower` again and checks that it stays out of the cluster saying why
/// ([`says_it_is_out`]; a restart would find the same damage); then stops it, which exits with an error.
/// Answers the line of its log that says `said`, which names `file`.
async fn refusal(cluster: &mut Cluster, follower: usize, said: &str, file: &Path) -> String {
    cluster.respawn(follower);
    says_it_is_out(cluster, follower, said, file).await;
    let status = cluster.stop(follower);
    assert!(!status.success(), "the damaged follower exits with an error when stopped: {status}");
    let refused = log_line(cluster, follower, said);
    let name = file.file_name().expect("a file name").to_string_lossy().into_owned();
    assert!(refused.contains(&name), "the error names the damaged file: {refused}");
    refused
}

/// The one snapshot file of the node whose data directory is `data_dir`.
fn snapshot_file(data_dir: &Path) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(data_dir.join("snapshots"))
        .expect("read snapshots/")
        .map(|entry| entry.expect("an entry").path())
        .collect();
    let [file] = &files[..] else { panic!("one snapshot file, found {files:?}") };
    file.clone()
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
/// cluster committed and the follower had synced: restarted, the follower finds the bad record (where,
/// until such bits were refused, they were taken for a crash's torn tail and the committed entries after
/// it dropped without a word), cuts its log there, naming the segment's file and the byte in its log, holds
/// its votes until its log has caught up with its leader's, and rejoins: ready, holding every lock
/// granted before under its fence; a new grant through it is fenced above them all.
#[tokio::test]
async fn a_follower_with_flipped_bits_among_committed_entries_cuts_its_log_there_and_catches_up() {
    let (mut cluster, _leader, follower, grants) = stopped_follower_after_grants("damage").await;
    let (segment, written) = newest_segment(cluster.data_dir(follower));
    flip(&segment, |_| written / 2);

    cluster.restart(follower).await;
    let cut = log_line(&cluster, follower, "cut the damaged raft log");
    let name = segment.file_name().expect("a file name").to_string_lossy().into_owned();
    assert!(cut.contains("has a bad record at byte") && cut.contains(&name), "the log names file and byte: {cut}");
    log_line(&cluster, follower, "this node votes again");
    assert_eq!(cluster.metric(follower, "holdfast_storage_catching_up").await, Some(0.0));
    cluster.holds(follower, &grants).await;
    let newest = grants.iter().map(|grant| grant.fence).max().expect("grants");
    let after = Grant::from_reply(&cluster.acquire(follower, "damage-after", "later", "60s").await, "an acquire after");
    assert!(after.fence > newest, "fence {} after {newest}", after.fence);
}

/// Grants the cluster committed while one follower was down, so that only the leader and the other
/// follower held them; that follower's disk then damaged them. With the leader down, the two others could
/// elect a leader without those grants (the damaged one, whose cut log is still longer than the other's)
/// and lose them. The damaged follower, its log cut, grants no vote and does not campaign until its log has
/// caught up with a leader's: it says so on `/readyz`, the other follower's pre-votes keep failing, and no
/// leader is elected; once the old leader is back, it leads, the damaged follower catches up, and every
/// grant is held through every node.
#[tokio::test]
async fn a_follower_whose_damaged_log_was_cut_grants_no_vote_until_it_caught_up() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let behind = cluster.other_than(&[leader]);
    let damaged = cluster.other_than(&[leader, behind]);
    cluster.stop(behind);
    let mut grants = Vec::new();
    for i in 0..40 {
        let reply = cluster.acquire(leader, &format!("gate-{i}"), "holder", "300s").await;
        grants.push(Grant::from_reply(&reply, "an acquire with one follower down"));
    }
    cluster.get(damaged, "/v1/locks/gate-39").await.ok("a read through the follower that will be damaged");
    cluster.stop(damaged);
    let (segment, written) = newest_segment(cluster.data_dir(damaged));
    flip(&segment, |_| written * 3 / 4);
    cluster.stop(leader);

    cluster.respawn(behind);
    cluster.respawn(damaged);
    let name = segment.file_name().expect("a file name").to_string_lossy().into_owned();
    wait_for(EXIT_BOUND, "the damaged follower to say it catches up", async || {
        match cluster.try_get(damaged, "/readyz").await {
            Ok(reply)
                if reply.status == 503
                    && reply.body.as_str().is_some_and(|body| body.contains("catching up") && body.contains(&name)) =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let lost = "holdfast_raft_pre_votes_lost_total";
    let before = cluster.metric(behind, lost).await.unwrap_or(0.0);
    wait_for(ELECTION_BOUND, "two more pre-votes lost by the follower that was behind", async || {
        match cluster.metric(behind, lost).await.unwrap_or(0.0) {
            now if now >= before + 2.0 => Ok(()),
            now => Err(format!("{now} lost, {before} before")),
        }
    })
    .await;
    for id in [behind, damaged] {
        let view = cluster.cluster_info(id).await;
        assert!(view["leader"].is_null(), "node {id} follows no leader while the damaged one catches up: {view}");
    }
    assert_eq!(cluster.metric(damaged, "holdfast_storage_catching_up").await, Some(1.0));

    cluster.respawn(leader);
    cluster.wait_ready(damaged).await;
    assert_eq!(cluster.metric(damaged, "holdfast_storage_catching_up").await, Some(0.0));
    for id in [leader, behind, damaged] {
        cluster.holds(id, &grants).await;
    }
}

/// The snapshot file of a stopped follower with bits flipped in its middle: restarted, the follower finds
/// the damage (the file's CRC), says so naming the file, fetches a member's current snapshot in its place,
/// and rejoins: ready, serving every lock granted before under its fence, and a new grant through it gets
/// a fence above them all. The damaged file is gone.
#[tokio::test]
async fn a_follower_with_a_damaged_snapshot_file_fetches_a_members_and_rejoins() {
    let (mut cluster, _leader, follower, grants) = stopped_follower_after_grants("snap").await;
    let file = snapshot_file(cluster.data_dir(follower));
    flip(&file, |len| len / 2);

    cluster.restart(follower).await;
    let found = log_line(&cluster, follower, "the stored snapshot is corrupt");
    assert!(found.contains(&*file.file_name().unwrap().to_string_lossy()), "the log names the file: {found}");
    log_line(&cluster, follower, "a member's snapshot replaced the damaged one");
    assert_eq!(cluster.metric(follower, "holdfast_storage_refused").await, Some(0.0));
    assert!(!file.exists(), "the damaged file was replaced");
    cluster.holds(follower, &grants).await;
    let newest = grants.iter().map(|grant| grant.fence).max().expect("grants");
    let after = Grant::from_reply(&cluster.acquire(follower, "snap-after", "later", "60s").await, "an acquire after");
    assert!(after.fence > newest, "fence {} after {newest}", after.fence);
}

/// A follower whose snapshot is damaged while no member runs to serve one: it stays out, saying on
/// `/readyz` that its snapshot is damaged and that it fetches a member's, until the two others are back;
/// then it fetches theirs and rejoins, holding every lock granted before the whole cluster stopped.
#[tokio::test]
async fn a_follower_with_a_damaged_snapshot_stays_out_until_a_member_serves_one() {
    let (mut cluster, leader, follower, grants) = stopped_follower_after_grants("snapout").await;
    let file = snapshot_file(cluster.data_dir(follower));
    flip(&file, |len| len / 2);
    let other = cluster.other_than(&[leader, follower]);
    cluster.stop(other);
    cluster.stop(leader);

    cluster.respawn(follower);
    says_it_is_out(&cluster, follower, "fetching a member's snapshot in its place", &file).await;
    cluster.respawn(leader);
    cluster.respawn(other);
    cluster.wait_ready(follower).await;
    assert_eq!(cluster.metric(follower, "holdfast_storage_refused").await, Some(0.0));
    cluster.holds(follower, &grants).await;
}

/// The vote's file of a stopped follower with a bit flipped: restarted, the follower refuses to start
/// rather than vote without knowing what it voted, with an error naming the file; the others serve.
#[tokio::test]
async fn a_follower_with_a_damaged_vote_file_stays_out_naming_the_file() {
    let (mut cluster, leader, follower, grants) = stopped_follower_after_grants("vote").await;
    let file = cluster.data_dir(follower).join("vote");
    flip(&file, |len| len - 1);

    refusal(&mut cluster, follower, "vote file:", &file).await;
    let other = cluster.other_than(&[leader, follower]);
    cluster.holds(other, &grants).await;
}

/// The records file (where the log starts, which snapshot is current) of a stopped follower with a bit
/// flipped: restarted, the follower refuses to start rather than guess where its log starts, with an error
/// naming the file; the others serve.
#[tokio::test]
async fn a_follower_with_a_damaged_records_file_stays_out_naming_the_file() {
    let (mut cluster, leader, follower, grants) = stopped_follower_after_grants("records").await;
    let file = cluster.data_dir(follower).join("records");
    flip(&file, |len| len - 1);

    refusal(&mut cluster, follower, "records: ", &file).await;
    let other = cluster.other_than(&[leader, follower]);
    cluster.holds(other, &grants).await;
}
