//! The whole disk store (log, vote, records, snapshots, commit) on a file system that loses, at a power cut,
//! what was not synced: openraft's storage suite on it, and seeded runs that cut the power at a random file
//! operation of a random workload, open the store again and check that nothing acknowledged is lost, nothing
//! removed comes back, and the node restarts to the state its log and snapshot say. A third of the runs are
//! a leader's, whose own entries are acknowledged when written and synced later (by a task here, a thread
//! in a node): there what the store reported durable must survive, and nothing may have acted on the rest.
//! Another third are a follower's that syncs most appends aside (by that task), as a node with many
//! clients' writes waiting does, acknowledging each once durable.
//!
//! `HOLDFAST_CRASH_SEEDS=N` runs N seeds (default 500); a soak by hand runs thousands.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{acquire, blank, log_id, model, receive, snapshot_bytes};
use holdfast_core::{Applied, LockState};
use holdfast_store::testing::{open_on_crash_fs, CrashFs};
use holdfast_store::{ApplyObserver, LogStore, NoObserver, NodeId, StateMachineStore, TypeConfig};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{
    Entry, LogId, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta, StorageError, StorageHelper, StorageIOError,
    StoredMembership, Vote,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DIR: &str = "/store";

fn open(fs: &Arc<CrashFs>) -> Result<(LogStore, StateMachineStore), holdfast_store::StoreError> {
    open_on_crash_fs(fs.clone(), Path::new(DIR), Arc::new(NoObserver))
}

/// An observer that has three in four of a follower's appends synced aside, as a node with many clients'
/// writes waiting does, so that a run mixes both ways; it remembers its last answer.
#[derive(Default)]
struct MostlyAside {
    asked: AtomicU64,
    last: AtomicBool,
}

impl ApplyObserver for MostlyAside {
    fn applied(&self, _state: &LockState, _index: u64, _cmd: &holdfast_core::Command, _applied: &Applied) {}

    fn restored(&self, _state: &LockState) {}

    fn sync_aside(&self) -> bool {
        let aside = self.asked.fetch_add(1, Ordering::SeqCst) % 4 != 3;
        self.last.store(aside, Ordering::SeqCst);
        aside
    }
}

/// A fresh store on a file system of its own for every test of the suite; the file system is the guard.
struct OnCrashFs;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, Arc<CrashFs>> for OnCrashFs {
    async fn build(&self) -> Result<(Arc<CrashFs>, LogStore, StateMachineStore), StorageError<NodeId>> {
        let fs = Arc::new(CrashFs::new(0, false));
        let (log, state_machine) = open(&fs).map_err(|e| StorageIOError::write(&e))?;
        Ok((fs, log, state_machine))
    }
}

#[test]
fn the_store_on_the_crash_file_system_passes_openraft_storage_suite() -> Result<(), Box<StorageError<NodeId>>> {
    Suite::test_all(OnCrashFs).map_err(Box::new)
}

/// What the workload had acknowledged when the power went, and what it was doing.
#[derive(Default)]
struct Acked {
    /// The log as acknowledged appends, truncations and purges left it.
    log: BTreeMap<u64, Entry<TypeConfig>>,
    purged: Option<u64>,
    vote: Option<Vote<NodeId>>,
    /// The last index saved as committed (not durable on its own), and the last applied.
    committed: u64,
    applied: u64,
    /// The last log index of the last snapshot built or installed.
    snapshot: Option<u64>,
    /// Every entry ever committed: they never change.
    history: BTreeMap<u64, Entry<TypeConfig>>,
    term: u64,
    /// The operation under way when the process died.
    dying: Option<Op>,
    /// Whether the store acknowledges its own appends as leader before their sync (see the module docs).
    leader: bool,
    /// The end of the log the store last reported durable.
    durable: Option<u64>,
}

#[derive(Debug, Clone)]
enum Op {
    Append(Vec<Entry<TypeConfig>>),
    /// An append synced aside (see [`MostlyAside`]).
    AppendAside(Vec<Entry<TypeConfig>>),
    Vote(Vote<NodeId>),
    Truncate(u64),
    Purge(u64),
    Build,
    Install(u64),
    Other,
}

impl Acked {
    fn last(&self) -> u64 {
        self.log.keys().next_back().copied().or(self.purged).unwrap_or(0)
    }

    fn id(&self, index: u64) -> LogId<NodeId> {
        self.log.get(&index).or(self.history.get(&index)).map(|e| e.log_id).unwrap_or_else(|| log_id(1, index))
    }

    fn state_at(&self, index: u64) -> Vec<u8> {
        let entries: Vec<_> = self.history.range(..=index).map(|(_, e)| e.clone()).collect();
        model(&entries).snapshot()
    }
}

type Failed = Box<dyn std::error::Error>;

/// One step of the workload, chosen by `rng`: what a follower's openraft asks of its store, in an order it
/// could. An error ends the run (the process died).
async fn step(
    rng: &mut StdRng,
    acked: &mut Acked,
    log: &mut LogStore,
    sm: &mut StateMachineStore,
) -> Result<(), Failed> {
    let last = acked.last();
    match rng.gen_range(0..11) {
        0..=3 => {
            let entries: Vec<_> = (last + 1..=last + rng.gen_range(1..4))
                .map(|i| if i % 3 == 0 { blank(acked.term, i) } else { acquire(acked.term, i, "job", "w", i.into()) })
                .collect();
            acked.dying = Some(Op::Append(entries.clone()));
            log.blocking_append(entries.clone()).await?;
            acked.log.extend(entries.into_iter().map(|e| (e.log_id.index, e)));
        }
        4 if !acked.leader => {
            acked.term += rng.gen_range(0..2);
            let vote = Vote::new_committed(acked.term, 1);
            acked.dying = Some(Op::Vote(vote));
            log.save_vote(&vote).await?;
            acked.vote = Some(vote);
        }
        5 if last > acked.committed => {
            let committed = rng.gen_range(acked.committed + 1..=last);
            for i in acked.committed + 1..=committed {
                acked.history.insert(i, acked.log[&i].clone());
            }
            acked.dying = Some(Op::Other);
            log.save_committed(Some(acked.id(committed))).await?;
            acked.committed = committed;
        }
        10 if acked.committed > acked.applied => {
            let entries: Vec<_> =
                acked.history.range(acked.applied + 1..=acked.committed).map(|(_, e)| e.clone()).collect();
            acked.dying = Some(Op::Other);
            sm.apply(entries).await?;
            acked.applied = acked.committed;
        }
        6 if acked.applied > acked.snapshot.unwrap_or(0) => {
            acked.dying = Some(Op::Build);
            let built = sm.get_snapshot_builder().await.build_snapshot().await?;
            acked.snapshot = built.meta.last_log_id.map(|id| id.index);
        }
        7 if acked.snapshot > acked.purged => {
            let upto = rng.gen_range(acked.purged.map_or(1, |p| p + 1)..=acked.snapshot.unwrap_or(0));
            acked.dying = Some(Op::Purge(upto));
            log.purge(acked.id(upto)).await?;
            acked.purged = Some(upto);
            acked.log.retain(|i, _| *i > upto);
        }
        8 if last > acked.committed && !acked.leader => {
            let from = rng.gen_range(acked.committed + 1..=last);
            acked.dying = Some(Op::Truncate(from));
            log.truncate(acked.id(from)).await?;
            acked.log.retain(|i, _| *i < from);
            acked.term += 1;
        }
        9 if acked.committed > acked.applied && !acked.leader => {
            // A leader's snapshot of a committed prefix this node has not applied yet.
            let at = rng.gen_range(acked.applied + 1..=acked.committed);
            let meta = SnapshotMeta {
                last_log_id: Some(acked.id(at)),
                last_membership: StoredMembership::default(),
                snapshot_id: format!("leader-{at}"),
            };
            acked.dying = Some(Op::Install(at));
            let mut received = sm.begin_receiving_snapshot().await?;
            receive(&mut received, &acked.state_at(at)).await?;
            sm.install_snapshot(&meta, received).await?;
            (acked.applied, acked.snapshot) = (at, Some(at));
            // openraft then purges what the snapshot covers.
            log.purge(acked.id(at)).await?;
            acked.purged = Some(at);
            acked.log.retain(|i, _| *i > at);
        }
        _ => return Ok(()),
    }
    acked.dying = None;
    Ok(())
}

/// Runs seed `seed`'s workload until the process dies at a random file operation, cuts the power, opens the
/// store again and checks it against what was acknowledged; the operation the process died in.
async fn crash_run(seed: u64, lying: bool) -> Result<Option<Op>, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let fs = Arc::new(CrashFs::new(seed, lying));
    let mut acked = Acked { term: 1, leader: seed.is_multiple_of(3), ..Default::default() };
    let leader = acked.leader;
    let aside = Arc::new(MostlyAside::default());
    let open =
        |fs: &Arc<CrashFs>| open(fs).map(|(log, sm)| (if leader { log.acknowledge_own_appends(1) } else { log }, sm));
    {
        let (mut log, mut sm) = match seed % 3 {
            1 => open_on_crash_fs(fs.clone(), Path::new(DIR), aside.clone()),
            _ => open(&fs),
        }
        .map_err(|e| format!("first open: {e}"))?;
        // A Raft log starts at index 0 (the initial membership's entry, here a blank one).
        let first = blank(0, 0);
        log.blocking_append([first.clone()]).await.map_err(|e| format!("first append: {e}"))?;
        acked.log.insert(0, first.clone());
        acked.history.insert(0, first);
        if acked.leader {
            // This node's own vote, as a leader's: its entries of term 1 are its own.
            let vote = Vote::new_committed(1, 1);
            log.save_vote(&vote).await.map_err(|e| format!("first vote: {e}"))?;
            acked.vote = Some(vote);
        }
        fs.die_after(rng.gen_range(0..400));
        for _ in 0..120 {
            // Bounded: an apply waits for the log's sync, which fails once the process died.
            let stepped = tokio::time::timeout(Duration::from_secs(10), step(&mut rng, &mut acked, &mut log, &mut sm));
            let stepped = matches!(stepped.await, Ok(Ok(())));
            acked.durable = acked.durable.max(log.durable().last().map(|id| id.index));
            if !stepped {
                break;
            }
        }
    }
    if let (Some(Op::Append(entries)), true) = (&acked.dying, aside.last.load(Ordering::SeqCst)) {
        acked.dying = Some(Op::AppendAside(entries.clone()));
    }
    fs.crash();
    let (mut log, mut sm) = open(&fs).map_err(|e| format!("the open after the crash: {e}"))?;
    check(&acked, &mut log, &mut sm).await.map_err(|e| format!("{e} (dying in {:?})", acked.dying))?;
    Ok(acked.dying)
}

