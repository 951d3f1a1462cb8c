//! What the memory store keeps across a simulated crash (`MemDisk::crash`, then open the disk again):
//! everything its calls acknowledged, as the disk store keeps it across a restart; and what the
//! deliberately broken disk loses.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::{acquire, blank, log_id, membership, model, receive, snapshot_bytes, state_bytes, Counting};
use holdfast_store::{open_memory, MemDisk, MemLogStore, MemStateMachine, NoObserver, NodeId};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{LogId, RaftLogReader, RaftSnapshotBuilder, StorageHelper, Vote};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

fn reopen(disk: &MemDisk) -> (MemLogStore, MemStateMachine) {
    open_memory(disk, Arc::new(NoObserver))
}

async fn log_ids(log: &mut MemLogStore) -> Result<Vec<LogId<NodeId>>> {
    Ok(log.try_get_log_entries(..).await?.into_iter().map(|e| e.log_id).collect())
}

#[tokio::test]
async fn acknowledged_appends_and_votes_survive_crash() -> Result {
    let disk = MemDisk::new();
    let entries = vec![blank(1, 1), acquire(1, 2, "alpha", "a", 1), membership(1, 3), blank(2, 4)];
    let vote = Vote::new_committed(2, 1);
    {
        let (mut log, _sm) = reopen(&disk);
        log.blocking_append(entries.clone()).await?;
        log.save_vote(&vote).await?;
    }
    disk.crash();

    let (mut log, _sm) = reopen(&disk);
    assert_eq!(log.read_vote().await?, Some(vote));
    assert_eq!(log.try_get_log_entries(..).await?, entries);
    assert_eq!(log.try_get_log_entries(2..4).await?, entries[1..3]);
    let state = log.get_log_state().await?;
    assert_eq!(state.last_purged_log_id, None);
    assert_eq!(state.last_log_id, Some(log_id(2, 4)));
    Ok(())
}

/// `committed` is not flushed on its own, as in the disk store: a crash loses the one written since the
/// last flush, and keeps one a later flush covered.
#[tokio::test]
async fn crash_loses_only_committed_written_since_last_flush() -> Result {
    let disk = MemDisk::new();
    let (mut log, _sm) = reopen(&disk);
    log.blocking_append((1..=4).map(|i| blank(1, i))).await?;
    log.save_committed(Some(log_id(1, 2))).await?;
    log.save_vote(&Vote::new(1, 1)).await?;
    log.save_committed(Some(log_id(1, 4))).await?;
    assert_eq!(log.read_committed().await?, Some(log_id(1, 4)), "reads see the unflushed record");
    assert_eq!(log.committed_index().load(Ordering::Relaxed), 4);
    disk.crash();

    let (mut log, _sm) = reopen(&disk);
    assert_eq!(log.read_committed().await?, Some(log_id(1, 2)), "the vote's flush covered the first");
    assert_eq!(log.committed_index().load(Ordering::Relaxed), 0, "as for sled: none saved since the open");
    assert_eq!(log.get_log_state().await?.last_log_id, Some(log_id(1, 4)));
    Ok(())
}

#[tokio::test]
async fn truncate_and_purge_survive_crash() -> Result {
    let disk = MemDisk::new();
    {
        let (mut log, _sm) = reopen(&disk);
        log.blocking_append((1..=10).map(|i| blank(1, i))).await?;
        log.truncate(log_id(1, 8)).await?;
        // A new leader's entries replace the truncated ones.
        log.blocking_append([blank(2, 8)]).await?;
        log.purge(log_id(1, 5)).await?;
    }
    disk.crash();
    {
        let (mut log, _sm) = reopen(&disk);
        assert_eq!(log_ids(&mut log).await?, [log_id(1, 6), log_id(1, 7), log_id(2, 8)]);
        let state = log.get_log_state().await?;
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 5)));
        assert_eq!(state.last_log_id, Some(log_id(2, 8)));
        log.purge(log_id(2, 8)).await?;
    }
    disk.crash();

    // With every entry purged, the log ends where the purge did.
    let (mut log, _sm) = reopen(&disk);
    let state = log.get_log_state().await?;
    assert_eq!(state.last_purged_log_id, Some(log_id(2, 8)));
    assert_eq!(state.last_log_id, Some(log_id(2, 8)));
    assert!(log.try_get_log_entries(..).await?.is_empty());
    Ok(())
}

