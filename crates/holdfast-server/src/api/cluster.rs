//! The cluster as this node sees it (`GET /v1/cluster`, `ClusterStatus`), whether it is ready for
//! traffic (`/readyz`, `grpc.health.v1`), and the metrics page (`/metrics`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use holdfast_store::NodeId;
use openraft::ServerState;

use super::Api;

/// A node this many entries behind its own log is still catching up.
const READY_LAG_ENTRIES: u64 = 100;

/// This node, the leader, the term, the members, and how far the log is.
#[derive(Debug, Clone)]
pub struct ClusterView {
    pub id: NodeId,
    /// This node's Raft role (`Leader`, `Follower`, …).
    pub state: String,
    /// The leader as this node knows it.
    pub leader: Option<NodeId>,
    pub term: u64,
    /// Every member's peer address.
    pub members: BTreeMap<NodeId, String>,
    pub voters: BTreeSet<NodeId>,
    pub learners: BTreeSet<NodeId>,
    pub last_log_index: Option<u64>,
    pub committed_index: u64,
    pub applied_index: Option<u64>,
    pub snapshot_index: Option<u64>,
    /// On the leader: how long since a quorum last acknowledged it.
    pub millis_since_quorum_ack: Option<u64>,
    /// Every other member, as this node sees it.
    pub peers: BTreeMap<NodeId, PeerView>,
    /// This node's wall clock, in milliseconds since the Unix epoch: what a page counts lease ends from.
    pub now_ms: u64,
}

/// Another member as this node sees it: how far the leader knows its log matches, and when this node last
/// heard from it. A follower hears mostly from the leader, so the leader's view is the whole picture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerView {
    /// On the leader: the last log index known to be on the peer.
    pub matched_index: Option<u64>,
    /// How long ago this node last heard from the peer: an answer to a call of this node or, from the
    /// leader this node follows, a call. `None`: nothing since this node started.
    pub last_heard_ms: Option<u64>,
}

impl Api {
    /// The cluster as this node sees it.
    pub fn cluster(&self) -> ClusterView {
        let leader = self.elections.leader();
        // Before the borrow below: `last_heard` reads openraft's metrics too, and a second read of them while
        // openraft waits to write them blocks for ever, holding up the writer and, with it, the whole node.
        let heard = self.elections.last_heard();
        let now = tokio::time::Instant::now();
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        let membership = m.membership_config.membership();
        let peers = membership
            .nodes()
            .map(|(id, _)| *id)
            .filter(|id| *id != self.id())
            .map(|id| {
                let matched_index = m.replication.as_ref().and_then(|r| r.get(&id)).and_then(|l| l.map(|l| l.index));
                let last_heard_ms = heard.get(&id).map(|at| now.saturating_duration_since(*at).as_millis() as u64);
                (id, PeerView { matched_index, last_heard_ms })
            })
            .collect();
        ClusterView {
            id: self.id(),
            state: format!("{:?}", m.state),
            leader,
            term: m.current_term,
            members: membership.nodes().map(|(id, n)| (*id, n.addr.clone())).collect(),
            voters: membership.voter_ids().collect(),
            learners: membership.learner_ids().collect(),
            last_log_index: m.last_log_index,
            committed_index: self.committed_index.load(Ordering::Relaxed),
            applied_index: m.last_applied.map(|l| l.index),
            snapshot_index: m.snapshot.map(|l| l.index),
            millis_since_quorum_ack: m.millis_since_quorum_ack,
            peers,
            now_ms: crate::clock::wall_ms(),
        }
    }

    /// The store's disk (`None`: a store in memory).
    pub fn disk(&self) -> Option<&holdfast_store::Disk> {
        self.disk.as_ref()
    }

    /// Whether this node may take traffic: its disk has room and its syncs finish, a leader is known (on a
    /// follower, one heard from lately), and this node applied its log.
    pub fn readiness(&self) -> Result<(), String> {
        if let Some(disk) = &self.disk {
            let state = *disk.state().borrow();
            if state.full {
                return Err(format!(
                    "disk full: {} bytes free under {} (the reserve is {} bytes): this node stores no new entries \
                     until there is room",
                    state.free,
                    disk.dir().display(),
                    disk.reserve()
                ));
            }
            if let Some(waited) = state.stalled {
                return Err(format!(
                    "disk stalled: the raft log's sync under {} has kept a write waiting {} ms: this node stores \
                     no new entries until its syncs finish",
                    disk.dir().display(),
                    waited.as_millis()
                ));
            }
        }
        if let Some(cut) = self.elections.votes_held() {
            return Err(format!(
                "catching up: this node's log was cut where its disk damaged it ({cut}); it grants no vote until \
                 its log reaches its leader's"
            ));
        }
        let leader = self.elections.leader();
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        m.running_state.as_ref().map_err(|e| format!("raft stopped: {e}"))?;
        let Some(leader) = leader else {
            return Err("no leader known".into());
        };
        if leader == self.id() && m.state != ServerState::Leader {
            return Err("leader election in progress".into());
        }
        let applied = m.last_applied.map_or(0, |l| l.index);
        let committed = self.committed_index.load(Ordering::Relaxed);
        if applied + READY_LAG_ENTRIES < committed {
            return Err(format!("catching up: applied {applied} of {committed} committed"));
        }
        Ok(())
    }

    /// Sets the gauges read at scrape time, then encodes every metric.
    pub fn metrics_page(&self) -> String {
        let m = &self.metrics;
        m.has_leader.set(self.elections.leader().is_some().into());
        let ms = |lag: std::time::Duration| i64::try_from(lag.as_millis()).unwrap_or(i64::MAX);
        m.runtime_lag_ms.set(ms(self.load.runtime_lag()));
        m.runtime_busy.set(f64::from(self.load.busy_permille()) / 1000.0);
        if let Some(disk) = &self.disk {
            let state = *disk.state().borrow();
            m.disk_free.set(i64::try_from(state.free).unwrap_or(i64::MAX));
            m.disk_full.set(state.full.into());
            m.disk_stalled.set(state.stalled.is_some().into());
        }
        m.heartbeat_lag_ms.set(ms(self.load.heartbeat_lag()));
        let applied = {
            let raft = self.raft.metrics();
            let r = raft.borrow();
            m.is_leader.set((r.state == ServerState::Leader).into());
            m.term.set(r.current_term as i64);
            m.last_log_index.set(r.last_log_index.unwrap_or(0) as i64);
            r.last_applied.map_or(0, |l| l.index)
        };
        let committed = self.committed_index.load(Ordering::Relaxed);
        m.committed_index.set(committed as i64);
        m.applied_index.set(applied as i64);
        m.apply_lag.set(committed.saturating_sub(applied) as i64);
        {
            let state = crate::state::read(&self.state);
            m.locks_held.set(state.lock_count() as i64);
            m.waiters.set(state.waiter_count() as i64);
            m.sessions.set(state.session_count() as i64);
        }
        m.encode()
    }
}
