//! Taking a request to the leader: served here when this node leads, forwarded over the peer port when it
//! follows, and retried only where nothing was delivered; and a follower's batches of writes, heartbeats
//! and barriers, each one request with one answer per item.

use std::time::Duration;

use holdfast_core::SessionId;

use holdfast_store::NodeId;
use tokio::time::Instant;

use super::batches::{LeaderBatches, BATCHES_REFUSED_FOR};
use super::Router;
use crate::metrics::Forwarded;
use crate::peer::client::CallError;
use crate::peer::codec::Call;
use crate::peer::protocol::{
    ForwardReply, ForwardRequest, HeartbeatReply, NodeError, Request, Written, REQUEST_TIMEOUT,
};

/// The pause between attempts while no leader is known or the leader just changed.
const RETRY_PAUSE: Duration = Duration::from_millis(25);

impl Router {
    pub(super) async fn through_leader(&self, request: &ForwardRequest) -> Result<ForwardReply, NodeError> {
        self.through_leader_within(request, REQUEST_TIMEOUT).await
    }

    pub(super) async fn through_leader_within(
        &self,
        request: &ForwardRequest,
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
            let attempt = match self.elections.heard_leader(current) {
                // Both boxed: each is a large future (the leader's serving 1.2 KiB), and a request's future
                // would otherwise carry the larger of the two inline wherever it is served, for as long as
                // it waits (a session's stream waits for its close like this). One allocation a request.
                Some(leader) if leader == self.elections.id() => Box::pin(self.leader.serve(request.clone())).await,
                Some(leader) => Box::pin(self.forward(leader, request, deadline)).await,
                None => Err(NodeError::NotLeader { leader: None }),
            };
            // Not for a refusal (a limit, bad input): the leader served that.
            if let Err(
                NodeError::NotLeader { .. }
                | NodeError::Unreachable(_)
                | NodeError::Timeout(_)
                | NodeError::Unavailable(_),
            ) = attempt
            {
                self.mark_unserved();
            }
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
            ForwardRequest::Heartbeats(_) | ForwardRequest::HeartbeatsWaited { .. } => Forwarded::Heartbeats,
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
                    self.batches.record(LeaderBatches::Read(leader));
                }
                reply
            }
            Err(CallError::Timeout(timeout)) => Err(NodeError::Timeout(timeout)),
            // Nothing was sent: the request may go to the next leader.
            Err(e @ CallError::Connect(_)) => Err(NodeError::Unreachable(format!("node {leader}: {e}"))),
            Err(e @ CallError::Broken(_)) if matches!(request, ForwardRequest::HeartbeatsWaited { .. }) => {
                // A leader of a build from before waited batches (or one that failed meanwhile): it is sent
                // plain batches for a while.
                tracing::warn!(leader, %e, "the leader closed the connection on a batch of heartbeats with their wait; sending plain batches for {BATCHES_REFUSED_FOR:?}");
                self.batches.refused_waited(leader);
                Err(NodeError::Unavailable(format!("forwarding to node {leader}: {e}")))
            }
            Err(e @ CallError::Broken(_)) if request.is_batch() => {
                // So does a leader of a build from before batches, which cannot decode one (or a leader that
                // failed meanwhile): heartbeats and writes go to it one by one for a while. The writes of a
                // batch were received, and may have been applied: theirs is the error below, as for one.
                tracing::warn!(leader, %e, "the leader closed the connection on a batch; forwarding one by one for {BATCHES_REFUSED_FOR:?}");
                self.batches.record(LeaderBatches::Refused(leader, Instant::now() + BATCHES_REFUSED_FOR));
                Err(NodeError::Unavailable(format!("forwarding to node {leader}: {e}")))
            }
            Err(e) => Err(NodeError::Unavailable(format!("forwarding to node {leader}: {e}"))),
        }
    }

    /// Resolves once this node no longer takes `leader` for the leader: it learned of another, or of an
    /// election, or it stopped, or the leader has said nothing for as long as `Elections::leader` allows (a
    /// follower cut off from its leader stays its follower). openraft's server metrics change only with
    /// the vote, role, leader or membership, so a forward that waits here is not woken by every entry
    /// applied meanwhile, as the full metrics would; the silence is one timer, pushed back while the
    /// leader is heard from.
    async fn stops_following(&self, leader: NodeId) {
        let mut server = self.raft.server_metrics();
        let changed = server.wait_for(|server| server.current_leader != Some(leader));
        let silent = async {
            loop {
                let until = self.elections.follows_until(Instant::now());
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

    pub(super) async fn write_alone(&self, request: Request) -> Result<Written, NodeError> {
        match self.through_leader(&ForwardRequest::Write(request)).await? {
            ForwardReply::Written(written) => Ok(written),
            other => Err(NodeError::Unavailable(format!("the leader answered a write with {other:?}"))),
        }
    }

    /// One result per write of `requests`, in order, from one request through the leader. A write the
    /// leader answered "not the leader" was not proposed, and goes again on its own.
    pub(super) async fn forward_writes(&self, requests: Vec<Request>) -> Vec<Result<Written, NodeError>> {
        let count = requests.len();
        let batch = ForwardRequest::Writes(requests);
        let error = match self.through_leader(&batch).await {
            Ok(ForwardReply::Writes(results)) if results.len() == count => {
                if !results.iter().any(|result| matches!(result, Err(NodeError::NotLeader { .. }))) {
                    return results;
                }
                let ForwardRequest::Writes(requests) = batch else { unreachable!("made a batch of writes above") };
                let answers = requests.into_iter().zip(results).map(|(request, result)| async move {
                    match result {
                        // Boxed: a lone write's future is a kilobyte, and every write of the batch would
                        // carry one inline while the batch's answers are joined.
                        Err(NodeError::NotLeader { .. }) => Box::pin(self.write_alone(request)).await,
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

    /// One barrier through the leader, its answer given `count` times.
    pub(super) async fn forward_barrier(&self, count: usize) -> Vec<Result<u64, NodeError>> {
        let index = match self.through_leader(&ForwardRequest::Barrier).await {
            Ok(ForwardReply::Barrier(index)) => Ok(index),
            Ok(other) => Err(NodeError::Unavailable(format!("the leader answered a barrier with {other:?}"))),
            Err(e) => Err(e),
        };
        vec![index; count]
    }

    pub(super) async fn heartbeat_alone(&self, id: SessionId) -> Result<HeartbeatReply, NodeError> {
        match self.through_leader(&ForwardRequest::Heartbeat(id)).await? {
            ForwardReply::Heartbeat(reply) => Ok(reply),
            other => Err(NodeError::Unavailable(format!("the leader answered a heartbeat with {other:?}"))),
        }
    }

    /// One answer per session in `ids`, in order, from one request through the leader (this node, if it
    /// became leader meanwhile), telling it how long the oldest of them, which arrived at `oldest`, waited
    /// here while a leader served this node, plus this node's runtime lag (`load.rs`); in a plain batch to
    /// a leader that refused that, one by one to a leader that refused batches.
    pub(super) async fn forward_heartbeats(
        &self,
        ids: Vec<SessionId>,
        oldest: Instant,
    ) -> Vec<Result<HeartbeatReply, NodeError>> {
        let count = ids.len();
        let mut waited = true;
        let error = loop {
            let leader = self.raft.metrics().borrow().current_leader;
            waited = waited && leader.is_none_or(|leader| self.batches.reads_waited(leader));
            let request = if waited {
                // The runtime lag too: before this node read them, they may have waited that long unread.
                let waited = self.waited_while_served(oldest) + self.load.runtime_lag();
                let waited_ms = waited.as_millis().min(u32::MAX.into()) as u32;
                ForwardRequest::HeartbeatsWaited { ids: ids.clone(), waited_ms }
            } else {
                ForwardRequest::Heartbeats(ids.clone())
            };
            match self.through_leader(&request).await {
                Ok(ForwardReply::Heartbeats(replies)) if replies.len() == count => {
                    return replies.into_iter().map(Ok).collect()
                }
                Ok(other) => {
                    break NodeError::Unavailable(format!("the leader answered {count} heartbeats with {other:?}"))
                }
                Err(_) if self.batches.refused(self.raft.metrics().borrow().current_leader) => {
                    let alone = ids.into_iter().map(|id| self.heartbeat_alone(id));
                    return futures_util::future::join_all(alone).await;
                }
                // Heartbeats may be sent twice: the same batch goes again, plain.
                Err(_) if waited && !leader.is_none_or(|leader| self.batches.reads_waited(leader)) => waited = false,
                Err(e) => break e,
            }
        };
        vec![Err(error); count]
    }
}
