//! [`Gather`]: requests that arrive one by one, sent on in batches by a few sender tasks.
//!
//! A follower forwards its sessions' heartbeats, its clients' writes and its reads' barriers
//! ([`super::Router`]) to the leader this way: each heartbeat forwarded on its own held one of the follower's
//! forwarding slots for a whole quorum round on the leader, which capped a follower at about 8,000
//! heartbeats a second, and each write took a frame each way
//! (docs/perf-notes/2026-12-03-sessions-through-a-follower.md). Gathered, a round trip carries everything that arrived
//! while the previous batches were under way.
//!
//! The queue and the count of senders sit under one lock, so a request is never left queued with no sender
//! to take it: a push starts a sender unless enough are running, and a sender counts itself out only when
//! it finds the queue empty.

use std::future::Future;
use std::sync::Mutex;

use tokio::sync::oneshot;

/// Requests of type `T` waiting for answers of type `R`, gathered into batches of at most `max_batch`,
/// taken by at most `max_senders` senders at a time.
pub struct Gather<T, R> {
    inner: Mutex<Inner<T, R>>,
    max_senders: usize,
    max_batch: usize,
}

/// What a sender does with a request's answer: send it to the caller waiting in [`Gather::ask`], or act on
/// it in the sender's task ([`Gather::push_with`]). Dropped unanswered when the sender goes away.
pub type Reply<R> = Box<dyn FnOnce(R) + Send>;

struct Inner<T, R> {
    queued: Vec<(T, Reply<R>)>,
    senders: usize,
}

/// A queued request: where its answer comes, and whether the caller must start a sender
/// ([`Gather::next_batch`] in a loop, in a task of its own).
pub struct Queued<R> {
    pub answer: oneshot::Receiver<R>,
    pub start_sender: bool,
}

impl<T, R: Send + 'static> Gather<T, R> {
    pub fn new(max_senders: usize, max_batch: usize) -> Self {
        assert!(max_senders > 0 && max_batch > 0, "a gather needs a sender and room for a request");
        Gather { inner: Mutex::new(Inner { queued: Vec::new(), senders: 0 }), max_senders, max_batch }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner<T, R>> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues `request`. The caller starts a sender when told to; the answer comes from whichever sender
    /// takes the request (a dropped sender ends the wait with an error).
    pub fn push(&self, request: T) -> Queued<R> {
        let (reply, answer) = oneshot::channel();
        let start_sender = self.push_with(
            request,
            Box::new(move |answer| {
                let _ = reply.send(answer);
            }),
        );
        Queued { answer, start_sender }
    }

    /// Queues `request`, whose answer `reply` takes in the sender's task (no caller waits). True when the
    /// caller must start a sender.
    pub fn push_with(&self, request: T, reply: Reply<R>) -> bool {
        let mut inner = self.inner();
        inner.queued.push((request, reply));
        let start_sender = inner.senders < self.max_senders;
        if start_sender {
            inner.senders += 1;
        }
        start_sender
    }

    /// For a sender: the next batch, oldest first, or `None` when nothing is queued, and then this sender is
    /// counted out and must stop.
    pub fn next_batch(&self) -> Option<Vec<(T, Reply<R>)>> {
        let mut inner = self.inner();
        if inner.queued.is_empty() {
            inner.senders -= 1;
            return None;
        }
        let taken = inner.queued.len().min(self.max_batch);
        let rest = inner.queued.split_off(taken);
        Some(std::mem::replace(&mut inner.queued, rest))
    }

    /// Queues `request`, has `start_sender` start a sender (a task that runs [`Gather::send_all`]) when one is
    /// needed, and waits for the answer; `gone` makes the answer when the sender that took the request went
    /// away without one.
    pub async fn ask(&self, request: T, start_sender: impl FnOnce(), gone: impl FnOnce() -> R) -> R {
        let queued = self.push(request);
        if queued.start_sender {
            start_sender();
        }
        queued.answer.await.unwrap_or_else(|_| gone())
    }

    /// A sender's work: batch after batch until none is queued, each answered by `forward` (one answer per
    /// request, in order).
    pub async fn send_all<F: Future<Output = Vec<R>>>(&self, mut forward: impl FnMut(Vec<T>) -> F) {
        while let Some(batch) = self.next_batch() {
            let (requests, replies): (Vec<T>, Vec<_>) = batch.into_iter().unzip();
            for (reply, answer) in replies.into_iter().zip(forward(requests).await) {
                reply(answer);
            }
        }
    }

    /// How many senders are running.
    #[cfg(test)]
    fn senders(&self) -> usize {
        self.inner().senders
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer_all(batch: Vec<(u32, Reply<u32>)>) -> Vec<u32> {
        batch
            .into_iter()
            .map(|(n, reply)| {
                reply(n * 10);
                n
            })
            .collect()
    }

    #[test]
    fn requests_queued_before_a_sender_runs_go_in_few_batches_and_are_all_answered() {
        let gather = Gather::<u32, u32>::new(2, 4);
        let queued: Vec<_> = (0..10).map(|n| gather.push(n)).collect();
        // The first two pushes start senders; the rest find enough of them running.
        let starts: Vec<bool> = queued.iter().map(|q| q.start_sender).collect();
        assert_eq!(starts, [true, true, false, false, false, false, false, false, false, false]);
        // One sender takes everything, oldest first, in batches of at most 4; the other finds nothing.
        assert_eq!(answer_all(gather.next_batch().unwrap()), [0, 1, 2, 3]);
        assert_eq!(answer_all(gather.next_batch().unwrap()), [4, 5, 6, 7]);
        assert_eq!(answer_all(gather.next_batch().unwrap()), [8, 9]);
        assert!(gather.next_batch().is_none(), "the first sender stops once the queue is empty");
        assert!(gather.next_batch().is_none(), "so does the second");
        assert_eq!(gather.senders(), 0);
        for (n, mut q) in queued.into_iter().enumerate() {
            assert_eq!(q.answer.try_recv().unwrap(), n as u32 * 10, "request {n} answered by whoever took it");
        }
    }

    #[test]
    fn a_request_queued_while_every_sender_is_busy_goes_with_a_busy_senders_next_batch() {
        let gather = Gather::<u32, u32>::new(1, 8);
        let first = gather.push(1);
        assert!(first.start_sender);
        let batch = gather.next_batch().unwrap();
        // While that batch is under way, another request comes: no new sender, the running one takes it.
        let mut second = gather.push(2);
        assert!(!second.start_sender);
        answer_all(batch);
        assert_eq!(answer_all(gather.next_batch().unwrap()), [2]);
        assert_eq!(second.answer.try_recv().unwrap(), 20);
        assert!(gather.next_batch().is_none());
    }

    #[test]
    fn a_request_after_the_last_sender_stopped_starts_a_new_one() {
        let gather = Gather::<u32, u32>::new(1, 8);
        assert!(gather.push(1).start_sender);
        answer_all(gather.next_batch().unwrap());
        assert!(gather.next_batch().is_none());
        assert!(gather.push(2).start_sender, "nothing would take it otherwise");
        assert_eq!(gather.senders(), 1);
    }

    #[test]
    fn a_request_whose_sender_went_away_learns_it() {
        let gather = Gather::<u32, u32>::new(1, 8);
        let mut queued = gather.push(1);
        drop(gather.next_batch().unwrap());
        assert!(queued.answer.try_recv().is_err());
    }
}
