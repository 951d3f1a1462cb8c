//! What the disk store keeps across a restart (drop every handle, open the same directory again),
//! and what a snapshot carries from one node to another.

mod common;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::{acquire, blank, log_id, membership, model, receive, snapshot_bytes, Counting};
use holdfast_store::{open, LogStore, NoObserver, NodeId, StateMachineStore};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder, StorageHelper, Vote};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Opens the store in `dir`. An open that converts an older directory opens sled, and a reopen right after
/// may find sled's file lock still held for a moment: a write sled handed to its own IO thread pool keeps
/// the database open until it finishes (seen once in CI as `could not acquire lock … WouldBlock`). So a
/// lock conflict is retried,
/// within a bound; any other error is not.
fn open_quiet(dir: &Path) -> Result<(LogStore, StateMachineStore)> {
    until_unlocked(|| open(dir, Arc::new(NoObserver)))
}

/// The database in `dir` opened with sled alone, as an older build or a check would.
fn sled_open(dir: &Path) -> Result<sled::Db> {
    until_unlocked(|| sled::open(dir))
}

/// `open()`, again while it fails on sled's lock of the directory: a store just dropped in this process may
/// still hold it for a moment (up to 5 s, a bound on the wait, not a sleep the test relies on).
fn until_unlocked<T, E: std::fmt::Display + Into<Box<dyn std::error::Error>>>(
    mut open: impl FnMut() -> std::result::Result<T, E>,
) -> Result<T> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match open() {
            Err(e) if e.to_string().contains("could not acquire lock") && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            opened => return opened.map_err(Into::into),
        }
    }
}

/// openraft 0.9 purges the log that a leader's snapshot covers as soon as it hands the snapshot to the
/// state machine, before the state machine has stored it; a node stopped in between could not start (its
/// log gone, its stored snapshot behind it). While a snapshot is on its way, a purge past the stored
/// snapshot waits for the install.
#[tokio::test]
async fn a_purge_after_a_leaders_snapshot_waits_until_the_snapshot_is_stored() -> Result {
    let (source_dir, target_dir) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let (_source_log, mut source) = open_quiet(source_dir.path())?;
    source.apply((1..=8).map(|i| blank(1, i)).collect::<Vec<_>>()).await?;
    let mut snapshot = source.get_snapshot_builder().await.build_snapshot().await?;

    let (mut log, mut target) = open_quiet(target_dir.path())?;
    log.blocking_append((1..=4).map(|i| blank(1, i))).await?;
    log.purge(log_id(1, 2)).await?;
    let mut received = target.begin_receiving_snapshot().await?;
    receive(&mut received, &snapshot_bytes(&mut snapshot.snapshot).await?).await?;
    // openraft's order: the purge comes before the install is done.
    let mut purge = tokio::spawn({
        let mut log = log.clone();
        async move { log.purge(log_id(1, 8)).await }
    });
    // It waits (a purge that does not wait is done in milliseconds); the log is still there.
    let waited = tokio::time::timeout(Duration::from_millis(500), &mut purge).await;
    assert!(waited.is_err(), "the purge went ahead of the snapshot: {waited:?}");
    assert_eq!(log.try_get_log_entries(3..5).await?.len(), 2);
    target.install_snapshot(&snapshot.meta, received).await?;
    purge.await??;
    assert_eq!(log.get_log_state().await?.last_purged_log_id, Some(log_id(1, 8)));
    Ok(())
}

fn state_bytes(sm: &StateMachineStore) -> Vec<u8> {
    common::state_bytes(&sm.state())
}

#[tokio::test]
async fn log_vote_and_committed_survive_reopen() -> Result {
    let dir = tempfile::tempdir()?;
    let entries = vec![blank(1, 1), acquire(1, 2, "alpha", "a", 1), membership(1, 3), blank(2, 4)];
    let vote = Vote::new_committed(2, 1);
    {
        let (mut log, _sm) = open_quiet(dir.path())?;
        log.blocking_append(entries.clone()).await?;
        log.save_vote(&vote).await?;
        log.save_committed(Some(log_id(1, 3))).await?;
    }

    let (mut log, _sm) = open_quiet(dir.path())?;
    assert_eq!(log.read_vote().await?, Some(vote));
    assert_eq!(log.read_committed().await?, Some(log_id(1, 3)));
    assert_eq!(log.try_get_log_entries(..).await?, entries);
    assert_eq!(log.try_get_log_entries(2..4).await?, entries[1..3]);
    let state = log.get_log_state().await?;
    assert_eq!(state.last_purged_log_id, None);
    assert_eq!(state.last_log_id, Some(log_id(2, 4)));
    Ok(())
}

#[tokio::test]
async fn truncated_log_stays_truncated_after_reopen() -> Result {
    let dir = tempfile::tempdir()?;
    {
        let (mut log, _sm) = open_quiet(dir.path())?;
        log.blocking_append((1..=6).map(|i| blank(1, i))).await?;
        log.truncate(log_id(1, 4)).await?;
        // A new leader's entries replace the truncated ones.
        log.blocking_append([blank(2, 4)]).await?;
    }

    let (mut log, _sm) = open_quiet(dir.path())?;
    let ids: Vec<_> = log.try_get_log_entries(..).await?.into_iter().map(|e| e.log_id).collect();
    assert_eq!(ids, [log_id(1, 1), log_id(1, 2), log_id(1, 3), log_id(2, 4)]);
    assert_eq!(log.get_log_state().await?.last_log_id, Some(log_id(2, 4)));
    Ok(())
}

