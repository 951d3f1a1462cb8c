//! Model test: random histories applied to [`LockState`] and to a deliberately simple model written
//! here (locks in a sorted `Vec`, a session's claims found by scanning the locks), compared after every
//! entry: the whole `Applied`, every view, and the structural invariants.
//!
//! Besides the commands, a history may move the leader's clock (sometimes backwards: apply must keep
//! time monotonic), and replace the state by a restore of its own snapshot (a replica that restarted or
//! installed a snapshot must go on exactly as the one that did not).
//!
//! The model keeps no revisions of its own making: after every command it compares each lock with what
//! it was before, and a lock that differs (or was renewed, or had its value set) gets the entry's index.
//!
//! The model encodes the intended rule for an `Expire` that ends sessions: a session that ends in an
//! entry is never handed a lock in that same entry (its wait is dropped at the hand-over instead). See
//! the `bug_expire_…` tests in `outcomes.rs`.
//!
//! Semaphores: a lock has a limit (1 unless an `AcquireSemaphore` gave another) and up to that many
//! places, each a holder of its own, in fence order. An entry grants a lock at most once: a place whose
//! hold ends in an entry that granted the lock already, while anyone waits, is kept (a lock-delay that
//! ends now) for the next `Expire` to hand over.

use holdfast_core::limits::{
    self, FREED_KEEP_MS, LOCK_DELAY_MS_MAX, SEMAPHORE_LIMIT_MAX, TTL_MS_MAX, TTL_MS_MIN, VALUE_LEN_MAX,
};
use holdfast_core::{
    Acquire, Applied, Command, Ended, Entry, Expire, Grant, HolderView, Lease, LockState, LockView, Outcome, Reject,
    SessionId, SessionSecret, SessionWait, Token, WaiterView,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

const T0: u64 = 1_700_000_000_000;
/// "a" is a prefix of "a.1", so `list` by prefix has something to tell apart.
const NAMES: [&str; 4] = ["a", "a.1", "b", "c"];
/// The limit most acquires of each name give: "a.1" and "c" are semaphores, of 2 and 3 places; "a" and
/// "b" locks, taken by the acquires without a limit.
const NAME_LIMITS: [u32; 4] = [1, 2, 1, 3];
/// Limits an `AcquireSemaphore` may give instead of its name's (one past the end: an acquire without a
/// limit): a lock asked for as a semaphore of 1, a limit other than the lock's, or an invalid one (0 and
/// the last).
const LIMITS: [u32; 5] = [1, 2, 3, 0, SEMAPHORE_LIMIT_MAX + 1];
/// 5 is below `TTL_MS_MIN`: some acquires, renews and opens are rejected.
const TTLS: [u64; 5] = [5, 10, 40, 150, 600];
const WAITS: [u64; 5] = [0, 20, 200, 2_000, 2_000];
const TOKENS: u8 = 6;
/// Values an acquire (one past the end: a plain `Acquire`) or a value change gives; the last is too long.
const VALUES: [&[u8]; 4] = [b"", b"10.0.0.1:7070", &[0xff, 0, 7], &[b'x'; VALUE_LEN_MAX + 1]];
const SESSIONS: SessionId = 3;
/// Lock-delays an acquire asks for (0: a command without one); the last is too long.
const DELAYS: [u64; 5] = [0, 0, 30, 500, LOCK_DELAY_MS_MAX + 1];

fn token(t: u8) -> Token {
    Token((u128::from(t) << 64) | 0xabc)
}

// --- the model ---

#[derive(Debug, Clone, PartialEq)]
struct MHolder {
    owner: String,
    token: Token,
    fence: u64,
    granted_at_ms: u64,
    lease: Lease,
    value: Vec<u8>,
    lock_delay_ms: u64,
}

impl MHolder {
    /// Whether `token` holds this place now (not an expired hold in its lock-delay).
    fn holds(&self, token: Token) -> bool {
        self.token == token && !matches!(self.lease, Lease::Delayed { .. })
    }
}

#[derive(Debug, Clone, PartialEq)]
struct MWaiter {
    owner: String,
    token: Token,
    ttl_ms: u64,
    queued_at_ms: u64,
    /// `None`: a session's waiter, which waits as long as its session lives.
    wait_until_ms: Option<u64>,
    session: Option<SessionId>,
    value: Vec<u8>,
    lock_delay_ms: u64,
}

#[derive(Debug, Clone)]
struct MLock {
    name: String,
    /// Its places, held or in their lock-delay, in fence order: never empty, at most `limit`.
    holders: Vec<MHolder>,
    limit: u32,
    /// Only while every place is taken.
    waiters: Vec<MWaiter>,
    revision: u64,
}

impl MLock {
    fn first(&self) -> &MHolder {
        &self.holders[0]
    }

    /// The place `token` holds now.
    fn held_by(&self, token: Token) -> Option<&MHolder> {
        self.holders.iter().find(|h| h.holds(token))
    }

    /// The place (held or in its delay) under `fence`.
    fn place(&self, fence: u64) -> Option<&MHolder> {
        self.holders.iter().find(|h| h.fence == fence)
    }

    fn is_full(&self) -> bool {
        self.holders.len() == self.limit as usize
    }
}

#[derive(Debug, Clone, Default)]
struct Model {
    /// Sorted by name.
    locks: Vec<MLock>,
    /// Open sessions and their leases.
    sessions: Vec<(SessionId, u64)>,
    now_ms: u64,
    index: u64,
    /// Locks freed, with the index and time of the entry that last freed each.
    freed: Vec<(String, u64, u64)>,
    /// The highest revision of a free forgotten.
    forgotten_through: u64,
    /// How many `Expire` items found a place whose delay had passed but left it for a later entry (for
    /// the coverage test).
    held_back: usize,
}

/// What an entry did besides its outcome.
#[derive(Default)]
struct Effects {
    grants: Vec<Grant>,
    ended: Vec<Ended>,
    dropped: Vec<(String, Token)>,
    delayed: Vec<(String, u64, u64)>,
}

fn grant_of(name: &str, h: &MHolder) -> Grant {
    Grant {
        name: name.to_owned(),
        owner: h.owner.clone(),
        token: h.token,
        fence: h.fence,
        granted_at_ms: h.granted_at_ms,
        lease: h.lease,
        value: h.value.clone(),
    }
}

fn view_of(h: &MHolder) -> HolderView {
    HolderView {
        owner: h.owner.clone(),
        fence: h.fence,
        granted_at_ms: h.granted_at_ms,
        lease: h.lease,
        value: h.value.clone(),
    }
}

fn lock_view(l: &MLock) -> LockView {
    LockView {
        name: l.name.clone(),
        holder: view_of(l.first()),
        holders: l.holders.iter().map(view_of).collect(),
        limit: l.limit,
        waiters: l
            .waiters
            .iter()
            .map(|w| WaiterView { owner: w.owner.clone(), queued_at_ms: w.queued_at_ms, session: w.session })
            .collect(),
        revision: l.revision,
    }
}

fn valid_ttl(ttl_ms: u64) -> bool {
    (TTL_MS_MIN..=TTL_MS_MAX).contains(&ttl_ms)
}

impl Model {
    fn find(&self, name: &str) -> Option<usize> {
        self.locks.iter().position(|l| l.name == name)
    }

    fn lock(&self, name: &str) -> Option<&MLock> {
        self.find(name).map(|i| &self.locks[i])
    }

    /// The place of `name` under `fence`, to change it.
    fn place_mut(&mut self, name: &str, fence: u64) -> &mut MHolder {
        let i = self.find(name).expect("a place of an existing lock");
        self.locks[i].holders.iter_mut().find(|h| h.fence == fence).expect("an existing place")
    }

    fn is_open(&self, id: SessionId) -> bool {
        self.sessions.iter().any(|(s, _)| *s == id)
    }

    fn not_holder(&self, name: &str) -> Outcome {
        Outcome::Rejected(Reject::NotHolder {
            name: name.to_owned(),
            holder: self.lock(name).map(|l| view_of(l.first())),
        })
    }

    /// What a watch of `prefix` that last saw revision `after` missed, as `LockState::changed_since`.
    fn changed_since(&self, prefix: &str, after: u64) -> Vec<(String, Option<LockView>, u64)> {
        let mut changed: Vec<(String, Option<LockView>, u64)> = Vec::new();
        for lock in self.locks.iter().filter(|l| l.name.starts_with(prefix) && l.revision > after) {
            changed.push((lock.name.clone(), Some(lock_view(lock)), lock.revision));
        }
        for (name, revision, _) in &self.freed {
            if name.starts_with(prefix) && *revision > after && self.lock(name).is_none() {
                changed.push((name.clone(), None, *revision));
            }
        }
        changed.sort_by(|a, b| (a.2, &a.0).cmp(&(b.2, &b.0)));
        changed
    }

    fn revision(&self, name: &str) -> u64 {
        match self.lock(name) {
            Some(l) => l.revision,
            None => self.freed.iter().find(|(n, _, _)| n == name).map_or(0, |(_, revision, _)| *revision),
        }
    }

    fn apply(&mut self, index: u64, entry: &Entry) -> Applied {
        assert!(index > self.index);
        self.index = index;
        self.now_ms = self.now_ms.max(entry.at_ms);
        let mut fx = Effects::default();
        let outcome = match &entry.cmd {
            // A batch is its commands one after the other, under one index and time.
            Command::Batch(cmds) => Outcome::Batch(cmds.iter().map(|cmd| self.apply_cmd(cmd, &mut fx)).collect()),
            // A group is a batch whose lock may repeat under a rule; one that breaks it changes nothing.
            Command::Group(cmds) if cmds.iter().enumerate().all(|(i, cmd)| follows_group_rule(&cmds[..i], cmd)) => {
                Outcome::Batch(cmds.iter().map(|cmd| self.apply_cmd(cmd, &mut fx)).collect())
            }
            Command::Group(_) => Outcome::Rejected(Reject::InvalidBatch),
            cmd => self.apply_cmd(cmd, &mut fx),
        };
        let now = self.now_ms;
        for (_, revision, freed_at_ms) in &self.freed {
            if freed_at_ms + FREED_KEEP_MS <= now {
                self.forgotten_through = self.forgotten_through.max(*revision);
            }
        }
        self.freed.retain(|(_, _, freed_at_ms)| freed_at_ms + FREED_KEEP_MS > now);
        Applied {
            at_ms: self.now_ms,
            outcome,
            grants: fx.grants,
            ended: fx.ended,
            dropped: fx.dropped,
            delayed: fx.delayed,
        }
    }

    /// Applies one command, then gives every lock it changed (or renewed, or set the value of) this
    /// entry's revision, and remembers the locks it freed.
    fn apply_cmd(&mut self, cmd: &Command, fx: &mut Effects) -> Outcome {
        let before = self.locks.clone();
        let outcome = self.apply_one(cmd, fx);
        let written = match &outcome {
            Outcome::Renewed(grant) | Outcome::ValueSet(grant) => Some(grant.name.clone()),
            _ => None,
        };
        let index = self.index;
        for lock in &mut self.locks {
            let old = before.iter().find(|l| l.name == lock.name);
            let same = old.is_some_and(|old| old.holders == lock.holders && old.waiters == lock.waiters);
            if !same || written.as_ref() == Some(&lock.name) {
                lock.revision = index;
            }
        }
        // A lock freed by the command is remembered under this entry's revision (a lock taken again keeps
        // its memory, which its own revision hides, until it is freed again or forgotten).
        for old in &before {
            if self.lock(&old.name).is_none() {
                self.freed.retain(|(name, _, _)| *name != old.name);
                self.freed.push((old.name.clone(), index, self.now_ms));
            }
        }
        outcome
    }

    fn apply_one(&mut self, cmd: &Command, fx: &mut Effects) -> Outcome {
        match cmd {
            Command::Acquire(a) => self.acquire(a, &[], 0, 1, fx),
            Command::AcquireValued { acquire, value } => self.acquire(acquire, value, 0, 1, fx),
            Command::AcquireDelayed { acquire, value, lock_delay_ms } => {
                self.acquire(acquire, value, *lock_delay_ms, 1, fx)
            }
            Command::AcquireSemaphore { acquire, value, lock_delay_ms, limit } => {
                self.acquire(acquire, value, *lock_delay_ms, *limit, fx)
            }
            Command::SetValue { name, token, value } => self.set_value(name, *token, value),
            Command::Release { name, token } => match self.lock(name).and_then(|l| l.held_by(*token)) {
                Some(h) if matches!(h.lease, Lease::Session(_)) => {
                    Outcome::Rejected(Reject::SessionHold { name: name.clone() })
                }
                _ => self.release(name, *token, fx),
            },
            Command::Renew { name, token, ttl_ms } => self.renew(name, *token, Some(*ttl_ms)),
            Command::RenewKeepingTtl { name, token } => self.renew(name, *token, None),
            Command::Cancel { name, token } => self.cancel(name, *token, fx),
            Command::OpenSession { id, lease_ms, .. }
            | Command::OpenSessionWithoutSecret { id, lease_ms, .. }
            | Command::OpenSessionCapped { id, lease_ms, .. } => {
                if !valid_ttl(*lease_ms) {
                    Outcome::Rejected(Reject::InvalidTtl(*lease_ms))
                } else if self.is_open(*id) {
                    Outcome::Rejected(Reject::SessionExists(*id))
                } else {
                    self.sessions.push((*id, *lease_ms));
                    Outcome::SessionOpened { id: *id }
                }
            }
            Command::CloseSession { id } => {
                if self.close(*id, &[*id], false, fx) {
                    Outcome::SessionClosed { id: *id }
                } else {
                    Outcome::Rejected(Reject::NoSession(*id))
                }
            }
            Command::Expire(e) => self.expire(e, fx),
            // The generator below makes no key commands (and no tenant names); outcomes.rs covers keys.
            Command::CreateKey { .. } | Command::RevokeKey { .. } => unreachable!("the model makes no key commands"),
            Command::Batch(_) | Command::Group(_) => unreachable!("the model nests no batches"),
        }
    }

    /// The answer to an acquire that changes nothing whatever the lock's places: a refusal, or what a
    /// session asking again for a lock it holds a place of or waits for was answered before.
    fn answer_unchanged(&self, a: &Acquire, value: &[u8], lock_delay_ms: u64, limit: u32) -> Option<Outcome> {
        // The generator only makes valid names, owners and waits.
        let reject = if value.len() > VALUE_LEN_MAX {
            Reject::ValueTooLong(value.len())
        } else if lock_delay_ms > LOCK_DELAY_MS_MAX {
            Reject::InvalidLockDelay(lock_delay_ms)
        } else if limit == 0 || limit > SEMAPHORE_LIMIT_MAX {
            Reject::InvalidLimit(limit)
        } else if a.session.is_none() && !valid_ttl(a.ttl_ms) {
            Reject::InvalidTtl(a.ttl_ms)
        } else if let Some(lock) = self.lock(&a.name).filter(|l| l.limit != limit) {
            Reject::LimitMismatch { name: a.name.clone(), limit: lock.limit }
        } else if let Some(id) = a.session.filter(|id| !self.is_open(*id)) {
            Reject::NoSession(id)
        } else {
            let (id, lock) = (a.session?, self.lock(&a.name)?);
            if let Some(h) = lock.holders.iter().find(|h| h.lease == Lease::Session(id)) {
                return Some(Outcome::Granted(grant_of(&a.name, h)));
            }
            let i = lock.waiters.iter().position(|w| w.session == Some(id))?;
            return Some(Outcome::Queued { position: i + 1, holder: view_of(lock.first()) });
        };
        Some(Outcome::Rejected(reject))
    }

    fn acquire(&mut self, a: &Acquire, value: &[u8], lock_delay_ms: u64, limit: u32, fx: &mut Effects) -> Outcome {
        if let Some(outcome) = self.answer_unchanged(a, value, lock_delay_ms, limit) {
            return outcome;
        }
        let now = self.now_ms;
        let holder = MHolder {
            owner: a.owner.clone(),
            token: a.token,
            fence: self.index,
            granted_at_ms: now,
            lease: match a.session {
                Some(id) => Lease::Session(id),
                None => Lease::Ttl { ttl_ms: a.ttl_ms, expires_at_ms: now + a.ttl_ms },
            },
            value: value.to_vec(),
            lock_delay_ms,
        };
        let grant = grant_of(&a.name, &holder);
        let Some(i) = self.find(&a.name) else {
            let at = self.locks.partition_point(|l| l.name < a.name);
            let (name, revision) = (a.name.clone(), self.index);
            self.locks.insert(at, MLock { name, holders: vec![holder], limit, waiters: vec![], revision });
            fx.grants.push(grant.clone());
            return Outcome::Granted(grant);
        };
        let lock = &mut self.locks[i];
        if lock.holders.iter().any(|h| h.token == a.token) || lock.waiters.iter().any(|w| w.token == a.token) {
            return Outcome::Rejected(Reject::DuplicateToken);
        }
        if !lock.is_full() {
            lock.holders.push(holder);
            fx.grants.push(grant.clone());
            return Outcome::Granted(grant);
        }
        if a.wait_ms == 0 {
            return Outcome::Busy { holder: view_of(lock.first()) };
        }
        lock.waiters.push(MWaiter {
            owner: a.owner.clone(),
            token: a.token,
            ttl_ms: a.ttl_ms,
            queued_at_ms: now,
            wait_until_ms: a.session.is_none().then(|| now + a.wait_ms),
            session: a.session,
            value: value.to_vec(),
            lock_delay_ms,
        });
        Outcome::Queued { position: lock.waiters.len(), holder: view_of(lock.first()) }
    }

    fn release(&mut self, name: &str, token: Token, fx: &mut Effects) -> Outcome {
        match self.lock(name).and_then(|l| l.held_by(token)).map(|h| h.fence) {
            Some(fence) => {
                self.end_hold(name, fence, &[], false, fx);
                Outcome::Released { name: name.to_owned(), fence }
            }
            None => self.not_holder(name),
        }
    }

    fn renew(&mut self, name: &str, token: Token, ttl_ms: Option<u64>) -> Outcome {
        if let Some(ttl_ms) = ttl_ms.filter(|ttl| !valid_ttl(*ttl)) {
            return Outcome::Rejected(Reject::InvalidTtl(ttl_ms));
        }
        let now = self.now_ms;
        let Some(fence) = self.lock(name).and_then(|l| l.held_by(token)).map(|h| h.fence) else {
            return self.not_holder(name);
        };
        let holder = self.place_mut(name, fence);
        match holder.lease {
            Lease::Session(_) => Outcome::Rejected(Reject::SessionHold { name: name.to_owned() }),
            Lease::Delayed { .. } => unreachable!("nobody holds a place in its delay"),
            Lease::Ttl { expires_at_ms, .. } if now >= expires_at_ms => {
                Outcome::Rejected(Reject::Expired { name: name.to_owned() })
            }
            Lease::Ttl { ttl_ms: held, .. } => {
                let ttl_ms = ttl_ms.unwrap_or(held);
                holder.lease = Lease::Ttl { ttl_ms, expires_at_ms: now + ttl_ms };
                Outcome::Renewed(grant_of(name, holder))
            }
        }
    }

    fn set_value(&mut self, name: &str, token: Token, value: &[u8]) -> Outcome {
        if value.len() > VALUE_LEN_MAX {
            return Outcome::Rejected(Reject::ValueTooLong(value.len()));
        }
        let now = self.now_ms;
        let Some(fence) = self.lock(name).and_then(|l| l.held_by(token)).map(|h| h.fence) else {
            return self.not_holder(name);
        };
        let holder = self.place_mut(name, fence);
        if matches!(holder.lease, Lease::Ttl { expires_at_ms, .. } if now >= expires_at_ms) {
            return Outcome::Rejected(Reject::Expired { name: name.to_owned() });
        }
        holder.value = value.to_vec();
        Outcome::ValueSet(grant_of(name, holder))
    }

    fn cancel(&mut self, name: &str, token: Token, fx: &mut Effects) -> Outcome {
        let Some(i) = self.find(name) else {
            return self.not_holder(name);
        };
        if self.locks[i].held_by(token).is_some() {
            return self.release(name, token, fx);
        }
        let Some(w) = self.locks[i].waiters.iter().position(|w| w.token == token) else {
            return self.not_holder(name);
        };
        self.locks[i].waiters.remove(w);
        fx.dropped.push((name.to_owned(), token));
        Outcome::Withdrawn
    }

    /// Ends session `id` (by its lease running out if `expired`); `ending` lists every session that ends
    /// in this entry, none of which may be handed a lock by it. False if `id` was not open.
    fn close(&mut self, id: SessionId, ending: &[SessionId], expired: bool, fx: &mut Effects) -> bool {
        if !self.is_open(id) {
            return false;
        }
        let names: Vec<String> = self.locks.iter().map(|l| l.name.clone()).collect();
        for name in names {
            let i = self.find(&name).expect("only hand-overs change locks here");
            if let Some(h) = self.locks[i].holders.iter().find(|h| h.lease == Lease::Session(id)) {
                let fence = h.fence;
                self.end_hold(&name, fence, ending, expired, fx);
            } else if let Some(w) = self.locks[i].waiters.iter().position(|w| w.session == Some(id)) {
                let waiter = self.locks[i].waiters.remove(w);
                fx.dropped.push((name, waiter.token));
            }
        }
        self.sessions.retain(|(s, _)| *s != id);
        true
    }

    fn expire(&mut self, e: &Expire, fx: &mut Effects) -> Outcome {
        let now = self.now_ms;
        let ending: Vec<SessionId> = e.sessions.iter().copied().filter(|id| self.is_open(*id)).collect();
        let (mut locks, mut waiters, mut sessions) = (0, 0, 0);
        for (name, fence) in &e.locks {
            let counted = match self.lock(name).and_then(|l| l.place(*fence)).map(|h| h.lease) {
                Some(Lease::Ttl { expires_at_ms, .. }) if expires_at_ms <= now => {
                    self.end_hold(name, *fence, &ending, true, fx);
                    true
                }
                Some(Lease::Delayed { free_at_ms }) if free_at_ms <= now => {
                    let freed = self.free_place(name, *fence, &ending, fx);
                    self.held_back += usize::from(!freed);
                    freed
                }
                _ => false,
            };
            locks += usize::from(counted);
        }
        for (name, token) in &e.waiters {
            let Some(i) = self.find(name) else { continue };
            let due = self.locks[i].waiters.iter().position(|w| w.token == *token && w.wait_until_ms.is_some());
            if let Some(w) = due {
                self.locks[i].waiters.remove(w);
                fx.dropped.push((name.clone(), *token));
                waiters += 1;
            }
        }
        for id in &e.sessions {
            if self.close(*id, &ending, true, fx) {
                sessions += 1;
            }
        }
        Outcome::Expired { locks, waiters, sessions }
    }

    /// Ends the hold on the place of `name` under `fence`: if it `expired` with a lock-delay, the place
    /// waits out the delay; else it goes on to the next waiter, or is kept until the next `Expire` if this
    /// entry granted the lock already.
    fn end_hold(&mut self, name: &str, fence: u64, ending: &[SessionId], expired: bool, fx: &mut Effects) {
        let now = self.now_ms;
        let session = match self.place_mut(name, fence).lease {
            Lease::Session(id) => Some(id),
            _ => None,
        };
        fx.ended.push(Ended { name: name.to_owned(), fence, session });
        let delay = self.place_mut(name, fence).lock_delay_ms;
        let free_at_ms = if expired && delay > 0 {
            fx.delayed.push((name.to_owned(), fence, delay));
            now + delay
        } else if self.free_place(name, fence, ending, fx) {
            return;
        } else {
            fx.delayed.push((name.to_owned(), fence, 0));
            now
        };
        let holder = self.place_mut(name, fence);
        holder.lease = Lease::Delayed { free_at_ms };
        holder.value.clear();
    }

    /// Frees the place of `name` under `fence` and grants it to the first waiter still waiting whose
    /// session is not among `ending` (removing the lock with its last place). False, changing nothing, if
    /// this entry granted the lock already and anyone waits: one entry grants a lock once.
    fn free_place(&mut self, name: &str, fence: u64, ending: &[SessionId], fx: &mut Effects) -> bool {
        let (now, index) = (self.now_ms, self.index);
        let i = self.find(name).expect("freeing a place of an existing lock");
        let lock = &mut self.locks[i];
        if !lock.waiters.is_empty() && lock.holders.iter().any(|h| h.fence == index) {
            return false;
        }
        lock.holders.retain(|h| h.fence != fence);
        while !lock.waiters.is_empty() {
            let w = lock.waiters.remove(0);
            let gone = w.wait_until_ms.is_some_and(|t| t <= now) || w.session.is_some_and(|id| ending.contains(&id));
            if gone {
                fx.dropped.push((name.to_owned(), w.token));
                continue;
            }
            let holder = MHolder {
                owner: w.owner,
                token: w.token,
                fence: index,
                granted_at_ms: now,
                lease: match w.session {
                    Some(id) => Lease::Session(id),
                    None => Lease::Ttl { ttl_ms: w.ttl_ms, expires_at_ms: now + w.ttl_ms },
                },
                value: w.value,
                lock_delay_ms: w.lock_delay_ms,
            };
            fx.grants.push(grant_of(name, &holder));
            lock.holders.push(holder);
            return true;
        }
        if lock.holders.is_empty() {
            self.locks.remove(i);
        }
        true
    }

    // --- queries, as the model sees them ---

    fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Vec<LockView> {
        self.locks
            .iter()
            .filter(|l| l.name.starts_with(prefix) && after.is_none_or(|a| l.name.as_str() > a))
            .take(limit)
            .map(lock_view)
            .collect()
    }

    fn grant(&self, name: &str, token: Token) -> Option<Grant> {
        self.lock(name).and_then(|l| l.held_by(token)).map(|h| grant_of(name, h))
    }

    /// Every place, in name order, then fence order.
    fn places(&self) -> impl Iterator<Item = (&str, &MHolder)> + '_ {
        self.locks.iter().flat_map(|l| l.holders.iter().map(|h| (l.name.as_str(), h)))
    }

    fn ttl_holds(&self) -> Vec<(String, u64, u64, u64)> {
        let mut holds = Vec::new();
        for (name, h) in self.places() {
            if let Lease::Ttl { ttl_ms, expires_at_ms } = h.lease {
                holds.push((name.to_owned(), h.fence, ttl_ms, expires_at_ms));
            }
        }
        holds
    }

    fn lock_delays(&self) -> Vec<(String, u64, u64, u64)> {
        let mut delays = Vec::new();
        for (name, h) in self.places() {
            if let Lease::Delayed { free_at_ms } = h.lease {
                delays.push((name.to_owned(), h.fence, h.lock_delay_ms, free_at_ms));
            }
        }
        delays
    }

    fn timed_waiters(&self) -> Vec<(String, Token, u64)> {
        let mut waiters = Vec::new();
        for l in &self.locks {
            for w in &l.waiters {
                if let Some(t) = w.wait_until_ms {
                    waiters.push((l.name.clone(), w.token, t));
                }
            }
        }
        waiters
    }

    fn sessions(&self) -> Vec<(SessionId, u64)> {
        let mut sessions = self.sessions.clone();
        sessions.sort();
        sessions
    }

    /// What session `id` holds and waits for, in name order, as `LockState::session` shows them.
    fn session_claims(&self, id: SessionId) -> Option<(Vec<Grant>, Vec<SessionWait>)> {
        if !self.is_open(id) {
            return None;
        }
        let (mut holds, mut waits) = (Vec::new(), Vec::new());
        for l in &self.locks {
            if let Some(h) = l.holders.iter().find(|h| h.lease == Lease::Session(id)) {
                holds.push(grant_of(&l.name, h));
            }
            if let Some(i) = l.waiters.iter().position(|w| w.session == Some(id)) {
                let (name, token, holder) = (l.name.clone(), l.waiters[i].token, view_of(l.first()));
                waits.push(SessionWait { name, token, position: i + 1, holder });
            }
        }
        Some((holds, waits))
    }
}

