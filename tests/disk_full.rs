//! A node whose data directory's disk fills up, on a real 3-node cluster whose nodes each keep their data on
//! a small tmpfs of their own: the node stores no new entries (as leader, it lets another lead), says so on
//! `/readyz` and in a metric, and catches up by itself once there is room; the cluster keeps serving and no
//! grant is lost. Mounting a tmpfs needs root, so the test is ignored by default and `tests/run` runs it
//! when it is root.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::{wait_for, Cluster, Grant};

/// The reserve each node keeps here (`--disk-reserve`), and the size of each node's tmpfs: room for the
/// log's first segment (32 MiB), sled, and twice the reserve, so that the reserve is allocated at start.
const RESERVE: &str = "16MiB";
const TMPFS_SIZE: &str = "96m";

/// How long a node may take to find its disk full or free again (it looks every 250 ms) and to apply what
/// it missed; another leader is waited for within the harness's election bound.
const BOUND: Duration = Duration::from_secs(30);

/// A tmpfs mounted over a directory, with what the directory held copied in; unmounted when dropped (lazily,
/// so that it goes even while a node still has files open there).
struct Tmpfs {
    at: PathBuf,
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program).args(args).status().unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(status.success(), "{program} {args:?} failed: {status}");
}

impl Tmpfs {
    fn mount_over(dir: &Path) -> Tmpfs {
        let aside = dir.with_extension("before-tmpfs");
        std::fs::rename(dir, &aside).expect("move the data directory aside");
        std::fs::create_dir(dir).expect("make the mount point");
        let dir_arg = dir.to_str().expect("a UTF-8 path");
        run("mount", &["-t", "tmpfs", "-o", &format!("size={TMPFS_SIZE}"), "tmpfs", dir_arg]);
        let tmpfs = Tmpfs { at: dir.to_owned() };
        run("cp", &["-a", &format!("{}/.", aside.display()), dir_arg]);
        tmpfs
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}

/// Writes a file in `dir` until its file system has no room left; answers the file.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).expect("create the filler");
    let chunk = vec![1u8; 1 << 20];
    loop {
        match file.write_all(&chunk) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => return path,
            Err(e) => panic!("fill {}: {e}", dir.display()),
        }
    }
}

/// A 3-node cluster started with the test's reserve, each node's data directory moved onto a tmpfs of its
/// own (stopped, moved, started again), and the mounts, to be dropped before the cluster.
async fn cluster_on_tmpfs() -> (Cluster, Vec<Tmpfs>) {
    let mut cluster = Cluster::start_with(3, &["--disk-reserve", RESERVE]).await;
    let mut mounts = Vec::new();
    for id in cluster.ids() {
        cluster.stop(id);
        mounts.push(Tmpfs::mount_over(cluster.data_dir(id)));
    }
    cluster.restart_all("the cluster on tmpfs").await;
    (cluster, mounts)
}

/// Waits until node `id` says on `/readyz` that its disk is full, naming its data directory, and shows it
/// in its metric.
async fn says_full(cluster: &Cluster, id: usize) {
    let said = wait_for(BOUND, "the full node to say so on /readyz", async || match cluster.readyz(id).await {
        (503, body) if body.contains("disk full") => Ok(body),
        other => Err(format!("{other:?}")),
    })
    .await;
    assert!(said.contains(&cluster.data_dir(id).display().to_string()), "names the directory: {said}");
    assert_eq!(cluster.metric(id, "holdfast_storage_disk_full").await, Some(1.0));
    assert!(!cluster.data_dir(id).join("reserve").exists(), "the reserve was given back");
}

/// Removes `filler`, waits until node `id` is ready again with its reserve back, and checks that every node,
/// `id` included, reads each of `grants` held under its fence.
async fn room_again(cluster: &Cluster, id: usize, filler: &Path, grants: &[Grant]) {
    std::fs::remove_file(filler).expect("remove the filler");
    wait_for(BOUND, "the node to be ready again", async || match cluster.readyz(id).await {
        (200, _) => Ok(()),
        other => Err(format!("{other:?}")),
    })
    .await;
    assert_eq!(cluster.metric(id, "holdfast_storage_disk_full").await, Some(0.0));
    let reserve = cluster.data_dir(id).join("reserve");
    assert_eq!(std::fs::metadata(&reserve).expect("the reserve file").len(), 16 << 20, "the reserve is back");
    for id in cluster.ids() {
        cluster.holds(id, grants).await;
    }
}

/// `count` grants of locks named `prefix-N` through node `id`, each retried while the cluster answers 503
/// (an election).
async fn grant(cluster: &Cluster, id: usize, prefix: &str, count: usize) -> Vec<Grant> {
    let mut grants = Vec::new();
    for i in 0..count {
        let name = format!("{prefix}-{i}");
        let reply =
            cluster.until_available("an acquire", async || cluster.acquire(id, &name, "holder", "300s").await).await;
        grants.push(Grant::from_reply(&reply, "an acquire"));
    }
    grants
}

/// The leader's disk fills up while it holds grants: it says so and stops leading, the other two elect a
/// leader and grant more, with no grant lost; once the filler is gone, the node allocates its reserve again,
/// takes the entries it missed and is ready, and every grant is held under its fence as each node reads it.
#[tokio::test]
#[ignore = "mounts a tmpfs (root): tests/run runs it with --ignored when it can"]
async fn a_leader_whose_disk_fills_up_lets_another_lead_and_catches_up_once_there_is_room() {
    let (cluster, mounts) = cluster_on_tmpfs().await;
    let full = cluster.leader().await;
    assert_eq!(std::fs::metadata(cluster.data_dir(full).join("reserve")).map(|m| m.len()).ok(), Some(16 << 20));
    let mut grants = grant(&cluster, full, "before", 10).await;

    let filler = fill(cluster.data_dir(full));
    says_full(&cluster, full).await;
    let leader = cluster.leader_other_than(full).await;
    grants.extend(grant(&cluster, leader, "during", 10).await);
    let before = grants[9].fence;
    assert!(grants[10..].iter().all(|grant| grant.fence > before), "fences only grow: {grants:?}");

    room_again(&cluster, full, &filler, &grants).await;
    // The mounts go first (lazily: the nodes still run), then the nodes and their directory.
    drop(mounts);
    drop(cluster);
}

/// A follower's disk fills up: it says so and applies nothing more, while the leader and the other
/// follower go on granting; once there is room, it takes what it missed.
#[tokio::test]
#[ignore = "mounts a tmpfs (root): tests/run runs it with --ignored when it can"]
async fn a_follower_whose_disk_fills_up_applies_nothing_more_and_catches_up_once_there_is_room() {
    let (cluster, mounts) = cluster_on_tmpfs().await;
    let leader = cluster.leader().await;
    let full = cluster.other_than(&[leader]);
    let mut grants = grant(&cluster, leader, "before", 10).await;

    let filler = fill(cluster.data_dir(full));
    says_full(&cluster, full).await;
    let applied = cluster.metric(full, "holdfast_raft_applied_index").await.expect("the applied index");
    grants.extend(grant(&cluster, leader, "during", 10).await);
    let during = grants[10..].iter().map(|grant| grant.fence).min().expect("grants while full");
    assert!(applied < during as f64, "the follower had not applied them before: {applied} < {during}");
    let still = cluster.metric(full, "holdfast_raft_applied_index").await.expect("the applied index");
    assert!(still < during as f64, "the full follower applied no entry it could not store: {still} < {during}");

    room_again(&cluster, full, &filler, &grants).await;
    drop(mounts);
    drop(cluster);
}
