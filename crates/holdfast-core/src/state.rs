//! [`LockState`]: named locks, their holders and FIFO waiters, and sessions.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use imbl::{OrdMap, Vector};
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::claims::Claims;
use crate::command::{Acquire, Command, Entry, Expire, SecretDigest, SessionId, SessionSecret, Token};
use crate::limits;
use crate::sessions::Sessions;

/// How a hold stays alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Lease {
    /// Until `expires_at_ms` (leader time), unless renewed.
    Ttl { ttl_ms: u64, expires_at_ms: u64 },
    /// As long as the session lives.
    Session(SessionId),
    /// Not held: the hold expired (its TTL or its session's lease ran out) with a lock-delay, and nobody
    /// is granted the lock before `free_at_ms` (leader time). The holder shown is the one that expired;
    /// it holds nothing. (Last, so that the variants before it keep their encoding.)
    Delayed { free_at_ms: u64 },
}

impl Lease {
    /// The advertised end of a TTL hold; `None` for a session's hold, whose end only the leader's
    /// in-memory lease keeper knows, and for a lock-delay.
    pub fn expires_at_ms(&self) -> Option<u64> {
        match self {
            Lease::Ttl { expires_at_ms, .. } => Some(*expires_at_ms),
            Lease::Session(_) | Lease::Delayed { .. } => None,
        }
    }

    /// When a lock in its lock-delay becomes grantable again; `None` for a live hold.
    pub fn free_at_ms(&self) -> Option<u64> {
        match self {
            Lease::Delayed { free_at_ms } => Some(*free_at_ms),
            Lease::Ttl { .. } | Lease::Session(_) => None,
        }
    }
}

/// A grant: who now holds which lock, under which fence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub name: String,
    pub owner: String,
    pub token: Token,
    /// The log index of the entry that made this grant.
    pub fence: u64,
    pub granted_at_ms: u64,
    pub lease: Lease,
    /// What the holder publishes (empty: nothing).
    pub value: Vec<u8>,
}

/// What anyone may see of a holder (no token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderView {
    pub owner: String,
    pub fence: u64,
    pub granted_at_ms: u64,
    pub lease: Lease,
    /// What the holder publishes (empty: nothing).
    pub value: Vec<u8>,
}

/// What anyone may see of a waiter (no token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaiterView {
    pub owner: String,
    pub queued_at_ms: u64,
    pub session: Option<SessionId>,
}

/// A lock as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockView {
    pub name: String,
    /// The first of `holders`: the lock's holder, or a semaphore's longest-held place.
    pub holder: HolderView,
    /// Every holder, ordered by fence: one for a lock, up to `limit` for a semaphore. A holder in its
    /// lock-delay ([`Lease::Delayed`]) holds a place and nothing else.
    pub holders: Vec<HolderView>,
    /// How many may hold it at once: 1 for a lock.
    pub limit: u32,
    pub waiters: Vec<WaiterView>,
    /// The log index of the lock's last change: a grant, release, expiry, hand-over, value change,
    /// renewal, or a waiter joining or leaving.
    pub revision: u64,
}

/// The answer to the proposer of an entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// The proposer holds the lock (for a session re-asking, the grant it already had).
    Granted(Grant),
    /// The proposer is queued at `position` (1 = next).
    Queued {
        position: usize,
        holder: HolderView,
    },
    /// Held by someone else and the proposer did not want to wait.
    Busy {
        holder: HolderView,
    },
    /// The hold with this fence ended.
    Released {
        name: String,
        fence: u64,
    },
    /// The hold now lasts until its new `expires_at_ms`.
    Renewed(Grant),
    /// The waiter left the queue.
    Withdrawn,
    SessionOpened {
        id: SessionId,
    },
    /// The session ended; its locks were handed over and its waits withdrawn.
    SessionClosed {
        id: SessionId,
    },
    /// How many of each kind actually expired (items that had changed meanwhile are skipped).
    Expired {
        locks: usize,
        waiters: usize,
        sessions: usize,
    },
    /// An API key was stored for this tenant.
    KeyCreated {
        tenant: u64,
    },
    /// This tenant's API key was revoked.
    KeyRevoked {
        tenant: u64,
    },
    /// Nothing changed, for this reason.
    Rejected(Reject),
    /// A [`Command::Batch`] or [`Command::Group`]: each command's outcome, in order.
    Batch(Vec<Outcome>),
    /// The holder's value is now the one given (same fence).
    ValueSet(Grant),
}

/// Why an entry changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Reject {
    /// The name is empty, too long, or has characters other than `A-Z a-z 0-9 . _ - :`.
    #[error("invalid lock name: 1 to {} bytes of A-Z a-z 0-9 . _ - :", limits::NAME_LEN_MAX)]
    InvalidName,
    /// The owner is too long or has control characters.
    #[error("invalid owner: at most {} bytes, no control characters", limits::OWNER_LEN_MAX)]
    InvalidOwner,
    /// A TTL or lease outside the hard bounds.
    #[error("ttl {0} ms is outside {min}..={max} ms", min = limits::TTL_MS_MIN, max = limits::TTL_MS_MAX)]
    InvalidTtl(u64),
    /// A wait longer than the hard bound.
    #[error("wait {0} ms is longer than {max} ms", max = limits::WAIT_MS_MAX)]
    InvalidWait(u64),
    /// The token does not hold (or wait for) this lock: it is wrong, or its hold already ended.
    #[error("the token does not hold lock {name:?}")]
    NotHolder { name: String, holder: Option<HolderView> },
    /// The TTL hold ran out before the renew arrived; it can no longer be renewed.
    #[error("the hold on {name:?} expired before it was renewed")]
    Expired { name: String },
    /// A session's hold is kept by the session's heartbeats and let go through the session, not by a
    /// one-shot `Renew` or `Release`.
    #[error("lock {name:?} is held by a session; the session keeps it and lets it go")]
    SessionHold { name: String },
    /// The lock's queue is full.
    #[error("the queue for {name:?} is full ({} waiters)", limits::WAITERS_PER_LOCK_MAX)]
    QueueFull { name: String },
    /// The cluster holds as many locks as it may.
    #[error("too many locks ({})", limits::LOCKS_MAX)]
    TooManyLocks,
    /// The cluster has as many sessions as it may.
    #[error("too many sessions ({max})")]
    TooManySessions { max: u64 },
    /// The session holds or waits for as many locks as it may.
    #[error("the session has too many claims ({})", limits::CLAIMS_PER_SESSION_MAX)]
    TooManyClaims,
    /// No session with this id is open.
    #[error("no open session {0}")]
    NoSession(SessionId),
    /// A session with this id is already open.
    #[error("session {0} is already open")]
    SessionExists(SessionId),
    /// Tenant `0` has no API key (never had, or it was revoked).
    #[error("no API key for tenant {0:016x}")]
    NoKey(u64),
    /// A key with this tenant id or hash exists already.
    #[error("the API key exists already")]
    KeyExists,
    /// The cluster has as many API keys as it may.
    #[error("too many API keys ({})", limits::KEYS_MAX)]
    TooManyKeys,
    /// A claim with this token already exists on the lock.
    #[error("duplicate token")]
    DuplicateToken,
    /// An `Expire` entry larger than [`limits::EXPIRE_BATCH_MAX`].
    #[error("expire batch of {0} items is too large")]
    BatchTooLarge(usize),
    /// A [`Command::Batch`] that is empty, longer than [`limits::BATCH_MAX`], holds a command that is not a
    /// one-lock command, or names a lock twice; or a [`Command::Group`] that breaks its own rule: none of
    /// its commands is applied.
    #[error("invalid batch of commands")]
    InvalidBatch,
    /// A value longer than [`limits::VALUE_LEN_MAX`] bytes.
    #[error("a value of {0} bytes is longer than {max} bytes", max = limits::VALUE_LEN_MAX)]
    ValueTooLong(usize),
    /// A lock-delay longer than [`limits::LOCK_DELAY_MS_MAX`].
    #[error("lock-delay {0} ms is longer than {max} ms", max = limits::LOCK_DELAY_MS_MAX)]
    InvalidLockDelay(u64),
    /// A semaphore's limit of 0 or above [`limits::SEMAPHORE_LIMIT_MAX`].
    #[error("limit {0} is outside 1..={max}", max = limits::SEMAPHORE_LIMIT_MAX)]
    InvalidLimit(u32),
    /// The lock exists (held, or in its lock-delay) with another limit: every acquirer of a name gives the
    /// same limit while anyone holds or waits for it.
    #[error("lock {name:?} has a limit of {limit}; an acquire must give the same")]
    LimitMismatch { name: String, limit: u32 },
}

/// An open session and its claims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionView {
    pub id: SessionId,
    pub owner: String,
    pub lease_ms: u64,
    /// The digest of the secret that resumes it; `None` for a session opened by a build from before
    /// secrets, which cannot be resumed.
    pub secret: Option<SecretDigest>,
    /// The locks it holds, in name order.
    pub holds: Vec<Grant>,
    /// The queues it is in, in name order.
    pub waits: Vec<SessionWait>,
}

impl SessionView {
    /// Whether `secret` is the session's own (compared in constant time). Never for a session without one.
    pub fn proven_by(&self, secret: &SessionSecret) -> bool {
        self.secret.is_some_and(|digest| digest == secret.digest())
    }
}

/// A session's place in a lock's queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionWait {
    pub name: String,
    pub token: Token,
    /// 1 = next.
    pub position: usize,
    pub holder: HolderView,
}

/// A hold an entry ended (released, expired, closed with its session, or a lock-delay run out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub name: String,
    pub fence: u64,
    /// The session that held it, if it was a session's live hold: the node it is attached to tells it.
    pub session: Option<SessionId>,
}

/// Everything one entry did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The entry's time: `max(stamp, previous time)`.
    pub at_ms: u64,
    /// The answer to the proposer.
    pub outcome: Outcome,
    /// Every grant the entry made: the proposer's and any hand-overs, in order.
    pub grants: Vec<Grant>,
    /// Every hold the entry ended, in order.
    pub ended: Vec<Ended>,
    /// Every waiter the entry removed from a queue without granting it, by name and token.
    pub dropped: Vec<(String, Token)>,
    /// Every lock-delay the entry began: the lock, the fence of the hold that expired, and the delay in ms.
    /// A delay of 0 is a semaphore's place freed in an entry that already granted that semaphore: it is
    /// handed over by the next `Expire` entry that names it, so that no two holders share a fence.
    pub delayed: Vec<(String, u64, u64)>,
}

