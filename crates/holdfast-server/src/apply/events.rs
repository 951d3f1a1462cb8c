//! The apply observer ([`Events`]): what a node learns from every applied entry.
//!
//! Every node keeps, in memory, a monotonic-clock deadline for each TTL hold (set when it applies the grant
//! or renewal: `apply instant + ttl`) and for each session (set when it applies the session's opening; on
//! the leader, extended by every confirmed heartbeat; heartbeats are not written to the log). Only the
//! leader acts on them (`leader::expiry`): when deadlines pass, it confirms with a quorum that it is still
//! leader and proposes one `Expire` entry for all of them. A node that becomes leader first gives every
//! hold and session a full lease from its promotion, because it cannot know when the old leader last
//! extended them. A node that is not leader never expires anything (etcd #15247).
//!
//! The same observer tells waiting requests of their grants and session streams of their grants and losses.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use holdfast_core::{
    limits, Applied, Command, Ended, Expire, Grant, Lease, LockState, LockView, Outcome, SessionId, Token,
};
use holdfast_store::ApplyObserver;
use tokio::sync::{mpsc, oneshot};

use super::deadlines::Deadlines;
use super::notes::NoteSender;
pub use super::notes::{Notes, SessionNote};
use super::waiting::Waiting;
use crate::faults::Bugs;
use crate::metrics::{self, Metrics};

/// A one-shot waiter (a long-polling request) is kept in its queue only while the node serving the request
/// says, at least this often, that it still waits; otherwise its node crashed and the leader withdraws it.
pub const WAITER_LEASE: Duration = Duration::from_secs(3);
/// How often a node tells the leader which of its requests still wait.
pub const WAITER_PING: Duration = Duration::from_secs(1);

/// Changes a watch stream may fall behind by: past it, the stream is ended (the client resumes from the
/// last revision it saw) rather than buffering without bound.
pub const WATCH_STREAM_BACKLOG: usize = 1024;

/// A lock as a command left it, for a watch stream: its name, view (`None`: nobody holds it) and revision.
#[derive(Debug, Clone)]
pub struct LockChange {
    pub name: String,
    pub view: Option<LockView>,
    pub revision: u64,
}

/// What a watch stream follows: one lock, or every lock whose name starts with a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchTarget {
    Lock(String),
    Prefix(String),
}

/// The node's view of applied entries: watchers and deadlines. Implements [`ApplyObserver`].
#[derive(Default)]
pub struct Events {
    inner: Mutex<Inner>,
    /// Counts grants, hand-overs, expirations and flushes.
    metrics: Arc<Metrics>,
    /// The last log index this node's current snapshot covers, and its size in bytes.
    snapshot: Mutex<Option<(u64, u64)>>,
    /// The highest log index a follower may be waiting to apply: as leader, this node tells its followers
    /// of a commit through it at once, not with the next entries ([`Events::urgent_commit`]).
    urgent_commit: tokio::sync::watch::Sender<u64>,
    /// Broken behaviours (the simulation's; none otherwise).
    bugs: Bugs,
    /// The operator's bound on how far two nodes' wall clocks may disagree (`--max-clock-skew`): with it, a
    /// new leader keeps each TTL hold's stamped end (and each lock-delay's) plus the bound and its own
    /// election, instead of giving them a full lease from its promotion.
    max_clock_skew: Option<Duration>,
    /// Clients' writes waiting here for the leader: with many, a follower syncs its appends aside.
    waiting: Waiting,
}

#[derive(Default)]
struct Inner {
    /// Queued one-shot claims waiting to hear of their grant, by token.
    watchers: BTreeMap<Token, (String, oneshot::Sender<Grant>)>,
    /// Requests waiting for a lock to change (watches), by name and a number of their own: each is told
    /// once, at the next entry that may have changed the lock, and then forgotten.
    lock_watchers: BTreeMap<String, BTreeMap<u64, oneshot::Sender<()>>>,
    /// Watch streams, by lock name and number: each is sent the lock's state after every command that
    /// changed it, in log order. One that falls [`WATCH_STREAM_BACKLOG`] behind is dropped (its stream ends).
    lock_streams: BTreeMap<String, BTreeMap<u64, mpsc::Sender<LockChange>>>,
    /// Watch streams of every lock under a prefix, by prefix and number, sent the same.
    prefix_streams: BTreeMap<String, BTreeMap<u64, mpsc::Sender<LockChange>>>,
    /// The number of the next lock watcher or stream.
    next_lock_watcher: u64,
    /// Session streams attached to this node.
    streams: BTreeMap<SessionId, NoteSender>,
    /// TTL holds and lock-delays by name and fence (a semaphore has several), tagged with the fence.
    holds: Deadlines<(String, u64)>,
    /// Sessions, tagged 0, with how many locks each holds and waits for.
    sessions: Deadlines<SessionId, SessionCounts>,
    /// One-shot waiters by token, tagged 0, and the lock each waits for.
    waiters: Deadlines<Token>,
    waiter_names: BTreeMap<Token, String>,
    /// The term in which this node, as leader, last gave everything a full lease.
    promoted_term: Option<u64>,
    /// When it did: every deadline set before runs out no earlier than this plus its lease (see
    /// [`Deadlines`]); with a bound on clock skew, every session's and waiter's.
    floor: Option<Instant>,
    /// How long the election that made this node leader took: from when it last followed a leader to its
    /// promotion.
    election_took: Duration,
    /// Changes told to watch streams: the broken variant `watch_skips_changes` skips every other one
    /// (whatever their log indexes, which a workload's rhythm may keep all even or all odd).
    changes_told: u64,
}

/// Every deadline of a state replaced whole (from a snapshot), rebuilt: each TTL hold, one-shot waiter and
/// session with a full lease from the time given. Built without the keeper's lock, then swapped in: the
/// work is in proportion to the state (about 0.6 s for a million held locks on a 2-core host, release
/// build), and the node's worker threads would wait for the lock meanwhile.
struct Rebuilt {
    holds: Deadlines<(String, u64)>,
    waiters: Deadlines<Token>,
    waiter_names: BTreeMap<Token, String>,
    sessions: Deadlines<SessionId, SessionCounts>,
}

