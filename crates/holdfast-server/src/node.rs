//! A node's parts, built and wired together: each part gets the narrow handles it needs, and the node
//! answers the peer port ([`peer::server::Handler`]) by handing each call to the part it is for.

use crate::load::Load;
use crate::purge::Purges;
use std::io;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use holdfast_store::{Durable, NodeId, Recovering, SharedState, SnapshotPiece, SnapshotSource, TypeConfig};
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::Raft;
use tokio::task::JoinHandle;

use crate::api::auth::Secret;
use crate::api::auth::{Auth, AuthConfig};
use crate::api::{self, Api, FrontLimits};
use crate::apply::events::Events;
use crate::clock::WallClock;
use crate::election::Elections;
use crate::faults::Bugs;
use crate::leader::append::Appender;
use crate::leader::proposer::Proposer;
use crate::leader::{self, Leader};
use crate::metrics::Metrics;
use crate::peer;
use crate::peer::client::Peers;
use crate::peer::codec::SNAPSHOT_CHUNK_BYTES;
use crate::peer::protocol::{ForwardReply, ForwardRequest, LogEnd, NodeError, PreVote, PreVoteAnswer, SnapshotFetch};
use crate::random::Random;
use crate::route::{self, Router};

/// A running node, as its embedder sees it: the simulation watches its Raft and reads its lock state, a
/// test drives its API.
pub struct Node {
    pub id: NodeId,
    pub raft: Raft<TypeConfig>,
    /// The lock state this node applies to.
    pub state: SharedState,
    /// The last committed log index this node knows of.
    pub committed_index: Arc<AtomicU64>,
    /// The node as its clients see it: what the fronts serve.
    pub api: Arc<Api>,
    events: Arc<Events>,
    elections: Arc<Elections>,
    leader: Arc<Leader>,
    route: Arc<Router>,
    peers: Arc<Peers>,
    purges: Arc<Purges>,
    mending: Mending,
    bugs: Bugs,
}

/// What mends damaged data: this node's current snapshot, for peers whose own is damaged (`None`: a store
/// without snapshot files), and the cut of its own damaged log while it has not caught up.
struct Mending {
    snapshots: Option<SnapshotSource>,
    recovering: Option<Recovering>,
}

/// What a node is built from: its Raft and storage, and the settings of [`crate::Config`] its parts take.
pub struct Parts {
    pub raft: Raft<TypeConfig>,
    pub state: SharedState,
    pub events: Arc<Events>,
    pub peers: Arc<Peers>,
    pub metrics: Arc<Metrics>,
    /// The last committed index the log store knows of.
    pub committed_index: Arc<AtomicU64>,
    /// How far the log is durable: its last entry is what a pre-vote offers.
    pub durable: Durable,
    /// The store's disk (`None`: in memory).
    pub disk: Option<holdfast_store::Disk>,
    pub limits: FrontLimits,
    pub auth: AuthConfig,
    pub admin_key: Option<Secret>,
    pub clock: WallClock,
    pub rng_seed: Option<u64>,
    pub queue_hold: Duration,
    /// How far the node purges its log (shared with its Raft network, which tells it of snapshots sent).
    pub purges: Arc<Purges>,
    /// The store's current snapshot, as peers fetch it (`None`: a store without snapshot files).
    pub snapshots: Option<SnapshotSource>,
    /// The cut of the store's damaged log, if it has not caught up since: the node holds its votes until
    /// it has.
    pub recovering: Option<Recovering>,
    pub bugs: Bugs,
}

impl Node {
    /// Builds node `id`'s parts, bottom up.
    pub fn new(id: NodeId, parts: Parts) -> Self {
        let Parts {
            raft,
            state,
            events,
            peers,
            metrics,
            committed_index,
            durable,
            disk,
            limits,
            auth,
            admin_key,
            clock,
            rng_seed,
            queue_hold,
            purges,
            snapshots,
            recovering,
            bugs,
        } = parts;
        let random = Arc::new(Random::new(rng_seed));
        let elections =
            Arc::new(Elections::new(id, raft.clone(), peers.clone(), durable, random.clone(), metrics.clone(), bugs));
        // Before the peer port is served: no vote may be granted with a cut log.
        elections.hold(recovering.as_ref().map(|recovering| recovering.cut.clone()));
        let appender = Arc::new(Appender::new(raft.clone(), state.clone(), elections.clone(), metrics.clone(), clock));
        let auth = Auth::new(auth);
        let load = Arc::new(Load::new(limits.overload_delay, limits.overload_busy));
        let leader = Arc::new(Leader::new(leader::Parts {
            raft: raft.clone(),
            state: state.clone(),
            events: events.clone(),
            elections: elections.clone(),
            metrics: metrics.clone(),
            appender,
            proposer: Proposer::new(queue_hold),
            random,
            tenants: auth.tenant_limits(),
            load: load.clone(),
            bugs,
        }));
        let route = Arc::new(Router::new(route::Parts {
            raft: raft.clone(),
            state: state.clone(),
            events: events.clone(),
            elections: elections.clone(),
            leader: leader.clone(),
            peers: peers.clone(),
            metrics: metrics.clone(),
            load: load.clone(),
            bugs,
        }));
        let api = Arc::new(Api::new(api::Parts {
            raft: raft.clone(),
            state: state.clone(),
            events: events.clone(),
            elections: elections.clone(),
            leader: leader.clone(),
            route: route.clone(),
            metrics,
            committed_index: committed_index.clone(),
            disk,
            limits,
            auth,
            admin_key,
            load,
            bugs,
        }));
        let mending = Mending { snapshots, recovering };
        Node { id, raft, state, committed_index, api, events, elections, leader, route, peers, purges, mending, bugs }
    }

