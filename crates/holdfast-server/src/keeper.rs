//! The lease keeper and the grant watchers: what a node learns from every applied entry.
//!
//! Every node keeps, in memory, a monotonic-clock deadline for each TTL hold, set when it applies the grant
//! or renewal (`apply instant + ttl`). Only the leader acts on them: when deadlines pass, it confirms with
//! a quorum that it is still leader and proposes one `Expire` entry for all of them. A node that becomes
//! leader first resets every deadline to a full TTL from its promotion, because it cannot know when the
//! old leader last extended a hold. A node that is not leader never expires anything (etcd #15247).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast_core::{limits, Applied, Expire, Grant, Lease, LockState, Outcome, Token};
use holdfast_store::ApplyObserver;
use tokio::sync::oneshot;

use crate::node::{wall_ms, Node};

/// How often the leader looks for run-out leases.
pub const KEEPER_TICK: Duration = Duration::from_millis(50);
/// How often the leader sweeps waiters whose wait ran out (normally their own request withdraws them;
/// this catches waiters whose node died while they waited).
const WAITER_SWEEP: Duration = Duration::from_secs(2);
/// Grace past a waiter's wait before the sweep removes it, so its own request withdraws it first.
const WAITER_GRACE_MS: u64 = 1000;

/// The node's view of applied entries: grant watchers and hold deadlines. Implements [`ApplyObserver`].
#[derive(Default)]
pub struct Events {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Queued claims waiting to hear of their grant, by token.
    watchers: HashMap<Token, (String, oneshot::Sender<Grant>)>,
    deadlines: Deadlines,
}

/// TTL hold deadlines on this node's monotonic clock, by name and ordered by time.
#[derive(Default)]
struct Deadlines {
    by_name: HashMap<String, (u64, Instant)>,
    by_time: BTreeSet<(Instant, String)>,
}

impl Deadlines {
    fn set(&mut self, name: &str, fence: u64, deadline: Instant) {
        if let Some((_, old)) = self.by_name.insert(name.to_owned(), (fence, deadline)) {
            self.by_time.remove(&(old, name.to_owned()));
        }
        self.by_time.insert((deadline, name.to_owned()));
    }

    fn end(&mut self, name: &str, fence: u64) {
        if let Some(&(f, deadline)) = self.by_name.get(name) {
            if f == fence {
                self.by_name.remove(name);
                self.by_time.remove(&(deadline, name.to_owned()));
            }
        }
    }

    /// Every TTL hold in `state` gets a full TTL from `now`.
    fn reset(&mut self, state: &LockState, now: Instant) {
        self.by_name.clear();
        self.by_time.clear();
        for (name, fence, ttl_ms, _) in state.ttl_holds() {
            self.set(name, fence, now + Duration::from_millis(ttl_ms));
        }
    }
}

impl Events {
    /// Registers a watcher for `token`'s grant. The caller holds the state's read lock, so no entry is
    /// applied between its check and this registration.
    pub fn watch(&self, name: &str, token: Token) -> oneshot::Receiver<Grant> {
        let (tx, rx) = oneshot::channel();
        self.inner
            .lock()
            .expect("events poisoned")
            .watchers
            .insert(token, (name.to_owned(), tx));
        rx
    }

    /// Forgets the watcher for `token`, if any.
    pub fn unwatch(&self, token: Token) {
        self.inner
            .lock()
            .expect("events poisoned")
            .watchers
            .remove(&token);
    }

    /// A new leader's start: every TTL hold gets a full TTL from now.
    pub fn promote(&self, state: &LockState) {
        self.inner
            .lock()
            .expect("events poisoned")
            .deadlines
            .reset(state, Instant::now());
    }