/// How many locks a session holds and waits for, as this node's state says: a heartbeat's answer.
type SessionCounts = (u32, u32);

/// `holds` and `waits` as [`SessionCounts`] (each at most [`limits::CLAIMS_PER_SESSION_MAX`]).
fn counts(holds: usize, waits: usize) -> SessionCounts {
    (u32::try_from(holds).unwrap_or(u32::MAX), u32::try_from(waits).unwrap_or(u32::MAX))
}

impl Rebuilt {
    fn of(state: &LockState, now: Instant) -> Self {
        let ttl_holds = state.ttl_holds().map(|(name, fence, ttl_ms, _)| (name, fence, ttl_ms));
        let delays = state.lock_delays().map(|(name, fence, delay_ms, _)| (name, fence, delay_ms));
        let holds = Deadlines::of(
            ttl_holds
                .chain(delays)
                .map(|(name, fence, ms)| ((name.to_owned(), fence), fence, Duration::from_millis(ms), ())),
            now,
        );
        let waiter_names: BTreeMap<Token, String> =
            state.timed_waiters().map(|(name, token, _)| (token, name.to_owned())).collect();
        let waiters = Deadlines::of(waiter_names.keys().map(|token| (*token, 0, WAITER_LEASE, ())), now);
        let sessions = Deadlines::of(
            state
                .session_summaries()
                .map(|(id, lease_ms, holds, waits)| (id, 0, Duration::from_millis(lease_ms), counts(holds, waits))),
            now,
        );
        Rebuilt { holds, waiters, waiter_names, sessions }
    }
}

impl Inner {
    /// The watch streams `what` is kept among, and its key there.
    fn streams_of<'a>(
        &mut self,
        what: &'a WatchTarget,
    ) -> (&mut BTreeMap<String, BTreeMap<u64, mpsc::Sender<LockChange>>>, &'a str) {
        match what {
            WatchTarget::Lock(name) => (&mut self.lock_streams, name),
            WatchTarget::Prefix(prefix) => (&mut self.prefix_streams, prefix),
        }
    }

    /// Puts `rebuilt` in place of every deadline; answers the ones it replaced, for the caller to drop
    /// once it let go of the lock. The last promotion's floor (the keeper's, not the deadlines') stays: a
    /// full lease from the rebuild ends later than one from the promotion anyway.
    fn install(&mut self, mut rebuilt: Rebuilt) -> Rebuilt {
        std::mem::swap(&mut self.holds, &mut rebuilt.holds);
        std::mem::swap(&mut self.waiters, &mut rebuilt.waiters);
        std::mem::swap(&mut self.waiter_names, &mut rebuilt.waiter_names);
        std::mem::swap(&mut self.sessions, &mut rebuilt.sessions);
        rebuilt
    }
}

impl Events {
    pub fn new(metrics: Arc<Metrics>, bugs: Bugs, max_clock_skew: Option<Duration>) -> Self {
        let urgent_commit = tokio::sync::watch::channel(0).0;
        let (inner, snapshot, waiting) = Default::default();
        Events { inner, metrics, snapshot, urgent_commit, bugs, max_clock_skew, waiting }
    }

    /// The clients' writes waiting on this node for the leader.
    pub fn waiting(&self) -> &Waiting {
        &self.waiting
    }

    /// Marks the commit of the entry at `index` as one a follower may be waiting for: a lock handed over
    /// to a waiter whose session or long poll is not attached to this node (it may be attached to a
    /// follower, which tells it when it applies the entry), a session opened (a follower answers `Opened`
    /// once it applied it), a barrier answered (a follower's reads wait to apply through it). The leader's
    /// network sends a commit notice it holds back for the next entries to carry
    /// (`peer::raft::COMMIT_NOTICE_HOLD`) at once instead, to every follower that was not sent a
    /// commit through `index` yet.
    pub fn urgent_commit(&self, index: u64) {
        self.urgent_commit.send_if_modified(|urgent| {
            let later = index > *urgent;
            if later {
                *urgent = index;
            }
            later
        });
    }

    /// The highest index marked by [`Events::urgent_commit`], as it changes.
    pub fn urgent_commits(&self) -> tokio::sync::watch::Receiver<u64> {
        self.urgent_commit.subscribe()
    }

    /// The last log index this node's current snapshot covers, and its size in bytes; `None` before its
    /// first snapshot.
    pub fn snapshot(&self) -> Option<(u64, u64)> {
        *self.snapshot.lock().expect("snapshot poisoned")
    }

