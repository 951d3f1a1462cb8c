//! ④ Leader: what only the leader does. It turns requests into entries and proposes them, confirms its
//! leadership with a quorum, keeps sessions' leases, expires what ran out, and changes the membership.
//!
//! - [`Leader::serve`]: the leader's dispatcher, for a request of this node's own or a follower's.
//! - `propose`: a request becomes a command (with the leader's token, session id and stamp); a try-lock of
//!   a held lock is answered without an entry; tenants' limits.
//! - [`proposer`]: one-lock commands batched into one entry; [`append`]: stamping and appending entries.
//! - [`confirm`]: quorum rounds shared by heartbeats and reads, and the leader floor.
//! - `sessions`: heartbeats extend leases; a new leader's promotion.
//! - `expiry`: the keeper's loop, which proposes one `Expire` for what ran out.
//! - `disk`: a leader whose disk fills up or stalls lets another lead.
//! - `membership`, `snapshot`: admin calls.
//!
//! Imports `apply`, `election`, `peer` and the leaves; nothing above.

pub mod append;
pub mod confirm;
mod disk;
pub mod expiry;
pub mod membership;
mod propose;
pub mod proposer;
mod sessions;
pub mod snapshot;
pub mod tenants;

use std::sync::Arc;
use std::time::Duration;

use holdfast_store::{SharedState, TypeConfig};
use openraft::Raft;
use tokio::time::Instant;

use self::append::Appender;
use self::confirm::Confirmer;
use self::proposer::Proposer;
use self::tenants::TenantLimits;
use crate::apply::events::Events;
use crate::election::Elections;
use crate::faults::Bugs;
use crate::load::Load;
use crate::metrics::Metrics;
use crate::peer::protocol::{ForwardReply, ForwardRequest, NodeError, Query, QueryReply};
use crate::random::Random;

/// The leader's part of a node. Every node has one; it serves only while the node leads, and answers
/// [`NodeError::NotLeader`] otherwise.
pub struct Leader {
    raft: Raft<TypeConfig>,
    state: SharedState,
    events: Arc<Events>,
    elections: Arc<Elections>,
    metrics: Arc<Metrics>,
    appender: Arc<Appender>,
    proposer: Proposer,
    confirmer: Arc<Confirmer>,
    /// Makes tokens and session ids.
    random: Arc<Random>,
    /// Each API key's limits on locks and sessions, under `--auth`.
    tenants: Option<TenantLimits>,
    /// How late this node confirms heartbeats: its admission and its keeper's grace.
    load: Arc<Load>,
    bugs: Bugs,
}

/// What a [`Leader`] is made of: the node's shared parts.
pub struct Parts {
    pub raft: Raft<TypeConfig>,
    pub state: SharedState,
    pub events: Arc<Events>,
    pub elections: Arc<Elections>,
    pub metrics: Arc<Metrics>,
    pub appender: Arc<Appender>,
    pub proposer: Proposer,
    pub random: Arc<Random>,
    pub tenants: Option<TenantLimits>,
    pub load: Arc<Load>,
    pub bugs: Bugs,
}

impl Leader {
    pub fn new(parts: Parts) -> Self {
        let Parts { raft, state, events, elections, metrics, appender, proposer, random, tenants, load, bugs } = parts;
        let confirmer = Arc::new(Confirmer::new(raft.clone(), state.clone(), elections.clone(), metrics.clone()));
        Leader { raft, state, events, elections, metrics, appender, proposer, confirmer, random, tenants, load, bugs }
    }

    /// The quorum rounds this leader's reads and heartbeats share.
    pub fn confirmer(&self) -> &Arc<Confirmer> {
        &self.confirmer
    }

    /// Runs the proposer's batches until the task is aborted ([`proposer::run`]).
    pub async fn run_proposer(&self) {
        proposer::run(&self.proposer, self.appender.clone(), self.state.clone(), self.metrics.clone()).await
    }

    /// Serves `request` as the leader, for a client of this node or a follower's; answers
    /// [`NodeError::NotLeader`] if this node is not the leader.
    pub async fn serve(&self, request: ForwardRequest) -> Result<ForwardReply, NodeError> {
        match request {
            ForwardRequest::Write(request) => self.propose(request).await.map(ForwardReply::Written),
            ForwardRequest::Read(query) => self.answer(query).await.map(ForwardReply::Read),
            ForwardRequest::Heartbeat(id) => self.keep_alive(id, Instant::now()).await.map(ForwardReply::Heartbeat),
            ForwardRequest::Heartbeats(ids) => {
                let now = Instant::now();
                self.keep_alive_all(&ids, now, now).await.map(ForwardReply::Heartbeats)
            }
            ForwardRequest::HeartbeatsWaited { ids, waited_ms } => {
                let now = Instant::now();
                let waited = Duration::from_millis(waited_ms.into()).min(crate::load::WAIT_COUNTED_MAX);
                let waiting_since = now.checked_sub(waited).unwrap_or(now);
                self.keep_alive_all(&ids, now, waiting_since).await.map(ForwardReply::Heartbeats)
            }
            ForwardRequest::Writes(requests) => {
                self.elections.check_leader()?;
                let proposed = requests.into_iter().map(|request| self.propose(request));
                Ok(ForwardReply::Writes(futures_util::future::join_all(proposed).await))
            }
            ForwardRequest::StillWaiting(tokens) => {
                self.elections.check_leader()?;
                self.promote();
                self.events.keep_waiting(&tokens);
                Ok(ForwardReply::Noted)
            }
            ForwardRequest::Barrier => {
                self.confirmer.confirm_leader().await?;
                Ok(ForwardReply::Barrier(crate::state::read(&self.state).applied_index()))
            }
            // Boxed, as rare as they are large (openraft's membership futures): inline, every request's future
            // would be as large as theirs.
            ForwardRequest::AddMember { id, addr } => {
                Box::pin(self.add_member(id, addr)).await.map(|()| ForwardReply::Noted)
            }
            ForwardRequest::RemoveMember { id } => Box::pin(self.remove_member(id)).await.map(|()| ForwardReply::Noted),
        }
    }

    /// Confirms leadership with a quorum, waits until this node applied everything committed before,
    /// then answers from its state.
    async fn answer(&self, query: Query) -> Result<QueryReply, NodeError> {
        if !self.bugs.unconfirmed_reads() {
            self.confirmer.confirm_leader().await?;
        } else {
            self.elections.check_leader()?;
        }
        Ok(crate::apply::answer_query(&self.state, query))
    }
}