impl Applied {
    fn new(at_ms: u64) -> Self {
        Applied {
            at_ms,
            outcome: Outcome::Withdrawn,
            grants: Vec::new(),
            ended: Vec::new(),
            dropped: Vec::new(),
            delayed: Vec::new(),
        }
    }
}

/// Whether `cmds` may be applied as one [`Command::Batch`]: 1 to [`limits::BATCH_MAX`] one-lock commands,
/// each on a different lock, so that no lock is granted twice under one fence.
fn valid_batch(cmds: &[Command]) -> bool {
    let mut names = BTreeSet::new();
    (1..=limits::BATCH_MAX).contains(&cmds.len())
        && cmds.iter().all(|cmd| cmd.lock_name().is_some_and(|name| names.insert(name)))
}

/// Whether `cmds` may be applied as one [`Command::Group`]: 1 to [`limits::BATCH_MAX`] one-lock commands,
/// and per lock at most one that is not an acquire, before that lock's acquires, and at most one acquire
/// with a limit above 1. Then a lock is granted at most once in the entry: the one command that can free
/// a place comes first, and of the acquires after it only the first can find a place free (a semaphore
/// with a free place has no waiters, so a second acquire could take a second place).
fn valid_group(cmds: &[Command]) -> bool {
    let mut seen = BTreeSet::new();
    let mut semaphores = BTreeSet::new();
    (1..=limits::BATCH_MAX).contains(&cmds.len())
        && cmds.iter().all(|cmd| {
            cmd.lock_name().is_some_and(|name| {
                let first = seen.insert(name);
                (first || cmd.is_acquire()) && (cmd.limit() <= 1 || semaphores.insert(name))
            })
        })
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Holder {
    owner: String,
    token: Token,
    fence: u64,
    granted_at_ms: u64,
    lease: Lease,
    value: Vec<u8>,
    /// How long the lock stays ungranted if this hold expires (0: not at all).
    lock_delay_ms: u64,
}

impl Holder {
    /// Whether `token` holds the lock now: the holder's, and not an expired hold in its lock-delay.
    fn holds(&self, token: Token) -> bool {
        self.token == token && self.lease.free_at_ms().is_none()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Waiter {
    owner: String,
    token: Token,
    /// The TTL the grant will carry (unused for a session's waiter).
    ttl_ms: u64,
    queued_at_ms: u64,
    /// Past this time the waiter is gone; `u64::MAX` for a session's waiter.
    wait_until_ms: u64,
    session: Option<SessionId>,
    /// The value its grant will publish.
    value: Vec<u8>,
    /// The lock-delay its grant will carry.
    lock_delay_ms: u64,
}

/// A lock's holders, ordered by fence: one for a lock, up to its limit for a semaphore. Kept inline for one,
/// so that a lock costs no allocation more than before semaphores; smallvec's `union` layout keeps no tag
/// beside the inline holder, which puts a lock with its `Arc` in mimalloc's 192-byte class instead of 224.
type Holders = SmallVec<[Holder; 1]>;

/// A lock (or semaphore) exists while one of its places is held or in its lock-delay ([`Lease::Delayed`]).
/// A lock with waiters has every place taken (a release hands its place over in the same entry, and so
/// does the entry that ends a lock-delay), so there is no "free place with a queue".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Lock {
    /// Never empty; at most `limit`. Fences are unique: a lock is granted at most once per entry.
    #[serde(deserialize_with = "ordered::deserialize_small")]
    holders: Holders,
    waiters: VecDeque<Waiter>,
    /// The index of the entry that last changed it.
    revision: u64,
    /// How many may hold it at once: 1 for a lock.
    limit: u32,
}

impl Lock {
    /// A lock of one holder, as the snapshot formats before semaphores kept every lock.
    fn single(holder: Holder, waiters: VecDeque<Waiter>, revision: u64) -> Self {
        Lock { holders: smallvec::smallvec![holder], waiters, revision, limit: 1 }
    }

    /// The first holder: the lock's, or a semaphore's longest-held place.
    fn first(&self) -> &Holder {
        &self.holders[0]
    }

    /// Where `token` holds a place now (not an expired hold in its lock-delay).
    fn held_by(&self, token: Token) -> Option<usize> {
        self.holders.iter().position(|h| h.holds(token))
    }

    /// Where the hold (or lock-delay) with `fence` is.
    fn place(&self, fence: u64) -> Option<usize> {
        self.holders.iter().position(|h| h.fence == fence)
    }

    /// Whether the claim `token` (a holder, expired or not, or a waiter) is on the lock.
    fn has_claim(&self, token: Token) -> bool {
        self.holders.iter().any(|h| h.token == token) || self.waiters.iter().any(|w| w.token == token)
    }

    /// Whether the entry at `index` granted the lock: a second grant there would share its fence.
    fn granted_in(&self, index: u64) -> bool {
        self.holders.last().is_some_and(|h| h.fence == index)
    }

    /// Whether every place is taken.
    fn is_full(&self) -> bool {
        self.holders.len() >= self.limit as usize
    }

    /// The place session `id` holds.
    fn session_place(&self, id: SessionId) -> Option<usize> {
        self.holders.iter().position(|h| h.lease == Lease::Session(id))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Session {
    owner: String,
    lease_ms: u64,
    opened_at_ms: u64,
    /// Names of the locks the session holds or waits for.
    claims: Claims,
    /// How many of `claims` it holds (the rest it waits for), so that a heartbeat's answer looks up no
    /// lock: at 100,000 sessions those lookups (a name compared at every level of the locks' tree) were
    /// about a tenth of the leader's CPU. Not encoded: counted from the locks when a snapshot is read.
    #[serde(skip)]
    holds: u32,
    /// The digest of the secret that resumes it. Not encoded with the rest of the session: a snapshot
    /// carries the digests after the state (format 3), so that format 2's sessions still decode.
    #[serde(skip)]
    secret: Option<SecretDigest>,
}

/// The replicated lock state.
///
/// Locks and sessions are kept in persistent B-trees (`imbl::OrdMap`), which share their nodes between
/// copies: [`Clone`] takes the same short time whatever the state's size, and a copy's later changes
/// copy only the nodes they touch. A snapshot is therefore serialized from a copy taken in an instant
/// ([`LockState::clone`]), without holding up the entries applied meanwhile. Each lock sits behind an
/// [`Arc`], so a tree node copied that way copies pointers, and a lock is copied only when it changes
/// while a copy shares it; it also keeps the tree's nodes small (a million held locks at 85861e8: about
/// 262 bytes a lock in all, against 294 in the ordered map used before and 361 with the locks inline;
/// semaphores' list of holders added 32 bytes a lock, see docs/perf-notes/2026-12-04-semaphores-memory.md).
/// Each session sits behind an [`Arc`] too (in `Sessions`): a tree's leaf holds its entries inline, and a
/// look at a session ([`LockState::session_summary`]) searched session-sized entries, a new cache line at
/// nearly every step; in 16-byte entries, a look at each of 100,000 sessions takes 138-146 ns where it
/// took 234 (`cargo bench -p holdfast-core -- heartbeat`). The sessions each command changes are named
/// ([`LockState::sessions_changed`]), so that a node can keep what a heartbeat's answer needs beside the
/// session's deadline and look nothing up here for it. Serialized, they are the same bytes as the ordered
/// maps they replaced.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockState {
    #[serde(deserialize_with = "ordered::deserialize")]
    locks: OrdMap<String, Arc<Lock>>,
    sessions: Sessions<Session>,
    /// API keys: tenant id to the key's hash and creation time; and the reverse.
    keys: BTreeMap<u64, ([u8; 32], u64)>,
    key_tenants: BTreeMap<[u8; 32], u64>,
    /// The revision of the entry that last freed each lock, for the frees in [`LockState::frees`]: a
    /// watcher that looks again soon after a lock was freed sees that it changed, even if it was taken and
    /// freed again meanwhile. A lock taken again keeps its entry here (its own revision is read first) until
    /// it is freed again or the free is forgotten: the acquire does no work for it.
    #[serde(deserialize_with = "ordered::deserialize")]
    freed: OrdMap<String, u64>,
    /// Every free of the last [`limits::FREED_KEEP_MS`] of log time, at most the last [`limits::FREED_MAX`]:
    /// revision, time and name, oldest first. A free that leaves the front takes its lock's entry in
    /// `freed` with it, if that entry is still this free's.
    #[serde(deserialize_with = "ordered::deserialize_vector")]
    frees: Vector<(u64, u64, String)>,
    /// The highest revision a lock's memory of being freed was forgotten at: a watcher resuming after an
    /// earlier revision may have missed a free ([`LockState::forgotten_through`]).
    forgotten_through: u64,
    /// Time of the last applied entry.
    now_ms: u64,
    /// Index of the last applied entry.
    applied_index: u64,
}

/// Decoding the persistent maps as serde decodes ordered maps: entry by entry. (imbl's own decoder first
/// reserves room for as many entries as the encoded length claims, so a corrupt length aborts the process
/// instead of failing the decode.)
pub(crate) mod ordered {
    use std::fmt;
    use std::marker::PhantomData;

    use imbl::{OrdMap, Vector};
    use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

    pub(crate) fn deserialize<'de, D, K, V>(deserializer: D) -> Result<OrdMap<K, V>, D::Error>
    where
        D: Deserializer<'de>,
        K: Deserialize<'de> + Ord + Clone,
        V: Deserialize<'de> + Clone,
    {
        struct Entries<K, V>(PhantomData<(K, V)>);

        impl<'de, K, V> Visitor<'de> for Entries<K, V>
        where
            K: Deserialize<'de> + Ord + Clone,
            V: Deserialize<'de> + Clone,
        {
            type Value = OrdMap<K, V>;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a map")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut map = OrdMap::new();
                while let Some((key, value)) = access.next_entry()? {
                    map.insert(key, value);
                }
                Ok(map)
            }
        }

        deserializer.deserialize_map(Entries(PhantomData))
    }

    /// A small vector, element by element (smallvec's decoder reserves room for the encoded length first,
    /// so a corrupt length would abort the process instead of failing the decode).
    pub(super) fn deserialize_small<'de, D, A>(deserializer: D) -> Result<smallvec::SmallVec<A>, D::Error>
    where
        D: Deserializer<'de>,
        A: smallvec::Array,
        A::Item: Deserialize<'de>,
    {
        struct Elements<A>(PhantomData<A>);

        impl<'de, A: smallvec::Array> Visitor<'de> for Elements<A>
        where
            A::Item: Deserialize<'de>,
        {
            type Value = smallvec::SmallVec<A>;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a sequence")
            }

            fn visit_seq<S: SeqAccess<'de>>(self, mut access: S) -> Result<Self::Value, S::Error> {
                let mut small = smallvec::SmallVec::new();
                while let Some(element) = access.next_element()? {
                    small.push(element);
                }
                Ok(small)
            }
        }

        deserializer.deserialize_seq(Elements(PhantomData))
    }

    /// A persistent vector, element by element (imbl's reserves room for the encoded length first).
    pub(super) fn deserialize_vector<'de, D, T>(deserializer: D) -> Result<Vector<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de> + Clone,
    {
        struct Elements<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de> + Clone> Visitor<'de> for Elements<T> {
            type Value = Vector<T>;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a sequence")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut vector = Vector::new();
                while let Some(element) = access.next_element()? {
                    vector.push_back(element);
                }
                Ok(vector)
            }
        }

        deserializer.deserialize_seq(Elements(PhantomData))
    }
}

