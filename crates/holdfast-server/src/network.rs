//! The peer network: openraft's RPCs and forwarded client requests between nodes, on the peer port.
//!
//! Each call is one request frame and one answer frame on a connection of its own while it lasts, in the
//! wire format of [`crate::wire`]. The caller's task writes the request and reads the answer on the socket
//! itself: no connection task and no channel stand between openraft and the kernel. That is what this
//! module is for. Over gRPC, a call crossed hyper's and h2's connection tasks on both ends: the nodes
//! spent up to twice the CPU per write, and one client's acquire+release took about twice as long
//! (docs/benchmarks.md).
//!
//! Finished calls leave their connection in [`Peers`]' idle pool for the next call to the same peer, so a
//! replication stream keeps reusing one connection. A connection that failed or timed out is dropped, and
//! the next call makes a new one. Before a forwarded client request (which is never sent twice) goes on an
//! idle connection, a look at it drops one the peer closed meanwhile; a Raft call skips that look (a read
//! syscall before its request) and is made once more on a new connection if the reused one fails.
//! Answers are read through a small buffer, so that a frame's length and body come in one read.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use holdfast_proto::dial::{Dialer, Io};
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
use tokio::io::{AsyncRead, AsyncWriteExt, BufReader, ReadBuf};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::tls::Tls;
use crate::wire::{self, Call};

/// Largest peer message: a snapshot chunk ([`SNAPSHOT_CHUNK_BYTES`]) plus its envelope, with room to spare.
pub const MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Size of one snapshot chunk sent to a lagging follower.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 8 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// See [`PeerNetwork::backoff`].
const UNREACHABLE_RETRY: Duration = Duration::from_millis(50);
/// How long the leader may hold back telling a follower of a newer commit index, for the next entries to
/// carry it instead ([`PeerNetwork::is_commit_notice`]). It delays a follower's apply of the last entries
/// of a burst (and what clients attached to that follower hear of them) by this, at most; tokio's timers
/// round it up to the next millisecond. A commit a follower may be waiting for is not held back
/// ([`crate::keeper::Events::urgent_commit`]).
pub const COMMIT_NOTICE_HOLD: Duration = Duration::from_millis(1);
/// Forwarded client requests in flight to one peer, at most; more wait for one of them to finish. Each
/// takes a connection of its own, so this bounds the connections (and file descriptors) a busy follower
/// holds open to its leader, and lets the pool keep them all instead of making and closing a connection
/// per request (which would also fill the port range with sockets in TIME_WAIT). Raft's own calls do not
/// wait for these: replication, votes and leadership checks are few, and must never queue behind clients.
const FORWARDS_PER_PEER: usize = 64;
/// Idle connections kept per peer: every forwarding slot, and a few for Raft's calls.
const IDLE_PER_PEER: usize = FORWARDS_PER_PEER + 8;

/// Why a call to a peer failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No connection could be made: nothing was sent, so the call may safely be made again elsewhere.
    #[error("cannot connect: {0}")]
    Connect(io::Error),
    /// The connection failed after the request may have been sent: it may or may not have been served.
    #[error("connection failed: {0}")]
    Broken(io::Error),
    /// No answer within the call's time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The answer did not decode.
    #[error("undecodable answer: {0}")]
    Undecodable(bincode::Error),
}

/// A connection to a peer, read through a buffer: an answer's length and body arrive in one read.
type Conn = BufReader<Box<dyn Io>>;

/// A peer's address and its idle connections.
type Idle = (String, Vec<Conn>);

/// Connections to peers: how they are made, and the idle ones by node id and address.
///
/// Ordered maps, not hash maps: dropping the pool (a node stopping) closes its connections in the same
/// order every time, which a simulated run of a seed depends on (a hash map's order is drawn per process).
pub struct Peers {
    idle: Mutex<BTreeMap<NodeId, Idle>>,
    /// Each peer's forwarding slots ([`FORWARDS_PER_PEER`]).
    forwards: Mutex<BTreeMap<NodeId, Arc<Semaphore>>>,
    /// Mutual TLS to peers, if the cluster uses it.
    tls: Option<Arc<Tls>>,
    /// How connections are made: TCP, or the simulation's network.
    dialer: Option<Dialer>,
}

impl Peers {
    pub fn new(tls: Option<Arc<Tls>>, dialer: Option<Dialer>) -> Self {
        Peers { idle: Mutex::default(), forwards: Mutex::default(), tls, dialer }
    }

    /// Closes every idle connection, so that the next calls connect anew (with reloaded certificates).
    pub fn reset(&self) {
        self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clear();
    }

