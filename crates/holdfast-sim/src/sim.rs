//! One simulated run: a cluster of real nodes (the server crate on the in-memory store, or on the disk
//! store over a file system that loses what was not synced) on turmoil's network, clients on it, faults from a schedule, and at the end the healed cluster's final state and
//! every checker's verdict.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use holdfast_server::{Bugs, Config, Storage, Transport, WallClock};
use holdfast_server::{FrontLimits, Node};
use holdfast_store::testing::{open_on_crash_fs_flushing, CrashFs};
use holdfast_store::{open_memory, MemDisk};
use openraft::ServerState;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::check::{self, Violation};
use crate::history::{At, Final, History};
use crate::record::{Recorder, Resource};
use crate::workload::{self, Ctx, KEPT_PREFIX, MODEL_LOCKS};

/// A node's number, 1-based; its host is `n{id}`.
pub type NodeId = u64;

/// One thing that goes wrong.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Every link between the two groups of nodes is cut, both ways.
    Partition(Vec<NodeId>, Vec<NodeId>),
    /// Messages from `from` to `to` are lost; the other way works.
    OneWay { from: Vec<NodeId>, to: Vec<NodeId> },
    /// The node that leads now is cut off from the other nodes (clients still reach it).
    IsolateLeader,
    /// A node stops at once (kill -9, power loss): it keeps only what its disk made durable.
    Crash(NodeId),
    /// The node that leads now crashes.
    CrashLeader,
    /// The `n`th follower (from 0, lowest-numbered first) of the node that leads now crashes.
    CrashFollower(usize),
    /// Every node crashes at once.
    CrashAll,
    /// A crashed node starts again from its disk.
    Restart(NodeId),
    /// Every crashed node starts again from its disk; cuts and everything else stay as they are.
    RestartCrashed,
    /// Messages between nodes are held (delayed) until the next `Heal` or `Release`.
    Hold(Vec<NodeId>, Vec<NodeId>),
    /// Messages between one follower of the node that leads now (the lowest-numbered) and every other
    /// node are held (a stalled link): it hears nothing, and what it sends, its candidacies included,
    /// arrives all at once at the next `Heal` or `Release`.
    HoldFollower,
    /// Messages held between nodes are delivered, and links stop holding; cuts, crashes and everything
    /// else stay as they are.
    Release,
    /// The `n`th follower (from 0, lowest-numbered first) of the node that leads now is cut off from every
    /// other node; clients still reach it.
    IsolateFollower(usize),
    /// The link between the node that leads now and its `n`th follower (from 0, lowest-numbered first) is
    /// cut, both ways; every other link works.
    CutFollower(usize),
    /// Installing a snapshot the leader sent takes this long on every node from now on, as with a large
    /// state; the node answers the leader's last chunk only once it is done.
    SlowSnapshotInstalls(Duration),
    /// Messages take up to this long from now on.
    Latency(Duration),
    /// Every link, at each message sent, breaks with this probability: what it had in flight is lost.
    Lossy(f64),
    /// A node's wall clock jumps by this many milliseconds (forwards or backwards) and stays off; its
    /// monotonic clock is not affected.
    ClockJump { node: NodeId, by_ms: i64 },
    /// A client's process pauses (a long GC, a stopped VM): nothing it sends or is sent moves until the
    /// next `Heal`, while its own code goes on believing what it believed.
    StallClient(u32),
    /// Every link repaired, held messages delivered, crashed nodes restarted, latency back to normal.
    Heal,
}

/// What a client does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// One-call try-locks of the model locks (linearizability).
    Model,
    /// One-call holds of the fenced lock with a short TTL, stalling now and then.
    FencedHttp,
    /// A session on the client library queueing for the fenced lock.
    Session,
    /// One-call holds of locks of its own, about half kept to the end (acknowledged writes).
    Keeper,
    /// Changes the membership while everything else goes on: adds the spare node, removes a member, adds
    /// it back, removes the spare (so the cluster ends as it began).
    Admin { spare: NodeId, victim: NodeId },
    /// One-call reads of the model locks (linearizability of reads).
    Reader,
    /// A watch of the fenced lock on the client library (every change, in order).
    Watcher,
    /// Campaigns in an election on the client library, leads a while, resigns.
    Elector,
    /// One-call holds of the delayed lock with a lock-delay, half of them left to expire.
    Delayed,
    /// One-call holds (HTTP or gRPC) of places of the semaphore with a short TTL, half of them left to
    /// expire.
    Semaphore,
    /// A session on the client library queueing for places of the semaphore.
    SemaphoreSession,
}

/// A client written for one scenario: given its context, it runs to completion.
pub type Script = Arc<dyn Fn(Ctx) -> Pin<Box<dyn Future<Output = turmoil::Result>>>>;

/// A [`Script`] from an async closure.
pub fn script<F, Fut>(client: F) -> Script
where
    F: Fn(Ctx) -> Fut + 'static,
    Fut: Future<Output = turmoil::Result> + 'static,
{
    Arc::new(move |ctx| Box::pin(client(ctx)))
}