    /// Holds whose deadline passed by `now` and whose advertised end passed by leader time `wall_ms`,
    /// as (name, fence), at most `max`.
    fn due(&self, state: &LockState, now: Instant, wall_ms: u64, max: usize) -> Vec<(String, u64)> {
        let inner = self.inner.lock().expect("events poisoned");
        let mut due = Vec::new();
        for (deadline, name) in &inner.deadlines.by_time {
            if *deadline > now || due.len() >= max {
                break;
            }
            let (fence, _) = inner.deadlines.by_name[name];
            let advertised_end = state
                .get(name)
                .and_then(|l| (l.holder.fence == fence).then_some(l.holder.lease));
            if let Some(Lease::Ttl { expires_at_ms, .. }) = advertised_end {
                if expires_at_ms <= wall_ms {
                    due.push((name.clone(), fence));
                }
            }
        }
        due
    }
}

impl ApplyObserver for Events {
    fn applied(&self, _state: &LockState, _index: u64, applied: &Applied) {
        let now = Instant::now();
        let mut inner = self.inner.lock().expect("events poisoned");
        for (name, fence) in &applied.ended {
            inner.deadlines.end(name, *fence);
        }
        let renewed = match &applied.outcome {
            Outcome::Renewed(grant) => Some(grant),
            _ => None,
        };
        for grant in applied.grants.iter().chain(renewed) {
            if let Lease::Ttl { ttl_ms, .. } = grant.lease {
                inner.deadlines.set(
                    &grant.name,
                    grant.fence,
                    now + Duration::from_millis(ttl_ms),
                );
            }
        }
        for grant in &applied.grants {
            if let Some((_, tx)) = inner.watchers.remove(&grant.token) {
                let _ = tx.send(grant.clone());
            }
        }
        for (_, token) in &applied.dropped {
            // Dropping the sender tells the waiter it left the queue.
            inner.watchers.remove(token);
        }
    }

    fn restored(&self, state: &LockState) {
        let mut inner = self.inner.lock().expect("events poisoned");
        inner.deadlines.reset(state, Instant::now());
        let watchers = std::mem::take(&mut inner.watchers);
        for (token, (name, tx)) in watchers {
            if let Some(grant) = state.grant(&name, token) {
                let _ = tx.send(grant);
            } else if state.is_waiting(&name, token) {
                inner.watchers.insert(token, (name, tx));
            }
        }
    }
}

/// Runs the lease keeper until `shutdown` resolves. Acts only while this node is leader.
pub async fn run(node: Arc<Node>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(KEEPER_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut leading_term = None;
    let mut last_sweep = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let term = node.raft.metrics().borrow().current_term;
        if !node.is_leader() {
            leading_term = None;
            continue;
        }
        if leading_term != Some(term) {
            // Promotion: nobody is expired early because of a heartbeat the old leader saw and we did not.
            node.events
                .promote(&node.state.read().expect("lock state poisoned"));
            leading_term = Some(term);
            tracing::info!(term, "became leader; every hold gets a full lease from now");
            continue;
        }
        let wall = wall_ms().max(node.state.read().expect("lock state poisoned").now_ms());
        let mut expire = Expire {
            locks: node.events.due(
                &node.state.read().expect("lock state poisoned"),
                Instant::now(),
                wall,
                limits::EXPIRE_BATCH_MAX,
            ),
            ..Expire::default()
        };
        if last_sweep.elapsed() >= WAITER_SWEEP {
            last_sweep = Instant::now();
            let room = limits::EXPIRE_BATCH_MAX - expire.len();
            let state = node.state.read().expect("lock state poisoned");
            expire.waiters = state
                .timed_waiters()
                .filter(|(_, _, until)| until.saturating_add(WAITER_GRACE_MS) <= wall)
                .take(room)
                .map(|(name, token, _)| (name.to_owned(), token))
                .collect();
        }
        if expire.is_empty() {
            continue;
        }
        // Only a confirmed leader decides expiry.
        if let Err(e) = node.confirm_leader().await {
            tracing::debug!(%e, "not expiring: leadership not confirmed");
            continue;
        }
        let count = expire.len();
        match node
            .propose_command(holdfast_core::Command::Expire(expire))
            .await
        {
            Ok((index, response)) => {
                tracing::debug!(index, ?response.outcome, count, "proposed expiry")
            }
            Err(e) => tracing::warn!(%e, count, "expiry proposal failed; will retry"),
        }
    }
}
