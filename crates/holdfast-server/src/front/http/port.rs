//! The client port's listener as the node serves it: every request learns the address its connection
//! came from ([`PeerAddr`]), which admin checks need.

use std::net::{IpAddr, SocketAddr};

use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::serve::{IncomingStream, Listener};

/// The address a client connection came from, as the client port's listener accepted it: put in every
/// request's extensions (`ConnectInfo<PeerAddr>`) by the node's `serve`, for HTTP and gRPC alike.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

/// The client port's listener as the node's `serve` runs it: any listener (TCP, TLS, the simulation's),
/// whose connections are told their [`PeerAddr`]. (A wrapper of our own, because axum's `Connected` for
/// any listener would overlap with axum's own.)
pub struct ClientPort<L>(pub L);

impl<L: Listener<Addr = SocketAddr>> Listener for ClientPort<L> {
    type Io = L::Io;
    type Addr = SocketAddr;

    fn accept(&mut self) -> impl std::future::Future<Output = (Self::Io, SocketAddr)> + Send {
        self.0.accept()
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

impl<L: Listener<Addr = SocketAddr>> Connected<IncomingStream<'_, ClientPort<L>>> for PeerAddr {
    fn connect_info(stream: IncomingStream<'_, ClientPort<L>>) -> Self {
        PeerAddr(*stream.remote_addr())
    }
}

/// The peer address of a request (HTTP or gRPC) from its extensions; `None` if it was not served by
/// the node's `serve` (a router driven directly, as in unit tests), which admin checks take for remote.
pub fn peer_ip(extensions: &axum::http::Extensions) -> Option<IpAddr> {
    extensions.get::<ConnectInfo<PeerAddr>>().map(|ConnectInfo(PeerAddr(addr))| addr.ip())
}
