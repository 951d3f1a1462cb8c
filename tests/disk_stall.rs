//! A leader whose fsync stalls, on a real 3-node cluster. The test stops the leader's log sync thread
//! (`holdfast-log-sync`, which fdatasyncs the leader's own entries) with ptrace, as if its fdatasync never
//! returned, while the rest of the process runs on: the leader finds its log's sync stalled past
//! `--disk-stall` (1 s by default), says so on `/readyz` and in a metric, and stops; the other two elect one
//! of them, which grants; once the thread runs again, the old leader syncs, follows, and reads every grant.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::{wait_for, Cluster, Grant};

/// How long the old leader may take to be ready again once its sync runs. Its replacement is waited for
/// within the harness's election bound (20 s): far above the design's bound (`--disk-stall`, one look of the
/// disk every 250 ms, then a lease and an election timeout: about 1.9 s with the defaults), so that a loaded
/// machine does not fail the test.
const BOUND: Duration = Duration::from_secs(30);

/// A thread of another process held stopped by a tracer thread of this one; let go when dropped.
struct StoppedThread {
    release: Option<mpsc::Sender<()>>,
    tracer: Option<std::thread::JoinHandle<()>>,
}

impl StoppedThread {
    /// Stops the thread of process `pid` named `name` (as `/proc` shows it: 15 bytes at most).
    fn stop(pid: u32, name: &str) -> StoppedThread {
        let tid: libc::pid_t = std::fs::read_dir(format!("/proc/{pid}/task"))
            .expect("list the node's threads")
            .filter_map(|entry| entry.ok())
            .find(|entry| std::fs::read_to_string(entry.path().join("comm")).is_ok_and(|comm| comm.trim() == name))
            .unwrap_or_else(|| panic!("process {pid} has no thread named {name}"))
            .file_name()
            .to_string_lossy()
            .parse()
            .expect("a thread id");
        let (stopped_tx, stopped) = mpsc::channel::<Result<(), String>>();
        let (release, released) = mpsc::channel::<()>();
        // ptrace belongs to the thread that attached: this one attaches, waits, and detaches.
        let tracer = std::thread::spawn(move || {
            let attach = || -> Result<(), String> {
                // SAFETY: ptrace and waitpid on a thread id, with no memory passed to the kernel but `status`.
                unsafe {
                    if libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) != 0 {
                        return Err(format!("PTRACE_SEIZE {tid}: {}", std::io::Error::last_os_error()));
                    }
                    if libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) != 0 {
                        return Err(format!("PTRACE_INTERRUPT {tid}: {}", std::io::Error::last_os_error()));
                    }
                    let mut status = 0;
                    if libc::waitpid(tid, &mut status, libc::__WALL) != tid {
                        return Err(format!("waitpid {tid}: {}", std::io::Error::last_os_error()));
                    }
                }
                Ok(())
            };
            let attached = attach();
            let ok = attached.is_ok();
            let _ = stopped_tx.send(attached);
            if ok {
                let _ = released.recv();
                // SAFETY: as above; the thread is in a ptrace stop, so it may be detached.
                unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0) };
            }
        });
        match stopped.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => StoppedThread { release: Some(release), tracer: Some(tracer) },
            Ok(Err(e)) => panic!("stopping thread {name} of process {pid}: {e}"),
            Err(e) => panic!("stopping thread {name} of process {pid}: {e}"),
        }
    }
}

impl Drop for StoppedThread {
    fn drop(&mut self) {
        drop(self.release.take());
        if let Some(tracer) = self.tracer.take() {
            let _ = tracer.join();
        }
    }
}

/// The leader's log sync stops while a client writes through it: within a bounded time the other two
/// elect one of them and grant with growing fences, the stalled node says `disk stalled`; once its sync
/// runs again it follows, is ready, and every node reads every grant under its fence.
#[tokio::test]
async fn a_leader_whose_fsync_stalls_is_replaced_and_follows_once_it_syncs_again() {
    let cluster = Cluster::start(3).await;
    let stalled = cluster.leader().await;
    let mut grants = Vec::new();
    for i in 0..5 {
        let reply = cluster.acquire(stalled, &format!("before-{i}"), "holder", "300s").await;
        grants.push(Grant::from_reply(&reply, "an acquire before the stall"));
    }

    let thread = StoppedThread::stop(cluster.pid(stalled), "holdfast-log-sy");
    let started = Instant::now();
    // A write through the leader: its entry waits for the sync that does not come. Its answer does not
    // matter (it may time out, or commit through the next leader).
    let trigger = cluster.http().post(format!("{}/v1/locks/trigger", cluster.client_url(stalled)));
    let trigger = tokio::spawn(trigger.query(&[("ttl", "300s"), ("owner", "trigger")]).send());

    let leader = cluster.leader_other_than(stalled).await;
    let replaced = started.elapsed();
    for i in 0..5 {
        let name = format!("during-{i}");
        let reply = cluster
            .until_available("an acquire", async || cluster.acquire(leader, &name, "holder", "300s").await)
            .await;
        grants.push(Grant::from_reply(&reply, "an acquire while the old leader's sync is stalled"));
    }
    let served = started.elapsed();
    eprintln!("stalled leader replaced after {replaced:?}; first 5 grants through the new one by {served:?}");
    let before = grants[4].fence;
    assert!(grants[5..].iter().all(|grant| grant.fence > before), "fences only grow: {grants:?}");
    let said = cluster.readyz(stalled).await;
    assert!(said.0 == 503 && said.1.contains("disk stalled"), "the stalled node says so: {said:?}");
    assert_eq!(cluster.metric(stalled, "holdfast_storage_disk_stalled").await, Some(1.0));

    drop(thread);
    let _ = trigger.await;
    wait_for(BOUND, "the old leader to be ready again", async || match cluster.readyz(stalled).await {
        (200, _) => Ok(()),
        other => Err(format!("{other:?}")),
    })
    .await;
    assert_eq!(cluster.metric(stalled, "holdfast_storage_disk_stalled").await, Some(0.0));
    for id in cluster.ids() {
        cluster.holds(id, &grants).await;
    }
}