// --- operations ---

/// Whose token a release, renew or cancel carries.
#[derive(Debug, Clone)]
enum Who {
    /// The n-th holder (modulo how many places there are).
    Holder(usize),
    /// The n-th waiter, if there is one (else token 0, which nobody has).
    Waiter(usize),
    Any(u8),
}

/// Which lock a release, renew or cancel names: mostly one that is held, so that they do something.
#[derive(Debug, Clone)]
enum Target {
    /// The n-th held lock (modulo how many there are), or `NAMES[n]` if none is.
    Held(usize),
    Any(usize),
}

/// Which session a session's acquire names: mostly one that is open.
#[derive(Debug, Clone)]
enum Owner {
    /// The n-th open session (modulo how many there are), or session n if none is open.
    Open(SessionId),
    Any(SessionId),
}

#[derive(Debug, Clone)]
enum Op {
    /// `limit`: `None` for the name's own (`NAME_LIMITS`), else an index into `LIMITS`.
    Acquire {
        name: usize,
        token: u8,
        ttl: usize,
        wait: usize,
        value: usize,
        delay: usize,
        limit: Option<usize>,
    },
    SessionAcquire {
        name: usize,
        token: u8,
        session: Owner,
        wait: usize,
        delay: usize,
        limit: Option<usize>,
    },
    Release {
        target: Target,
        who: Who,
    },
    Renew {
        target: Target,
        who: Who,
        ttl: usize,
    },
    Cancel {
        target: Target,
        who: Who,
    },
    SetValue {
        target: Target,
        who: Who,
        value: usize,
    },
    OpenSession {
        id: SessionId,
        lease: usize,
    },
    CloseSession {
        id: SessionId,
    },
    /// Some of what the model finds due (chosen by the bits of `pick`), some stale items (a lock, maybe a
    /// fence, and which place's fence to take if not), some sessions, in an order turned by `turn`.
    Expire {
        pick: u64,
        stale_locks: Vec<(usize, Option<u64>, usize)>,
        stale_waiters: Vec<(usize, Option<u8>)>,
        sessions: Vec<SessionId>,
        turn: usize,
    },
    /// Move the leader's stamp; negative goes back (a proposal stamped before one appended earlier).
    Clock(i64),
    /// Move the leader's stamp to just before, at or just after a deadline the model knows (the n-th,
    /// modulo how many there are): the boundaries are where `<` and `<=` differ.
    ClockToDeadline(usize, i64),
    /// Restart from a snapshot.
    SnapshotRestore,
    /// One-lock operations proposed together as one `Command::Batch` entry (the ones naming a lock already
    /// in the batch are left out, as the leader's proposer leaves them for the next batch).
    Batch(Vec<Op>),
    /// One-lock operations proposed together as one `Command::Group` entry. With `true`, the ones breaking
    /// its rule (a lock's command that is not an acquire, after another command on that lock; a second
    /// acquire of a limit above 1 of one lock) are left out, as the proposer leaves them for the next
    /// entry; with `false` they stay, and the whole entry must be refused.
    Group(Vec<Op>, bool),
}

