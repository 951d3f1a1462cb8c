//! Membership changes, made by the leader: a node is added as a learner until it caught up, then made a
//! voter; a voter or learner is removed. Both are read from a confirmed leader's view of the membership.

use std::collections::BTreeSet;
use std::time::Duration;

use holdfast_store::NodeId;
use openraft::error::{ClientWriteError, RaftError};
use openraft::BasicNode;

use super::Leader;
use crate::peer::protocol::NodeError;

/// How long adding or removing a member may take: an added node first catches up as a learner, which may
/// take a snapshot transfer.
pub const MEMBERSHIP_TIMEOUT: Duration = Duration::from_secs(60);

impl Leader {
    /// As leader: adds `id` as a learner, waits until it caught up, then makes it a voter. Adding a voter
    /// again at the same address does nothing, so a retried call is harmless.
    pub(super) async fn add_member(&self, id: NodeId, addr: String) -> Result<(), NodeError> {
        self.elections.check_leader()?;
        // The answers below are read from this node's view of the membership: only a confirmed leader's view
        // is current: a deposed leader that had not heard of a removal would answer "already a voter" and
        // change nothing (a reproduction: crates/holdfast-sim/tests/regressions.rs).
        self.confirmer.confirm_leader().await?;
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
        let changes = openraft::ChangeMembers::AddVoterIds(BTreeSet::from([id]));
        self.raft.change_membership(changes, false).await.map_err(membership_error)?;
        tracing::info!(id, %addr, "node is a voter");
        Ok(())
    }

    /// As leader: removes `id`, voter or learner. The last voter cannot be removed.
    pub(super) async fn remove_member(&self, id: NodeId) -> Result<(), NodeError> {
        self.elections.check_leader()?;
        // As in add_member: "not a member" and "last member" must come from a confirmed leader's view.
        self.confirmer.confirm_leader().await?;
        let membership = self.raft.metrics().borrow().membership_config.membership().clone();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        if membership.get_node(&id).is_none() {
            return Err(refused("not-a-member", format!("node {id} is not a member")));
        }
        let ids = BTreeSet::from([id]);
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
}

/// A membership change refused for the reason `slug` names; nothing changed.
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
