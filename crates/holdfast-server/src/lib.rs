//! A holdfast node: openraft wired to the disk store and the peer network, the leader's lease keeper, and
//! the client port's two fronts, HTTP/JSON and gRPC, served side by side.
//!
//! The folders are the path of a request, top to bottom, and each may use only the ones below it:
//!
//! ```text
//! front/     ① socket: HTTP and gRPC, health, problems       (axum, tonic)
//! api/       ② operations, checks, API keys, admin calls      (no transport)
//! route/     ③ to the leader: served here, or forwarded in batches
//! leader/    ④ propose, batch, confirm, keep leases, expire, membership
//! apply/     ⑤ what every applied entry tells: watchers, deadlines → the answer
//! election/  ⑥ who leads; the election watch and pre-vote (a pure core and its driver)
//! peer/      ⑦ what nodes say to each other: protocol, codec, client, openraft network, server
//! ```
//!
//! Below them, leaves that import no module of this crate: [`metrics`], [`tls`], [`clock`], [`random`],
//! [`state`], [`faults`], [`load`]. Above them only the wiring: [`node`] builds the parts and answers the peer port,
//! and this file starts a node ([`run`], [`serve`]). `docs/ARCHITECTURE.md` follows one request through
//! the folders. This crate must not depend on the client library or the binary.
// A write's future holds the lone writes a forwarded batch may fall back to, nested inside the HTTP
// and gRPC fronts' futures: deeper than the compiler's default limit for computing their layout.
#![recursion_limit = "256"]

pub mod api;
pub mod apply;
pub mod clock;
pub mod election;
pub mod faults;
pub mod front;
pub mod leader;
pub mod load;
pub mod metrics;
pub mod node;
pub mod peer;
pub mod purge;
pub mod random;
pub mod route;
pub mod state;
pub mod tls;

pub use api::auth::AuthConfig;
pub use api::auth::Secret;
pub use api::FrontLimits;
pub use clock::WallClock;
pub use faults::Bugs;
pub use holdfast_core::limits;
pub use leader::proposer::QUEUE_HOLD;
pub use node::Node;
pub use peer::protocol::REQUEST_TIMEOUT;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use holdfast_store::NodeId;
use openraft::{BasicNode, Raft, SnapshotPolicy};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::apply::events::Events;
use crate::peer::client::Peers;
use crate::peer::codec::SNAPSHOT_CHUNK_BYTES;
use crate::peer::raft::Network;

/// How long in-flight HTTP requests (long polls) may run on after shutdown begins.
const DRAIN: Duration = Duration::from_secs(2);

/// A node's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// This node's id; it must be one of `members`.
    pub id: NodeId,
    /// Every member's id and the peer address the others reach it at.
    pub members: BTreeMap<NodeId, String>,
    /// Where the log, vote and snapshots live.
    pub data_dir: PathBuf,
    /// Bounds on what clients may ask for.
    pub limits: FrontLimits,
    /// How often the leader sends heartbeats to followers.
    pub heartbeat_ms: u64,
    /// The shortest election timeout; the longest is 1.5 times this.
    pub election_timeout_ms: u64,
    /// A snapshot is taken after this many entries since the last one.
    pub snapshot_every_entries: u64,
    /// How long the leader may hold back an acquire that will queue, for its lock's release to share its
    /// entry ([`QUEUE_HOLD`] by default; zero: never).
    pub queue_hold: Duration,
    /// Start without initializing the cluster, to be added by a member (`holdfast cluster add`): for a
    /// node that joins a running cluster, or replaces one whose disk was lost (under a new id).
    pub join: bool,
    /// The key admin calls must present; `None` leaves them open.
    pub admin_key: Option<Secret>,
    /// TLS on the client port and mutual TLS between peers; `None`: plain TCP.
    pub tls: Option<tls::TlsFiles>,
    /// API keys and tenants.
    pub auth: AuthConfig,
    /// The storage's page cache, in bytes.
    pub cache_bytes: u64,
    /// Disk space kept in reserve for when the disk fills up (holdfast-store's `Disk`), in bytes.
    pub disk_reserve: u64,
    /// How long the log's syncs may keep a write waiting before the disk counts as stalled (`None`: not
    /// watched).
    pub disk_stall: Option<Duration>,
    /// Where the leader's time stamps come from: the system clock, but in simulations.
    pub clock: WallClock,
    /// Seeds tokens and session ids; `None` (always, outside simulations): the operating system's entropy.
    pub rng_seed: Option<u64>,
    /// Deliberately broken behaviours, all off: for the simulation's checker tests only.
    pub bugs: Bugs,
    /// The operator's bound on how far two nodes' wall clocks may disagree (`--max-clock-skew`). `None`
    /// (the default, safe under any clocks): a new leader gives every TTL hold a full lease from its
    /// promotion. With a bound, it keeps each TTL hold's stamped end plus the bound and its election.
    pub max_clock_skew: Option<Duration>,
}

