//! What the Raft log carries.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A session's public id, made by the leader before it proposes [`Command::OpenSession`]. Reads show it
/// (who holds a lock); it gives no power over the session: resuming one takes its [`SessionSecret`].
pub type SessionId = u64;

/// The secret that proves a claim (a holder or a waiter). Made by the leader from a random source before
/// it proposes, so every replica stores the same value.
///
/// Equality takes the same time whatever the values: whether a presented token matches a holder's must
/// not leak through timing how many of its bits do.
// Hash is derived: it hashes the one field, which agrees with this equality (equal exactly when the
// values are).
#[allow(clippy::derived_hash_with_manual_eq)]
#[derive(Clone, Copy, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Token(pub u128);

impl PartialEq for Token {
    fn eq(&self, other: &Self) -> bool {
        // No early exit: fold every bit of the difference, then compare once. `black_box` keeps the
        // compiler from turning this back into a comparison that may stop early.
        std::hint::black_box(self.0 ^ other.0) == 0
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for Token {
    // Tokens are secrets: debug output (and so logs) shows only a prefix.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({:08x}…)", (self.0 >> 96) as u32)
    }
}

/// The secret that proves a session: `Resume` needs it. 128 random bits made by the leader before it
/// proposes [`Command::OpenSession`], sent to the opener in `Opened` and nowhere else. The log and the
/// snapshot carry only its [`SecretDigest`], so neither a replica's files nor a snapshot sent to a
/// follower give a session away.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSecret(pub Token);

impl SessionSecret {
    /// What the replicated state keeps of the secret: its SHA-256. A plain hash is enough for 128 random
    /// bits (nothing to guess by trying), as for API keys.
    pub fn digest(&self) -> SecretDigest {
        SecretDigest(Sha256::digest(self.0 .0.to_be_bytes()).into())
    }
}

impl fmt::Display for SessionSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for SessionSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionSecret(..)")
    }
}

impl FromStr for SessionSecret {
    type Err = BadToken;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(SessionSecret)
    }
}

/// The SHA-256 of a [`SessionSecret`], as the log, the lock state and its snapshots keep it. Compared in
/// constant time, like tokens.
#[allow(clippy::derived_hash_with_manual_eq)]
#[derive(Clone, Copy, Eq, Hash, Serialize, Deserialize)]
pub struct SecretDigest(pub [u8; 32]);

impl PartialEq for SecretDigest {
    fn eq(&self, other: &Self) -> bool {
        let diff = self.0.iter().zip(&other.0).fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(diff) == 0
    }
}

impl fmt::Debug for SecretDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretDigest(..)")
    }
}

/// A token is 32 lowercase or uppercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a token is 32 hex digits")]
pub struct BadToken;

impl FromStr for Token {
    type Err = BadToken;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(BadToken);
        }
        u128::from_str_radix(s, 16).map(Token).map_err(|_| BadToken)
    }
}

/// One log entry: a command and the leader's wall-clock stamp, in milliseconds since the Unix epoch.
///
/// Apply uses `max(at_ms, the previous entry's time)` as the entry's time, so time never runs backwards
/// even when two proposals are stamped and appended in a different order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The leader's stamp.
    pub at_ms: u64,
    /// What to do.
    pub cmd: Command,
}

