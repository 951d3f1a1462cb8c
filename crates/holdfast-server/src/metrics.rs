//! Prometheus metrics: one registry per node, served at `GET /metrics` (OpenMetrics text) on the client
//! port and on the health port. Names and labels are documented in `docs/operations.md`; they are part of
//! the interface, so rename nothing without saying so there.
//!
//! Counters move where things happen (apply, propose, forward, each request). Gauges that describe the
//! state (locks held, Raft's term and indexes) are read when scraped, so they cost nothing in between.
//! No label carries a lock name, owner, token or key: label values come from small fixed sets.

use std::borrow::Cow;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

/// The content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Which front a request came in by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Http,
    Grpc,
}

impl Api {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Api::Http => "http",
            Api::Grpc => "grpc",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub api: &'static str,
    /// `METHOD /route/{param}` for HTTP, `/package.Service/Method` for gRPC; `unmatched` otherwise.
    /// Borrowed where the endpoint is a fixed name (the calls of a `Calls` stream), so that counting a
    /// call allocates nothing.
    pub endpoint: Cow<'static, str>,
    /// The HTTP status, or the gRPC status code (0 is OK).
    pub code: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    pub api: &'static str,
    pub endpoint: Cow<'static, str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProposalResult {
    Committed,
    Failed,
}

impl ProposalResult {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            ProposalResult::Committed => "committed",
            ProposalResult::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProposalLabels {
    pub result: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    Lock,
    Waiter,
    Session,
}

impl Expired {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Expired::Lock => "lock",
            Expired::Waiter => "waiter",
            Expired::Session => "session",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExpiredLabels {
    pub kind: &'static str,
}

/// What a follower forwards to the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forwarded {
    Write,
    /// A batch of a follower's writes.
    Writes,
    Read,
    Heartbeat,
    /// A batch of a follower's heartbeats.
    Heartbeats,
    StillWaiting,
    Barrier,
    Membership,
}

impl Forwarded {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Forwarded::Write => "write",
            Forwarded::Writes => "writes",
            Forwarded::Read => "read",
            Forwarded::Heartbeat => "heartbeat",
            Forwarded::Heartbeats => "heartbeats",
            Forwarded::StillWaiting => "still_waiting",
            Forwarded::Barrier => "barrier",
            Forwarded::Membership => "membership",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ForwardedLabels {
    pub kind: &'static str,
}

type HistogramMaker = fn() -> Histogram;

/// Latencies from 100 µs to about 13 s.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 2.0, 18))
}

/// A node's metrics.
pub struct Metrics {
    registry: Registry,

    // Raft, read when scraped.
    pub has_leader: Gauge,
    pub is_leader: Gauge,
    pub term: Gauge,
    pub last_log_index: Gauge,
    pub committed_index: Gauge,
    pub applied_index: Gauge,
    pub apply_lag: Gauge,
    // Raft, counted as it happens.
    pub leader_changes: Counter,
    pub early_campaigns: Counter,
    pub silent_leader_campaigns: Counter,
    pub pre_votes_lost: Counter,
    pub confirmations: Counter,
    pub proposals: Family<ProposalLabels, Counter>,
    pub entry_commands: Histogram,
    pub held_back: Gauge,
    pub fsync: Histogram,
    /// Appends this node synced on the log's own thread as a follower with many clients' writes waiting.
    pub appends_synced_aside: Counter,
    pub snapshot_bytes: Gauge,
    pub snapshot_index: Gauge,
    /// The store's disk: its room and its syncs (set at scrape time).
    pub disk_free: Gauge,
    pub disk_full: Gauge,
    pub disk_stalled: Gauge,
    pub storage_refused: Gauge,
    pub storage_catching_up: Gauge,

    // The lock state, read when scraped.
    pub locks_held: Gauge,
    pub waiters: Gauge,
    pub sessions: Gauge,
    // The lock state, counted on apply (so every node counts the same entries).
    pub grants: Counter,
    pub handovers: Counter,
    pub expirations: Family<ExpiredLabels, Counter>,
    pub handover_latency: Histogram,