/// A snapshot that cannot be restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Written by a format this build does not know.
    #[error("snapshot format {0} is not supported (expected {SNAPSHOT_FORMAT})")]
    Format(u32),
    /// The bytes do not decode.
    #[error("snapshot does not decode: {0}")]
    Decode(#[from] bincode::Error),
    /// The bytes could not be written.
    #[error("snapshot could not be written: {0}")]
    Write(#[source] bincode::Error),
}

/// Format 6: the state with semaphores (each lock its holders and limit), lock-delays, values, revisions
/// and freed locks, then the sessions' secret digests ([`SessionSecrets`]). Format 5 (one holder a lock)
/// restores through [`before_semaphores`]; format 4 (without lock-delays) through [`before_delays`];
/// format 3 (the state without values, revisions or freed locks, then the digests) and format 2 (without
/// digests) through [`before_values`].
const SNAPSHOT_FORMAT: u32 = 6;
const SNAPSHOT_FORMAT_WITHOUT_SEMAPHORES: u32 = 5;
const SNAPSHOT_FORMAT_WITHOUT_DELAYS: u32 = 4;
const SNAPSHOT_FORMAT_WITHOUT_VALUES: u32 = 3;
const SNAPSHOT_FORMAT_WITHOUT_SECRETS: u32 = 2;

/// The state as snapshot formats 2 and 3 encoded it: no values, no revisions, no freed locks.
mod before_values {
    use std::collections::{BTreeMap, VecDeque};
    use std::sync::Arc;

    use serde::Deserialize;

    use super::{Lease, Lock, SessionId, Token};

    #[derive(Deserialize)]
    struct Holder {
        owner: String,
        token: Token,
        fence: u64,
        granted_at_ms: u64,
        lease: Lease,
    }

    #[derive(Deserialize)]
    struct Waiter {
        owner: String,
        token: Token,
        ttl_ms: u64,
        queued_at_ms: u64,
        wait_until_ms: u64,
        session: Option<SessionId>,
    }

    #[derive(Deserialize)]
    pub(super) struct LockState {
        locks: BTreeMap<String, (Holder, VecDeque<Waiter>)>,
        sessions: BTreeMap<SessionId, super::Session>,
        keys: BTreeMap<u64, ([u8; 32], u64)>,
        key_tenants: BTreeMap<[u8; 32], u64>,
        now_ms: u64,
        applied_index: u64,
    }

    impl LockState {
        /// The state as this build keeps it. The changes before the snapshot were not recorded: each lock's
        /// revision is the snapshot's index, which no change to it after the snapshot can be at or below, so
        /// a watcher may be told of a change that did not happen, never left unaware of one that did.
        pub(super) fn into_current(self) -> super::LockState {
            let revision = self.applied_index;
            let lock = |(holder, waiters): (Holder, VecDeque<Waiter>)| {
                let holder = super::Holder {
                    owner: holder.owner,
                    token: holder.token,
                    fence: holder.fence,
                    granted_at_ms: holder.granted_at_ms,
                    lease: holder.lease,
                    value: Vec::new(),
                    lock_delay_ms: 0,
                };
                let waiters = waiters
                    .into_iter()
                    .map(|w| super::Waiter {
                        owner: w.owner,
                        token: w.token,
                        ttl_ms: w.ttl_ms,
                        queued_at_ms: w.queued_at_ms,
                        wait_until_ms: w.wait_until_ms,
                        session: w.session,
                        value: Vec::new(),
                        lock_delay_ms: 0,
                    })
                    .collect();
                Arc::new(Lock::single(holder, waiters, revision))
            };
            super::LockState {
                locks: self.locks.into_iter().map(|(name, l)| (name, lock(l))).collect(),
                sessions: self.sessions.into_iter().map(|(id, session)| (id, Arc::new(session))).collect(),
                keys: self.keys,
                key_tenants: self.key_tenants,
                now_ms: self.now_ms,
                applied_index: self.applied_index,
                freed: Default::default(),
                frees: Default::default(),
                forgotten_through: 0,
            }
        }
    }
}

/// The state as snapshot format 4 encoded it: no lock-delays; otherwise as format 5.
mod before_delays {
    use std::collections::VecDeque;
    use std::sync::Arc;

    use serde::Deserialize;

    use super::{Lease, Lock, SessionId, Token};

    #[derive(Deserialize)]
    struct Holder {
        owner: String,
        token: Token,
        fence: u64,
        granted_at_ms: u64,
        lease: Lease,
        value: Vec<u8>,
    }

    #[derive(Deserialize)]
    struct Waiter {
        owner: String,
        token: Token,
        ttl_ms: u64,
        queued_at_ms: u64,
        wait_until_ms: u64,
        session: Option<SessionId>,
        value: Vec<u8>,
    }

    #[derive(Deserialize)]
    pub(super) struct Lock4 {
        holder: Holder,
        waiters: VecDeque<Waiter>,
        revision: u64,
    }

    /// The lock as this build keeps it: its hold and waiters without a lock-delay.
    pub(super) fn into_current(l: Lock4) -> Arc<Lock> {
        let h = l.holder;
        let holder = super::Holder {
            owner: h.owner,
            token: h.token,
            fence: h.fence,
            granted_at_ms: h.granted_at_ms,
            lease: h.lease,
            value: h.value,
            lock_delay_ms: 0,
        };
        let waiters = l
            .waiters
            .into_iter()
            .map(|w| super::Waiter {
                owner: w.owner,
                token: w.token,
                ttl_ms: w.ttl_ms,
                queued_at_ms: w.queued_at_ms,
                wait_until_ms: w.wait_until_ms,
                session: w.session,
                value: w.value,
                lock_delay_ms: 0,
            })
            .collect();
        Arc::new(Lock::single(holder, waiters, l.revision))
    }
}

/// The state as snapshot formats 5 and 4 encoded it: one holder a lock, no limits; each lock `L` in the
/// shape its format gave it.
mod before_semaphores {
    use std::collections::{BTreeMap, VecDeque};
    use std::sync::Arc;

    use serde::Deserialize;

    use super::{Holder, Lock, SessionId, Waiter};

    #[derive(Deserialize)]
    pub(super) struct Lock5 {
        holder: Holder,
        waiters: VecDeque<Waiter>,
        revision: u64,
    }

    /// The lock as this build keeps it: a lock of one holder.
    pub(super) fn into_current(l: Lock5) -> Arc<Lock> {
        Arc::new(Lock::single(l.holder, l.waiters, l.revision))
    }

    #[derive(Deserialize)]
    pub(super) struct LockState<L> {
        locks: BTreeMap<String, L>,
        sessions: BTreeMap<SessionId, super::Session>,
        keys: BTreeMap<u64, ([u8; 32], u64)>,
        key_tenants: BTreeMap<[u8; 32], u64>,
        freed: BTreeMap<String, u64>,
        frees: Vec<(u64, u64, String)>,
        forgotten_through: u64,
        now_ms: u64,
        applied_index: u64,
    }

    impl<L> LockState<L> {
        /// The state as this build keeps it, each lock made by `lock`.
        pub(super) fn into_current(self, lock: impl Fn(L) -> Arc<Lock>) -> super::LockState {
            super::LockState {
                locks: self.locks.into_iter().map(|(name, l)| (name, lock(l))).collect(),
                sessions: self.sessions.into_iter().map(|(id, session)| (id, Arc::new(session))).collect(),
                keys: self.keys,
                key_tenants: self.key_tenants,
                freed: self.freed.into_iter().collect(),
                frees: self.frees.into_iter().collect(),
                forgotten_through: self.forgotten_through,
                now_ms: self.now_ms,
                applied_index: self.applied_index,
            }
        }
    }
}

/// The sessions' secret digests, by session id in id order, as a snapshot encodes them after the state.
struct SessionSecrets<'a>(&'a Sessions<Session>);

impl Serialize for SessionSecrets<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let secrets = || self.0.iter().filter_map(|(id, session)| session.secret.map(|secret| (id, secret)));
        // bincode writes a map's length first: counted in a pass of its own.
        let mut map = serializer.serialize_map(Some(secrets().count()))?;
        for (id, secret) in secrets() {
            map.serialize_entry(id, &secret)?;
        }
        map.end()
    }
}

/// The lock `name` in `locks`, to change: copied first if a snapshot's copy of the state shares it
/// ([`Arc::make_mut`]), so that the copy keeps what it saw.
fn lock_mut<'a>(locks: &'a mut OrdMap<String, Arc<Lock>>, name: &str) -> Option<&'a mut Lock> {
    locks.get_mut(name).map(Arc::make_mut)
}

impl LockState {
    /// An empty state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Apply the entry at log `index`. Indexes must strictly increase; entries the lock state does not see
    /// (Raft's blank and membership entries) may leave gaps. For a [`Command::Batch`] the outcome is
    /// [`Outcome::Batch`] and the grants, ends and drops are every command's, in order.
    pub fn apply(&mut self, index: u64, entry: &Entry) -> Applied {
        let mut all = Applied::new(0);
        let outcome = self.apply_each(index, entry, |_, _, applied| {
            all.grants.extend_from_slice(&applied.grants);
            all.ended.extend_from_slice(&applied.ended);
            all.dropped.extend_from_slice(&applied.dropped);
            all.delayed.extend_from_slice(&applied.delayed);
        });
        Applied { at_ms: self.now_ms, outcome, ..all }
    }

