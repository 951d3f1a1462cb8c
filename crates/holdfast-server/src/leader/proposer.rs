//! Batched proposals: the leader's one-lock commands that arrive while the log is busy travel together in
//! one [`Command::Batch`] (or [`Command::Group`]) entry.
//!
//! openraft 0.9 appends one client write at a time and waits for that append's flush before it takes the
//! next, so without batching every acquire and release costs the leader its own fsync, and the leader's
//! rate is one entry per flush. Here every one-lock command (acquire, release, renew, cancel) goes into a
//! queue; a single task takes what has queued, up to [`limits::BATCH_MAX`] commands, and proposes them as
//! one entry, with at most [`IN_FLIGHT`] entries proposed and not yet applied at once. A lone command is
//! proposed as it is, so an idle cluster answers exactly as fast as before; under load, one append, one
//! flush per node and one round trip serve the whole batch.
//!
//! A lock may appear in an entry more than once only as a [`Command::Group`] allows: one command that is
//! not an acquire, then acquires, of which at most one is a semaphore's (a limit above 1). A second such
//! command on a lock waits for the next entry, as does one that follows an acquire of its lock, and a
//! second semaphore acquire: no lock is granted twice under one fence. Batches are taken in
//! order of arrival, but two entries in flight at once may commit in either order; their commands were all
//! outstanding together, so either order is linearizable (a client's next command is only sent after the
//! answer to its previous one).
//!
//! **Acquires that will queue wait for the release.** A crowd on one lock makes two writes per hand-over:
//! the holder's release, and the previous holder's next acquire, which queues. Both follow the same
//! apply, tens of microseconds apart, and proposed as they come they take two entries, two flushes on
//! every node and two replication round trips, with the release (on which the hand-over waits) often
//! behind the acquire. So an acquire that waits, on a lock this node's state shows held, stays in the
//! queue for up to the queue hold (`--queue-hold`, [`QUEUE_HOLD`] unless set), until a command on its lock
//! (the release, as a rule) comes to go in the same entry ahead of it, or an entry this proposer sent is
//! applied (which may have freed the lock), or the time is up. It costs such an acquire at most that long
//! before it is told it queues; it was going to wait for a hand-over in any case. A hold of zero turns
//! this off.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast_core::{limits, Command, LockState, Outcome, Reject};
use holdfast_store::{Response, SharedState};
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};
use tokio::time::Instant;

use super::append::Appender;
use crate::metrics::Metrics;
use crate::peer::protocol::NodeError;

/// Batch entries proposed and not yet answered, at most. Two keep the leader's disk busy: one batch
/// flushes while the one before it waits for its quorum.
pub const IN_FLIGHT: usize = 2;

/// How long an acquire that will queue may wait in the proposer for a command on its lock to share its
/// entry, unless configured (timers are as coarse as the runtime's, about a millisecond).
pub const QUEUE_HOLD: Duration = Duration::from_millis(5);

/// A command waiting to be proposed, and where its answer goes.
struct Queued {
    cmd: Command,
    reply: oneshot::Sender<Result<(u64, Response), NodeError>>,
    since: Instant,
}

/// The queue of one-lock commands waiting to be proposed (the leader's `propose` fills it, [`run`] empties
/// it).
pub struct Proposer {
    tx: mpsc::UnboundedSender<Queued>,
    rx: Mutex<Option<mpsc::UnboundedReceiver<Queued>>>,
    /// How long an acquire that will queue may wait for a command on its lock (see the module's doc).
    hold: Duration,
}

impl Default for Proposer {
    fn default() -> Self {
        Proposer::new(QUEUE_HOLD)
    }
}

