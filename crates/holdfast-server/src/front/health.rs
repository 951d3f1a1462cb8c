//! ① What operators and orchestrators ask a node: is the process alive (`/livez`, never dependent on quorum,
//! so a restart loop cannot turn a lost quorum into an outage), may it take traffic (`/readyz` and
//! `grpc.health.v1`, which do depend on a leader), and what is it doing (`/metrics`). Also: counting every
//! client request, logging Raft role changes, and telling systemd the node is ready.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use openraft::ServerState;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;
use tracing::Instrument;

use crate::api::Api as NodeApi;
use crate::metrics::{self, Api, Metrics};

/// How often readiness is re-checked for `grpc.health.v1` between changes of role: it also depends on how
/// far the log is applied, which does not wake the watcher (so a node that caught up serves within this).
const HEALTH_RECHECK: Duration = Duration::from_secs(1);

/// `/livez`, `/readyz` and `/metrics`: the client port serves them too, and the optional health port
/// serves only them (plain HTTP, for probes and scrapers when the client port needs client certificates).
pub fn router(api: Arc<NodeApi>) -> Router {
    routes().with_state(api)
}

/// The same routes, for merging into the client port's router.
pub fn routes() -> Router<Arc<NodeApi>> {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_page))
}

async fn readyz(State(api): State<Arc<NodeApi>>) -> Response {
    match api.readiness() {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")).into_response(),
    }
}

async fn metrics_page(State(api): State<Arc<NodeApi>>) -> Response {
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], api.metrics_page()).into_response()
}

/// Middleware on the client port: counts each request and its latency by front, endpoint and code. The
/// endpoint is the route pattern (`POST /v1/locks/{name}`), never the lock name, so the label set stays
/// small; a gRPC method the server does not have counts as `unmatched`.
///
/// Each request also runs in a `request` span (method and path; never the query, which may carry a
/// token) and, at debug level, logs its answer: `RUST_LOG=holdfast_server::health=debug` traces them all.
pub async fn track(State(metrics): State<Arc<Metrics>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let path = request.uri().path().to_owned();
    let route = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned());
    let method = request.method().clone();
    let grpc =
        request.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    let span = tracing::debug_span!("request", %method, %path);
    let response = next.run(request).instrument(span.clone()).await;
    let took = started.elapsed();
    tracing::debug!(parent: &span, status = response.status().as_u16(), took_us = took.as_micros() as u64, "answered");
    if grpc {
        // A failed unary call answers "trailers only": its status is in the headers. A success's status is
        // in the trailers, after this middleware has let go of the response.
        let code = response
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u16>().ok())
            .unwrap_or(0);
        let endpoint = match route {
            Some(_) if code != tonic::Code::Unimplemented as u16 => path,
            _ => "unmatched".to_owned(),
        };
        metrics.request(Api::Grpc, endpoint, code, took);
    } else {
        let endpoint = match route {
            Some(route) => format!("{method} {route}"),
            None => "unmatched".to_owned(),
        };
        metrics.request(Api::Http, endpoint, response.status().as_u16(), took);
    }
    response
}

/// Follows Raft's role until `shutdown`: logs every change of role, leader or term, counts leader changes,
/// and keeps `grpc.health.v1` in step with `/readyz` (for the whole server, `""`, and for
/// `holdfast.v1.Locks`).
///
/// It watches openraft's server metrics (role, vote, leader, membership), which change only with them, and
/// not `Raft::metrics`: openraft 0.9 sends those on every turn of its core's loop, several times per write,
/// and a watcher of them is woken as often, on every node. Readiness also depends on how far the log is
/// applied, which is re-checked every [`HEALTH_RECHECK`].
pub async fn watch_raft(api: Arc<NodeApi>, health: HealthReporter, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut raft = api.raft().server_metrics();
    let mut seen: Option<(ServerState, Option<u64>, u64)> = None;
    let mut serving = None;
    let mut raft_running = true;
    let mut recheck = tokio::time::interval(HEALTH_RECHECK);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        {
            let m = raft.borrow_and_update();
            let now = (m.state, m.current_leader, m.vote.leader_id().get_term());
            if seen != Some(now) {
                let leader_before = seen.and_then(|(_, leader, _)| leader);
                if m.current_leader.is_some() && m.current_leader != leader_before {
                    api.metrics().leader_changes.inc();
                }
                tracing::info!(state = ?now.0, leader = ?now.1, term = now.2, "raft role");
                seen = Some(now);
            }
        }
        let ready = raft_running && api.readiness().is_ok();
        if serving != Some(ready) {
            let status = if ready { ServingStatus::Serving } else { ServingStatus::NotServing };
            health.set_service_status("", status).await;
            health.set_service_status(holdfast_proto::v1::LOCKS_SERVICE, status).await;
            serving = Some(ready);
        }
        if !raft_running {
            return;
        }
        tokio::select! {
            // An error: openraft's core stopped (a fatal error, or shutdown) and dropped the sender, so
            // the node is not ready from now on.
            changed = raft.changed() => raft_running = changed.is_ok(),
            _ = shutdown.changed() => return,
            _ = recheck.tick() => {}
        }
    }
}