/// Whose token: weights for a holder, a waiter, any token.
fn who(weights: [u32; 3]) -> impl Strategy<Value = Who> {
    prop_oneof![
        weights[0] => (0..3usize).prop_map(Who::Holder),
        weights[1] => (0..3usize).prop_map(Who::Waiter),
        weights[2] => (0..=TOKENS).prop_map(Who::Any),
    ]
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        4 => (0..NAMES.len()).prop_map(Target::Held),
        1 => (0..NAMES.len()).prop_map(Target::Any),
    ]
}

fn owner() -> impl Strategy<Value = Owner> {
    prop_oneof![
        4 => (1..=SESSIONS).prop_map(Owner::Open),
        1 => (1..=SESSIONS + 1).prop_map(Owner::Any),
    ]
}

/// Mostly the name's own limit; else one of `LIMITS` (one past the end: an acquire without a limit).
fn limit() -> impl Strategy<Value = Option<usize>> {
    prop::option::weighted(0.15, 0..=LIMITS.len())
}

/// The name an acquire asks for: the semaphores more often, so that they fill up and queue.
fn acquired() -> impl Strategy<Value = usize> {
    prop_oneof![2 => 0..NAMES.len(), 1 => Just(1), 1 => Just(3)]
}

fn acquire() -> impl Strategy<Value = Op> {
    let acquire = (acquired(), 1..=TOKENS, 0..TTLS.len(), 0..WAITS.len(), 0..VALUES.len() + 1, 0..DELAYS.len());
    (acquire, limit()).prop_map(|((name, token, ttl, wait, value, delay), limit)| Op::Acquire {
        name,
        token,
        ttl,
        wait,
        value,
        delay,
        limit,
    })
}