    /// Apply the entry at log `index`, as [`apply`](Self::apply) does, telling `each` what every command
    /// did, with the state as it is just after that command: once for a single command, once per command
    /// of a valid batch (none for an invalid one). Returns the entry's outcome.
    pub fn apply_each(
        &mut self,
        index: u64,
        entry: &Entry,
        mut each: impl FnMut(&LockState, &Command, &Applied),
    ) -> Outcome {
        assert!(
            index > self.applied_index,
            "entry {index} applied after {}: the log went backwards",
            self.applied_index
        );
        self.applied_index = index;
        self.now_ms = self.now_ms.max(entry.at_ms);
        let outcome = match &entry.cmd {
            Command::Batch(cmds) if valid_batch(cmds) => self.apply_all(cmds, each),
            Command::Group(cmds) if valid_group(cmds) => self.apply_all(cmds, each),
            Command::Batch(_) | Command::Group(_) => Outcome::Rejected(Reject::InvalidBatch),
            cmd => {
                let applied = self.apply_command(cmd);
                each(self, cmd, &applied);
                applied.outcome
            }
        };
        self.forget_old_frees();
        outcome
    }

    /// Applies the commands of a valid batch or group, in order.
    fn apply_all(&mut self, cmds: &[Command], mut each: impl FnMut(&LockState, &Command, &Applied)) -> Outcome {
        let mut outcomes = Vec::with_capacity(cmds.len());
        for cmd in cmds {
            let applied = self.apply_command(cmd);
            each(self, cmd, &applied);
            outcomes.push(applied.outcome);
        }
        Outcome::Batch(outcomes)
    }

    /// Forgets the frees older than [`limits::FREED_KEEP_MS`], and the oldest past [`limits::FREED_MAX`]:
    /// decided by the entry's time, the same on every replica.
    fn forget_old_frees(&mut self) {
        while let Some((_, freed_at_ms, _)) = self.frees.front() {
            let old = freed_at_ms.saturating_add(limits::FREED_KEEP_MS) <= self.now_ms;
            if !old && self.frees.len() <= limits::FREED_MAX {
                return;
            }
            let (revision, _, name) = self.frees.pop_front().expect("a front");
            if self.freed.get(&name) == Some(&revision) {
                self.freed.remove(&name);
                self.forgotten_through = self.forgotten_through.max(revision);
            }
        }
    }

    /// Remembers that `name` was freed by the current entry.
    fn note_freed(&mut self, name: &str) {
        self.freed.insert(name.to_owned(), self.applied_index);
        self.frees.push_back((self.applied_index, self.now_ms, name.to_owned()));
    }

    /// Apply one command (not a batch) at the current index and time.
    fn apply_command(&mut self, cmd: &Command) -> Applied {
        self.sessions.forget_changes();
        let mut applied = Applied::new(self.now_ms);
        let named = cmd.lock_name();
        // A name in a tenant's namespace is acted on only while the tenant's key exists: a write ordered
        // after the key's revocation changes nothing, on every replica.
        if let Some((Some(tenant), _)) = named.map(limits::split_tenant) {
            if !self.keys.contains_key(&tenant) {
                applied.outcome = Outcome::Rejected(Reject::NoKey(tenant));
                return applied;
            }
        }
        let outcome = match cmd {
            Command::CreateKey { tenant, hash } => {
                if self.keys.contains_key(tenant) || self.key_tenants.contains_key(hash) {
                    Outcome::Rejected(Reject::KeyExists)
                } else if self.keys.len() >= limits::KEYS_MAX {
                    Outcome::Rejected(Reject::TooManyKeys)
                } else {
                    self.keys.insert(*tenant, (*hash, self.now_ms));
                    self.key_tenants.insert(*hash, *tenant);
                    Outcome::KeyCreated { tenant: *tenant }
                }
            }
            Command::RevokeKey { tenant } => match self.keys.remove(tenant) {
                Some((hash, _)) => {
                    self.key_tenants.remove(&hash);
                    Outcome::KeyRevoked { tenant: *tenant }
                }
                None => Outcome::Rejected(Reject::NoKey(*tenant)),
            },
            Command::Acquire(acquire) => self.acquire(acquire, &[], 0, 1, &mut applied),
            Command::AcquireValued { acquire, value } => self.acquire(acquire, value, 0, 1, &mut applied),
            Command::AcquireDelayed { acquire, value, lock_delay_ms } => {
                self.acquire(acquire, value, *lock_delay_ms, 1, &mut applied)
            }
            Command::AcquireSemaphore { acquire, value, lock_delay_ms, limit } => {
                self.acquire(acquire, value, *lock_delay_ms, *limit, &mut applied)
            }
            Command::SetValue { name, token, value } => self.set_value(name, *token, value),
            Command::Release { name, token } => {
                let lock = self.locks.get(name.as_str());
                match lock.and_then(|l| l.held_by(*token).map(|i| l.holders[i].lease)) {
                    // A session lets go through its stream (a Cancel); a one-shot release must not end a session's
                    // hold behind its back.
                    Some(Lease::Session(_)) => Outcome::Rejected(Reject::SessionHold { name: name.clone() }),
                    _ => self.release(name, *token, &mut applied),
                }
            }
            Command::Renew { name, token, ttl_ms } => self.renew(name, *token, Some(*ttl_ms)),
            Command::RenewKeepingTtl { name, token } => self.renew(name, *token, None),
            Command::Cancel { name, token } => self.cancel(name, *token, &mut applied),
            Command::OpenSessionCapped { id, owner, lease_ms, secret, sessions_max } => {
                self.open_session(*id, owner, *lease_ms, Some(*secret), *sessions_max)
            }
            Command::OpenSession { id, owner, lease_ms, secret } => {
                self.open_session(*id, owner, *lease_ms, Some(*secret), limits::SESSIONS_MAX_BEFORE)
            }
            Command::OpenSessionWithoutSecret { id, owner, lease_ms } => {
                self.open_session(*id, owner, *lease_ms, None, limits::SESSIONS_MAX_BEFORE)
            }
            Command::CloseSession { id } => match self.close_session(*id, &BTreeSet::new(), false, &mut applied) {
                true => Outcome::SessionClosed { id: *id },
                false => Outcome::Rejected(Reject::NoSession(*id)),
            },
            Command::Expire(expire) => self.expire(expire, &mut applied),
            // Only at the top of an entry, where `apply_each` takes it apart.
            Command::Batch(_) | Command::Group(_) => Outcome::Rejected(Reject::InvalidBatch),
        };
        if let Outcome::Rejected(_) = outcome {
            assert!(applied.grants.is_empty() && applied.ended.is_empty() && applied.dropped.is_empty());
            assert!(applied.delayed.is_empty());
        }
        applied.outcome = outcome;
        applied
    }

    /// Why an acquire with these arguments must change nothing, if it must, whatever the state.
    fn invalid_acquire(a: &Acquire, value: &[u8], lock_delay_ms: u64, limit: u32) -> Option<Reject> {
        Some(if !limits::valid_name(&a.name) {
            Reject::InvalidName
        } else if !limits::valid_owner(&a.owner) {
            Reject::InvalidOwner
        } else if value.len() > limits::VALUE_LEN_MAX {
            Reject::ValueTooLong(value.len())
        } else if lock_delay_ms > limits::LOCK_DELAY_MS_MAX {
            Reject::InvalidLockDelay(lock_delay_ms)
        } else if !(1..=limits::SEMAPHORE_LIMIT_MAX).contains(&limit) {
            Reject::InvalidLimit(limit)
        } else if a.session.is_none() && !(limits::TTL_MS_MIN..=limits::TTL_MS_MAX).contains(&a.ttl_ms) {
            Reject::InvalidTtl(a.ttl_ms)
        } else if a.session.is_none() && a.wait_ms > limits::WAIT_MS_MAX {
            Reject::InvalidWait(a.wait_ms)
        } else {
            return None;
        })
    }

    fn acquire(&mut self, a: &Acquire, value: &[u8], lock_delay_ms: u64, limit: u32, applied: &mut Applied) -> Outcome {
        if let Some(reject) = Self::invalid_acquire(a, value, lock_delay_ms, limit) {
            return Outcome::Rejected(reject);
        }
        if let Some(held) = self.locks.get(&a.name).map(|l| l.limit).filter(|held| *held != limit) {
            return Outcome::Rejected(Reject::LimitMismatch { name: a.name.clone(), limit: held });
        }
        if let Some(id) = a.session {
            let Some(session) = self.sessions.get(&id) else {
                return Outcome::Rejected(Reject::NoSession(id));
            };
            // A session asking again for a lock it holds or waits for gets the same answer again.
            if session.claims.contains(&a.name) {
                let lock = &self.locks[&a.name];
                if let Some(i) = lock.session_place(id) {
                    return Outcome::Granted(grant_of(&a.name, &lock.holders[i]));
                }
                let position = lock.waiters.iter().position(|w| w.session == Some(id));
                let position = position.expect("a session's claim is a hold or a wait") + 1;
                return Outcome::Queued { position, holder: view_of(lock.first()) };
            }
            if session.claims.len() >= limits::CLAIMS_PER_SESSION_MAX {
                return Outcome::Rejected(Reject::TooManyClaims);
            }
        }
        let (at, index) = (self.now_ms, self.applied_index);
        let holder = || Holder {
            owner: a.owner.clone(),
            token: a.token,
            fence: index,
            granted_at_ms: at,
            lease: match a.session {
                Some(id) => Lease::Session(id),
                None => Lease::Ttl { ttl_ms: a.ttl_ms, expires_at_ms: at.saturating_add(a.ttl_ms) },
            },
            value: value.to_vec(),
            lock_delay_ms,
        };
        let outcome = match lock_mut(&mut self.locks, &a.name) {
            None => {
                if self.locks.len() >= limits::LOCKS_MAX {
                    return Outcome::Rejected(Reject::TooManyLocks);
                }
                let lock = Lock { limit, ..Lock::single(holder(), VecDeque::new(), index) };
                let grant = grant_of(&a.name, lock.first());
                self.locks.insert(a.name.clone(), Arc::new(lock));
                applied.grants.push(grant.clone());
                Outcome::Granted(grant)
            }
            Some(lock) => {
                if lock.has_claim(a.token) {
                    return Outcome::Rejected(Reject::DuplicateToken);
                }
                // A free place has no queue (see `Lock`); a group names a semaphore in one acquire at most,
                // so a free place is never found in an entry that granted one already.
                if !lock.is_full() {
                    debug_assert!(lock.waiters.is_empty() && !lock.granted_in(index));
                    lock.holders.push(holder());
                    lock.revision = index;
                    let grant = grant_of(&a.name, lock.holders.last().expect("just pushed"));
                    applied.grants.push(grant.clone());
                    Outcome::Granted(grant)
                } else {
                    if a.wait_ms == 0 {
                        return Outcome::Busy { holder: view_of(lock.first()) };
                    }
                    if lock.waiters.len() >= limits::WAITERS_PER_LOCK_MAX {
                        return Outcome::Rejected(Reject::QueueFull { name: a.name.clone() });
                    }
                    lock.waiters.push_back(Waiter {
                        owner: a.owner.clone(),
                        token: a.token,
                        ttl_ms: a.ttl_ms,
                        queued_at_ms: at,
                        wait_until_ms: match a.session {
                            Some(_) => u64::MAX,
                            None => at.saturating_add(a.wait_ms),
                        },
                        session: a.session,
                        value: value.to_vec(),
                        lock_delay_ms,
                    });
                    lock.revision = index;
                    Outcome::Queued { position: lock.waiters.len(), holder: view_of(lock.first()) }
                }
            }
        };
        if let Some(id) = a.session {
            let session = self.sessions.get_mut(&id).expect("checked above");
            assert!(session.claims.insert(a.name.clone()), "a new claim");
            session.holds += u32::from(matches!(outcome, Outcome::Granted(_)));
        }
        outcome
    }