    /// The metrics this node's observer counts into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Counts what an applied command did.
    fn count(&self, applied: &Applied) {
        let m = &self.metrics;
        m.grants.inc_by(applied.grants.len() as u64);
        let handovers =
            applied.grants.iter().filter(|g| applied.ended.iter().any(|ended| ended.name == g.name)).count();
        if handovers > 0 {
            m.handovers.inc_by(handovers as u64);
            // A metric only: the system clock, also under simulation.
            let took_s = crate::clock::wall_ms().saturating_sub(applied.at_ms) as f64 / 1000.0;
            for _ in 0..handovers {
                m.handover_latency.observe(took_s);
            }
        }
        if let Outcome::Expired { locks, waiters, sessions } = applied.outcome {
            m.expired(metrics::Expired::Lock, locks);
            m.expired(metrics::Expired::Waiter, waiters);
            m.expired(metrics::Expired::Session, sessions);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("events poisoned")
    }

    /// Registers a watcher for `token`'s grant. The caller holds the state's read lock, so no entry is
    /// applied between its check and this registration.
    pub fn watch(&self, name: &str, token: Token) -> oneshot::Receiver<Grant> {
        let (tx, rx) = oneshot::channel();
        self.lock().watchers.insert(token, (name.to_owned(), tx));
        rx
    }

    /// Forgets the watcher for `token`, if any.
    pub fn unwatch(&self, token: Token) {
        self.lock().watchers.remove(&token);
    }

    /// Registers a watcher of lock `name`: its receiver is told (or its sender dropped) at the next applied
    /// entry that may have changed the lock, or when the whole state is replaced. The caller holds the
    /// state's read lock, so no entry is applied between its look at the lock and this registration. The
    /// number answered is for [`Events::unwatch_lock`].
    pub fn watch_lock(&self, name: &str) -> (u64, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.lock();
        let id = inner.next_lock_watcher;
        inner.next_lock_watcher += 1;
        inner.lock_watchers.entry(name.to_owned()).or_default().insert(id, tx);
        self.metrics.lock_watchers.inc();
        (id, rx)
    }

    /// Registers a watch stream of `what`: sent a lock's state after every command that changes it (the
    /// lock, or any lock under the prefix) from now on. The caller holds the state's read lock, having read
    /// the state the stream starts from. The number answered is for [`Events::unwatch_stream`].
    pub fn watch_stream(&self, what: &WatchTarget) -> (u64, mpsc::Receiver<LockChange>) {
        let (tx, rx) = mpsc::channel(WATCH_STREAM_BACKLOG);
        let mut inner = self.lock();
        let id = inner.next_lock_watcher;
        inner.next_lock_watcher += 1;
        let (streams, key) = inner.streams_of(what);
        streams.entry(key.to_owned()).or_default().insert(id, tx);
        self.metrics.lock_watchers.inc();
        (id, rx)
    }

    /// Forgets watch stream `id` of `what`.
    pub fn unwatch_stream(&self, what: &WatchTarget, id: u64) {
        let mut inner = self.lock();
        let (streams, key) = inner.streams_of(what);
        let Some(of_key) = streams.get_mut(key) else { return };
        if of_key.remove(&id).is_some() {
            self.metrics.lock_watchers.dec();
        }
        if of_key.is_empty() {
            streams.remove(key);
        }
    }

    /// Sends the watch streams of `name` (and of the prefixes it starts with) its state, if the command
    /// just applied (at `index`) changed it. A stream that is full or gone is dropped.
    fn tell_lock_streams(&self, inner: &mut Inner, state: &LockState, index: u64, name: &str) {
        let prefixes: Vec<String> = inner
            .prefix_streams
            .range::<str, _>((std::ops::Bound::Unbounded, std::ops::Bound::Included(name)))
            .map(|(prefix, _)| prefix)
            .filter(|prefix| name.starts_with(prefix.as_str()))
            .cloned()
            .collect();
        if !inner.lock_streams.contains_key(name) && prefixes.is_empty() {
            return;
        }
        let revision = state.revision(name);
        if revision != index {
            return;
        }
        if self.bugs.watch_skips_changes() {
            inner.changes_told += 1;
            if inner.changes_told.is_multiple_of(2) {
                return;
            }
        }
        let change = LockChange { name: name.to_owned(), view: state.get(name), revision };
        let mut dropped = 0;
        let mut send = |streams: &mut BTreeMap<String, BTreeMap<u64, mpsc::Sender<LockChange>>>, key: &str| {
            let Some(of_key) = streams.get_mut(key) else { return };
            let before = of_key.len();
            of_key.retain(|_, tx| tx.try_send(change.clone()).is_ok());
            dropped += before - of_key.len();
            if of_key.is_empty() {
                streams.remove(key);
            }
        };
        send(&mut inner.lock_streams, name);
        for prefix in &prefixes {
            send(&mut inner.prefix_streams, prefix);
        }
        self.metrics.lock_watchers.dec_by(dropped as i64);
    }

    /// Tells the watches of every lock the command may have changed. Every change to a lock is a command
    /// naming it, or a grant, end or drop on it (an `Expire`, a session's close). A command that changed
    /// nothing (a busy answer) tells its long polls too; they look again and wait on. Streams are sent only
    /// changes (the lock's revision is this entry).
    fn tell_watches(&self, inner: &mut Inner, state: &LockState, index: u64, cmd: &Command, applied: &Applied) {
        let touched = cmd.lock_name().into_iter().chain(applied.grants.iter().map(|g| g.name.as_str()));
        let touched = touched.chain(applied.ended.iter().map(|ended| ended.name.as_str()));
        let mut told = Vec::new();
        for name in touched.chain(applied.dropped.iter().map(|(name, _)| name.as_str())) {
            self.tell_lock_watchers(inner, name);
            // A lock touched twice by one command (an expiry's end and grant) is sent once.
            if !told.contains(&name) {
                self.tell_lock_streams(inner, state, index, name);
                told.push(name);
            }
        }
    }

    /// Forgets watcher `id` of lock `name`, if it was not told yet.
    pub fn unwatch_lock(&self, name: &str, id: u64) {
        let mut inner = self.lock();
        let Some(watchers) = inner.lock_watchers.get_mut(name) else { return };
        if watchers.remove(&id).is_some() {
            self.metrics.lock_watchers.dec();
        }
        if watchers.is_empty() {
            inner.lock_watchers.remove(name);
        }
    }

    /// Tells the watchers of `name` that it may have changed.
    fn tell_lock_watchers(&self, inner: &mut Inner, name: &str) {
        if let Some(watchers) = inner.lock_watchers.remove(name) {
            self.metrics.lock_watchers.dec_by(watchers.len() as i64);
            for (_, tx) in watchers {
                let _ = tx.send(());
            }
        }
    }

    /// Attaches a stream to session `id` (replacing any earlier one: the session moved). The caller holds
    /// the state's read lock.
    pub fn attach(&self, id: SessionId) -> Notes {
        let (tx, rx) = futures_channel::mpsc::unbounded();
        if let Some(earlier) = self.lock().streams.insert(id, tx.clone()) {
            // That stream must not go on acting for the session: its notes end.
            earlier.close_channel();
        }
        Notes { rx, tell: tx }
    }

    /// Detaches the stream of session `id`, if it is still the one attached.
    pub fn detach(&self, id: SessionId) {
        let mut inner = self.lock();
        if inner.streams.get(&id).is_some_and(|tx| tx.is_closed()) {
            inner.streams.remove(&id);
        }
    }

    /// The tokens of the one-shot waiters whose requests wait on this node.
    pub fn waiting_here(&self) -> Vec<Token> {
        self.lock().watchers.keys().copied().collect()
    }

    /// The leader heard that these waiters' requests still wait: keep them queued.
    pub fn keep_waiting(&self, tokens: &[Token]) {
        let mut inner = self.lock();
        let (now, floor) = (Instant::now(), inner.floor);
        for token in tokens {
            inner.waiters.extend(token, now, floor);
        }
    }

    fn end_waiter(inner: &mut Inner, token: &Token) {
        inner.waiters.end(token, 0);
        inner.waiter_names.remove(token);
    }

    /// Extends sessions' leases (the leader, on heartbeats), from one reading of the clock and under one
    /// hold of the keeper's lock: a heartbeat batch's sessions, a few hundred at a time. Deciding under the
    /// same lock as [`Events::due`] means a heartbeat either extends a session before the keeper looks, or
    /// finds it past its deadline.
    pub fn extending(&self) -> Extending<'_> {
        let inner = self.lock();
        Extending { floor: inner.floor, now: Instant::now(), inner }
    }