fn session_acquire() -> impl Strategy<Value = Op> {
    (acquired(), 1..=TOKENS, owner(), 0..WAITS.len(), 0..DELAYS.len(), limit()).prop_map(
        |(name, token, session, wait, delay, limit)| Op::SessionAcquire { name, token, session, wait, delay, limit },
    )
}

/// An operation on one lock: what a batch may carry.
fn lock_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => acquire(),
        4 => session_acquire(),
        3 => (target(), who([4, 1, 1])).prop_map(|(target, who)| Op::Release { target, who }),
        2 => (target(), who([4, 1, 1]), 0..=TTLS.len())
            .prop_map(|(target, who, ttl)| Op::Renew { target, who, ttl }),
        2 => (target(), who([1, 3, 1])).prop_map(|(target, who)| Op::Cancel { target, who }),
        2 => (target(), who([4, 1, 1]), 0..VALUES.len()).prop_map(|(target, who, value)| Op::SetValue { target, who, value }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let name = 0..NAMES.len();
    prop_oneof![
        15 => lock_op(),
        3 => prop::collection::vec(lock_op(), 2..=4).prop_map(Op::Batch),
        4 => (prop::collection::vec(lock_op(), 1..=6), prop::bool::weighted(0.75))
            .prop_map(|(ops, follow_rule)| Op::Group(ops, follow_rule)),
        3 => (1..=SESSIONS, 0..TTLS.len()).prop_map(|(id, lease)| Op::OpenSession { id, lease }),
        1 => (1..=SESSIONS + 1).prop_map(|id| Op::CloseSession { id }),
        4 => (
            // Often all that is due: places of one lock expiring together.
            prop_oneof![2 => any::<u64>(), 1 => Just(u64::MAX)],
            prop::collection::vec((name.clone(), prop::option::of(0..200u64), 0..3usize), 0..3),
            prop::collection::vec((name, prop::option::of(0..=TOKENS)), 0..3),
            prop_oneof![
                2 => Just(vec![]),
                // Often two sessions or more: places of one lock held by several sessions ending together.
                2 => prop::collection::vec(1..=SESSIONS + 1, 1..4),
            ],
            any::<usize>(),
        )
            .prop_map(|(pick, stale_locks, stale_waiters, sessions, turn)| Op::Expire {
                pick,
                stale_locks,
                stale_waiters,
                sessions,
                turn,
            }),
        3 => (-300i64..800).prop_map(Op::Clock),
        // Far enough that every freed lock's revision is forgotten (and every hold and wait runs out).
        1 => Just(Op::Clock(FREED_KEEP_MS as i64)),
        3 => (any::<usize>(), -1i64..=1).prop_map(|(n, by)| Op::ClockToDeadline(n, by)),
        1 => Just(Op::SnapshotRestore),
    ]
}