async fn check(acked: &Acked, log: &mut LogStore, sm: &mut StateMachineStore) -> Result<(), Failed> {
    let dying = acked.dying.clone();
    // The vote: the acknowledged one, or the one being saved (a leader's own comes back not committed).
    let vote = log.read_vote().await?;
    let same = |a: Option<Vote<NodeId>>, b: Option<Vote<NodeId>>| match acked.leader {
        true => a.map(|v| *v.leader_id()) == b.map(|v| *v.leader_id()),
        false => a == b,
    };
    if !same(vote, acked.vote) && !matches!(dying, Some(Op::Vote(v)) if vote == Some(v)) {
        return Err(format!("vote {vote:?}, where {:?} was acknowledged", acked.vote).into());
    }
    // The log: the acknowledged entries after the purge point, then at most what was being appended.
    let state = log.get_log_state().await?;
    let purged = state.last_purged_log_id.map(|id| id.index);
    if purged != acked.purged && !matches!(dying, Some(Op::Purge(p) | Op::Install(p)) if purged == Some(p)) {
        return Err(format!("purged through {purged:?}, where {:?} was acknowledged", acked.purged).into());
    }
    let found: BTreeMap<u64, Entry<TypeConfig>> =
        log.try_get_log_entries(..).await?.into_iter().map(|e| (e.log_id.index, e)).collect();
    // What must be there: every acknowledged entry after the purge point; a leader's own only once the store
    // reported them durable.
    let durable = if acked.leader { acked.durable.unwrap_or(0) } else { u64::MAX };
    let expected: BTreeMap<u64, _> =
        acked.log.iter().filter(|(i, _)| Some(**i) > purged && **i <= durable).map(|(i, e)| (*i, e.clone())).collect();
    let in_flight: BTreeMap<u64, _> = match &dying {
        Some(Op::Append(entries) | Op::AppendAside(entries)) => {
            entries.iter().map(|e| (e.log_id.index, e.clone())).collect()
        }
        _ => BTreeMap::new(),
    };
    for (i, entry) in &found {
        if acked.log.get(i) != Some(entry) && in_flight.get(i) != Some(entry) {
            return Err(format!("entry {i} reads {:?}, neither acknowledged nor being appended", entry.log_id).into());
        }
    }
    // A truncation under way may have removed the entries from its start on, or some of them.
    let kept_below = match dying {
        Some(Op::Truncate(from)) => from,
        _ => u64::MAX,
    };
    if let Some(i) = expected.keys().find(|i| **i < kept_below && !found.contains_key(i)) {
        return Err(format!("acknowledged entry {i} is gone").into());
    }
    finish(acked, log, sm).await
}

