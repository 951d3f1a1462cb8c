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

use holdfast_core::limits::{FREED_KEEP_MS, LOCK_DELAY_MS_MAX, TTL_MS_MAX, TTL_MS_MIN, VALUE_LEN_MAX};
use holdfast_core::{
    Acquire, Applied, Command, Entry, Expire, Grant, HolderView, Lease, LockState, LockView, Outcome, Reject,
    SessionId, SessionSecret, Token, WaiterView,
};
use proptest::prelude::*;

const T0: u64 = 1_700_000_000_000;
/// "a" is a prefix of "a.1", so `list` by prefix has something to tell apart.
const NAMES: [&str; 4] = ["a", "a.1", "b", "c"];
/// 5 is below `TTL_MS_MIN`: some acquires, renews and opens are rejected.
const TTLS: [u64; 5] = [5, 10, 40, 150, 600];
const WAITS: [u64; 5] = [0, 20, 200, 2_000, 2_000];
const TOKENS: u8 = 5;
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
    /// Whether `token` holds the lock now (not an expired hold in its lock-delay).
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
    holder: MHolder,
    waiters: Vec<MWaiter>,
    revision: u64,
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
}

/// What an entry did besides its outcome.
#[derive(Default)]
struct Effects {
    grants: Vec<Grant>,
    ended: Vec<(String, u64)>,
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
        holder: view_of(&l.holder),
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

    fn is_open(&self, id: SessionId) -> bool {
        self.sessions.iter().any(|(s, _)| *s == id)
    }

