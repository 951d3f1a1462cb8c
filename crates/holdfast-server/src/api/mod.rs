//! ② The API: the operations both fronts offer, with their input checks, API keys and tenants, admin
//! calls and the cluster's view, all free of any transport (no axum, no tonic). The fronts only parse and
//! format; everything else is here, once.
//!
//! - [`locks`]: acquire, release, renew, get, list, with their checks and the long poll.
//! - [`auth`]: API keys, tenants' namespaces ([`auth::Scope`]) and request budgets.
//! - [`admin`]: who may make admin calls, membership, keys, snapshots.
//! - [`cluster`]: the cluster as this node sees it, readiness, and the metrics page.
//! - [`error`]: [`error::ApiError`], what a client is told went wrong.
//!
//! Imports `route`, `leader`, `apply`, `election`, `peer` and the leaves; nothing above.

pub mod admin;
pub mod auth;
pub mod cluster;
pub mod error;
pub mod locks;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use holdfast_core::{SessionId, SessionView};
use holdfast_store::{NodeId, SharedState, TypeConfig};
use openraft::Raft;

use self::auth::{Auth, Scope, Secret};
use self::error::ApiError;
use crate::apply::events::{Events, Notes};
use crate::election::Elections;
use crate::faults::Bugs;
use crate::leader::Leader;
use crate::load::Load;
use crate::metrics::Metrics;
use crate::peer::protocol::{NodeError, Request, Written};
use crate::route::Router;

/// Bounds the front doors apply before proposing anything.
#[derive(Debug, Clone)]
pub struct FrontLimits {
    pub ttl_ms_min: u64,
    pub ttl_ms_max: u64,
    pub wait_ms_max: u64,
    /// The longest lock-delay an acquire may ask for.
    pub lock_delay_ms_max: u64,
    /// Past this heartbeat lag the node refuses new sessions and one-shot acquires (`--overload-delay`,
    /// [`crate::load`]).
    pub overload_delay: std::time::Duration,
    /// Past this share of the workers' time busy, in either of the last two seconds, the node refuses new
    /// sessions (`--overload-busy`, 1 never; [`crate::load`]).
    pub overload_busy: f64,
}

/// What the fronts hold: a node as its clients see it.
pub struct Api {
    raft: Raft<TypeConfig>,
    state: SharedState,
    events: Arc<Events>,
    elections: Arc<Elections>,
    leader: Arc<Leader>,
    route: Arc<Router>,
    metrics: Arc<Metrics>,
    /// The last committed log index this node knows of.
    committed_index: Arc<AtomicU64>,
    /// The store's disk (`None`: in memory).
    disk: Option<holdfast_store::Disk>,
    limits: FrontLimits,
    /// API keys, tenants and their budgets.
    auth: Auth,
    /// The key admin calls must present; `None`: from loopback only (or never, under `--auth`).
    admin_key: Option<Secret>,
    /// How late this node confirms heartbeats.
    load: Arc<Load>,
    bugs: Bugs,
}

/// What an [`Api`] is made of.
pub struct Parts {
    pub raft: Raft<TypeConfig>,
    pub state: SharedState,
    pub events: Arc<Events>,
    pub elections: Arc<Elections>,
    pub leader: Arc<Leader>,
    pub route: Arc<Router>,
    pub metrics: Arc<Metrics>,
    pub committed_index: Arc<AtomicU64>,
    pub disk: Option<holdfast_store::Disk>,
    pub limits: FrontLimits,
    pub auth: Auth,
    pub admin_key: Option<Secret>,
    pub load: Arc<Load>,
    pub bugs: Bugs,
}

impl Api {
    pub fn new(parts: Parts) -> Self {
        let Parts {
            raft,
            state,
            events,
            elections,
            leader,
            route,
            metrics,
            committed_index,
            disk,
            limits,
            auth,
            admin_key,
            load,
            bugs,
        } = parts;
        Api {
            raft,
            state,
            events,
            elections,
            leader,
            route,
            metrics,
            committed_index,
            disk,
            limits,
            auth,
            admin_key,
            load,
            bugs,
        }
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.elections.id()
    }

    /// The bounds on what clients may ask for.
    pub fn limits(&self) -> &FrontLimits {
        &self.limits
    }

    /// The node's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// How late this node confirms heartbeats ([`crate::load`]).
    pub fn load(&self) -> &Arc<Load> {
        &self.load
    }

    /// Refuses new load (a session, a one-shot acquire) while this node confirms heartbeats later than
    /// `--overload-delay`: the sessions it has come first. `RESOURCE_EXHAUSTED` / `429` `overloaded`.
    pub fn admit_load(&self) -> Result<(), ApiError> {
        self.refuse_if(self.load.refuses_acquire())
    }