impl Proposer {
    /// A proposer that holds acquires that will queue for up to `hold` (`--queue-hold`).
    pub fn new(hold: Duration) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Proposer { tx, rx: Mutex::new(Some(rx)), hold }
    }

    /// Queues `cmd` (a one-lock command) and waits for its index and answer.
    pub async fn propose(&self, cmd: Command) -> Result<(u64, Response), NodeError> {
        let (reply, answer) = oneshot::channel();
        if self.tx.send(Queued { cmd, reply, since: Instant::now() }).is_err() {
            // The node is stopping and its proposer is gone: nothing was proposed, so the caller (a
            // follower forwarding) may safely try again, at the next leader.
            return Err(NodeError::NotLeader { leader: None });
        }
        // An answer dropped unsent: the proposer was stopped with the command queued or in flight.
        answer.await.unwrap_or_else(|_| Err(NodeError::Unavailable("the node stopped while proposing".into())))
    }
}

/// Proposes what queues in `proposer` through `appender` until the task is aborted (the server does so
/// once its client requests drained). Runs once per node; a second call returns at once.
pub async fn run(proposer: &Proposer, appender: Arc<Appender>, state: SharedState, metrics: Arc<Metrics>) {
    let Some(mut rx) = proposer.rx.lock().expect("proposer poisoned").take() else { return };
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    let applied = Arc::new(Notify::new());
    let mut waiting: VecDeque<Queued> = VecDeque::new();
    loop {
        if waiting.is_empty() {
            match rx.recv().await {
                Some(queued) => waiting.push_back(queued),
                None => return,
            }
        }
        // While the earlier batches are in flight, more commands queue up for this one.
        let Ok(permit) = in_flight.clone().acquire_owned().await else { return };
        while let Ok(queued) = rx.try_recv() {
            waiting.push_back(queued);
        }
        let (taken, held_back) = {
            let state = crate::state::read(&state);
            take_batch(&mut waiting, &state, Instant::now(), proposer.hold)
        };
        metrics.held_back.set(held_back as i64);
        match taken {
            Taken::Batch(batch) => {
                let (appender, applied) = (appender.clone(), applied.clone());
                tokio::spawn(async move {
                    propose_batch(&appender, batch).await;
                    drop(permit);
                    applied.notify_one();
                });
            }
            Taken::Nothing => {}
            Taken::Held { until } => {
                // Only acquires that will queue are waiting: for a command on their lock, an entry applied,
                // or the end of their hold.
                drop(permit);
                tokio::select! {
                    queued = rx.recv() => match queued {
                        Some(queued) => waiting.push_back(queued),
                        None => return,
                    },
                    _ = applied.notified() => {}
                    _ = tokio::time::sleep_until(until) => {}
                }
            }
        }
    }
}

/// What [`take_batch`] found to propose.
enum Taken {
    Batch(Vec<Queued>),
    /// Every command left had its caller go away.
    Nothing,
    /// Only acquires held back (see the module's doc) are waiting; the first may go alone at `until`.
    Held {
        until: Instant,
    },
}

/// Whether `cmd` is an acquire that will queue, by `state`, and may wait for its lock's release to share
/// its entry: it waits for the lock, every place of the lock is taken, and it has not waited `hold` yet.
fn held_back(state: &LockState, queued: &Queued, now: Instant, hold: Duration) -> bool {
    match queued.cmd.acquire() {
        Some((acquire, _)) => acquire.wait_ms > 0 && now < queued.since + hold && state.is_full(&acquire.name),
        None => false,
    }
}