/// A change to the lock state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Take a lock, or queue for it.
    Acquire(Acquire),
    /// Let go of a TTL hold; the next live waiter is granted in the same entry. A session's hold is refused
    /// (`SessionHold`): a session lets go with `Cancel` through its own stream.
    Release { name: String, token: Token },
    /// Extend a TTL-leased hold to `at + ttl_ms`.
    Renew { name: String, token: Token, ttl_ms: u64 },
    /// Withdraw a claim: leave the queue, or let go if it was granted meanwhile.
    Cancel { name: String, token: Token },
    /// Open a session whose claims live as long as its lease is kept alive by heartbeats, as written by
    /// builds from before [`SessionSecret`]s. Such a session has no secret and cannot be resumed. Kept so
    /// that stored logs still decode; no build proposes it any more.
    OpenSessionWithoutSecret { id: SessionId, owner: String, lease_ms: u64 },
    /// End a session cleanly: its locks are handed over at once, its waits withdrawn.
    CloseSession { id: SessionId },
    /// Leases the leader found run out.
    Expire(Expire),
    /// An API key for tenant `tenant`, stored as the SHA-256 `hash` of the key (the key itself is never in
    /// the log).
    CreateKey { tenant: u64, hash: [u8; 32] },
    /// Tenant `tenant`'s key stops working; its names and owners remain until their holds end.
    RevokeKey { tenant: u64 },
    /// Several one-lock commands (`Acquire`, `Release`, `Renew`, `Cancel`), each on a different lock,
    /// applied in order at the entry's time: the leader proposes the commands that queued up while the log
    /// was busy as one entry, so that one append, one flush and one round trip serve them all. Every grant
    /// they make carries the entry's index as its fence, as the grants of one `Expire` do; no lock is
    /// granted twice in one entry, so each lock's fences still strictly grow. See
    /// [`Command::batchable`] and [`limits::BATCH_MAX`](crate::limits::BATCH_MAX).
    Batch(Vec<Command>),
    /// Extend a TTL-leased hold by its own TTL, as the hold has it when the entry applies: a renew that
    /// names no TTL. The leader cannot fill in the TTL when it proposes: its applied state may not hold
    /// the grant yet (a new leader still applying its predecessor's entries), and a TTL read from there
    /// would be wrong. (After the others, so that the variants before it keep their encoding in stored
    /// logs.)
    RenewKeepingTtl { name: String, token: Token },
    /// A [`Command::Batch`] in which a lock may appear more than once: per lock, at most one command that
    /// is not an `Acquire`, before that lock's acquires. So a lock still gets at most one grant in the
    /// entry (a release hands over or frees it, then the first acquire can take it only if it is free, and
    /// the others queue), and each lock's fences still strictly grow. The leader makes one when a crowd
    /// waits for a lock: the holder's release and the acquires that will queue behind it travel in one
    /// entry, one flush and one round trip per hand-over instead of two. Its own variant, after
    /// `RenewKeepingTtl`, so that a build that does not know it refuses the entry instead of applying it
    /// with the batch rule. See [`limits::BATCH_MAX`](crate::limits::BATCH_MAX).
    Group(Vec<Command>),
    /// Open a session whose claims live as long as its lease is kept alive by heartbeats; resuming it
    /// takes the secret whose digest is `secret`. Refused past
    /// [`limits::SESSIONS_MAX_BEFORE`](crate::limits::SESSIONS_MAX_BEFORE) open sessions. Written by builds
    /// from before [`Command::OpenSessionCapped`]; kept so that stored logs still decode and apply as they
    /// did. (After `Group`, so that the variants before it keep their encoding in stored logs.)
    OpenSession { id: SessionId, owner: String, lease_ms: u64, secret: SecretDigest },
    /// Take a lock, or queue for it, as [`Command::Acquire`] does, with a value the grant publishes (an
    /// elected leader's address): reads show it beside the holder until the holder changes it or lets go.
    /// At most [`limits::VALUE_LEN_MAX`](crate::limits::VALUE_LEN_MAX) bytes. A plain `Acquire` is an
    /// acquire with an empty value. (After `OpenSession`, so that the variants before it keep their
    /// encoding in stored logs.)
    AcquireValued { acquire: Acquire, value: Vec<u8> },
    /// The holder `token` of `name` publishes `value` in place of the lock's value: the fence stays, the
    /// lock's revision moves to this entry.
    SetValue { name: String, token: Token, value: Vec<u8> },
    /// Take a lock, or queue for it, as [`Command::AcquireValued`] does, with a lock-delay: if the grant
    /// ends by expiry (its TTL ran out, or its session's lease did), nobody is granted the lock for
    /// `lock_delay_ms` of log time after that expiry; a clean release or session close frees it at once.
    /// At most [`limits::LOCK_DELAY_MS_MAX`](crate::limits::LOCK_DELAY_MS_MAX). Proposed only with a
    /// nonzero delay. (After `SetValue`, so that the variants before it keep their encoding in stored logs.)
    AcquireDelayed { acquire: Acquire, value: Vec<u8>, lock_delay_ms: u64 },
    /// Take one of `limit` places of a semaphore, or queue for one, as [`Command::AcquireDelayed`] does
    /// (a `lock_delay_ms` of 0: none): up to `limit` holders at once, each with its own token and fence.
    /// Every acquirer of a name must give the lock's limit while anyone holds or waits for it
    /// ([`Reject::LimitMismatch`](crate::Reject::LimitMismatch)). `limit` is 2 to
    /// [`limits::SEMAPHORE_LIMIT_MAX`](crate::limits::SEMAPHORE_LIMIT_MAX); proposed only above 1 (the
    /// other acquires have a limit of 1). (After `AcquireDelayed`, so that the variants before it keep
    /// their encoding in stored logs.)
    AcquireSemaphore { acquire: Acquire, value: Vec<u8>, lock_delay_ms: u64, limit: u32 },
    /// Open a session as [`Command::OpenSession`] does, refused if `sessions_max` sessions are open already.
    /// The limit travels in the entry, so every replica, whatever build replays the entry, applies the limit
    /// it was proposed under: `OpenSession` entries keep the limit of the builds that wrote them
    /// ([`limits::SESSIONS_MAX_BEFORE`](crate::limits::SESSIONS_MAX_BEFORE)), and raising
    /// [`limits::SESSIONS_MAX`](crate::limits::SESSIONS_MAX) changes only entries proposed after it. The
    /// leader proposes this one. (After `AcquireSemaphore`, so that the variants before it keep their
    /// encoding in stored logs.)
    OpenSessionCapped { id: SessionId, owner: String, lease_ms: u64, secret: SecretDigest, sessions_max: u64 },
}

