//! How many clients' writes wait on this node for the leader's answer ([`Waiting`]): a follower with many
//! syncs its own appends aside (holdfast-store's `ApplyObserver::sync_aside`).

use std::sync::atomic::{AtomicUsize, Ordering};

/// Writes waiting, at least, for a follower to sync its appends on the log's own thread rather than on the
/// worker that appends. A follower's worker blocked in its sync holds up the answers it passes back to its
/// clients: with 64 gRPC clients on one follower and one worker a node, 40 % of the time. Synced aside, a
/// sync costs a thread wake-up each way, which pays only where the wait, not the CPU, holds the clients up:
/// 64 gRPC clients through a follower ran faster in 17 of 22 alternating rounds (median 1.07×), while 64
/// HTTP clients spread over the nodes (21 a follower, bound by the CPU) crossed a threshold of 16 and paid
/// a third more context switches for nothing; at 32 they do not cross it
/// (docs/perf-notes/2026-12-07-a-follower-syncs-aside.md).
pub const SYNC_ASIDE_WAITING: usize = 32;

/// Counts the clients' writes waiting on this node for the leader's answer.
#[derive(Debug, Default)]
pub struct Waiting(AtomicUsize);

/// One write counted in [`Waiting`] until it is dropped.
pub struct Counted<'a>(&'a Waiting);

impl Waiting {
    /// Counts one write until the returned guard is dropped.
    pub fn count(&self) -> Counted<'_> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Counted(self)
    }

    /// Whether [`SYNC_ASIDE_WAITING`] or more writes wait.
    pub fn many(&self) -> bool {
        self.0.load(Ordering::Relaxed) >= SYNC_ASIDE_WAITING
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_from_the_threshold_until_the_writes_are_answered() {
        let waiting = Waiting::default();
        let mut counted: Vec<_> = (0..SYNC_ASIDE_WAITING - 1).map(|_| waiting.count()).collect();
        assert!(!waiting.many());
        counted.push(waiting.count());
        assert!(waiting.many());
        counted.pop();
        assert!(!waiting.many());
        drop(counted);
        assert_eq!(waiting.0.load(Ordering::Relaxed), 0);
    }
}