    /// The answer to a claim `token` does not hold on `name`.
    fn not_holder(&self, name: &str) -> Outcome {
        let holder = self.locks.get(name).map(|l| view_of(l.first()));
        Outcome::Rejected(Reject::NotHolder { name: name.to_owned(), holder })
    }

    fn release(&mut self, name: &str, token: Token, applied: &mut Applied) -> Outcome {
        match self.locks.get(name).and_then(|l| l.held_by(token).map(|i| l.holders[i].fence)) {
            Some(fence) => {
                self.end_hold(name, fence, &BTreeSet::new(), false, applied);
                Outcome::Released { name: name.to_owned(), fence }
            }
            None => self.not_holder(name),
        }
    }

    /// Renews for `ttl_ms`, or for the hold's own TTL if `None`.
    fn renew(&mut self, name: &str, token: Token, ttl_ms: Option<u64>) -> Outcome {
        if let Some(ttl_ms) = ttl_ms.filter(|ttl| !(limits::TTL_MS_MIN..=limits::TTL_MS_MAX).contains(ttl)) {
            return Outcome::Rejected(Reject::InvalidTtl(ttl_ms));
        }
        let (at, index) = (self.now_ms, self.applied_index);
        let Some((lock, i)) = lock_mut(&mut self.locks, name).and_then(|l| l.held_by(token).map(|i| (l, i))) else {
            return self.not_holder(name);
        };
        let holder = &mut lock.holders[i];
        match holder.lease {
            Lease::Session(_) => Outcome::Rejected(Reject::SessionHold { name: name.to_owned() }),
            Lease::Delayed { .. } => unreachable!("an expired hold is nobody's"),
            // Once the advertised end has passed, the holder (counting from when it sent its last
            // request) already considers the lock lost; reviving it would make its view disagree.
            Lease::Ttl { expires_at_ms, .. } if at >= expires_at_ms => {
                Outcome::Rejected(Reject::Expired { name: name.to_owned() })
            }
            Lease::Ttl { ttl_ms: held, .. } => {
                let ttl_ms = ttl_ms.unwrap_or(held);
                holder.lease = Lease::Ttl { ttl_ms, expires_at_ms: at.saturating_add(ttl_ms) };
                let grant = grant_of(name, holder);
                lock.revision = index;
                Outcome::Renewed(grant)
            }
        }
    }

    /// The holder `token` of `name` publishes `value`. A TTL hold past its advertised end is refused, as
    /// its renewal is: its holder already counts it lost.
    fn set_value(&mut self, name: &str, token: Token, value: &[u8]) -> Outcome {
        if value.len() > limits::VALUE_LEN_MAX {
            return Outcome::Rejected(Reject::ValueTooLong(value.len()));
        }
        let (at, index) = (self.now_ms, self.applied_index);
        let Some((lock, i)) = lock_mut(&mut self.locks, name).and_then(|l| l.held_by(token).map(|i| (l, i))) else {
            return self.not_holder(name);
        };
        let holder = &mut lock.holders[i];
        if holder.lease.expires_at_ms().is_some_and(|end| at >= end) {
            return Outcome::Rejected(Reject::Expired { name: name.to_owned() });
        }
        holder.value = value.to_vec();
        let grant = grant_of(name, holder);
        lock.revision = index;
        Outcome::ValueSet(grant)
    }

    fn cancel(&mut self, name: &str, token: Token, applied: &mut Applied) -> Outcome {
        let index = self.applied_index;
        let Some(lock) = lock_mut(&mut self.locks, name) else {
            return self.not_holder(name);
        };
        if lock.held_by(token).is_some() {
            return self.release(name, token, applied);
        }
        let Some(i) = lock.waiters.iter().position(|w| w.token == token) else {
            return self.not_holder(name);
        };
        let waiter = lock.waiters.remove(i).expect("position is in range");
        lock.revision = index;
        if let Some(id) = waiter.session {
            self.sessions.get_mut(&id).expect("a claim's session is open").claims.remove(name);
        }
        applied.dropped.push((name.to_owned(), token));
        Outcome::Withdrawn
    }

    fn open_session(
        &mut self,
        id: SessionId,
        owner: &str,
        lease_ms: u64,
        secret: Option<SecretDigest>,
        sessions_max: u64,
    ) -> Outcome {
        if !limits::valid_owner(owner) {
            return Outcome::Rejected(Reject::InvalidOwner);
        }
        if !(limits::TTL_MS_MIN..=limits::TTL_MS_MAX).contains(&lease_ms) {
            return Outcome::Rejected(Reject::InvalidTtl(lease_ms));
        }
        if self.sessions.contains_key(&id) {
            return Outcome::Rejected(Reject::SessionExists(id));
        }
        if self.sessions.len() as u64 >= sessions_max {
            return Outcome::Rejected(Reject::TooManySessions { max: sessions_max });
        }
        let session = Session {
            owner: owner.to_owned(),
            lease_ms,
            opened_at_ms: self.now_ms,
            claims: Claims::default(),
            holds: 0,
            secret,
        };
        self.sessions.insert(id, Arc::new(session));
        Outcome::SessionOpened { id }
    }

    /// Ends session `id`, handing over its locks (or, if its lease `expired`, beginning the lock-delays its
    /// holds asked for). False if it was not open.
    fn close_session(
        &mut self,
        id: SessionId,
        ending: &BTreeSet<SessionId>,
        expired: bool,
        applied: &mut Applied,
    ) -> bool {
        let Some(claims) = self.sessions.get(&id).map(|s| s.claims.clone()) else {
            return false;
        };
        let index = self.applied_index;
        for name in &claims {
            let lock = lock_mut(&mut self.locks, name).expect("a session's claim names an existing lock");
            if let Some(i) = lock.session_place(id) {
                let fence = lock.holders[i].fence;
                self.end_hold(name, fence, ending, expired, applied);
            } else {
                let i = lock.waiters.iter().position(|w| w.session == Some(id));
                let waiter = lock.waiters.remove(i.expect("a claim that is not a hold is a wait"));
                lock.revision = index;
                applied.dropped.push((name.clone(), waiter.expect("in range").token));
            }
        }
        self.sessions.remove(&id);
        true
    }

    fn expire(&mut self, expire: &Expire, applied: &mut Applied) -> Outcome {
        if expire.len() > limits::EXPIRE_BATCH_MAX {
            return Outcome::Rejected(Reject::BatchTooLarge(expire.len()));
        }
        let (at, index) = (self.now_ms, self.applied_index);
        // Sessions that end in this entry must not be handed a lock in it: closing them would end that
        // hold again and grant the next waiter the same fence.
        let ending: BTreeSet<SessionId> =
            expire.sessions.iter().copied().filter(|id| self.sessions.contains_key(id)).collect();
        let (mut locks, mut waiters, mut sessions) = (0, 0, 0);
        for (name, fence) in &expire.locks {
            let lock = self.locks.get(name);
            let Some(lease) = lock.and_then(|l| l.place(*fence).map(|i| l.holders[i].lease)) else {
                continue;
            };
            let ended = match lease {
                Lease::Ttl { expires_at_ms, .. } if at >= expires_at_ms => {
                    self.end_hold(name, *fence, &ending, true, applied);
                    true
                }
                // Left as it is if the entry granted the lock already: the next `Expire` frees it.
                Lease::Delayed { free_at_ms } if at >= free_at_ms => self.free_place(name, *fence, &ending, applied),
                _ => false,
            };
            locks += usize::from(ended);
        }
        for (name, token) in &expire.waiters {
            let Some(lock) = lock_mut(&mut self.locks, name) else {
                continue;
            };
            let due = lock.waiters.iter().position(|w| w.session.is_none() && w.token == *token);
            if let Some(i) = due {
                lock.waiters.remove(i);
                lock.revision = index;
                applied.dropped.push((name.clone(), *token));
                waiters += 1;
            }
        }
        for id in &expire.sessions {
            if self.close_session(*id, &ending, true, applied) {
                sessions += 1;
            }
        }
        Outcome::Expired { locks, waiters, sessions }
    }

    /// Ends the hold on `name` with `fence`. If it `expired` and asked for a lock-delay, its place stays
    /// ungranted until the delay has passed, the waiters in their places; else the place goes to the first
    /// waiter still waiting, in this same entry ([`LockState::free_place`]).
    fn end_hold(&mut self, name: &str, fence: u64, ending: &BTreeSet<SessionId>, expired: bool, applied: &mut Applied) {
        let (at, index) = (self.now_ms, self.applied_index);
        let lock = lock_mut(&mut self.locks, name).expect("ending a hold on an existing lock");
        let holder = lock.place(fence).map(|i| &mut lock.holders[i]).expect("ending an existing hold");
        let session = match holder.lease {
            Lease::Session(id) => Some(id),
            _ => None,
        };
        applied.ended.push(Ended { name: name.to_owned(), fence, session });
        if let Some(id) = session {
            let session = self.sessions.get_mut(&id).expect("a holder's session is open");
            session.claims.remove(name);
            session.holds -= 1;
        }
        let delay = holder.lock_delay_ms;
        if expired && delay > 0 {
            // What the holder published goes with it: nobody leads a lock in its delay.
            holder.lease = Lease::Delayed { free_at_ms: at.saturating_add(delay) };
            holder.value = Vec::new();
            lock.revision = index;
            applied.delayed.push((name.to_owned(), fence, delay));
            return;
        }
        if !self.free_place(name, fence, ending, applied) {
            // A semaphore granted by this entry already: its next `Expire` hands this place over.
            let lock = lock_mut(&mut self.locks, name).expect("still there");
            let holder = lock.place(fence).map(|i| &mut lock.holders[i]).expect("still there");
            holder.lease = Lease::Delayed { free_at_ms: at };
            holder.value = Vec::new();
            lock.revision = index;
            applied.delayed.push((name.to_owned(), fence, 0));
        }
    }

