//! A node: proposes on the leader, forwards from followers, reads linearizably, waits for grants.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use holdfast_core::{Acquire, Command, Entry, Grant, LockView, Outcome, SessionId, SessionSecret, SessionView, Token};
use holdfast_store::{Durable, NodeId, Response, SharedState, TypeConfig};
use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::{BasicNode, LogId, Raft, ServerState, Vote};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::keeper::Events;
use crate::metrics::{Forwarded, Metrics, ProposalResult};
use crate::network::{CallError, Peers};
use crate::wire::Call;

/// How long a write or a read may take, forwarding and retries included, before the caller is told the
/// cluster is unavailable.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long adding or removing a member may take: an added node first catches up as a learner, which may
/// take a snapshot transfer.
pub const MEMBERSHIP_TIMEOUT: Duration = Duration::from_secs(60);
/// The shortest time between two leadership confirmation rounds for heartbeats alone. Back to back, rounds
/// ran about a thousand times a second under 10,000 sessions, each a message to every follower; spaced, a
/// heartbeat waits at most this much longer for its acknowledgement (a lease is 100s of ms at least). A
/// read does not wait for the spacing ([`Node::confirm_leader`]).
const CONFIRM_SPACING: Duration = Duration::from_millis(5);
/// How long an asked-for snapshot may take to build and store (a million held locks take about a second).
pub const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one snapshot build is waited for before it is asked for again: a build that was already
/// running when it was asked for may cover less than was wanted, and openraft starts no second one meanwhile.
const SNAPSHOT_RETRY: Duration = Duration::from_secs(1);
/// Pause between attempts while no leader is known or the leader just changed.
const RETRY_PAUSE: Duration = Duration::from_millis(25);
/// A follower's heartbeat batches under way to the leader at once, at most (see [`Node::heartbeat`]).
const HEARTBEAT_SENDERS: usize = 4;
/// Heartbeats in one batch, at most: the leader extends them all under one read of the lock state, which
/// holds its applies back meanwhile.
const HEARTBEATS_PER_BATCH: usize = 1024;
/// How long a follower forwards heartbeats and writes one by one after the leader closed the connection on
/// a batch, as a leader of a build from before batches does (it cannot decode the request).
const BATCHES_REFUSED_FOR: Duration = Duration::from_secs(30);
/// A follower's write batches under way to the leader at once, at most (see [`Node::write`]).
const WRITE_SENDERS: usize = 8;
/// Writes in one forwarded batch, at most.
const WRITES_PER_BATCH: usize = 256;
/// A follower's barriers under way to the leader at once, at most (see [`Node::read`]).
const BARRIER_SENDERS: usize = 4;
/// Reads that wait for one barrier, at most. A barrier is the same one request however many wait for it.
const READS_PER_BARRIER: usize = 4096;

/// A change a client asks for; the leader turns it into a [`Command`] (adding its stamp and, for an
/// acquire, the token) and proposes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    Acquire {
        name: String,
        owner: String,
        ttl_ms: u64,
        wait_ms: u64,
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
    List(Vec<LockView>),
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
    /// connection, and the follower then forwards heartbeats one by one ([`Node::heartbeat`]).
    Heartbeats(Vec<SessionId>),
    /// Apply these writes: a follower's, gathered, once the leader has shown it reads batches (it answered
    /// a [`ForwardRequest::Heartbeats`]). Each is proposed on its own; the answer has one result each.
    Writes(Vec<Request>),
}

impl ForwardRequest {
    /// Whether the leader may serve this request twice with no effect beyond once: everything but writes
    /// and membership changes. Such a request, left with a leader that stopped leading, is sent again to
    /// the next one (see [`Node::forward`]).
    fn repeatable(&self) -> bool {
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
        matches!(self, ForwardRequest::Heartbeats(_) | ForwardRequest::Writes(_))
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
    /// One answer per session of a [`ForwardRequest::Heartbeats`], in its order.
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

/// What [`Node::watch`] found for a queued claim.
pub enum Watch {
    /// The claim holds the lock.
    Granted(Grant),
    /// Still queued: the receiver is sent the grant, or dropped if the claim leaves the queue.
    Waiting(oneshot::Receiver<Grant>),
    /// Neither held nor queued any more.
    Gone,
}

/// Bounds the front doors apply before proposing anything.
#[derive(Debug, Clone)]
pub struct FrontLimits {
    pub ttl_ms_min: u64,
    pub ttl_ms_max: u64,
    pub wait_ms_max: u64,
}

/// One holdfast node.
pub struct Node {
    pub id: NodeId,
    pub raft: Raft<TypeConfig>,
    pub state: SharedState,
    pub events: Arc<Events>,
    pub peers: Arc<Peers>,
    pub limits: FrontLimits,
    /// The last committed log index this node knows of.
    pub committed_index: Arc<AtomicU64>,
    /// The last time stamp this node issued as leader; stamps never go backwards.
    last_stamp_ms: AtomicU64,
    /// Batches the leadership confirmations heartbeats need.
    confirmer: Confirmer,
    /// The term this node leads (as far as it knows) and its last log index when it first confirmed its
    /// leadership in it since it started: see [`Node::leader_floor`].
    leader_floor: Mutex<Option<(u64, u64)>>,
    /// Batches one-lock commands into one log entry.
    pub(crate) proposer: crate::proposer::Proposer,
    pub metrics: Arc<Metrics>,
    /// The key admin calls (membership changes) must present; `None`: admin calls are open.
    pub admin_key: Option<crate::Secret>,
    /// API keys, tenants and their budgets.
    pub auth: crate::auth::Auth,
    /// Where the leader's stamps come from.
    pub clock: WallClock,
    /// Makes tokens and session ids (a CSPRNG seeded by the operating system, or by a simulation).
    rng: Mutex<StdRng>,
    /// Deliberately broken behaviours; all off outside the simulation's checker tests.
    pub bugs: Bugs,
    /// What this node last heard from a leader, and when it last granted a vote (see [`Node::answered_vote`]
    /// and [`Node::run_election_watch`]).
    contact: Mutex<LeaderContact>,
    /// The highest term of a candidate this node started a campaign of its own against.
    campaigned_against: AtomicU64,
    /// How far this node's log is durable: its last entry, for pre-votes.
    durable: Durable,
    /// Heartbeats of sessions attached here, gathered for the leader while this node follows.
    heartbeats: crate::gather::Gather<SessionId, Result<HeartbeatReply, NodeError>>,
    /// Writes of clients attached here, gathered for the leader while this node follows.
    writes: crate::gather::Gather<Request, Result<Written, NodeError>>,
    /// Reads (and session views) answered here while this node follows, waiting for a barrier through the
    /// leader: how far to apply before answering ([`Node::read_index`]).
    barriers: crate::gather::Gather<(), Result<u64, NodeError>>,
    /// What the last leader sent a batch did with it.
    batches: Mutex<Option<LeaderBatches>>,
    /// Whether an empty batch is on its way to ask the leader whether it reads batches.
    asking_for_batches: std::sync::atomic::AtomicBool,
}

/// What a follower sends its leader in batches.
#[derive(Debug, Clone, Copy)]
enum Batched {
    Heartbeats,
    Writes,
}

/// What a leader did with the last batch (of heartbeats or writes) a follower sent it.
#[derive(Debug, Clone, Copy)]
enum LeaderBatches {
    /// It answered: it reads batches.
    Read(NodeId),
    /// It closed the connection on it, as a build from before batches does: it is sent nothing in batches
    /// until then.
    Refused(NodeId, Instant),
}

/// What a node knows of its contact with a leader, for its election watch, its answers to pre-votes and
/// its early campaigns.
#[derive(Debug)]
struct LeaderContact {
    /// When a call from a leader (an `AppendEntries` or a snapshot chunk, from whichever leader) last
    /// arrived here or was last answered; on the leader itself, the election watch's last look. At first,
    /// when the node started: a node that just started neither campaigns nor says yes to a pre-vote until
    /// it has heard nothing for as long as one that just heard from a leader. A restarted node that said yes
    /// at once would make a majority with a node cut off from a healthy leader, and depose it.
    heard: Instant,
    /// Calls from a leader being answered now. The last chunk of a snapshot is answered only once the
    /// snapshot is installed, which takes a second or more at a million locks, and the leader sends this
    /// node nothing else until then: a silence of this node's own making, not a leader gone. A follower
    /// whose watch campaigned meanwhile deposed a healthy leader with its higher term (docs/benchmarks.md).
    /// A follower's `AppendEntries` waits for its disk the same way.
    answering: u32,
    /// When this node last granted a candidate its vote: an election waits as long from then as from the
    /// last word from a leader, as openraft's timer would.
    granted_vote: Option<Instant>,
}

impl LeaderContact {
    /// A node's contact as it starts at `now`.
    fn new(now: Instant) -> Self {
        LeaderContact { heard: now, answering: 0, granted_vote: None }
    }

    /// When a leader was last heard from, as of `now`: `now` itself while one of its calls is answered.
    fn heard(&self, now: Instant) -> Instant {
        if self.answering > 0 {
            now
        } else {
            self.heard
        }
    }

    /// The later of the last word from a leader and the last vote this node granted, as of `now`: what an
    /// election waits from. A candidate it voted for may lead already, its first entries on their way.
    fn quiet_since(&self, now: Instant) -> Instant {
        self.granted_vote.map_or(self.heard(now), |granted| granted.max(self.heard(now)))
    }
}

/// A call from a leader being answered ([`Node::leader_call`]); once dropped, the leader was last heard
/// from then.
pub(crate) struct LeaderCall<'a> {
    node: &'a Node,
}

impl Drop for LeaderCall<'_> {
    fn drop(&mut self) {
        let mut contact = self.node.contact();
        contact.answering -= 1;
        contact.heard = Instant::now();
    }
}

/// What a node asks each voter before it campaigns: whether the voter would vote for it now
/// ([`Node::pre_vote`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreVote {
    /// The node that asks.
    pub candidate: NodeId,
    /// The term it would campaign in: one above its vote's.
    pub term: u64,
    /// The last entry of its log.
    pub last_log_id: Option<LogId<NodeId>>,
}

/// A voter's answer to a [`PreVote`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreVoteAnswer {
    pub granted: bool,
}

/// What a node knows when a peer asks it a [`PreVote`] ([`Node::answer_pre_vote`]).
struct PreVoteAsked<'a> {
    asked: &'a PreVote,
    state: ServerState,
    /// How long since this node last heard from a leader or granted a vote.
    leader_silent: Duration,
    /// A leader's lease: openraft's longest election timeout.
    lease: Duration,
    /// The last entry of this node's log.
    last: Option<LogId<NodeId>>,
}

impl PreVoteAsked<'_> {
    /// Whether the leader is gone as far as this node knows: it is not the leader, and heard from none
    /// (nor granted a vote) for longer than a lease, the time openraft refuses votes for after the last
    /// word from a leader.
    fn leader_gone(&self) -> bool {
        self.state != ServerState::Leader && self.leader_silent > self.lease
    }

    /// Whether this node would vote for the asker: the leader is gone, and the asker's log is at least as
    /// up to date as this node's, as openraft's vote requires.
    fn grants(&self) -> bool {
        self.leader_gone() && self.asked.last_log_id >= self.last
    }
}

