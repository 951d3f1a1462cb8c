//! openraft's network: one [`PeerNetwork`] per peer, over the connections of [`super::client::Peers`],
//! holding back commit notices that the next entries can carry.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast_store::{Durable, NodeId, TypeConfig};
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::{BasicNode, LogId, RaftNetwork, RaftNetworkFactory, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::client::{CallError, Peers};
use super::codec::Call;
use crate::purge::Purges;

/// See [`PeerNetwork::backoff`].
const UNREACHABLE_RETRY: Duration = Duration::from_millis(50);
/// How long the leader may hold back telling a follower of a newer commit index, for the next entries to
/// carry it instead ([`PeerNetwork::is_commit_notice`]). It delays a follower's apply of the last entries
/// of a burst (and what clients attached to that follower hear of them) by this, at most; tokio's timers
/// round it up to the next millisecond. A commit a follower may be waiting for is not held back
/// (`apply::Events::urgent_commit`).
pub const COMMIT_NOTICE_HOLD: Duration = Duration::from_millis(1);

/// openraft's network factory: one [`PeerNetwork`] per target, sharing the connections.
#[derive(Clone)]
pub struct Network {
    pub peers: Arc<Peers>,
    /// How far this node's log is durable: no commit index past it is sent (holdfast-store's `durable`
    /// module says why). `None`: commit indexes go as openraft gives them.
    pub durable: Option<Durable>,
    /// The highest log index whose commit a follower may be waiting for
    /// (`apply::Events::urgent_commits`): a commit notice through it is not held back. `None`:
    /// every notice may be.
    pub urgent: Option<tokio::sync::watch::Receiver<u64>>,
    /// Told of each snapshot chunk sent and each snapshot installed, so that the log the follower needs
    /// next is not purged meanwhile (`purge::Purges`). `None`: nobody is told.
    pub purges: Option<Arc<Purges>>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        PeerNetwork {
            target,
            addr: node.addr.clone(),
            peers: self.peers.clone(),
            durable: self.durable.clone(),
            urgent: self.urgent.clone(),
            purges: self.purges.clone(),
            acked: None,
            commit_told: None,
            commit_sent: Arc::default(),
            hold_for: COMMIT_NOTICE_HOLD,
            held: None,
        }
    }
}

/// openraft's connection to one peer.
pub struct PeerNetwork {
    target: NodeId,
    addr: String,
    peers: Arc<Peers>,
    durable: Option<Durable>,
    urgent: Option<tokio::sync::watch::Receiver<u64>>,
    purges: Option<Arc<Purges>>,
    /// What the peer last answered `Success` to on this connection: the vote it accepted, and the last log
    /// id it then held from that leader.
    acked: Option<(Vote<NodeId>, Option<LogId<NodeId>>)>,
    /// The newest commit index sent to the peer on this connection, or held back to be sent.
    commit_told: Option<LogId<NodeId>>,
    /// The newest commit index (its log index) that went out to the peer on this connection, as lowered to
    /// the durable log: a notice held back goes at once when a commit past it is urgent.
    commit_sent: Arc<AtomicU64>,
    /// How long a commit notice is held back: [`COMMIT_NOTICE_HOLD`].
    hold_for: Duration,
    /// A commit notice held back ([`COMMIT_NOTICE_HOLD`]), and the task that sends it if nothing else does.
    held: Option<(HeldNotice, tokio::task::JoinHandle<()>)>,
}

/// A commit notice held back, until the next request takes it away or its sender takes it to send.
type HeldNotice = Arc<Mutex<Option<AppendEntriesRequest<TypeConfig>>>>;