    fn not_holder(&self, name: &str) -> Outcome {
        Outcome::Rejected(Reject::NotHolder {
            name: name.to_owned(),
            holder: self.lock(name).map(|l| view_of(&l.holder)),
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
            let same = old.is_some_and(|old| old.holder == lock.holder && old.waiters == lock.waiters);
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
            Command::Acquire(a) => self.acquire(a, &[], 0, fx),
            Command::AcquireValued { acquire, value } => self.acquire(acquire, value, 0, fx),
            Command::AcquireDelayed { acquire, value, lock_delay_ms } => {
                self.acquire(acquire, value, *lock_delay_ms, fx)
            }
            Command::SetValue { name, token, value } => self.set_value(name, *token, value),
            Command::Release { name, token } => match self.lock(name) {
                Some(l) if l.holder.token == *token && matches!(l.holder.lease, Lease::Session(_)) => {
                    Outcome::Rejected(Reject::SessionHold { name: name.clone() })
                }
                _ => self.release(name, *token, &[], fx),
            },
            Command::Renew { name, token, ttl_ms } => self.renew(name, *token, Some(*ttl_ms)),
            Command::RenewKeepingTtl { name, token } => self.renew(name, *token, None),
            Command::Cancel { name, token } => self.cancel(name, *token, fx),
            Command::OpenSession { id, lease_ms, .. } | Command::OpenSessionWithoutSecret { id, lease_ms, .. } => {
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

    fn acquire(&mut self, a: &Acquire, value: &[u8], lock_delay_ms: u64, fx: &mut Effects) -> Outcome {
        // The generator only makes valid names, owners and waits.
        if value.len() > VALUE_LEN_MAX {
            return Outcome::Rejected(Reject::ValueTooLong(value.len()));
        }
        if lock_delay_ms > LOCK_DELAY_MS_MAX {
            return Outcome::Rejected(Reject::InvalidLockDelay(lock_delay_ms));
        }
        if a.session.is_none() && !valid_ttl(a.ttl_ms) {
            return Outcome::Rejected(Reject::InvalidTtl(a.ttl_ms));
        }
        if let Some(id) = a.session {
            if !self.is_open(id) {
                return Outcome::Rejected(Reject::NoSession(id));
            }
            if let Some(lock) = self.lock(&a.name) {
                if lock.holder.lease == Lease::Session(id) {
                    return Outcome::Granted(grant_of(&a.name, &lock.holder));
                }
                if let Some(i) = lock.waiters.iter().position(|w| w.session == Some(id)) {
                    return Outcome::Queued { position: i + 1, holder: view_of(&lock.holder) };
                }
            }
        }
        let now = self.now_ms;
        match self.find(&a.name) {
            None => {
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
                let at = self.locks.partition_point(|l| l.name < a.name);
                let revision = self.index;
                self.locks.insert(at, MLock { name: a.name.clone(), holder, waiters: vec![], revision });
                fx.grants.push(grant.clone());
                Outcome::Granted(grant)
            }
            Some(i) => {
                let lock = &mut self.locks[i];
                if lock.holder.token == a.token || lock.waiters.iter().any(|w| w.token == a.token) {
                    return Outcome::Rejected(Reject::DuplicateToken);
                }
                if a.wait_ms == 0 {
                    return Outcome::Busy { holder: view_of(&lock.holder) };
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
                Outcome::Queued { position: lock.waiters.len(), holder: view_of(&lock.holder) }
            }
        }
    }

    fn release(&mut self, name: &str, token: Token, ending: &[SessionId], fx: &mut Effects) -> Outcome {
        match self.lock(name) {
            Some(l) if l.holder.holds(token) => {
                let fence = l.holder.fence;
                self.end_hold(name, ending, false, fx);
                Outcome::Released { name: name.to_owned(), fence }
            }
            _ => self.not_holder(name),
        }
    }

    fn renew(&mut self, name: &str, token: Token, ttl_ms: Option<u64>) -> Outcome {
        if let Some(ttl_ms) = ttl_ms.filter(|ttl| !valid_ttl(*ttl)) {
            return Outcome::Rejected(Reject::InvalidTtl(ttl_ms));
        }
        let now = self.now_ms;
        let Some(i) = self.find(name).filter(|i| self.locks[*i].holder.holds(token)) else {
            return self.not_holder(name);
        };
        let holder = &mut self.locks[i].holder;
        match holder.lease {
            Lease::Session(_) => Outcome::Rejected(Reject::SessionHold { name: name.to_owned() }),
            Lease::Delayed { .. } => unreachable!("nobody holds a lock in its delay"),
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
        let Some(i) = self.find(name).filter(|i| self.locks[*i].holder.holds(token)) else {
            return self.not_holder(name);
        };
        let holder = &mut self.locks[i].holder;
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
        if self.locks[i].holder.holds(token) {
            return self.release(name, token, &[], fx);
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
            if self.locks[i].holder.lease == Lease::Session(id) {
                self.end_hold(&name, ending, expired, fx);
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
            match self.lock(name).filter(|l| l.holder.fence == *fence).map(|l| l.holder.lease) {
                Some(Lease::Ttl { expires_at_ms, .. }) if expires_at_ms <= now => {
                    self.end_hold(name, &ending, true, fx)
                }
                Some(Lease::Delayed { free_at_ms }) if free_at_ms <= now => self.grant_next(name, &ending, fx),
                _ => continue,
            }
            locks += 1;
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

    /// Ends the hold on `name`: if it `expired` with a lock-delay, the lock waits out the delay; else it
    /// goes on to the next waiter.
    fn end_hold(&mut self, name: &str, ending: &[SessionId], expired: bool, fx: &mut Effects) {
        let now = self.now_ms;
        let i = self.find(name).expect("ending an existing hold");
        let holder = &mut self.locks[i].holder;
        fx.ended.push((name.to_owned(), holder.fence));
        if expired && holder.lock_delay_ms > 0 {
            holder.lease = Lease::Delayed { free_at_ms: now + holder.lock_delay_ms };
            holder.value.clear();
            fx.delayed.push((name.to_owned(), holder.fence, holder.lock_delay_ms));
            return;
        }
        self.grant_next(name, ending, fx);
    }

    /// Grants the first waiter still waiting whose session is not among `ending`, or frees the lock.
    fn grant_next(&mut self, name: &str, ending: &[SessionId], fx: &mut Effects) {
        let (now, index) = (self.now_ms, self.index);
        let i = self.find(name).expect("granting an existing lock");
        let lock = &mut self.locks[i];
        while !lock.waiters.is_empty() {
            let w = lock.waiters.remove(0);
            let gone = w.wait_until_ms.is_some_and(|t| t <= now) || w.session.is_some_and(|id| ending.contains(&id));
            if gone {
                fx.dropped.push((name.to_owned(), w.token));
                continue;
            }
            lock.holder = MHolder {
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
            fx.grants.push(grant_of(name, &lock.holder));
            return;
        }
        self.locks.remove(i);
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
        self.lock(name).filter(|l| l.holder.holds(token)).map(|l| grant_of(name, &l.holder))
    }

    fn ttl_holds(&self) -> Vec<(String, u64, u64, u64)> {
        let mut holds = Vec::new();
        for l in &self.locks {
            if let Lease::Ttl { ttl_ms, expires_at_ms } = l.holder.lease {
                holds.push((l.name.clone(), l.holder.fence, ttl_ms, expires_at_ms));
            }
        }
        holds
    }

    fn lock_delays(&self) -> Vec<(String, u64, u64, u64)> {
        let mut delays = Vec::new();
        for l in &self.locks {
            if let Lease::Delayed { free_at_ms } = l.holder.lease {
                delays.push((l.name.clone(), l.holder.fence, l.holder.lock_delay_ms, free_at_ms));
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
}

// --- operations ---

/// Whose token a release, renew or cancel carries.
#[derive(Debug, Clone)]
enum Who {
    Holder,
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
    Acquire {
        name: usize,
        token: u8,
        ttl: usize,
        wait: usize,
        value: usize,
        delay: usize,
    },
    SessionAcquire {
        name: usize,
        token: u8,
        session: Owner,
        wait: usize,
        delay: usize,
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
    /// Some of what the model finds due (chosen by the bits of `pick`), some stale items, some sessions,
    /// in an order turned by `turn`.
    Expire {
        pick: u64,
        stale_locks: Vec<(usize, Option<u64>)>,
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
    /// its rule (a lock's command that is not an acquire, after another command on that lock) are left
    /// out, as the proposer leaves them for the next entry; with `false` they stay, and the whole entry
    /// must be refused.
    Group(Vec<Op>, bool),
}

/// Whose token: weights for the holder, a waiter, any token.
fn who(weights: [u32; 3]) -> impl Strategy<Value = Who> {
    prop_oneof![
        weights[0] => Just(Who::Holder),
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

/// An operation on one lock: what a batch may carry.
fn lock_op() -> impl Strategy<Value = Op> {
    let name = 0..NAMES.len();
    prop_oneof![
        5 => (name.clone(), 1..=TOKENS, 0..TTLS.len(), 0..WAITS.len(), 0..VALUES.len() + 1, 0..DELAYS.len())
            .prop_map(|(name, token, ttl, wait, value, delay)| Op::Acquire { name, token, ttl, wait, value, delay }),
        3 => (name.clone(), 1..=TOKENS, owner(), 0..WAITS.len(), 0..DELAYS.len())
            .prop_map(|(name, token, session, wait, delay)| Op::SessionAcquire { name, token, session, wait, delay }),
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
        3 => (
            any::<u64>(),
            prop::collection::vec((name.clone(), prop::option::of(0..200u64)), 0..3),
            prop::collection::vec((name, prop::option::of(0..=TOKENS)), 0..3),
            prop_oneof![
                2 => Just(vec![]),
                1 => prop::collection::vec(1..=SESSIONS + 1, 1..3),
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

/// An operation and the gap to the next log index (Raft entries the lock state never sees).
fn history() -> impl Strategy<Value = Vec<(u64, Op)>> {
    prop::collection::vec((prop_oneof![4 => Just(1u64), 1 => 2..5u64], op()), 1..=60)
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

/// The entry an operation stands for, built from what the model holds now.
/// Whether `cmd` may follow `before` in a `Command::Group`: it is an acquire, or the first command on its
/// lock.
fn follows_group_rule(before: &[Command], cmd: &Command) -> bool {
    cmd.is_acquire() || before.iter().all(|c| c.lock_name() != cmd.lock_name())
}

fn command(model: &Model, clock: u64, op: &Op) -> Command {
    let name = |i: usize| NAMES[i].to_owned();
    let target = |t: &Target| match t {
        Target::Held(n) if !model.locks.is_empty() => model.locks[n % model.locks.len()].name.clone(),
        Target::Held(n) | Target::Any(n) => name(*n),
    };
    let token_of = |name: &str, who: &Who| match (model.lock(name), who) {
        (Some(l), Who::Holder) => l.holder.token,
        (Some(l), Who::Waiter(n)) => l.waiters.get(*n).map_or(token(0), |w| w.token),
        (None, Who::Holder | Who::Waiter(_)) => token(1),
        (_, Who::Any(t)) => token(*t),
    };
    match op {
        Op::Acquire { name: n, token: t, ttl, wait, value, delay } => {
            let acquire = Acquire {
                name: name(*n),
                owner: format!("worker-{t}"),
                token: token(*t),
                ttl_ms: TTLS[*ttl],
                wait_ms: WAITS[*wait],
                session: None,
            };
            match (VALUES.get(*value), DELAYS[*delay]) {
                (value, lock_delay_ms @ 1..) => {
                    let value = value.map_or(vec![], |v| v.to_vec());
                    Command::AcquireDelayed { acquire, value, lock_delay_ms }
                }
                (Some(value), 0) => Command::AcquireValued { acquire, value: value.to_vec() },
                (None, 0) => Command::Acquire(acquire),
            }
        }
        Op::SessionAcquire { name: n, token: t, session, wait, delay } => {
            let id = match session {
                Owner::Open(n) if !model.sessions.is_empty() => model.sessions[*n as usize % model.sessions.len()].0,
                Owner::Open(id) | Owner::Any(id) => *id,
            };
            let acquire = Acquire {
                name: name(*n),
                owner: format!("svc-{id}"),
                token: token(*t),
                ttl_ms: 0,
                wait_ms: WAITS[*wait],
                session: Some(id),
            };
            match DELAYS[*delay] {
                0 => Command::Acquire(acquire),
                lock_delay_ms => Command::AcquireDelayed { acquire, value: vec![], lock_delay_ms },
            }
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
            Command::OpenSession { id: *id, owner: format!("svc-{id}"), lease_ms: TTLS[*lease], secret }
        }
        Op::CloseSession { id } => Command::CloseSession { id: *id },
        Op::Expire { pick: bits, stale_locks, stale_waiters, sessions, turn } => {
            // What the leader would find due at this entry's time.
            let at = model.now_ms.max(clock);
            let mut due_locks: Vec<(String, u64)> =
                model.ttl_holds().into_iter().filter(|(_, _, _, end)| *end <= at).map(|(n, f, _, _)| (n, f)).collect();
            let delays = model.lock_delays().into_iter();
            due_locks.extend(delays.filter(|(_, _, _, free_at)| *free_at <= at).map(|(n, f, _, _)| (n, f)));
            let due_waiters: Vec<(String, Token)> =
                model.timed_waiters().into_iter().filter(|(_, _, end)| *end <= at).map(|(n, t, _)| (n, t)).collect();
            let mut locks = pick(due_locks, *bits);
            // Stale items: an old or future fence, or the current fence of a hold not yet due.
            locks.extend(stale_locks.iter().map(|(n, fence)| {
                let current = model.lock(NAMES[*n]).map_or(0, |l| l.holder.fence);
                (name(*n), fence.unwrap_or(current))
            }));
            let mut waiters = pick(due_waiters, bits.rotate_left(32));
            // Stale items: any token, or the first waiter's, due or not, with or without a session.
            waiters.extend(stale_waiters.iter().map(|(n, t)| {
                let first = model.lock(NAMES[*n]).and_then(|l| l.waiters.first());
                let t = t.map_or(first.map_or(token(0), |w| w.token), token);
                (name(*n), t)
            }));
            Command::Expire(Expire {
                locks: turned(locks, *turn),
                waiters: turned(waiters, *turn / 7),
                sessions: sessions.clone(),
            })
        }
        Op::Batch(ops) => {
            let mut cmds: Vec<Command> = Vec::new();
            for cmd in ops.iter().map(|op| command(model, clock, op)) {
                if cmds.iter().all(|c| c.lock_name() != cmd.lock_name()) {
                    cmds.push(cmd);
                }
            }
            match cmds.len() {
                1 => cmds.pop().expect("one command"),
                _ => Command::Batch(cmds),
            }
        }
        Op::Group(ops, follow_rule) => {
            let mut cmds: Vec<Command> = Vec::new();
            for cmd in ops.iter().map(|op| command(model, clock, op)) {
                if !follow_rule || follows_group_rule(&cmds, &cmd) {
                    cmds.push(cmd);
                }
            }
            Command::Group(cmds)
        }
        Op::Clock(_) | Op::ClockToDeadline(..) | Op::SnapshotRestore => {
            unreachable!("not an entry")
        }
    }
}

/// Compares everything the state shows with the model.
fn compare(real: &LockState, model: &Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(real.applied_index(), model.index);
    prop_assert_eq!(real.now_ms(), model.now_ms);
    for name in NAMES {
        prop_assert_eq!(real.get(name), model.lock(name).map(lock_view));
        prop_assert_eq!(real.revision(name), model.revision(name), "revision of {:?}", name);
    }
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
    for name in NAMES {
        for t in 0..=TOKENS {
            prop_assert_eq!(real.grant(name, token(t)), model.grant(name, token(t)));
            let waiting = model.lock(name).is_some_and(|l| l.waiters.iter().any(|w| w.token == token(t)));
            prop_assert_eq!(real.is_waiting(name, token(t)), waiting);
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
    prop_assert_eq!(real.lock_count(), model.locks.len());
    prop_assert_eq!(real.waiter_count(), model.locks.iter().map(|l| l.waiters.len()).sum::<usize>());
    prop_assert_eq!(real.session_count(), model.sessions.len());
    real.check_invariants();
    Ok(())
}

fn run(history: Vec<(u64, Op)>) -> Result<(), TestCaseError> {
    let mut real = LockState::new();
    let mut model = Model::default();
    let (mut clock, mut index) = (T0, 0u64);
    // The largest fence ever granted, and the last fence of each lock.
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
                compare(&real, &model)?;
                continue;
            }
            _ => {}
        }
        index += gap;
        let entry = Entry { at_ms: clock, cmd: command(&model, clock, &op) };
        let expected = model.apply(index, &entry);
        let applied = real.apply(index, &entry);
        prop_assert_eq!(&applied, &expected, "entry {} {:?}", index, entry);

        // Fences: every grant of this entry carries its index, which is larger than every fence before;
        // a lock is granted at most once per entry.
        for (i, grant) in applied.grants.iter().enumerate() {
            prop_assert_eq!(grant.fence, index);
            prop_assert!(grant.fence > fence_max || (i > 0 && grant.fence == fence_max));
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
            fence_max = grant.fence;
        }
        // What ended was held under a fence granted before this entry.
        for (_, fence) in &applied.ended {
            prop_assert!(*fence < index);
        }
        compare(&real, &model)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn lock_state_matches_the_model(history in history()) {
        run(history)?;
    }
}