/// A crash-and-restart, compared with a model: a plain `LockState` fed every entry. The restarted node
/// has the snapshot (entries 0..=3) and the committed log after it (4..=6); openraft's start-up path
/// re-applies 4..=6, and the result is the model's state byte for byte.
#[tokio::test]
async fn crash_restores_snapshot_and_reapplies_committed_log() -> Result {
    let disk = MemDisk::new();
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
    let observer = Arc::new(Counting::default());
    let built = {
        let (mut log, mut sm) = open_memory(&disk, observer.clone());
        log.blocking_append(entries.clone()).await?;
        sm.apply(entries[..4].to_vec()).await?;
        let built = sm.get_snapshot_builder().await.build_snapshot().await?;
        sm.apply(entries[4..].to_vec()).await?;
        log.save_committed(Some(log_id(1, 6))).await?;
        // The next vote flushes `committed` with it.
        log.save_vote(&Vote::new_committed(1, 1)).await?;
        built
    };
    disk.crash();
    assert_eq!(observer.restored.load(Ordering::SeqCst), 0);

    let (mut log, mut sm) = open_memory(&disk, observer.clone());
    assert_eq!(observer.restored.load(Ordering::SeqCst), 1, "open restores from the snapshot");
    assert_eq!(sm.applied_state().await?.0, Some(log_id(1, 3)), "open restores the snapshot only");
    assert_eq!(state_bytes(&sm.state()), model(&entries[..4]).snapshot());
    let current = sm.get_current_snapshot().await?.expect("the built snapshot is durable");
    assert_eq!(current.meta, built.meta);
    let (mut current_data, mut built_data) = (current.snapshot, built.snapshot);
    assert_eq!(snapshot_bytes(&mut current_data).await?, snapshot_bytes(&mut built_data).await?);

    StorageHelper::new(&mut log, &mut sm).get_initial_state().await?;
    assert_eq!(state_bytes(&sm.state()), model(&entries).snapshot());
    let (applied, membership) = sm.applied_state().await?;
    assert_eq!(applied, Some(log_id(1, 6)));
    assert_eq!(membership.log_id(), &Some(log_id(1, 5)));
    Ok(())
}

/// Without a durable `committed`, a restarted node has the snapshot only, and waits for the leader.
#[tokio::test]
async fn crash_before_committed_is_flushed_restores_snapshot_only() -> Result {
    let disk = MemDisk::new();
    let entries = vec![membership(0, 0), acquire(1, 1, "alpha", "a", 1), acquire(1, 2, "beta", "b", 2)];
    {
        let (mut log, mut sm) = reopen(&disk);
        log.blocking_append(entries.clone()).await?;
        sm.apply(entries[..2].to_vec()).await?;
        sm.get_snapshot_builder().await.build_snapshot().await?;
        sm.apply(entries[2..].to_vec()).await?;
        log.save_committed(Some(log_id(1, 2))).await?;
    }
    disk.crash();

    let (mut log, mut sm) = reopen(&disk);
    StorageHelper::new(&mut log, &mut sm).get_initial_state().await?;
    assert_eq!(sm.applied_state().await?.0, Some(log_id(1, 1)));
    assert_eq!(state_bytes(&sm.state()), model(&entries[..2]).snapshot());
    assert_eq!(log_ids(&mut log).await?.len(), 3, "the log after the snapshot is kept");
    Ok(())
}

#[tokio::test]
async fn installed_snapshot_survives_crash() -> Result {
    let (source_disk, target_disk) = (MemDisk::new(), MemDisk::new());
    let (_source_log, mut source) = reopen(&source_disk);
    source
        .apply([membership(1, 1), acquire(1, 2, "alpha", "a", 1), acquire(2, 3, "alpha", "b", 2), blank(2, 4)])
        .await?;
    let mut snapshot = source.get_snapshot_builder().await.build_snapshot().await?;
    {
        let (_target_log, mut target) = reopen(&target_disk);
        let mut received = target.begin_receiving_snapshot().await?;
        receive(&mut received, &snapshot_bytes(&mut snapshot.snapshot).await?).await?;
        target.install_snapshot(&snapshot.meta, received).await?;
        assert_eq!(state_bytes(&target.state()), state_bytes(&source.state()));
    }
    target_disk.crash();

    let (_target_log, mut target) = reopen(&target_disk);
    assert_eq!(state_bytes(&target.state()), state_bytes(&source.state()));
    assert_eq!(target.applied_state().await?, source.applied_state().await?);
    assert_eq!(target.get_current_snapshot().await?.map(|s| s.meta), Some(snapshot.meta));
    Ok(())
}

/// A crashed node is gone: the stores it had are refused, so they cannot write to the restarted
/// node's disk. Opening the disk again fences off the earlier open in the same way.
#[tokio::test]
async fn stores_opened_before_a_crash_or_reopen_are_refused() -> Result {
    let disk = MemDisk::new();
    let (mut old_log, mut old_sm) = reopen(&disk);
    old_log.blocking_append([blank(1, 1)]).await?;
    disk.crash();
    assert!(old_log.read_vote().await.is_err());
    assert!(old_log.save_vote(&Vote::new(2, 1)).await.is_err());
    assert!(old_sm.get_snapshot_builder().await.build_snapshot().await.is_err());

    let (mut log, _sm) = reopen(&disk);
    assert_eq!(log.read_vote().await?, None, "the refused vote was not written");
    let (mut newer_log, _newer_sm) = reopen(&disk);
    assert!(log.get_log_state().await.is_err());
    assert_eq!(newer_log.get_log_state().await?.last_log_id, Some(log_id(1, 1)));
    Ok(())
}