/// Takes from the front of `waiting` up to [`limits::BATCH_MAX`] commands that may share an entry; a
/// command that may not stays, in order, for a later batch. Acquires that will queue are held back unless
/// a command on their lock is taken, which they then follow; how many stay held back is returned too. A
/// command whose caller went away before it was proposed (a client that disconnected, a request that
/// timed out) is dropped: as before batching, a request abandoned before its proposal changes nothing.
fn take_batch(waiting: &mut VecDeque<Queued>, state: &LockState, now: Instant, hold: Duration) -> (Taken, usize) {
    // The locks the batch has a command on, and those it has a semaphore's acquire of.
    let mut taken: BTreeSet<String> = BTreeSet::new();
    let mut semaphores: BTreeSet<String> = BTreeSet::new();
    let mut batch = Vec::new();
    let mut rest = VecDeque::new();
    let mut until: Option<Instant> = None;
    let mut held = 0;
    while let Some(queued) = waiting.pop_front() {
        if queued.reply.is_closed() {
            continue;
        }
        if batch.len() == limits::BATCH_MAX {
            waiting.push_front(queued);
            break;
        }
        let name = queued.cmd.lock_name().expect("only one-lock commands are queued");
        if queued.cmd.limit() > 1 && semaphores.contains(name) {
            // A second acquire of a semaphore could take a second free place under the same fence.
            rest.push_back((queued, false));
        } else if queued.cmd.is_acquire() {
            if !taken.contains(name) && held_back(state, &queued, now, hold) {
                until = Some(until.map_or(queued.since, |u| u.min(queued.since)));
                held += 1;
                rest.push_back((queued, true));
                continue;
            }
            if queued.cmd.limit() > 1 {
                semaphores.insert(name.to_owned());
            }
            taken.insert(name.to_owned());
            batch.push(queued);
        } else if taken.contains(name) {
            // A lock's second command that is not an acquire, or one after an acquire of its lock.
            rest.push_back((queued, false));
        } else {
            taken.insert(name.to_owned());
            batch.push(queued);
        }
    }
    // The acquires held back whose lock the batch has a command on follow it (a semaphore's, one).
    let mut kept = VecDeque::new();
    for (queued, was_held_back) in rest {
        let name = queued.cmd.lock_name().expect("only one-lock commands are queued");
        let follows = was_held_back && taken.contains(name) && batch.len() < limits::BATCH_MAX;
        if follows && (queued.cmd.limit() == 1 || semaphores.insert(name.to_owned())) {
            held -= 1;
            batch.push(queued);
        } else {
            kept.push_back(queued);
        }
    }
    kept.append(waiting);
    *waiting = kept;
    let taken = match (batch.is_empty(), until) {
        (false, _) => Taken::Batch(batch),
        (true, Some(since)) => Taken::Held { until: since + hold },
        (true, None) => Taken::Nothing,
    };
    (taken, held)
}

/// The entry for `cmds`, taken by [`take_batch`]: a [`Command::Batch`] if they name each lock once, else a
/// [`Command::Group`].
fn entry_of(cmds: Vec<Command>) -> Command {
    let mut names: Vec<&str> = cmds.iter().filter_map(Command::lock_name).collect();
    names.sort_unstable();
    names.dedup();
    match names.len() == cmds.len() {
        true => Command::Batch(cmds),
        false => Command::Group(cmds),
    }
}