    /// Calls `call` with `request` on the peer `id` at `addr` and decodes its answer, all within `ttl`.
    pub async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        id: NodeId,
        addr: &str,
        call: Call,
        request: &Req,
        ttl: Duration,
    ) -> Result<Resp, CallError> {
        let deadline = Instant::now() + ttl;
        let _slot = match call {
            Call::Forward => {
                let slots = self
                    .forwards
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .entry(id)
                    .or_insert_with(|| Arc::new(Semaphore::new(FORWARDS_PER_PEER)))
                    .clone();
                let slot = tokio::time::timeout_at(deadline, slots.acquire_owned()).await;
                Some(slot.map_err(|_| CallError::Timeout(ttl))?.expect("forwarding slots are never closed"))
            }
            _ => None,
        };
        let mut request = wire::request(call, request);
        let mut answer = Vec::new();
        // A pooled connection may have been closed by the other end since its last call (the peer
        // restarted) in a way not yet seen when it was taken. Raft's calls are idempotent, so one of them
        // that fails so on a reused connection is made once more on a new one; a forwarded client
        // request is not, and fails as it is.
        let mut retry = call != Call::Forward;
        loop {
            // A call that is made again when its reused connection fails needs no look at that connection
            // first: that look is a read syscall on the write's path, before the request goes out.
            let look = !retry;
            let (mut conn, fresh) = match tokio::time::timeout_at(deadline, self.take(id, addr, look)).await {
                Err(_) => return Err(self.failed(id, CallError::Timeout(ttl))),
                Ok(Err(e)) => return Err(self.failed(id, CallError::Connect(e))),
                Ok(Ok(taken)) => taken,
            };
            let exchange = async {
                if fresh {
                    conn.write_all(wire::HELLO).await?;
                }
                wire::write_frame(&mut conn, &mut request).await?;
                match wire::read_frame(&mut conn, &mut answer, MESSAGE_BYTES_MAX).await? {
                    true => Ok(()),
                    false => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed the connection")),
                }
            };
            match tokio::time::timeout_at(deadline, exchange).await {
                Err(_) => return Err(self.failed(id, CallError::Timeout(ttl))),
                Ok(Err(e)) if retry && !fresh && answer.is_empty() => {
                    tracing::debug!(peer = id, %e, "a reused peer connection failed; calling again on a new one");
                    retry = false;
                }
                Ok(Err(e)) => return Err(self.failed(id, CallError::Broken(e))),
                Ok(Ok(())) => {
                    self.put(id, addr, conn);
                    return crate::wire::decode_answer(&answer).map_err(CallError::Undecodable);
                }
            }
        }
    }

    /// Closes the idle connections to `id` after a call to it failed with `error`, and returns the error.
    /// They were made and last used alongside the one that failed: after a partition or a restart of the
    /// peer they are as dead as it was, without looking so, and each would cost a call its whole time.
    fn failed(&self, id: NodeId, error: CallError) -> CallError {
        self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&id);
        error
    }

    /// An idle connection to `id` at `addr` that is still open, or a new one (`true`: new).
    async fn take(&self, id: NodeId, addr: &str, look: bool) -> io::Result<(Conn, bool)> {
        loop {
            let idle = {
                let mut idle = self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                match idle.get_mut(&id) {
                    Some((cached, conns)) if cached == addr => conns.pop(),
                    _ => None,
                }
            };
            match idle {
                Some(mut conn) => {
                    if !look || still_open(&mut conn) {
                        return Ok((conn, false));
                    }
                }
                None => {
                    return Ok((BufReader::with_capacity(wire::READ_BUFFER_BYTES, self.connect(addr).await?), true))
                }
            }
        }
    }

    /// Leaves `conn` to `id` at `addr` for the next call.
    fn put(&self, id: NodeId, addr: &str, conn: Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (cached, conns) = idle.entry(id).or_insert_with(|| (addr.to_owned(), Vec::new()));
        if cached != addr {
            // The peer moved: its old connections go.
            *cached = addr.to_owned();
            conns.clear();
        }
        if conns.len() < IDLE_PER_PEER {
            conns.push(conn);
        }
    }

    async fn connect(&self, addr: &str) -> io::Result<Box<dyn Io>> {
        if let Some(dialer) = &self.dialer {
            return dialer.dial(addr.to_owned()).await;
        }
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("connecting to {addr}")))??;
        tcp.set_nodelay(true)?;
        let Some(tls) = &self.tls else { return Ok(Box::new(tcp)) };
        let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host).trim_matches(['[', ']']);
        let name = rustls_pki_types::ServerName::try_from(host.to_owned())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("peer address {addr:?}: {e}")))?;
        let handshake = tls.peer_connector().connect(name, tcp);
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, handshake)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("TLS handshake with {addr}")))??;
        Ok(Box::new(stream))
    }
}