    /// Frees the place of `name` held (or kept by a lock-delay) under `fence`, and grants it to the first
    /// waiter still waiting (dropping the ones whose wait ran out or whose session ends in this entry);
    /// removes the lock if that was its last place. False, changing nothing, if the entry granted the lock
    /// already and someone waits: a second grant would share the entry's index as its fence.
    fn free_place(&mut self, name: &str, fence: u64, ending: &BTreeSet<SessionId>, applied: &mut Applied) -> bool {
        let (at, index) = (self.now_ms, self.applied_index);
        let lock = lock_mut(&mut self.locks, name).expect("freeing a place of an existing lock");
        if !lock.waiters.is_empty() && lock.granted_in(index) {
            return false;
        }
        let i = lock.place(fence).expect("freeing an existing place");
        lock.holders.remove(i);
        lock.revision = index;
        while let Some(waiter) = lock.waiters.pop_front() {
            if waiter.session.is_none() && waiter.wait_until_ms <= at {
                applied.dropped.push((name.to_owned(), waiter.token));
                continue;
            }
            if let Some(id) = waiter.session.filter(|id| ending.contains(id)) {
                self.sessions.get_mut(&id).expect("a waiter's session is open").claims.remove(name);
                applied.dropped.push((name.to_owned(), waiter.token));
                continue;
            }
            let lease = match waiter.session {
                Some(id) => {
                    self.sessions.get_mut(&id).expect("a waiter's session is open").holds += 1;
                    Lease::Session(id)
                }
                None => Lease::Ttl { ttl_ms: waiter.ttl_ms, expires_at_ms: at.saturating_add(waiter.ttl_ms) },
            };
            let (owner, token, value, lock_delay_ms) = (waiter.owner, waiter.token, waiter.value, waiter.lock_delay_ms);
            let last = lock.holders.last().map_or(0, |h| h.fence);
            assert!(index > last.max(fence), "fences of lock {name:?} went from {} to {index}", last.max(fence));
            lock.holders.push(Holder { owner, token, fence: index, granted_at_ms: at, lease, value, lock_delay_ms });
            applied.grants.push(grant_of(name, lock.holders.last().expect("just pushed")));
            return true;
        }
        if lock.holders.is_empty() {
            self.locks.remove(name);
            self.note_freed(name);
        }
        true
    }

    // --- queries ---

    /// Time of the last applied entry (leader time, ms since the Unix epoch).
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Index of the last entry applied to the lock state.
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    /// The lock called `name`, if held.
    pub fn get(&self, name: &str) -> Option<LockView> {
        self.locks.get(name).map(|lock| lock_view(name, lock))
    }

    /// The revision of `name`: the index of the entry that last changed it. For a lock nobody holds, the
    /// entry that freed it if that was within [`limits::FREED_KEEP_MS`] (and among the last
    /// [`limits::FREED_MAX`] frees); else 0, as for a lock that never existed.
    pub fn revision(&self, name: &str) -> u64 {
        match self.locks.get(name) {
            Some(lock) => lock.revision,
            None => self.freed.get(name).copied().unwrap_or(0),
        }
    }

    /// The highest revision at which a freed lock's revision was forgotten (0: none yet). A lock freed after
    /// this is still remembered; one freed at or before it may read 0 now.
    pub fn forgotten_through(&self) -> u64 {
        self.forgotten_through
    }

    /// Every lock whose name starts with `prefix` and whose revision is above `after`, as it is now (`None`:
    /// freed, and remembered as such), in revision order, at most `limit`: what a watch of the prefix that
    /// last saw `after` has missed. `None` if there are more than `limit`.
    pub fn changed_since(
        &self,
        prefix: &str,
        after: u64,
        limit: usize,
    ) -> Option<Vec<(String, Option<LockView>, u64)>> {
        let under = |map_start: &str| std::ops::Bound::Included(map_start.to_owned());
        let mut changed: Vec<(String, Option<LockView>, u64)> = Vec::new();
        let held = self.locks.range((under(prefix), std::ops::Bound::Unbounded));
        for (name, lock) in held.take_while(|(name, _)| name.starts_with(prefix)) {
            if lock.revision > after {
                changed.push((name.clone(), Some(lock_view(name, lock)), lock.revision));
            }
        }
        let freed = self.freed.range((under(prefix), std::ops::Bound::Unbounded));
        for (name, revision) in freed.take_while(|(name, _)| name.starts_with(prefix)) {
            if *revision > after && !self.locks.contains_key(name) {
                changed.push((name.clone(), None, *revision));
            }
        }
        if changed.len() > limit {
            return None;
        }
        changed.sort_by(|a, b| (a.2, &a.0).cmp(&(b.2, &b.0)));
        Some(changed)
    }

    /// Up to `limit` locks whose names start with `prefix`, after `after` (exclusive), in name order.
    pub fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Vec<LockView> {
        use std::ops::Bound;
        let start = match after {
            Some(after) if after >= prefix => Bound::Excluded(after.to_owned()),
            _ => Bound::Included(prefix.to_owned()),
        };
        self.locks
            .range((start, Bound::Unbounded))
            .take_while(|(name, _)| name.starts_with(prefix))
            .take(limit)
            .map(|(name, lock)| lock_view(name, lock))
            .collect()
    }

    /// Whether anyone holds `name`: cheaper still than [`LockState::holder`].
    pub fn is_held(&self, name: &str) -> bool {
        self.locks.contains_key(name)
    }

    /// Whether every place of `name` is taken (held, or kept by a lock-delay): an acquire of it now would
    /// be busy or queue.
    pub fn is_full(&self, name: &str) -> bool {
        self.locks.get(name).is_some_and(|lock| lock.is_full())
    }

    /// How many may hold `name` at once, if it exists (held or in its lock-delay): an acquire must give the
    /// same.
    pub fn limit(&self, name: &str) -> Option<u32> {
        self.locks.get(name).map(|lock| lock.limit)
    }

    /// Who holds `name` (for a semaphore, its longest-held place), if anyone: a cheaper [`LockState::get`]
    /// when the waiters and the other holders do not matter.
    pub fn holder(&self, name: &str) -> Option<HolderView> {
        self.locks.get(name).map(|lock| view_of(lock.first()))
    }

    /// The hold (or lock-delay) of `name` under `fence`, if it is still there.
    pub fn hold(&self, name: &str, fence: u64) -> Option<HolderView> {
        let lock = self.locks.get(name)?;
        lock.place(fence).map(|i| view_of(&lock.holders[i]))
    }

    /// The grant `token` holds on `name`, if it holds it now.
    pub fn grant(&self, name: &str, token: Token) -> Option<Grant> {
        let lock = self.locks.get(name)?;
        lock.held_by(token).map(|i| grant_of(name, &lock.holders[i]))
    }

    /// Whether `token` is queued for `name`.
    pub fn is_waiting(&self, name: &str, token: Token) -> bool {
        self.locks.get(name).is_some_and(|lock| lock.waiters.iter().any(|w| w.token == token))
    }