/// Proposes `batch` as one entry (a lone command as itself) and answers each command.
async fn propose_batch(appender: &Appender, mut batch: Vec<Queued>) {
    if batch.len() == 1 {
        let queued = batch.pop().expect("one command");
        let _ = queued.reply.send(appender.propose_command(queued.cmd).await);
        return;
    }
    let (cmds, replies): (Vec<Command>, Vec<_>) = batch.into_iter().map(|q| (q.cmd, q.reply)).unzip();
    let count = cmds.len();
    let written = appender.propose_commands(entry_of(cmds), count).await;
    match written {
        Ok((index, Response { at_ms, outcome: Some(Outcome::Batch(outcomes)) })) if outcomes.len() == count => {
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                let _ = reply.send(Ok((index, Response { at_ms, outcome: Some(outcome) })));
            }
        }
        Ok((index, response)) => {
            // Only a malformed batch (`Reject::InvalidBatch`) gets here, and `take_batch` makes none.
            debug_assert_eq!(response.outcome, Some(Outcome::Rejected(Reject::InvalidBatch)));
            let error = NodeError::Unavailable(format!("batch entry {index} was refused: {:?}", response.outcome));
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
        Err(error) => {
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use holdfast_core::{Acquire, Entry, Token};

    use super::*;

    /// `cmd` queued at `since`, its caller waiting for the answer (the receiver is leaked: kept open).
    fn queued_at(cmd: Command, since: Instant) -> Queued {
        let (reply, answer) = oneshot::channel();
        std::mem::forget(answer);
        Queued { cmd, reply, since }
    }

    /// A queued release.
    fn release(name: &str) -> Queued {
        queued_at(Command::Release { name: name.into(), token: Token(1) }, Instant::now())
    }

    fn acquire_cmd(name: &str, wait_ms: u64) -> Command {
        let token = Token(7);
        Command::Acquire(Acquire {
            name: name.into(),
            owner: "w".into(),
            token,
            ttl_ms: 30_000,
            wait_ms,
            session: None,
        })
    }

    /// A queued acquire that waits `wait_ms` for the lock.
    fn acquire(name: &str, wait_ms: u64) -> Queued {
        queued_at(acquire_cmd(name, wait_ms), Instant::now())
    }

    /// A state in which `held` are held.
    fn holding(held: &[&str]) -> LockState {
        let mut state = LockState::new();
        for (i, name) in held.iter().enumerate() {
            state.apply(i as u64 + 1, &Entry { at_ms: 1, cmd: acquire_cmd(name, 0) });
        }
        state
    }

    /// `take_batch` on a state where nothing is held, now.
    fn take(waiting: &mut VecDeque<Queued>) -> Vec<Queued> {
        match take_batch(waiting, &LockState::new(), Instant::now(), QUEUE_HOLD).0 {
            Taken::Batch(batch) => batch,
            Taken::Nothing => Vec::new(),
            Taken::Held { .. } => panic!("nothing is held"),
        }
    }

    /// The batch `take_batch` took, and how many it held back.
    fn batch((taken, held): (Taken, usize)) -> (Vec<Queued>, usize) {
        let taken = match taken {
            Taken::Batch(batch) => batch,
            Taken::Nothing => panic!("nothing taken"),
            Taken::Held { .. } => panic!("everything held back"),
        };
        (taken, held)
    }

    #[test]
    fn a_command_whose_caller_went_away_is_not_proposed() {
        let (reply, answer) = oneshot::channel();
        let gone =
            Queued { cmd: Command::Release { name: "gone".into(), token: Token(1) }, reply, since: Instant::now() };
        drop(answer);
        let mut waiting: VecDeque<Queued> = VecDeque::from([release("a"), gone, release("b")]);
        assert_eq!(names(&take(&mut waiting)), ["a", "b"]);
        assert!(waiting.is_empty());
    }

    fn names(queued: &[Queued]) -> Vec<&str> {
        queued.iter().map(|q| q.cmd.lock_name().unwrap()).collect()
    }

    #[test]
    fn a_batch_names_each_lock_once_and_the_rest_keep_their_order() {
        let mut waiting: VecDeque<Queued> = ["a", "b", "a", "c", "b", "a"].into_iter().map(release).collect();
        let batch = take(&mut waiting);
        assert_eq!(names(&batch), ["a", "b", "c"]);
        assert_eq!(names(waiting.make_contiguous()), ["a", "b", "a"]);
        let batch = take(&mut waiting);
        assert_eq!(names(&batch), ["a", "b"]);
        assert_eq!(names(waiting.make_contiguous()), ["a"]);
    }

    #[tokio::test]
    async fn a_stopped_proposer_says_nothing_was_proposed_or_that_it_may_have_been() {
        // Stopped before the command was queued: nothing was proposed, safe to retry elsewhere.
        let proposer = Proposer::default();
        drop(proposer.rx.lock().unwrap().take());
        let answer = proposer.propose(release("a").cmd).await;
        assert!(matches!(answer, Err(NodeError::NotLeader { leader: None })), "{answer:?}");

        // Stopped with the command queued (or in flight): it may or may not have taken effect.
        let proposer = Arc::new(Proposer::default());
        let rx = proposer.rx.lock().unwrap().take().unwrap();
        let asking = tokio::spawn({
            let proposer = proposer.clone();
            async move { proposer.propose(release("a").cmd).await }
        });
        let mut rx = rx;
        let queued = rx.recv().await.expect("the command was queued");
        drop((queued, rx));
        let answer = asking.await.unwrap();
        assert!(matches!(answer, Err(NodeError::Unavailable(_))), "{answer:?}");
    }

    #[test]
    fn a_batch_holds_at_most_batch_max_commands() {
        let mut waiting: VecDeque<Queued> = (0..limits::BATCH_MAX + 3).map(|i| release(&format!("lock-{i}"))).collect();
        let batch = take(&mut waiting);
        assert_eq!(batch.len(), limits::BATCH_MAX);
        let left = names(waiting.make_contiguous()).join(",");
        let expected = (limits::BATCH_MAX..limits::BATCH_MAX + 3).map(|i| format!("lock-{i}")).collect::<Vec<_>>();
        assert_eq!(left, expected.join(","));
    }

    #[test]
    fn a_lock_takes_one_command_that_is_not_an_acquire_then_acquires() {
        // Nothing is held, so no acquire is held back: a release, acquires after it, and a release after
        // an acquire of the same lock, which waits for the next entry.
        let mut waiting = VecDeque::from([release("a"), acquire("a", 0), acquire("a", 5_000), release("a")]);
        let batch = take(&mut waiting);
        assert_eq!(names(&batch), ["a", "a", "a"]);
        assert!(
            matches!(entry_of(batch.into_iter().map(|q| q.cmd).collect()), Command::Group(cmds) if cmds.len() == 3)
        );
        assert_eq!(names(waiting.make_contiguous()), ["a"]);

        let mut waiting = VecDeque::from([acquire("a", 5_000), release("a"), release("b")]);
        let batch = take(&mut waiting);
        assert_eq!(names(&batch), ["a", "b"]);
        assert!(matches!(entry_of(batch.into_iter().map(|q| q.cmd).collect()), Command::Batch(_)));
        assert_eq!(names(waiting.make_contiguous()), ["a"]);
    }

    #[test]
    fn an_acquire_that_will_queue_is_held_back_until_its_lock_has_a_command_to_follow() {
        let state = holding(&["a"]);
        let now = Instant::now();
        // Alone, it is held back, until its hold ends.
        let mut waiting = VecDeque::from([acquire("a", 5_000)]);
        let since = waiting[0].since;
        match take_batch(&mut waiting, &state, now, QUEUE_HOLD) {
            (Taken::Held { until }, 1) => assert_eq!(until, since + QUEUE_HOLD),
            _ => panic!("the acquire was not held back"),
        }
        assert_eq!(waiting.len(), 1);
        let (taken, held) = batch(take_batch(&mut waiting, &state, since + QUEUE_HOLD, QUEUE_HOLD));
        assert_eq!((names(&taken), held), (vec!["a"], 0));

        // With other locks' commands, those go and it stays.
        let mut waiting = VecDeque::from([acquire("a", 5_000), release("b")]);
        let (taken, held) = batch(take_batch(&mut waiting, &state, now, QUEUE_HOLD));
        assert_eq!((names(&taken), held), (vec!["b"], 1));
        assert_eq!(names(waiting.make_contiguous()), ["a"]);

        // The holder's release comes: the held-back acquires follow it in the same entry, in order.
        waiting.push_back(acquire("a", 1));
        waiting.push_back(release("a"));
        let (taken, held) = batch(take_batch(&mut waiting, &state, now, QUEUE_HOLD));
        assert_eq!((names(&taken), held), (vec!["a", "a", "a"], 0));
        assert!(matches!(taken[0].cmd, Command::Release { .. }));
        assert!(taken[1..].iter().all(|q| q.cmd.is_acquire()));
        assert!(waiting.is_empty());

        // A try-lock (no wait) and an acquire of a free lock are never held back.
        let mut waiting = VecDeque::from([acquire("a", 0), acquire("c", 5_000)]);
        let (taken, held) = batch(take_batch(&mut waiting, &state, now, QUEUE_HOLD));
        assert_eq!((names(&taken), held), (vec!["a", "c"], 0));
    }
}
