//! Plain Rust views of the server's answers, so that callers never handle generated prost types.
//!
//! Times are the leader's wall clock in milliseconds since the Unix epoch, as the server stamps them; they
//! are for people and logs. A holder decides whether it still holds a lock by its lease (see
//! [`HeldLock::lost`](crate::HeldLock::lost)) or its own TTL arithmetic, never by comparing these
//! stamps with its own clock.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use holdfast_proto::v1;

/// Who holds a lock, as the server reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderInfo {
    /// The holder's owner description (free text chosen by the holder).
    pub owner: String,
    /// The fence of the holder's grant.
    pub fence: u64,
    /// When the lock was granted (leader's clock, ms since the epoch).
    pub granted_at_ms: u64,
    /// When a TTL hold runs out (leader's clock); `None` for a session's hold, which its session keeps.
    pub expires_at_ms: Option<u64>,
    /// The TTL of a TTL hold; `None` for a session's hold.
    pub ttl_ms: Option<u64>,
    /// The session that holds the lock; `None` for a TTL hold.
    pub session_id: Option<u64>,
    /// What the holder publishes (an elected leader's address); empty: nothing.
    pub value: Vec<u8>,
    /// `Some`: nobody holds the lock. This holder's hold expired with a lock-delay, and nobody is granted
    /// the lock before this time (leader's clock, ms since the epoch).
    pub free_at_ms: Option<u64>,
}

impl HolderInfo {
    /// Whether this holder holds the lock now: false for a lock in its lock-delay.
    pub fn is_live(&self) -> bool {
        self.free_at_ms.is_none()
    }
}

/// What an acquire asks for besides the lock's name, its TTL and its wait.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AcquireOptions {
    /// Published while held (at most 1 KiB): reads, busy answers and watches of the lock show it.
    pub value: Vec<u8>,
    /// If the hold ends by expiry (a TTL not renewed, a session's lease run out) rather than by a release,
    /// nobody is granted the lock for this long after (waiters keep their places), so that a holder that
    /// was only paused can notice before anyone else starts. Zero: none. At most the server's
    /// `--lock-delay-max`.
    pub lock_delay: Duration,
    /// A semaphore: up to this many holders at once, each with its own token and fence, the others queued
    /// in order. 0 or 1: a lock. Every acquirer of a name must give the same limit while anyone holds or
    /// waits for it ([`Error::LimitMismatch`](crate::Error::LimitMismatch) otherwise); at most 1,024.
    pub limit: u32,
}

impl From<v1::Holder> for HolderInfo {
    fn from(h: v1::Holder) -> Self {
        HolderInfo {
            owner: h.owner,
            fence: h.fence,
            granted_at_ms: h.granted_at_ms,
            expires_at_ms: nonzero(h.expires_at_ms),
            ttl_ms: nonzero(h.ttl_ms),
            session_id: nonzero(h.session_id),
            value: h.value,
            free_at_ms: nonzero(h.free_at_ms),
        }
    }
}

/// One queued waiter of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaiterInfo {
    /// The waiter's owner description.
    pub owner: String,
    /// When it joined the queue (leader's clock, ms since the epoch).
    pub queued_at_ms: u64,
    /// The session that waits; `None` for a one-shot acquire that waits.
    pub session_id: Option<u64>,
}

impl From<v1::Waiter> for WaiterInfo {
    fn from(w: v1::Waiter) -> Self {
        WaiterInfo { owner: w.owner, queued_at_ms: w.queued_at_ms, session_id: nonzero(w.session_id) }
    }
}

/// A lock, with its holder and queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    /// The lock's name.
    pub name: String,
    /// Its holder (a semaphore's longest-held place); `None` when nobody holds it (a watch's view of a
    /// free lock).
    pub holder: Option<HolderInfo>,
    /// Every holder, ordered by fence: one for a lock, up to `limit` for a semaphore.
    pub holders: Vec<HolderInfo>,
    /// How many may hold it at once: 1 for a lock (0 in a watch's view of a free lock).
    pub limit: u32,
    /// Its waiters, next in line first.
    pub waiters: Vec<WaiterInfo>,
    /// The log index of its last change (grant, release, expiry, hand-over, value change, renewal, a
    /// waiter joining or leaving). For a lock nobody holds: the entry that freed it, if that was in the
    /// last 10 minutes, else 0.
    pub revision: u64,
}

impl From<v1::Lock> for LockInfo {
    fn from(l: v1::Lock) -> Self {
        LockInfo {
            name: l.name,
            holder: l.holder.map(HolderInfo::from),
            holders: l.holders.into_iter().map(HolderInfo::from).collect(),
            limit: l.limit,
            waiters: l.waiters.into_iter().map(WaiterInfo::from).collect(),
            revision: l.revision,
        }
    }
}

/// A one-shot TTL hold, as granted by [`Client::acquire`](crate::Client::acquire) or extended by
/// [`Client::renew`](crate::Client::renew).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The lock's name.
    pub name: String,
    /// The owner description the hold was taken with.
    pub owner: String,
    /// The secret that renews and releases the hold. Keep it out of logs.
    pub token: String,
    /// Grows with every grant: pass it to the protected resource so it can turn away stale holders.
    pub fence: u64,
    /// When the lock was granted (leader's clock, ms since the epoch).
    pub granted_at_ms: u64,
    /// When the hold runs out unless renewed (leader's clock, ms since the epoch).
    pub expires_at_ms: u64,
    /// The hold's TTL.
    pub ttl_ms: u64,
    /// What the hold publishes; empty: nothing.
    pub value: Vec<u8>,
}

