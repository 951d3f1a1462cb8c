//! TLS on the client port and mutual TLS between peers, with rustls.
//!
//! A node has one certificate (`--tls-cert`, `--tls-key`), signed by the cluster's CA (`--tls-ca`). It
//! presents it to clients on the client port, to peers on the peer port, and as a client certificate when
//! it connects to a peer; a peer accepts only connections whose certificate the CA signed (mTLS). The
//! client port asks clients for a certificate only with `--tls-client-auth`.
//!
//! The files are read again on [`Tls::reload`] (SIGHUP, or a change of their modification times): new
//! connections use the new certificate, idle peer connections are closed, and connections already open keep
//! theirs. A reload that fails (a half-written file) keeps the old configuration and logs why.
//!
//! Handshakes run in their own tasks, so a client that stalls its handshake holds up nobody else.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client may take over its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the files' modification times are compared, for a reload without SIGHUP.
pub const RELOAD_CHECK: Duration = Duration::from_secs(10);
/// Handshaken connections waiting to be served.
const ACCEPT_BACKLOG: usize = 256;
/// The TLS application protocol (ALPN) of the peer port: the peer codec's (whose version is in its hello).
const PEER_ALPN: &[u8] = b"holdfast-peer/1";

/// Where a node's TLS material lives.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The node's certificate chain (PEM), for the client port, the peer port and peer connections.
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The CA (PEM) that signs every node's certificate (and clients', with `client_auth`).
    pub ca: PathBuf,
    /// Whether clients on the client port must present a certificate the CA signed.
    pub client_auth: bool,
}

/// Which listener a configuration is for.
#[derive(Debug, Clone, Copy)]
pub enum Port {
    Client,
    Peer,
}

/// What the files gave, parsed.
struct Loaded {
    client: Arc<ServerConfig>,
    peer: Arc<ServerConfig>,
    /// For connecting to peers.
    peer_client: Arc<rustls::ClientConfig>,
    modified: Vec<Option<SystemTime>>,
}

/// A node's TLS configuration, reloadable.
pub struct Tls {
    files: TlsFiles,
    loaded: RwLock<Loaded>,
}

impl Tls {
    /// Reads and checks the files.
    pub fn load(files: TlsFiles) -> anyhow::Result<Tls> {
        // rustls (servers, peer connections) and tonic (the client library) use ring; say so once for the
        // process.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let loaded = load(&files)?;
        Ok(Tls { files, loaded: RwLock::new(loaded) })
    }

    /// Reads the files again. On an error the old configuration stays.
    pub fn reload(&self) -> anyhow::Result<()> {
        let loaded = load(&self.files)?;
        *self.loaded.write().expect("tls config poisoned") = loaded;
        tracing::info!(cert = %self.files.cert.display(), "TLS certificates reloaded");
        Ok(())
    }

    /// Whether a file changed since the last load.
    pub fn changed(&self) -> bool {
        self.loaded.read().expect("tls config poisoned").modified != modified(&self.files)
    }

    fn server_config(&self, port: Port) -> Arc<ServerConfig> {
        let loaded = self.loaded.read().expect("tls config poisoned");
        match port {
            Port::Client => loaded.client.clone(),
            Port::Peer => loaded.peer.clone(),
        }
    }

    /// Makes TLS connections to peers: this node's certificate, peers checked against the CA.
    pub fn peer_connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(self.loaded.read().expect("tls config poisoned").peer_client.clone())
    }

    /// Accepts connections on `listener` and completes their handshakes in their own tasks; the receiver
    /// yields the connections that finished one. Ends when the receiver is dropped.
    pub fn accept(
        self: &Arc<Self>,
        listener: TcpListener,
        port: Port,
    ) -> mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)> {
        let (tx, rx) = mpsc::channel(ACCEPT_BACKLOG);
        let tls = self.clone();
        tokio::spawn(async move {
            loop {
                // Ends (closing the listener) when the server that takes the connections is gone.
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = tx.closed() => return,
                };
                let (tcp, addr) = match accepted {
                    Ok(conn) => conn,
                    Err(e) => {
                        // Out of file descriptors and the like: wait a little rather than spin.
                        tracing::warn!(%e, "accepting a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let acceptor = TlsAcceptor::from(tls.server_config(port));
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send((stream, addr)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%addr, %e, ?port, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%addr, ?port, "TLS handshake timed out"),
                    }
                });
            }
        });
        rx
    }
}

/// A listener of handshaken TLS connections, for axum.
pub struct TlsListener {
    pub incoming: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    pub local_addr: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.recv().await {
            Some(conn) => conn,
            // The accept task only ends with the process; wait for shutdown rather than spin.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}

fn modified(files: &TlsFiles) -> Vec<Option<SystemTime>> {
    [&files.cert, &files.key, &files.ca]
        .iter()
        .map(|path| std::fs::metadata(path).and_then(|m| m.modified()).ok())
        .collect()
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))
}

fn load(files: &TlsFiles) -> anyhow::Result<Loaded> {
    let modified = modified(files);
    let (cert_pem, key_pem, ca_pem) = (read(&files.cert)?, read(&files.key)?, read(&files.ca)?);
    let certs = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("{}: {e}", files.cert.display()))?;
    anyhow::ensure!(!certs.is_empty(), "{}: no certificate in it", files.cert.display());
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| anyhow::anyhow!("{}: {e}", files.key.display()))?;
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(&ca_pem) {
        let ca = ca.map_err(|e| anyhow::anyhow!("{}: {e}", files.ca.display()))?;
        roots.add(ca).map_err(|e| anyhow::anyhow!("{}: {e}", files.ca.display()))?;
    }
    anyhow::ensure!(!roots.is_empty(), "{}: no CA certificate in it", files.ca.display());
    let roots = Arc::new(roots);
    let verifier = WebPkiClientVerifier::builder(roots.clone()).build()?;
    let mut peer = ServerConfig::builder()
        .with_client_cert_verifier(verifier.clone())
        .with_single_cert(certs.clone(), key.clone_key())
        .map_err(|e| anyhow::anyhow!("{} and {}: {e}", files.cert.display(), files.key.display()))?;
    // Nodes of another peer protocol (an older holdfast spoke gRPC to its peers) fail the handshake
    // with a clear alert instead of exchanging bytes neither understands.
    peer.alpn_protocols = vec![PEER_ALPN.to_vec()];
    let mut peer_client = rustls::ClientConfig::builder()
        .with_root_certificates(roots.clone())
        .with_client_auth_cert(certs.clone(), key.clone_key())
        .map_err(|e| anyhow::anyhow!("{} and {}: {e}", files.cert.display(), files.key.display()))?;
    peer_client.alpn_protocols = vec![PEER_ALPN.to_vec()];
    let builder = ServerConfig::builder();
    let mut client = match files.client_auth {
        true => builder.with_client_cert_verifier(verifier),
        false => builder.with_no_client_auth(),
    }
    .with_single_cert(certs, key)?;
    // gRPC needs HTTP/2; curl and browsers may take either.
    client.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Loaded { client: Arc::new(client), peer: Arc::new(peer), peer_client: Arc::new(peer_client), modified })
}