    /// Refuses a new session while [`Api::admit_load`] would refuse new load, or while this node's workers
    /// have had no room to spare (`--overload-busy`, [`Load::refuses_session`]).
    pub fn admit_session(&self) -> Result<(), ApiError> {
        self.refuse_if(self.load.refuses_session())
    }

    /// `overloaded` with the detail of a refusal, counted, if there is one.
    fn refuse_if(&self, refused: Option<String>) -> Result<(), ApiError> {
        let Some(detail) = refused else { return Ok(()) };
        self.metrics.overload_refusals.inc();
        Err(ApiError::Limit { slug: "overloaded", detail })
    }

    /// The fence a client is told for a grant under `fence`.
    pub fn told_fence(&self, fence: u64) -> u64 {
        if self.bugs.term_as_fence() {
            return self.raft.metrics().borrow().current_term;
        }
        fence
    }

    /// Applies `request` through the leader ([`Router::write`]). Not an async fn of its own: a caller waiting
    /// for its write holds [`Router::write`]'s future alone, not a second copy of the request around it.
    pub fn write(&self, request: Request) -> impl std::future::Future<Output = Result<Written, NodeError>> + Send + '_ {
        self.route.write(request)
    }

    /// Keeps session `id` alive through the leader, and calls `beaten` with the answer
    /// ([`Router::heartbeat`]).
    pub fn heartbeat(&self, id: SessionId, beaten: crate::route::Beaten) {
        self.route.heartbeat(id, beaten)
    }

    /// A session's client sees its heartbeats `late` ([`Load::client_late`]), counted only since this node's
    /// requests were last left unserved, so that the wait for a failover is not taken for load.
    pub fn client_late(&self, late: std::time::Duration) {
        let since = tokio::time::Instant::now().checked_sub(late).unwrap_or_else(tokio::time::Instant::now);
        self.load.client_late(self.route.waited_while_served(since));
    }

    /// The value the hold of `name` under `fence` publishes as this node has applied it (empty if that
    /// hold is not there).
    pub fn value_here(&self, name: &str, fence: u64) -> Vec<u8> {
        crate::state::read(&self.state).hold(name, fence).map(|h| h.value).unwrap_or_default()
    }

    /// Waits until this node applied the log up to `index`.
    pub async fn wait_applied(&self, index: u64) -> Result<(), NodeError> {
        self.route.wait_applied(index).await
    }

    /// Session `id` as of now, with `attach` run on it before any later entry applies
    /// ([`Router::session_view`]).
    pub async fn session_view<T>(
        &self,
        id: SessionId,
        attach: impl FnOnce(&SessionView) -> T,
    ) -> Result<Option<(SessionView, T)>, NodeError> {
        self.route.session_view(id, attach).await
    }

    /// Attaches a stream to session `id` (replacing any earlier one: the session moved), with no entry
    /// applied meanwhile: what it hears starts where this node's state is.
    pub fn attach(&self, id: SessionId) -> Notes {
        let _state = crate::state::read(&self.state);
        self.events.attach(id)
    }

    /// Attaches a stream to session `id` from inside [`Api::session_view`]'s `attach`, which holds the
    /// state's lock already.
    pub fn attach_viewed(&self, id: SessionId) -> Notes {
        self.events.attach(id)
    }

    /// Detaches the stream of session `id`, if it is still the one attached.
    pub fn detach(&self, id: SessionId) {
        self.events.detach(id)
    }

    /// This node's Raft, for the fronts' health service to watch.
    pub fn raft(&self) -> &Raft<TypeConfig> {
        &self.raft
    }

    /// Authenticates a request by its `Authorization` value ([`auth::authenticate`]): the tenant's scope
    /// (everything, without `--auth`), one request taken from its key's budget.
    ///
    /// A key this node does not know may have been made through another node a moment ago, its entry not
    /// applied here yet: before refusing it, the node catches up with the leader (a read index, shared by
    /// the requests that arrive together) and looks again, so that a key acknowledged by any node works on
    /// every node at once.
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Scope, ApiError> {
        match auth::authenticate(&self.auth, &self.state, authorization) {
            Err(ApiError::Unauthenticated { .. }) if auth::bearer(authorization).is_some() => {
                // Boxed: a read index is a large future, and every request would carry it inline.
                Box::pin(self.route.caught_up()).await?;
                auth::authenticate(&self.auth, &self.state, authorization)
            }
            scope => scope,
        }
    }

    /// Admits one more request under `scope` ([`Scope::admit`]).
    pub fn admit(&self, scope: &Scope) -> Result<(), ApiError> {
        scope.admit(&self.auth, &self.state)
    }

    /// Whether `scope`'s key still exists ([`Scope::valid`]).
    pub fn scope_valid(&self, scope: &Scope) -> bool {
        scope.valid(&self.state)
    }
}