/// Whether an idle connection is still open: nothing arrived on it, not even its end. (Nothing may
/// arrive on an idle connection but its end; anything else is a fault, and the connection goes too.)
fn still_open(conn: &mut Conn) -> bool {
    let mut byte = [0u8; 1];
    let mut buf = ReadBuf::new(&mut byte);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    matches!(std::pin::Pin::new(conn).poll_read(&mut cx, &mut buf), Poll::Pending)
}

/// openraft's network factory: one [`PeerNetwork`] per target, sharing the connections.
#[derive(Clone)]
pub struct Network {
    pub peers: Arc<Peers>,
    /// How far this node's log is durable: no commit index past it is sent (holdfast-store's `durable`
    /// module says why). `None`: commit indexes go as openraft gives them.
    pub durable: Option<Durable>,
    /// The highest log index whose commit a follower may be waiting for
    /// ([`crate::keeper::Events::urgent_commits`]): a commit notice through it is not held back. `None`:
    /// every notice may be.
    pub urgent: Option<tokio::sync::watch::Receiver<u64>>,
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
    /// (the entry, then its commit) and the leader two round trips per follower (docs/benchmarks.md). Its
    /// answer tells the leader nothing it does not know: the follower acknowledged that log id already, in
    /// this leader's term, after flushing it; a follower that since voted for another leader will say so
    /// to the next request with entries, or to the next heartbeat, which still go out and wait for their
    /// answers. openraft uses such an answer for nothing but its `millis_since_quorum_ack` metric, and
    /// leadership checks (`ensure_linearizable`) send requests of their own on connections of their own.
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
        self.call(Call::Snapshot, &rpc, option.hard_ttl()).await
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
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use super::*;

    const TTL: Duration = Duration::from_secs(5);
    /// Requests from this number up are answered after 20 ms.
    const SLOW: u64 = 1_000_000;