/// The snapshot and the restart: the acknowledged snapshot (or a newer one being made) is current and holds
/// the state of its log position; the log starts no later than right after it; and openraft's start re-applies
/// to the state of the commit it finds.
async fn finish(acked: &Acked, log: &mut LogStore, sm: &mut StateMachineStore) -> Result<(), Failed> {
    let current = sm.get_current_snapshot().await?;
    let at = current.as_ref().and_then(|s| s.meta.last_log_id).map(|id| id.index);
    let newer_allowed = matches!(acked.dying, Some(Op::Build | Op::Install(_)));
    if at < acked.snapshot || (at > acked.snapshot && !newer_allowed) {
        return Err(format!("the current snapshot is of {at:?}, where {:?} was acknowledged", acked.snapshot).into());
    }
    if let Some(mut current) = current {
        let bytes = snapshot_bytes(&mut current.snapshot).await?;
        if bytes != acked.state_at(at.unwrap_or(0)) {
            return Err(format!("the snapshot of {at:?} does not hold that position's state").into());
        }
    }
    let purged = log.get_log_state().await?.last_purged_log_id.map(|id| id.index);
    if purged > at {
        return Err(format!("the log is purged through {purged:?}, past the snapshot of {at:?}").into());
    }
    StorageHelper::new(log, sm).get_initial_state().await?;
    let (applied, _) = sm.applied_state().await?;
    let applied = applied.map_or(0, |id| id.index);
    if applied > acked.history.keys().next_back().copied().unwrap_or(0).max(at.unwrap_or(0)) {
        return Err(format!("applied through {applied}, past anything committed").into());
    }
    if sm.state().read().map_err(|_| "poisoned")?.snapshot() != acked.state_at(applied) {
        return Err(format!("the state after the restart is not that of entry {applied}").into());
    }
    Ok(())
}

