//! ⑥ Elections: who leads, as this node knows, and when this node campaigns.
//!
//! [`core::Election`] decides (a pure state machine: the election watch, the pre-vote judge, the early
//! campaigns); [`Elections`] drives it: it feeds it the clock, Raft's view of this node and what peers
//! said, asks the voters for pre-votes, and campaigns through openraft when the core says so.
//!
//! Imports only `peer` (pre-votes go to peers) and the leaves.

mod catch_up;
pub mod core;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use holdfast_store::{Durable, NodeId, TypeConfig};
use openraft::raft::VoteResponse;
use openraft::{LogId, Raft, ServerState, Vote};
use tokio::time::Instant;

use self::core::{majority_of_each, Action, Election, Role, Why};
use crate::faults::Bugs;
use crate::metrics::Metrics;
use crate::peer::client::{CallError, Peers};
use crate::peer::codec::Call;
use crate::peer::protocol::{NodeError, PreVote, PreVoteAnswer};
use crate::random::Random;

/// Who leads, as this node knows, and its election watch: the handle every part that asks "am I the
/// leader, and if not, who is" holds.
pub struct Elections {
    id: NodeId,
    raft: Raft<TypeConfig>,
    core: Mutex<Election>,
    peers: Arc<Peers>,
    /// How far this node's log is durable: its last entry is what a pre-vote offers.
    durable: Durable,
    random: Arc<Random>,
    metrics: Arc<Metrics>,
    /// While this node's damaged log, cut, has not caught up: what was cut where. It then grants no vote
    /// or pre-vote and does not campaign (see `catch_up`).
    held: Mutex<Option<String>>,
    bugs: Bugs,
}

/// A call from a leader being answered ([`Elections::leader_call`]); once dropped, the leader was last
/// heard from then.
pub struct LeaderCall<'a> {
    elections: &'a Elections,
}

impl Drop for LeaderCall<'_> {
    fn drop(&mut self) {
        self.elections.core().leader_call_answered(Instant::now());
    }
}

impl Elections {
    /// Node `id`'s elections on `raft`, starting now. Draws nothing yet: the first timeout is drawn when
    /// the watch starts ([`Elections::run`]).
    pub fn new(
        id: NodeId,
        raft: Raft<TypeConfig>,
        peers: Arc<Peers>,
        durable: Durable,
        random: Arc<Random>,
        metrics: Arc<Metrics>,
        bugs: Bugs,
    ) -> Self {
        let config = raft.config();
        let lease = Duration::from_millis(config.election_timeout_max);
        let look = Duration::from_millis((config.heartbeat_interval / 4).max(1));
        let core = Mutex::new(Election::new(id, Instant::now(), lease, look));
        Elections { id, raft, core, peers, durable, random, metrics, held: Mutex::default(), bugs }
    }

    fn core(&self) -> MutexGuard<'_, Election> {
        self.core.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// When this node last heard from each peer: its last answer to a call of this node
    /// ([`Peers::last_answers`]) or, for the leader this node follows, its last call.
    pub fn last_heard(&self) -> std::collections::BTreeMap<NodeId, Instant> {
        let mut heard = self.peers.last_answers();
        if let Some(leader) = self.leader().filter(|leader| *leader != self.id) {
            let called = self.core().leader_heard(Instant::now());
            heard.entry(leader).and_modify(|at| *at = (*at).max(called)).or_insert(called);
        }
        heard
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// A leader's lease: openraft's longest election timeout.
    pub fn lease(&self) -> Duration {
        self.core().lease()
    }

    /// The leader as this node knows it: openraft's, unless a follower has not heard from it for a lease
    /// and the longest election timeout ([`Election::leader`]).
    pub fn leader(&self) -> Option<NodeId> {
        let current = self.raft.metrics().borrow().current_leader;
        self.heard_leader(current)
    }

    /// `current`, openraft's leader, unless it is another node this node has not heard from for as long as
    /// [`Elections::leader`] allows.
    pub fn heard_leader(&self, current: Option<NodeId>) -> Option<NodeId> {
        self.core().leader(Instant::now(), current)
    }

    /// When this node last followed a leader ([`Election::followed`]).
    pub fn followed(&self) -> Instant {
        self.core().followed(Instant::now())
    }

    /// Until when this node, as a follower, takes its leader for one.
    pub fn follows_until(&self, now: Instant) -> Instant {
        self.core().follows_until(now)
    }

    /// Whether this node is the leader now (by its own view; proposals and reads still confirm it).
    pub fn is_leader(&self) -> bool {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.id)
    }