/// An operation of a crowd: an acquire that is valid but maybe for its limit (the other operations cover
/// invalid TTLs, values and lock-delays), mostly without a lock-delay, of a name the crowd sets; or a
/// session opening, to crowd with.
fn crowd_op() -> impl Strategy<Value = Op> {
    let value = prop_oneof![0..VALUES.len() - 1, Just(VALUES.len())];
    let delay = || prop_oneof![3 => Just(0), 1 => 2..DELAYS.len() - 1];
    let acquire = (1..=TOKENS, 1..TTLS.len(), 0..WAITS.len(), value, delay(), limit());
    prop_oneof![
        3 => acquire.prop_map(|(token, ttl, wait, value, delay, limit)| {
            Op::Acquire { name: 0, token, ttl, wait, value, delay, limit }
        }),
        2 => (1..=TOKENS, owner(), 0..WAITS.len(), delay(), limit()).prop_map(
            |(token, session, wait, delay, limit)| Op::SessionAcquire { name: 0, token, session, wait, delay, limit }
        ),
        1 => (1..=SESSIONS, 1..TTLS.len()).prop_map(|(id, lease)| Op::OpenSession { id, lease }),
    ]
}

/// Acquires of one name, one entry each, at one time: clients crowding a lock, enough to fill a semaphore
/// and queue behind it (and holds that end together, when their TTLs are the same).
fn crowd() -> impl Strategy<Value = Vec<Op>> {
    (acquired(), prop::collection::vec(crowd_op(), 4..=10)).prop_map(|(n, mut ops)| {
        for op in &mut ops {
            if let Op::Acquire { name, .. } | Op::SessionAcquire { name, .. } = op {
                *name = n;
            }
        }
        ops
    })
}