#[tokio::test]
async fn snapshot_restores_lock_state_on_reopen() -> Result {
    let dir = tempfile::tempdir()?;
    let observer = Arc::new(Counting::default());
    let (built, view, applied, bytes) = {
        let (_log, mut sm) = open(dir.path(), observer.clone())?;
        let responses = sm
            .apply([
                blank(1, 1),
                membership(1, 2),
                acquire(1, 3, "alpha", "a", 1),
                acquire(1, 4, "alpha", "b", 2),
                acquire(1, 5, "beta", "c", 3),
            ])
            .await?;
        assert_eq!(responses.len(), 5);
        assert_eq!(responses[0].outcome, None, "a blank entry has no lock outcome");
        assert!(responses[2..].iter().all(|r| r.outcome.is_some()));
        assert_eq!(observer.applied.load(Ordering::SeqCst), 3, "told of normal entries only");
        let built = sm.get_snapshot_builder().await.build_snapshot().await?;
        let view = {
            let state = sm.state();
            let state = state.read().expect("no apply panicked");
            (state.get("alpha"), state.get("beta"), state.get("gamma"))
        };
        assert_eq!(view.0.as_ref().map(|l| l.waiters.len()), Some(1), "b waits for alpha");
        (built, view, sm.applied_state().await?, state_bytes(&sm))
    };
    assert_eq!(built.meta.last_log_id, Some(log_id(1, 5)));
    assert_eq!(observer.restored.load(Ordering::SeqCst), 0);

    let (_log, mut sm) = open(dir.path(), observer.clone())?;
    assert_eq!(observer.restored.load(Ordering::SeqCst), 1, "open restores from the snapshot");
    {
        let state = sm.state();
        let state = state.read().expect("no apply panicked");
        assert_eq!((state.get("alpha"), state.get("beta"), state.get("gamma")), view);
        assert_eq!(state.applied_index(), 5);
    }
    assert_eq!(sm.applied_state().await?, applied);
    assert_eq!(state_bytes(&sm), bytes);
    let current = sm.get_current_snapshot().await?.expect("the built snapshot is stored");
    assert_eq!(current.meta, built.meta);
    let (mut current_data, mut built_data) = (current.snapshot, built.snapshot);
    assert_eq!(snapshot_bytes(&mut current_data).await?, snapshot_bytes(&mut built_data).await?);

    // The log after the snapshot applies on top of the restored state.
    sm.apply([acquire(1, 6, "beta", "d", 4)]).await?;
    let state = sm.state();
    let beta = state.read().expect("no apply panicked").get("beta").expect("beta is held");
    assert_eq!(beta.waiters.len(), 1);
    Ok(())
}

#[tokio::test]
async fn installed_snapshot_matches_source_bytes() -> Result {
    let (source_dir, target_dir) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let (_source_log, mut source) = open_quiet(source_dir.path())?;
    source
        .apply([membership(1, 1), acquire(1, 2, "alpha", "a", 1), acquire(2, 3, "alpha", "b", 2), blank(2, 4)])
        .await?;
    let mut snapshot = source.get_snapshot_builder().await.build_snapshot().await?;

    let observer = Arc::new(Counting::default());
    {
        let (_target_log, mut target) = open(target_dir.path(), observer.clone())?;
        let mut received = target.begin_receiving_snapshot().await?;
        receive(&mut received, &snapshot_bytes(&mut snapshot.snapshot).await?).await?;
        target.install_snapshot(&snapshot.meta, received).await?;

        assert_eq!(state_bytes(&target), state_bytes(&source));
        assert_eq!(target.applied_state().await?, source.applied_state().await?);
        assert_eq!(target.get_current_snapshot().await?.map(|s| s.meta), Some(snapshot.meta.clone()));
        assert_eq!(observer.restored.load(Ordering::SeqCst), 1);
    }

    // The installed snapshot is on disk: a restart comes back to it.
    let (_target_log, mut target) = open_quiet(target_dir.path())?;
    assert_eq!(state_bytes(&target), state_bytes(&source));
    assert_eq!(target.applied_state().await?, source.applied_state().await?);
    Ok(())
}

#[tokio::test]
async fn purge_survives_reopen() -> Result {
    let dir = tempfile::tempdir()?;
    {
        let (mut log, _sm) = open_quiet(dir.path())?;
        log.blocking_append((1..=10).map(|i| blank(1, i))).await?;
        log.purge(log_id(1, 5)).await?;
    }
    {
        let (mut log, _sm) = open_quiet(dir.path())?;
        let state = log.get_log_state().await?;
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 5)));
        assert_eq!(state.last_log_id, Some(log_id(1, 10)));
        let first = log.try_get_log_entries(..).await?.first().map(|e| e.log_id);
        assert_eq!(first, Some(log_id(1, 6)));

        log.purge(log_id(1, 10)).await?;
    }

    // With every entry purged, the log ends where the purge did.
    let (mut log, _sm) = open_quiet(dir.path())?;
    let state = log.get_log_state().await?;
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 10)));
    assert_eq!(state.last_log_id, Some(log_id(1, 10)));
    assert!(log.try_get_log_entries(..).await?.is_empty());
    Ok(())
}

