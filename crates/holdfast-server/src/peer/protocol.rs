//! What nodes say to each other beyond Raft: the requests a follower forwards to its leader, their
//! answers, a node's pre-vote, and why a request could not be served. Plain data, encoded by
//! [`super::codec`]; the order of every enum's variants is their encoding, so new variants go last.

use std::time::Duration;

use holdfast_core::{LockView, Outcome, SessionId, SessionSecret, Token};
use holdfast_store::{NodeId, Response};
use openraft::LogId;
use serde::{Deserialize, Serialize};

/// How long a write or a read may take, forwarding and retries included, before the caller is told the
/// cluster is unavailable.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A change a client asks for; the leader turns it into a [`Command`](holdfast_core::Command) (adding its stamp and,
/// for an acquire, the token) and proposes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// Take a lock (or one of `limit` places of a semaphore; 1: a lock) with a TTL, publishing `value`
    /// (empty: none) while held, leaving a lock-delay of `lock_delay_ms` (0: none) if the hold expires.
    Acquire {
        name: String,
        owner: String,
        ttl_ms: u64,
        wait_ms: u64,
        value: Vec<u8>,
        lock_delay_ms: u64,
        limit: u32,
    },
    Release {
        name: String,
        token: Token,
    },
    /// Without `ttl_ms`, renew for the TTL the hold has (as the leader's state says).
    Renew {
        name: String,
        token: Token,
        ttl_ms: Option<u64>,
    },
    /// Withdraw a claim: leave the queue, or release if it was granted.
    Cancel {
        name: String,
        token: Token,
    },
    /// Open a session; the leader makes its id.
    OpenSession {
        owner: String,
        lease_ms: u64,
    },
    /// End a session cleanly, handing over its locks.
    CloseSession {
        id: SessionId,
    },
    /// A session asks for a lock; if it is held, the session queues (`wait`) or is answered busy.
    SessionAcquire {
        id: SessionId,
        name: String,
        wait: bool,
        value: Vec<u8>,
        lock_delay_ms: u64,
        limit: u32,
    },
    /// Store an API key's hash for a new tenant (the node that made the key keeps the key to itself).
    CreateKey {
        tenant: u64,
        hash: [u8; 32],
    },
    /// Revoke a tenant's API key.
    RevokeKey {
        tenant: u64,
    },
    /// The holder `token` of `name` publishes `value` in place of the lock's value.
    SetValue {
        name: String,
        token: Token,
        value: Vec<u8>,
    },
}

/// A read a client asks for, answered by the leader after it confirmed its leadership.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Query {
    Lock { name: String },
    List { prefix: String, after: Option<String>, limit: usize },
    Keys,
}

/// The answer to a [`Query`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum QueryReply {
    Lock(Option<LockView>),
    /// A page of locks, and the lock state's index it was read at (a prefix watch resumes after it).
    List(Vec<LockView>, u64),
    /// Every tenant with an API key and when it was made.
    Keys(Vec<(u64, u64)>),
}

/// A committed and applied write.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Written {
    /// The log index of the entry.
    pub index: u64,
    /// What the lock state answered.
    pub response: Response,
    /// The token the leader made, for an acquire.
    pub token: Option<Token>,
    /// The secret the leader made, for an opened session: the only copy, for its opener.
    pub secret: Option<SessionSecret>,
}

/// What the leader answers a session's heartbeat: how many locks it holds and waits for, or `None` if the
/// session is gone (closed or expired).
pub type HeartbeatReply = Option<(u32, u32)>;

impl Written {
    /// The lock state's answer. Every entry a node proposes is a lock command, so there always is one.
    pub fn outcome(&self) -> &Outcome {
        self.response.outcome.as_ref().expect("a proposed lock command has an outcome")
    }
}