/// Everything that decides a run. A run is a function of its plan.
#[derive(Clone)]
pub struct Plan {
    pub seed: u64,
    /// 3 or 5: the members the cluster starts with.
    pub nodes: u64,
    /// Nodes started with `--join`, for membership changes: ids `nodes + 1 ..= nodes + spares`.
    pub spares: u64,
    /// Broken behaviours of the nodes (all off: the real thing).
    pub bugs: Bugs,
    /// The nodes' `--max-clock-skew` (`None`: a full lease for every hold from a promotion).
    pub max_clock_skew: Option<Duration>,
    /// Nodes whose disks acknowledge before they make writes durable (broken).
    pub broken_disks: bool,
    /// The nodes' storage.
    pub store: Store,
    /// On [`Store::Files`], how long of the simulation's time each sync by a node's log task takes there (a
    /// leader's own entries, a follower's synced aside), during which a crash may take what it syncs. A node
    /// not named syncs at once, as every node of a random plan does.
    pub flush: BTreeMap<NodeId, Duration>,
    /// Faults and when they happen, in order.
    pub faults: Vec<(At, Fault)>,
    /// The clients.
    pub roles: Vec<Role>,
    /// Clients written for a scenario, beside the roles.
    pub scripts: Vec<Script>,
    /// Clients start nothing new after this.
    pub stop_at: At,
    /// From this moment no fault is in force (a `Heal` is applied then if the schedule did not).
    pub healed_at: At,
    /// How long after `healed_at` (plus an election's time to settle) every call must be answered.
    pub liveness_bound: Duration,
    /// Entries between a node's snapshots; it keeps as many behind its snapshot (at most 1,000), and a
    /// leader what its followers still need, for 3 s at most if it does not move (the server's `purge` module), so a follower
    /// further behind than that is sent a snapshot.
    pub snapshot_every_entries: u64,
    /// Whether the run ends with a failover in a cluster nobody else talks to, once the healed cluster has
    /// converged ([`workload::quiet_probe`]): the leader crashes while a session and a TTL hold, taken
    /// through a follower, must outlive it and run out respectively.
    pub quiet_failover: bool,
}

/// The storage a plan's nodes run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// The memory store (`MemDisk`): each call makes durable what the disk store would, and a crash
    /// forgets the rest; `SlowSnapshotInstalls` slows its installs.
    Memory,
    /// The disk store itself (holdfast-store's log segments, snapshot files, vote and records) on the crash
    /// file system (`CrashFs`), which at a crash keeps what was synced and a random part of the rest, and
    /// only the directory changes that were synced. A leader's own entries are synced by a task of the
    /// node's runtime rather than a thread (which would run outside turmoil's schedule), and
    /// `SlowSnapshotInstalls` does nothing.
    Files,
}

/// What a run found.
#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    pub history: History,
    pub violations: Vec<Violation>,
    /// Simulated time the run covered.
    pub simulated: Duration,
    /// One line per fault applied, with its time.
    pub trace: Vec<String>,
    /// The members (voters and learners) of the healed cluster at the end.
    pub members: Vec<NodeId>,
}

impl Report {
    /// A fingerprint of the whole history: two runs of a seed that agree call for call have the same.
    pub fn digest(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        // DefaultHasher::new() has fixed keys: the same text hashes alike in every process.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        format!("{:?}{:?}", self.history, self.trace).hash(&mut hasher);
        hasher.finish()
    }

    /// A short account: seed, history fingerprint, counts, violations.
    pub fn summary(&self) -> String {
        use crate::history::Outcome;
        let granted = self.history.ops.iter().filter(|op| matches!(op.outcome, Outcome::Granted { .. }));
        let read = self.history.ops.iter().filter(|op| matches!(op.outcome, Outcome::Holds { .. } | Outcome::Free));
        let mut text = format!(
            "seed {} (history {:016x}): {:.1} s simulated, {} calls ({} grants, {} reads answered), {} holds, {} \
             resource accesses, {} watched states, {} faults",
            self.seed,
            self.digest(),
            self.simulated.as_secs_f64(),
            self.history.ops.len(),
            granted.count(),
            read.count(),
            self.history.holds.len(),
            self.history.accesses.len(),
            self.history.watched.len(),
            self.trace.len()
        );
        for v in self.violations.iter().take(SUMMARY_VIOLATIONS_MAX) {
            text.push_str(&format!("\n  VIOLATION {v}"));
        }
        if self.violations.len() > SUMMARY_VIOLATIONS_MAX {
            text.push_str(&format!("\n  ... and {} more", self.violations.len() - SUMMARY_VIOLATIONS_MAX));
        }
        text
    }
}

/// The clients of a random plan before an admin (which stalls do not pick).
const CLIENTS_RANDOM: u32 = 7;
/// Entries between snapshots, unless a plan says otherwise: small, so that runs take snapshots.
const SNAPSHOT_EVERY_ENTRIES: u64 = 200;
/// Mixed into a random plan's seed for the draw of its snapshot installs' time ([`Plan::random`]).
const SLOW_INSTALLS_STREAM: u64 = 0x51_0e_1a_57;

/// The stream a random plan's store is drawn from (see [`random_store`]).
const STORE_STREAM: u64 = 0xd1_5c_f1_1e;

/// A random plan's store: the disk store on the crash file system for a third of the seeds. Drawn from a
/// stream of its own, so that this draw shifts none of the draws of a seed's schedule and clients.
fn random_store(seed: u64) -> Store {
    if StdRng::seed_from_u64(seed ^ STORE_STREAM).gen_ratio(1, 3) {
        Store::Files
    } else {
        Store::Memory
    }
}
/// Violations a summary lists; the rest are counted.
const SUMMARY_VIOLATIONS_MAX: usize = 12;
/// How long after the heal an election and reconnections may take before liveness is judged.
const SETTLE: Duration = Duration::from_secs(3);
/// How long the healed cluster may take to converge at the end of a run.
const CONVERGE_MAX: Duration = Duration::from_secs(30);
/// How long the quiet failover at the end of a run may take ([`Plan::quiet_failover`]).
const PROBE_MAX: Duration = Duration::from_secs(60);