    // The fronts.
    pub heartbeat_duration: Histogram,
    pub forwarded: Family<ForwardedLabels, Counter>,
    pub requests: Family<RequestLabels, Counter>,
    pub request_duration: Family<EndpointLabels, Histogram, HistogramMaker>,
    pub lock_watchers: Gauge,
    /// How late this node's tasks wake and how late it confirms heartbeats, in milliseconds
    /// ([`crate::load`]; set at scrape time).
    pub runtime_lag_ms: Gauge,
    /// How busy the runtime's worker threads were, as a share of their time (set at scrape time).
    pub runtime_busy: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub heartbeat_lag_ms: Gauge,
    pub overload_refusals: Counter,

    // The process.
    pub worker_threads: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut root = Registry::with_prefix("holdfast");
        let m = Metrics {
            registry: Registry::default(),
            has_leader: Gauge::default(),
            is_leader: Gauge::default(),
            term: Gauge::default(),
            last_log_index: Gauge::default(),
            committed_index: Gauge::default(),
            applied_index: Gauge::default(),
            apply_lag: Gauge::default(),
            leader_changes: Counter::default(),
            early_campaigns: Counter::default(),
            confirmations: Counter::default(),
            silent_leader_campaigns: Counter::default(),
            pre_votes_lost: Counter::default(),
            proposals: Family::default(),
            entry_commands: Histogram::new(exponential_buckets(1.0, 2.0, 9)),
            held_back: Gauge::default(),
            worker_threads: Gauge::default(),
            fsync: latency_histogram(),
            appends_synced_aside: Counter::default(),
            snapshot_bytes: Gauge::default(),
            snapshot_index: Gauge::default(),
            disk_free: Gauge::default(),
            disk_full: Gauge::default(),
            disk_stalled: Gauge::default(),
            storage_refused: Gauge::default(),
            storage_catching_up: Gauge::default(),
            locks_held: Gauge::default(),
            waiters: Gauge::default(),
            sessions: Gauge::default(),
            grants: Counter::default(),
            handovers: Counter::default(),
            expirations: Family::default(),
            handover_latency: latency_histogram(),
            heartbeat_duration: latency_histogram(),
            forwarded: Family::default(),
            requests: Family::default(),
            request_duration: Family::new_with_constructor(latency_histogram),
            lock_watchers: Gauge::default(),
            runtime_lag_ms: Gauge::default(),
            runtime_busy: Gauge::default(),
            heartbeat_lag_ms: Gauge::default(),
            overload_refusals: Counter::default(),
        };
        m.register_raft(root.sub_registry_with_prefix("raft"));
        m.register_storage(root.sub_registry_with_prefix("storage"));
        m.register_lock_state(&mut root);
        m.register_fronts(&mut root);
        m.register_process(&mut root);
        Metrics { registry: root, ..m }
    }

    /// Registers Raft's metrics (`holdfast_raft_…`).
    fn register_raft(&self, raft: &mut Registry) {
        raft.register("has_leader", "1 if this node knows a leader", self.has_leader.clone());
        raft.register("is_leader", "1 if this node is the leader", self.is_leader.clone());
        raft.register("term", "The current Raft term", self.term.clone());
        raft.register("last_log_index", "The index of the last entry in this node's log", self.last_log_index.clone());
        raft.register("committed_index", "The last committed index this node knows of", self.committed_index.clone());
        raft.register("applied_index", "The last index applied to this node's lock state", self.applied_index.clone());
        raft.register_with_unit(
            "apply_lag",
            "Committed entries not yet applied on this node",
            Unit::Other("entries".into()),
            self.apply_lag.clone(),
        );
        raft.register("leader_changes", "Times this node saw a new leader", self.leader_changes.clone());
        raft.register(
            "early_campaigns",
            "Elections this node started at once, on refusing a candidate whose log was behind its own after no leader \
             was heard from for a lease, or a candidate that deposed this node as leader",
            self.early_campaigns.clone(),
        );
        raft.register(
            "silent_leader_campaigns",
            "Elections this node started because no leader was heard from for a lease and an election timeout, and a \
             majority of the voters would vote for it",
            self.silent_leader_campaigns.clone(),
        );
        raft.register(
            "pre_votes_lost",
            "Times this node did not campaign after no leader was heard from for a lease and an election timeout: no \
             majority of the voters would vote for it (they still hear a leader, hold a longer log, or cannot be \
             reached)",
            self.pre_votes_lost.clone(),
        );
        raft.register(
            "leader_confirmations",
            "Quorum rounds this node ran as leader to confirm it still leads, each shared by the reads, busy answers \
             and heartbeats that arrived before it began",
            self.confirmations.clone(),
        );
        raft.register("proposals", "Entries this node proposed as leader, by result", self.proposals.clone());
        raft.register(
            "entry_commands",
            "Client commands carried by each entry this node proposed as leader (more than 1: a batch)",
            self.entry_commands.clone(),
        );
        raft.register(
            "held_back_acquires",
            "Acquires that will queue, held back by the leader's proposer for their lock's release to share its entry",
            self.held_back.clone(),
        );
    }

