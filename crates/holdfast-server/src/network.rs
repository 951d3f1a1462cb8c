//! The peer network: openraft's RPCs and forwarded client requests over gRPC on the peer port.
//!
//! Every message is a [`Blob`] holding the bincode encoding of the openraft request or response, so a
//! snapshot chunk travels as raw bytes (not JSON) and fits the message size limit. Channels are made once
//! per peer and cached; every call is bounded in time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast_proto::dial::Dialer;
use holdfast_proto::peer::peer_client::PeerClient;
use holdfast_proto::peer::peer_server::Peer;
use holdfast_proto::peer::Blob;
use holdfast_store::{NodeId, TypeConfig};
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::{BasicNode, RaftNetwork, RaftNetworkFactory};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use crate::node::{ForwardRequest, Node, NodeError};
use crate::tls::Tls;

/// Largest peer message: a snapshot chunk ([`SNAPSHOT_CHUNK_BYTES`]) plus its envelope, with room to spare.
pub const MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Size of one snapshot chunk sent to a lagging follower.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 8 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// See [`PeerNetwork::backoff`].
const UNREACHABLE_RETRY: Duration = Duration::from_millis(50);
/// HTTP/2 pings on peer connections: a connection whose other end vanished (a cut network, a container
/// disconnected and reconnected) is dropped and re-made within about two intervals, instead of every RPC
/// on it timing out until the other end resets it.
const PEER_KEEPALIVE: Duration = Duration::from_secs(1);

/// Cached gRPC channels to peers, by node id and address.
pub struct Peers {
    channels: Mutex<HashMap<NodeId, (String, Channel)>>,
    /// Mutual TLS to peers, if the cluster uses it.
    tls: Option<Arc<Tls>>,
    /// How connections are made: tonic's TCP connector, or the simulation's network.
    dialer: Option<Dialer>,
}

impl Peers {
    pub fn new(tls: Option<Arc<Tls>>, dialer: Option<Dialer>) -> Self {
        Peers { channels: Mutex::default(), tls, dialer }
    }

    /// Forgets every channel, so that the next calls connect anew (with reloaded certificates).
    pub fn reset(&self) {
        self.channels.lock().expect("peer channel cache poisoned").clear();
    }

    /// The channel to `id` at `addr`: cached, and re-made if the address changed. Channels connect lazily
    /// and reconnect by themselves.
    pub fn channel(&self, id: NodeId, addr: &str) -> Result<Channel, tonic::Status> {
        let mut channels = self.channels.lock().expect("peer channel cache poisoned");
        if let Some((cached, channel)) = channels.get(&id) {
            if cached == addr {
                return Ok(channel.clone());
            }
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| tonic::Status::invalid_argument(format!("peer address {addr:?}: {e}")))?;
        if let Some(tls) = &self.tls {
            let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host).trim_matches(['[', ']']);
            endpoint = endpoint
                .tls_config(tls.peer_client(host))
                .map_err(|e| tonic::Status::invalid_argument(format!("TLS for peer {addr:?}: {e}")))?;
        }
        let endpoint = endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(PEER_KEEPALIVE)
            .keep_alive_timeout(PEER_KEEPALIVE)
            .keep_alive_while_idle(true);
        let channel = match &self.dialer {
            Some(dialer) => dialer.channel(&endpoint),
            None => endpoint.connect_lazy(),
        };
        channels.insert(id, (addr.to_owned(), channel.clone()));
        Ok(channel)
    }

    /// A client for `id` at `addr`.
    pub fn client(&self, id: NodeId, addr: &str) -> Result<PeerClient<Channel>, tonic::Status> {
        Ok(PeerClient::new(self.channel(id, addr)?)
            .max_decoding_message_size(MESSAGE_BYTES_MAX)
            .max_encoding_message_size(MESSAGE_BYTES_MAX))
    }
}

/// Encodes a peer message.
pub fn encode<T: Serialize>(value: &T) -> Blob {
    Blob { data: bincode::serialize(value).expect("peer messages always encode") }
}

/// Decodes a peer message.
pub fn decode<T: DeserializeOwned>(blob: &Blob) -> Result<T, tonic::Status> {
    bincode::deserialize(&blob.data).map_err(|e| tonic::Status::invalid_argument(format!("undecodable message: {e}")))
}

/// openraft's network factory: one [`PeerNetwork`] per target, sharing the channel cache.
#[derive(Clone)]
pub struct Network {
    pub peers: Arc<Peers>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        PeerNetwork { target, addr: node.addr.clone(), peers: self.peers.clone() }
    }
}

/// openraft's connection to one peer.
pub struct PeerNetwork {
    target: NodeId,
    addr: String,
    peers: Arc<Peers>,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl PeerNetwork {
    async fn call<Req, Resp, E>(&self, kind: Rpc, req: &Req, ttl: Duration) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let mut client =
            self.peers.client(self.target, &self.addr).map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
        let blob = encode(req);
        let call = async {
            match kind {
                Rpc::Append => client.append_entries(blob).await,
                Rpc::Vote => client.vote(blob).await,
                Rpc::Snapshot => client.install_snapshot(blob).await,
            }
        };
        let reply = match tokio::time::timeout(ttl, call).await {
            Err(elapsed) => return Err(RPCError::Network(NetworkError::new(&elapsed))),
            Ok(Err(status)) if status.code() == tonic::Code::Unavailable => {
                return Err(RPCError::Unreachable(Unreachable::new(&status)))
            }
            Ok(Err(status)) => return Err(RPCError::Network(NetworkError::new(&status))),
            Ok(Ok(reply)) => reply.into_inner(),
        };
        let result: Result<Resp, RaftError<NodeId, E>> =
            decode(&reply).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

#[derive(Clone, Copy)]
enum Rpc {
    Append,
    Vote,
    Snapshot,
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
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        self.call(Rpc::Append, &rpc, option.hard_ttl()).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.call(Rpc::Snapshot, &rpc, option.hard_ttl()).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.call(Rpc::Vote, &rpc, option.hard_ttl()).await
    }
}

/// Serves the peer API: hands Raft messages to openraft and forwarded requests to the node.
pub struct PeerService {
    pub node: Arc<Node>,
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn append_entries(&self, req: tonic::Request<Blob>) -> Result<tonic::Response<Blob>, tonic::Status> {
        let rpc: AppendEntriesRequest<TypeConfig> = decode(req.get_ref())?;
        Ok(tonic::Response::new(encode(&self.node.raft.append_entries(rpc).await)))
    }

    async fn vote(&self, req: tonic::Request<Blob>) -> Result<tonic::Response<Blob>, tonic::Status> {
        let rpc: VoteRequest<NodeId> = decode(req.get_ref())?;
        Ok(tonic::Response::new(encode(&self.node.raft.vote(rpc).await)))
    }

    async fn install_snapshot(&self, req: tonic::Request<Blob>) -> Result<tonic::Response<Blob>, tonic::Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = decode(req.get_ref())?;
        Ok(tonic::Response::new(encode(&self.node.raft.install_snapshot(rpc).await)))
    }

    async fn forward(&self, req: tonic::Request<Blob>) -> Result<tonic::Response<Blob>, tonic::Status> {
        let request: ForwardRequest = decode(req.get_ref())?;
        let reply: Result<_, NodeError> = self.node.serve_forwarded(request).await;
        Ok(tonic::Response::new(encode(&reply)))
    }
}