impl Hold {
    /// [`expires_at_ms`](Self::expires_at_ms) as a `SystemTime`, for display.
    pub fn expires_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.expires_at_ms)
    }
}

impl From<v1::Hold> for Hold {
    fn from(h: v1::Hold) -> Self {
        Hold {
            name: h.name,
            owner: h.owner,
            token: h.token,
            fence: h.fence,
            granted_at_ms: h.granted_at_ms,
            expires_at_ms: h.expires_at_ms,
            ttl_ms: h.ttl_ms,
            value: h.value,
        }
    }
}

/// The answer to a one-shot [`Client::release`](crate::Client::release).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// The lock's name.
    pub name: String,
    /// The fence of the hold that ended.
    pub fence: u64,
}

impl From<v1::ReleaseResponse> for Released {
    fn from(r: v1::ReleaseResponse) -> Self {
        Released { name: r.name, fence: r.fence }
    }
}

/// One page of [`Client::list`](crate::Client::list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPage {
    /// The held locks on this page, by name.
    pub locks: Vec<LockInfo>,
    /// Pass as `after` to get the next page; `None` when this was the last.
    pub next: Option<String>,
    /// The log index the page was read at: [`Client::watch_prefix_after`](crate::Client::watch_prefix_after)
    /// this revision misses nothing since.
    pub revision: u64,
}

impl From<v1::ListResponse> for ListPage {
    fn from(r: v1::ListResponse) -> Self {
        ListPage {
            locks: r.locks.into_iter().map(LockInfo::from).collect(),
            next: if r.next.is_empty() { None } else { Some(r.next) },
            revision: r.revision,
        }
    }
}

/// A snapshot a node took when asked, from [`Client::snapshot`](crate::Client::snapshot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// The endpoint that answered, as the client spells it (`http://host:port`).
    pub endpoint: String,
    /// The id of the node that snapshot itself.
    pub id: u64,
    /// The last log index the snapshot covers (0: nothing was applied yet, and no snapshot was taken).
    pub index: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

/// One node's view of the cluster, from [`Client::cluster_status`](crate::Client::cluster_status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStatus {
    /// The endpoint that answered, as the client spells it (`http://host:port`).
    pub endpoint: String,
    /// The answering node's id.
    pub id: u64,
    /// The leader's id, if that node knows one.
    pub leader: Option<u64>,
    /// The Raft term.
    pub term: u64,
    /// The node's Raft state, as the server names it (for example "Leader", "Follower").
    pub state: String,
    /// Members by id. The addresses are the nodes' PEER addresses, not client endpoints.
    pub members: BTreeMap<u64, String>,
    /// The index of the node's last log entry.
    pub last_log_index: u64,
    /// The index of the last entry the node applied.
    pub applied_index: u64,
    /// The members that vote; the other members are learners, catching up before they vote.
    pub voters: Vec<u64>,
}

impl ClusterStatus {
    /// Whether the answering node said it is the leader.
    pub fn is_leader(&self) -> bool {
        self.leader == Some(self.id)
    }

    pub(crate) fn from_proto(endpoint: String, s: v1::ClusterStatusResponse) -> Self {
        ClusterStatus {
            endpoint,
            id: s.id,
            leader: nonzero(s.leader),
            term: s.term,
            state: s.state,
            members: s.members.into_iter().collect(),
            last_log_index: s.last_log_index,
            applied_index: s.applied_index,
            voters: s.voters,
        }
    }
}

/// The proto's "0 means unset" convention as an `Option`.
fn nonzero(v: u64) -> Option<u64> {
    (v != 0).then_some(v)
}

/// A duration in whole milliseconds for the wire, rounded up so that a short non-zero duration never
/// becomes 0 (which means "none" or "default" in several requests).
pub(crate) fn millis_ceil(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_round_up_and_saturate() {
        assert_eq!(millis_ceil(Duration::ZERO), 0);
        assert_eq!(millis_ceil(Duration::from_micros(1)), 1);
        assert_eq!(millis_ceil(Duration::from_millis(1500)), 1500);
        assert_eq!(millis_ceil(Duration::from_micros(1500)), 2);
        assert_eq!(millis_ceil(Duration::MAX), u64::MAX);
    }

    #[test]
    fn zero_means_unset() {
        let h = HolderInfo::from(v1::Holder {
            owner: "w1".into(),
            fence: 7,
            granted_at_ms: 10,
            expires_at_ms: 0,
            ttl_ms: 0,
            session_id: 3,
            value: vec![],
            free_at_ms: 0,
        });
        assert_eq!(h.expires_at_ms, None);
        assert_eq!(h.ttl_ms, None);
        assert_eq!(h.session_id, Some(3));
        assert_eq!(h.free_at_ms, None);
        assert!(h.is_live());
        let page = ListPage::from(v1::ListResponse { locks: vec![], next: String::new(), revision: 0 });
        assert_eq!(page.next, None);
    }
}