    /// A leader's start in `term`, having last followed a leader at `followed`: every hold, session and
    /// waiter gets a full lease from now, once per term; with a bound on clock skew, every session and
    /// waiter, and each TTL hold and lock-delay its stamped end plus the bound and the election
    /// ([`Events::due`]). True if this call did it. Whoever first acts as leader in a term calls it (the
    /// keeper's tick, a heartbeat, a waiter ping), so that no deadline a follower kept stale is acted on or
    /// refused. Takes the same time whatever the state's size (see [`Deadlines`]).
    pub fn promote(&self, term: u64, followed: Instant, bugs: Bugs) -> bool {
        let mut inner = self.lock();
        if inner.promoted_term == Some(term) {
            return false;
        }
        let now = Instant::now();
        if !bugs.no_promotion_grace() {
            inner.floor = Some(now);
        }
        inner.election_took = now.saturating_duration_since(followed);
        inner.promoted_term = Some(term);
        true
    }

    /// Whether a new leader keeps the stamped ends of TTL holds (`--max-clock-skew`) rather than giving
    /// them a full lease.
    pub fn keeps_stamped_ends(&self) -> bool {
        self.max_clock_skew.is_some()
    }

    /// This node is not (or no longer) leader.
    pub fn demote(&self) {
        self.lock().promoted_term = None;
    }

    /// What has run out by `now` (and, for TTL holds, whose advertised end passed by leader time `wall_ms`),
    /// at most [`limits::EXPIRE_BATCH_MAX`] items. A session runs out `session_grace` after its deadline:
    /// the leader's heartbeat lag ([`crate::load::Load::expiry_grace`], zero when it keeps up), so that a
    /// heartbeat still on its way through a slow node is not the reason its session ends.
    pub fn due(&self, state: &LockState, now: Instant, wall_ms: u64, session_grace: Duration) -> Expire {
        let mut inner = self.lock();
        let floor = inner.floor;
        // With a bound on clock skew, holds are not moved to a full lease from the promotion: see below.
        inner.holds.settle(now, floor.filter(|_| self.max_clock_skew.is_none()));
        inner.waiters.settle(now, floor);
        inner.sessions.settle(now, floor);
        let mut expire = Expire::default();
        for (key, fence) in inner.holds.due(now) {
            let name = &key.0;
            if expire.len() >= limits::EXPIRE_BATCH_MAX {
                return expire;
            }
            // A TTL hold whose advertised end passed, or a lock-delay past its end.
            let end = match state.hold(name, fence).map(|h| h.lease) {
                Some(Lease::Ttl { expires_at_ms, .. }) => Some(expires_at_ms),
                Some(Lease::Delayed { free_at_ms }) => Some(free_at_ms),
                Some(Lease::Session(_)) | None => None,
            };
            // One this node was given before its promotion (its end stamped by an earlier leader's clock,
            // which may be up to the bound behind this one's) waits the bound and the election more.
            let margin = match (self.max_clock_skew, floor) {
                (Some(skew), Some(floor)) if inner.holds.set_before(key, floor) => skew + inner.election_took,
                _ => Duration::ZERO,
            };
            let margin_ms = u64::try_from(margin.as_millis()).unwrap_or(u64::MAX);
            if end.is_some_and(|end| end.saturating_add(margin_ms) <= wall_ms) {
                expire.locks.push((name.clone(), fence));
            }
        }
        for (token, _) in inner.waiters.due(now) {
            if expire.len() >= limits::EXPIRE_BATCH_MAX {
                return expire;
            }
            let name = &inner.waiter_names[token];
            if state.is_waiting(name, *token) {
                expire.waiters.push((name.clone(), *token));
            }
        }
        let Some(sessions_now) = now.checked_sub(session_grace) else { return expire };
        for (id, _) in inner.sessions.due(sessions_now) {
            if expire.len() >= limits::EXPIRE_BATCH_MAX {
                break;
            }
            if state.session_lease_ms(*id).is_some() {
                expire.sessions.push(*id);
            }
        }
        expire
    }
}