    /// Every TTL hold: name, fence, TTL and advertised end. For the leader's lease keeper.
    pub fn ttl_holds(&self) -> impl Iterator<Item = (&str, u64, u64, u64)> + '_ {
        self.locks.iter().flat_map(|(name, lock)| {
            lock.holders.iter().filter_map(move |h| match h.lease {
                Lease::Ttl { ttl_ms, expires_at_ms } => Some((name.as_str(), h.fence, ttl_ms, expires_at_ms)),
                Lease::Session(_) | Lease::Delayed { .. } => None,
            })
        })
    }

    /// Every lock in its lock-delay: name, the fence of the hold that expired, the delay, and when the lock
    /// becomes grantable. For the leader's lease keeper, which proposes the end of each.
    pub fn lock_delays(&self) -> impl Iterator<Item = (&str, u64, u64, u64)> + '_ {
        self.locks.iter().flat_map(|(name, lock)| {
            lock.holders
                .iter()
                .filter_map(move |h| Some((name.as_str(), h.fence, h.lock_delay_ms, h.lease.free_at_ms()?)))
        })
    }

    /// Every waiter without a session: name, token, end of its wait. For the leader's lease keeper.
    pub fn timed_waiters(&self) -> impl Iterator<Item = (&str, Token, u64)> + '_ {
        self.locks.iter().flat_map(|(name, lock)| {
            lock.waiters.iter().filter(|w| w.session.is_none()).map(move |w| (name.as_str(), w.token, w.wait_until_ms))
        })
    }

    /// Every open session with its lease.
    pub fn sessions(&self) -> impl Iterator<Item = (SessionId, u64)> + '_ {
        self.sessions.iter().map(|(id, s)| (*id, s.lease_ms))
    }

    /// Every open session with its lease and how many locks it holds and waits for, as
    /// [`LockState::session_summary`] counts them.
    pub fn session_summaries(&self) -> impl Iterator<Item = (SessionId, u64, usize, usize)> + '_ {
        self.sessions.iter().map(|(id, s)| (*id, s.lease_ms, s.holds as usize, s.claims.len() - s.holds as usize))
    }

    /// Session `id`'s lease, if it is open.
    pub fn session_lease_ms(&self, id: SessionId) -> Option<u64> {
        self.sessions.get(&id).map(|s| s.lease_ms)
    }

    /// The sessions the last command applied opened, closed, or changed the claims of, each at least once
    /// (for [`LockState::apply_each`]'s caller, which may keep what [`LockState::session_summary`] says of
    /// them: a session it does not name still says the same).
    pub fn sessions_changed(&self) -> &[SessionId] {
        self.sessions.changed()
    }

    /// Session `id`'s owner, lease, and how many locks it holds and waits for, if it is open. Cheaper than
    /// [`LockState::session`]: nothing is copied.
    pub fn session_summary(&self, id: SessionId) -> Option<(&str, u64, usize, usize)> {
        let session = self.sessions.get(&id)?;
        let holds = session.holds as usize;
        Some((&session.owner, session.lease_ms, holds, session.claims.len() - holds))
    }

    /// Session `id` and its claims, if it is open.
    pub fn session(&self, id: SessionId) -> Option<SessionView> {
        let session = self.sessions.get(&id)?;
        let mut view = SessionView {
            id,
            owner: session.owner.clone(),
            lease_ms: session.lease_ms,
            secret: session.secret,
            holds: Vec::new(),
            waits: Vec::new(),
        };
        for name in &session.claims {
            let lock = &self.locks[name];
            if let Some(i) = lock.session_place(id) {
                view.holds.push(grant_of(name, &lock.holders[i]));
            } else {
                let i = lock.waiters.iter().position(|w| w.session == Some(id));
                let i = i.expect("a session's claim that is not a hold is a wait");
                view.waits.push(SessionWait {
                    name: name.clone(),
                    token: lock.waiters[i].token,
                    position: i + 1,
                    holder: view_of(lock.first()),
                });
            }
        }
        Some(view)
    }

    /// Locks held (a semaphore counts once, however many hold it), or kept by a lock-delay.
    pub fn lock_count(&self) -> usize {
        self.locks.len()
    }

    /// Waiters queued, over all locks.
    pub fn waiter_count(&self) -> usize {
        self.locks.values().map(|l| l.waiters.len()).sum()
    }

    /// Sessions open.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    // --- snapshot ---

    /// The whole state as bytes; equal states give equal bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        self.write_snapshot(&mut bytes).expect("the lock state always serializes");
        bytes
    }

    /// Writes the bytes of [`LockState::snapshot`] to `out` as they are made, without holding them
    /// all (about 110 bytes per held lock) in memory.
    pub fn write_snapshot<W: std::io::Write>(&self, out: W) -> Result<(), SnapshotError> {
        bincode::serialize_into(out, &(SNAPSHOT_FORMAT, self, SessionSecrets(&self.sessions)))
            .map_err(SnapshotError::Write)
    }

    /// The tenant whose API key has SHA-256 `hash`.
    pub fn key_tenant(&self, hash: &[u8; 32]) -> Option<u64> {
        self.key_tenants.get(hash).copied()
    }

    /// Whether tenant `tenant` has an API key.
    pub fn has_key(&self, tenant: u64) -> bool {
        self.keys.contains_key(&tenant)
    }

    /// Every tenant with an API key, and when the key was made (leader time, ms).
    pub fn keys(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.keys.iter().map(|(tenant, (_, created_at_ms))| (*tenant, *created_at_ms))
    }

    /// Locks that exist (held or waited for) whose names start with `prefix`, counted up to `stop`.
    pub fn count_locks_with_prefix(&self, prefix: &str, stop: usize) -> usize {
        let from = (std::ops::Bound::Included(prefix), std::ops::Bound::Unbounded);
        self.locks.range::<_, str>(from).take_while(|(name, _)| name.starts_with(prefix)).take(stop).count()
    }

    /// Open sessions whose owners start with `prefix`, counted up to `stop`.
    pub fn count_sessions_with_owner_prefix(&self, prefix: &str, stop: usize) -> usize {
        self.sessions.values().filter(|s| s.owner.starts_with(prefix)).take(stop).count()
    }

    /// The state [`LockState::snapshot`] wrote.
    pub fn restore(bytes: &[u8]) -> Result<Self, SnapshotError> {
        Self::read_snapshot(bytes, bytes.len() as u64)
    }

    /// The state [`LockState::snapshot`] wrote, read from `input` as far as its end: whatever follows
    /// is left unread. `len_bytes` is how long the input is: no length inside it may claim more, so a
    /// corrupt length is an error rather than an allocation of that size (bincode's reader sizes its
    /// buffer from the length before it reads).
    pub fn read_snapshot<R: std::io::Read>(mut input: R, len_bytes: u64) -> Result<Self, SnapshotError> {
        use bincode::Options;
        let bounded = || bincode::options().with_fixint_encoding().allow_trailing_bytes().with_limit(len_bytes);
        let format: u32 = bounded().deserialize_from(&mut input)?;
        let mut state = match format {
            SNAPSHOT_FORMAT => bounded().deserialize_from(&mut input)?,
            SNAPSHOT_FORMAT_WITHOUT_SEMAPHORES => {
                let state: before_semaphores::LockState<before_semaphores::Lock5> =
                    bounded().deserialize_from(&mut input)?;
                state.into_current(before_semaphores::into_current)
            }
            SNAPSHOT_FORMAT_WITHOUT_DELAYS => {
                let state: before_semaphores::LockState<before_delays::Lock4> =
                    bounded().deserialize_from(&mut input)?;
                state.into_current(before_delays::into_current)
            }
            SNAPSHOT_FORMAT_WITHOUT_VALUES | SNAPSHOT_FORMAT_WITHOUT_SECRETS => {
                let state: before_values::LockState = bounded().deserialize_from(&mut input)?;
                state.into_current()
            }
            _ => return Err(SnapshotError::Format(format)),
        };
        if format != SNAPSHOT_FORMAT_WITHOUT_SECRETS {
            let secrets: BTreeMap<SessionId, SecretDigest> = bounded().deserialize_from(input)?;
            for (id, secret) in secrets {
                let Some(session) = state.sessions.get_mut(&id) else {
                    return Err(SnapshotError::Decode(Box::new(bincode::ErrorKind::Custom(format!(
                        "a secret for session {id}, which the snapshot does not have"
                    )))));
                };
                session.secret = Some(secret);
            }
        }
        for (name, lock) in &state.locks {
            for id in lock.holders.iter().filter_map(|h| if let Lease::Session(id) = h.lease { Some(id) } else { None })
            {
                let Some(session) = state.sessions.get_mut(&id) else {
                    return Err(SnapshotError::Decode(Box::new(bincode::ErrorKind::Custom(format!(
                        "{name:?} is held by session {id}, which the snapshot does not have"
                    )))));
                };
                session.holds += 1;
            }
        }
        state.sessions.forget_changes();
        Ok(state)
    }

    /// Asserts every structural invariant. O(state): for tests and after restoring a snapshot.
    pub fn check_invariants(&self) {
        assert_eq!(self.keys.len(), self.key_tenants.len(), "every key has one hash and every hash one key");
        for (tenant, (hash, created_at_ms)) in &self.keys {
            assert_eq!(self.key_tenants.get(hash), Some(tenant), "the hash of tenant {tenant:016x} maps back to it");
            assert!(*created_at_ms <= self.now_ms, "keys were made in the past");
        }
        let mut claims: BTreeMap<SessionId, BTreeSet<String>> = BTreeMap::new();
        assert!(self.frees.len() <= limits::FREED_MAX);
        let mut last = (0, 0);
        for (revision, at_ms, _) in &self.frees {
            assert!((*revision, *at_ms) >= last, "frees are in log order");
            assert!(*revision <= self.applied_index && *at_ms <= self.now_ms, "frees are not from the future");
            last = (*revision, *at_ms);
        }
        assert!(self.forgotten_through <= self.applied_index, "nothing forgotten from the future");
        let frees: BTreeSet<(u64, &str)> = self.frees.iter().map(|(r, _, n)| (*r, n.as_str())).collect();
        for (name, revision) in &self.freed {
            assert!(frees.contains(&(*revision, name)), "freed {name:?} at {revision} is among the frees remembered");
        }
        for (name, lock) in &self.locks {
            assert!(limits::valid_name(name), "stored name {name:?} is valid");
            assert!((1..=limits::SEMAPHORE_LIMIT_MAX).contains(&lock.limit), "{name:?}'s limit is valid");
            assert!(
                !lock.holders.is_empty() && lock.holders.len() <= lock.limit as usize,
                "{name:?} has 1..=limit holders"
            );
            assert!(lock.waiters.is_empty() || lock.is_full(), "{name:?} has waiters only with every place taken");
            assert!(lock.holders.windows(2).all(|w| w[0].fence < w[1].fence), "{name:?}'s fences are unique, in order");
            assert!(lock.revision <= self.applied_index, "revision of {name:?} is not from the future");
            let mut tokens = BTreeSet::new();
            for holder in &lock.holders {
                assert!(tokens.insert(holder.token), "tokens on {name:?} are unique");
                assert!(holder.fence <= lock.revision, "revision of {name:?} is at or after its grants");
                assert!(holder.value.len() <= limits::VALUE_LEN_MAX);
                assert!(holder.lock_delay_ms <= limits::LOCK_DELAY_MS_MAX);
                if let Lease::Delayed { free_at_ms } = holder.lease {
                    // A semaphore's place freed in an entry that granted it already waits for the next, with
                    // no delay of its own.
                    assert!(holder.lock_delay_ms > 0 || lock.limit > 1, "only a hold with a lock-delay leaves one");
                    assert!(free_at_ms <= self.now_ms + holder.lock_delay_ms, "{name:?}'s delay began in the past");
                    assert!(holder.value.is_empty(), "a place in its delay publishes nothing");
                }
                if let Lease::Session(id) = holder.lease {
                    assert!(claims.entry(id).or_default().insert(name.clone()), "a session holds once per lock");
                }
            }
            assert!(lock.waiters.len() <= limits::WAITERS_PER_LOCK_MAX);
            for w in &lock.waiters {
                assert!(tokens.insert(w.token), "tokens on {name:?} are unique");
                assert!(w.lock_delay_ms <= limits::LOCK_DELAY_MS_MAX);
                assert!(w.queued_at_ms <= self.now_ms, "waiters on {name:?} were queued in the past");
            }
            for id in lock.waiters.iter().filter_map(|w| w.session) {
                assert!(claims.entry(id).or_default().insert(name.clone()), "a session waits once per lock");
            }
        }
        for (id, session) in self.sessions.iter() {
            let found: Claims = claims.remove(id).unwrap_or_default().into_iter().collect();
            assert_eq!(found, session.claims, "session {id}'s claims match the locks");
            let holds = found.iter().filter(|name| self.locks[*name].session_place(*id).is_some()).count();
            assert_eq!(session.holds as usize, holds, "session {id} counts its holds");
        }
        assert!(claims.is_empty(), "every claimed session is open: {claims:?}");
    }
}