    /// The error for a request that only the leader serves: this node is not it, and the leader it knows.
    pub fn not_leader(&self) -> NodeError {
        NodeError::NotLeader { leader: self.leader() }
    }

    /// `Ok` if this node leads now ([`Elections::is_leader`]), else [`Elections::not_leader`].
    pub fn check_leader(&self) -> Result<(), NodeError> {
        match self.is_leader() {
            true => Ok(()),
            false => Err(self.not_leader()),
        }
    }

    /// Records that a call from a leader (an `AppendEntries`, or a chunk of a snapshot it streams) reached
    /// this node; until the guard this answers is dropped, with the call answered, the leader counts as
    /// heard from at every moment.
    pub fn leader_call(&self) -> LeaderCall<'_> {
        self.core().leader_call(Instant::now());
        LeaderCall { elections: self }
    }

    /// This node's role, the term of its vote and its last durable entry, as its Raft metrics last told.
    fn role(&self) -> Role {
        // Nothing else is read while openraft's metrics are borrowed (see `Api::cluster`).
        let last = self.durable.last();
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let voter = metrics.membership_config.membership().voter_ids().any(|id| id == self.id);
        Role { state: metrics.state, voter, term: metrics.vote.leader_id().term, last }
    }

    /// After this node answered a candidate's vote ([`Election::vote_answered`]).
    pub fn vote_answered(
        &self,
        candidate: &Vote<NodeId>,
        candidate_last: Option<LogId<NodeId>>,
        answer: &VoteResponse<NodeId>,
    ) {
        let role = self.role();
        let actions = self.core().vote_answered(Instant::now(), role, candidate, candidate_last, answer);
        self.act(actions);
    }

    /// Why this node grants no vote and does not campaign, if it does not: its damaged log was cut (what
    /// was cut where) and has not caught up (see `catch_up`).
    pub fn votes_held(&self) -> Option<String> {
        self.held.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Answers a peer's [`PreVote`] ([`Election::pre_vote_asked`]); refused while votes are held.
    pub fn answer_pre_vote(&self, asked: &PreVote) -> PreVoteAnswer {
        if self.votes_held().is_some() {
            tracing::debug!(candidate = asked.candidate, "refused a pre-vote: this node's cut log has not caught up");
            return PreVoteAnswer { granted: false };
        }
        let role = self.role();
        let (answer, actions) = self.core().pre_vote_asked(Instant::now(), role, asked);
        let (candidate, term, granted) = (asked.candidate, asked.term, answer.granted);
        tracing::debug!(candidate, term, last = ?asked.last_log_id, granted, "answered a pre-vote");
        self.act(actions);
        answer
    }

    /// Runs the election watch until `shutdown` ([`Election::tick`]).
    pub async fn run(&self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let config = self.raft.config();
        let (min, max) = (config.election_timeout_min, config.election_timeout_max);
        let first = self.random.millis_between(min, max);
        self.core().start(first);
        let mut next_look = Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next_look) => {}
                _ = shutdown.changed() => return,
            }
            let role = self.role();
            let actions = self.core().tick(Instant::now(), role, || self.random.millis_between(min, max));
            for action in actions {
                match action {
                    Action::LookAt(at) => next_look = at,
                    Action::AskPreVotes(asked) => {
                        // A node whose votes are held asks no one: it does not campaign.
                        let held = self.votes_held().is_some();
                        let won = !held && self.pre_vote(asked).await;
                        if !won && !held {
                            self.metrics.pre_votes_lost.inc();
                            tracing::debug!(
                                "not campaigning: a majority of the voters still hears a leader, or holds a longer log"
                            );
                        }
                        let despite = self.bugs.campaign_despite_a_vote_granted();
                        let decided = self.core().pre_voted(Instant::now(), won, despite);
                        match decided[..] {
                            [Action::Campaign { times, why: Why::LeaderSilent(silent) }] => {
                                self.metrics.silent_leader_campaigns.inc();
                                tracing::info!(
                                    ?silent,
                                    "campaigning: no leader heard from for a lease and an election timeout"
                                );
                                campaign(self.raft.clone(), times).await;
                            }
                            [] if won => tracing::debug!(
                                "not campaigning: a leader was heard from, or a vote granted, during the pre-vote"
                            ),
                            ref other => debug_assert!(other.is_empty(), "a pre-vote answers a campaign or nothing"),
                        }
                    }
                    other => self.act(vec![other]),
                }
            }
        }
    }

    /// Carries out `actions` that campaign, each in a task of its own: a campaign waits for openraft's core.
    /// None while this node's votes are held.
    fn act(&self, actions: Vec<Action>) {
        if self.votes_held().is_some() {
            return;
        }
        for action in actions {
            let raft = self.raft.clone();
            match action {
                Action::Campaign { times, why } => {
                    self.metrics.early_campaigns.inc();
                    match why {
                        Why::Deposed => tracing::info!(
                            "campaigning at once: a candidate deposed this node as leader and did not get its vote"
                        ),
                        _ => tracing::info!(
                            campaigns = times,
                            "campaigning at once: a candidate's log is behind this node's and no leader has been heard from for a lease"
                        ),
                    }
                    drop(tokio::spawn(campaign(raft, times)));
                }
                Action::CampaignOnceDeposed { candidate_term } => {
                    self.metrics.early_campaigns.inc();
                    tracing::info!(
                        candidate_term,
                        "campaigning at once: a candidate deposed this node as leader and did not get its vote"
                    );
                    let lease = self.lease();
                    drop(tokio::spawn(async move {
                        // openraft ignores a leader's campaign: wait until the candidate's term deposes it (its
                        // followers answer its next calls with that term), and count from the term it then holds.
                        let deposed =
                            raft.wait(Some(lease)).metrics(|m| m.state != ServerState::Leader, "deposed").await;
                        let Ok(metrics) = deposed else {
                            tracing::info!(candidate_term, "not campaigning: still the leader a lease later");
                            return;
                        };
                        campaign(raft, self::core::campaigns_past(candidate_term, metrics.vote.leader_id().term)).await;
                    }));
                }
                Action::AskPreVotes(_) | Action::LookAt(_) => {
                    unreachable!("only a tick asks for pre-votes and looks, and the watch carries those out")
                }
            }
        }
    }

    /// Asks every other voter whether it would vote for this node now (`asked`), each within the shortest
    /// election timeout: `true` once a majority of every voter set (this node's own vote included) would.
    /// A node that cannot win this round does not campaign: its higher term would only depose a leader the
    /// others still follow, once it reached that leader (openraft 0.9 has no pre-vote of its own). A peer
    /// that cannot be reached, or a build without pre-votes that closes the connection, counts as refusing.
    async fn pre_vote(&self, asked: PreVote) -> bool {
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let membership = membership.membership();
        let configs = membership.get_joint_config();
        let mut granted = BTreeSet::from([self.id]);
        if majority_of_each(configs, &granted) {
            return true;
        }
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
}

/// Campaigns `times` in a row through openraft.
async fn campaign(raft: Raft<TypeConfig>, times: u64) {
    for _ in 0..times {
        if let Err(e) = raft.trigger().elect().await {
            tracing::warn!(%e, "cannot campaign");
            return;
        }
    }
}