/// Whether the voters in `granted` are a majority of every voter set in `configs` (two during a membership
/// change, one otherwise): what an election needs to win.
fn majority_of_each(configs: &[BTreeSet<NodeId>], granted: &BTreeSet<NodeId>) -> bool {
    configs.iter().all(|voters| voters.iter().filter(|id| granted.contains(id)).count() * 2 > voters.len())
}

/// A vote or a pre-vote this node answered, and what it knew then: whether it has to campaign at once (see
/// [`Node::answered_vote`]).
struct Refused {
    /// The term the candidate campaigns in (or, for a pre-vote, would campaign in), the candidate, and its
    /// last entry.
    candidate_term: u64,
    candidate: NodeId,
    candidate_last: Option<LogId<NodeId>>,
    /// Whether this node granted it.
    granted: bool,
    /// This node's last entry, and the term of its vote, as it answered.
    last: Option<LogId<NodeId>>,
    answer_term: u64,
    /// How long since this node last heard from a leader.
    leader_silent: Duration,
    /// A leader's lease: openraft's longest election timeout.
    lease: Duration,
    state: ServerState,
    /// The term of this node's vote, as its metrics last told.
    term: u64,
    /// This node's id.
    id: NodeId,
    /// Whether this node's vote, as it answered, is for a third node (neither the candidate nor itself) in
    /// the candidate's term.
    voted_other: bool,
}

impl Refused {
    /// How many campaigns, one after the other, take this node's term past the candidate's: `None` if this
    /// node should not campaign now. It does when the candidate cannot win its vote for a shorter log and
    /// no leader has been heard from for a lease (it follows, and did not vote in a later term), or when it
    /// is the leader the candidate deposes ([`Refused::deposed`]).
    fn campaigns(&self) -> Option<u64> {
        if self.granted || self.answer_term > self.candidate_term {
            return None;
        }
        let behind = self.candidate_last < self.last;
        let leader_gone = behind && self.leader_silent > self.lease && self.state == ServerState::Follower;
        let deposed = self.deposed() && matches!(self.state, ServerState::Follower | ServerState::Leader);
        (leader_gone || deposed).then(|| campaigns_past(self.candidate_term, self.term))
    }

    /// Whether the last leader this node heard from is itself, and the candidate's vote is above the one
    /// it led with (a higher term, or the same term and a higher id, as openraft orders votes), and it
    /// refused the candidate for its shorter log or its own lease, not for another candidate of that term:
    /// its last entry is its own, which no later leader's entries followed. The candidate's vote deposes
    /// it (its followers answer its calls with that vote) or has already, and the candidate, which did not
    /// get its vote, may get no other: the leader is gone, though this node heard from it a moment ago.
    fn deposed(&self) -> bool {
        self.last.is_some_and(|last| {
            let led = (last.leader_id.term, last.leader_id.node_id);
            last.leader_id.node_id == self.id && led < (self.candidate_term, self.candidate)
        }) && !self.voted_other
    }
}

/// Whether node `id`'s vote `vote` is for a third node, neither `candidate`'s nor its own, in the
/// candidate's term.
fn votes_for_a_third(vote: &Vote<NodeId>, candidate: &Vote<NodeId>, id: NodeId) -> bool {
    let (vote, candidate) = (vote.leader_id(), candidate.leader_id());
    vote.term == candidate.term && ![Some(candidate.node_id), Some(id)].contains(&vote.voted_for())
}

/// How many campaigns, one after the other, take a node whose vote is of `term` past `candidate_term`,
/// in which openraft would have the candidate refuse it if its id is lower: at least one, at most three.
fn campaigns_past(candidate_term: u64, term: u64) -> u64 {
    (candidate_term + 1).saturating_sub(term).clamp(1, 3)
}

/// What decides whether a node tries to campaign because its leader fell silent
/// ([`Node::run_election_watch`]).
#[derive(Debug, Clone, Copy)]
struct Silence {
    state: ServerState,
    /// Whether this node is a voter.
    voter: bool,
    /// How long since this node last heard from a leader or granted a vote (or started).
    leader_silent: Duration,
    /// How long since this node last tried (a pre-vote, and a campaign if it won); `None`: never.
    since_try: Option<Duration>,
    /// How long after the last word from a leader to try: a lease and an election timeout.
    wait: Duration,
    /// How long after a try it tries again: an election timeout.
    retry: Duration,
}

impl Silence {
    /// Whether to try now: a voter that follows or stands for election, has heard no leader for `wait`, and
    /// has not tried within `retry`.
    fn tries(&self) -> bool {
        self.voter && matches!(self.state, ServerState::Follower | ServerState::Candidate) && self.due_in().is_zero()
    }

    /// How long from now until the silence is long enough to try, if nothing is heard meanwhile: zero once
    /// it is.
    fn due_in(&self) -> Duration {
        let quiet = self.wait.saturating_sub(self.leader_silent);
        let again = self.since_try.map_or(Duration::ZERO, |since| self.retry.saturating_sub(since));
        quiet.max(again)
    }
}

/// Where a node reads wall-clock time for the leader's stamps: the system clock, or a simulation's.
#[derive(Clone, Default)]
pub struct WallClock(Option<Arc<dyn Fn() -> u64 + Send + Sync>>);

impl WallClock {
    /// The system clock.
    pub fn system() -> Self {
        WallClock(None)
    }

    /// A clock that reads `now_ms` (milliseconds since the Unix epoch): a simulation's, or a skewed one.
    pub fn from_fn(now_ms: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        WallClock(Some(Arc::new(now_ms)))
    }

    /// Milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        match &self.0 {
            Some(now_ms) => now_ms(),
            None => wall_ms(),
        }
    }
}

impl std::fmt::Debug for WallClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "WallClock(custom)" } else { "WallClock(system)" })
    }
}