/// A crash-and-restart, compared with a model: a plain `LockState` fed every entry. The restarted
/// node has the snapshot (entries 0..=3) and the committed log after it (4..=6); openraft's start-up
/// path re-applies 4..=6, and the result is the model's state byte for byte.
#[tokio::test]
async fn restart_reapplies_committed_log_after_snapshot() -> Result {
    let dir = tempfile::tempdir()?;
    // Index 0 is where `Raft::initialize` puts the first membership.
    let entries = vec![
        membership(0, 0),
        blank(1, 1),
        acquire(1, 2, "alpha", "a", 1),
        acquire(1, 3, "alpha", "b", 2),
        acquire(1, 4, "beta", "c", 3),
        membership(1, 5),
        acquire(1, 6, "alpha", "d", 4),
    ];
    let model = model(&entries);
    {
        let (mut log, mut sm) = open_quiet(dir.path())?;
        log.blocking_append(entries.clone()).await?;
        sm.apply(entries[..4].to_vec()).await?;
        sm.get_snapshot_builder().await.build_snapshot().await?;
        sm.apply(entries[4..].to_vec()).await?;
        log.save_committed(Some(log_id(1, 6))).await?;
    }

    let (mut log, mut sm) = open_quiet(dir.path())?;
    assert_eq!(sm.applied_state().await?.0, Some(log_id(1, 3)), "open restores the snapshot only");
    StorageHelper::new(&mut log, &mut sm).get_initial_state().await?;
    assert_eq!(state_bytes(&sm), model.snapshot());
    let (applied, membership) = sm.applied_state().await?;
    assert_eq!(applied, Some(log_id(1, 6)));
    assert_eq!(membership.log_id(), &Some(log_id(1, 5)));
    Ok(())
}

/// A leader's own entries (`acknowledge_own_appends`) are written at once and synced by the log's own
/// thread; applying them waits until they are durable, and a follower's append is durable when it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaders_own_appends_are_synced_in_the_background_and_applied_once_durable() -> Result {
    let dir = tempfile::tempdir()?;
    let entries = vec![blank(1, 1), acquire(1, 2, "alpha", "a", 1), acquire(1, 3, "beta", "b", 2)];
    {
        let (log, mut sm) = open_quiet(dir.path())?;
        let mut log = log.acknowledge_own_appends(1);
        let durable = log.durable();
        log.save_vote(&Vote::new_committed(1, 1)).await?;
        log.blocking_append(entries.clone()).await?;
        assert_eq!(log.try_get_log_entries(..).await?, entries, "reads see them at once");
        tokio::time::timeout(Duration::from_secs(10), sm.apply(entries.clone())).await??;
        assert_eq!(durable.last(), Some(log_id(1, 3)), "applied only once durable");
        assert_eq!(state_bytes(&sm), model(&entries).snapshot());
        log.save_committed(Some(log_id(1, 3))).await?;

        log.save_vote(&Vote::new_committed(2, 2)).await?;
        log.blocking_append(vec![blank(2, 4)]).await?;
        assert_eq!(durable.last(), Some(log_id(2, 4)), "a follower's append is durable when acknowledged");
    }
    let (mut log, _sm) = open_quiet(dir.path())?;
    assert_eq!(log.try_get_log_entries(..).await?.len(), 4);
    assert_eq!(log.read_committed().await?, Some(log_id(1, 3)));
    Ok(())
}

/// Asks for every follower append to be synced aside, as a node with many clients' writes waiting does, and
/// notes the thread each sync ran on.
#[derive(Default)]
struct Aside {
    synced_on: std::sync::Mutex<Vec<Option<String>>>,
}

impl holdfast_store::ApplyObserver for Aside {
    fn applied(&self, _: &holdfast_core::LockState, _: u64, _: &holdfast_core::Command, _: &holdfast_core::Applied) {}

    fn restored(&self, _state: &holdfast_core::LockState) {}

    fn flushed(&self, _took: Duration) {
        let thread = std::thread::current().name().map(str::to_owned);
        self.synced_on.lock().unwrap().push(thread);
    }

    fn sync_aside(&self) -> bool {
        true
    }
}

/// A follower's append synced aside is written at once, synced by the log's own thread (not the caller's),
/// and acknowledged only once durable; it survives a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_append_synced_aside_is_acknowledged_once_durable() -> Result {
    let dir = tempfile::tempdir()?;
    let entries = vec![blank(1, 1), acquire(1, 2, "alpha", "a", 1), acquire(1, 3, "beta", "b", 2)];
    {
        let aside = Arc::new(Aside::default());
        let (log, _sm) = until_unlocked(|| open(dir.path(), aside.clone()))?;
        let mut log = log.acknowledge_own_appends(1);
        let durable = log.durable();
        // Node 2 leads: the entries are a follower's.
        log.save_vote(&Vote::new_committed(1, 2)).await?;
        aside.synced_on.lock().unwrap().clear();
        log.blocking_append(entries.clone()).await?;
        assert_eq!(durable.last(), Some(log_id(1, 3)), "durable when acknowledged");
        let synced_on = aside.synced_on.lock().unwrap().clone();
        assert_eq!(synced_on, [Some("holdfast-log-sync".to_owned())], "synced by the log's own thread");
    }
    let (mut log, _sm) = open_quiet(dir.path())?;
    assert_eq!(log.try_get_log_entries(..).await?, entries);
    Ok(())
}