impl Plan {
    /// A plan with a random fault schedule and client mix drawn from `seed`.
    pub fn random(seed: u64) -> Plan {
        let mut rng = StdRng::seed_from_u64(seed);
        let nodes = if rng.gen_ratio(1, 4) { 5 } else { 3 };
        let healed_at = Duration::from_secs(rng.gen_range(12..20));
        let mut faults = random_faults(&mut rng, nodes, healed_at);
        let snapshot_every_entries = random_snapshots(seed, &mut faults);
        let (spares, roles) = random_roles(&mut rng, nodes);
        Plan {
            seed,
            nodes,
            spares,
            bugs: Bugs::default(),
            max_clock_skew: None,
            broken_disks: false,
            store: random_store(seed),
            flush: BTreeMap::new(),
            faults,
            roles,
            scripts: Vec::new(),
            stop_at: healed_at + Duration::from_secs(8),
            healed_at,
            liveness_bound: Duration::from_secs(10),
            snapshot_every_entries,
            quiet_failover: true,
        }
    }

    /// A plan with no faults and no clients, for scenarios to fill in.
    pub fn quiet(seed: u64, nodes: u64, stop_at: At) -> Plan {
        Plan {
            seed,
            nodes,
            spares: 0,
            bugs: Bugs::default(),
            max_clock_skew: None,
            broken_disks: false,
            store: Store::Memory,
            flush: BTreeMap::new(),
            faults: Vec::new(),
            roles: Vec::new(),
            scripts: Vec::new(),
            stop_at,
            healed_at: Duration::ZERO,
            liveness_bound: Duration::from_secs(10),
            snapshot_every_entries: SNAPSHOT_EVERY_ENTRIES,
            quiet_failover: false,
        }
    }
}

/// A random plan's faults, from a second or two in until `healed_at`, where a `Heal` ends them.
fn random_faults(rng: &mut StdRng, nodes: u64, healed_at: At) -> Vec<(At, Fault)> {
    let mut faults = Vec::new();
    let mut at = Duration::from_millis(rng.gen_range(1_500..3_000));
    let mut crashed: Vec<NodeId> = Vec::new();
    while at < healed_at {
        let node = rng.gen_range(1..=nodes);
        let others: Vec<NodeId> = (1..=nodes).filter(|n| *n != node).collect();
        let fault = match rng.gen_range(0..10) {
            0 => Fault::Partition(vec![node], others),
            1 => {
                // A majority side and a minority side.
                let cut = rng.gen_range(1..=nodes / 2) as usize;
                let ids: Vec<NodeId> = (1..=nodes).collect();
                Fault::Partition(ids[..cut].to_vec(), ids[cut..].to_vec())
            }
            2 => Fault::OneWay { from: vec![node], to: others },
            3 => Fault::IsolateLeader,
            4 if crashed.len() < (nodes as usize - 1) / 2 => {
                crashed.push(node);
                Fault::Crash(node)
            }
            5 if crashed.is_empty() => {
                crashed.push(0);
                Fault::CrashLeader
            }
            6 => Fault::Hold(vec![node], others),
            7 if rng.gen_ratio(1, 2) => Fault::Latency(Duration::from_millis(rng.gen_range(5..80))),
            7 => Fault::Lossy(rng.gen_range(0.001..0.01)),
            9 if rng.gen_ratio(1, 2) => Fault::StallClient(rng.gen_range(1..=CLIENTS_RANDOM)),
            9 => Fault::ClockJump { node, by_ms: rng.gen_range(-10_000..=10_000) },
            8 if rng.gen_ratio(1, 3) => Fault::CrashAll,
            _ => Fault::Heal,
        };
        if matches!(fault, Fault::Heal | Fault::CrashAll) {
            crashed.clear();
        }
        faults.push((at, fault));
        at += Duration::from_millis(rng.gen_range(500..3_000));
    }
    faults.push((healed_at, Fault::Heal));
    faults
}

/// A random plan's entries between snapshots; for a third of the plans, also slow snapshot installs from
/// the start (put first in `faults`).
fn random_snapshots(seed: u64, faults: &mut Vec<(At, Fault)>) -> u64 {
    // A third of the plans snapshot every 10 entries, so that a follower down or cut off for a second or
    // two is sent a snapshot, and install snapshots slowly throughout, as a large state does, mostly for
    // longer than a follower waits for word from its leader (0.55-0.6 s). With 200 entries between
    // snapshots no run of seeds 1-30 installed one; with 10, 7 of the 12 among them so drawn did, 1 to 7
    // times. Drawn from a stream of its own, so that this draw shifts none of the draws of a seed's
    // schedule and clients.
    let mut installs = StdRng::seed_from_u64(seed ^ SLOW_INSTALLS_STREAM);
    let mut snapshot_every_entries = SNAPSHOT_EVERY_ENTRIES;
    if installs.gen_ratio(1, 3) {
        snapshot_every_entries = 10;
        let time = Duration::from_millis(installs.gen_range(300..2_000));
        faults.insert(0, (Duration::ZERO, Fault::SlowSnapshotInstalls(time)));
    }
    snapshot_every_entries
}

/// A random plan's spare nodes (0 or 1) and clients: the [`CLIENTS_RANDOM`] that stalls may pick, an admin
/// when there is a spare, and a reader.
fn random_roles(rng: &mut StdRng, nodes: u64) -> (u64, Vec<Role>) {
    let mut roles =
        vec![Role::Model, Role::Model, Role::Keeper, Role::FencedHttp, Role::FencedHttp, Role::Session, Role::Session];
    debug_assert_eq!(roles.len() as u32, CLIENTS_RANDOM);
    let spares = u64::from(rng.gen_ratio(1, 3));
    if spares > 0 {
        roles.push(Role::Admin { spare: nodes + 1, victim: rng.gen_range(1..=nodes) });
    }
    // Last: a client's number seeds its choices, so a role put before others would change theirs.
    roles.push(Role::Reader);
    roles.push(Role::Watcher);
    roles.extend([Role::Elector, Role::Elector]);
    roles.extend([Role::Delayed, Role::Delayed]);
    // Three clients for the semaphore's two places.
    roles.extend([Role::Semaphore, Role::Semaphore, Role::SemaphoreSession]);
    (spares, roles)
}