/// Time passing, then the leader expiring all that is due, and maybe sessions, in one entry: places of
/// one lock ending together.
fn tick() -> impl Strategy<Value = Vec<Op>> {
    let clock = prop_oneof![
        (0i64..800).prop_map(Op::Clock),
        (any::<usize>(), 0i64..=1).prop_map(|(n, by)| Op::ClockToDeadline(n, by)),
    ];
    let sessions = prop_oneof![Just(vec![]), prop::sample::subsequence((1..=SESSIONS).collect::<Vec<_>>(), 2..=3)];
    (clock, sessions, any::<usize>()).prop_map(|(clock, sessions, turn)| {
        let (stale_locks, stale_waiters) = (vec![], vec![]);
        vec![clock, Op::Expire { pick: u64::MAX, stale_locks, stale_waiters, sessions, turn }]
    })
}

/// Operations, each with the gap to the next log index (Raft entries the lock state never sees).
fn history() -> impl Strategy<Value = Vec<(u64, Op)>> {
    let gap = || prop_oneof![4 => Just(1u64), 1 => 2..5u64];
    let ops = prop_oneof![6 => op().prop_map(|op| vec![op]), 2 => crowd(), 2 => tick()];
    prop::collection::vec((gap(), ops), 1..=50).prop_map(|segments| {
        segments.into_iter().flat_map(|(gap, ops)| ops.into_iter().map(move |op| (gap, op))).collect()
    })
}

fn pick<T>(all: Vec<T>, bits: u64) -> Vec<T> {
    all.into_iter().enumerate().filter(|(i, _)| bits >> (i % 64) & 1 == 1).map(|(_, x)| x).collect()
}

fn turned<T>(mut items: Vec<T>, turn: usize) -> Vec<T> {
    if !items.is_empty() {
        let by = turn % items.len();
        items.rotate_left(by);
    }
    items
}

/// Whether `cmd` may follow `before` in a `Command::Group`: it is an acquire, or the first command on its
/// lock; and it is not a second acquire with a limit above 1 of its lock.
fn follows_group_rule(before: &[Command], cmd: &Command) -> bool {
    let mut same = before.iter().filter(|c| c.lock_name() == cmd.lock_name());
    let first = same.clone().next().is_none();
    (cmd.is_acquire() || first) && (cmd.limit() <= 1 || same.all(|c| c.limit() <= 1))
}

/// The acquire command of `acquire` on `NAMES[n]` giving `limit` (see `Op::Acquire`), `value` (`None`:
/// none, a plain `Acquire`) and `lock_delay_ms`.
fn acquire_command(
    n: usize,
    acquire: Acquire,
    value: Option<&[u8]>,
    lock_delay_ms: u64,
    limit: Option<usize>,
) -> Command {
    let semaphore = match limit {
        None => Some(NAME_LIMITS[n]).filter(|limit| *limit > 1),
        Some(i) => LIMITS.get(i).copied(),
    };
    match (semaphore, value, lock_delay_ms) {
        (Some(limit), value, lock_delay_ms) => {
            let value = value.map_or(vec![], <[u8]>::to_vec);
            Command::AcquireSemaphore { acquire, value, lock_delay_ms, limit }
        }
        (None, value, lock_delay_ms @ 1..) => {
            let value = value.map_or(vec![], <[u8]>::to_vec);
            Command::AcquireDelayed { acquire, value, lock_delay_ms }
        }
        (None, Some(value), 0) => Command::AcquireValued { acquire, value: value.to_vec() },
        (None, None, 0) => Command::Acquire(acquire),
    }
}

/// The `Expire` an `Op::Expire` stands for: what the leader would find due at this entry's time (some
/// of it), some stale items, some sessions.
fn expire_command(model: &Model, clock: u64, op: &Op) -> Command {
    let Op::Expire { pick: bits, stale_locks, stale_waiters, sessions, turn } = op else { unreachable!("an expire") };
    let at = model.now_ms.max(clock);
    let mut due_locks: Vec<(String, u64)> =
        model.ttl_holds().into_iter().filter(|(_, _, _, end)| *end <= at).map(|(n, f, _, _)| (n, f)).collect();
    let delays = model.lock_delays().into_iter();
    due_locks.extend(delays.filter(|(_, _, _, free_at)| *free_at <= at).map(|(n, f, _, _)| (n, f)));
    let due_waiters: Vec<(String, Token)> =
        model.timed_waiters().into_iter().filter(|(_, _, end)| *end <= at).map(|(n, t, _)| (n, t)).collect();
    let mut locks = pick(due_locks, *bits);
    // Stale items: an old or future fence, or the fence of a place (the k-th) not yet due.
    locks.extend(stale_locks.iter().map(|(n, fence, k)| {
        let current = model.lock(NAMES[*n]).map_or(0, |l| l.holders[k % l.holders.len()].fence);
        (NAMES[*n].to_owned(), fence.unwrap_or(current))
    }));
    let mut waiters = pick(due_waiters, bits.rotate_left(32));
    // Stale items: any token, or the first waiter's, due or not, with or without a session.
    waiters.extend(stale_waiters.iter().map(|(n, t)| {
        let first = model.lock(NAMES[*n]).and_then(|l| l.waiters.first());
        let t = t.map_or(first.map_or(token(0), |w| w.token), token);
        (NAMES[*n].to_owned(), t)
    }));
    Command::Expire(Expire {
        locks: turned(locks, *turn),
        waiters: turned(waiters, *turn / 7),
        sessions: sessions.clone(),
    })
}

/// The entry an operation stands for, built from what the model holds now.
fn command(model: &Model, clock: u64, op: &Op) -> Command {
    let target = |t: &Target| match t {
        Target::Held(n) if !model.locks.is_empty() => model.locks[n % model.locks.len()].name.clone(),
        Target::Held(n) | Target::Any(n) => NAMES[*n].to_owned(),
    };
    let token_of = |name: &str, who: &Who| match (model.lock(name), who) {
        (Some(l), Who::Holder(n)) => l.holders[n % l.holders.len()].token,
        (Some(l), Who::Waiter(n)) => l.waiters.get(*n).map_or(token(0), |w| w.token),
        (None, Who::Holder(_) | Who::Waiter(_)) => token(1),
        (_, Who::Any(t)) => token(*t),
    };
    match op {
        Op::Acquire { name: n, token: t, ttl, wait, value, delay, limit } => {
            let acquire = Acquire {
                name: NAMES[*n].to_owned(),
                owner: format!("worker-{t}"),
                token: token(*t),
                ttl_ms: TTLS[*ttl],
                wait_ms: WAITS[*wait],
                session: None,
            };
            acquire_command(*n, acquire, VALUES.get(*value).copied(), DELAYS[*delay], *limit)
        }
        Op::SessionAcquire { name: n, token: t, session, wait, delay, limit } => {
            let id = match session {
                Owner::Open(n) if !model.sessions.is_empty() => model.sessions[*n as usize % model.sessions.len()].0,
                Owner::Open(id) | Owner::Any(id) => *id,
            };
            let acquire = Acquire {
                name: NAMES[*n].to_owned(),
                owner: format!("svc-{id}"),
                token: token(*t),
                ttl_ms: 0,
                wait_ms: WAITS[*wait],
                session: Some(id),
            };
            acquire_command(*n, acquire, None, DELAYS[*delay], *limit)
        }
        Op::Release { target: n, who } => {
            let name = target(n);
            let token = token_of(&name, who);
            Command::Release { name, token }
        }
        Op::Renew { target: n, who, ttl } => {
            let name = target(n);
            let token = token_of(&name, who);
            // One past the TTLs: a renew that names none, keeping the hold's.
            match TTLS.get(*ttl) {
                Some(&ttl_ms) => Command::Renew { name, token, ttl_ms },
                None => Command::RenewKeepingTtl { name, token },
            }
        }
        Op::Cancel { target: n, who } => {
            let name = target(n);
            let token = token_of(&name, who);
            Command::Cancel { name, token }
        }
        Op::SetValue { target: n, who, value } => {
            let name = target(n);
            let token = token_of(&name, who);
            Command::SetValue { name, token, value: VALUES[*value].to_vec() }
        }
        Op::OpenSession { id, lease } => {
            let secret = SessionSecret(Token(u128::from(*id))).digest();
            let (id, owner, lease_ms, sessions_max) = (*id, format!("svc-{id}"), TTLS[*lease], limits::SESSIONS_MAX);
            Command::OpenSessionCapped { id, owner, lease_ms, secret, sessions_max }
        }
        Op::CloseSession { id } => Command::CloseSession { id: *id },
        Op::Expire { .. } => expire_command(model, clock, op),
        Op::Batch(ops) | Op::Group(ops, _) => several(model, clock, op, ops),
        Op::Clock(_) | Op::ClockToDeadline(..) | Op::SnapshotRestore => {
            unreachable!("not an entry")
        }
    }
}