/// Declares [`Bugs`]: a field per switch when the `faults` feature is on, and a method of the same name
/// that reads it then and is `false` otherwise, so that a build without the feature (every build of the
/// `holdfast` binary) has neither the switches nor the branches on them.
macro_rules! bugs {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// Deliberately broken behaviours, each the opposite of a rule the design depends on. Every one is
        /// off unless the simulation turns it on, to show that its checkers catch a cluster that breaks that
        /// rule (a checker that never failed proves nothing). They exist only with the `faults` feature,
        /// which only `holdfast-sim` turns on; no flag of the binary sets them.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct Bugs {
            $($(#[$doc])* #[cfg(feature = "faults")] pub $name: bool,)*
        }

        impl Bugs {
            $(
                $(#[$doc])*
                #[inline(always)]
                pub fn $name(&self) -> bool {
                    #[cfg(feature = "faults")]
                    return self.$name;
                    #[cfg(not(feature = "faults"))]
                    return false;
                }
            )*
        }
    };
}

bugs! {
    /// A new leader keeps the deadlines it kept as a follower, instead of giving every session and hold a
    /// full lease from its promotion.
    no_promotion_grace,
    /// Heartbeats are acknowledged without a quorum round confirming that this node still leads.
    unconfirmed_heartbeats,
    /// Clients are told the leader's term as a grant's fence, instead of the grant's log index.
    term_as_fence,
    /// A try-lock of a held lock is answered busy from this node's state without confirming leadership.
    unconfirmed_busy,
    /// A read (`get`, `list`) is answered from the leader's state without confirming its leadership.
    unconfirmed_reads,
    /// A follower answers a read from its own state at once, without asking the leader how far to apply
    /// first.
    unconfirmed_follower_reads,
    /// Leases never run out: the keeper never proposes an expiry.
    never_expire,
    /// Not a bug: this node acts as one of a build from before batches, which closes the connection on a
    /// follower's batch of heartbeats or writes (it cannot decode one). What a follower of a newer build
    /// meets during a rolling upgrade, and must cope with.
    no_heartbeat_batches,
    /// A follower whose watch won a pre-vote campaigns even if it granted another candidate its vote
    /// during the pre-vote. What happens anyway when the grant comes after the watch's last look but
    /// before openraft's core takes the campaign (see [`Node::answered_vote`]); here it happens every time.
    campaign_despite_a_vote_granted,
}

/// Batches leadership confirmations: one quorum round answers every heartbeat and read that arrived
/// before it began.
struct Confirmer {
    wake: tokio::sync::Notify,
    /// A read waits: the next round begins as soon as the last one ended, not [`CONFIRM_SPACING`] after it
    /// began.
    hurry: tokio::sync::Notify,
    /// When the last round began, and what it found: whether this node still leads, and if so the leader
    /// floor it had not applied yet when the round ended (read once per round, not per waiter).
    rounds: tokio::sync::watch::Sender<Option<(Instant, Confirmed)>>,
}

/// What a confirmation round found: the leader floor still to apply (if any), or why leadership was not
/// confirmed.
type Confirmed = Result<Option<u64>, NodeError>;

/// How far a node's own log is, as its store tells.
pub struct LogProgress {
    /// The last committed index the log store knows of.
    pub committed_index: Arc<AtomicU64>,
    /// How far the log is durable: its last entry is what a pre-vote offers.
    pub durable: Durable,
}

/// The answer to a gathered request whose sender went away: only when the node stops.
fn shutting_down<T>() -> Result<T, NodeError> {
    Err(NodeError::Unavailable("shutting down".into()))
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl Node {
    pub fn new(
        id: NodeId,
        raft: Raft<TypeConfig>,
        state: SharedState,
        events: Arc<Events>,
        peers: Arc<Peers>,
        limits: FrontLimits,
        log: LogProgress,
    ) -> Self {
        let LogProgress { committed_index, durable } = log;
        let metrics = events.metrics().clone();
        let confirmer = Confirmer {
            wake: tokio::sync::Notify::new(),
            hurry: tokio::sync::Notify::new(),
            rounds: tokio::sync::watch::channel(None).0,
        };
        let last_stamp_ms = AtomicU64::new(0);
        let (admin_key, auth) = (None, crate::auth::Auth::default());
        let rng = Mutex::new(StdRng::from_entropy());
        Node {
            id,
            raft,
            state,
            events,
            peers,
            limits,
            committed_index,
            last_stamp_ms,
            confirmer,
            leader_floor: Mutex::new(None),
            proposer: Default::default(),
            metrics,
            admin_key,
            auth,
            clock: WallClock::system(),
            rng,
            bugs: Bugs::default(),
            contact: Mutex::new(LeaderContact::new(Instant::now())),
            campaigned_against: AtomicU64::new(0),
            durable,
            heartbeats: crate::gather::Gather::new(HEARTBEAT_SENDERS, HEARTBEATS_PER_BATCH),
            writes: crate::gather::Gather::new(WRITE_SENDERS, WRITES_PER_BATCH),
            barriers: crate::gather::Gather::new(BARRIER_SENDERS, READS_PER_BARRIER),
            batches: Mutex::new(None),
            asking_for_batches: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Records that a call from a leader (an `AppendEntries`, or a chunk of a snapshot it streams) reached
    /// this node; until the guard this answers is dropped, with the call answered, the leader counts as
    /// heard from at every moment ([`LeaderContact`]).
    pub(crate) fn leader_call(&self) -> LeaderCall<'_> {
        let mut contact = self.contact();
        contact.heard = Instant::now();
        contact.answering += 1;
        LeaderCall { node: self }
    }

    fn contact(&self) -> std::sync::MutexGuard<'_, LeaderContact> {
        self.contact.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A leader's lease: openraft's longest election timeout, for which a node that heard from a leader
    /// refuses votes.
    fn lease(&self) -> Duration {
        Duration::from_millis(self.raft.config().election_timeout_max)
    }

    /// This node's role and the term of its vote, as its Raft metrics last told.
    fn role(&self) -> (ServerState, u64) {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        (metrics.state, metrics.vote.leader_id().term)
    }

    /// After this node answered a candidate of `candidate_term` whose log ends at `candidate_last`:
    /// records when it granted a vote (the election watch waits from then too), and campaigns at once if
    /// this node is the one that has to lead.
    ///
    /// A candidate whose log is behind this node's never gets its vote, and in a three-node cluster whose
    /// leader is gone it cannot win at all: this node has to. Waiting for its own election watch costs a
    /// lease and an election timeout from the last word of the leader (docs/benchmarks.md: failovers of 1.2 s
    /// against about 0.6 s, when openraft's own timer still campaigned). So when no leader has been heard
    /// from for longer than a leader's lease, this node campaigns at once, in a term above the candidate's:
    /// openraft orders the candidates of one term by node id, and would have the candidate refuse this
    /// node in its own term if this node's id is lower. A campaign never breaks safety; at worst it costs
    /// an election round, and a node that still hears from a leader never starts one here.
    ///
    /// Nor does it wait when the leader such a candidate deposes is this node. Two followers whose watches
    /// try within a moment of each other both win their pre-votes; the second may grant the first its vote
    /// after its own watch last looked, and campaign in the next term anyway (the grant and the campaign
    /// meet only in openraft's core). The first, elected meanwhile with one entry more, is deposed by that
    /// higher term and refuses the second for its shorter log: nobody could win until the second tried
    /// again, a lease and an election timeout after its grant (a failover of 1.18 s instead of 0.56 s in a
    /// `cluster/bench.sh` run, docs/benchmarks.md). If the second's log is as long as the first's (it heard
    /// the first's entry before its campaign), the first refuses it for its own lease, with the same end.
    /// The deposed leader campaigns at once instead.
    pub(crate) fn answered_vote(
        &self,
        candidate: &Vote<NodeId>,
        candidate_last: Option<LogId<NodeId>>,
        answer: &openraft::raft::VoteResponse<NodeId>,
    ) {
        let candidate_term = candidate.leader_id().term;
        let heard = {
            let mut contact = self.contact();
            let now = Instant::now();
            if answer.vote_granted {
                contact.granted_vote = Some(now);
            }
            contact.heard(now)
        };
        let (state, term) = self.role();
        self.campaign_past(Refused {
            candidate_term,
            candidate_last,
            granted: answer.vote_granted,
            last: answer.last_log_id,
            answer_term: answer.vote.leader_id().term,
            leader_silent: heard.elapsed(),
            lease: self.lease(),
            state,
            term,
            id: self.id,
            candidate: candidate.leader_id().node_id,
            voted_other: votes_for_a_third(&answer.vote, candidate, self.id),
        });
    }

    /// Answers a peer's [`PreVote`]: granted if this node would vote for it now ([`PreVoteAsked::grants`]).
    /// A node that refuses it because its log is behind this node's, with the leader gone, campaigns at once
    /// instead, as it would on refusing that node's vote ([`Node::answered_vote`]).
    pub(crate) fn answer_pre_vote(&self, asked: &PreVote) -> PreVoteAnswer {
        let now = Instant::now();
        let (heard, quiet_since) = {
            let contact = self.contact();
            (contact.heard(now), contact.quiet_since(now))
        };
        let (state, term) = self.role();
        let last = self.durable.last();
        let judged = PreVoteAsked { asked, state, leader_silent: now - quiet_since, lease: self.lease(), last };
        let granted = judged.grants();
        tracing::debug!(
            candidate = asked.candidate,
            term = asked.term,
            last = ?asked.last_log_id,
            granted,
            "answered a pre-vote"
        );
        if !granted && judged.leader_gone() {
            self.campaign_past(Refused {
                candidate_term: asked.term,
                candidate: asked.candidate,
                candidate_last: asked.last_log_id,
                granted,
                last,
                answer_term: term,
                leader_silent: now - heard,
                lease: self.lease(),
                state,
                term,
                id: self.id,
                voted_other: false,
            });
        }
        PreVoteAnswer { granted }
    }

    /// Campaigns at once if `refused` says so ([`Node::answered_vote`]), once per candidate's term.
    fn campaign_past(&self, refused: Refused) {
        let Some(campaigns) = refused.campaigns() else { return };
        let candidate_term = refused.candidate_term;
        if self.campaigned_against.fetch_max(candidate_term, Ordering::SeqCst) >= candidate_term {
            return;
        }
        self.metrics.early_campaigns.inc();
        let leads = refused.state == ServerState::Leader;
        if refused.deposed() {
            tracing::info!(
                candidate_term,
                "campaigning at once: a candidate deposed this node as leader and did not get its vote"
            );
        } else {
            tracing::info!(
                candidate_term,
                campaigns,
                "campaigning at once: a candidate's log is behind this node's and no leader has been heard from for a lease"
            );
        }
        let (raft, lease) = (self.raft.clone(), self.lease());
        tokio::spawn(async move {
            let mut campaigns = campaigns;
            if leads {
                // openraft ignores a leader's campaign: wait until the candidate's term deposes it (its
                // followers answer its next calls with that term), and count from the term it then holds.
                let deposed = raft.wait(Some(lease)).metrics(|m| m.state != ServerState::Leader, "deposed").await;
                let Ok(metrics) = deposed else {
                    tracing::info!(candidate_term, "not campaigning: still the leader a lease later");
                    return;
                };
                campaigns = campaigns_past(candidate_term, metrics.vote.leader_id().term);
            }
            for _ in 0..campaigns {
                if let Err(e) = raft.trigger().elect().await {
                    tracing::warn!(%e, "cannot campaign");
                    return;
                }
            }
        });
    }

    /// Asks every other voter whether it would vote for this node now ([`PreVote`]), each within the
    /// shortest election timeout: `true` once a majority of every voter set (this node's own vote
    /// included) would. A node that cannot win this round does not campaign: its higher term would only
    /// depose a leader the others still follow, once it reached that leader (openraft 0.9 has no pre-vote
    /// of its own). A peer that cannot be reached, or a build without pre-votes that closes the
    /// connection, counts as refusing.
    async fn pre_vote(&self) -> bool {
        let (membership, term) = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            (metrics.membership_config.clone(), metrics.vote.leader_id().term)
        };
        let membership = membership.membership();
        let configs = membership.get_joint_config();
        let mut granted = BTreeSet::from([self.id]);
        if majority_of_each(configs, &granted) {
            return true;
        }
        let asked = PreVote { candidate: self.id, term: term + 1, last_log_id: self.durable.last() };
        let ttl = Duration::from_millis(self.raft.config().election_timeout_min);
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let mut answers: futures_util::stream::FuturesUnordered<_> = membership
            .nodes()
            .filter(|(id, _)| **id != self.id && voters.contains(id))
            .map(|(id, node)| {
                let asked = &asked;
                async move {
                    let answer: Result<PreVoteAnswer, CallError> =
                        self.peers.call(*id, &node.addr, Call::PreVote, asked, ttl).await;
                    (*id, answer)
                }
            })
            .collect();
        while let Some((id, answer)) = futures_util::StreamExt::next(&mut answers).await {
            match answer {
                Ok(PreVoteAnswer { granted: true }) => {
                    granted.insert(id);
                    if majority_of_each(configs, &granted) {
                        return true;
                    }
                }
                Ok(PreVoteAnswer { granted: false }) => {}
                Err(e) => tracing::debug!(peer = id, %e, "no answer to a pre-vote"),
            }
        }
        false
    }

    /// Reads wall-clock time from `clock` and, with a `seed`, makes tokens and session ids from it (the
    /// simulation's determinism); without one they come from the operating system's entropy.
    pub fn with_clock(self, clock: WallClock, seed: Option<u64>) -> Self {
        let rng = Mutex::new(seed.map_or_else(StdRng::from_entropy, StdRng::seed_from_u64));
        Node { clock, rng, ..self }
    }

    /// Holds acquires that will queue for up to `hold`, for their lock's release to share their entry
    /// (`--queue-hold`; see [`crate::proposer`]).
    pub fn with_queue_hold(mut self, hold: Duration) -> Self {
        self.proposer.hold = hold;
        self
    }

    /// Breaks the rules `bugs` names (simulation only).
    pub fn with_bugs(self, bugs: Bugs) -> Self {
        Node { bugs, ..self }
    }

    /// A random value for a token or an id.
    fn random<T>(&self) -> T
    where
        rand::distributions::Standard: rand::distributions::Distribution<T>,
    {
        self.rng.lock().expect("rng poisoned").gen()
    }

    /// The fence a client is told for a grant under `fence`.
    pub fn told_fence(&self, fence: u64) -> u64 {
        if self.bugs.term_as_fence() {
            return self.raft.metrics().borrow().current_term;
        }
        fence
    }

    /// Checks API keys as `auth` says.
    pub fn with_auth(self, auth: crate::auth::Auth) -> Self {
        Node { auth, ..self }
    }

    /// Requires `key` of admin calls.
    pub fn with_admin_key(self, key: Option<crate::Secret>) -> Self {
        Node { admin_key: key, ..self }
    }

    /// The leader's stamp for a new entry: `max(last stamp, last applied time, wall clock)`.
    pub fn stamp(&self) -> u64 {
        let floor = self.clock.now_ms().max(self.state.read().expect("lock state poisoned").now_ms());
        let previous = self.last_stamp_ms.fetch_max(floor, Ordering::SeqCst);
        previous.max(floor)
    }

    /// The leader as this node knows it.
    ///
    /// A follower whose leader has said nothing for a lease and the longest election timeout (the longest
    /// its election watch waits before it tries to campaign) knows no leader: with pre-votes it stays a
    /// follower, with openraft's idea of the leader unchanged, until some node wins an election, which a
    /// node cut off from the others, or a lone survivor, never does.
    pub fn leader(&self) -> Option<NodeId> {
        let current = self.raft.metrics().borrow().current_leader;
        self.heard_leader(current)
    }

    /// `current`, openraft's leader, unless it is another node this node has not heard from for as long as
    /// [`Node::leader`] allows.
    fn heard_leader(&self, current: Option<NodeId>) -> Option<NodeId> {
        let leader = current?;
        if leader != self.id {
            let now = Instant::now();
            if now > self.follows_until(now) {
                return None;
            }
        }
        Some(leader)
    }

    /// Until when this node, as a follower, takes its leader for one ([`Node::leader`]): a lease and the
    /// longest election timeout after it last heard from it.
    fn follows_until(&self, now: Instant) -> Instant {
        self.contact().heard(now) + self.lease() * 2
    }

    /// Whether this node is the leader now (by its own view; proposals and reads still confirm it).
    pub fn is_leader(&self) -> bool {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.id)
    }

    /// Applies `request` through the leader (this node, or forwarded), waiting until it is committed and
    /// applied. Retries only where nothing was delivered: while no leader is known, or when the contacted
    /// node was not (or no longer) the leader.
    ///
    /// A follower whose leader reads batches gathers its clients' writes and forwards them in batches, at
    /// most [`WRITE_SENDERS`] under way at once: one by one, each took a frame each way and a forwarding slot
    /// (docs/benchmarks.md). A write is never sent twice: a batch whose connection breaks leaves each of its
    /// writes with an unknown outcome, as a lone write's would.
    pub async fn write(self: &Arc<Self>, request: Request) -> Result<Written, NodeError> {
        if !self.in_batches(Batched::Writes) {
            return self.write_alone(request).await;
        }
        let node = self.clone();
        // Each batch's future boxed: it holds the lone writes it may fall back to, each as deep as a write.
        let sender = || {
            drop(tokio::spawn(async move { node.writes.send_all(|batch| Box::pin(node.forward_writes(batch))).await }))
        };
        self.writes.ask(request, sender, shutting_down).await
    }

    async fn write_alone(&self, request: Request) -> Result<Written, NodeError> {
        let reply = self.through_leader(ForwardRequest::Write(request)).await?;
        match reply {
            ForwardReply::Written(written) => Ok(written),
            other => Err(NodeError::Unavailable(format!("the leader answered a write with {other:?}"))),
        }
    }

    /// Whether this node, following another, sends `what` to its leader in batches: heartbeats unless the
    /// leader refused a batch lately, writes only once it has answered one. When that is not known, asks
    /// the leader with an empty batch of heartbeats in the background (one question at a time), and its
    /// writes go one by one meanwhile.
    fn in_batches(self: &Arc<Self>, what: Batched) -> bool {
        let leader = self.raft.metrics().borrow().current_leader;
        let Some(leader) = leader.filter(|leader| *leader != self.id) else { return false };
        match (self.leader_reads_batches(leader), what) {
            (Some(reads), _) => reads,
            (None, Batched::Heartbeats) => true,
            (None, Batched::Writes) => {
                if !self.asking_for_batches.swap(true, Ordering::AcqRel) {
                    let node = self.clone();
                    tokio::spawn(async move {
                        let _ = node.through_leader(ForwardRequest::Heartbeats(Vec::new())).await;
                        node.asking_for_batches.store(false, Ordering::Release);
                    });
                }
                false
            }
        }
    }

    /// Whether `leader` reads batches, as far as this node has seen: `Some(false)` for
    /// [`BATCHES_REFUSED_FOR`] after it closed the connection on one.
    fn leader_reads_batches(&self, leader: NodeId) -> Option<bool> {
        match *self.batches.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) {
            Some(LeaderBatches::Read(by)) if by == leader => Some(true),
            Some(LeaderBatches::Refused(by, until)) if by == leader && Instant::now() < until => Some(false),
            _ => None,
        }
    }

    /// Records what `leader` did with a batch.
    fn leader_batches(&self, seen: LeaderBatches) {
        *self.batches.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(seen);
    }

    /// One result per write of `requests`, in order, from one request through the leader. A write the
    /// leader answered "not the leader" was not proposed, and goes again on its own.
    async fn forward_writes(&self, requests: Vec<Request>) -> Vec<Result<Written, NodeError>> {
        let count = requests.len();
        let error = match self.through_leader(ForwardRequest::Writes(requests.clone())).await {
            Ok(ForwardReply::Writes(results)) if results.len() == count => {
                let answers = requests.into_iter().zip(results).map(|(request, result)| async move {
                    match result {
                        Err(NodeError::NotLeader { .. }) => self.write_alone(request).await,
                        result => result,
                    }
                });
                return futures_util::future::join_all(answers).await;
            }
            // Received, so possibly applied: as a lone write's unexpected answer.
            Ok(other) => NodeError::Unavailable(format!(
                "the leader answered {count} writes with {other:?}; they may or may not have taken effect"
            )),
            Err(e) => e,
        };
        vec![Err(error); count]
    }

    /// Answers `query` linearizably: its answer holds every write acknowledged before it arrived.
    ///
    /// The leader answers from its state once the first quorum round of its confirmer begun after the query
    /// arrived confirmed it still leads ([`Node::confirm_leader`]). A follower answers from its own state,
    /// once it applied all the leader had applied when such a round confirmed it: a read index
    /// ([`Node::read_index`]), one barrier through the leader for every read that arrived while the
    /// barriers before it were under way. Forwarded one by one, each read held a forwarding slot for a round
    /// trip and cost the leader a decode, an answer and an encode: 64 clients got 45,000-83,000 answers a
    /// second through a follower against 111,000-170,000 from the leader (docs/benchmarks.md).
    pub async fn read(self: &Arc<Self>, query: Query) -> Result<QueryReply, NodeError> {
        if self.is_leader() {
            return match self.through_leader(ForwardRequest::Read(query)).await? {
                ForwardReply::Read(reply) => Ok(reply),
                other => Err(NodeError::Unavailable(format!("the leader answered a read with {other:?}"))),
            };
        }
        if !self.bugs.unconfirmed_follower_reads() {
            let index = self.read_index().await?;
            self.wait_applied(index).await?;
        }
        Ok(self.answer_here(query))
    }

    /// How far this node must have applied the log before it answers a read that arrived before this call:
    /// the lock state's index on the leader once a quorum round begun after the call confirmed it still
    /// leads, from a barrier through the leader (this node itself, if it leads). Every write acknowledged
    /// before the call was applied on the leader by then. Calls made while [`BARRIER_SENDERS`] barriers are
    /// under way share the next one: the barrier is sent after all of them arrived.
    async fn read_index(self: &Arc<Self>) -> Result<u64, NodeError> {
        let node = self.clone();
        let sender = || {
            drop(tokio::spawn(async move { node.barriers.send_all(|reads| node.forward_barrier(reads.len())).await }))
        };
        self.barriers.ask((), sender, shutting_down).await
    }

    /// One barrier through the leader, its answer given `count` times.
    async fn forward_barrier(&self, count: usize) -> Vec<Result<u64, NodeError>> {
        let index = match self.through_leader(ForwardRequest::Barrier).await {
            Ok(ForwardReply::Barrier(index)) => Ok(index),
            Ok(other) => Err(NodeError::Unavailable(format!("the leader answered a barrier with {other:?}"))),
            Err(e) => Err(e),
        };
        vec![index; count]
    }

    /// Keeps session `id` alive: the leader extends its lease from when the heartbeat reached it, once a
    /// quorum round begun after that confirmed it is still leader.
    ///
    /// A follower gathers its sessions' heartbeats and forwards them in batches, at most
    /// [`HEARTBEAT_SENDERS`] under way at once, each carrying whatever arrived while the others were: one
    /// forwarded heartbeat holds a forwarding slot for a whole quorum round on the leader, and one by one a
    /// follower could pass on only about 8,000 a second, so that most of 10,000 sessions attached to it
    /// expired (docs/benchmarks.md).
    pub async fn heartbeat(self: &Arc<Self>, id: SessionId) -> Result<HeartbeatReply, NodeError> {
        if !self.in_batches(Batched::Heartbeats) {
            return self.heartbeat_alone(id).await;
        }
        let node = self.clone();
        let sender =
            || drop(tokio::spawn(async move { node.heartbeats.send_all(|ids| node.forward_heartbeats(ids)).await }));
        self.heartbeats.ask(id, sender, shutting_down).await
    }

    async fn heartbeat_alone(&self, id: SessionId) -> Result<HeartbeatReply, NodeError> {
        match self.through_leader(ForwardRequest::Heartbeat(id)).await? {
            ForwardReply::Heartbeat(reply) => Ok(reply),
            other => Err(NodeError::Unavailable(format!("the leader answered a heartbeat with {other:?}"))),
        }
    }

    /// One answer per session in `ids`, in order, from one request through the leader (this node, if it
    /// became leader meanwhile); one by one where the leader refused the batch.
    async fn forward_heartbeats(&self, ids: Vec<SessionId>) -> Vec<Result<HeartbeatReply, NodeError>> {
        let count = ids.len();
        let error = match self.through_leader(ForwardRequest::Heartbeats(ids.clone())).await {
            Ok(ForwardReply::Heartbeats(replies)) if replies.len() == count => {
                return replies.into_iter().map(Ok).collect()
            }
            Ok(other) => NodeError::Unavailable(format!("the leader answered {count} heartbeats with {other:?}")),
            Err(_) if self.batches_refused() => {
                let alone = ids.into_iter().map(|id| self.heartbeat_alone(id));
                return futures_util::future::join_all(alone).await;
            }
            Err(e) => e,
        };
        vec![Err(error); count]
    }

    /// Whether the leader closed the connection on a batch not long ago (see [`BATCHES_REFUSED_FOR`]).
    fn batches_refused(&self) -> bool {
        let leader = self.raft.metrics().borrow().current_leader;
        leader.is_some_and(|leader| self.leader_reads_batches(leader) == Some(false))
    }

    /// Session `id` and its claims, as of a point no earlier than this call (confirmed by the leader and
    /// applied here), with `attach` run under the state lock so no entry is applied in between.
    pub async fn session_view<T>(
        self: &Arc<Self>,
        id: SessionId,
        attach: impl FnOnce(&SessionView) -> T,
    ) -> Result<Option<(SessionView, T)>, NodeError> {
        let index = self.read_index().await?;
        self.wait_applied(index).await?;
        let state = self.state.read().expect("lock state poisoned");
        Ok(state.session(id).map(|view| {
            let attached = attach(&view);
            (view, attached)
        }))
    }

    /// Waits until this node applied the log up to `index`. At once when the lock state has applied an entry
    /// at or past it (its index counts only entries with lock commands, so it never runs ahead of Raft's):
    /// a read through a follower that is caught up, the usual case, looks at no watch.
    pub async fn wait_applied(&self, index: u64) -> Result<(), NodeError> {
        if self.state.read().expect("lock state poisoned").applied_index() >= index {
            return Ok(());
        }
        self.raft
            .wait(Some(REQUEST_TIMEOUT))
            .applied_index_at_least(Some(index), "applied here")
            .await
            .map(|_| ())
            .map_err(|e| NodeError::Unavailable(e.to_string()))
    }

    async fn through_leader(&self, request: ForwardRequest) -> Result<ForwardReply, NodeError> {
        self.through_leader_within(request, REQUEST_TIMEOUT).await
    }

    async fn through_leader_within(
        &self,
        request: ForwardRequest,
        timeout: Duration,
    ) -> Result<ForwardReply, NodeError> {
        let deadline = Instant::now() + timeout;
        let mut metrics = self.raft.metrics();
        loop {
            let current = metrics.borrow_and_update().current_leader;
            // Not openraft's leader as it is: a follower cut off from its leader (with pre-votes it stays a
            // follower and keeps that leader for as long as the cut lasts) would send requests into the
            // cut, where a write waits out its bound and ends with an unknown outcome. A leader gone silent
            // counts as none: the request waits here, sent nowhere, until a leader is heard from again.
            let attempt = match self.heard_leader(current) {
                Some(leader) if leader == self.id => self.serve_forwarded(request.clone()).await,
                Some(leader) => self.forward(leader, &request, deadline).await,
                None => Err(NodeError::NotLeader { leader: None }),
            };
            match attempt {
                Err(NodeError::NotLeader { .. } | NodeError::Unreachable(_)) if Instant::now() < deadline => {
                    // Wait for news of a leader, but not forever: the metrics may not change while a
                    // partitioned leader still believes it leads.
                    let _ = tokio::time::timeout(RETRY_PAUSE * 4, metrics.changed()).await;
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(NodeError::NotLeader { .. } | NodeError::Unreachable(_)) => {
                    return Err(NodeError::Unavailable(format!(
                        "no leader answered within {timeout:?}; nothing was done"
                    )))
                }
                result => return result,
            }
        }
    }

    async fn forward(
        &self,
        leader: NodeId,
        request: &ForwardRequest,
        deadline: Instant,
    ) -> Result<ForwardReply, NodeError> {
        let addr = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            m.membership_config.membership().get_node(&leader).map(|n| n.addr.clone())
        };
        let Some(addr) = addr else {
            return Err(NodeError::NotLeader { leader: None });
        };
        self.metrics.forwarded(match request {
            ForwardRequest::Write(_) => Forwarded::Write,
            ForwardRequest::Read(_) => Forwarded::Read,
            ForwardRequest::Heartbeat(_) => Forwarded::Heartbeat,
            ForwardRequest::Heartbeats(_) => Forwarded::Heartbeats,
            ForwardRequest::Writes(_) => Forwarded::Writes,
            ForwardRequest::StillWaiting(_) => Forwarded::StillWaiting,
            ForwardRequest::Barrier => Forwarded::Barrier,
            ForwardRequest::AddMember { .. } | ForwardRequest::RemoveMember { .. } => Forwarded::Membership,
        });
        let timeout = deadline.saturating_duration_since(Instant::now());
        // A leader that stops answering without closing its connections (its host lost power, or the network
        // between dropped everything) would hold the request until the deadline, long after another leader
        // took over. So a request that changes nothing when served twice stops waiting when this node stops
        // following that leader, and goes to the next one. A write does not: a leader that lost its office
        // but lives still answers it (its proposal fails, or commits, or it passes the request on itself),
        // and leaving would turn that answer into an unknown outcome; a write to a silent leader waits out
        // its bound.
        let call = self.peers.call(leader, &addr, Call::Forward, request, timeout);
        let answered = if request.repeatable() {
            tokio::select! {
                answered = call => answered,
                () = self.stops_following(leader) => {
                    return Err(NodeError::Unreachable(format!("node {leader} stopped leading, or went silent, before it answered")));
                }
            }
        } else {
            call.await
        };
        match answered {
            Ok(reply) => {
                // Answered at all, whatever the answer: that node reads batches.
                if request.is_batch() {
                    self.leader_batches(LeaderBatches::Read(leader));
                }
                reply
            }
            Err(CallError::Timeout(timeout)) => Err(NodeError::Timeout(timeout)),
            // Nothing was sent: the request may go to the next leader.
            Err(e @ CallError::Connect(_)) => Err(NodeError::Unreachable(format!("node {leader}: {e}"))),
            Err(e @ CallError::Broken(_)) if request.is_batch() => {
                // So does a leader of a build from before batches, which cannot decode one (or a leader that
                // failed meanwhile): heartbeats and writes go to it one by one for a while. The writes of a
                // batch were received, and may have been applied: theirs is the error below, as for one.
                tracing::warn!(leader, %e, "the leader closed the connection on a batch; forwarding one by one for {BATCHES_REFUSED_FOR:?}");
                self.leader_batches(LeaderBatches::Refused(leader, Instant::now() + BATCHES_REFUSED_FOR));
                Err(NodeError::Unavailable(format!("forwarding to node {leader}: {e}")))
            }
            Err(e) => Err(NodeError::Unavailable(format!("forwarding to node {leader}: {e}"))),
        }
    }

    /// Resolves once this node no longer takes `leader` for the leader: it learned of another, or of an
    /// election, or it stopped, or the leader has said nothing for as long as [`Node::leader`] allows (a
    /// follower cut off from its leader stays its follower). openraft's server metrics change only with
    /// the vote, role, leader or membership, so a forward that waits here is not woken by every entry
    /// applied meanwhile, as the full metrics would; the silence is one timer, pushed back while the
    /// leader is heard from.
    async fn stops_following(&self, leader: NodeId) {
        let mut server = self.raft.server_metrics();
        let changed = server.wait_for(|server| server.current_leader != Some(leader));
        let silent = async {
            loop {
                let until = self.follows_until(Instant::now());
                if Instant::now() > until {
                    return;
                }
                tokio::time::sleep_until(until + Duration::from_millis(1)).await;
            }
        };
        tokio::select! {
            _ = changed => {}
            () = silent => {}
        }
    }

    /// Serves a request as the leader; answers [`NodeError::NotLeader`] if this node is not.
    pub async fn serve_forwarded(&self, request: ForwardRequest) -> Result<ForwardReply, NodeError> {
        match request {
            ForwardRequest::Write(request) => self.propose(request).await.map(ForwardReply::Written),
            ForwardRequest::Read(query) => self.answer(query).await.map(ForwardReply::Read),
            ForwardRequest::Heartbeat(id) => self.keep_alive(id, Instant::now()).await.map(ForwardReply::Heartbeat),
            ForwardRequest::Heartbeats(ids) => {
                self.keep_alive_all(&ids, Instant::now()).await.map(ForwardReply::Heartbeats)
            }
            ForwardRequest::Writes(requests) => {
                if !self.is_leader() {
                    return Err(NodeError::NotLeader { leader: self.leader() });
                }
                let proposed = requests.into_iter().map(|request| self.propose(request));
                Ok(ForwardReply::Writes(futures_util::future::join_all(proposed).await))
            }
            ForwardRequest::StillWaiting(tokens) => {
                if !self.is_leader() {
                    return Err(NodeError::NotLeader { leader: self.leader() });
                }
                self.promote();
                self.events.keep_waiting(&tokens);
                Ok(ForwardReply::Noted)
            }
            ForwardRequest::Barrier => {
                self.confirm_leader().await?;
                Ok(ForwardReply::Barrier(self.state.read().expect("lock state poisoned").applied_index()))
            }
            ForwardRequest::AddMember { id, addr } => self.add_member(id, addr).await.map(|()| ForwardReply::Noted),
            ForwardRequest::RemoveMember { id } => self.remove_member(id).await.map(|()| ForwardReply::Noted),
        }
    }

    /// Adds node `id` at peer address `addr` through the leader; see [`ForwardRequest::AddMember`].
    pub async fn add(&self, id: NodeId, addr: String) -> Result<(), NodeError> {
        self.through_leader_within(ForwardRequest::AddMember { id, addr }, MEMBERSHIP_TIMEOUT).await.map(|_| ())
    }

    /// Removes node `id` through the leader.
    pub async fn remove(&self, id: NodeId) -> Result<(), NodeError> {
        self.through_leader_within(ForwardRequest::RemoveMember { id }, MEMBERSHIP_TIMEOUT).await.map(|_| ())
    }

    /// As leader: adds `id` as a learner, waits until it caught up, then makes it a voter. Adding a voter
    /// again at the same address does nothing, so a retried call is harmless.
    async fn add_member(&self, id: NodeId, addr: String) -> Result<(), NodeError> {
        if !self.is_leader() {
            return Err(NodeError::NotLeader { leader: self.leader() });
        }
        // The answers below are read from this node's view of the membership: only a confirmed leader's view
        // is current. A deposed leader that had not heard of a removal answered "already a voter" (200) and
        // changed nothing (found by the simulation: crates/holdfast-sim/tests/regressions.rs).
        self.confirm_leader().await?;
        let membership = self.raft.metrics().borrow().membership_config.membership().clone();
        if let Some(node) = membership.get_node(&id) {
            if node.addr != addr {
                let detail = format!("node {id} is already a member, at {}; remove it first", node.addr);
                return Err(refused("member-exists", detail));
            }
            if membership.voter_ids().any(|v| v == id) {
                return Ok(());
            }
        }
        if let Some((other, _)) = membership.nodes().find(|(other, n)| **other != id && n.addr == addr) {
            return Err(refused("address-in-use", format!("node {other} is already at {addr}")));
        }
        tracing::info!(id, %addr, "adding a member: as a learner until it catches up");
        let node = BasicNode { addr: addr.clone() };
        let added = tokio::time::timeout(MEMBERSHIP_TIMEOUT, self.raft.add_learner(id, node, true)).await;
        match added {
            Err(_) => {
                let detail = format!(
                    "node {id} at {addr} was added as a learner but did not catch up within {MEMBERSHIP_TIMEOUT:?}; \
                     check that it runs with --join and that peers reach that address, or remove it"
                );
                return Err(refused("not-caught-up", detail));
            }
            Ok(result) => result.map_err(membership_error)?,
        };
        let changes = openraft::ChangeMembers::AddVoterIds(std::collections::BTreeSet::from([id]));
        self.raft.change_membership(changes, false).await.map_err(membership_error)?;
        tracing::info!(id, %addr, "node is a voter");
        Ok(())
    }

    /// As leader: removes `id`, voter or learner. The last voter cannot be removed.
    async fn remove_member(&self, id: NodeId) -> Result<(), NodeError> {
        if !self.is_leader() {
            return Err(NodeError::NotLeader { leader: self.leader() });
        }
        // As in add_member: "not a member" and "last member" must come from a confirmed leader's view.
        self.confirm_leader().await?;
        let membership = self.raft.metrics().borrow().membership_config.membership().clone();
        let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
        if membership.get_node(&id).is_none() {
            return Err(refused("not-a-member", format!("node {id} is not a member")));
        }
        let ids = std::collections::BTreeSet::from([id]);
        let changes = if voters.contains(&id) {
            if voters.len() == 1 {
                return Err(refused("last-member", format!("node {id} is the only voter; a cluster needs one")));
            }
            openraft::ChangeMembers::RemoveVoters(ids)
        } else {
            openraft::ChangeMembers::RemoveNodes(ids)
        };
        tracing::info!(id, "removing a member");
        // `retain: false`: a removed voter also stops receiving the log.
        self.raft.change_membership(changes, false).await.map_err(membership_error)?;
        Ok(())
    }

    /// Has this node snapshot its lock state now (an operator's call; snapshots are otherwise taken every
    /// `--snapshot-every` entries), and waits, at most [`SNAPSHOT_TIMEOUT`], until its stored snapshot
    /// covers every entry it had applied when asked. Answers that snapshot's last log index and size in
    /// bytes; `(0, 0)` if nothing was applied yet. Every node snapshots its own state; nothing is proposed.
    pub async fn snapshot(&self) -> Result<(u64, u64), NodeError> {
        let wanted = self.raft.metrics().borrow().last_applied.map_or(0, |id| id.index);
        let deadline = Instant::now() + SNAPSHOT_TIMEOUT;
        loop {
            match self.events.snapshot() {
                Some((index, bytes)) if index >= wanted => return Ok((index, bytes)),
                None if wanted == 0 => return Ok((0, 0)),
                _ => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(NodeError::Unavailable(format!(
                    "no snapshot up to index {wanted} was stored within {SNAPSHOT_TIMEOUT:?}"
                )));
            }
            self.raft.trigger().snapshot().await.map_err(|e| NodeError::Unavailable(e.to_string()))?;
            // Stored (and so reported to `events`) before openraft's metrics show it.
            let _ = self
                .raft
                .wait(Some(left.min(SNAPSHOT_RETRY)))
                .metrics(|m| m.snapshot.is_some_and(|id| id.index >= wanted), "snapshot stored")
                .await;
        }
    }

    /// As leader: gives every hold, session and waiter a full lease from now, once per term. True if this
    /// call did it.
    pub fn promote(&self) -> bool {
        let term = self.raft.metrics().borrow().current_term;
        let promoted = self.events.promote(term, self.bugs);
        if promoted {
            tracing::info!(term, "became leader; every hold, session and waiter gets a full lease from now");
        }
        promoted
    }

    /// The leader's side of a heartbeat that reached it at `received`.
    async fn keep_alive(&self, id: SessionId, received: Instant) -> Result<HeartbeatReply, NodeError> {
        Ok(self.keep_alive_all(&[id], received).await?.pop().flatten())
    }

    /// Keeps the sessions `ids` alive from now, on heartbeats that reached this node at `received`: for each,
    /// how many locks it holds and waits for, or `None` if it is gone. One quorum round confirms them all.
    async fn keep_alive_all(&self, ids: &[SessionId], received: Instant) -> Result<Vec<HeartbeatReply>, NodeError> {
        if !self.is_leader() {
            return Err(NodeError::NotLeader { leader: self.leader() });
        }
        // A heartbeat may reach a new leader before its keeper's next tick: the deadlines it kept as a
        // follower are stale, so promote first or a live session would be refused as gone.
        self.promote();
        let extended: Vec<HeartbeatReply> = {
            let state = self.state.read().expect("lock state poisoned");
            ids.iter()
                .map(|&id| {
                    let (_, lease_ms, holds, waits) = state.session_summary(id)?;
                    // Extended from now, after the client sent the heartbeat: the client, counting its lease
                    // from when it sent it, never believes in a lease longer than the leader's.
                    self.events.extend_session(id, lease_ms).then_some((holds as u32, waits as u32))
                })
                .collect()
        };
        // Acknowledged only once a quorum round begun after the heartbeats arrived confirms this node still
        // leads: a deposed leader's extension is worthless, so it must not be acknowledged.
        if extended.iter().any(Option::is_some) && !self.bugs.unconfirmed_heartbeats() {
            // Not confirmed until this node applied its floor, either: a heartbeat is answered from its state.
            if !matches!(self.confirmed_since(received, false).await, Ok(None)) {
                return Err(NodeError::NotLeader { leader: None });
            }
        }
        // Belt and braces: a session may have been closed while the round ran.
        let state = self.state.read().expect("lock state poisoned");
        Ok(ids
            .iter()
            .zip(extended)
            .map(|(&id, counts)| counts.filter(|_| state.session_lease_ms(id).is_some()))
            .collect())
    }

    /// Waits for a quorum round that began at or after `since`, and answers what it found: whether it
    /// confirmed this node's leadership, and the leader floor not applied yet then ([`Node::floor_to_apply`]).
    /// With `hurry`, that round begins as soon as the one under way ended, without the spacing heartbeats
    /// keep.
    async fn confirmed_since(&self, since: Instant, hurry: bool) -> Confirmed {
        let mut rounds = self.confirmer.rounds.subscribe();
        self.confirmer.wake.notify_one();
        if hurry {
            self.confirmer.hurry.notify_one();
        }
        let round = tokio::time::timeout(
            REQUEST_TIMEOUT,
            rounds.wait_for(|round| round.as_ref().is_some_and(|(began, _)| *began >= since)),
        )
        .await
        .map_err(|_| NodeError::Timeout(REQUEST_TIMEOUT))?
        .map_err(|_| NodeError::Unavailable("shutting down".into()))?;
        match &*round {
            Some((_, found)) => found.clone(),
            None => unreachable!("waited for a round"),
        }
    }

    /// Tells the leader, every [`crate::keeper::WAITER_PING`] until `shutdown`, which one-shot waiters still
    /// wait on this node, so that the waiters of a node that crashed leave their queues.
    pub async fn run_waiter_pings(&self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(crate::keeper::WAITER_PING);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            let tokens = self.events.waiting_here();
            if !tokens.is_empty() {
                if let Err(e) = self.through_leader(ForwardRequest::StillWaiting(tokens)).await {
                    tracing::debug!(%e, "could not tell the leader which requests still wait");
                }
            }
        }
    }

    /// Campaigns when this node, a voter, has heard from no leader for a lease and an election timeout and
    /// a majority of the voters would vote for it, until `shutdown`: the only election timer of a node
    /// (openraft's own is off, `enable_elect`), with a pre-vote.
    ///
    /// openraft 0.9's timer campaigned up to a tick (1.5 heartbeat intervals) after its timeout, added twice
    /// the longest election timeout for as long as the node once saw a longer log while it was a candidate
    /// (the first campaign after a crash came 1.05-1.2 s after it instead of about 0.6 s: the simulation's
    /// quiet failover, seeds 110 and 296), did not restart on a snapshot's chunk nor during its install
    /// (a follower installing a snapshot deposed its healthy leader), and had no pre-vote: a follower cut
    /// off from its leader campaigned in higher and higher terms, and the first answer it gave the leader
    /// after the cut healed made the leader step down (docs/benchmarks.md).
    ///
    /// A voter that follows, or stands for election, tries once no word from a leader came, nor did it
    /// grant a vote, for a lease (the longest election timeout) plus an election timeout drawn between the
    /// shortest and the longest, as openraft draws its own (550 to 600 ms with the defaults), counted from
    /// its start if it has heard nothing since ([`LeaderContact`]). A try is a pre-vote
    /// ([`Node::pre_vote`]) and, if a majority would vote for it, a campaign; it tries again a drawn
    /// timeout later (a split vote, a refused pre-vote) for as long as no leader is heard. The watch wakes
    /// at the instant a try is due, and otherwise every quarter heartbeat interval to look again, and
    /// draws a new timeout after every try. The draw spreads the followers' tries as openraft's timer
    /// does, so that the one with the longer log is not often outvoted in the same term by one with a
    /// shorter log and a higher id; two tries that met anyway (a split vote) do not meet again at the
    /// next. It never tries while a leader is heard, and never on the leader.
    pub async fn run_election_watch(&self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let config = self.raft.config();
        let draw = || {
            let mut rng = self.rng.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            Duration::from_millis(rng.gen_range(config.election_timeout_min..=config.election_timeout_max))
        };
        let look = Duration::from_millis((config.heartbeat_interval / 4).max(1));
        let mut timeout = draw();
        let mut tried: Option<Instant> = None;
        let mut next_look = Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next_look) => {}
                _ = shutdown.changed() => return,
            }
            let (state, voter) = {
                let metrics = self.raft.metrics();
                let metrics = metrics.borrow();
                let voter = metrics.membership_config.membership().voter_ids().any(|id| id == self.id);
                (metrics.state, voter)
            };
            let now = Instant::now();
            let quiet_since = {
                let mut contact = self.contact();
                // A leader hears itself: once deposed, it waits as long as its followers did.
                if state == ServerState::Leader {
                    contact.heard = now;
                }
                contact.quiet_since(now)
            };
            let silence = Silence {
                state,
                voter,
                leader_silent: now - quiet_since,
                since_try: tried.map(|at| now - at),
                wait: self.lease() + timeout,
                retry: timeout,
            };
            if !silence.tries() {
                let due = silence.due_in();
                next_look = now + if due.is_zero() { look } else { due.min(look) };
                continue;
            }
            tried = Some(now);
            timeout = draw();
            next_look = now + look;
            if !self.pre_vote().await {
                self.metrics.pre_votes_lost.inc();
                tracing::debug!(
                    "not campaigning: a majority of the voters still hears a leader, or holds a longer log"
                );
                continue;
            }
            // Two followers whose watches try within a round trip of each other both win their pre-votes; the
            // one that granted the other's vote meanwhile would only depose the leader it just voted for.
            if self.contact().quiet_since(Instant::now()) >= now && !self.bugs.campaign_despite_a_vote_granted() {
                tracing::debug!("not campaigning: a leader was heard from, or a vote granted, during the pre-vote");
                continue;
            }
            self.metrics.silent_leader_campaigns.inc();
            tracing::info!(silent = ?silence.leader_silent, "campaigning: no leader heard from for a lease and an election timeout");
            if let Err(e) = self.raft.trigger().elect().await {
                tracing::warn!(%e, "cannot campaign");
            }
        }
    }

    /// Runs leadership confirmation rounds on demand until `shutdown`; one round answers every heartbeat
    /// and read that arrived before it began.
    pub async fn run_confirmer(&self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = self.confirmer.wake.notified() => {}
                _ = shutdown.changed() => return,
            }
            let began = Instant::now();
            let found = self.confirm_round().await.map(|()| self.floor_to_apply());
            self.confirmer.rounds.send_replace(Some((began, found)));
            // At most one round per CONFIRM_SPACING while only heartbeats wait: those that arrive meanwhile
            // share the next one. A read waiting cuts the spacing short.
            tokio::select! {
                () = tokio::time::sleep_until(began + CONFIRM_SPACING) => {}
                () = self.confirmer.hurry.notified() => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    /// One quorum round: whether this node still leads, once it applied everything committed before the
    /// round began (openraft's `ensure_linearizable`).
    async fn confirm_round(&self) -> Result<(), NodeError> {
        self.metrics.confirmations.inc();
        let confirmed = tokio::time::timeout(REQUEST_TIMEOUT, self.raft.ensure_linearizable())
            .await
            .map_err(|_| NodeError::Timeout(REQUEST_TIMEOUT))?;
        match confirmed {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                Err(NodeError::NotLeader { leader: f.leader_id })
            }
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e))) => {
                Err(NodeError::NotLeader { leader: None })
                    .inspect_err(|_| tracing::debug!(%e, "leadership not confirmed"))
            }
            Err(RaftError::Fatal(e)) => Err(NodeError::Unavailable(e.to_string())),
        }
    }

    async fn propose(&self, request: Request) -> Result<Written, NodeError> {
        // Per-key limits exist only under --auth; without it, no write pays for the state's lock here.
        if self.auth.config.enabled {
            let state = self.state.read().expect("lock state poisoned");
            let checked = match &request {
                Request::Acquire { name, .. } | Request::SessionAcquire { name, .. } => {
                    self.auth.check_new_lock(&state, name)
                }
                Request::OpenSession { owner, .. } => self.auth.check_new_session(&state, owner),
                _ => Ok(()),
            };
            if let Err((slug, detail)) = checked {
                return Err(NodeError::Limit { slug: slug.to_owned(), detail });
            }
        }
        if let Request::Acquire { name, wait_ms: 0, .. } = &request {
            if let Some(busy) = self.busy_without_a_log_entry(name).await? {
                return Ok(busy);
            }
        }
        let mut secret = None;
        let (cmd, token) = match request {
            Request::Acquire { name, owner, ttl_ms, wait_ms } => {
                // The leader makes the token before it proposes, so apply stays deterministic.
                let token = Token(self.random());
                (Command::Acquire(Acquire { name, owner, token, ttl_ms, wait_ms, session: None }), Some(token))
            }
            Request::Release { name, token } => (Command::Release { name, token }, None),
            // Without a TTL, the state machine takes the hold's own when it applies: this node's state may
            // not have applied the grant yet (a new leader), so a TTL read here could be wrong.
            Request::Renew { name, token, ttl_ms: Some(ttl_ms) } => (Command::Renew { name, token, ttl_ms }, None),
            Request::Renew { name, token, ttl_ms: None } => (Command::RenewKeepingTtl { name, token }, None),
            Request::Cancel { name, token } => (Command::Cancel { name, token }, None),
            Request::OpenSession { owner, lease_ms } => {
                // Ids are made by the leader, like tokens; 0 is never used so it can mean "none" on the wire.
                let id = self.random::<u64>().max(1);
                let made = SessionSecret(Token(self.random()));
                secret = Some(made);
                (Command::OpenSession { id, owner, lease_ms, secret: made.digest() }, None)
            }
            Request::CloseSession { id } => (Command::CloseSession { id }, None),
            Request::CreateKey { tenant, hash } => (Command::CreateKey { tenant, hash }, None),
            Request::RevokeKey { tenant } => (Command::RevokeKey { tenant }, None),
            Request::SessionAcquire { id, name, wait } => {
                let state = self.state.read().expect("lock state poisoned");
                let owner = state.session_summary(id).map(|(owner, ..)| owner.to_owned());
                drop(state);
                let token = Token(self.random());
                let acquire = Acquire {
                    name,
                    owner: owner.unwrap_or_default(),
                    token,
                    ttl_ms: 0,
                    wait_ms: wait.into(),
                    session: Some(id),
                };
                (Command::Acquire(acquire), Some(token))
            }
        };
        let (index, response) = match cmd.batchable() {
            true => self.proposer.propose(cmd).await?,
            false => self.propose_command(cmd).await?,
        };
        Ok(Written { index, response, token, secret })
    }

    /// A try-lock of a lock that is held needs no log entry: if this leader's state says `name` is held,
    /// it confirms its leadership (a quorum round, and everything committed before it applied here) and, if
    /// the lock is still held, answers busy from its state. That answer is linearizable, and polling
    /// clients (cron fleets) do not grow the log or pay an fsync. A lock that looks free is proposed as
    /// usual, so the uncontended path costs nothing more.
    async fn busy_without_a_log_entry(&self, name: &str) -> Result<Option<Written>, NodeError> {
        if !self.is_leader() {
            return Err(NodeError::NotLeader { leader: self.leader() });
        }
        if self.state.read().expect("lock state poisoned").holder(name).is_none() {
            return Ok(None);
        }
        if !self.bugs.unconfirmed_busy() {
            self.confirm_leader().await?;
        }
        let state = self.state.read().expect("lock state poisoned");
        Ok(state.holder(name).map(|holder| Written {
            index: state.applied_index(),
            response: Response { at_ms: state.now_ms(), outcome: Some(Outcome::Busy { holder }) },
            token: None,
            secret: None,
        }))
    }

    /// Proposes `cmd` stamped with leader time, as an entry of its own; returns its log index and the lock
    /// state's answer once it is committed and applied here. (Client writes of one-lock commands go
    /// through the [`Proposer`](crate::proposer::Proposer) instead, which batches them.)
    pub async fn propose_command(&self, cmd: Command) -> Result<(u64, Response), NodeError> {
        self.propose_commands(cmd, 1).await
    }

    /// Proposes `cmd`, which carries `count` client commands (a batch, or one), as one entry.
    pub(crate) async fn propose_commands(&self, cmd: Command, count: usize) -> Result<(u64, Response), NodeError> {
        if !self.is_leader() {
            return Err(NodeError::NotLeader { leader: self.leader() });
        }
        let entry = Entry { at_ms: self.stamp(), cmd };
        let written = tokio::time::timeout(REQUEST_TIMEOUT, self.raft.client_write(entry)).await;
        let result = match &written {
            Ok(Ok(_)) => ProposalResult::Committed,
            _ => ProposalResult::Failed,
        };
        self.metrics.proposal(result, count);
        match written.map_err(|_| NodeError::Timeout(REQUEST_TIMEOUT))? {
            Ok(reply) => Ok((reply.log_id.index, reply.data)),
            // openraft also answers ForwardToLeader for an entry it appended and then had truncated by a
            // new leader; a copy may survive on another node and still commit, so this is not "nothing was
            // proposed" and must not be retried.
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => Err(NodeError::Unavailable(format!(
                "leadership moved to {:?} while the write was in flight; it may or may not have taken effect",
                f.leader_id
            ))),
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                Err(NodeError::Unavailable(e.to_string()))
            }
            Err(RaftError::Fatal(e)) => Err(NodeError::Unavailable(e.to_string())),
        }
    }

    /// Confirms leadership with a quorum, waits until this node applied everything committed before,
    /// then answers from its state.
    async fn answer(&self, query: Query) -> Result<QueryReply, NodeError> {
        if !self.bugs.unconfirmed_reads() {
            self.confirm_leader().await?;
        } else if !self.is_leader() {
            return Err(NodeError::NotLeader { leader: self.leader() });
        }
        Ok(self.answer_here(query))
    }

    /// Answers `query` from this node's lock state as it is.
    fn answer_here(&self, query: Query) -> QueryReply {
        let state = self.state.read().expect("lock state poisoned");
        match query {
            Query::Lock { name } => QueryReply::Lock(state.get(&name)),
            Query::List { prefix, after, limit } => QueryReply::List(state.list(&prefix, after.as_deref(), limit)),
            Query::Keys => QueryReply::Keys(state.keys().collect()),
        }
    }

    /// The log index this node must have applied before it answers anything from its state as leader: its
    /// last log index when it first confirmed its leadership in the current term since it started.
    ///
    /// openraft's `ensure_linearizable` waits only until the leader applied its commit index, or its first
    /// entry of the term. A node that restarts while it leads is leader again at once, in the same term
    /// (openraft 0.9 restores a committed vote for itself), with the commit index it last stored, which may
    /// be behind (it is not flushed on its own), and no new entry of its own. Writes that were committed and
    /// acknowledged before the restart were then not applied yet when it confirmed its leadership, and a
    /// session resumed through it was told it held a lock its own acknowledged release had let go (seed
    /// 873 of the simulation, after every node crashed). Every committed entry is in the leader's log, so
    /// its whole log at its first confirmation covers them.
    fn leader_floor(&self) -> u64 {
        let (term, last, leads) = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            (m.current_term, m.last_log_index.unwrap_or(0), m.current_leader == Some(self.id))
        };
        if !leads {
            // Deposed since it confirmed: nothing to wait for (its log's tail may never commit), and no
            // floor to record for a term it does not lead.
            return 0;
        }
        let mut floor = self.leader_floor.lock().expect("leader floor poisoned");
        match *floor {
            Some((t, index)) if t == term => index,
            _ => {
                *floor = Some((term, last));
                last
            }
        }
    }

    /// The leader floor, if this node has not applied it yet.
    ///
    /// Raft's applied index, not the lock state's: the state counts only the entries that carry lock
    /// commands, and the floor is often a new leader's blank entry, which the state never counts. Compared
    /// with the state's index, a leader that had taken no lock command since its election never reached
    /// its floor: it acknowledged no session heartbeat until some client wrote (found by the simulation's
    /// `tests/failover.rs`: a session through a follower lost its lock after the leader's crash).
    fn floor_to_apply(&self) -> Option<u64> {
        let floor = self.leader_floor();
        let applied = self.raft.metrics().borrow().last_applied.map_or(0, |applied| applied.index);
        (applied < floor).then_some(floor)
    }

    /// Confirms with a quorum that this node is still the leader, and that it applied everything
    /// committed before now (openraft's `ensure_linearizable`, and [`Node::leader_floor`]).
    ///
    /// The confirmation is a round of the confirmer's, the first to begin after this call, shared with
    /// every read and heartbeat that came before it: a round is a message to every follower and back, and
    /// one each cost every leader-confirmed read (a `get`, a busy answer to a try-lock) that much
    /// (docs/benchmarks.md).
    pub async fn confirm_leader(&self) -> Result<(), NodeError> {
        // Almost always applied already: only a leader restarted in its term waits here.
        match self.confirmed_since(Instant::now(), true).await? {
            Some(floor) => self.wait_applied(floor).await,
            None => Ok(()),
        }
    }

    /// Watches queued claim `token` on `name`, once this node has applied the entry (at `index`) that
    /// queued it.
    pub async fn watch(&self, name: &str, token: Token, index: u64) -> Result<Watch, NodeError> {
        self.wait_applied(index).await?;
        // Holding the state lock while registering means no grant can be applied in between.
        let state = self.state.read().expect("lock state poisoned");
        if let Some(grant) = state.grant(name, token) {
            return Ok(Watch::Granted(grant));
        }
        if !state.is_waiting(name, token) {
            return Ok(Watch::Gone);
        }
        Ok(Watch::Waiting(self.events.watch(name, token)))
    }
}