/// Where a node listens.
pub struct Listeners {
    /// Clients: HTTP/JSON and gRPC side by side.
    pub client: TcpListener,
    /// Peers: Raft and forwarded requests (the peer protocol, [`peer`]).
    pub peer: TcpListener,
    /// Optional plain port for `/livez`, `/readyz` and `/metrics` only.
    pub health: Option<TcpListener>,
}

/// Runs a node on its listeners until `shutdown` resolves: the disk store in `config.data_dir`, and TLS
/// on both ports if `config.tls` says so.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let Listeners { client, peer, health } = listeners;
    let tls = match &config.tls {
        Some(files) => Some(Arc::new(tls::Tls::load(files.clone()).context("loading TLS certificates")?)),
        None => None,
    };
    let client_addr = client.local_addr()?;
    tracing::info!(id = config.id, %client_addr, peer_addr = %peer.local_addr()?, data_dir = %config.data_dir.display(), "starting holdfast node");
    let data_dir = config.data_dir.clone();
    let options = holdfast_store::Options {
        cache_bytes: config.cache_bytes,
        disk_reserve: config.disk_reserve,
        disk_stall: config.disk_stall,
    };
    let id = config.id;
    let storage = move |observer| disk_storage(&data_dir, observer, id, options);
    match tls {
        Some(tls) => {
            use tokio_stream::StreamExt;
            let client = tls::TlsListener { local_addr: client_addr, incoming: tls.accept(client, tls::Port::Client) };
            let peer = tokio_stream::wrappers::ReceiverStream::new(tls.accept(peer, tls::Port::Peer))
                .map(|(stream, _)| Ok::<_, std::io::Error>(stream));
            let transport = Transport { client, peer, health, tls: Some(tls), dialer: None, started: None };
            serve(config, storage, transport, shutdown).await
        }
        None => {
            // Without TCP_NODELAY, small answers and pushed session events wait for Nagle and delayed ACKs
            // (~40 ms).
            let client = axum::serve::ListenerExt::tap_io(client, |tcp| {
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!(%e, "could not set TCP_NODELAY on a client connection");
                }
            });
            let peer = nodelay(tokio_stream::wrappers::TcpListenerStream::new(peer));
            let transport = Transport { client, peer, health, tls: None, dialer: None, started: None };
            serve(config, storage, transport, shutdown).await
        }
    }
}

/// A node's storage, opened with the node's apply observer: the disk store, or the simulation's (in memory or
/// on its crash file system).
pub struct Storage<LS, SM> {
    pub log: LS,
    pub machine: SM,
    /// The lock state the machine applies to.
    pub state: holdfast_store::SharedState,
    /// The last committed index the log store knows of.
    pub committed_index: Arc<std::sync::atomic::AtomicU64>,
    /// How far the log is durable: the leader tells its followers no commit index past it.
    pub durable: holdfast_store::Durable,
    /// The store's disk, for a store on one (`None`: in memory).
    pub disk: Option<holdfast_store::Disk>,
    /// The current snapshot, as members whose own is damaged fetch it (`None`: a store without snapshot
    /// files).
    pub snapshots: Option<holdfast_store::SnapshotSource>,
    /// The cut of the store's damaged log, if it has not caught up since (`None` too for a store that cuts
    /// nothing).
    pub recovering: Option<holdfast_store::Recovering>,
}

impl<LS, SM> Storage<LS, SM> {
    /// Storage whose disk nobody watches and whose damage nobody mends (the simulation's, in memory or on
    /// its crash file system): no disk, no snapshot files served to peers, no cut log.
    pub fn unwatched(
        log: LS,
        machine: SM,
        state: holdfast_store::SharedState,
        committed_index: Arc<std::sync::atomic::AtomicU64>,
        durable: holdfast_store::Durable,
    ) -> Self {
        Storage { log, machine, state, committed_index, durable, disk: None, snapshots: None, recovering: None }
    }
}