    /// Registers the storage's metrics (`holdfast_storage_…`).
    fn register_storage(&self, storage: &mut Registry) {
        storage.register_with_unit(
            "fsync_duration",
            "Time of each sync (write and fdatasync or fsync) the log, vote or snapshot waited for",
            Unit::Seconds,
            self.fsync.clone(),
        );
        storage.register(
            "appends_synced_aside",
            "Appends this node synced on the log's own thread, not its worker's, as a follower with many clients' writes waiting",
            self.appends_synced_aside.clone(),
        );
        storage.register_with_unit(
            "snapshot",
            "Size of this node's current snapshot (built here, installed from the leader, or found at start; 0: none)",
            Unit::Bytes,
            self.snapshot_bytes.clone(),
        );
        storage.register(
            "snapshot_index",
            "The last log index this node's current snapshot covers (0: none)",
            self.snapshot_index.clone(),
        );
        storage.register_with_unit(
            "disk_free",
            "Bytes free on the file system of the data directory, at the last look (every 250 ms)",
            Unit::Bytes,
            self.disk_free.clone(),
        );
        storage.register(
            "disk_full",
            "1 while the data directory's disk is full: the reserve is given back and the raft log takes no more \
             entries, so this node acknowledges no write and, as leader, lets another lead",
            self.disk_full.clone(),
        );
        storage.register(
            "disk_stalled",
            "1 while the raft log's sync has kept a write waiting --disk-stall or longer: the log takes no more \
             entries until its syncs finish, so this node acknowledges no write and, as leader, lets another lead",
            self.disk_stalled.clone(),
        );
        storage.register(
            "refused",
            "1 while this node's storage refuses to open (damage found, an unknown format): the node serves \
             nothing but its health and metrics, and says why on /readyz",
            self.storage_refused.clone(),
        );
        storage.register(
            "catching_up",
            "1 while this node's log, cut where its disk damaged it, has not caught up with the leader's: the \
             node grants no vote until it has, and says so on /readyz",
            self.storage_catching_up.clone(),
        );
    }

    /// Registers the lock state's metrics.
    fn register_lock_state(&self, registry: &mut Registry) {
        registry.register("locks_held", "Locks held now", self.locks_held.clone());
        registry.register("lock_waiters", "Claims waiting in lock queues now", self.waiters.clone());
        registry.register("sessions", "Open sessions", self.sessions.clone());
        registry.register("grants", "Locks granted (applied on this node)", self.grants.clone());
        registry.register(
            "handovers",
            "Grants to a waiter in the same entry that ended the previous hold",
            self.handovers.clone(),
        );
        registry.register("expirations", "Holds, waiters and sessions expired, by kind", self.expirations.clone());
        registry.register_with_unit(
            "handover_latency",
            "From the leader stamping an entry that hands a lock over to this node applying it",
            Unit::Seconds,
            self.handover_latency.clone(),
        );
    }