/// Regression: sled 0.34's `flush_async` never completes once about eight flushes are in flight in
/// one process (spacejam/sled#1241, #1308). Sixteen stores flushing at once, as a process running
/// several nodes does, must all finish. The stores run on a thread of their own so that a hang fails
/// this test (sled would also hang dropping them) instead of hanging the run.
#[test]
fn many_concurrent_flushes_complete() {
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build();
        let result = runtime.map_err(Into::into).and_then(|rt| rt.block_on(flush_from_many_stores()));
        let _ = done_tx.send(result.map_err(|e| e.to_string()));
    });
    let result = done.recv_timeout(Duration::from_secs(120)).expect("concurrent flushes hung");
    result.expect("every store appends and votes");
}

async fn flush_from_many_stores() -> Result {
    let dirs = (0..16).map(|_| tempfile::tempdir()).collect::<std::io::Result<Vec<_>>>()?;
    let mut tasks = tokio::task::JoinSet::new();
    for dir in &dirs {
        let (mut log, _sm) = open_quiet(dir.path())?;
        tasks.spawn(async move {
            for i in 1..=10 {
                log.save_vote(&Vote::new(i, 1)).await?;
                log.blocking_append([blank(i, i)]).await?;
            }
            Ok::<_, openraft::StorageError<NodeId>>(log.get_log_state().await?.last_log_id)
        });
    }
    while let Some(done) = tasks.join_next().await {
        assert_eq!(done??, Some(log_id(10, 10)));
    }
    Ok(())
}

/// A directory written by format 1 (the Raft log in sled's `log` tree, keyed by big-endian index) opens with
/// its log, vote and purge point intact, the log now in the log files; sled's `log` tree is gone, and sled
/// records format 5, which older builds refuse.
#[tokio::test]
async fn a_format_1_directory_is_converted_when_opened() -> Result {
    let dir = tempfile::tempdir()?;
    let entries = vec![acquire(1, 3, "alpha", "a", 1), membership(1, 4), blank(2, 5)];
    let vote = Vote::new_committed(2, 1);
    {
        let db = sled_open(dir.path())?;
        let meta = db.open_tree("meta")?;
        meta.insert("format", bincode::serialize(&1u32)?)?;
        meta.insert("vote", bincode::serialize(&vote)?)?;
        meta.insert("last_purged", bincode::serialize(&log_id(1, 2))?)?;
        let tree = db.open_tree("log")?;
        for entry in &entries {
            tree.insert(entry.log_id.index.to_be_bytes(), bincode::serialize(entry)?)?;
        }
        db.flush()?;
    }
    for _ in 0..2 {
        let (mut log, _sm) = open_quiet(dir.path())?;
        assert_eq!(log.try_get_log_entries(..).await?, entries);
        let state = log.get_log_state().await?;
        assert_eq!((state.last_purged_log_id, state.last_log_id), (Some(log_id(1, 2)), Some(log_id(2, 5))));
        assert_eq!(log.read_vote().await?, Some(vote));
    }
    let db = sled_open(dir.path())?;
    assert!(!db.tree_names().iter().any(|name| name.as_ref() == b"log"), "{:?}", db.tree_names());
    assert_eq!(db.open_tree("meta")?.get("format")?.as_deref(), Some(&bincode::serialize(&5u32)?[..]));
    Ok(())
}

/// The format a directory's sled records.
fn format_of(dir: &Path) -> Result<Option<u32>> {
    let db = sled_open(dir)?;
    Ok(db.open_tree("meta")?.get("format")?.map(|b| bincode::deserialize(&b)).transpose()?)
}

/// Turns `dir`, written by this build, into the directory a build of `format` (2 to 4) would have left: the
/// same log files, and the store's records in sled's `meta` tree (`records`, keys and values) instead of
/// files of their own.
fn as_older(dir: &Path, format: u32, records: &[(&str, Vec<u8>)]) -> Result {
    std::fs::remove_file(dir.join("records"))?;
    std::fs::remove_file(dir.join("committed"))?;
    let db = sled_open(dir)?;
    let meta = db.open_tree("meta")?;
    meta.insert("format", bincode::serialize(&format)?)?;
    for (key, value) in records {
        meta.insert(key, &value[..])?;
    }
    db.flush()?;
    Ok(())
}

/// A directory of format 2, 3 or 4 (records in sled) opens with its log, purge point and commit, and is
/// converted to format 5: its records in files of their own, and format 5 in sled, so that such a build
/// refuses it from then on. A format this build does not know is refused and left as it was.
#[tokio::test]
async fn a_format_2_3_or_4_directory_is_converted_to_5_and_an_unknown_format_is_refused() -> Result {
    let dir = tempfile::tempdir()?;
    let entries = vec![acquire(1, 1, "alpha", "a", 1), blank(1, 2), blank(1, 3)];
    {
        let (mut log, _sm) = open_quiet(dir.path())?;
        log.blocking_append(entries.clone()).await?;
        log.purge(log_id(1, 1)).await?;
    }
    assert_eq!(format_of(dir.path())?, Some(5), "a new directory's sled says format 5, for older builds");
    for older in [2, 3, 4] {
        let committed = Some(log_id(1, older as u64 - 1));
        let records =
            [("last_purged", bincode::serialize(&log_id(1, 1))?), ("committed", bincode::serialize(&committed)?)];
        as_older(dir.path(), older, &records)?;
        {
            let (mut log, _sm) = open_quiet(dir.path())?;
            assert_eq!(log.try_get_log_entries(..).await?, entries[1..]);
            assert_eq!(log.get_log_state().await?.last_purged_log_id, Some(log_id(1, 1)));
            assert_eq!(log.read_committed().await?, committed);
        }
        assert_eq!(format_of(dir.path())?, Some(5));
        assert!(dir.path().join("records").exists());
    }

    as_older(dir.path(), 6, &[])?;
    let refused = open_quiet(dir.path()).err().map(|e| e.to_string());
    assert_eq!(refused.as_deref(), Some("storage format 6 is not supported (expected 5)"));
    assert_eq!(format_of(dir.path())?, Some(6));
    assert!(!dir.path().join("records").exists(), "left as it was");
    Ok(())
}