/// Node `id`'s storage on disk under `data_dir`, as [`run`] opens it: the leader's own entries go to its
/// followers while they are synced (see holdfast-store's `durable`).
pub fn disk_storage(
    data_dir: &std::path::Path,
    observer: Arc<dyn holdfast_store::ApplyObserver>,
    id: NodeId,
    options: holdfast_store::Options,
) -> anyhow::Result<Storage<holdfast_store::LogStore, holdfast_store::StateMachineStore>> {
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating the data directory {}", data_dir.display()))?;
    let (log, machine) = holdfast_store::open_with(data_dir, observer, options)
        .with_context(|| format!("opening storage in {}", data_dir.display()))?;
    let log = log.acknowledge_own_appends(id);
    Ok(Storage {
        state: machine.state(),
        committed_index: log.committed_index(),
        durable: log.durable(),
        disk: Some(log.disk()),
        snapshots: Some(machine.source()),
        recovering: log.recovering()?,
        log,
        machine,
    })
}

/// How a node is reached and reaches its peers: real sockets (with or without TLS), or the simulation's.
pub struct Transport<C, P> {
    /// Accepts client connections (HTTP/JSON and gRPC).
    pub client: C,
    /// Accepted peer connections.
    pub peer: P,
    /// The optional plain health port.
    pub health: Option<TcpListener>,
    /// TLS certificates, for peer connections and reloads; the listeners above already speak TLS.
    pub tls: Option<Arc<tls::Tls>>,
    /// Makes peer connections; `None`: TCP (with TLS if `tls` is set).
    pub dialer: Option<holdfast_proto::dial::Dialer>,
    /// Told the node once it runs: the simulation watches Raft and reads the lock state through it.
    pub started: Option<tokio::sync::oneshot::Sender<Arc<Node>>>,
}

/// Runs a node on `transport` until `shutdown` resolves, with the storage `storage` opens. [`run`] calls
/// it with real sockets and the disk store; the simulation with its own network and its own stores.
pub async fn serve<LS, SM, C, P, IO, E>(
    config: Config,
    mut storage: impl FnMut(Arc<dyn holdfast_store::ApplyObserver>) -> anyhow::Result<Storage<LS, SM>>,
    transport: Transport<C, P>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()>
where
    LS: openraft::storage::RaftLogStorage<holdfast_store::TypeConfig>,
    SM: openraft::storage::RaftStateMachine<holdfast_store::TypeConfig>,
    C: axum::serve::Listener<Addr = std::net::SocketAddr>,
    P: tokio_stream::Stream<Item = Result<IO, E>> + Send + 'static,
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let Transport { client, peer, health, tls, dialer, started } = transport;
    anyhow::ensure!(
        config.members.contains_key(&config.id),
        "node {} is not in the member list {:?}",
        config.id,
        config.members
    );
    let metrics = metrics::Metrics::new();
    metrics.worker_threads.set(tokio::runtime::Handle::current().metrics().num_workers() as i64);
    let metrics = Arc::new(metrics);
    let events = Arc::new(Events::new(metrics.clone(), config.bugs, config.max_clock_skew));
    let peers = Arc::new(Peers::new(tls.clone(), dialer));
    let mut shutdown: Shutdown = Box::pin(shutdown);
    let opening = Opening { config: &config, events: &events, metrics: &metrics, peers: &peers };
    let (storage, client, health) = opening.open(&mut storage, client, health, &mut shutdown).await?;
    let Storage { log: log_store, machine: sm_store, state, committed_index, durable, disk, snapshots, recovering } =
        storage;
    let purges = purge::Purges::new(config.snapshot_every_entries.min(1_000));
    let network = Network {
        peers: peers.clone(),
        durable: Some(durable.clone()),
        urgent: Some(events.urgent_commits()),
        purges: Some(purges.clone()),
    };
    let raft =
        Raft::new(config.id, raft_config(&config)?, network, log_store, sm_store).await.context("starting raft")?;
    initialize(&config, &raft).await?;
    let parts = node::Parts {
        raft: raft.clone(),
        state,
        events,
        peers,
        metrics,
        committed_index,
        durable,
        disk,
        limits: config.limits.clone(),
        auth: config.auth.clone(),
        admin_key: config.admin_key.clone(),
        clock: config.clock.clone(),
        rng_seed: config.rng_seed,
        queue_hold: config.queue_hold,
        purges,
        snapshots,
        recovering,
        bugs: config.bugs,
    };
    let node = Arc::new(Node::new(config.id, parts));
    if let Some(started) = started {
        let _ = started.send(node.clone());
    }
    let running = Running::start(&node, peer, health, tls);
    let client_addr = client.local_addr()?;
    tracing::info!(id = config.id, %client_addr, "holdfast node started");
    warn_if_open(&config, client_addr);
    running.serve_clients(&node, client, shutdown).await
}