/// The nodes of a run, as the driver sees them.
#[derive(Clone, Default)]
struct Registry(Arc<Mutex<BTreeMap<NodeId, Arc<Node>>>>);

impl Registry {
    fn set(&self, id: NodeId, node: Arc<Node>) {
        self.0.lock().expect("registry poisoned").insert(id, node);
    }

    fn get(&self, id: NodeId) -> Option<Arc<Node>> {
        self.0.lock().expect("registry poisoned").get(&id).cloned()
    }
}

fn host(id: NodeId) -> String {
    format!("n{id}")
}

/// Runs `plan` and checks what it recorded.
pub fn run(plan: &Plan) -> Report {
    // openraft's election timeouts draw from this thread's generator: seeded, every run of a seed elects
    // alike.
    holdfast_store::seed_thread_rng(plan.seed);
    let mut sim = simulation(plan);
    let mut world = World::new(plan);
    for id in 1..=plan.nodes + plan.spares {
        start_node(&mut sim, plan, &world, id);
    }
    let recorder = Recorder::default();
    world.clients = start_clients(&mut sim, plan, &recorder);

    let mut trace = vec![format!(
        "{} nodes on {:?} storage{}, a snapshot every {} entries",
        plan.nodes,
        plan.store,
        if plan.broken_disks { " (broken)" } else { "" },
        plan.snapshot_every_entries
    )];
    let mut violations = Vec::new();
    run_schedule(&mut sim, plan, &mut world, &mut trace, &mut violations);
    apply(&mut sim, plan, &mut world, &Fault::Heal);
    let (end, members) = converge(&mut sim, plan, &world.registry, &mut violations).unzip();
    if let (true, Some(members)) = (plan.quiet_failover, &members) {
        quiet_failover(&mut sim, plan, &mut world, members, &mut trace, &mut violations);
    }

    let mut history = recorder.snapshot();
    history.end = end;
    violations.extend(judge(plan, &history));
    Report {
        seed: plan.seed,
        history,
        violations,
        simulated: sim.elapsed(),
        trace,
        members: members.unwrap_or_default(),
    }
}

/// Turmoil's simulation for `plan`, long enough for its clients, the end's convergence and quiet failover.
fn simulation(plan: &Plan) -> turmoil::Sim<'static> {
    turmoil::Builder::new()
        .rng_seed(plan.seed)
        .simulation_duration(plan.stop_at + 2 * CONVERGE_MAX + PROBE_MAX + Duration::from_secs(60))
        .epoch(UNIX_EPOCH + Duration::from_secs(1_800_000_000))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(5))
        .tcp_capacity(1 << 16)
        .build()
}

/// What every start of one node is made from.
#[derive(Clone)]
struct NodeSpec {
    id: NodeId,
    members: BTreeMap<NodeId, String>,
    join: bool,
    seed: u64,
    snapshot_every_entries: u64,
    bugs: Bugs,
    max_clock_skew: Option<Duration>,
    /// How far the node's wall clock is off the simulation's, in milliseconds.
    skew_ms: Arc<AtomicI64>,
}

impl NodeSpec {
    fn new(plan: &Plan, world: &World, id: NodeId) -> NodeSpec {
        let total = plan.nodes + plan.spares;
        // The first `nodes` start the cluster together; a spare starts empty and waits to be added.
        let join = id > plan.nodes;
        let members: BTreeMap<NodeId, String> =
            (1..=if join { total } else { plan.nodes }).map(|id| (id, format!("{}:7071", host(id)))).collect();
        NodeSpec {
            id,
            members,
            join,
            seed: plan.seed,
            snapshot_every_entries: plan.snapshot_every_entries,
            bugs: plan.bugs,
            max_clock_skew: plan.max_clock_skew,
            skew_ms: world.skews[&id].clone(),
        }
    }

    /// The node's configuration at its `start`th start (from 0).
    fn config(&self, start: u64) -> Config {
        Config {
            id: self.id,
            members: self.members.clone(),
            data_dir: "/simulated".into(),
            limits: FrontLimits {
                ttl_ms_min: 100,
                ttl_ms_max: 24 * 3_600_000,
                wait_ms_max: 300_000,
                lock_delay_ms_max: 60_000,
                overload_delay: holdfast_server::load::OVERLOAD_DELAY_DEFAULT,
                // The simulated nodes share one thread, whose busy time says nothing of a node's: never.
                overload_busy: 1.0,
            },
            heartbeat_ms: 100,
            election_timeout_ms: 250,
            snapshot_every_entries: self.snapshot_every_entries,
            queue_hold: holdfast_server::QUEUE_HOLD,
            join: self.join,
            admin_key: Some(holdfast_server::Secret(crate::http::ADMIN_KEY.into())),
            tls: None,
            auth: Default::default(),
            cache_bytes: 0,
            disk_reserve: 0,
            disk_stall: None,
            clock: {
                let skew_ms = self.skew_ms.clone();
                WallClock::from_fn(move || {
                    let ms = turmoil::since_epoch().unwrap_or_default().as_millis() as i64;
                    (ms + skew_ms.load(Ordering::Relaxed)) as u64
                })
            },
            // Tokens and session ids differ between the starts of a node, as they would.
            rng_seed: Some(self.seed ^ (self.id << 48) ^ (start << 40)),
            bugs: self.bugs,
            max_clock_skew: self.max_clock_skew,
        }
    }
}

/// Adds node `id`'s host to the simulation; each (re)start serves from the node's disk.
fn start_node(sim: &mut turmoil::Sim<'_>, plan: &Plan, world: &World, id: NodeId) {
    let spec = NodeSpec::new(plan, world, id);
    let (disk, registry) = (world.disks[&id].clone(), world.registry.clone());
    let starts = Arc::new(AtomicU64::new(0));
    sim.host(host(id), move || {
        let start = starts.fetch_add(1, Ordering::Relaxed);
        serve_node(spec.config(start), disk.clone(), registry.clone())
    });
}