/// The store's records file is checked as the vote's is: a flipped bit refuses the open, naming the file;
/// and a directory that holds a log but has lost its records is refused rather than taken for a new one.
#[tokio::test]
async fn a_damaged_or_missing_records_file_refuses_the_open() -> Result {
    let dir = tempfile::tempdir()?;
    {
        let (mut log, _sm) = open_quiet(dir.path())?;
        log.blocking_append(vec![blank(1, 1), blank(1, 2)]).await?;
        log.purge(log_id(1, 1)).await?;
    }
    let file = dir.path().join("records");
    let bytes = std::fs::read(&file)?;
    let mut damaged = bytes.clone();
    damaged[9] ^= 0x04;
    std::fs::write(&file, &damaged)?;
    let refused = open_quiet(dir.path()).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(refused.starts_with("records: ") && refused.contains("damaged"), "{refused}");
    assert!(refused.contains(&file.display().to_string()), "{refused}");

    std::fs::remove_file(&file)?;
    for sled_file in ["db", "conf"] {
        std::fs::remove_file(dir.path().join(sled_file))?;
    }
    let refused = open_quiet(dir.path()).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(refused.contains("records is missing, but raft-log is there"), "{refused}");

    std::fs::write(&file, &bytes)?;
    let (mut log, _sm) = open_quiet(dir.path())?;
    assert_eq!(log.try_get_log_entries(..).await?, vec![blank(1, 2)]);
    Ok(())
}

/// A committed log id is written in place and never synced on its own: a crash can leave it damaged, which
/// costs a re-apply at the leader's next message, and does not stop the node.
#[tokio::test]
async fn a_damaged_committed_file_is_taken_as_no_commit() -> Result {
    let dir = tempfile::tempdir()?;
    {
        let (mut log, _sm) = open_quiet(dir.path())?;
        log.blocking_append(vec![blank(1, 1)]).await?;
        log.save_committed(Some(log_id(1, 1))).await?;
    }
    {
        let (mut log, _sm) = open_quiet(dir.path())?;
        assert_eq!(log.read_committed().await?, Some(log_id(1, 1)));
    }
    let file = dir.path().join("committed");
    let mut bytes = std::fs::read(&file)?;
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&file, &bytes)?;
    let (mut log, _sm) = open_quiet(dir.path())?;
    assert_eq!(log.read_committed().await?, None);
    assert_eq!(log.try_get_log_entries(..).await?, vec![blank(1, 1)], "the log is whole");
    Ok(())
}

/// The files in a directory's `snapshots/`, by name.
fn snapshot_files(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir.join("snapshots"))? {
        names.push(entry?.file_name().into_string().map_err(|name| format!("{name:?} is not UTF-8"))?);
    }
    names.sort();
    Ok(names)
}

/// A format 3 directory kept its snapshot's bytes in sled's `snapshot` tree, as `data`. It opens with its
/// state restored from them, now in a file of `snapshots/`, and sends them to a follower that asks.
#[tokio::test]
async fn a_format_3_snapshot_in_sled_is_moved_to_a_file() -> Result {
    let dir = tempfile::tempdir()?;
    let entries = vec![membership(0, 0), acquire(1, 1, "alpha", "a", 1), acquire(1, 2, "beta", "b", 2)];
    let meta = {
        let (mut log, mut sm) = open_quiet(dir.path())?;
        log.blocking_append(entries.clone()).await?;
        sm.apply(entries[..2].to_vec()).await?;
        log.save_committed(Some(log_id(1, 2))).await?;
        sm.get_snapshot_builder().await.build_snapshot().await?.meta
    };
    // The directory as a format 3 build would have left it: the same snapshot, its bytes in the tree.
    {
        let [name] = &snapshot_files(dir.path())?[..] else { panic!("one snapshot file") };
        let bytes = std::fs::read(dir.path().join("snapshots").join(name))?;
        assert_eq!(bytes, model(&entries[..2]).snapshot());
        std::fs::remove_dir_all(dir.path().join("snapshots"))?;
        as_older(dir.path(), 3, &[("committed", bincode::serialize(&Some(log_id(1, 2)))?)])?;
        let db = sled_open(dir.path())?;
        let tree = db.open_tree("snapshot")?;
        tree.insert("meta", bincode::serialize(&meta)?)?;
        tree.insert("data", bytes)?;
        db.flush()?;
    }
    for _ in 0..2 {
        let (mut log, mut sm) = open_quiet(dir.path())?;
        assert_eq!(state_bytes(&sm), model(&entries[..2]).snapshot());
        let mut current = sm.get_current_snapshot().await?.expect("the tree's snapshot is current");
        assert_eq!(current.meta, meta);
        assert_eq!(snapshot_bytes(&mut current.snapshot).await?, model(&entries[..2]).snapshot());
        StorageHelper::new(&mut log, &mut sm).get_initial_state().await?;
        assert_eq!(state_bytes(&sm), model(&entries).snapshot(), "the log after the snapshot re-applied");
    }
    assert_eq!(snapshot_files(dir.path())?, ["0.snapshot"]);
    assert_eq!(format_of(dir.path())?, Some(5));
    Ok(())
}