impl Command {
    /// The lock a one-lock command acts on; `None` for the others.
    pub fn lock_name(&self) -> Option<&str> {
        match self {
            Command::Acquire(Acquire { name, .. })
            | Command::AcquireValued { acquire: Acquire { name, .. }, .. }
            | Command::AcquireDelayed { acquire: Acquire { name, .. }, .. }
            | Command::AcquireSemaphore { acquire: Acquire { name, .. }, .. }
            | Command::SetValue { name, .. }
            | Command::Release { name, .. }
            | Command::Renew { name, .. }
            | Command::RenewKeepingTtl { name, .. }
            | Command::Cancel { name, .. } => Some(name),
            _ => None,
        }
    }

    /// Whether the command may travel inside a [`Command::Batch`] or [`Command::Group`]: it acts on exactly
    /// one lock.
    pub fn batchable(&self) -> bool {
        self.lock_name().is_some()
    }

    /// Whether the command is an `Acquire`: in a [`Command::Group`], a lock's acquires may follow one
    /// other command on it.
    pub fn is_acquire(&self) -> bool {
        self.acquire().is_some()
    }

    /// The acquire an [`Command::Acquire`], [`Command::AcquireValued`], [`Command::AcquireDelayed`] or
    /// [`Command::AcquireSemaphore`] makes, with the value its grant publishes (empty for a plain
    /// `Acquire`).
    pub fn acquire(&self) -> Option<(&Acquire, &[u8])> {
        match self {
            Command::Acquire(acquire) => Some((acquire, &[])),
            Command::AcquireValued { acquire, value }
            | Command::AcquireDelayed { acquire, value, .. }
            | Command::AcquireSemaphore { acquire, value, .. } => Some((acquire, value)),
            _ => None,
        }
    }

    /// The lock-delay an acquire asks for (0: none, and for every other command).
    pub fn lock_delay_ms(&self) -> u64 {
        match self {
            Command::AcquireDelayed { lock_delay_ms, .. } | Command::AcquireSemaphore { lock_delay_ms, .. } => {
                *lock_delay_ms
            }
            _ => 0,
        }
    }

    /// How many may hold the lock an acquire asks for at once: its semaphore's limit, 1 for a lock (and for
    /// every other command).
    pub fn limit(&self) -> u32 {
        match self {
            Command::AcquireSemaphore { limit, .. } => *limit,
            _ => 1,
        }
    }
}

/// Take a lock named `name`, or queue for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acquire {
    pub name: String,
    /// Who asks, for people reading the state; not an identity.
    pub owner: String,
    /// The claim's secret.
    pub token: Token,
    /// For a claim without a session: how long the grant lasts unless renewed. Ignored with a session.
    pub ttl_ms: u64,
    /// 0: answer busy if held. Otherwise queue, and give up the place after `wait_ms`; a session's waiter
    /// waits (whatever the nonzero value) as long as the session lives.
    pub wait_ms: u64,
    /// The session that owns the claim, if any.
    pub session: Option<SessionId>,
}

/// What the leader found run out. Apply re-checks every item: one that was renewed, released or
/// re-granted meanwhile is left alone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expire {
    /// TTL holds, by name and the fence of the grant that ran out.
    pub locks: Vec<(String, u64)>,
    /// Waiters without a session the leader found gone, by name and token: their wait ran out, or the node
    /// serving their request stopped keeping them alive (it crashed, or the client went away). A session's
    /// waiter is never removed this way: it goes with its session.
    pub waiters: Vec<(String, Token)>,
    /// Sessions whose lease ran out on the leader.
    pub sessions: Vec<SessionId>,
}

impl Expire {
    /// Whether there is nothing to expire.
    pub fn is_empty(&self) -> bool {
        self.locks.is_empty() && self.waiters.is_empty() && self.sessions.is_empty()
    }

    /// Items carried.
    pub fn len(&self) -> usize {
        self.locks.len() + self.waiters.len() + self.sessions.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_round_trips_and_hides_in_debug() {
        let t = Token(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        let s = t.to_string();
        assert_eq!(s, "0123456789abcdef0011223344556677");
        assert_eq!(s.parse::<Token>(), Ok(t));
        assert_eq!(s.to_uppercase().parse::<Token>(), Ok(t));
        assert_eq!(format!("{t:?}"), "Token(01234567…)");
        assert_eq!("".parse::<Token>(), Err(BadToken));
        assert_eq!("+123456789abcdef0011223344556677".parse::<Token>(), Err(BadToken));
        assert_eq!("0123456789abcdef00112233445566778".parse::<Token>(), Err(BadToken));
    }

    #[test]
    fn session_secrets_hide_in_debug_and_digests_tell_them_apart() {
        let secret = SessionSecret(Token(0x0123_4567_89ab_cdef_0011_2233_4455_6677));
        assert_eq!(format!("{secret:?}"), "SessionSecret(..)");
        assert_eq!(format!("{:?}", secret.digest()), "SecretDigest(..)");
        assert_eq!(secret.to_string().parse::<SessionSecret>(), Ok(secret));
        assert_eq!(secret.digest(), secret.digest());
        assert_ne!(secret.digest(), SessionSecret(Token(secret.0 .0 ^ 1)).digest());
        assert_ne!(secret.digest().0, secret.0 .0.to_be_bytes().repeat(2)[..32], "a digest, not the secret");
    }
}