/// A node's disk: what survives its crashes.
#[derive(Clone)]
enum Disk {
    Memory(MemDisk),
    /// The disk store's files, under [`FILES_DIR`], and how long its log task's syncs take ([`Plan::flush`]).
    Files(Arc<CrashFs>, Duration),
}

/// Where a node on [`Store::Files`] keeps its files.
const FILES_DIR: &str = "/data";

impl Disk {
    /// Node `id`'s disk for `plan`: broken ones acknowledge what they did not make durable (a file system's
    /// syncs that do nothing).
    fn new(plan: &Plan, id: NodeId) -> Disk {
        match (plan.store, plan.broken_disks) {
            (Store::Memory, false) => Disk::Memory(MemDisk::new()),
            (Store::Memory, true) => Disk::Memory(MemDisk::acking_before_flush()),
            (Store::Files, lying) => {
                let flush = plan.flush.get(&id).copied().unwrap_or_default();
                Disk::Files(Arc::new(CrashFs::new(plan.seed.wrapping_mul(31).wrapping_add(id), lying)), flush)
            }
        }
    }

    /// A power cut: what was not made durable is lost.
    fn crash(&self) {
        match self {
            Disk::Memory(disk) => disk.crash(),
            Disk::Files(fs, _) => fs.crash(),
        }
    }

    fn slow_snapshot_installs(&self, time: Duration) {
        if let Disk::Memory(disk) = self {
            disk.slow_snapshot_installs(time);
        }
    }
}

/// One start of a node: the server crate on `disk`, on turmoil's network, registered once it runs.
async fn serve_node(config: Config, disk: Disk, registry: Registry) -> turmoil::Result {
    let id = config.id;
    let client = turmoil::net::TcpListener::bind("0.0.0.0:7070").await?;
    let peer = turmoil::net::TcpListener::bind("0.0.0.0:7071").await?;
    let (started, node) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        if let Ok(node) = node.await {
            registry.set(id, node);
        }
    });
    let transport = Transport {
        client: crate::net::ClientListener(client),
        peer: crate::net::peer_incoming(peer),
        health: None,
        tls: None,
        dialer: Some(crate::net::dialer()),
        started: Some(started),
    };
    match disk {
        Disk::Memory(disk) => {
            let storage = move |observer| {
                let (log, machine) = open_memory(&disk, observer);
                let log = log.acknowledge_own_appends(id);
                let (state, committed_index, durable) = (machine.state(), log.committed_index(), log.durable());
                Ok(Storage::unwatched(log, machine, state, committed_index, durable))
            };
            holdfast_server::serve(config, storage, transport, std::future::pending()).await?;
        }
        Disk::Files(fs, flush) => {
            let storage = move |observer| {
                let dir = std::path::Path::new(FILES_DIR);
                let (log, machine) = open_on_crash_fs_flushing(fs.clone(), dir, observer, flush)?;
                let log = log.acknowledge_own_appends(id);
                let (state, committed_index, durable) = (machine.state(), log.committed_index(), log.durable());
                Ok(Storage::unwatched(log, machine, state, committed_index, durable))
            };
            holdfast_server::serve(config, storage, transport, std::future::pending()).await?;
        }
    }
    Ok(())
}

/// Adds the plan's clients (hosts `c1`..), its roles first, then its scripts; answers how many.
fn start_clients(sim: &mut turmoil::Sim<'_>, plan: &Plan, recorder: &Recorder) -> u32 {
    let resource = Resource::new(recorder.clone());
    let nodes: Vec<String> = (1..=plan.nodes).map(|id| format!("{}:7070", host(id))).collect();
    let ctx = |client: u32| Ctx {
        client,
        nodes: nodes.clone(),
        recorder: recorder.clone(),
        resource: resource.clone(),
        stop_at: plan.stop_at,
        seed: plan.seed.wrapping_mul(1_000_003).wrapping_add(client as u64),
    };
    let mut client = 0;
    for role in &plan.roles {
        client += 1;
        let ctx = ctx(client);
        match role {
            Role::Model => sim.client(format!("c{client}"), workload::model_client(ctx)),
            Role::FencedHttp => sim.client(format!("c{client}"), workload::fenced_http_client(ctx)),
            Role::Session => sim.client(format!("c{client}"), workload::session_client(ctx)),
            Role::Keeper => sim.client(format!("c{client}"), workload::keeper_client(ctx)),
            Role::Reader => sim.client(format!("c{client}"), workload::reader_client(ctx)),
            Role::Watcher => sim.client(format!("c{client}"), workload::watcher_client(ctx)),
            Role::Elector => sim.client(format!("c{client}"), workload::elector_client(ctx)),
            Role::Delayed => sim.client(format!("c{client}"), workload::delayed_client(ctx)),
            Role::Semaphore => sim.client(format!("c{client}"), workload::semaphore_client(ctx)),
            Role::SemaphoreSession => sim.client(format!("c{client}"), workload::semaphore_session_client(ctx)),
            Role::Admin { spare, victim } => {
                // Changes begin well before the heal; faults may hold the last of them up past it, and
                // liveness is then judged from after it (see `judge`).
                let changes_by = plan.healed_at.saturating_sub(Duration::from_secs(3));
                sim.client(format!("c{client}"), workload::admin_client(ctx, *spare, *victim, changes_by))
            }
        }
    }
    for script in &plan.scripts {
        client += 1;
        sim.client(format!("c{client}"), script(ctx(client)));
    }
    client
}