/// Only the current snapshot's file stays in `snapshots/`: a newer snapshot removes the one before (whose
/// bytes a transfer that opened it earlier still reads), a transfer from the leader that was given up
/// removes what it received, and files a crash left there are removed when the directory is opened.
#[tokio::test]
async fn snapshots_leave_only_the_current_file() -> Result {
    let dir = tempfile::tempdir()?;
    let entries = vec![membership(1, 1), acquire(1, 2, "alpha", "a", 1), acquire(1, 3, "beta", "b", 2)];
    {
        let (_log, mut sm) = open_quiet(dir.path())?;
        sm.apply(entries[..2].to_vec()).await?;
        sm.get_snapshot_builder().await.build_snapshot().await?;
        let mut sending = sm.get_current_snapshot().await?.expect("a snapshot is stored");
        sm.apply(entries[2..].to_vec()).await?;
        sm.get_snapshot_builder().await.build_snapshot().await?;
        assert_eq!(snapshot_files(dir.path())?.len(), 1, "{:?}", snapshot_files(dir.path())?);
        assert_eq!(snapshot_bytes(&mut sending.snapshot).await?, model(&entries[..2]).snapshot());

        let mut received = sm.begin_receiving_snapshot().await?;
        receive(&mut received, b"part of a snapshot").await?;
        assert_eq!(snapshot_files(dir.path())?.len(), 2);
        drop(received);
        assert_eq!(snapshot_files(dir.path())?.len(), 1);
    }
    let kept = snapshot_files(dir.path())?;
    for left in ["17.new", "16.snapshot"] {
        std::fs::write(dir.path().join("snapshots").join(left), b"left by a crash")?;
    }
    let (_log, sm) = open_quiet(dir.path())?;
    assert_eq!(snapshot_files(dir.path())?, kept);
    assert_eq!(state_bytes(&sm), model(&entries).snapshot());
    Ok(())
}

/// A snapshot file whose bytes are not those recorded with it (a bit flipped on disk) refuses the open, and
/// says which file; so does one cut short.
#[tokio::test]
async fn a_snapshot_file_that_changed_on_disk_refuses_the_open() -> Result {
    let dir = tempfile::tempdir()?;
    {
        let (_log, mut sm) = open_quiet(dir.path())?;
        sm.apply([membership(1, 1), acquire(1, 2, "alpha", "owner-a", 1)]).await?;
        sm.get_snapshot_builder().await.build_snapshot().await?;
    }
    let [name] = &snapshot_files(dir.path())?[..] else { panic!("one snapshot file") };
    let path = dir.path().join("snapshots").join(name);
    let bytes = std::fs::read(&path)?;
    let at = bytes.windows(7).position(|w| w == b"owner-a").expect("the owner is in the snapshot");
    let mut changed = bytes.clone();
    changed[at + 6] = b'b';
    std::fs::write(&path, &changed)?;
    let refused = open_quiet(dir.path()).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(refused.starts_with("the stored snapshot is corrupt: "), "{refused}");
    assert!(refused.contains(name.as_str()), "{refused}");

    std::fs::write(&path, &bytes[..bytes.len() - 1])?;
    let refused = open_quiet(dir.path()).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(refused.starts_with("the stored snapshot is corrupt: "), "{refused}");
    assert!(refused.contains(name.as_str()) && refused.contains("does not read back"), "{refused}");

    std::fs::write(&path, &bytes)?;
    open_quiet(dir.path())?;
    Ok(())
}

/// A purge removes whole log files once a snapshot covers them: after enough entries to fill several
/// segments and a purge of all but the last few, the log directory holds one file, and what is left reads
/// back after a reopen.
#[tokio::test]
async fn purge_deletes_log_files_it_covers() -> Result {
    let dir = tempfile::tempdir()?;
    let big = |index: u64| acquire(1, index, &"x".repeat(4 << 20), "a", index.into());
    let last = 20;
    {
        let (mut log, _sm) = open_quiet(dir.path())?;
        for index in 1..=last {
            log.blocking_append([big(index)]).await?;
        }
        assert!(std::fs::read_dir(dir.path().join("raft-log"))?.count() > 1);
        log.purge(log_id(1, last - 1)).await?;
        assert_eq!(std::fs::read_dir(dir.path().join("raft-log"))?.count(), 1);
    }
    let (mut log, _sm) = open_quiet(dir.path())?;
    let ids: Vec<_> = log.try_get_log_entries(..).await?.into_iter().map(|e| e.log_id).collect();
    assert_eq!(ids, [log_id(1, last)]);
    Ok(())
}