    /// The peer connections, which a TLS reload resets.
    pub fn peers(&self) -> &Arc<Peers> {
        &self.peers
    }

    /// Starts the node's background tasks until `stop` changes: the lease keeper, the confirmer's quorum
    /// rounds, the proposer, the waiter pings, the election watch and the load probe. The proposer runs until aborted (once
    /// the client requests drained): it is the first handle, the rest end on `stop`.
    pub fn spawn_tasks(&self, stop: &tokio::sync::watch::Receiver<bool>) -> (JoinHandle<()>, Vec<JoinHandle<()>>) {
        let (leader, stop_keeper) = (self.leader.clone(), stop.clone());
        let keeper = tokio::spawn(async move { leader.run_keeper(stop_keeper).await });
        let (confirmer, stop_confirmer) = (self.leader.confirmer().clone(), stop.clone());
        let confirmer = tokio::spawn(async move { confirmer.run(stop_confirmer).await });
        let leader = self.leader.clone();
        let proposer = tokio::spawn(async move { leader.run_proposer().await });
        let (route, stop_pings) = (self.route.clone(), stop.clone());
        let pings = tokio::spawn(async move { route.run_waiter_pings(stop_pings).await });
        let (elections, stop_elections) = (self.elections.clone(), stop.clone());
        let watch = tokio::spawn(async move { elections.run(stop_elections).await });
        let (load, stop_probe) = (self.api.load().clone(), stop.clone());
        let probe = tokio::spawn(async move { load.run_probe(stop_probe).await });
        let (purges, raft, stop_purges) = (self.purges.clone(), self.raft.clone(), stop.clone());
        let purging = tokio::spawn(async move { purges.run(raft, stop_purges).await });
        let mut tasks = vec![keeper, confirmer, pings, watch, probe, purging];
        if let Some(recovering) = self.mending.recovering.clone() {
            let (elections, stop_catch_up) = (self.elections.clone(), stop.clone());
            tasks.push(tokio::spawn(async move { elections.catch_up(recovering, stop_catch_up).await }));
        }
        if let Some(disk) = self.api.disk().cloned() {
            let (leader, stop_disk) = (self.leader.clone(), stop.clone());
            tasks.push(tokio::spawn(async move { leader.run_disk_watch(disk, stop_disk).await }));
        }
        (proposer, tasks)
    }
}

impl peer::server::Handler for Node {
    async fn append(
        &self,
        rpc: AppendEntriesRequest<TypeConfig>,
    ) -> Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        let _call = self.elections.leader_call();
        self.raft.append_entries(rpc).await
    }

    async fn vote(&self, rpc: VoteRequest<NodeId>) -> Result<VoteResponse<NodeId>, RaftError<NodeId>> {
        if self.elections.votes_held().is_some() {
            tracing::info!(candidate = %rpc.vote, "refused a vote: this node's cut log has not caught up");
            return Ok(self.elections.refused_vote());
        }
        let (candidate, last) = (rpc.vote, rpc.last_log_id);
        let voted = self.raft.vote(rpc).await;
        if let Ok(voted) = &voted {
            self.elections.vote_answered(&candidate, last, voted);
        }
        voted
    }

    async fn snapshot(
        &self,
        rpc: InstallSnapshotRequest<TypeConfig>,
    ) -> Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        // A leader streaming a snapshot sends no AppendEntries meanwhile: its chunks are word from it, and
        // so is the wait for the last chunk's answer, which comes once the snapshot is installed.
        let _call = self.elections.leader_call();
        self.raft.install_snapshot(rpc).await
    }

    async fn forward(&self, request: ForwardRequest) -> io::Result<Result<ForwardReply, NodeError>> {
        if self.bugs.no_heartbeat_batches() && request.is_batch() {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "undecodable: a batch"));
        }
        let reply = self.leader.serve(request).await;
        // The asking follower's reads wait until it applied through the barrier's index.
        if let Ok(ForwardReply::Barrier(index)) = &reply {
            self.events.urgent_commit(*index);
        }
        Ok(reply)
    }

    fn pre_vote(&self, asked: &PreVote) -> PreVoteAnswer {
        self.elections.answer_pre_vote(asked)
    }

    fn log_end(&self) -> LogEnd {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        LogEnd {
            leader: m.state == openraft::ServerState::Leader && m.current_leader == Some(self.id),
            term: m.vote.leader_id().term,
            last_index: m.last_log_index.unwrap_or(0),
        }
    }

    async fn fetch_snapshot(&self, asked: SnapshotFetch) -> Result<SnapshotPiece, NodeError> {
        let Some(source) = &self.mending.snapshots else {
            return Err(NodeError::Unavailable("this node keeps no snapshot files".into()));
        };
        let through = asked.through;
        match source.piece(through, asked.offset, SNAPSHOT_CHUNK_BYTES as usize).await {
            Ok(Some(piece)) => Ok(piece),
            Ok(None) => {
                // None stored covers that far: build one now if this node applied that far (openraft
                // builds one at a time), for the asker's next try.
                let applied = self.raft.metrics().borrow().last_applied.map_or(0, |id| id.index);
                if applied >= through {
                    let _ = self.raft.trigger().snapshot().await;
                }
                let detail =
                    format!("no snapshot here covers the log through {through} yet (applied through {applied})");
                Err(NodeError::Unavailable(detail))
            }
            Err(e) => Err(NodeError::Unavailable(format!("reading the current snapshot: {e}"))),
        }
    }
}