    /// A peer that answers each `u64` request with the next number, except that it closes its first
    /// connection, unanswered, at that connection's second request, and never answers `u64::MAX`. Returns
    /// its address and a count of the connections it accepted.
    async fn peer_closing_its_first_connection() -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut conn, _) = listener.accept().await.unwrap();
                let nth = counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut hello = [0u8; 8];
                    conn.read_exact(&mut hello).await.unwrap();
                    assert_eq!(&hello, wire::HELLO);
                    let mut buf = Vec::new();
                    for answered in 0.. {
                        if !wire::read_frame(&mut conn, &mut buf, MESSAGE_BYTES_MAX).await.unwrap() {
                            return;
                        }
                        if nth == 0 && answered == 1 {
                            return;
                        }
                        let n: u64 = bincode::deserialize(&buf[1..]).unwrap();
                        if n == u64::MAX {
                            std::future::pending::<()>().await;
                        }
                        if n >= SLOW {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        let mut answer = vec![0; 4];
                        bincode::serialize_into(&mut answer, &(n + 1)).unwrap();
                        wire::write_frame(&mut conn, &mut answer).await.unwrap();
                    }
                });
            }
        });
        (addr, accepted)
    }

    #[tokio::test]
    async fn a_raft_call_on_a_reused_connection_the_peer_closed_is_made_again_on_a_new_one() {
        let (addr, accepted) = peer_closing_its_first_connection().await;
        let peers = Peers::new(None, None);
        assert_eq!(peers.call::<u64, u64>(2, &addr, Call::Vote, &1, TTL).await.unwrap(), 2);
        // The same connection again: the peer closes it, and the call goes out once more on a new one.
        assert_eq!(peers.call::<u64, u64>(2, &addr, Call::Append, &10, TTL).await.unwrap(), 11);
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        // And the new connection is kept for the next call.
        assert_eq!(peers.call::<u64, u64>(2, &addr, Call::Vote, &20, TTL).await.unwrap(), 21);
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_forwarded_request_is_never_sent_twice() {
        let (addr, accepted) = peer_closing_its_first_connection().await;
        let peers = Peers::new(None, None);
        assert_eq!(peers.call::<u64, u64>(2, &addr, Call::Forward, &1, TTL).await.unwrap(), 2);
        // The peer may have served it before closing: the caller is told, and nothing is sent again.
        let failed = peers.call::<u64, u64>(2, &addr, Call::Forward, &10, TTL).await.unwrap_err();
        assert!(matches!(failed, CallError::Broken(_)), "{failed:?}");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_call_that_timed_out_takes_the_idle_connections_to_its_peer_with_it() {
        let (addr, accepted) = peer_closing_its_first_connection().await;
        let peers = Peers::new(None, None);
        // Past the peer's quirk: its first connection closes at the second call, made again on a new one.
        peers.call::<u64, u64>(2, &addr, Call::Vote, &1, TTL).await.unwrap();
        peers.call::<u64, u64>(2, &addr, Call::Vote, &2, TTL).await.unwrap();
        // Three calls at once leave three idle connections.
        let calls = [&10, &20, &30].map(|n| peers.call::<u64, u64>(2, &addr, Call::Vote, n, TTL));
        let answers = futures_join3(calls).await;
        assert_eq!(answers, [11, 21, 31]);
        let idle = || peers.idle.lock().unwrap().get(&2).map_or(0, |(_, conns)| conns.len());
        assert_eq!(idle(), 3);
        let silent = peers.call::<u64, u64>(2, &addr, Call::Vote, &u64::MAX, Duration::from_millis(200)).await;
        assert!(matches!(silent, Err(CallError::Timeout(_))), "{silent:?}");
        assert_eq!(idle(), 0, "the idle connections went with the one that timed out");
        let before = accepted.load(Ordering::SeqCst);
        assert_eq!(peers.call::<u64, u64>(2, &addr, Call::Vote, &40, TTL).await.unwrap(), 41);
        assert_eq!(accepted.load(Ordering::SeqCst), before + 1, "the next call made a new connection");
    }

    async fn futures_join3<F: std::future::Future<Output = Result<u64, CallError>>>(calls: [F; 3]) -> [u64; 3] {
        let [a, b, c] = calls;
        let (a, b, c) = tokio::join!(a, b, c);
        [a.unwrap(), b.unwrap(), c.unwrap()]
    }

    #[tokio::test]
    async fn forwarded_requests_share_a_bounded_set_of_connections() {
        let (addr, accepted) = peer_closing_its_first_connection().await;
        let peers = Arc::new(Peers::new(None, None));
        // Past the peer's quirk: its first connection closes at the second call.
        peers.call::<u64, u64>(2, &addr, Call::Vote, &1, TTL).await.unwrap();
        peers.call::<u64, u64>(2, &addr, Call::Vote, &2, TTL).await.unwrap();
        let before = accepted.load(Ordering::SeqCst);
        for wave in 0..2 {
            let calls: Vec<_> = (0..3 * FORWARDS_PER_PEER as u64)
                .map(|i| {
                    let (peers, addr) = (peers.clone(), addr.clone());
                    tokio::spawn(async move { peers.call::<u64, u64>(2, &addr, Call::Forward, &(SLOW + i), TTL).await })
                })
                .collect();
            for (i, call) in calls.into_iter().enumerate() {
                assert_eq!(call.await.unwrap().unwrap(), SLOW + i as u64 + 1);
            }
            let made = accepted.load(Ordering::SeqCst) - before;
            // The Raft call's connection is reused for a forward too.
            assert!(made < FORWARDS_PER_PEER, "wave {wave}: {made} connections for {FORWARDS_PER_PEER} slots");
        }
    }

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
                    while wire::read_frame(&mut conn, &mut buf, MESSAGE_BYTES_MAX).await.unwrap_or(false) {
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
                        if wire::write_frame(&mut conn, &mut frame).await.is_err() {
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
        let mut factory = Network { peers: Arc::new(Peers::new(None, None)), durable: None, urgent: None };
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

        let mut factory = Network { peers: Arc::new(Peers::new(None, None)), durable: Some(durable), urgent: None };
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

    #[tokio::test]
    async fn a_peer_that_is_down_is_unreachable_and_one_that_is_silent_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let peers = Peers::new(None, None);
        // Accepted (by the kernel's backlog) but never answered.
        let silent = peers.call::<u64, u64>(2, &addr, Call::Vote, &1, Duration::from_millis(200)).await.unwrap_err();
        assert!(matches!(silent, CallError::Timeout(_)), "{silent:?}");
        drop(listener);
        let down = peers.call::<u64, u64>(2, &addr, Call::Vote, &1, TTL).await.unwrap_err();
        assert!(matches!(down, CallError::Connect(_)), "{down:?}");
    }
}