/// The vote survives a restart in its own file; a directory of an older format opens with sled's copy of
/// the vote where it has no file or the copy is the later vote; a vote file whose bytes changed refuses the
/// open, naming the file.
#[tokio::test]
async fn the_vote_is_kept_in_its_own_file_and_a_damaged_one_refuses_the_open() -> Result {
    let dir = tempfile::tempdir()?;
    {
        let (mut log, _sm) = open_quiet(dir.path())?;
        log.save_vote(&Vote::new_committed(5, 2)).await?;
    }
    let file = dir.path().join("vote");
    assert!(file.exists(), "the vote has a file of its own");
    {
        let (mut log, _sm) = open_quiet(dir.path())?;
        assert_eq!(log.read_vote().await?, Some(Vote::new_committed(5, 2)));
        log.save_vote(&Vote::new(6, 3)).await?;
    }
    let bytes = std::fs::read(&file)?;
    // A directory of a build of format 2 or 3, with the vote in sled only: taken from there.
    std::fs::remove_file(&file)?;
    as_older(dir.path(), 3, &[("vote", bincode::serialize(&Vote::<NodeId>::new(6, 3))?)])?;
    {
        let (mut log, _sm) = open_quiet(dir.path())?;
        assert_eq!(log.read_vote().await?, Some(Vote::new(6, 3)));
    }
    assert_eq!(std::fs::read(&file)?, bytes, "written to the file");
    // A build of format 4 ran here and voted in sled only, after its file's vote: its later vote stands.
    as_older(dir.path(), 4, &[("vote", bincode::serialize(&Vote::<NodeId>::new(7, 1))?)])?;
    {
        let (mut log, _sm) = open_quiet(dir.path())?;
        assert_eq!(log.read_vote().await?, Some(Vote::new(7, 1)), "the later vote, from sled's copy");
    }
    // And an earlier copy in sled does not take a vote back.
    as_older(dir.path(), 4, &[("vote", bincode::serialize(&Vote::<NodeId>::new(2, 1))?)])?;
    {
        let (mut log, _sm) = open_quiet(dir.path())?;
        assert_eq!(log.read_vote().await?, Some(Vote::new(7, 1)));
    }
    // A flipped bit in the file: refused, not read.
    let mut damaged = bytes;
    let last = damaged.len() - 1;
    damaged[last] ^= 0x01;
    std::fs::write(&file, &damaged)?;
    let refused = open_quiet(dir.path()).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(refused.starts_with("vote file: ") && refused.contains("damaged"), "{refused}");
    assert!(refused.contains(&file.display().to_string()), "{refused}");
    Ok(())
}

/// Node `dir`'s store after `entries` were appended and the first `through` of them applied and snapshot,
/// with the snapshot's file then damaged (a bit flipped): the open refuses it.
async fn damaged_after(dir: &Path, entries: &[openraft::Entry<holdfast_store::TypeConfig>], through: usize) -> Result {
    {
        let (mut log, mut sm) = open_quiet(dir)?;
        log.blocking_append(entries.to_vec()).await?;
        sm.apply(entries[..through].to_vec()).await?;
        sm.get_snapshot_builder().await.build_snapshot().await?;
    }
    let [name] = &snapshot_files(dir)?[..] else { panic!("one snapshot file") };
    let path = dir.join("snapshots").join(name);
    let mut bytes = std::fs::read(&path)?;
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    std::fs::write(&path, &bytes)?;
    let refused = open_quiet(dir).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(refused.starts_with("the stored snapshot is corrupt: "), "{refused}");
    Ok(())
}

/// A peer's store that applied `entries` and snapshot them: its snapshot, whole, as it serves it.
async fn peer_snapshot(
    entries: &[openraft::Entry<holdfast_store::TypeConfig>],
) -> Result<holdfast_store::SnapshotPiece> {
    let dir = tempfile::tempdir()?;
    let (_log, mut sm) = open_quiet(dir.path())?;
    sm.apply(entries.to_vec()).await?;
    sm.get_snapshot_builder().await.build_snapshot().await?;
    let through = entries.last().expect("entries").log_id.index;
    assert!(sm.source().piece(through + 1, 0, usize::MAX).await?.is_none(), "it covers no more than it applied");
    let head = sm.source().piece(through, 0, 10).await?.expect("a snapshot through the last entry");
    let tail = sm.source().piece(through, 10, usize::MAX).await?.expect("the same snapshot");
    assert_eq!((head.bytes.len(), head.meta.clone(), head.len), (10, tail.meta.clone(), tail.len));
    Ok(holdfast_store::SnapshotPiece { bytes: [head.bytes, tail.bytes].concat(), ..head })
}

/// A damaged snapshot replaced by a peer's that covers more of the log, which the damaged node's log holds
/// (the same entry at its last index): the log is kept whole, entries after the snapshot included, and the
/// store opens to the peer's state, re-applying its committed log after it.
#[tokio::test]
async fn a_peers_snapshot_replaces_a_damaged_one_keeping_a_log_that_holds_its_last_entry() -> Result {
    let dir = tempfile::tempdir()?;
    let entries = vec![
        membership(0, 0),
        blank(1, 1),
        acquire(1, 2, "alpha", "a", 1),
        acquire(1, 3, "beta", "b", 2),
        acquire(1, 4, "gamma", "c", 3),
        acquire(1, 5, "delta", "d", 4),
    ];
    damaged_after(dir.path(), &entries, 3).await?;
    let piece = peer_snapshot(&entries[..5]).await?;
    let replaced = holdfast_store::replace_snapshot(dir.path(), &piece.meta, piece.bytes, piece.len, piece.crc).await?;
    assert_eq!(replaced, holdfast_store::Replaced { index: 4, removed: 0 });
    assert_eq!(snapshot_files(dir.path())?.len(), 1, "the damaged file is gone");

    let (mut log, mut sm) = open_quiet(dir.path())?;
    assert_eq!(sm.applied_state().await?.0, Some(log_id(1, 4)));
    assert_eq!(log.try_get_log_entries(..).await?, entries, "the log is whole");
    log.save_committed(Some(log_id(1, 5))).await?;
    StorageHelper::new(&mut log, &mut sm).get_initial_state().await?;
    assert_eq!(state_bytes(&sm), model(&entries).snapshot());
    Ok(())
}