impl Events {
    /// Forgets the holds `applied` ended (telling their sessions) and arms the lock-delays it began.
    fn end_holds(inner: &mut Inner, applied: &Applied, now: Instant) {
        for Ended { name, fence, session } in &applied.ended {
            match session {
                Some(id) => {
                    if let Some(tx) = inner.streams.get(id) {
                        let _ = tx.unbounded_send(Box::new(SessionNote::Ended { name: name.clone(), fence: *fence }));
                    }
                }
                None => inner.holds.end(&(name.clone(), *fence), *fence),
            }
        }
        for (name, fence, delay_ms) in &applied.delayed {
            // A lock-delay runs out as a TTL hold does: a full delay on this node's clock from now (or from
            // its promotion), and not before its end by leader time.
            inner.holds.set(&(name.clone(), *fence), *fence, now, Duration::from_millis(*delay_ms), ());
        }
    }
}

/// Sessions' extensions under one hold of the keeper's lock ([`Events::extending`]).
pub struct Extending<'a> {
    inner: std::sync::MutexGuard<'a, Inner>,
    now: Instant,
    floor: Option<Instant>,
}

impl Extending<'_> {
    /// Extends session `id`'s lease to a full lease from the clock's reading, and answers how many locks
    /// it holds and waits for. None if it is not open or its deadline already passed: a due session may
    /// be in an `Expire` on its way, so it is not revived.
    pub fn extend(&mut self, id: SessionId) -> Option<SessionCounts> {
        self.inner.sessions.extend(&id, self.now, self.floor)
    }

    /// Whether session `id` is open.
    pub fn is_open(&self, id: SessionId) -> bool {
        self.inner.sessions.contains(&id)
    }
}

impl ApplyObserver for Events {
    fn applied(&self, state: &LockState, index: u64, cmd: &Command, applied: &Applied) {
        self.count(applied);
        let now = Instant::now();
        let mut inner = self.lock();
        // A waiter granted the lock whose session or long poll is not attached here may be attached to a
        // follower, which tells it once it applied this entry.
        let own_grant = |grant: &Grant| cmd.acquire().is_some_and(|(a, _)| a.token == grant.token);
        let waits_elsewhere = |grant: &Grant| match grant.lease {
            Lease::Session(id) => !inner.streams.contains_key(&id),
            Lease::Ttl { .. } => !inner.watchers.contains_key(&grant.token),
            Lease::Delayed { .. } => false,
        };
        let handed_over = applied.grants.iter().any(|grant| !own_grant(grant) && waits_elsewhere(grant));
        if handed_over || matches!(applied.outcome, Outcome::SessionOpened { .. }) {
            self.urgent_commit(index);
        }
        if !inner.lock_watchers.is_empty() || !inner.lock_streams.is_empty() || !inner.prefix_streams.is_empty() {
            self.tell_watches(&mut inner, state, index, cmd, applied);
        }
        Events::end_holds(&mut inner, applied, now);
        let renewed = match &applied.outcome {
            Outcome::Renewed(grant) => Some(grant),
            _ => None,
        };
        for grant in applied.grants.iter().chain(renewed) {
            match grant.lease {
                Lease::Ttl { ttl_ms, .. } => {
                    let key = (grant.name.clone(), grant.fence);
                    inner.holds.set(&key, grant.fence, now, Duration::from_millis(ttl_ms), ());
                }
                Lease::Session(id) => {
                    if let Some(tx) = inner.streams.get(&id) {
                        let _ = tx.unbounded_send(Box::new(SessionNote::Granted(grant.clone())));
                    }
                }
                Lease::Delayed { .. } => unreachable!("a grant is a live hold"),
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
            Events::end_waiter(&mut inner, token);
        }
        for grant in &applied.grants {
            Events::end_waiter(&mut inner, &grant.token);
        }
        if let (Some((a, _)), Outcome::Queued { .. }) = (cmd.acquire(), &applied.outcome) {
            if a.session.is_none() {
                inner.waiters.set(&a.token, 0, now, WAITER_LEASE, ());
                inner.waiter_names.insert(a.token, a.name.clone());
            }
        }
        // The sessions' deadlines and counts follow the state: a session opened gets a full lease, one
        // closed or expired leaves, and one whose claims changed has them counted again.
        for &id in state.sessions_changed() {
            match state.session_summary(id) {
                Some((_, lease_ms, holds, waits)) => {
                    if !inner.sessions.set_payload(&id, counts(holds, waits)) {
                        inner.sessions.set(&id, 0, now, Duration::from_millis(lease_ms), counts(holds, waits));
                    }
                }
                None => inner.sessions.end(&id, 0),
            }
        }
    }

    fn flushed(&self, took: Duration) {
        self.metrics.fsync.observe(took.as_secs_f64());
    }

    fn sync_aside(&self) -> bool {
        let aside = self.waiting.many();
        if aside {
            self.metrics.appends_synced_aside.inc();
        }
        aside
    }

    fn snapshot_stored(&self, index: u64, bytes: u64) {
        let mut snapshot = self.snapshot.lock().expect("snapshot poisoned");
        // A build stored before an install that covers more may report after it: the newer one stands.
        if snapshot.is_some_and(|(stored, _)| stored > index) {
            return;
        }
        *snapshot = Some((index, bytes));
        self.metrics.snapshot_index.set(index as i64);
        self.metrics.snapshot_bytes.set(bytes as i64);
    }

    fn restored(&self, state: &LockState) {
        // The deadlines are rebuilt, and the old ones dropped, without the lock (see [`Rebuilt`]).
        let rebuilt = Rebuilt::of(state, Instant::now());
        let replaced = {
            let mut inner = self.lock();
            let replaced = inner.install(rebuilt);
            // The whole state changed: every long poll looks again, and every watch stream ends (what changed
            // in the entries the snapshot covers is not known, so a stream that went on would skip changes);
            // its client resumes from the last revision it saw.
            let streams = std::mem::take(&mut inner.lock_streams);
            let prefix_streams = std::mem::take(&mut inner.prefix_streams);
            let count = streams.values().chain(prefix_streams.values()).map(|s| s.len() as i64).sum();
            self.metrics.lock_watchers.dec_by(count);
            drop((streams, prefix_streams));
            let lock_watchers = std::mem::take(&mut inner.lock_watchers);
            for (_, watchers) in lock_watchers {
                self.metrics.lock_watchers.dec_by(watchers.len() as i64);
                for (_, tx) in watchers {
                    let _ = tx.send(());
                }
            }
            let watchers = std::mem::take(&mut inner.watchers);
            for (token, (name, tx)) in watchers {
                if let Some(grant) = state.grant(&name, token) {
                    let _ = tx.send(grant);
                } else if state.is_waiting(&name, token) {
                    inner.watchers.insert(token, (name, tx));
                }
            }
            replaced
        };
        drop(replaced);
    }
}

#[cfg(test)]
mod tests {
    use holdfast_core::{Acquire, Entry, Token};