fn seeds() -> u64 {
    std::env::var("HOLDFAST_CRASH_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(500)
}

/// A power cut at any file operation of a workload of appends, votes, commits and applies, snapshot builds and
/// installs, purges and truncations: after it, the store opens, holds everything it acknowledged and nothing
/// it removed, and restarts to the state its snapshot and log say.
#[tokio::test]
async fn a_power_cut_at_any_file_operation_loses_nothing_the_store_acknowledged() {
    let mut cut_in = std::collections::BTreeSet::new();
    for seed in 0..seeds() {
        match crash_run(seed, false).await {
            Ok(dying) => cut_in.extend(dying.map(|op| format!("{op:?}").split('(').next().unwrap_or("").to_owned())),
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
    // The runs cut the power in the middle of every kind of operation.
    assert_eq!(
        cut_in.into_iter().collect::<Vec<_>>(),
        ["Append", "AppendAside", "Build", "Install", "Other", "Purge", "Truncate", "Vote"]
    );
}

/// The check above catches a store that does not sync: on a file system whose syncs do nothing, some run
/// loses what the store acknowledged, or cannot open again.
#[tokio::test]
async fn the_whole_store_crash_check_catches_a_store_that_does_not_sync() {
    let mut caught = 0;
    for seed in 0..200 {
        caught += u32::from(crash_run(seed, true).await.is_err());
    }
    assert!(caught > 0, "no run lost anything on a file system that syncs nothing");
}