/// Serves a node whose storage refused to open (`why`: damage found, an unknown format, a directory it may not
/// write) until `shutdown`: `/livez` answers 200, since a restart finds the same storage and a restart loop
/// would only hide the reason; `/readyz` 503 `not ready: storage refused: …`; `/metrics` with
/// `holdfast_storage_refused 1`; every other request 503 problem+json pointing there. The node takes no part in
/// the cluster: its peer port is not served, so its peers find it down. On the client port, and on the
/// health port if there is one.
pub async fn serve_refused<C, H>(
    client: C,
    health: Option<H>,
    why: String,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> std::io::Result<()>
where
    C: axum::serve::Listener<Addr = std::net::SocketAddr>,
    H: axum::serve::Listener<Addr = std::net::SocketAddr>,
{
    metrics.storage_refused.set(1);
    let why = Arc::new(why);
    let page = {
        let metrics = metrics.clone();
        move || {
            let page = metrics.encode();
            async move { ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], page) }
        }
    };
    let router = Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|State(why): State<Arc<String>>| async move {
                (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: storage refused: {why}\n"))
            }),
        )
        .route("/metrics", get(page))
        // The reason names files of the node's data directory: /readyz and the log tell it, a client's
        // request is told only where to look.
        .fallback(|| async {
            let detail = "this node's storage refused to open, so it serves nothing: its /readyz and its log say why";
            crate::api::error::ApiError::Unavailable { detail: detail.to_owned() }.into_response()
        })
        .with_state(why);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.changed().await;
    };
    let client = axum::serve(client, router.clone()).with_graceful_shutdown(until(stopped.clone()));
    let mut servers = vec![tokio::spawn(async move { client.await })];
    if let Some(listener) = health {
        let health = axum::serve(listener, router).with_graceful_shutdown(until(stopped));
        servers.push(tokio::spawn(async move { health.await }));
    }
    shutdown.await;
    let _ = stop.send(true);
    for server in servers {
        server.await.map_err(std::io::Error::other)??;
    }
    Ok(())
}

/// A listener lent to a server that stops before the node's own starts (the health of a node that fetches
/// a replacement for its damaged snapshot, [`serve_refused`]): it accepts through a shared handle, and
/// [`Lent::take`] gives the listener back once that server is gone.
pub struct Lent<L> {
    inner: Arc<tokio::sync::Mutex<L>>,
    addr: std::net::SocketAddr,
}

impl<L: axum::serve::Listener<Addr = std::net::SocketAddr>> Lent<L> {
    pub fn new(listener: L) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        Ok(Lent { inner: Arc::new(tokio::sync::Mutex::new(listener)), addr })
    }

    /// Another handle on the same listener.
    pub fn share(&self) -> Self {
        Lent { inner: self.inner.clone(), addr: self.addr }
    }

    /// The listener, once every other handle is gone.
    pub fn take(self) -> Option<L> {
        Arc::try_unwrap(self.inner).ok().map(tokio::sync::Mutex::into_inner)
    }
}

impl<L: axum::serve::Listener<Addr = std::net::SocketAddr>> axum::serve::Listener for Lent<L> {
    type Io = L::Io;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        self.inner.lock().await.accept().await
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

/// Sends `state` (`READY=1`, `STOPPING=1`) to systemd's notification socket, if the service manager gave
/// one (`Type=notify`); does nothing otherwise.
pub fn notify_systemd(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = (|| -> std::io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let socket = std::os::unix::net::UnixDatagram::unbound()?;
        let bytes = path.as_bytes();
        let addr = match bytes.strip_prefix(b"@") {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                std::os::unix::net::SocketAddr::from_abstract_name(name)?
            }
            None => std::os::unix::net::SocketAddr::from_pathname(&path)?,
        };
        socket.send_to_addr(state.as_bytes(), &addr)?;
        Ok(())
    })();
    if let Err(e) = sent {
        tracing::warn!(%e, state, "could not notify systemd");
    }
}