/// What a follower sends the leader.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ForwardRequest {
    Write(Request),
    Read(Query),
    /// Keep a session alive.
    Heartbeat(SessionId),
    /// These one-shot waiters' requests still wait on the sending node.
    StillWaiting(Vec<Token>),
    /// Confirm leadership and answer the leader's applied index (for a read served by a follower).
    Barrier,
    /// Add node `id`, reachable by peers at `addr`: as a learner until it caught up, then as a voter.
    AddMember {
        id: NodeId,
        addr: String,
    },
    /// Remove node `id` from the cluster (voter or learner).
    RemoveMember {
        id: NodeId,
    },
    /// Keep these sessions alive: a follower's heartbeats, gathered. Last among the variants, so that the
    /// others keep their encoding; a leader of a build from before it cannot decode it and closes the
    /// connection, and the follower then forwards heartbeats one by one.
    Heartbeats(Vec<SessionId>),
    /// Apply these writes: a follower's, gathered, once the leader has shown it reads batches (it answered
    /// a [`ForwardRequest::Heartbeats`]). Each is proposed on its own; the answer has one result each.
    Writes(Vec<Request>),
    /// Keep these sessions alive, as [`ForwardRequest::Heartbeats`]; the oldest of them waited `waited_ms` on
    /// the sending node, while a leader served its requests, before it was sent. The leader counts that wait in its
    /// heartbeat lag (`load.rs`): a follower that falls behind with its sessions' heartbeats makes the
    /// cluster refuse new load, and the keeper lets those sessions live that much longer. Last, so that the
    /// others keep their encoding; a leader of a build from before it closes the connection on it, and the
    /// follower then sends [`ForwardRequest::Heartbeats`].
    HeartbeatsWaited {
        ids: Vec<SessionId>,
        waited_ms: u32,
    },
}

impl ForwardRequest {
    /// Whether the leader may serve this request twice with no effect beyond once: everything but writes
    /// and membership changes. Such a request, left with a leader that stopped leading, is sent again to
    /// the next one (see `route::forward`).
    pub fn repeatable(&self) -> bool {
        !matches!(
            self,
            ForwardRequest::Write(_)
                | ForwardRequest::Writes(_)
                | ForwardRequest::AddMember { .. }
                | ForwardRequest::RemoveMember { .. }
        )
    }

    /// Whether this is a batch, which a leader of a build from before batches cannot decode.
    pub fn is_batch(&self) -> bool {
        matches!(
            self,
            ForwardRequest::Heartbeats(_) | ForwardRequest::Writes(_) | ForwardRequest::HeartbeatsWaited { .. }
        )
    }
}

/// What the leader answers a follower.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ForwardReply {
    Written(Written),
    Read(QueryReply),
    Heartbeat(HeartbeatReply),
    Barrier(u64),
    Noted,
    /// One answer per session of a [`ForwardRequest::Heartbeats`] (or `HeartbeatsWaited`), in its order.
    Heartbeats(Vec<HeartbeatReply>),
    /// One result per write of a [`ForwardRequest::Writes`], in its order.
    Writes(Vec<Result<Written, NodeError>>),
}

/// Why a node could not serve a request.
#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
pub enum NodeError {
    /// This node is not the leader (the leader's id, if known). Nothing was proposed: safe to retry.
    #[error("not the leader (leader: {leader:?})")]
    NotLeader { leader: Option<NodeId> },
    /// The leader could not be reached; the request was not delivered. Safe to retry.
    #[error("leader unreachable: {0}")]
    Unreachable(String),
    /// No answer in time. A write may or may not have been applied.
    #[error("no answer within {0:?}; a write may or may not have taken effect")]
    Timeout(Duration),
    /// The node cannot serve at all (shutting down, storage failure).
    #[error("node unavailable: {0}")]
    Unavailable(String),
    /// The leader refused a membership change that cannot be made; nothing changed. `slug` names why.
    #[error("{detail}")]
    Refused { slug: String, detail: String },
    /// A tenant's limit (locks, sessions) is reached; nothing was proposed. `slug` names which.
    #[error("{detail}")]
    Limit { slug: String, detail: String },
}

/// What a node asks each voter before it campaigns: whether the voter would vote for it now
/// (the election watch's pre-vote).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreVote {
    /// The node that asks.
    pub candidate: NodeId,
    /// The term it would campaign in: one above its vote's.
    pub term: u64,
    /// The last entry of its log.
    pub last_log_id: Option<LogId<NodeId>>,
}

/// A voter's answer to a [`PreVote`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreVoteAnswer {
    pub granted: bool,
}

/// What a node whose stored snapshot is damaged asks a peer for: the piece at `offset` of the peer's
/// current snapshot, if it covers the log through index `through` (the damaged one's). Answered with a
/// `Result<holdfast_store::SnapshotPiece, NodeError>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotFetch {
    pub through: u64,
    pub offset: u64,
}

/// A node's answer to [`super::codec::Call::LogEnd`]: whether it leads, the term of its vote, and the
/// index of its log's last entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEnd {
    pub leader: bool,
    pub term: u64,
    pub last_index: u64,
}