/// A damaged snapshot replaced by a peer's whose last entry the damaged node's log does not hold (another
/// term's entry at that index, never committed): the log is emptied, and openraft's start purges it through
/// the snapshot, so the node's log is the committed one.
#[tokio::test]
async fn a_peers_snapshot_past_a_log_that_does_not_hold_its_last_entry_empties_the_log() -> Result {
    let dir = tempfile::tempdir()?;
    let ours = vec![membership(0, 0), blank(1, 1), acquire(1, 2, "alpha", "a", 1), acquire(1, 3, "lost", "x", 9)];
    damaged_after(dir.path(), &ours, 2).await?;
    let theirs =
        vec![membership(0, 0), blank(1, 1), acquire(1, 2, "alpha", "a", 1), blank(2, 3), acquire(2, 4, "b", "b", 2)];
    let piece = peer_snapshot(&theirs).await?;
    let replaced = holdfast_store::replace_snapshot(dir.path(), &piece.meta, piece.bytes, piece.len, piece.crc).await?;
    assert_eq!(replaced, holdfast_store::Replaced { index: 4, removed: 4 });

    let (mut log, mut sm) = open_quiet(dir.path())?;
    assert!(log.try_get_log_entries(..).await?.is_empty(), "the log was emptied");
    StorageHelper::new(&mut log, &mut sm).get_initial_state().await?;
    let after = log.get_log_state().await?;
    assert_eq!((after.last_purged_log_id, after.last_log_id), (Some(log_id(2, 4)), Some(log_id(2, 4))));
    assert_eq!(state_bytes(&sm), model(&theirs).snapshot());
    Ok(())
}

/// A peer's snapshot that covers less of the log than the damaged one, or whose bytes are not those it
/// sent the length and CRC of, is refused and changes nothing: the store still refuses to open.
#[tokio::test]
async fn an_older_or_changed_peer_snapshot_is_refused_and_changes_nothing() -> Result {
    let dir = tempfile::tempdir()?;
    let entries = vec![membership(0, 0), blank(1, 1), acquire(1, 2, "alpha", "a", 1), acquire(1, 3, "beta", "b", 2)];
    damaged_after(dir.path(), &entries, 3).await?;
    let before = snapshot_files(dir.path())?;

    let older = peer_snapshot(&entries[..2]).await?;
    let refused = holdfast_store::replace_snapshot(dir.path(), &older.meta, older.bytes, older.len, older.crc).await;
    assert!(refused.err().is_some_and(|e| e.to_string().contains("covers less of the log")));
    let newer = peer_snapshot(&entries).await?;
    let refused =
        holdfast_store::replace_snapshot(dir.path(), &newer.meta, newer.bytes, newer.len, newer.crc ^ 1).await;
    assert!(refused.err().is_some_and(|e| e.to_string().contains("where it sent")));

    assert_eq!(snapshot_files(dir.path())?, before);
    assert!(open_quiet(dir.path()).is_err(), "still damaged");
    Ok(())
}

/// A log with bits flipped among entries it recorded as committed refuses the open; cut at the damage
/// (`cut_damaged_log`), it opens with the entries before the bad record and none after, no saved commit,
/// and the cut recorded (`LogStore::recovering`, naming the file and byte) until the node caught up.
#[tokio::test]
async fn a_damaged_log_cut_at_the_damage_opens_as_recovering_until_caught_up() -> Result {
    let dir = tempfile::tempdir()?;
    let entries: Vec<_> = (1..=40).map(|i| acquire(1, i, &format!("lock-{i}"), "owner", u128::from(i))).collect();
    {
        let (mut log, _sm) = open_quiet(dir.path())?;
        log.blocking_append(entries.clone()).await?;
        log.save_committed(Some(log_id(1, 40))).await?;
        assert!(log.recovering()?.is_none());
    }
    let segments = dir.path().join("raft-log");
    let [segment] = &std::fs::read_dir(&segments)?.map(|e| Ok(e?.path())).collect::<Result<Vec<_>>>()?[..] else {
        panic!("one segment")
    };
    let mut bytes = std::fs::read(segment)?;
    let written = bytes.iter().rposition(|&b| b != 0).expect("bytes written") + 1;
    bytes[written / 2] ^= 0xff;
    std::fs::write(segment, &bytes)?;
    let refused = open_quiet(dir.path()).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(refused.starts_with("the raft log is corrupt: "), "{refused}");

    let what = holdfast_store::cut_damaged_log(dir.path()).await?;
    assert!(what.contains("has a bad record at byte") && what.contains("segment-"), "{what}");
    let (mut log, _sm) = open_quiet(dir.path())?;
    let kept = log.try_get_log_entries(..).await?;
    assert!(!kept.is_empty() && kept.len() < 40, "{} entries kept", kept.len());
    assert_eq!(kept, entries[..kept.len()], "the entries before the damage, as they were");
    assert_eq!(log.read_committed().await?, None);
    let recovering = log.recovering()?.expect("the cut is recorded");
    assert_eq!(recovering.cut, what);
    recovering.caught_up().await?;
    assert!(log.recovering()?.is_none(), "caught up, the record is gone");
    drop(log);
    assert!(open_quiet(dir.path())?.0.recovering()?.is_none());
    Ok(())
}