/// How a node stops: once this resolves.
type Shutdown = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// What opening a node's storage takes besides the store: where a refusal is told, and the members a
/// damaged snapshot is fetched from.
struct Opening<'a> {
    config: &'a Config,
    events: &'a Arc<Events>,
    metrics: &'a Arc<metrics::Metrics>,
    peers: &'a Peers,
}

impl Opening<'_> {
    /// Opens the node's storage with `storage`, the node's events observing it. A store that refuses to
    /// open keeps the node out of the cluster, up and saying why where probes and operators look (on
    /// `/readyz`, on `client` and `health`), until `shutdown`, and then fails: a restart would find the
    /// same. But where the node has members to turn to: a damaged log is cut at the damage and opened
    /// again (the node then holds its votes until it caught up: `election::Elections::catch_up`), and a
    /// damaged snapshot keeps it out only until a member's has replaced it (`peer::refetch`). Both act on
    /// the disk store in `config.data_dir`; a store elsewhere (the simulation's) has no records there, and
    /// nothing is mended.
    async fn open<LS, SM, C>(
        &self,
        storage: &mut impl FnMut(Arc<dyn holdfast_store::ApplyObserver>) -> anyhow::Result<Storage<LS, SM>>,
        mut client: C,
        mut health: Option<TcpListener>,
        shutdown: &mut Shutdown,
    ) -> anyhow::Result<(Storage<LS, SM>, C, Option<TcpListener>)>
    where
        C: axum::serve::Listener<Addr = std::net::SocketAddr>,
    {
        let (mut refetched, mut cut) = (false, false);
        loop {
            let e = match storage(self.events.clone()) {
                Ok(storage) => return Ok((storage, client, health)),
                Err(e) => e,
            };
            let why = format!("{e:#}");
            let Config { id, data_dir, members, .. } = self.config;
            if !cut && peer::refetch::damaged_log(&e, data_dir, *id, members) {
                tracing::error!(error = %why, "the raft log is damaged: cutting it there; this node grants no vote until its log has caught up with its leader's");
                match holdfast_store::cut_damaged_log(data_dir).await {
                    Ok(what) => tracing::warn!(cut = %what, "cut the damaged raft log; opening the storage again"),
                    Err(e) => tracing::error!(error = %e, "cannot cut the damaged raft log"),
                }
                cut = true;
                continue;
            }
            let damaged = peer::refetch::damaged_snapshot(&e, data_dir, *id, members).filter(|_| !refetched);
            let Some(damaged) = damaged else {
                tracing::error!(error = %why, "the storage refused to open: this node stays out of the cluster and says why on /readyz");
                front::health::serve_refused(client, health, why.clone(), self.metrics.clone(), shutdown).await?;
                anyhow::bail!("the storage refused to open: {why}");
            };
            tracing::error!(error = %why, "the stored snapshot is damaged: this node stays out of the cluster until a member's replaces it");
            (client, health) = self.refetch(&damaged, &why, client, health, shutdown).await?;
            refetched = true;
        }
    }

    /// Replaces the damaged snapshot `damaged` with a member's, meanwhile serving the node's health on
    /// `client` and `health` as refused (saying `why`, and that it fetches); gives the listeners back.
    async fn refetch<C>(
        &self,
        damaged: &peer::refetch::Damaged,
        why: &str,
        client: C,
        health: Option<TcpListener>,
        shutdown: &mut Shutdown,
    ) -> anyhow::Result<(C, Option<TcpListener>)>
    where
        C: axum::serve::Listener<Addr = std::net::SocketAddr>,
    {
        use front::health::Lent;
        let (client, health) = (Lent::new(client)?, health.map(Lent::new).transpose()?);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let said = format!("{why}; fetching a member's snapshot in its place");
        let refused = front::health::serve_refused(
            client.share(),
            health.as_ref().map(Lent::share),
            said,
            self.metrics.clone(),
            async move {
                let _ = stopped.await;
            },
        );
        let refused = tokio::spawn(refused);
        let fetched = tokio::select! {
            () = shutdown.as_mut() => None,
            fetched = peer::refetch::refetch(&self.config.data_dir, damaged, self.peers) => Some(fetched),
        };
        let _ = stop.send(());
        refused.await??;
        let Some((from, replaced)) = fetched else {
            anyhow::bail!("stopped before a member's snapshot replaced the damaged one: {why}");
        };
        tracing::info!(
            from,
            index = replaced.index,
            removed = replaced.removed,
            "a member's snapshot replaced the damaged one: opening the storage again"
        );
        self.metrics.storage_refused.set(0);
        let client = client.take().context("the client port is still lent")?;
        let health = match health {
            Some(health) => Some(health.take().context("the health port is still lent")?),
            None => None,
        };
        Ok((client, health))
    }
}