fn grant_of(name: &str, h: &Holder) -> Grant {
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

fn view_of(h: &Holder) -> HolderView {
    HolderView {
        owner: h.owner.clone(),
        fence: h.fence,
        granted_at_ms: h.granted_at_ms,
        lease: h.lease,
        value: h.value.clone(),
    }
}

fn lock_view(name: &str, lock: &Lock) -> LockView {
    LockView {
        name: name.to_owned(),
        holder: view_of(lock.first()),
        holders: lock.holders.iter().map(view_of).collect(),
        limit: lock.limit,
        waiters: lock
            .waiters
            .iter()
            .map(|w| WaiterView { owner: w.owner.clone(), queued_at_ms: w.queued_at_ms, session: w.session })
            .collect(),
        revision: lock.revision,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields of [`LockState`] as builds before the persistent maps kept them (ordered maps), each lock
    /// encoded as `L`: the lock itself, or the shape an older snapshot format gave it.
    #[derive(Serialize)]
    struct OrderedMaps<'a, L> {
        locks: BTreeMap<&'a String, L>,
        sessions: BTreeMap<&'a SessionId, &'a Session>,
        keys: &'a BTreeMap<u64, ([u8; 32], u64)>,
        key_tenants: &'a BTreeMap<[u8; 32], u64>,
        freed: BTreeMap<&'a String, &'a u64>,
        frees: Vec<&'a (u64, u64, String)>,
        forgotten_through: u64,
        now_ms: u64,
        applied_index: u64,
    }

    impl<'a, L> OrderedMaps<'a, L> {
        fn of(state: &'a LockState, lock: impl Fn(&'a Lock) -> L) -> Self {
            OrderedMaps {
                locks: state.locks.iter().map(|(name, l)| (name, lock(l))).collect(),
                sessions: state.sessions.iter().map(|(id, session)| (id, &**session)).collect(),
                keys: &state.keys,
                key_tenants: &state.key_tenants,
                freed: state.freed.iter().collect(),
                frees: state.frees.iter().collect(),
                forgotten_through: state.forgotten_through,
                now_ms: state.now_ms,
                applied_index: state.applied_index,
            }
        }
    }

    /// The secret digests a snapshot of a state with session 7 ([`open_session_7`]) carries after it.
    fn secrets_of_7() -> BTreeMap<SessionId, SecretDigest> {
        BTreeMap::from([(7u64, SessionSecret(Token(5)).digest())])
    }

    /// Session 7 open; "a" held by token 1 with session 7 waiting; "b" taken and released at 9.
    fn state_for_older_formats() -> LockState {
        let mut state = LockState::new();
        let commands = [open_session_7(), acquire("a", 1, None), acquire("a", 2, Some(7)), acquire("b", 3, None)];
        for (i, cmd) in commands.into_iter().enumerate() {
            state.apply(i as u64 + 1, &Entry { at_ms: 1_000 + i as u64, cmd });
        }
        state.apply(9, &Entry { at_ms: 2_000, cmd: Command::Release { name: "b".into(), token: Token(3) } });
        state
    }

    /// An acquire of `name` by owner `w`, waiting up to a minute if it is held.
    fn acquire(name: &str, token: u128, session: Option<SessionId>) -> Command {
        Command::Acquire(Acquire {
            name: name.into(),
            owner: "w".into(),
            token: Token(token),
            ttl_ms: 5_000,
            wait_ms: 60_000,
            session,
        })
    }

    /// Session 7 opened with secret 5.
    fn open_session_7() -> Command {
        Command::OpenSession { id: 7, owner: "s".into(), lease_ms: 2_000, secret: SessionSecret(Token(5)).digest() }
    }

    #[test]
    fn a_snapshot_has_the_bytes_ordered_maps_gave_it() {
        let mut state = LockState::new();
        let commands = [
            open_session_7(),
            Command::CreateKey { tenant: 3, hash: [9; 32] },
            acquire("b", 1, None),
            acquire("a", 2, Some(7)),
            acquire("b", 3, Some(7)),
            acquire("c", 4, None),
        ];
        for (i, cmd) in commands.into_iter().enumerate() {
            state.apply(i as u64 + 1, &Entry { at_ms: 1_000 + i as u64, cmd });
        }
        assert_eq!((state.lock_count(), state.session_count()), (3, 1));
        let earlier = OrderedMaps::of(&state, |lock| lock);
        assert_eq!(state.snapshot(), bincode::serialize(&(SNAPSHOT_FORMAT, &earlier, secrets_of_7())).unwrap());
    }

    #[test]
    fn a_snapshot_written_and_read_as_a_stream_is_the_same_snapshot() {
        let mut state = LockState::new();
        let open = open_session_7();
        state.apply(1, &Entry { at_ms: 1_000, cmd: open });
        let mut written = Vec::new();
        state.write_snapshot(&mut written).unwrap();
        assert_eq!(written, state.snapshot());

        // Read from a stream, a snapshot ends where its state does: what follows stays unread.
        written.extend_from_slice(b"after");
        let mut input = written.as_slice();
        let read = LockState::read_snapshot(&mut input, written.len() as u64).unwrap();
        assert_eq!(read, state);
        assert_eq!(input, b"after");

        let mut other_format = state.snapshot();
        other_format[0] ^= 0x10;
        let refused = LockState::read_snapshot(other_format.as_slice(), other_format.len() as u64);
        assert!(matches!(refused, Err(SnapshotError::Format(f)) if f == SNAPSHOT_FORMAT ^ 0x10));
        let cut = &state.snapshot()[..10];
        assert!(matches!(LockState::read_snapshot(cut, 10), Err(SnapshotError::Decode(_))));
    }

    /// A snapshot of format 3 (no values, revisions or freed locks) restores: every lock with an empty
    /// value, its revision the snapshot's index; and one of format 2, without the sessions' secrets.
    #[test]
    fn snapshots_of_formats_3_and_2_restore_with_revisions_at_their_index() {
        let state = state_for_older_formats();
        // Format 3's encoding: each lock its holder and waiters, without values or revisions.
        #[derive(Serialize)]
        struct Format3<'a> {
            locks: BTreeMap<&'a String, (OldHolder<'a>, Vec<OldWaiter<'a>>)>,
            sessions: BTreeMap<&'a SessionId, &'a Session>,
            keys: &'a BTreeMap<u64, ([u8; 32], u64)>,
            key_tenants: &'a BTreeMap<[u8; 32], u64>,
            now_ms: u64,
            applied_index: u64,
        }
        #[derive(Serialize)]
        struct OldHolder<'a>(&'a String, Token, u64, u64, Lease);
        #[derive(Serialize)]
        struct OldWaiter<'a>(&'a String, Token, u64, u64, u64, Option<SessionId>);
        let old = Format3 {
            locks: state
                .locks
                .iter()
                .map(|(name, lock)| {
                    let h = lock.first();
                    let holder = OldHolder(&h.owner, h.token, h.fence, h.granted_at_ms, h.lease);
                    let waiters = lock
                        .waiters
                        .iter()
                        .map(|w| OldWaiter(&w.owner, w.token, w.ttl_ms, w.queued_at_ms, w.wait_until_ms, w.session))
                        .collect();
                    (name, (holder, waiters))
                })
                .collect(),
            sessions: state.sessions.iter().map(|(id, session)| (id, &**session)).collect(),
            keys: &state.keys,
            key_tenants: &state.key_tenants,
            now_ms: state.now_ms,
            applied_index: state.applied_index,
        };
        let bytes = bincode::serialize(&(SNAPSHOT_FORMAT_WITHOUT_VALUES, &old, secrets_of_7())).unwrap();
        let restored = LockState::restore(&bytes).expect("format 3 restores");
        restored.check_invariants();
        let mut expected = state.clone();
        lock_mut(&mut expected.locks, "a").expect("held").revision = 9;
        expected.freed = OrdMap::new();
        expected.frees = Vector::new();
        assert_eq!(restored, expected);
        assert_eq!(state.revision("a"), 3, "a waiter joined at 3");
        assert_eq!((restored.revision("a"), restored.revision("b")), (9, 0), "b was freed before the snapshot");

        // Format 2: the same state without the secrets that follow it.
        let bytes = bincode::serialize(&(SNAPSHOT_FORMAT_WITHOUT_SECRETS, &old)).unwrap();
        let restored = LockState::restore(&bytes).expect("format 2 restores");
        restored.check_invariants();
        let view = state.session(7).expect("open");
        assert_eq!(restored.session(7), Some(SessionView { secret: None, ..view }));
    }

    #[test]
    fn a_snapshot_of_format_4_restores_with_no_lock_delays() {
        let state = state_for_older_formats();
        // Format 4's encoding: holders and waiters without their lock-delays.
        #[derive(Serialize)]
        struct OldHolder<'a>(&'a String, Token, u64, u64, Lease, &'a Vec<u8>);
        #[derive(Serialize)]
        struct OldWaiter<'a>(&'a String, Token, u64, u64, u64, Option<SessionId>, &'a Vec<u8>);
        let old = OrderedMaps::of(&state, |lock| {
            let h = lock.first();
            let holder = OldHolder(&h.owner, h.token, h.fence, h.granted_at_ms, h.lease, &h.value);
            let waiters: Vec<OldWaiter> = (lock.waiters.iter())
                .map(|w| OldWaiter(&w.owner, w.token, w.ttl_ms, w.queued_at_ms, w.wait_until_ms, w.session, &w.value))
                .collect();
            (holder, waiters, lock.revision)
        });
        let bytes = bincode::serialize(&(SNAPSHOT_FORMAT_WITHOUT_DELAYS, &old, secrets_of_7())).unwrap();
        let restored = LockState::restore(&bytes).expect("format 4 restores");
        restored.check_invariants();
        assert_eq!(restored, state, "the same state, every hold and waiter without a lock-delay");
        assert_eq!(restored.revision("b"), 9, "the free of b is remembered");
    }

    #[test]
    fn a_snapshot_of_format_5_restores_with_every_lock_of_one_holder() {
        let state = state_for_older_formats();
        // Format 5's encoding: each lock its one holder, its waiters and its revision; no limit.
        let old = OrderedMaps::of(&state, |lock| (lock.first(), &lock.waiters, lock.revision));
        let bytes = bincode::serialize(&(SNAPSHOT_FORMAT_WITHOUT_SEMAPHORES, &old, secrets_of_7())).unwrap();
        let restored = LockState::restore(&bytes).expect("format 5 restores");
        restored.check_invariants();
        assert_eq!(restored, state, "the same state, every lock of limit 1");
        assert_eq!(restored.get("a").map(|view| (view.limit, view.holders.len())), Some((1, 1)));
    }

    #[test]
    fn a_length_in_a_snapshot_longer_than_the_snapshot_is_an_error_not_an_allocation() {
        // The format, then no locks... as the first map's length, 2^60 entries; then a string length of
        // 2^60 bytes where the first lock's name would be. Unbounded, bincode's reader would size a buffer
        // of that length before reading it, and the allocation would abort the process.
        let mut bytes = SNAPSHOT_FORMAT.to_le_bytes().to_vec();
        bytes.extend_from_slice(&(1u64 << 60).to_le_bytes());
        bytes.extend_from_slice(&(1u64 << 60).to_le_bytes());
        let refused = LockState::read_snapshot(bytes.as_slice(), bytes.len() as u64);
        assert!(matches!(refused, Err(SnapshotError::Decode(_))), "{refused:?}");
    }
}