    use super::*;

    const TTL: Duration = Duration::from_secs(1);

    /// Applies `cmd` at log index `index` to `state` and tells `events`, as the state machine does.
    fn apply(events: &Events, state: &mut LockState, index: u64, cmd: Command) {
        let applied = state.apply(index, &Entry { at_ms: 1, cmd: cmd.clone() });
        events.applied(state, index, &cmd, &applied);
    }

    fn acquire(name: &str, session: Option<SessionId>) -> Command {
        acquire_by(name, Token(7), 0, session)
    }

    /// An acquire of `name` by `token`, waiting up to `wait_ms` if it is held.
    fn acquire_by(name: &str, token: Token, wait_ms: u64, session: Option<SessionId>) -> Command {
        Command::Acquire(Acquire {
            name: name.into(),
            owner: "w".into(),
            token,
            ttl_ms: TTL.as_millis() as u64,
            wait_ms,
            session,
        })
    }

    /// A heartbeat is answered from the keeper alone: the session's counts of holds and waits follow every
    /// entry that changes them, and a session closed or expired is not extended.
    #[test]
    fn a_heartbeat_answers_the_counts_of_the_state_as_applied() {
        let events = Events::default();
        let mut state = LockState::new();
        let (one, two): (SessionId, SessionId) = (9, 10);
        for (index, id) in [(1, one), (2, two)] {
            let secret = holdfast_core::SessionSecret(Token(id.into())).digest();
            apply(&events, &mut state, index, Command::OpenSession { id, owner: "s".into(), lease_ms: 2_000, secret });
        }
        let counts = |id| events.extending().extend(id);
        assert_eq!((counts(one), counts(two)), (Some((0, 0)), Some((0, 0))));
        apply(&events, &mut state, 3, acquire_by("a", Token(1), 0, Some(one)));
        apply(&events, &mut state, 4, acquire_by("a", Token(2), 60_000, Some(two)));
        apply(&events, &mut state, 5, acquire_by("b", Token(3), 0, Some(two)));
        assert_eq!((counts(one), counts(two)), (Some((1, 0)), Some((1, 1))));
        // Let go (a session's release is a cancel), "a" goes to the second session.
        apply(&events, &mut state, 6, Command::Cancel { name: "a".into(), token: Token(1) });
        assert_eq!((counts(one), counts(two)), (Some((0, 0)), Some((2, 0))));
        apply(&events, &mut state, 7, Command::CloseSession { id: two });
        assert_eq!((counts(one), counts(two)), (Some((0, 0)), None));
        let expire = holdfast_core::Expire { sessions: vec![one], ..Default::default() };
        apply(&events, &mut state, 8, Command::Expire(expire));
        assert_eq!(counts(one), None);
        assert!(!events.extending().is_open(one));
    }

    /// The names of the TTL holds the keeper finds run out now (leader time far ahead of every TTL).
    fn due_holds(events: &Events, state: &LockState) -> Vec<String> {
        events.due(state, Instant::now(), u64::MAX, Duration::ZERO).locks.into_iter().map(|(name, _)| name).collect()
    }

    /// The tokens of the one-shot waiters the keeper finds run out now.
    fn due_waiters(events: &Events, state: &LockState) -> Vec<Token> {
        events
            .due(state, Instant::now(), u64::MAX, Duration::ZERO)
            .waiters
            .into_iter()
            .map(|(_, token)| token)
            .collect()
    }

    /// A lock handed over to a waiter attached elsewhere and a session opened make their entry's commit
    /// urgent (a follower may be waiting to apply it); a grant to its own acquire, a queued acquire, a
    /// release with nobody waiting and a hand-over to a waiter attached to this node do not.
    #[test]
    fn a_hand_over_or_a_session_opened_makes_its_commit_urgent() {
        let events = Events::default();
        let urgent = events.urgent_commits();
        let mut state = LockState::new();
        apply(&events, &mut state, 1, acquire("a", None));
        apply(&events, &mut state, 2, acquire_by("a", Token(8), 60_000, None));
        assert_eq!(*urgent.borrow(), 0, "a grant to its own acquire, and a queued acquire");
        let open = Command::OpenSession {
            id: 9,
            owner: "s".into(),
            lease_ms: 2_000,
            secret: holdfast_core::SessionSecret(holdfast_core::Token(1)).digest(),
        };
        apply(&events, &mut state, 3, open);
        assert_eq!(*urgent.borrow(), 3, "a session opened");
        apply(&events, &mut state, 4, Command::Release { name: "a".into(), token: Token(7) });
        assert_eq!(state.holder("a").map(|holder| holder.fence), Some(4), "the waiter holds it");
        assert_eq!(*urgent.borrow(), 4, "a hand-over");
        apply(&events, &mut state, 5, acquire("b", None));
        apply(&events, &mut state, 6, Command::Release { name: "b".into(), token: Token(7) });
        assert_eq!(*urgent.borrow(), 4, "a grant and a release with nobody waiting");
        // A waiter whose long poll is on this node: told here, nobody else waits.
        apply(&events, &mut state, 7, acquire("b", None));
        apply(&events, &mut state, 8, acquire_by("b", Token(10), 60_000, None));
        let _told = events.watch("b", Token(10));
        apply(&events, &mut state, 9, Command::Release { name: "b".into(), token: Token(7) });
        assert_eq!(state.holder("b").map(|holder| holder.fence), Some(9), "the waiter holds it");
        assert_eq!(*urgent.borrow(), 4, "a hand-over to a waiter attached here");
        // The same for a session whose stream is attached here.
        apply(&events, &mut state, 10, acquire("c", None));
        apply(&events, &mut state, 11, acquire_by("c", Token(11), 60_000, Some(9)));
        let _notes = events.attach(9);
        apply(&events, &mut state, 12, Command::Release { name: "c".into(), token: Token(7) });
        assert_eq!(state.holder("c").map(|holder| holder.fence), Some(12), "the session holds it");
        assert_eq!(*urgent.borrow(), 4, "a hand-over to a session attached here");
    }