/// Lowers `rpc`'s commit index to the end of this node's durable log: a follower applies an entry only
/// once its leader's copy is durable too (holdfast-store's `durable` module). A follower whose commit
/// index was held back this way learns the rest from the next request (entries, a commit notice or a
/// heartbeat).
fn clamp_commit(durable: Option<&Durable>, rpc: &mut AppendEntriesRequest<TypeConfig>) {
    if let Some(durable) = durable {
        rpc.leader_commit = durable.clamp(rpc.leader_commit);
    }
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl PeerNetwork {
    /// Whether `rpc` only tells the peer of a newer commit index: no entries, from the leader and after the
    /// log id the peer last acknowledged on this connection, with a commit index not yet sent here.
    ///
    /// openraft 0.9 sends such a request to every follower as soon as an entry commits, and waits for its
    /// answer before it sends the next entries; one client's write thus cost each follower two requests
    /// (the entry, then its commit) and the leader two round trips per follower
    /// (docs/perf-notes/2026-12-02-commit-notice-on-next-entries.md). Its answer tells the leader nothing it does not
    /// know: the follower acknowledged that log id already, in this leader's term, after flushing it; a follower that
    /// since voted for another leader will say so to the next request with entries, or to the next heartbeat, which
    /// still go out and wait for their answers. openraft uses such an answer for nothing but its
    /// `millis_since_quorum_ack` metric, and leadership checks (`ensure_linearizable`) send requests of their own on
    /// connections of their own.
    fn is_commit_notice(&self, rpc: &AppendEntriesRequest<TypeConfig>) -> bool {
        rpc.entries.is_empty()
            && rpc.leader_commit > self.commit_told
            && self.acked.as_ref().is_some_and(|(vote, last)| *vote == rpc.vote && *last == rpc.prev_log_id)
    }

    /// Holds back the commit notice `rpc`: the next request on this connection carries its commit index;
    /// if none goes within [`COMMIT_NOTICE_HOLD`], or a commit the peer was not sent yet becomes urgent
    /// meanwhile (or was already), a task sends it alone (and drops its answer).
    fn hold(&mut self, rpc: AppendEntriesRequest<TypeConfig>, ttl: Duration) {
        let slot: HeldNotice = Arc::new(Mutex::new(Some(rpc)));
        let (peers, target, addr, durable) = (self.peers.clone(), self.target, self.addr.clone(), self.durable.clone());
        let (held, sent, hold_for, urgent) =
            (slot.clone(), self.commit_sent.clone(), self.hold_for, self.urgent.clone());
        let sender = tokio::spawn(async move {
            let unsent = sent.load(Ordering::Acquire);
            let urgent = async {
                match urgent {
                    // An error: the node is shutting down, and the notice may as well go.
                    Some(mut urgent) => drop(urgent.wait_for(|urgent| *urgent > unsent).await),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = tokio::time::sleep(hold_for) => {}
                () = urgent => {}
            }
            let Some(mut rpc) = held.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take() else { return };
            clamp_commit(durable.as_ref(), &mut rpc);
            sent.fetch_max(rpc.leader_commit.map_or(0, |commit| commit.index), Ordering::AcqRel);
            let answer: Result<Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>, _> =
                peers.call(target, &addr, Call::Append, &rpc, ttl).await;
            // Nothing to do with a failure: the next request to the peer carries the commit index again.
            if let Err(e) = answer {
                tracing::debug!(peer = target, %e, "a held-back commit notice did not reach its peer");
            }
        });
        self.held = Some((slot, sender));
    }

    async fn call<Req, Resp, E>(&self, call: Call, req: &Req, ttl: Duration) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let answer: Result<Resp, RaftError<NodeId, E>> =
            self.peers.call(self.target, &self.addr, call, req, ttl).await.map_err(|e| match e {
                CallError::Connect(_) => RPCError::Unreachable(Unreachable::new(&e)),
                _ => RPCError::Network(NetworkError::new(&e)),
            })?;
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerNetwork {
    /// How long the leader waits before trying an unreachable peer again. openraft's default, 500 ms, is
    /// longer than an election timeout: a follower that restarts would campaign (and depose a healthy
    /// leader) before the leader tried it again, as the container chaos test saw on every restart. A
    /// connection attempt to a peer that is down costs little, so try every 50 ms.
    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(std::iter::repeat(UNREACHABLE_RETRY))
    }

    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        // Whatever goes now carries a commit index at least as new as a notice held back (openraft's
        // `leader_commit` only grows on a replication stream), so the notice need not go on its own.
        if let Some((slot, sender)) = self.held.take() {
            if slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take().is_some() {
                sender.abort();
            }
        }
        if self.is_commit_notice(&rpc) {
            self.commit_told = rpc.leader_commit;
            self.hold(rpc, option.hard_ttl());
            return Ok(AppendEntriesResponse::Success);
        }
        // What openraft means to have told, not what goes: a request that repeats it is not a new notice.
        self.commit_told = self.commit_told.max(rpc.leader_commit);
        clamp_commit(self.durable.as_ref(), &mut rpc);
        self.commit_sent.fetch_max(rpc.leader_commit.map_or(0, |commit| commit.index), Ordering::AcqRel);
        let last = rpc.entries.last().map(|entry| entry.log_id).or(rpc.prev_log_id);
        let vote = rpc.vote;
        // Forgotten first: openraft drops this future when its timeout passes, and then nothing may be
        // answered for the peer until a call has been answered again.
        self.acked = None;
        let answer = self.call(Call::Append, &rpc, option.hard_ttl()).await;
        self.acked = match &answer {
            Ok(AppendEntriesResponse::Success) => Some((vote, last)),
            Ok(AppendEntriesResponse::PartialSuccess(matching)) => Some((vote, *matching)),
            _ => None,
        };
        answer
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        // The peer's log is replaced: what it acknowledged before says nothing about it any more.
        self.acked = None;
        if let Some(purges) = &self.purges {
            purges.sending(self.target, rpc.meta.last_log_id.map_or(0, |id| id.index));
        }
        let answer = self.call(Call::Snapshot, &rpc, option.hard_ttl()).await;
        if let (Some(purges), true, Ok(_)) = (&self.purges, rpc.done, &answer) {
            purges.sent(self.target);
        }
        answer
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.call(Call::Vote, &rpc, option.hard_ttl()).await
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use super::super::codec::{self, MESSAGE_BYTES_MAX};
    use super::*;

    const TTL: Duration = Duration::from_secs(5);

    /// What a recording peer saw of one append_entries request.
    #[derive(Debug, Clone, PartialEq)]
    struct Seen {
        prev: Option<u64>,
        entries: usize,
        commit: Option<u64>,
    }

    /// A peer that answers every append_entries with `Success`, except requests without entries while
    /// `refuse_empty` holds its vote (then with that vote, as a follower that voted for another leader).
    /// Sends what it saw, request by request, on the returned channel.
    async fn recording_peer(
        refuse_empty: Arc<Mutex<Option<Vote<NodeId>>>>,
    ) -> (String, tokio::sync::mpsc::UnboundedReceiver<Seen>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let (mut conn, _) = listener.accept().await.unwrap();
                let (tx, refuse_empty) = (tx.clone(), refuse_empty.clone());
                tokio::spawn(async move {
                    let mut hello = [0u8; 8];
                    conn.read_exact(&mut hello).await.unwrap();
                    let mut buf = Vec::new();
                    while codec::read_frame(&mut conn, &mut buf, MESSAGE_BYTES_MAX).await.unwrap_or(false) {
                        let rpc: AppendEntriesRequest<TypeConfig> = bincode::deserialize(&buf[1..]).unwrap();
                        let index = |id: Option<LogId<NodeId>>| id.map(|id| id.index);
                        let seen = Seen {
                            prev: index(rpc.prev_log_id),
                            entries: rpc.entries.len(),
                            commit: index(rpc.leader_commit),
                        };
                        let _ = tx.send(seen);
                        let refused = *refuse_empty.lock().unwrap();
                        let answer = match refused {
                            Some(vote) if rpc.entries.is_empty() => AppendEntriesResponse::HigherVote(vote),
                            _ => AppendEntriesResponse::Success,
                        };
                        let answer: Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>> = Ok(answer);
                        let mut frame = vec![0; 4];
                        bincode::serialize_into(&mut frame, &answer).unwrap();
                        // The caller may have given up on the call and closed the connection.
                        if codec::write_frame(&mut conn, &mut frame).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, rx)
    }

    const TERM: u64 = 3;

    fn log_id(index: u64) -> LogId<NodeId> {
        LogId::new(openraft::CommittedLeaderId::new(TERM, 1), index)
    }

    /// An append_entries of the leader of [`TERM`] after `prev`, with the entries after it up to `last`
    /// (none if `last` is `prev`) and commit `commit`.
    fn append(prev: u64, last: u64, commit: Option<u64>) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(TERM, 1),
            prev_log_id: Some(log_id(prev)),
            entries: (prev + 1..=last)
                .map(|index| openraft::Entry { log_id: log_id(index), payload: openraft::EntryPayload::Blank })
                .collect(),
            leader_commit: commit.map(log_id),
        }
    }

    async fn peer_network(addr: &str) -> PeerNetwork {
        let mut factory =
            Network { peers: Arc::new(Peers::new(None, None)), durable: None, urgent: None, purges: None };
        factory.new_client(2, &BasicNode { addr: addr.to_owned() }).await
    }

    fn option() -> RPCOption {
        RPCOption::new(TTL)
    }

    #[tokio::test]
    async fn a_commit_notice_is_answered_at_once_and_rides_on_the_next_entries() {
        let (addr, mut seen) = recording_peer(Arc::default()).await;
        let mut net = peer_network(&addr).await;
        let success = |answer: RpcResult<AppendEntriesResponse<NodeId>, _>| {
            assert!(matches!(answer, Ok(AppendEntriesResponse::Success)), "{answer:?}");
        };
        success(net.append_entries(append(4, 6, Some(4)), option()).await);
        assert_eq!(seen.recv().await.unwrap(), Seen { prev: Some(4), entries: 2, commit: Some(4) });

        // 5 and 6 committed: openraft tells the follower with a request of no entries after 6.
        success(net.append_entries(append(6, 6, Some(6)), option()).await);
        let (slot, _) = net.held.as_ref().expect("the notice is held back");
        let slot = slot.clone();
        assert!(slot.lock().unwrap().is_some());
        // The next entries go before the hold ends (this runtime has one thread, and nothing yielded to
        // the task that would send the notice): they carry commit 6, and the notice is not sent alone.
        success(net.append_entries(append(6, 7, Some(6)), option()).await);
        assert!(slot.lock().unwrap().is_none(), "the held notice was dropped, not left to its task");
        assert_eq!(seen.recv().await.unwrap(), Seen { prev: Some(6), entries: 1, commit: Some(6) });

        // 7 committed and nothing follows: the notice goes alone when the hold ends.
        success(net.append_entries(append(7, 7, Some(7)), option()).await);
        let alone = tokio::time::timeout(TTL, seen.recv()).await.expect("the held notice went out").unwrap();
        assert_eq!(alone, Seen { prev: Some(7), entries: 0, commit: Some(7) });
        // A heartbeat after it (no new commit index) is a real call: the peer saw it before it was answered.
        success(net.append_entries(append(7, 7, Some(7)), option()).await);
        assert_eq!(seen.try_recv().unwrap(), Seen { prev: Some(7), entries: 0, commit: Some(7) });
    }

    /// A notice held back goes at once when a commit it tells of becomes urgent (a lock handed over, a
    /// barrier answered), and at once when one already was; not for an urgent commit the peer was sent.
    #[tokio::test]
    async fn a_held_notice_goes_at_once_when_a_follower_may_be_waiting_for_its_commit() {
        let (addr, mut seen) = recording_peer(Arc::default()).await;
        let mut net = peer_network(&addr).await;
        let (urgent, urgent_rx) = tokio::sync::watch::channel(0);
        net.urgent = Some(urgent_rx);
        // Longer than the test may take: a notice that arrives went because its commit was urgent.
        net.hold_for = Duration::from_secs(3600);
        let success = |answer: RpcResult<AppendEntriesResponse<NodeId>, _>| {
            assert!(matches!(answer, Ok(AppendEntriesResponse::Success)), "{answer:?}");
        };
        success(net.append_entries(append(4, 6, Some(4)), option()).await);
        assert_eq!(seen.recv().await.unwrap(), Seen { prev: Some(4), entries: 2, commit: Some(4) });

        // Urgent through 4, which the peer was sent: the notice of 6 is held back.
        urgent.send_replace(4);
        success(net.append_entries(append(6, 6, Some(6)), option()).await);
        let (slot, _) = net.held.as_ref().expect("the notice is held back");
        let slot = slot.clone();
        // Its task runs (this runtime has one thread) and goes on waiting.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(slot.lock().unwrap().is_some(), "the notice of 6 went though nothing past 4 was urgent");
        // 6 becomes urgent: the notice goes.
        urgent.send_replace(6);
        let notice = tokio::time::timeout(TTL, seen.recv()).await.expect("the urgent notice went out").unwrap();
        assert_eq!(notice, Seen { prev: Some(6), entries: 0, commit: Some(6) });

        // 7 committed, urgent before its notice is held: it goes at once as well.
        success(net.append_entries(append(6, 7, Some(6)), option()).await);
        assert_eq!(seen.recv().await.unwrap(), Seen { prev: Some(6), entries: 1, commit: Some(6) });
        urgent.send_replace(7);
        success(net.append_entries(append(7, 7, Some(7)), option()).await);
        let notice = tokio::time::timeout(TTL, seen.recv()).await.expect("the urgent notice went out").unwrap();
        assert_eq!(notice, Seen { prev: Some(7), entries: 0, commit: Some(7) });
    }

    #[tokio::test]
    async fn only_a_new_commit_index_after_what_the_peer_acknowledged_is_held_back() {
        let refuse_empty = Arc::new(Mutex::new(None));
        let (addr, mut seen) = recording_peer(refuse_empty.clone()).await;
        let mut net = peer_network(&addr).await;
        // Nothing acknowledged on this connection yet (a leadership check's own connection, or a new
        // replication stream): a request without entries is a real call.
        assert!(!net.is_commit_notice(&append(4, 4, Some(4))));
        net.append_entries(append(4, 5, Some(4)), option()).await.unwrap();
        assert_eq!(seen.recv().await.unwrap().entries, 1);
        assert!(net.is_commit_notice(&append(5, 5, Some(5))));
        assert!(!net.is_commit_notice(&append(5, 5, Some(4))), "no newer commit index: a heartbeat");
        assert!(!net.is_commit_notice(&append(4, 4, Some(5))), "not after what was acknowledged");
        assert!(!net.is_commit_notice(&append(5, 6, Some(5))), "it carries entries");
        let mut newer_vote = append(5, 5, Some(5));
        newer_vote.vote = Vote::new_committed(TERM + 1, 1);
        assert!(!net.is_commit_notice(&newer_vote), "acknowledged under another vote");

        // A follower that voted for another leader says so to a heartbeat: that answer is never made up.
        *refuse_empty.lock().unwrap() = Some(Vote::new_committed(TERM + 1, 3));
        let answer = net.append_entries(append(5, 5, Some(4)), option()).await;
        assert!(matches!(answer, Ok(AppendEntriesResponse::HigherVote(_))), "{answer:?}");
        assert_eq!(seen.recv().await.unwrap(), Seen { prev: Some(5), entries: 0, commit: Some(4) });
        // Nor, after that answer, to a new commit index.
        assert!(!net.is_commit_notice(&append(5, 5, Some(5))));
        let answer = net.append_entries(append(5, 5, Some(5)), option()).await;
        assert!(matches!(answer, Ok(AppendEntriesResponse::HigherVote(_))), "{answer:?}");

        // A call that openraft gave up on (its timeout dropped the future) leaves nothing acknowledged.
        *refuse_empty.lock().unwrap() = None;
        net.append_entries(append(5, 6, Some(5)), option()).await.unwrap();
        assert!(net.is_commit_notice(&append(6, 6, Some(6))));
        let started = {
            let mut call = std::pin::pin!(net.append_entries(append(6, 7, Some(5)), option()));
            // Polled once, as far as its first wait for the peer, then dropped.
            futures_poll_once(call.as_mut()).await
        };
        assert!(started, "the call was waiting for the peer when it was dropped");
        assert!(!net.is_commit_notice(&append(6, 6, Some(6))), "nothing acknowledged after a dropped call");
    }

    /// A commit index past the end of the leader's durable log is lowered to it on the wire, in requests
    /// with entries, heartbeats and held-back notices alike; what openraft meant to tell still decides
    /// what counts as a new notice.
    #[tokio::test]
    async fn no_commit_index_past_the_durable_log_is_sent() {
        use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
        let (addr, mut seen) = recording_peer(Arc::default()).await;
        // A leader's log, durable through 5, with 6 and 7 written but not yet synced.
        let disk = holdfast_store::MemDisk::new();
        let (log, _sm) = holdfast_store::open_memory(&disk, Arc::new(holdfast_store::NoObserver));
        let mut log = log.acknowledge_own_appends(1);
        log.save_vote(&Vote::new_committed(TERM, 2)).await.unwrap();
        let blank = |index| openraft::Entry { log_id: log_id(index), payload: openraft::EntryPayload::Blank };
        log.blocking_append((1..=5).map(blank)).await.unwrap();
        log.save_vote(&Vote::new_committed(TERM, 1)).await.unwrap();
        log.blocking_append((6..=7).map(blank)).await.unwrap();
        let durable = log.durable();
        assert_eq!(durable.last(), Some(log_id(5)));

        let mut factory =
            Network { peers: Arc::new(Peers::new(None, None)), durable: Some(durable), urgent: None, purges: None };
        let mut net = factory.new_client(2, &BasicNode { addr: addr.clone() }).await;
        net.append_entries(append(4, 7, Some(6)), option()).await.unwrap();
        assert_eq!(seen.recv().await.unwrap(), Seen { prev: Some(4), entries: 3, commit: Some(5) });
        net.append_entries(append(7, 7, Some(4)), option()).await.unwrap();
        assert_eq!(seen.recv().await.unwrap(), Seen { prev: Some(7), entries: 0, commit: Some(4) });
        // A notice of 7 is held back and goes alone, lowered to 5.
        assert!(net.is_commit_notice(&append(7, 7, Some(7))));
        net.append_entries(append(7, 7, Some(7)), option()).await.unwrap();
        let alone = tokio::time::timeout(TTL, seen.recv()).await.expect("the held notice went out").unwrap();
        assert_eq!(alone, Seen { prev: Some(7), entries: 0, commit: Some(5) });
        // openraft told 7 already: a heartbeat with it is no new notice, and goes out (still lowered).
        assert!(!net.is_commit_notice(&append(7, 7, Some(7))));
        net.append_entries(append(7, 7, Some(7)), option()).await.unwrap();
        assert_eq!(seen.try_recv().unwrap(), Seen { prev: Some(7), entries: 0, commit: Some(5) });
    }

    /// Polls `future` once; true if it was not done yet.
    async fn futures_poll_once<F: std::future::Future>(future: std::pin::Pin<&mut F>) -> bool {
        let mut future = Some(future);
        std::future::poll_fn(|cx| std::task::Poll::Ready(future.take().unwrap().poll(cx).is_pending())).await
    }
}