/// Steps the simulation until the clients are done, applying each fault when it is due, and a `Heal` once
/// the plan says the faults are over (if the schedule did not end with one).
fn run_schedule(
    sim: &mut turmoil::Sim<'_>,
    plan: &Plan,
    world: &mut World,
    trace: &mut Vec<String>,
    violations: &mut Vec<Violation>,
) {
    let mut faults = plan.faults.iter().peekable();
    let mut disrupted = false;
    loop {
        let now = sim.elapsed();
        while let Some((at, fault)) = faults.next_if(|(at, _)| *at <= now) {
            let applied = apply(sim, plan, world, fault);
            disrupted |= *fault != Fault::Heal;
            trace.push(format!("{:>8.3}s {fault:?}{applied}", at.as_secs_f64()));
        }
        if disrupted && now >= plan.healed_at && faults.peek().is_none() {
            apply(sim, plan, world, &Fault::Heal);
            disrupted = false;
        }
        match sim.step() {
            // Scenario clients may finish early; faults still due (a crash after the last write) run on.
            Ok(true) if sim.elapsed() >= plan.stop_at => break,
            Ok(_) => {}
            Err(e) => {
                violations.push(Violation { checker: "run", detail: format!("a host failed: {e}") });
                break;
            }
        }
    }
}

/// Every checker's verdict on a run's history.
fn judge(plan: &Plan, history: &History) -> Vec<Violation> {
    let model = |lock: &str| MODEL_LOCKS.contains(&lock) || lock.starts_with(KEPT_PREFIX);
    // Liveness is judged on a settled cluster: after the heal and after the last membership change (which
    // may remove the leader, or have a removed node campaign once), each with time for an election.
    let settled = plan.healed_at.max(history.last_membership_change.unwrap_or_default()) + SETTLE;
    check::all(history, settled, plan.liveness_bound, &model)
}

/// The node that leads now, by the running nodes' own views (the newest term wins).
fn leader(sim: &mut turmoil::Sim<'_>, plan: &Plan, registry: &Registry) -> Option<NodeId> {
    (1..=plan.nodes + plan.spares)
        .filter(|id| sim.is_host_running(host(*id)))
        .filter_map(|id| registry.get(id).map(|node| (id, node)))
        .filter_map(|(id, node)| {
            let metrics = node.raft.metrics().borrow().clone();
            (metrics.state == ServerState::Leader).then_some((metrics.current_term, id))
        })
        .max()
        .map(|(_, id)| id)
}

/// What the driver holds of a run besides turmoil's simulation.
struct World {
    registry: Registry,
    /// Each node's disk: what survives its crashes.
    disks: BTreeMap<NodeId, Disk>,
    /// How far each node's wall clock is off the simulation's, in milliseconds.
    skews: BTreeMap<NodeId, Arc<AtomicI64>>,
    /// The most any node's wall clock has been ahead of the simulation's: how far ahead of every clock a
    /// leader may have stamped the log's time (which stays there).
    skew_max_ms: i64,
    /// Crashed nodes, restarted at the next heal.
    down: Vec<NodeId>,
    /// How many clients run (hosts `c1`..).
    clients: u32,
}

impl World {
    /// Every node's disk (broken ones if the plan says so) and clock skew; no clients yet.
    fn new(plan: &Plan) -> World {
        let total = plan.nodes + plan.spares;
        let disks: BTreeMap<NodeId, Disk> = (1..=total).map(|id| (id, Disk::new(plan, id))).collect();
        // A node's wall clock runs off the simulation's by up to 40 ms either way, and jumps on a
        // `ClockJump`: the leader's stamps must not depend on clocks agreeing.
        let skews: BTreeMap<NodeId, Arc<AtomicI64>> = (1..=total)
            .map(|id| {
                (id, Arc::new(AtomicI64::new((plan.seed.wrapping_mul(31).wrapping_add(id * 17) % 81) as i64 - 40)))
            })
            .collect();
        let skew_max_ms = skews.values().map(|skew| skew.load(Ordering::Relaxed)).max().unwrap_or_default();
        World { registry: Registry::default(), disks, skews, skew_max_ms, down: Vec::new(), clients: 0 }
    }

    /// Crashes node `id` if it runs: its disk keeps only what it made durable.
    fn crash(&mut self, sim: &mut turmoil::Sim<'_>, id: NodeId) {
        if sim.is_host_running(host(id)) {
            sim.crash(host(id));
            self.disks[&id].crash();
            self.down.push(id);
        }
    }

    /// Starts node `id` again from its disk if it is down.
    fn restart(&mut self, sim: &mut turmoil::Sim<'_>, id: NodeId) {
        if !sim.is_host_running(host(id)) {
            sim.bounce(host(id));
            self.down.retain(|d| *d != id);
        }
    }

    /// Starts every crashed node again from its disk.
    fn restart_crashed(&mut self, sim: &mut turmoil::Sim<'_>) {
        for id in std::mem::take(&mut self.down) {
            sim.bounce(host(id));
        }
    }

    /// Moves node `node`'s wall clock by `by_ms`.
    fn jump_clock(&mut self, node: NodeId, by_ms: i64) {
        let skew = self.skews[&node].fetch_add(by_ms, Ordering::Relaxed) + by_ms;
        self.skew_max_ms = self.skew_max_ms.max(skew);
    }

    /// Repairs every link, delivers everything held, stops the latency and losses, restarts crashed nodes.
    fn heal(&mut self, sim: &mut turmoil::Sim<'_>, total: u64) {
        let all: Vec<NodeId> = (1..=total).collect();
        for x in &all {
            for y in &all {
                if x != y {
                    sim.repair(host(*x), host(*y));
                    sim.release(host(*x), host(*y));
                }
            }
            for client in 1..=self.clients {
                sim.release(format!("c{client}"), host(*x));
            }
        }
        sim.set_max_message_latency(Duration::from_millis(5));
        sim.set_fail_rate(0.0);
        self.restart_crashed(sim);
    }
}