/// The observer hears of a flush wherever the disk store flushes (append, vote, truncate, purge,
/// snapshot), and of none for `committed`, which is not flushed on its own.
#[tokio::test]
async fn flushes_are_reported_where_sled_flushes() -> Result {
    let disk = MemDisk::new();
    let observer = Arc::new(Counting::default());
    let (mut log, mut sm) = open_memory(&disk, observer.clone());
    let mut expected = 0;
    let mut check = |what: &str, flushes: usize| {
        expected += flushes;
        assert_eq!(observer.flushes(), expected, "{what}");
    };
    log.blocking_append((1..=4).map(|i| blank(1, i))).await?;
    check("append", 1);
    log.save_vote(&Vote::new(1, 1)).await?;
    check("vote", 1);
    log.save_committed(Some(log_id(1, 2))).await?;
    check("committed", 0);
    log.truncate(log_id(1, 4)).await?;
    check("truncate", 1);
    log.purge(log_id(1, 1)).await?;
    check("purge", 1);
    sm.apply([blank(1, 1)]).await?;
    check("apply", 0);
    sm.get_snapshot_builder().await.build_snapshot().await?;
    check("snapshot", 1);
    Ok(())
}

/// The broken disk really is broken: an append it acknowledged is gone after a crash. The same calls
/// on a correct disk keep it.
#[tokio::test]
async fn acking_before_flush_disk_loses_an_acknowledged_append() -> Result {
    let appended = async |disk: &MemDisk| -> Result<Vec<LogId<NodeId>>> {
        {
            let (mut log, _sm) = reopen(disk);
            log.blocking_append([blank(1, 1), blank(1, 2)]).await?;
            // Acknowledged: `blocking_append` returns only once the append's callback fired.
            log.blocking_append([blank(1, 3)]).await?;
            assert_eq!(log_ids(&mut log).await?.len(), 3, "reads see every append before the crash");
        }
        disk.crash();
        let (mut log, _sm) = reopen(disk);
        log_ids(&mut log).await
    };

    let kept = [log_id(1, 1), log_id(1, 2)];
    assert_eq!(appended(&MemDisk::acking_before_flush()).await?, kept, "the last acknowledged append is lost");
    assert_eq!(appended(&MemDisk::new()).await?, [kept[0], kept[1], log_id(1, 3)]);
    Ok(())
}

/// The broken disk makes an append durable at the next flush, whatever it is for.
#[tokio::test]
async fn acking_before_flush_disk_keeps_appends_a_later_flush_covered() -> Result {
    let disk = MemDisk::acking_before_flush();
    {
        let (mut log, _sm) = reopen(&disk);
        log.blocking_append([blank(1, 1)]).await?;
        log.save_vote(&Vote::new(1, 1)).await?;
        log.blocking_append([blank(1, 2)]).await?;
    }
    disk.crash();
    let (mut log, _sm) = reopen(&disk);
    assert_eq!(log_ids(&mut log).await?, [log_id(1, 1)]);
    assert_eq!(log.read_vote().await?, Some(Vote::new(1, 1)));
    Ok(())
}

/// What a log store must show: its log, vote and committed log id, kept the simple way.
#[derive(Debug, Default)]
struct LogModel {
    log: BTreeMap<u64, LogId<NodeId>>,
    last_purged: Option<LogId<NodeId>>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
    /// `committed` as of the last flush: what a crash keeps.
    committed_flushed: Option<LogId<NodeId>>,
}

impl LogModel {
    fn flushed(&mut self) {
        self.committed_flushed = self.committed;
    }

    /// An index of an entry in the log, if it has any.
    fn pick(&self, rng: &mut StdRng) -> Option<LogId<NodeId>> {
        let (first, last) = (*self.log.keys().next()?, *self.log.keys().next_back()?);
        Some(self.log[&rng.gen_range(first..=last)])
    }

    async fn check(&self, log: &mut MemLogStore, step: usize) -> Result {
        let ids: Vec<_> = self.log.values().copied().collect();
        assert_eq!(log_ids(log).await?, ids, "log at step {step}");
        let state = log.get_log_state().await?;
        assert_eq!(state.last_purged_log_id, self.last_purged, "last purged at step {step}");
        assert_eq!(state.last_log_id, ids.last().copied().or(self.last_purged), "last log id at step {step}");
        assert_eq!(log.read_vote().await?, self.vote, "vote at step {step}");
        assert_eq!(log.read_committed().await?, self.committed, "committed at step {step}");
        Ok(())
    }
}

