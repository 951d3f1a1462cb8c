//! turmoil's simulated sockets, fitted to what the server and the client library take: an axum listener
//! for the client port, a stream of accepted connections for the peer port, and a dialer for connections.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use holdfast_proto::dial::{Dialer, Io};
use turmoil::net::{TcpListener, TcpStream};

/// The client port: accepts simulated connections for axum.
pub struct ClientListener(pub TcpListener);

impl axum::serve::Listener for ClientListener {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            match self.0.accept().await {
                Ok(accepted) => return accepted,
                // As axum's own TCP listener does: an accept error is logged and the loop goes on.
                Err(e) => {
                    tracing::debug!(%e, "simulated accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

/// The peer port's accepted connections, as a stream (accepted in a task of their own).
pub fn peer_incoming(listener: TcpListener) -> tokio_stream::wrappers::ReceiverStream<io::Result<TcpStream>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let accepted = listener.accept().await.map(|(stream, _)| stream);
            if tx.send(accepted).await.is_err() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Connects (client channels and peer connections) over the simulated network.
pub fn dialer() -> Dialer {
    Dialer::new(|addr| {
        Box::pin(async move {
            let stream = TcpStream::connect(addr).await?;
            Ok(Box::new(stream) as Box<dyn Io>)
        })
    })
}