/// Applies `fault`; answers a note on what it hit (e.g. which node led).
fn apply(sim: &mut turmoil::Sim<'_>, plan: &Plan, world: &mut World, fault: &Fault) -> String {
    let total = plan.nodes + plan.spares;
    match fault {
        Fault::Partition(a, b) => cut(sim, a, b),
        Fault::OneWay { from, to } => cut_one_way(sim, from, to),
        Fault::IsolateLeader => return on_leader(sim, plan, world, |sim, _, id| isolate(sim, id, total)),
        Fault::Crash(id) => world.crash(sim, *id),
        Fault::CrashLeader => return on_leader(sim, plan, world, |sim, world, id| world.crash(sim, id)),
        Fault::CrashFollower(n) => {
            return on_follower(sim, plan, world, *n, |sim, world, _, follower| world.crash(sim, follower))
        }
        Fault::CrashAll => {
            for id in 1..=total {
                world.crash(sim, id);
            }
        }
        Fault::Restart(id) => world.restart(sim, *id),
        Fault::RestartCrashed => world.restart_crashed(sim),
        Fault::Hold(a, b) => hold(sim, a, b),
        Fault::HoldFollower => {
            return on_follower(sim, plan, world, 0, |sim, _, _, follower| {
                for other in (1..=total).filter(|n| *n != follower) {
                    sim.hold(host(follower), host(other));
                }
            })
        }
        Fault::Release => release_all(sim, total),
        Fault::IsolateFollower(n) => {
            return on_follower(sim, plan, world, *n, |sim, _, _, follower| isolate(sim, follower, total))
        }
        Fault::CutFollower(n) => {
            return on_follower(sim, plan, world, *n, |sim, _, leader, follower| cut(sim, &[follower], &[leader]))
        }
        Fault::SlowSnapshotInstalls(time) => {
            for disk in world.disks.values() {
                disk.slow_snapshot_installs(*time);
            }
        }
        Fault::Latency(max) => sim.set_max_message_latency(*max),
        Fault::Lossy(rate) => sim.set_fail_rate(*rate),
        Fault::ClockJump { node, by_ms } => world.jump_clock(*node, *by_ms),
        Fault::StallClient(client) => {
            for id in 1..=total {
                sim.hold(format!("c{client}"), host(id));
            }
        }
        Fault::Heal => world.heal(sim, total),
    }
    String::new()
}