/// The `Command::Batch` or `Command::Group` of `ops`, as the leader's proposer would put them together.
fn several(model: &Model, clock: u64, op: &Op, ops: &[Op]) -> Command {
    let mut cmds: Vec<Command> = Vec::new();
    for cmd in ops.iter().map(|op| command(model, clock, op)) {
        let keep = match op {
            Op::Group(_, follow_rule) => !follow_rule || follows_group_rule(&cmds, &cmd),
            _ => cmds.iter().all(|c| c.lock_name() != cmd.lock_name()),
        };
        if keep {
            cmds.push(cmd);
        }
    }
    match op {
        Op::Group(..) => Command::Group(cmds),
        _ if cmds.len() == 1 => cmds.pop().expect("one command"),
        _ => Command::Batch(cmds),
    }
}

/// Compares everything the state shows with the model.
fn compare(real: &LockState, model: &Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(real.applied_index(), model.index);
    prop_assert_eq!(real.now_ms(), model.now_ms);
    compare_locks(real, model)?;
    prop_assert_eq!(real.forgotten_through(), model.forgotten_through);
    for prefix in ["", "a", "b"] {
        for after in [0, 3, model.index / 2, model.index] {
            let expected = model.changed_since(prefix, after);
            prop_assert_eq!(real.changed_since(prefix, after, usize::MAX), Some(expected.clone()));
            if !expected.is_empty() {
                prop_assert_eq!(real.changed_since(prefix, after, expected.len() - 1), None);
            }
        }
    }
    for prefix in ["", "a", "a.", "b", "z"] {
        for after in [None, Some(""), Some("a"), Some("a.1"), Some("b"), Some("zz")] {
            for limit in [0, 1, 2, usize::MAX] {
                prop_assert_eq!(
                    real.list(prefix, after, limit),
                    model.list(prefix, after, limit),
                    "list({:?}, {:?}, {})",
                    prefix,
                    after,
                    limit
                );
            }
        }
    }
    let ttl_holds: Vec<_> = real.ttl_holds().map(|(n, f, t, e)| (n.to_owned(), f, t, e)).collect();
    prop_assert_eq!(ttl_holds, model.ttl_holds());
    let delays: Vec<_> = real.lock_delays().map(|(n, f, d, t)| (n.to_owned(), f, d, t)).collect();
    prop_assert_eq!(delays, model.lock_delays());
    let timed: Vec<_> = real.timed_waiters().map(|(n, t, w)| (n.to_owned(), t, w)).collect();
    prop_assert_eq!(timed, model.timed_waiters());
    prop_assert_eq!(real.sessions().collect::<Vec<_>>(), model.sessions());
    for id in 1..=SESSIONS + 1 {
        let claims = model.session_claims(id);
        prop_assert_eq!(real.session(id).map(|view| (view.holds, view.waits)), claims.clone(), "session {}", id);
        let counts = real.session_summary(id).map(|(_, _, holds, waits)| (holds, waits));
        prop_assert_eq!(counts, claims.map(|(holds, waits)| (holds.len(), waits.len())), "summary of session {}", id);
    }
    prop_assert_eq!(real.lock_count(), model.locks.len());
    prop_assert_eq!(real.waiter_count(), model.locks.iter().map(|l| l.waiters.len()).sum::<usize>());
    prop_assert_eq!(real.session_count(), model.sessions.len());
    real.check_invariants();
    Ok(())
}

/// Compares each lock, its places, grants and waiters with the model's.
fn compare_locks(real: &LockState, model: &Model) -> Result<(), TestCaseError> {
    for name in NAMES {
        let lock = model.lock(name);
        prop_assert_eq!(real.get(name), lock.map(lock_view));
        prop_assert_eq!(real.revision(name), model.revision(name), "revision of {:?}", name);
        prop_assert_eq!(real.is_held(name), lock.is_some());
        prop_assert_eq!(real.holder(name), lock.map(|l| view_of(l.first())));
        prop_assert_eq!(real.is_full(name), lock.is_some_and(MLock::is_full), "is_full({:?})", name);
        // Every place by its fence, and the fences next to them (some another place's, most nobody's).
        let fences =
            lock.map_or(vec![], |l| l.holders.iter().flat_map(|h| [h.fence - 1, h.fence, h.fence + 1]).collect());
        for fence in fences.into_iter().chain([0, model.index]) {
            let expected = lock.and_then(|l| l.place(fence)).map(view_of);
            prop_assert_eq!(real.hold(name, fence), expected, "hold({:?}, {})", name, fence);
        }
        for t in 0..=TOKENS {
            prop_assert_eq!(real.grant(name, token(t)), model.grant(name, token(t)));
            let waiting = lock.is_some_and(|l| l.waiters.iter().any(|w| w.token == token(t)));
            prop_assert_eq!(real.is_waiting(name, token(t)), waiting);
        }
    }
    Ok(())
}

/// How often the histories reached what semaphores add (for `the_histories_reach_semaphores`).
#[derive(Debug, Default)]
struct Seen {
    /// Entries after which a lock had two places or more.
    shared: usize,
    /// Entries after which a semaphore had every place taken and waiters.
    queued_on_full: usize,
    /// `Expire` entries that ended two places or more of one lock.
    places_expired_together: usize,
    /// `Expire` entries ending two sessions or more that held places of one lock.
    sessions_expired_together: usize,
    /// Entries that kept a freed place for the next `Expire`, as they had granted its lock already.
    kept: usize,
    /// `Expire` items that found a kept place (or one whose delay had passed) and left it for later.
    held_back: usize,
    /// Groups refused for two acquires of a limit above 1 of one lock.
    two_semaphore_groups: usize,
    limit_mismatches: usize,
    invalid_limits: usize,
}