    /// The end of a session's hold reaches the stream attached here by the session the entry names, also
    /// for a state replaced whole since the grant; a TTL hold's end, and a session's attached elsewhere,
    /// tell nobody.
    #[tokio::test]
    async fn the_end_of_a_sessions_hold_is_told_to_its_stream() {
        let events = Events::default();
        let mut state = LockState::new();
        for (id, index) in [(9, 1), (10, 2)] {
            let secret = holdfast_core::SessionSecret(holdfast_core::Token(1)).digest();
            apply(&events, &mut state, index, Command::OpenSession { id, owner: "s".into(), lease_ms: 2_000, secret });
        }
        apply(&events, &mut state, 3, acquire_by("a", Token(30), 0, Some(9)));
        apply(&events, &mut state, 4, acquire_by("b", Token(31), 0, Some(10)));
        apply(&events, &mut state, 5, acquire("c", None));
        events.restored(&state);
        let mut notes = events.attach(9);
        apply(&events, &mut state, 6, Command::Release { name: "c".into(), token: Token(7) });
        for (index, name, token) in [(7, "b", 31), (8, "a", 30)] {
            apply(&events, &mut state, index, Command::Cancel { name: name.into(), token: Token(token) });
        }
        assert!(["a", "b", "c"].iter().all(|name| state.holder(name).is_none()), "all let go");
        let note = notes.rx.try_recv().expect("told");
        assert!(matches!(*note, SessionNote::Ended { ref name, fence: 3 } if name == "a"), "{note:?}");
        assert!(notes.rx.try_recv().is_err(), "nothing else was told");
    }

