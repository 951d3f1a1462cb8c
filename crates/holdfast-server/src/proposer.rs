//! Batched proposals: the leader's one-lock commands that arrive while the log is busy travel together in
//! one [`Command::Batch`] entry.
//!
//! openraft 0.9 appends one client write at a time and waits for that append's flush before it takes the
//! next, so without batching every acquire and release costs the leader its own fsync, and the leader's
//! rate is one entry per flush. Here every one-lock command (acquire, release, renew, cancel) goes into a
//! queue; a single task takes what has queued, up to [`limits::BATCH_MAX`] commands on different locks, and
//! proposes them as one entry, with at most [`IN_FLIGHT`] entries proposed and not yet applied at once.
//! A lone command is proposed as it is, so an idle cluster answers exactly as fast as before; under load,
//! one append, one flush per node and one round trip serve the whole batch.
//!
//! A second command on a lock already in the batch waits for the next one: no lock is granted twice
//! under one fence. Batches are taken in order of arrival, but two entries in flight at once may commit
//! in either order; their commands were all outstanding together, so either order is linearizable (a
//! client's next command is only sent after the answer to its previous one).

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

use holdfast_core::{limits, Command, Outcome, Reject};
use holdfast_store::Response;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::node::{Node, NodeError};

/// Batch entries proposed and not yet answered, at most. Two keep the leader's disk busy: one batch
/// flushes while the one before it waits for its quorum.
pub const IN_FLIGHT: usize = 2;

/// A command waiting to be proposed, and where its answer goes.
struct Queued {
    cmd: Command,
    reply: oneshot::Sender<Result<(u64, Response), NodeError>>,
}

/// The queue of one-lock commands waiting to be proposed ([`Node::propose`] fills it, [`run`] empties it).
pub struct Proposer {
    tx: mpsc::UnboundedSender<Queued>,
    rx: Mutex<Option<mpsc::UnboundedReceiver<Queued>>>,
}

impl Default for Proposer {
    fn default() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Proposer { tx, rx: Mutex::new(Some(rx)) }
    }
}

impl Proposer {
    /// Queues `cmd` (a one-lock command) and waits for its index and answer.
    pub async fn propose(&self, cmd: Command) -> Result<(u64, Response), NodeError> {
        let (reply, answer) = oneshot::channel();
        if self.tx.send(Queued { cmd, reply }).is_err() {
            // The node is stopping and its proposer is gone: nothing was proposed, so the caller (a
            // follower forwarding) may safely try again, at the next leader.
            return Err(NodeError::NotLeader { leader: None });
        }
        // An answer dropped unsent: the proposer was stopped with the command queued or in flight.
        answer.await.unwrap_or_else(|_| Err(NodeError::Unavailable("the node stopped while proposing".into())))
    }
}

/// Proposes what queues in `node`'s proposer until the task is aborted (the server does so once its
/// client requests drained). Runs once per node; a second call returns at once.
pub async fn run(node: Arc<Node>) {
    let Some(mut rx) = node.proposer.rx.lock().expect("proposer poisoned").take() else { return };
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
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
        let batch = take_batch(&mut waiting);
        let node = node.clone();
        tokio::spawn(async move {
            propose_batch(&node, batch).await;
            drop(permit);
        });
    }
}

/// Takes from the front of `waiting` up to [`limits::BATCH_MAX`] commands on different locks; a command on
/// a lock already taken stays, in order, for a later batch. A command whose caller went away before it was
/// proposed (a client that disconnected, a request that timed out) is dropped: as before batching, a
/// request abandoned before its proposal changes nothing.
fn take_batch(waiting: &mut VecDeque<Queued>) -> Vec<Queued> {
    let mut names = BTreeSet::new();
    let mut batch = Vec::new();
    let mut rest = VecDeque::new();
    while let Some(queued) = waiting.pop_front() {
        if queued.reply.is_closed() {
            continue;
        }
        if batch.len() == limits::BATCH_MAX {
            waiting.push_front(queued);
            break;
        }
        let name = queued.cmd.lock_name().expect("only one-lock commands are queued").to_owned();
        if names.insert(name) {
            batch.push(queued);
        } else {
            rest.push_back(queued);
        }
    }
    rest.append(waiting);
    *waiting = rest;
    batch
}

/// Proposes `batch` as one entry (a lone command as itself) and answers each command.
async fn propose_batch(node: &Node, mut batch: Vec<Queued>) {
    if batch.len() == 1 {
        let queued = batch.pop().expect("one command");
        let _ = queued.reply.send(node.propose_command(queued.cmd).await);
        return;
    }
    let (cmds, replies): (Vec<Command>, Vec<_>) = batch.into_iter().map(|q| (q.cmd, q.reply)).unzip();
    let count = cmds.len();
    let written = node.propose_commands(Command::Batch(cmds), count).await;
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
    use holdfast_core::Token;

    use super::*;

    /// A queued release whose caller waits for the answer (the receiver is leaked: kept open).
    fn release(name: &str) -> Queued {
        let (reply, answer) = oneshot::channel();
        std::mem::forget(answer);
        Queued { cmd: Command::Release { name: name.into(), token: Token(1) }, reply }
    }

    #[test]
    fn a_command_whose_caller_went_away_is_not_proposed() {
        let (reply, answer) = oneshot::channel();
        let gone = Queued { cmd: Command::Release { name: "gone".into(), token: Token(1) }, reply };
        drop(answer);
        let mut waiting: VecDeque<Queued> = VecDeque::from([release("a"), gone, release("b")]);
        assert_eq!(names(&take_batch(&mut waiting)), ["a", "b"]);
        assert!(waiting.is_empty());
    }

    fn names(queued: &[Queued]) -> Vec<&str> {
        queued.iter().map(|q| q.cmd.lock_name().unwrap()).collect()
    }

    #[test]
    fn a_batch_names_each_lock_once_and_the_rest_keep_their_order() {
        let mut waiting: VecDeque<Queued> = ["a", "b", "a", "c", "b", "a"].into_iter().map(release).collect();
        let batch = take_batch(&mut waiting);
        assert_eq!(names(&batch), ["a", "b", "c"]);
        assert_eq!(names(waiting.make_contiguous()), ["a", "b", "a"]);
        let batch = take_batch(&mut waiting);
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
        let batch = take_batch(&mut waiting);
        assert_eq!(batch.len(), limits::BATCH_MAX);
        let left = names(waiting.make_contiguous()).join(",");
        let expected = (limits::BATCH_MAX..limits::BATCH_MAX + 3).map(|i| format!("lock-{i}")).collect::<Vec<_>>();
        assert_eq!(left, expected.join(","));
    }
}
