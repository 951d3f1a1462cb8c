//! What a simulated run saw, in simulated time: every call a client made and what came back, every span
//! in which a client believed it held a lock, every access to the fenced resource, and the locks the
//! healed cluster holds at the end.

use std::collections::BTreeMap;
use std::time::Duration;

/// Simulated time since the start of the run.
pub type At = Duration;

/// One client's call to the cluster, from the moment it was sent to the moment its answer came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// The client that made it.
    pub client: u32,
    /// The lock it is about.
    pub lock: String,
    /// What was asked.
    pub call: Call,
    /// When it was sent.
    pub invoked: At,
    /// When its answer came back; `None` when none did (a timeout, a lost connection, a crashed node).
    pub completed: Option<At>,
    /// What came back.
    pub outcome: Outcome,
}

/// What a client asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// Take the lock for `ttl_ms`. `wait`: queue behind the holder (a session's acquire) rather than be
    /// told at once that it is busy (HTTP's one-call acquire).
    Acquire { ttl_ms: u64, wait: bool },
    /// Let go of the hold granted under `fence`.
    Release { fence: u64 },
    /// Read who holds the lock (`GET /v1/locks/{name}`), changing nothing.
    Get,
}

/// What came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The lock was granted under `fence`.
    Granted { fence: u64 },
    /// Someone else holds it; nothing changed. `holder`: the holder's fence the answer showed, if it
    /// showed one.
    Busy { holder: Option<u64> },
    /// The hold was let go.
    Released,
    /// The release named a hold that no longer exists (released or expired); nothing changed.
    NotHeld,
    /// A read found the lock held under `fence`.
    Holds { fence: u64 },
    /// A read found the lock free.
    Free,
    /// No definite answer (an error, a timeout, no answer at all): the call may or may not have taken
    /// effect.
    Unknown,
}

/// A span in which a client believed it held `lock` under `fence`, by its own conservative clock: from
/// when the grant came back until it sent its release, or until its lease ran out counted from when it
/// sent the request or heartbeat that last extended it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub client: u32,
    pub lock: String,
    /// How many may hold `lock` at once, as the acquire asked: 1 for a lock, more for a semaphore (the
    /// hold is then one of its places).
    pub limit: u32,
    pub fence: u64,
    pub from: At,
    pub until: At,
}

/// One access to the fenced resource: a counter that accepts an access only with a fence at least the
/// highest it has seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub client: u32,
    pub fence: u64,
    pub at: At,
    pub kind: AccessKind,
    /// Whether the resource accepted it.
    pub accepted: bool,
}

/// A read or a write of the fenced counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessKind {
    /// Read the counter: `value` (meaningful only if accepted).
    Read { value: u64 },
    /// Write `written`, computed from `read`, the value the client read before.
    Write { read: u64, written: u64 },
}

/// One state of a lock a watcher was sent: the lock's revision and its holder's fence (`None`: free).
/// `segment` numbers the server streams the watcher's states came on: within one, every change comes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    pub client: u32,
    pub lock: String,
    pub segment: u64,
    pub revision: u64,
    pub holder: Option<u64>,
    pub at: At,
}

/// A one-call grant with a lock-delay, in the leader's time (log time, which only goes forward): when it
/// was granted and when its TTL runs out, as its answer said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leased {
    pub client: u32,
    pub lock: String,
    pub fence: u64,
    pub granted_at_ms: u64,
    pub expires_at_ms: u64,
    pub lock_delay_ms: u64,
}

/// The locks the cluster holds at the end of a run, read from the healed cluster: lock name to its
/// holders' fences, in order (one for a lock, up to its limit for a semaphore).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Final {
    /// When it was read.
    pub at: At,
    pub holders: BTreeMap<String, Vec<u64>>,
}

/// Everything one run recorded.
#[derive(Debug, Clone, Default)]
pub struct History {
    pub ops: Vec<Op>,
    pub holds: Vec<Hold>,
    pub accesses: Vec<Access>,
    /// What watchers were sent, in the order each received it.
    pub watched: Vec<Watched>,
    /// Grants that asked for a lock-delay.
    pub leased: Vec<Leased>,
    pub end: Option<Final>,
    /// When the last membership change was made: one that removes the leader starts an election, so
    /// liveness is judged from after it as from after the faults' heal.
    pub last_membership_change: Option<At>,
}