/// Random appends, truncations, purges, votes, commits and crashes (sled's `fuzz_model` with its
/// `Reboot`): after every step, the store shows what the model says, and a crash keeps all of it but
/// a `committed` written since the last flush.
#[tokio::test]
async fn random_calls_and_crashes_match_a_model() -> Result {
    for seed in 0..20 {
        let mut rng = StdRng::seed_from_u64(seed);
        let disk = MemDisk::new();
        let (mut log, mut _sm) = reopen(&disk);
        let mut model = LogModel::default();
        let mut term = 1;
        for step in 0..200 {
            match rng.gen_range(0..10) {
                0..=3 => {
                    let next = model.log.keys().next_back().copied().or(model.last_purged.map(|p| p.index));
                    let first = next.map_or(1, |i| i + 1);
                    let ids: Vec<_> = (first..first + rng.gen_range(1..4)).map(|i| log_id(term, i)).collect();
                    log.blocking_append(ids.iter().map(|id| blank(id.leader_id.term, id.index))).await?;
                    model.log.extend(ids.iter().map(|id| (id.index, *id)));
                    model.flushed();
                }
                4 => {
                    if let Some(at) = model.pick(&mut rng) {
                        log.truncate(at).await?;
                        model.log.split_off(&at.index);
                        model.flushed();
                    }
                }
                5 => {
                    if let Some(upto) = model.pick(&mut rng) {
                        log.purge(upto).await?;
                        model.log = model.log.split_off(&(upto.index + 1));
                        model.last_purged = Some(upto);
                        model.flushed();
                    }
                }
                6 => {
                    term += rng.gen_range(0..2);
                    let vote = Vote::new(term, rng.gen_range(1..=3));
                    log.save_vote(&vote).await?;
                    model.vote = Some(vote);
                    model.flushed();
                }
                7 | 8 => {
                    let committed = model.pick(&mut rng);
                    log.save_committed(committed).await?;
                    model.committed = committed;
                }
                _ => {
                    disk.crash();
                    (log, _sm) = reopen(&disk);
                    model.committed = model.committed_flushed;
                }
            }
            model.check(&mut log, step).await.map_err(|e| format!("seed {seed}: {e}"))?;
        }
    }
    Ok(())
}

/// A leader's own entries (`acknowledge_own_appends`) are acknowledged before they are durable: a crash
/// before anything flushes them loses them, `committed` is not saved past them, and an apply of them
/// first makes them durable. A follower's append under the same store is durable when acknowledged.
#[tokio::test]
async fn a_leaders_own_appends_are_durable_only_once_flushed_and_applied_only_then() -> Result {
    let disk = MemDisk::new();
    let entries = [blank(1, 1), acquire(1, 2, "alpha", "a", 1)];
    {
        let (log, _sm) = reopen(&disk);
        let mut log = log.acknowledge_own_appends(1);
        // Node 1 is the leader of term 1: the vote is its own, and so are the entries.
        log.save_vote(&Vote::new_committed(1, 1)).await?;
        log.blocking_append(entries.to_vec()).await?;
        assert_eq!(log_ids(&mut log).await?, vec![log_id(1, 1), log_id(1, 2)], "reads see them at once");
        assert_eq!(log.durable().last(), None, "not durable yet");
        log.save_committed(Some(log_id(1, 2))).await?;
        assert_eq!(log.read_committed().await?, None, "not saved past the durable log");
    }
    disk.crash();
    let (mut log, mut sm) = reopen(&disk);
    assert_eq!(log_ids(&mut log).await?, vec![], "the crash lost the leader's unflushed entries");

    let mut log = log.acknowledge_own_appends(1);
    log.save_vote(&Vote::new_committed(2, 1)).await?;
    let own: Vec<_> = (1..=3).map(|i| blank(2, i)).collect();
    log.blocking_append(own).await?;
    let durable = log.durable();
    assert_eq!(durable.last(), None);
    // Applying them waits for them to be durable: the memory store flushes when asked.
    sm.apply((1..=3).map(|i| blank(2, i)).collect::<Vec<_>>()).await?;
    assert_eq!(durable.last(), Some(log_id(2, 3)));
    log.save_committed(Some(log_id(2, 3))).await?;
    assert_eq!(log.read_committed().await?, Some(log_id(2, 3)));

    // Another leader's vote: the same kind of entries are a follower's, durable when acknowledged.
    log.save_vote(&Vote::new_committed(3, 2)).await?;
    log.blocking_append(vec![blank(2, 4)]).await?;
    assert_eq!(durable.last(), Some(log_id(2, 4)));
    disk.crash();
    let (mut log, _sm) = reopen(&disk);
    assert_eq!(log.try_get_log_entries(..).await?.len(), 4);
    Ok(())
}