    /// Registers the fronts' metrics.
    fn register_fronts(&self, registry: &mut Registry) {
        registry.register_with_unit(
            "heartbeat_duration",
            "From a session heartbeat reaching this node to its acknowledgement, the leader's quorum round included",
            Unit::Seconds,
            self.heartbeat_duration.clone(),
        );
        registry.register(
            "forwarded_requests",
            "Requests this node forwarded to the leader, by kind",
            self.forwarded.clone(),
        );
        registry.register("requests", "Client requests answered, by front, endpoint and code", self.requests.clone());
        registry.register_with_unit(
            "request_duration",
            "Client request latency by front and endpoint (for gRPC streams: until the stream opened)",
            Unit::Seconds,
            self.request_duration.clone(),
        );
        registry.register(
            "lock_watchers",
            "Watches of a lock waiting on this node for its next change (long polls and watch streams)",
            self.lock_watchers.clone(),
        );
        registry.register(
            "runtime_lag_milliseconds",
            "How late this node's tasks wake from a sleep: the largest in the last one to two seconds",
            self.runtime_lag_ms.clone(),
        );
        registry.register(
            "runtime_busy_ratio",
            "How busy this node's runtime worker threads were, as a share of their time: the larger of the last two seconds",
            self.runtime_busy.clone(),
        );
        registry.register(
            "heartbeat_lag_milliseconds",
            "How long this node, as leader, took to confirm a heartbeat from its arrival at the node it was sent to: the largest in the last one to two seconds",
            self.heartbeat_lag_ms.clone(),
        );
        registry.register(
            "overload_refusals",
            "New sessions and one-shot acquires refused because heartbeats were confirmed later than --overload-delay",
            self.overload_refusals.clone(),
        );
    }

    /// Registers the process's metrics.
    fn register_process(&self, registry: &mut Registry) {
        registry.register(
            "worker_threads",
            "Threads of the async runtime this node runs on (--worker-threads)",
            self.worker_threads.clone(),
        );
    }

    /// Counts one answered client request.
    pub fn request(&self, api: Api, endpoint: impl Into<Cow<'static, str>>, code: u16, took: Duration) {
        let (api, endpoint) = (api.label(), endpoint.into());
        self.requests.get_or_create(&RequestLabels { api, endpoint: endpoint.clone(), code }).inc();
        self.request_duration.get_or_create(&EndpointLabels { api, endpoint }).observe(took.as_secs_f64());
    }

    /// An entry carrying `commands` client commands was proposed, with `result`.
    pub fn proposal(&self, result: ProposalResult, commands: usize) {
        self.proposals.get_or_create(&ProposalLabels { result: result.label() }).inc();
        self.entry_commands.observe(commands as f64);
    }

    pub fn forwarded(&self, kind: Forwarded) {
        self.forwarded.get_or_create(&ForwardedLabels { kind: kind.label() }).inc();
    }

    pub fn expired(&self, kind: Expired, count: usize) {
        if count > 0 {
            self.expirations.get_or_create(&ExpiredLabels { kind: kind.label() }).inc_by(count as u64);
        }
    }

    /// The registry as OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_prefix_units_and_labels() {
        let m = Metrics::new();
        m.grants.inc();
        m.proposal(ProposalResult::Failed, 3);
        m.request(Api::Http, "POST /v1/locks/{name}", 200, Duration::from_millis(3));
        m.fsync.observe(0.002);
        let text = m.encode();
        for line in [
            "holdfast_grants_total 1",
            "holdfast_raft_proposals_total{result=\"failed\"} 1",
            "holdfast_raft_entry_commands_sum 3.0",
            "holdfast_requests_total{api=\"http\",endpoint=\"POST /v1/locks/{name}\",code=\"200\"} 1",
            "holdfast_storage_fsync_duration_seconds_count 1",
            "holdfast_storage_appends_synced_aside_total 0",
            "holdfast_raft_apply_lag_entries 0",
            "holdfast_storage_snapshot_bytes 0",
            "holdfast_storage_snapshot_index 0",
            "holdfast_storage_disk_full 0",
            "holdfast_storage_disk_stalled 0",
            "holdfast_storage_refused 0",
            "holdfast_storage_catching_up 0",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing from:\n{text}");
        }
    }
}