impl Seen {
    /// Counts what the entry at `cmd` did, with the model's state before (`before`) and after it.
    fn count(&mut self, cmd: &Command, before: &Model, applied: &Applied, after: &Model) {
        self.shared += usize::from(after.locks.iter().any(|l| l.holders.len() >= 2));
        self.queued_on_full += usize::from(after.locks.iter().any(|l| l.limit > 1 && !l.waiters.is_empty()));
        self.kept += usize::from(applied.delayed.iter().any(|(_, _, delay)| *delay == 0));
        let twice = |names: Vec<&str>| names.iter().enumerate().any(|(i, n)| names[..i].contains(n));
        if let Command::Expire(e) = cmd {
            let ended = applied.ended.iter().map(|ended| ended.name.as_str()).collect();
            self.places_expired_together += usize::from(twice(ended));
            let ending = |h: &MHolder| matches!(h.lease, Lease::Session(id) if e.sessions.contains(&id));
            let held = before.places().filter(|(_, h)| ending(h)).map(|(name, _)| name).collect();
            self.sessions_expired_together += usize::from(twice(held));
        }
        if let Command::Group(cmds) = cmd {
            let semaphores = cmds.iter().filter(|c| c.limit() > 1).filter_map(Command::lock_name).collect();
            self.two_semaphore_groups += usize::from(twice(semaphores));
        }
        let outcomes = match &applied.outcome {
            Outcome::Batch(outcomes) => outcomes.iter().collect(),
            outcome => vec![outcome],
        };
        for outcome in outcomes {
            match outcome {
                Outcome::Rejected(Reject::LimitMismatch { .. }) => self.limit_mismatches += 1,
                Outcome::Rejected(Reject::InvalidLimit(_)) => self.invalid_limits += 1,
                _ => {}
            }
        }
    }
}

/// Checks the fences of an entry's grants: each carries the entry's index, which is larger than every
/// fence before; a lock is granted at most once per entry. What ended was held under a fence granted
/// before. `fence_max` is the largest fence granted so far, `fences` the last fence of each lock.
fn check_fences(
    index: u64,
    applied: &Applied,
    fence_max: &mut u64,
    fences: &mut Vec<(String, u64)>,
) -> Result<(), TestCaseError> {
    for (i, grant) in applied.grants.iter().enumerate() {
        prop_assert_eq!(grant.fence, index);
        prop_assert!(grant.fence > *fence_max || (i > 0 && grant.fence == *fence_max));
        prop_assert!(
            applied.grants[..i].iter().all(|g| g.name != grant.name),
            "lock {:?} granted twice by entry {}",
            grant.name,
            index
        );
        match fences.iter_mut().find(|(n, _)| *n == grant.name) {
            Some((_, last)) => {
                prop_assert!(grant.fence > *last);
                *last = grant.fence;
            }
            None => fences.push((grant.name.clone(), grant.fence)),
        }
        *fence_max = grant.fence;
    }
    for ended in &applied.ended {
        prop_assert!(ended.fence < index);
    }
    Ok(())
}

/// What a node keeps of each session's summary (owner, lease, holds, waits) from the sessions each command
/// says it changed ([`LockState::sessions_changed`]), as the lease keeper does; rebuilt whole from a
/// restored state.
#[derive(Default)]
struct KeptSummaries(std::collections::BTreeMap<SessionId, (String, u64, usize, usize)>);

impl KeptSummaries {
    fn of(state: &LockState) -> Self {
        let mut kept = KeptSummaries::default();
        let ids: Vec<SessionId> = state.sessions().map(|(id, _)| id).collect();
        kept.refresh(state, &ids);
        kept
    }

    fn refresh(&mut self, state: &LockState, ids: &[SessionId]) {
        for &id in ids {
            match state.session_summary(id) {
                Some((owner, lease_ms, holds, waits)) => self.0.insert(id, (owner.to_owned(), lease_ms, holds, waits)),
                None => self.0.remove(&id),
            };
        }
    }

    /// Applies `entry` to a copy of `state`, refreshing after each of its commands.
    fn follow(&mut self, state: &LockState, index: u64, entry: &Entry) {
        let mut copy = state.clone();
        copy.apply_each(index, entry, |state, _, _| self.refresh(state, state.sessions_changed()));
    }

    fn agree(&self, state: &LockState) -> Result<(), TestCaseError> {
        for id in 1..=SESSIONS + 1 {
            let summary = state.session_summary(id).map(|(owner, lease_ms, h, w)| (owner.to_owned(), lease_ms, h, w));
            prop_assert_eq!(self.0.get(&id), summary.as_ref(), "the summary kept of session {}", id);
        }
        Ok(())
    }
}

fn run(history: Vec<(u64, Op)>, seen: &mut Seen) -> Result<(), TestCaseError> {
    let mut real = LockState::new();
    let mut kept = KeptSummaries::default();
    let mut model = Model::default();
    let (mut clock, mut index) = (T0, 0u64);
    let mut fence_max = 0u64;
    let mut fences: Vec<(String, u64)> = Vec::new();
    for (gap, op) in history {
        match op {
            Op::Clock(delta) => {
                clock = clock.saturating_add_signed(delta);
                continue;
            }
            Op::ClockToDeadline(n, by) => {
                let mut deadlines: Vec<u64> = model.ttl_holds().iter().map(|h| h.3).collect();
                deadlines.extend(model.timed_waiters().iter().map(|w| w.2));
                deadlines.extend(model.lock_delays().iter().map(|d| d.3));
                if !deadlines.is_empty() {
                    clock = deadlines[n % deadlines.len()].saturating_add_signed(by);
                }
                continue;
            }
            Op::SnapshotRestore => {
                let bytes = real.snapshot();
                let restored = LockState::restore(&bytes).expect("a snapshot restores");
                prop_assert_eq!(&restored, &real);
                prop_assert_eq!(restored.snapshot(), bytes);
                real = restored;
                kept = KeptSummaries::of(&real);
                compare(&real, &model)?;
                continue;
            }
            _ => {}
        }
        index += gap;
        let entry = Entry { at_ms: clock, cmd: command(&model, clock, &op) };
        let before = model.clone();
        let expected = model.apply(index, &entry);
        kept.follow(&real, index, &entry);
        let applied = real.apply(index, &entry);
        prop_assert_eq!(&applied, &expected, "entry {} {:?}", index, entry);
        kept.agree(&real)?;
        check_fences(index, &applied, &mut fence_max, &mut fences)?;
        compare(&real, &model)?;
        seen.count(&entry.cmd, &before, &applied, &model);
    }
    seen.held_back += model.held_back;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn lock_state_matches_the_model(history in history()) {
        run(history, &mut Seen::default())?;
    }
}

/// The histories are worth little if they never reach what semaphores add: count it over a fixed set.
#[test]
fn the_histories_reach_semaphores() {
    let mut runner = TestRunner::deterministic();
    let mut seen = Seen::default();
    for _ in 0..256 {
        let history = history().new_tree(&mut runner).expect("a history").current();
        run(history, &mut seen).expect("the state agrees with the model");
    }
    println!("{seen:#?}");
    assert!(seen.shared >= 3_000 && seen.queued_on_full >= 1_500, "{seen:?}");
    assert!(seen.places_expired_together >= 100 && seen.sessions_expired_together >= 8, "{seen:?}");
    assert!(seen.kept >= 10 && seen.held_back >= 2, "{seen:?}");
    assert!(seen.two_semaphore_groups >= 8, "{seen:?}");
    assert!(seen.limit_mismatches >= 300 && seen.invalid_limits >= 150, "{seen:?}");
}