    /// Bugs with `no_promotion_grace` as given (which only the `faults` feature can set).
    fn broken_grace(broken: bool) -> Bugs {
        #[cfg(feature = "faults")]
        return Bugs { no_promotion_grace: broken, ..Bugs::default() };
        #[cfg(not(feature = "faults"))]
        {
            assert!(!broken, "the broken variant needs the faults feature");
            Bugs::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_promotion_gives_every_deadline_a_full_lease_from_then() {
        // Without the grace (a broken variant, only with the `faults` feature) the test must fail: it is
        // run both ways when it can be.
        let graces: &[bool] = if cfg!(feature = "faults") { &[true, false] } else { &[true] };
        for &grace in graces {
            let bugs = broken_grace(!grace);
            let events = Events::default();
            let mut state = LockState::new();
            let session: SessionId = 9;
            let lease = Duration::from_secs(2);
            apply(&events, &mut state, 1, acquire("a", None));
            let open = Command::OpenSession {
                id: session,
                owner: "s".into(),
                lease_ms: lease.as_millis() as u64,
                secret: holdfast_core::SessionSecret(holdfast_core::Token(1)).digest(),
            };
            apply(&events, &mut state, 2, open);
            // A one-shot request waits for "a" (its node pings the leader that it still waits).
            let waiter = Token(8);
            apply(&events, &mut state, 3, acquire_by("a", waiter, 60_000, None));
            // As a follower, past the hold's TTL and the session's lease (heartbeats go to the leader only).
            tokio::time::advance(Duration::from_secs(3)).await;
            assert!(events.promote(1, Instant::now(), bugs));
            assert!(!events.promote(1, Instant::now(), bugs), "once per term");
            if !grace {
                // The broken variant acts on the follower's stale deadlines.
                assert_eq!(due_holds(&events, &state), ["a"]);
                assert_eq!(due_waiters(&events, &state), [waiter]);
                assert!(events.extending().extend(session).is_none());
                continue;
            }
            assert!(due_holds(&events, &state).is_empty(), "a full TTL from the promotion");
            assert!(due_waiters(&events, &state).is_empty(), "a full waiter lease from the promotion");
            // A hold granted after the promotion runs out a TTL after its own grant.
            tokio::time::advance(Duration::from_millis(500)).await;
            apply(&events, &mut state, 4, acquire("b", None));
            tokio::time::advance(Duration::from_millis(499)).await;
            assert!(due_holds(&events, &state).is_empty());
            assert!(
                events.extending().extend(session).is_some(),
                "the session's lease from the promotion has not passed"
            );
            tokio::time::advance(Duration::from_millis(1)).await;
            assert_eq!(due_holds(&events, &state), ["a"], "a TTL after the promotion");
            tokio::time::advance(Duration::from_millis(500)).await;
            assert_eq!(due_holds(&events, &state), ["a", "b"]);
            // The heartbeat above moved the session's deadline to 2 s after it.
            tokio::time::advance(Duration::from_millis(1_498)).await;
            assert!(events.due(&state, Instant::now(), u64::MAX, Duration::ZERO).sessions.is_empty());
            tokio::time::advance(Duration::from_millis(1)).await;
            // A leader that confirms heartbeats late waits that much more: a heartbeat may be on its way.
            let grace = Duration::from_millis(100);
            assert!(events.due(&state, Instant::now(), u64::MAX, grace).sessions.is_empty(), "within the grace");
            assert_eq!(events.due(&state, Instant::now(), u64::MAX, Duration::ZERO).sessions, [session]);
            // The waiter's lease (3 s) from the promotion, at 3 s after it.
            assert!(due_waiters(&events, &state).is_empty());
            tokio::time::advance(Duration::from_millis(1)).await;
            assert_eq!(due_waiters(&events, &state), [waiter]);
        }
    }

    /// With `--max-clock-skew`, a new leader keeps the stamped end of each TTL hold it was given as a
    /// follower, plus the bound and its election; a hold it grants itself needs no margin, and a session
    /// still gets a full lease from the promotion.
    #[tokio::test(start_paused = true)]
    async fn a_bound_on_clock_skew_keeps_the_stamped_ends_of_holds_through_a_promotion() {
        let skew = Duration::from_millis(500);
        let events = Events { max_clock_skew: Some(skew), ..Events::default() };
        let mut state = LockState::new();
        // Every entry is stamped at 1 ms: "a" runs out at 1 001 ms by leader time.
        apply(&events, &mut state, 1, acquire("a", None));
        let open = Command::OpenSession {
            id: 9,
            owner: "s".into(),
            lease_ms: 2_000,
            secret: holdfast_core::SessionSecret(holdfast_core::Token(1)).digest(),
        };
        apply(&events, &mut state, 2, open);
        // The last word from the old leader, then 200 ms of election; by then the hold's TTL has passed here.
        tokio::time::advance(Duration::from_millis(2_800)).await;
        let followed = Instant::now();
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(events.promote(1, followed, Bugs::default()));
        let due_at = |state: &LockState, wall_ms: u64| -> Vec<String> {
            events.due(state, Instant::now(), wall_ms, Duration::ZERO).locks.into_iter().map(|(name, _)| name).collect()
        };
        assert!(due_at(&state, 1_001 + 699).is_empty(), "the stamped end plus the bound and the election to go");
        assert_eq!(due_at(&state, 1_001 + 700), ["a"], "no full TTL from the promotion");
        // A hold granted after the promotion: its own TTL and its stamped end, no margin.
        apply(&events, &mut state, 3, acquire("b", None));
        tokio::time::advance(TTL).await;
        assert_eq!(due_at(&state, 1_001), ["b"]);
        // The session, opened before the promotion, still has its whole lease from it (2 s; 1 s passed).
        assert!(events.due(&state, Instant::now(), u64::MAX, Duration::ZERO).sessions.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_state_replaced_whole_gets_full_leases_from_then_and_its_watchers_are_told() {
        let events = Events::default();
        // What this node applied before: a hold the new state does not have, and a request waiting for it.
        let mut before = LockState::new();
        apply(&events, &mut before, 1, acquire("gone", None));
        apply(&events, &mut before, 2, acquire_by("gone", Token(20), 60_000, None));
        let mut dropped = events.watch("gone", Token(20));
        // The snapshot's state, made elsewhere: TTL holds "a" and "b" (the latter granted to a request
        // waiting here), a request still waiting for "a", and a session holding "s".
        let mut state = LockState::new();
        let session: SessionId = 9;
        let lease = Duration::from_secs(2);
        let commands = [
            acquire("a", None),
            acquire_by("b", Token(21), 60_000, None),
            acquire_by("a", Token(8), 60_000, None),
            Command::OpenSession {
                id: session,
                owner: "s".into(),
                lease_ms: lease.as_millis() as u64,
                secret: holdfast_core::SessionSecret(holdfast_core::Token(1)).digest(),
            },
            acquire_by("s", Token(30), 0, Some(session)),
        ];
        for (i, cmd) in commands.into_iter().enumerate() {
            state.apply(i as u64 + 1, &Entry { at_ms: 1, cmd });
        }
        let mut granted = events.watch("b", Token(21));
        let mut waiting = events.watch("a", Token(8));

        tokio::time::advance(Duration::from_secs(5)).await;
        events.restored(&state);
        assert_eq!(granted.try_recv().expect("told of its grant").name, "b");
        assert!(
            matches!(dropped.try_recv(), Err(oneshot::error::TryRecvError::Closed)),
            "a request the new state does not have is told it left the queue"
        );
        assert!(matches!(waiting.try_recv(), Err(oneshot::error::TryRecvError::Empty)), "still waiting");
        {
            let inner = events.lock();
            let mut names: Vec<&str> = inner.holds.keys().map(|(name, _)| name.as_str()).collect();
            names.sort_unstable();
            assert_eq!(names, ["a", "b"], "the old hold's deadline is gone");
        }
        // Everything runs a full lease from the replacement.
        tokio::time::advance(TTL - Duration::from_millis(1)).await;
        assert!(due_holds(&events, &state).is_empty());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(due_holds(&events, &state), ["a", "b"]);
        tokio::time::advance(lease - TTL).await;
        assert_eq!(events.due(&state, Instant::now(), u64::MAX, Duration::ZERO).sessions, [session]);
        assert!(due_waiters(&events, &state).is_empty());
        tokio::time::advance(WAITER_LEASE - lease).await;
        assert_eq!(due_waiters(&events, &state), [Token(8)]);
    }

    #[test]
    fn a_follower_syncs_aside_while_many_writes_wait_and_counts_each() {
        let events = Events::default();
        let mut waiting: Vec<_> =
            (0..crate::apply::waiting::SYNC_ASIDE_WAITING - 1).map(|_| events.waiting().count()).collect();
        assert!(!events.sync_aside(), "in place under the threshold");
        waiting.push(events.waiting().count());
        assert!(events.sync_aside() && events.sync_aside());
        assert_eq!(events.metrics().appends_synced_aside.get(), 2);
        drop(waiting);
        assert!(!events.sync_aside());
        assert_eq!(events.metrics().appends_synced_aside.get(), 2);
    }
}
