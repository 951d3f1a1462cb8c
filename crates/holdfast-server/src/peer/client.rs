//! Calls to peers: openraft's RPCs and forwarded client requests, on the peer port.
//!
//! Each call is one request frame and one answer frame on a connection of its own while it lasts, in the
//! wire format of [`super::codec`]. The caller's task writes the request and reads the answer on the socket
//! itself: no connection task and no channel stand between openraft and the kernel. Over gRPC, a call
//! crossed hyper's and h2's connection tasks on both ends: the nodes spent up to twice the CPU per write,
//! and one client's acquire+release took about twice as long (docs/perf-notes/2026-12-01-peers-off-grpc.md).
//!
//! Finished calls leave their connection in [`Peers`]' idle pool for the next call to the same peer, so a
//! replication stream keeps reusing one connection. A connection that failed or timed out is dropped, and
//! the next call makes a new one. Before a forwarded client request (which is never sent twice) goes on an
//! idle connection, a look at it drops one the peer closed meanwhile; a Raft call skips that look (a read
//! syscall before its request) and is made once more on a new connection if the reused one fails.
//! Answers are read through a small buffer, so that a frame's length and body come in one read.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use holdfast_proto::dial::{Dialer, Io};
use holdfast_store::NodeId;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWriteExt, BufReader, ReadBuf};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::codec::{self, Call, MESSAGE_BYTES_MAX};
use crate::tls::Tls;

const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
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

/// The idle connections by node id and address, and when each peer last answered a call: noted where a
/// finished call leaves its connection, under the one lock it takes anyway.
#[derive(Default)]
struct Pool {
    conns: BTreeMap<NodeId, Idle>,
    answered: BTreeMap<NodeId, Instant>,
}

/// Connections to peers: how they are made, and the idle ones by node id and address.
///
/// Ordered maps, not hash maps: dropping the pool (a node stopping) closes its connections in the same
/// order every time, which a simulated run of a seed depends on (a hash map's order is drawn per process).
pub struct Peers {
    idle: Mutex<Pool>,
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

    /// When each peer this node called last answered: on the leader, every member it replicates to (a
    /// heartbeat at least every `heartbeat_interval`); on a follower, mostly the leader.
    pub fn last_answers(&self) -> BTreeMap<NodeId, Instant> {
        self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).answered.clone()
    }

    /// Closes every idle connection, so that the next calls connect anew (with reloaded certificates).
    pub fn reset(&self) {
        self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).conns.clear();
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
        let mut request = codec::request(call, request);
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
                    conn.write_all(codec::HELLO).await?;
                }
                codec::write_frame(&mut conn, &mut request).await?;
                match codec::read_frame(&mut conn, &mut answer, MESSAGE_BYTES_MAX).await? {
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
                    return codec::decode_answer(&answer).map_err(CallError::Undecodable);
                }
            }
        }
    }

    /// Closes the idle connections to `id` after a call to it failed with `error`, and returns the error.
    /// They were made and last used alongside the one that failed: after a partition or a restart of the
    /// peer they are as dead as it was, without looking so, and each would cost a call its whole time.
    fn failed(&self, id: NodeId, error: CallError) -> CallError {
        self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).conns.remove(&id);
        error
    }

    /// An idle connection to `id` at `addr` that is still open, or a new one (`true`: new).
    async fn take(&self, id: NodeId, addr: &str, look: bool) -> io::Result<(Conn, bool)> {
        loop {
            let idle = {
                let mut idle = self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                match idle.conns.get_mut(&id) {
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
                    return Ok((BufReader::with_capacity(codec::READ_BUFFER_BYTES, self.connect(addr).await?), true))
                }
            }
        }
    }

    /// Leaves `conn` to `id` at `addr` for the next call, its call answered now.
    fn put(&self, id: NodeId, addr: &str, conn: Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        idle.answered.insert(id, Instant::now());
        let (cached, conns) = idle.conns.entry(id).or_insert_with(|| (addr.to_owned(), Vec::new()));
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
                    assert_eq!(&hello, codec::HELLO);
                    let mut buf = Vec::new();
                    for answered in 0.. {
                        if !codec::read_frame(&mut conn, &mut buf, MESSAGE_BYTES_MAX).await.unwrap() {
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
                        codec::write_frame(&mut conn, &mut answer).await.unwrap();
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
        let idle = || peers.idle.lock().unwrap().conns.get(&2).map_or(0, |(_, conns)| conns.len());
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