/// openraft's configuration for `config`.
fn raft_config(config: &Config) -> anyhow::Result<Arc<openraft::Config>> {
    let raft_config = openraft::Config {
        cluster_name: "holdfast".into(),
        heartbeat_interval: config.heartbeat_ms,
        election_timeout_min: config.election_timeout_ms,
        // openraft 0.9 also makes this the leader's lease: a follower stands for election only after the
        // lease plus its own timeout. 1.2x keeps failover near lease + timeout = 2.2-2.4x the flag (1.5x
        // made it 2.5-3x), while 20 % of spread still keeps two followers' campaigns apart.
        election_timeout_max: config.election_timeout_ms + config.election_timeout_ms / 5,
        install_snapshot_timeout: 10_000,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every_entries),
        // openraft purges nothing on its own: `purge::Purges` does, keeping up to 1,000 entries behind a
        // snapshot for followers that lag a little (fewer when snapshots are taken more often, as the
        // simulation's are, so that lagging nodes install snapshots), and what followers still need.
        max_in_snapshot_log_to_keep: u64::MAX,
        snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES,
        max_payload_entries: 512,
        // Elections are the election watch's, with a pre-vote (`election::Elections::run`).
        enable_elect: false,
        ..Default::default()
    };
    Ok(Arc::new(raft_config.validate().context("raft configuration")?))
}

/// Initializes a new cluster with the full member list. Every node may: the first entry is then the same
/// everywhere, so no node is special (what a Kubernetes StatefulSet needs). A node with data just rejoins;
/// one started with `join` waits to be added.
async fn initialize(config: &Config, raft: &Raft<holdfast_store::TypeConfig>) -> anyhow::Result<()> {
    if config.join {
        tracing::info!("joining: waiting to be added by the cluster's leader (holdfast cluster add)");
    } else if !raft.is_initialized().await? {
        let members: BTreeMap<NodeId, BasicNode> =
            config.members.iter().map(|(id, addr)| (*id, BasicNode { addr: addr.clone() })).collect();
        if let Err(e) = raft.initialize(members).await {
            tracing::info!(%e, "not initializing: the cluster already is");
        }
    }
    Ok(())
}

/// A node's tasks while it runs, and how they are stopped.
struct Running {
    stop: tokio::sync::watch::Sender<bool>,
    stopped: tokio::sync::watch::Receiver<bool>,
    peer_stop: tokio::sync::watch::Sender<bool>,
    peer_server: JoinHandle<()>,
    proposer: JoinHandle<()>,
    /// Every task that ends on its own once `stop` is sent.
    tasks: Vec<JoinHandle<()>>,
    /// The client port's service.
    app: axum::Router,
    tls: Option<Arc<tls::Tls>>,
}

