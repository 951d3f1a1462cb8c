//! How a connection reaches a node: by default TCP; a [`Dialer`] replaces it (for gRPC channels and peer
//! connections), so that the same client and peer code runs over a simulated network (turmoil) in the
//! simulation.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::codegen::http::Uri;
use tonic::transport::{Channel, Endpoint};

/// A connection a [`Dialer`] made: any byte stream.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// A connection being made.
pub type Dialing = Pin<Box<dyn Future<Output = io::Result<Box<dyn Io>>> + Send>>;

/// Makes connections to `host:port` addresses.
#[derive(Clone)]
pub struct Dialer(Arc<dyn Fn(String) -> Dialing + Send + Sync>);

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Dialer(..)")
    }
}

impl Dialer {
    /// A dialer that calls `dial` with the `host:port` of every connection a channel makes.
    pub fn new(dial: impl Fn(String) -> Dialing + Send + Sync + 'static) -> Self {
        Dialer(Arc::new(dial))
    }

    /// Connects to `addr` (`host:port`).
    pub fn dial(&self, addr: String) -> Dialing {
        (self.0)(addr)
    }

    /// A channel to `endpoint` that connects (lazily, and again after a failure) through this dialer.
    ///
    /// Its HTTP/2 connections remember a stream they reset (a cancelled call) for good, up to h2's count
    /// limit, instead of for one second of the machine's clock: h2 reads `std::time::Instant` for nothing
    /// else, and a run over a simulated network must not depend on how fast the machine ran it.
    pub fn channel(&self, endpoint: &Endpoint) -> Channel {
        endpoint.clone().http2_reset_stream_duration(Duration::MAX).connect_with_connector_lazy(self.clone())
    }
}

impl tonic::codegen::Service<Uri> for Dialer {
    type Response = TokioIo<Box<dyn Io>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let dial = self.0.clone();
        Box::pin(async move {
            let authority = uri
                .authority()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("no host:port in {uri}")))?;
            Ok(TokioIo::new(dial(authority.to_string()).await?))
        })
    }
}