/// Does `what` to the node that leads now; answers the trace's note on which it was.
fn on_leader(
    sim: &mut turmoil::Sim<'_>,
    plan: &Plan,
    world: &mut World,
    what: impl FnOnce(&mut turmoil::Sim<'_>, &mut World, NodeId),
) -> String {
    let Some(id) = leader(sim, plan, &world.registry) else { return " (no leader)".into() };
    what(sim, world, id);
    format!(" (n{id})")
}

/// Does `what` to the node that leads now and its `n`th follower (see [`follower_of_leader`]); answers the
/// trace's note on which they were.
fn on_follower(
    sim: &mut turmoil::Sim<'_>,
    plan: &Plan,
    world: &mut World,
    n: usize,
    what: impl FnOnce(&mut turmoil::Sim<'_>, &mut World, NodeId, NodeId),
) -> String {
    let (leader, follower) = match follower_of_leader(sim, plan, &world.registry, n) {
        Ok(found) => found,
        Err(note) => return note,
    };
    what(sim, world, leader, follower);
    format!(" (n{follower}, led by n{leader})")
}

/// Cuts every link between a node of `a` and a node of `b`, both ways.
fn cut(sim: &mut turmoil::Sim<'_>, a: &[NodeId], b: &[NodeId]) {
    for x in a {
        for y in b {
            sim.partition(host(*x), host(*y));
        }
    }
}

/// Loses every message from a node of `from` to a node of `to`.
fn cut_one_way(sim: &mut turmoil::Sim<'_>, from: &[NodeId], to: &[NodeId]) {
    for x in from {
        for y in to {
            sim.partition_oneway(host(*x), host(*y));
        }
    }
}

/// Cuts node `id` off from every other node, both ways.
fn isolate(sim: &mut turmoil::Sim<'_>, id: NodeId, total: u64) {
    let others: Vec<NodeId> = (1..=total).filter(|n| *n != id).collect();
    cut(sim, &[id], &others);
}

/// Holds every message between a node of `a` and a node of `b`.
fn hold(sim: &mut turmoil::Sim<'_>, a: &[NodeId], b: &[NodeId]) {
    for x in a {
        for y in b {
            sim.hold(host(*x), host(*y));
        }
    }
}

/// The end of a run: a failover in a cluster nobody else talks to (see [`Plan::quiet_failover`]). The
/// probe takes its locks through a member that does not lead, the driver crashes the leader once it holds
/// them, and waits for the probe's verdict; then the crashed node restarts and the cluster must converge
/// again. Clusters left with fewer than three members (an admin's changes cut short) are skipped: a
/// failover there has no majority to go to.
fn quiet_failover(
    sim: &mut turmoil::Sim<'_>,
    plan: &Plan,
    world: &mut World,
    members: &[NodeId],
    trace: &mut Vec<String>,
    violations: &mut Vec<Violation>,
) {
    const CHECKER: &str = "quiet_failover";
    let started = sim.elapsed();
    let mut note = |sim: &turmoil::Sim<'_>, what: String| {
        trace.push(format!("{:>8.3}s quiet failover: {what}", sim.elapsed().as_secs_f64()));
    };
    let Some(old) = leader(sim, plan, &world.registry) else {
        return violations.push(Violation::new(CHECKER, "no leader after the cluster converged".into()));
    };
    let Some(through) = members.iter().copied().find(|id| *id != old).filter(|_| members.len() >= 3) else {
        return note(sim, format!("skipped: members {members:?}"));
    };
    // How far behind the log's time the slowest clock may be: a TTL runs out by both.
    let skew_min_ms = world.skews.values().map(|skew| skew.load(Ordering::Relaxed)).min().unwrap_or_default();
    let clock_slack = Duration::from_millis((world.skew_max_ms - skew_min_ms).max(0) as u64);
    let probe = Arc::new(Mutex::new(workload::Probe::default()));
    world.clients += 1;
    let recorder = Recorder::default();
    let ctx = Ctx {
        client: world.clients,
        nodes: vec![format!("{}:7070", host(through))],
        resource: Resource::new(recorder.clone()),
        recorder,
        stop_at: started + PROBE_MAX,
        seed: plan.seed.wrapping_mul(1_000_003).wrapping_add(u64::from(world.clients)),
    };
    sim.client(format!("c{}", world.clients), workload::quiet_probe(ctx, clock_slack, probe.clone()));
    note(sim, format!("a probe through n{through}, leader n{old}, clock slack {clock_slack:?}"));
    let mut crashed = false;
    loop {
        if !crashed && probe.lock().expect("probe poisoned").ready {
            let applied = apply(sim, plan, world, &Fault::CrashLeader);
            note(sim, format!("CrashLeader{applied}"));
            probe.lock().expect("probe poisoned").crashed_at = Some(sim.elapsed());
            crashed = true;
        }
        match sim.step() {
            Ok(true) => break,
            Ok(false) if sim.elapsed() < started + PROBE_MAX => {}
            Ok(false) => {
                violations.push(Violation::new(CHECKER, format!("the probe did not finish within {PROBE_MAX:?}")));
                break;
            }
            Err(e) => return violations.push(Violation::new("run", format!("a host failed: {e}"))),
        }
    }
    let problems = std::mem::take(&mut probe.lock().expect("probe poisoned").problems);
    violations.extend(problems.into_iter().map(|problem| Violation::new(CHECKER, problem)));
    apply(sim, plan, world, &Fault::Heal);
    note(sim, "Heal".into());
    // Every replica, the restarted one included, must agree again; the final state was taken before.
    converge(sim, plan, &world.registry, violations);
}

/// The node that leads now and its `n`th follower (from 0, lowest-numbered first) among the plan's first
/// members; else the trace's note on why there is none.
fn follower_of_leader(
    sim: &mut turmoil::Sim<'_>,
    plan: &Plan,
    registry: &Registry,
    n: usize,
) -> Result<(NodeId, NodeId), String> {
    let leader = leader(sim, plan, registry).ok_or(" (no leader)")?;
    let follower = (1..=plan.nodes).filter(|id| *id != leader).nth(n).ok_or(" (no such follower)")?;
    Ok((leader, follower))
}

/// Delivers every message held between nodes, and stops holding them.
fn release_all(sim: &mut turmoil::Sim<'_>, total: u64) {
    for x in 1..=total {
        for y in (1..=total).filter(|y| *y != x) {
            sim.release(host(x), host(y));
        }
    }
}

/// Runs the healed cluster until a leader has applied everything it committed and every node caught up
/// with it; checks that all replicas hold the same state, and answers the locks held then and the members.
fn converge(
    sim: &mut turmoil::Sim<'_>,
    plan: &Plan,
    registry: &Registry,
    violations: &mut Vec<Violation>,
) -> Option<(Final, Vec<NodeId>)> {
    let deadline = sim.elapsed() + CONVERGE_MAX;
    while sim.elapsed() < deadline {
        for _ in 0..100 {
            if let Err(e) = sim.step() {
                violations.push(Violation { checker: "run", detail: format!("a host failed: {e}") });
                return None;
            }
        }
        let Some(id) = leader(sim, plan, registry) else { continue };
        let leader = registry.get(id).expect("a leader is registered");
        // Raft's applied index counts every entry (membership and blank ones too), the lock state's only
        // lock commands.
        let applied = |node: &Node| node.raft.metrics().borrow().last_applied.map_or(0, |log_id| log_id.index);
        let target = applied(&leader);
        let committed = leader.committed_index.load(Ordering::Relaxed);
        if target < committed {
            continue;
        }
        // The members as the leader knows them: a node removed for good no longer follows the log.
        let members: Vec<NodeId> =
            leader.raft.metrics().borrow().membership_config.membership().nodes().map(|(id, _)| *id).collect();
        let nodes: Vec<Arc<Node>> = members.iter().filter_map(|n| registry.get(*n)).collect();
        if nodes.len() != members.len() || nodes.iter().any(|node| applied(node) != target) {
            continue;
        }
        // Every replica applied the same log up to the same index: their states must be the same, and each
        // must hold the state machine's invariants (a broken one panics, failing the run).
        for node in &nodes {
            node.state.read().expect("lock state poisoned").check_invariants();
        }
        let snapshot = |node: &Node| node.state.read().expect("lock state poisoned").snapshot();
        let reference = snapshot(&leader);
        for node in &nodes {
            if snapshot(node) != reference {
                violations.push(Violation {
                    checker: "replicas",
                    detail: format!("n{} and n{id} applied up to {target} but hold different states", node.id),
                });
            }
        }
        let state = leader.state.read().expect("lock state poisoned");
        let holders = state
            .list("", None, usize::MAX)
            .into_iter()
            .map(|view| (view.name, view.holders.iter().map(|holder| holder.fence).collect()))
            .collect();
        let at = sim.elapsed();
        return Some((Final { at, holders }, members));
    }
    violations.push(Violation {
        checker: "liveness",
        detail: format!("the healed cluster did not converge within {CONVERGE_MAX:?}"),
    });
    None
}