impl Running {
    /// Starts `node`'s tasks: the peer port on `peer`, the background tasks, the health watch and port.
    fn start<P, IO, E>(node: &Arc<Node>, peer: P, health: Option<TcpListener>, tls: Option<Arc<tls::Tls>>) -> Self
    where
        P: tokio_stream::Stream<Item = Result<IO, E>> + Send + 'static,
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        // The peer port stops last, after Raft: while client requests drain, this node keeps answering its
        // peers, so a stopping follower does not start an election and a stopping leader keeps its
        // followers.
        let (peer_stop, peer_stopped) = tokio::sync::watch::channel(false);
        let peer_server = tokio::spawn(peer::server::serve(node.clone(), peer, peer_stopped));
        let (proposer, mut tasks) = node.spawn_tasks(&stopped);
        let (app, health_reporter) = front::app(node.api.clone());
        tasks.push(tokio::spawn(front::health::watch_raft(node.api.clone(), health_reporter, stopped.clone())));
        if let Some(listener) = health {
            let mut stop = stopped.clone();
            let serve =
                axum::serve(listener, front::health::router(node.api.clone())).with_graceful_shutdown(async move {
                    let _ = stop.changed().await;
                });
            tasks.push(tokio::spawn(async move {
                if let Err(e) = serve.await {
                    tracing::warn!(%e, "health port");
                }
            }));
        }
        Running { stop, stopped, peer_stop, peer_server, proposer, tasks, app, tls }
    }

    /// Serves clients on `client` until `shutdown` resolves (or the client port fails), then stops every
    /// task, Raft, and last the peer port.
    async fn serve_clients<C>(
        self,
        node: &Arc<Node>,
        client: C,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()>
    where
        C: axum::serve::Listener<Addr = std::net::SocketAddr>,
    {
        let Running { stop, stopped, peer_stop, peer_server, proposer, mut tasks, app, tls } = self;
        let mut http_stop = stopped.clone();
        let http_stopped = async move {
            let _ = http_stop.changed().await;
        };
        // Every request carries its connection's peer address (`PeerAddr`): admin calls without an admin
        // key are accepted from loopback only.
        let app = app.into_make_service_with_connect_info::<front::http::port::PeerAddr>();
        let http = axum::serve(front::http::port::ClientPort(client), app).with_graceful_shutdown(http_stopped);
        let mut http = tokio::spawn(async move { http.await });
        if let Some(tls) = tls {
            tasks.push(tokio::spawn(reload_tls(tls, node.peers().clone(), stopped.clone())));
        }
        front::health::notify_systemd("READY=1");
        tokio::select! {
            _ = shutdown => {}
            result = &mut http => { result?.context("HTTP server")?; }
        }
        tracing::info!("shutting down");
        front::health::notify_systemd("STOPPING=1");
        let _ = stop.send(true);
        if tokio::time::timeout(DRAIN, &mut http).await.is_err() {
            http.abort();
        }
        // Client requests drained: nothing more to propose.
        proposer.abort();
        for task in tasks {
            let _ = task.await;
        }
        // An append waiting for the disk would hold openraft's core, and its shutdown, for good.
        if let Some(disk) = node.api.disk() {
            disk.close();
        }
        let stopped = node.raft.shutdown().await.map_err(|e| anyhow::anyhow!("stopping raft: {e}"));
        let _ = peer_stop.send(true);
        let _ = peer_server.await;
        stopped?;
        Ok(())
    }
}

/// Logs one warning when the client port is reachable beyond loopback with neither API keys nor an admin
/// key: then anyone who reaches it may take and release every lock, and admin calls are refused to all
/// but this host. Says what is open, so an operator who did not mean it knows which flag to set.
fn warn_if_open(config: &Config, client_addr: std::net::SocketAddr) {
    if client_addr.ip().to_canonical().is_loopback() || config.auth.enabled || config.admin_key.is_some() {
        return;
    }
    tracing::warn!(
        %client_addr,
        "the client port is reachable beyond loopback with neither --auth nor --admin-key: anyone who reaches \
         it may take, release and read every lock; admin calls (membership, snapshots) are accepted from \
         loopback only. Set --auth for API keys and --admin-key to manage the cluster from other hosts \
         (docs/security.md)"
    );
}

/// Reloads the TLS files on SIGHUP or when they change, until shutdown; idle peer connections are then
/// closed, so that new ones present the new certificate.
async fn reload_tls(tls: Arc<tls::Tls>, peers: Arc<Peers>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(signal) => Some(signal),
        Err(e) => {
            tracing::warn!(%e, "no SIGHUP handler; TLS files are reloaded when they change");
            None
        }
    };
    let mut check = tokio::time::interval(tls::RELOAD_CHECK);
    loop {
        let asked = tokio::select! {
            _ = stop.changed() => return,
            _ = async { hangup.as_mut().expect("checked").recv().await }, if hangup.is_some() => true,
            _ = check.tick() => false,
        };
        if asked || tls.changed() {
            match tls.reload() {
                Ok(()) => peers.reset(),
                Err(e) => tracing::error!(%e, "TLS reload failed; keeping the certificates in use"),
            }
        }
    }
}

/// Accepted peer connections with TCP_NODELAY set: Raft messages are small and latency-bound.
fn nodelay(
    incoming: tokio_stream::wrappers::TcpListenerStream,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    incoming.map(|conn| conn.and_then(|tcp| tcp.set_nodelay(true).map(|()| tcp)))
}