/// Whether a gRPC status says the connection could not be made, so the request was never delivered.
/// A connection reset or closed after sending is not one: the request may have been applied.
fn refused(slug: &str, detail: String) -> NodeError {
    NodeError::Refused { slug: slug.to_owned(), detail }
}

/// A failed membership change. Not being leader (any more) proposed nothing, so it is retried elsewhere;
/// a change already in progress is refused, to be tried again once it is done.
fn membership_error(e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> NodeError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => NodeError::NotLeader { leader: f.leader_id },
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => refused("membership-change", e.to_string()),
        RaftError::Fatal(e) => NodeError::Unavailable(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use openraft::raft::VoteResponse;
    use openraft::{CommittedLeaderId, Vote};

    use super::*;

    fn log_id(term: u64, index: u64) -> Option<LogId<NodeId>> {
        log_id_of(term, 2, index)
    }

    /// An entry written by leader `node`.
    fn log_id_of(term: u64, node: NodeId, index: u64) -> Option<LogId<NodeId>> {
        Some(LogId::new(CommittedLeaderId::new(term, node), index))
    }

    #[test]
    fn a_leader_counts_as_heard_from_for_as_long_as_one_of_its_calls_is_answered() {
        let arrived = Instant::now();
        let later = arrived + Duration::from_secs(2);
        let mut contact = LeaderContact { answering: 1, ..LeaderContact::new(arrived) };
        assert_eq!(contact.heard(later), later, "a snapshot still installing");
        contact.answering = 0;
        assert_eq!(contact.heard(later), arrived);
    }

    #[test]
    fn an_election_waits_from_the_later_of_the_last_word_from_a_leader_and_the_last_vote_granted() {
        let heard = Instant::now();
        let later = heard + Duration::from_secs(1);
        let contact = LeaderContact::new(heard);
        assert_eq!(contact.quiet_since(later), heard, "a node just started counts as having just heard");
        let voted = LeaderContact { granted_vote: Some(later), ..contact };
        assert_eq!(voted.quiet_since(later), later);
        let voted_before = LeaderContact { granted_vote: Some(heard - Duration::from_secs(1)), ..contact };
        assert_eq!(voted_before.quiet_since(later), heard);
        let answering = LeaderContact { answering: 1, ..voted };
        assert_eq!(answering.quiet_since(later + Duration::from_secs(5)), later + Duration::from_secs(5));
    }

    #[test]
    fn a_follower_tries_to_campaign_only_after_a_lease_and_an_election_timeout_of_silence() {
        let ms = Duration::from_millis;
        let silent = Silence {
            state: ServerState::Follower,
            voter: true,
            leader_silent: ms(610),
            since_try: None,
            wait: ms(600),
            retry: ms(280),
        };
        assert!(silent.tries());
        assert!(Silence { leader_silent: ms(600), ..silent }.tries(), "exactly the wait");
        assert!(!Silence { leader_silent: ms(599), ..silent }.tries(), "a leader heard within the wait");
        assert!(!Silence { voter: false, ..silent }.tries(), "a learner never campaigns");
        for state in [ServerState::Leader, ServerState::Learner, ServerState::Shutdown] {
            assert!(!Silence { state, ..silent }.tries(), "{state:?}");
        }
        // A candidate whose election came to nothing (a split vote) tries again.
        assert!(Silence { state: ServerState::Candidate, since_try: Some(ms(280)), ..silent }.tries());
        // Once per election timeout: not again until as long has passed since its last try.
        assert!(!Silence { since_try: Some(ms(279)), ..silent }.tries());
        assert!(Silence { since_try: Some(ms(280)), ..silent }.tries());
        // When the watch wakes next: the later of the end of the wait and a retry after the last try.
        assert_eq!(Silence { leader_silent: ms(450), ..silent }.due_in(), ms(150));
        assert_eq!(Silence { since_try: Some(ms(100)), ..silent }.due_in(), ms(180));
        assert_eq!(Silence { leader_silent: ms(450), since_try: Some(ms(200)), ..silent }.due_in(), ms(150));
        assert_eq!(silent.due_in(), Duration::ZERO);
    }

    #[test]
    fn a_voter_grants_a_pre_vote_only_with_the_leader_gone_for_a_lease_and_a_log_no_longer_than_the_askers() {
        let asked = PreVote { candidate: 1, term: 3, last_log_id: log_id(2, 3852) };
        let judged = PreVoteAsked {
            asked: &asked,
            state: ServerState::Follower,
            leader_silent: Duration::from_millis(301),
            lease: Duration::from_millis(300),
            last: log_id(2, 3852),
        };
        assert!(judged.grants());
        assert!(PreVoteAsked { state: ServerState::Candidate, ..judged }.grants());
        assert!(PreVoteAsked { last: log_id(2, 3851), ..judged }.grants(), "the asker's log is longer");
        assert!(PreVoteAsked { last: log_id(1, 3900), ..judged }.grants(), "the asker's last term is later");
        // A leader heard within its lease: the asker is only cut off from it.
        let heard = PreVoteAsked { leader_silent: Duration::from_millis(300), ..judged };
        assert!(!heard.grants() && !heard.leader_gone());
        let leader = PreVoteAsked { state: ServerState::Leader, leader_silent: Duration::from_secs(9), ..judged };
        assert!(!leader.grants() && !leader.leader_gone());
        // The asker's log is behind: refused, though the leader is gone.
        let behind = PreVoteAsked { last: log_id(2, 3853), ..judged };
        assert!(!behind.grants() && behind.leader_gone());
        assert!(!PreVoteAsked { last: log_id(3, 3800), ..judged }.grants(), "a later last term");
    }

    #[test]
    fn an_election_needs_a_majority_of_every_voter_set() {
        let set = |ids: &[NodeId]| ids.iter().copied().collect::<BTreeSet<NodeId>>();
        let three = vec![set(&[1, 2, 3])];
        assert!(!majority_of_each(&three, &set(&[1])));
        assert!(majority_of_each(&three, &set(&[1, 3])));
        assert!(majority_of_each(&[set(&[1])], &set(&[1])), "a single node elects itself");
        assert!(!majority_of_each(&[set(&[1, 2, 3, 4])], &set(&[1, 2])), "half is not a majority");
        // During a membership change, a majority of the old voters and one of the new.
        let joint = vec![set(&[1, 2, 3]), set(&[3, 4, 5])];
        assert!(!majority_of_each(&joint, &set(&[1, 2, 3])));
        assert!(majority_of_each(&joint, &set(&[1, 3, 4])));
    }

    /// Node 3 of the failover in docs/benchmarks.md: it followed node 2 in term 2 up to entry 3853, node 2
    /// is gone, and node 1 asks for its vote in term 3 with a log that ends at 3852.
    fn refused(answer: &VoteResponse<NodeId>) -> Refused {
        Refused {
            candidate_term: 3,
            candidate: 1,
            candidate_last: log_id(2, 3852),
            granted: answer.vote_granted,
            last: answer.last_log_id,
            answer_term: answer.vote.leader_id().term,
            leader_silent: Duration::from_millis(600),
            lease: Duration::from_millis(300),
            state: ServerState::Follower,
            term: 2,
            id: 3,
            voted_other: false,
        }
    }

    fn answer(granted: bool, vote: Vote<NodeId>, last: Option<LogId<NodeId>>) -> VoteResponse<NodeId> {
        VoteResponse { vote, vote_granted: granted, last_log_id: last }
    }

    #[test]
    fn a_node_campaigns_past_a_candidate_it_refused_for_a_shorter_log_once_the_leader_is_gone() {
        let refusal = answer(false, Vote::new_committed(2, 2), log_id(2, 3853));
        // Two campaigns: terms 3 and 4, past the candidate's 3, which a lower id would not win.
        assert_eq!(refused(&refusal).campaigns(), Some(2));
        assert_eq!(Refused { term: 3, ..refused(&refusal) }.campaigns(), Some(1));
        assert_eq!(Refused { term: 0, ..refused(&refusal) }.campaigns(), Some(3), "at most 3");

        // Not while a leader was heard from within its lease: the candidate is only cut off from it.
        let heard = Refused { leader_silent: Duration::from_millis(300), ..refused(&refusal) };
        assert_eq!(heard.campaigns(), None);
        // Not when the candidate's log is as long: it may win, and this node's refusal was for another reason.
        assert_eq!(Refused { candidate_last: log_id(2, 3853), ..refused(&refusal) }.campaigns(), None);
        // Not when the vote was granted, or this node already voted in a later term, or is not a follower.
        let granted = answer(true, Vote::new(3, 1), log_id(2, 3853));
        assert_eq!(refused(&granted).campaigns(), None);
        let later = answer(false, Vote::new(4, 3), log_id(2, 3853));
        assert_eq!(refused(&later).campaigns(), None);
        for state in [ServerState::Candidate, ServerState::Leader, ServerState::Learner] {
            assert_eq!(Refused { state, ..refused(&refusal) }.campaigns(), None, "{state:?}");
        }
    }

    #[test]
    fn a_leader_deposed_by_a_candidate_with_a_shorter_log_campaigns_at_once() {
        // Node 3 was elected in term 3 and wrote its first entry, 3854; node 1, a candidate of term 4 that
        // ends at 3853, deposes it. Node 3 heard from itself a moment ago.
        let refusal = answer(false, Vote::new_committed(3, 3), log_id_of(3, 3, 3854));
        let deposed = Refused {
            candidate_term: 4,
            candidate_last: log_id(2, 3853),
            leader_silent: Duration::from_millis(5),
            term: 3,
            ..refused(&refusal)
        };
        // Whether it still leads when it answers or has stepped down already: terms 4 and 5.
        for state in [ServerState::Leader, ServerState::Follower] {
            assert_eq!(Refused { state, ..deposed }.campaigns(), Some(2), "{state:?}");
        }
        // Not when its last entry is another leader's: that leader may still lead.
        for state in [ServerState::Leader, ServerState::Follower] {
            assert_eq!(Refused { state, last: log_id(3, 3854), ..deposed }.campaigns(), None, "{state:?}");
        }
        // Not when the candidate's term is its own: nothing deposes it.
        assert_eq!(Refused { candidate_term: 3, ..deposed }.campaigns(), None);
        // Not when it voted for another candidate of that term, which may win, nor when it granted the vote.
        assert_eq!(Refused { voted_other: true, ..deposed }.campaigns(), None);
        assert_eq!(Refused { granted: true, ..deposed }.campaigns(), None);
        // But when it refused a candidate with a log as long for its own lease: the candidate may get no
        // other vote.
        assert_eq!(Refused { candidate_last: log_id_of(3, 3, 3854), ..deposed }.campaigns(), Some(2));

        // A fresh cluster: node 2 won term 1 and wrote entry 1; node 3, started later, stands in term 1 too,
        // a vote above node 2's. Node 2 refuses it for its lease (its own vote of term 1), and campaigns in
        // term 2 once deposed; not for a candidate of its term with a lower id, which cannot depose it.
        let fresh = answer(false, Vote::new_committed(1, 2), log_id_of(1, 2, 1));
        let late = Refused {
            candidate_term: 1,
            candidate: 3,
            candidate_last: None,
            leader_silent: Duration::from_millis(5),
            term: 1,
            id: 2,
            state: ServerState::Leader,
            ..refused(&fresh)
        };
        assert_eq!(late.campaigns(), Some(1));
        assert_eq!(Refused { candidate: 1, ..late }.campaigns(), None);
        // Its own vote in the candidate's term, or one for the candidate, is not a third node's; a vote in
        // another term is not in the candidate's.
        let candidate = Vote::new(1, 3);
        assert!(!votes_for_a_third(&Vote::new_committed(1, 2), &candidate, 2));
        assert!(!votes_for_a_third(&Vote::new(1, 3), &candidate, 2));
        assert!(votes_for_a_third(&Vote::new(1, 1), &candidate, 2));
        assert!(!votes_for_a_third(&Vote::new(0, 1), &candidate, 2));
    }
}
