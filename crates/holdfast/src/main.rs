//! `holdfast`: the one binary. `holdfast server` runs a node; `holdfast run` runs a command under a lock;
//! `holdfast lock …` and `holdfast cluster status` are one-shot calls. See docs/cli.md.

mod bench;
mod cli;
mod run;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand, ValueEnum};
use holdfast_client::AcquireOptions;
use holdfast_server::limits;
use holdfast_server::FrontLimits;

#[derive(Parser)]
#[command(name = "holdfast", version, about = "A replicated lock service: locks with fences, decided by Raft.")]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// Run a node. With no flags: a working single-node cluster on 127.0.0.1:7070, data in ./holdfast-data.
    Server(Box<ServerArgs>),
    /// Run a command while holding a lock (flock for a cluster). Exit codes: see docs/cli.md.
    Run(RunCli),
    /// Leader election: run a command while this process leads (--value publishes its address), or print
    /// each leader (--observe).
    Elect(ElectCli),
    /// One-shot lock calls.
    Lock {
        #[command(flatten)]
        target: Target,
        #[command(subcommand)]
        command: LockCli,
    },
    /// Load against a running cluster: progress while it runs, a table (or JSON) at the end.
    Bench {
        #[command(flatten)]
        target: Target,
        #[command(subcommand)]
        workload: BenchCli,
    },
    /// The cluster as a node sees it.
    Cluster {
        #[command(flatten)]
        target: Target,
        #[command(subcommand)]
        command: ClusterCli,
    },
    /// Exit 0 if a node's health URL answers 200, 1 otherwise: a probe for images without curl.
    Healthcheck {
        /// The URL to GET (plain HTTP).
        #[arg(long, env = "HOLDFAST_HEALTHCHECK_URL", default_value = "http://127.0.0.1:7070/livez")]
        url: String,
        /// How long to wait for the answer.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
}

/// Which cluster to talk to, and how to print.
#[derive(clap::Args)]
struct Target {
    /// Any nodes of the cluster, comma-separated (HOST:PORT of their client port).
    #[arg(long, env = "HOLDFAST_ENDPOINTS", default_value = "127.0.0.1:7070", value_delimiter = ',', global = true)]
    endpoints: Vec<String>,
    /// Print JSON for scripts instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    tls: TlsArgs,
}

/// TLS to a cluster whose client port uses it.
#[derive(clap::Args)]
struct TlsArgs {
    /// The CA (PEM) that signed the nodes' certificates: talk TLS to the cluster.
    #[arg(long, env = "HOLDFAST_CA", global = true)]
    ca: Option<PathBuf>,
    /// This client's certificate (PEM), for a cluster that requires one (--tls-client-auth). Needs --key.
    #[arg(long, env = "HOLDFAST_CERT", global = true, requires = "key")]
    cert: Option<PathBuf>,
    /// The private key of --cert (PEM).
    #[arg(long, env = "HOLDFAST_KEY", global = true, requires = "cert")]
    key: Option<PathBuf>,
    /// The API key (from POST /v1/signup) for a cluster with --auth.
    #[arg(long, env = "HOLDFAST_API_KEY", global = true, hide_env_values = true)]
    api_key: Option<String>,
}

impl TlsArgs {
    /// A client for `endpoints` with these TLS settings, connected (the leader found).
    async fn connect(&self, endpoints: Vec<String>) -> Result<holdfast_client::Client, holdfast_client::Error> {
        self.builder(endpoints)?.connect().await
    }

    /// A client builder for `endpoints` with these TLS settings.
    fn builder(&self, endpoints: Vec<String>) -> Result<holdfast_client::ClientBuilder, holdfast_client::Error> {
        let read = |path: &PathBuf| {
            std::fs::read(path)
                .map_err(|e| holdfast_client::Error::InvalidArgument(format!("reading {}: {e}", path.display())))
        };
        let mut builder = holdfast_client::Client::builder(endpoints);
        if let Some(ca) = &self.ca {
            let identity = match (&self.cert, &self.key) {
                (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
                _ => None,
            };
            builder = builder.tls(read(ca)?, identity);
        }
        if let Some(key) = &self.api_key {
            builder = builder.api_key(key);
        }
        Ok(builder)
    }
}

#[derive(clap::Args)]
struct RunCli {
    /// The lock to hold.
    name: String,
    /// The session's lease: the lock is lost if the cluster hears nothing for this long.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Do not wait: exit with the busy code at once if the lock is held.
    #[arg(short = 'n', long = "no-wait", conflicts_with = "wait")]
    no_wait: bool,
    /// Wait at most this long for the lock (default: as long as it takes).
    #[arg(short = 'w', long, value_parser = humantime::parse_duration)]
    wait: Option<Duration>,
    /// The exit code when the lock is busy (as flock's -E).
    #[arg(short = 'E', long = "conflict-exit-code", default_value_t = run::EXIT_BUSY)]
    conflict_exit_code: u8,
    /// At most this many run the command at once: the lock is a semaphore of this many places (every
    /// process running under the name gives the same).
    #[arg(long, default_value_t = 1)]
    limit: u32,
    #[command(flatten)]
    hold: HoldCli,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// What `holdfast run` and `holdfast elect` share: how the lock is held, and the cluster.
#[derive(clap::Args)]
struct HoldCli {
    /// If the session's lease runs out while this process holds the lock or leads (its host died or was
    /// cut off), nobody else gets the lock for this long after (default: no delay; at most the server's
    /// --lock-delay-max).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    lock_delay: Duration,
    /// After the lock (or the leadership) is lost: how long the command has between SIGTERM and SIGKILL.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    kill_after: Duration,
    /// Any nodes of the cluster, comma-separated (HOST:PORT of their client port).
    #[arg(long, env = "HOLDFAST_ENDPOINTS", default_value = "127.0.0.1:7070", value_delimiter = ',')]
    endpoints: Vec<String>,
    #[command(flatten)]
    tls: TlsArgs,
}

impl HoldCli {
    /// The client to hold the lock with; exits with the usage code if the TLS or key settings are wrong.
    fn client(&self) -> holdfast_client::ClientBuilder {
        match self.tls.builder(self.endpoints.clone()) {
            Ok(client) => client,
            Err(e) => {
                eprintln!("holdfast: {e}");
                exit(run::EXIT_USAGE)
            }
        }
    }

    /// What `holdfast run` is given to hold `name` with a session lease of `ttl`, publishing `value`.
    fn run_args(&self, name: String, ttl: Duration, wait: run::Wait, value: Vec<u8>) -> run::RunArgs {
        run::RunArgs {
            client: self.client(),
            name,
            ttl,
            wait,
            options: AcquireOptions { value, lock_delay: self.lock_delay, limit: 1 },
            busy_code: run::EXIT_BUSY,
            kill_after: self.kill_after,
            command: Vec::new(),
        }
    }
}

#[derive(clap::Args)]
struct ElectCli {
    /// The election (a lock name).
    name: String,
    /// What this candidate publishes while it leads (its address, say).
    #[arg(long, default_value = "", conflicts_with = "observe")]
    value: String,
    /// Do not campaign: print the leader now and each new one (fence, owner, value; "none" when nobody
    /// leads), one line each, until interrupted.
    #[arg(long)]
    observe: bool,
    /// Print JSON lines instead of text (with --observe).
    #[arg(long, requires = "observe")]
    json: bool,
    /// The session's lease: leadership is lost if the cluster hears nothing for this long.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    #[command(flatten)]
    hold: HoldCli,
    /// The command and its arguments, run while this process leads.
    #[arg(last = true, required_unless_present = "observe")]
    command: Vec<String>,
}

#[derive(Subcommand)]
enum LockCli {
    /// Take a lock with a TTL; prints its token and fence.
    Acquire {
        name: String,
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// Wait in the queue up to this long if it is held.
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        wait: Duration,
        /// What the hold publishes (at most 1 KiB).
        #[arg(long, default_value = "")]
        value: String,
        /// If the hold expires (not renewed in time), nobody gets the lock for this long after.
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        lock_delay: Duration,
        /// A semaphore: up to this many holders at once (every acquirer of the name gives the same).
        #[arg(long, default_value_t = 1)]
        limit: u32,
    },
    /// Publish a new value on a lock held with --token.
    SetValue {
        name: String,
        #[arg(long)]
        token: String,
        value: String,
    },
    /// Print the lock's state now and after each change, one line each, until interrupted; with --prefix,
    /// every lock whose name starts with NAME.
    Watch {
        name: String,
        /// Watch every lock whose name starts with NAME (the locks held now first).
        #[arg(long)]
        prefix: bool,
        /// Resume after this revision (as a line printed before showed it).
        #[arg(long, default_value_t = 0)]
        after: u64,
    },
    /// Let go of a lock.
    Release {
        name: String,
        #[arg(long)]
        token: String,
    },
    /// Extend a lock's TTL (by its current TTL unless --ttl is given).
    Renew {
        name: String,
        #[arg(long)]
        token: String,
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Option<Duration>,
    },
    /// Who holds a lock and who waits for it.
    Get { name: String },
    /// Locks by name prefix.
    List {
        #[arg(long, default_value = "")]
        prefix: String,
        #[arg(long)]
        after: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
}

#[derive(Subcommand)]
enum BenchCli {
    /// Each client acquires and releases its own lock, in a loop: cycles/s and latency.
    Uncontended {
        #[arg(long, default_value_t = 64)]
        clients: usize,
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        duration: Duration,
        /// Through the HTTP API (keep-alive HTTP/1.1, client i on endpoint i mod n) instead of gRPC.
        #[arg(long)]
        http: bool,
    },
    /// Every client's session wants one lock and lets go as soon as it holds it: hand-overs/s and latency.
    Contended {
        #[arg(long, default_value_t = 8)]
        clients: usize,
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        duration: Duration,
        /// Through the HTTP API, each client waiting in the lock's queue with `wait=` (client i on endpoint
        /// i mod n) instead of gRPC sessions.
        #[arg(long)]
        http: bool,
    },
    /// Every client asks about one lock held by another, in a loop: answers/s and latency. Each answer is
    /// confirmed by the leader with a quorum.
    Reads {
        #[arg(long, default_value_t = 64)]
        clients: usize,
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        duration: Duration,
        /// Ask with one-shot acquires that find the lock held (busy), as a fleet woken together does,
        /// instead of `get`.
        #[arg(long)]
        busy: bool,
    },
    /// A prober acquires and releases while a command kills the leader: the longest gap, the time to the
    /// first grant after the kill, and whether locks held before the kill are still held.
    Failover(bench::FailoverArgs),
    /// Many sessions, each holding its own lock and heartbeating every lease/4: locks lost, session
    /// expirations, CPU per node.
    Sessions(bench::SessionsArgs),
    /// Fill the cluster with held locks (one-shot acquires, long TTL, many at once): the fill rate, and
    /// memory per node given their pids.
    Scale(bench::ScaleArgs),
    /// A writer changes one lock's value while watchers spread over the nodes watch it: changes/s, states
    /// told/s, and the time from a change's send to a watcher being told.
    Watch(bench::WatchArgs),
    /// Candidates spread over the nodes take turns leading one election (each resigns after --hold, or with
    /// --kill-leaders is killed): the gap from a resignation (or a kill) to the next leader, and that fences
    /// only grow.
    Elect(bench::ElectArgs),
    /// The machine alone, no cluster: a thread wake-up round trip and small synced appends (fdatasync),
    /// the two costs a write's latency is made of, so that runs on different hosts can be compared.
    Host(bench::HostArgs),
}

#[derive(Subcommand)]
enum ClusterCli {
    /// The leader, term, members and log of the node that answers.
    Status,
    /// Add a node started with `--join`: it catches up as a learner, then votes. Admin.
    Add {
        /// The new node's id (unused in the cluster so far; a replacement takes a new id).
        id: u64,
        /// HOST:PORT of its peer port, as the other nodes reach it.
        peer_addr: String,
        #[command(flatten)]
        admin: AdminKey,
    },
    /// Remove a node from the cluster. Admin.
    Remove {
        id: u64,
        #[command(flatten)]
        admin: AdminKey,
    },
    /// Have a node snapshot its lock state now (the first of --endpoints that answers: name one). Admin.
    Snapshot {
        #[command(flatten)]
        admin: AdminKey,
    },
}

#[derive(clap::Args)]
struct AdminKey {
    /// The server's admin key, if it has one.
    #[arg(long, env = "HOLDFAST_ADMIN_KEY", hide_env_values = true)]
    admin_key: Option<String>,
}

#[derive(Parser)]
struct ServerArgs {
    /// This node's id: a positive number, unique in the cluster; or `hostname`, which takes the number N
    /// that ends the host name (`holdfast-2`, a StatefulSet pod) and uses N+1.
    #[arg(long, env = "HOLDFAST_ID", default_value = "1")]
    id: String,
    /// Every member as ID=HOST:PEER_PORT, comma-separated: the peer addresses the nodes reach each other
    /// at, the same list on every node. Default: this node alone, at --peer-addr.
    #[arg(long, env = "HOLDFAST_MEMBERS")]
    members: Option<String>,
    /// Join a running cluster instead of starting one: the node waits until a member adds it
    /// (`holdfast cluster add ID HOST:PEER_PORT`). For growing a cluster and for replacing a node whose disk
    /// was lost, under a new id. --members is then not needed.
    #[arg(long, env = "HOLDFAST_JOIN")]
    join: bool,
    /// The key admin calls (membership, snapshots, API keys) must present as `Authorization: Bearer KEY`.
    /// Without one, admin calls are accepted from loopback only (docs/security.md).
    #[arg(long, env = "HOLDFAST_ADMIN_KEY", hide_env_values = true, conflicts_with = "admin_key_file")]
    admin_key: Option<String>,
    /// Read the admin key from this file (its first line).
    #[arg(long, env = "HOLDFAST_ADMIN_KEY_FILE")]
    admin_key_file: Option<PathBuf>,
    /// Require an API key (`Authorization: Bearer KEY`) on every lock call; each key is its own namespace.
    #[arg(long, env = "HOLDFAST_AUTH")]
    auth: bool,
    /// With --auth: anyone may make a key with POST /v1/signup (otherwise only the admin).
    #[arg(long, env = "HOLDFAST_OPEN_SIGNUP", requires = "auth")]
    open_signup: bool,
    /// With --auth: locks (held or waited for) one key may have at once.
    #[arg(long, env = "HOLDFAST_KEY_LOCKS_MAX", default_value_t = 10_000)]
    key_locks_max: usize,
    /// With --auth: sessions one key may have open at once.
    #[arg(long, env = "HOLDFAST_KEY_SESSIONS_MAX", default_value_t = 1_000)]
    key_sessions_max: usize,
    /// With --auth: requests per second one key may make on one node (429 beyond).
    #[arg(long, env = "HOLDFAST_KEY_RATE", default_value_t = 1_000)]
    key_rate: u32,
    /// This node's certificate (PEM): turns on TLS on the client port and mutual TLS between peers.
    /// Needs --tls-key and --tls-ca. Reloaded on SIGHUP or when the file changes.
    #[arg(long, env = "HOLDFAST_TLS_CERT", requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "HOLDFAST_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The CA (PEM) that signs every node's certificate; peers must present one it signed.
    #[arg(long, env = "HOLDFAST_TLS_CA", requires = "tls_cert")]
    tls_ca: Option<PathBuf>,
    /// Clients on the client port must also present a certificate signed by --tls-ca.
    #[arg(long, env = "HOLDFAST_TLS_CLIENT_AUTH", requires = "tls_cert")]
    tls_client_auth: bool,
    /// Where to listen for clients (HTTP).
    #[arg(long, env = "HOLDFAST_CLIENT_ADDR", default_value = "127.0.0.1:7070")]
    client_addr: SocketAddr,
    /// Where to listen for peers (Raft and forwarded requests).
    #[arg(long, env = "HOLDFAST_PEER_ADDR", default_value = "127.0.0.1:7071")]
    peer_addr: SocketAddr,
    /// Where to also serve /livez, /readyz and /metrics, alone, on plain HTTP (default: only on the client
    /// port).
    #[arg(long, env = "HOLDFAST_HEALTH_ADDR")]
    health_addr: Option<SocketAddr>,
    /// Where the log, vote and snapshots are kept.
    #[arg(long, env = "HOLDFAST_DATA_DIR", default_value = "./holdfast-data")]
    data_dir: PathBuf,
    /// The shortest TTL a client may ask for.
    #[arg(long, env = "HOLDFAST_TTL_MIN", default_value = "500ms", value_parser = humantime::parse_duration)]
    ttl_min: Duration,
    /// The longest TTL a client may ask for.
    #[arg(long, env = "HOLDFAST_TTL_MAX", default_value = "24h", value_parser = humantime::parse_duration)]
    ttl_max: Duration,
    /// The longest a client may wait in a lock's queue in one request.
    #[arg(long, env = "HOLDFAST_WAIT_MAX", default_value = "5m", value_parser = humantime::parse_duration)]
    wait_max: Duration,
    /// The longest lock-delay a client may ask for (`lock_delay=`): how long a lock whose holder's lease
    /// ran out stays ungranted.
    #[arg(long, env = "HOLDFAST_LOCK_DELAY_MAX", default_value = "60s", value_parser = humantime::parse_duration)]
    lock_delay_max: Duration,
    /// The most two nodes' wall clocks may disagree, if the operator can promise a bound (NTP with an
    /// alarm, say). With it, a new leader keeps each TTL hold's end as stamped by the leader that granted
    /// or renewed it, plus this bound and its own election, instead of giving every hold a whole TTL again
    /// from its promotion. Unset (the default): safe under any clocks. See docs/GUARANTEES.md.
    #[arg(long, env = "HOLDFAST_MAX_CLOCK_SKEW", value_parser = humantime::parse_duration)]
    max_clock_skew: Option<Duration>,
    /// Past this lag (how late this node's tasks wake, or how late it confirms its sessions' heartbeats),
    /// new sessions and one-shot acquires are refused (`RESOURCE_EXHAUSTED` / `429` `overloaded`) rather
    /// than paid for by the sessions already here. See docs/operations.md, "Overload".
    #[arg(long, env = "HOLDFAST_OVERLOAD_DELAY", default_value = "500ms", value_parser = humantime::parse_duration)]
    overload_delay: Duration,
    /// Past this share of its worker threads' time busy, in either of the last two seconds, new sessions
    /// are refused (`RESOURCE_EXHAUSTED` `overloaded`): a session is load that stays, admitted only while
    /// the node has room to spare for its heartbeats. 1 never refuses on it. See docs/operations.md,
    /// "Overload".
    #[arg(long, env = "HOLDFAST_OVERLOAD_BUSY", default_value_t = 0.8, value_parser = parse_share)]
    overload_busy: f64,
    /// How often the leader sends Raft heartbeats.
    #[arg(long, env = "HOLDFAST_HEARTBEAT_INTERVAL", default_value = "100ms", value_parser = humantime::parse_duration)]
    heartbeat_interval: Duration,
    /// The shortest election timeout (the longest is 1.2 times this). A follower that hears nothing from a
    /// leader for its lease (the longest timeout) plus a timeout stands for election.
    #[arg(long, env = "HOLDFAST_ELECTION_TIMEOUT", default_value = "250ms", value_parser = humantime::parse_duration)]
    election_timeout: Duration,
    /// The most sled's page cache may hold, e.g. 64MiB, while the node converts a data directory written by
    /// a build of storage format 4 or older, once, at its first start; the storage keeps no cache of its
    /// own otherwise (the lock state is in memory).
    #[arg(long, env = "HOLDFAST_STORAGE_CACHE", default_value = "1GiB", value_parser = parse_bytes)]
    storage_cache: u64,
    /// Disk space kept in reserve (a file, `reserve`, in the data directory) while there is room. When the
    /// disk fills up, the node gives it back for what it must still write, stores no new log entries (as
    /// leader, it lets another lead) and reports `disk full` on /readyz, until twice this is free again.
    /// 0: no reserve.
    #[arg(long, env = "HOLDFAST_DISK_RESERVE", default_value = "64MiB", value_parser = parse_bytes)]
    disk_reserve: u64,
    /// How long the raft log's sync may keep a write waiting before the disk counts as stalled: the node
    /// then stores no new log entries (as leader, it lets another lead) and reports `disk stalled` on
    /// /readyz, until its syncs finish. 0: not watched.
    #[arg(long, env = "HOLDFAST_DISK_STALL", default_value = "1s", value_parser = humantime::parse_duration)]
    disk_stall: Duration,
    /// Take a snapshot after this many log entries.
    #[arg(long, env = "HOLDFAST_SNAPSHOT_EVERY", default_value_t = 20_000)]
    snapshot_every: u64,
    /// How long the leader may hold back an acquire that will queue (its lock is held), so that the lock's
    /// release and the acquire share one log entry (about one hand-over: a slow host takes a few ms); 0 turns
    /// it off. At most 10s.
    #[arg(long, env = "HOLDFAST_QUEUE_HOLD", default_value = "5ms", value_parser = humantime::parse_duration)]
    queue_hold: Duration,
    /// Log format on stderr; the level comes from RUST_LOG (default: info).
    #[arg(long, env = "HOLDFAST_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Threads that run the node's tasks. Default: one per CPU the process may use (a container's CPU
    /// quota counts). Nodes that share a machine do better with their share of its cores, e.g. 1 for
    /// three nodes on two cores (docs/deployment.md).
    #[arg(long, env = "HOLDFAST_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    worker_threads: Option<u16>,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// mimalloc rather than glibc's malloc: a node allocates and frees many small buffers per request (HTTP/2
/// frames, protobuf messages, log entries) from several threads, and glibc's allocator took about a sixth
/// of the machine's CPU under load (see docs/perf-notes/2026-12-01-log-files-and-mimalloc.md).
///
/// Built without transparent huge pages (the `no_thp` feature: mimalloc turns them off for the process;
/// `MIMALLOC_ALLOW_THP=1` leaves them on): with them, on a kernel that grants them when asked (`madvise`),
/// a 2 MiB page was resident as soon as a byte of it was touched. An idle node held 59 MiB instead of 19, and one holding
/// 100,000 sessions 256-261 MiB instead of 208-212, with no rate measurably lower without them
/// (docs/perf-notes/2026-12-07-a-heartbeat-without-a-lookup.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Commands::Server(args) => server(*args),
        Commands::Run(args) => run_command(args),
        Commands::Elect(args) => elect_command(args),
        Commands::Lock { target, command } => lock_command(target, command),
        Commands::Bench { target, workload } => bench_command(target, workload),
        Commands::Cluster { target, command } => cluster_command(target, command),
        Commands::Healthcheck { url, timeout } => match cli::healthcheck(&url, timeout) {
            Ok(()) => Ok(()),
            Err(e) => {
                eprintln!("holdfast healthcheck: {e:#}");
                exit(1)
            }
        },
    }
}

/// `holdfast run`: exits with the command's code, or the codes of docs/cli.md.
fn run_command(args: RunCli) -> anyhow::Result<()> {
    let wait = match (args.no_wait, args.wait) {
        (true, _) => run::Wait::No,
        (false, Some(wait)) => run::Wait::For(wait),
        (false, None) => run::Wait::Forever,
    };
    let mut run_args = run::RunArgs {
        busy_code: args.conflict_exit_code,
        command: args.command,
        ..args.hold.run_args(args.name, args.ttl, wait, Vec::new())
    };
    run_args.options.limit = args.limit;
    exit(client_runtime()?.block_on(run::run(run_args)))
}

/// `holdfast elect`: campaigns and runs the command while leading (exit codes as `holdfast run`'s), or
/// observes.
fn elect_command(args: ElectCli) -> anyhow::Result<()> {
    if args.observe {
        let client = args.hold.client();
        exit(client_runtime()?.block_on(async {
            match client.connect().await {
                Ok(client) => cli::observe(&client, &args.name, args.json).await,
                Err(e) => unreachable_cluster(&e),
            }
        }));
    }
    let run_args = run::RunArgs {
        command: args.command,
        ..args.hold.run_args(args.name, args.ttl, run::Wait::Forever, args.value.into_bytes())
    };
    exit(client_runtime()?.block_on(run::run(run_args)))
}

/// `holdfast lock …`: one call.
fn lock_command(target: Target, command: LockCli) -> anyhow::Result<()> {
    let command = match command {
        LockCli::Acquire { name, ttl, wait, value, lock_delay, limit } => {
            let options = AcquireOptions { value: value.into_bytes(), lock_delay, limit };
            cli::LockCommand::Acquire { name, ttl, wait, options }
        }
        LockCli::SetValue { name, token, value } => {
            cli::LockCommand::SetValue { name, token, value: value.into_bytes() }
        }
        LockCli::Watch { name, prefix, after } => cli::LockCommand::Watch { name, prefix, after },
        LockCli::Release { name, token } => cli::LockCommand::Release { name, token },
        LockCli::Renew { name, token, ttl } => cli::LockCommand::Renew { name, token, ttl },
        LockCli::Get { name } => cli::LockCommand::Get { name },
        LockCli::List { prefix, after, limit } => cli::LockCommand::List { prefix, after, limit },
    };
    exit(client_runtime()?.block_on(async {
        match target.tls.connect(target.endpoints).await {
            Ok(client) => cli::lock(&client, command, target.json).await,
            Err(e) => unreachable_cluster(&e),
        }
    }))
}

/// `holdfast bench …`: a workload against the cluster.
fn bench_command(target: Target, workload: BenchCli) -> anyhow::Result<()> {
    let http = matches!(workload, BenchCli::Uncontended { http: true, .. } | BenchCli::Contended { http: true, .. });
    if http && (target.tls.ca.is_some() || target.tls.api_key.is_some()) {
        eprintln!("holdfast: bench --http speaks plain HTTP with no API key: it takes neither --ca nor --api-key");
        exit(run::EXIT_USAGE)
    }
    let workload = match workload {
        BenchCli::Uncontended { clients, duration, http } => bench::Workload::Uncontended { clients, duration, http },
        BenchCli::Contended { clients, duration, http } => bench::Workload::Contended { clients, duration, http },
        BenchCli::Reads { clients, duration, busy } => bench::Workload::Reads { clients, duration, busy },
        BenchCli::Failover(args) => bench::Workload::Failover(args),
        BenchCli::Sessions(args) => bench::Workload::Sessions(args),
        BenchCli::Scale(args) => bench::Workload::Scale(args),
        BenchCli::Watch(args) => bench::Workload::Watch(args),
        BenchCli::Elect(args) => bench::Workload::Elect(args),
        BenchCli::Host(args) => bench::Workload::Host(args),
    };
    let builder = match target.tls.builder(target.endpoints) {
        Ok(builder) => builder,
        Err(e) => {
            eprintln!("holdfast: {e}");
            exit(run::EXIT_USAGE)
        }
    };
    let args = bench::BenchArgs { builder, workload, json: target.json };
    // One worker thread: the load generator shares the machine with the nodes it measures (on the
    // benchmark's 2 cores, 3 nodes and itself), and one worker wakes no other for its tasks.
    // Measured at 64 clients against the default (a worker per core), alternating, two runs each:
    // its CPU per cycle 57-59 -> 46-48 us, and 7,398-7,844 -> 8,198-8,293 cycles/s. (A
    // current-thread runtime was about as cheap, and 3 % slower.)
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    exit(runtime.block_on(bench::run(args)))
}

/// `holdfast cluster …`: the status, a membership change or a snapshot.
fn cluster_command(target: Target, command: ClusterCli) -> anyhow::Result<()> {
    exit(client_runtime()?.block_on(async {
        let client = match target.tls.connect(target.endpoints).await {
            Ok(client) => client,
            Err(e) => return unreachable_cluster(&e),
        };
        let (member, admin) = match command {
            ClusterCli::Status => return cli::cluster_status(&client, target.json).await,
            ClusterCli::Add { id, peer_addr, admin } => (cli::MemberCommand::Add { id, peer_addr }, admin),
            ClusterCli::Remove { id, admin } => (cli::MemberCommand::Remove { id }, admin),
            ClusterCli::Snapshot { admin } => {
                return cli::cluster_snapshot(&client, admin.admin_key.as_deref(), target.json).await
            }
        };
        cli::cluster_member(&client, member, admin.admin_key.as_deref(), target.json).await
    }))
}

fn client_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")
}

fn unreachable_cluster(e: &holdfast_client::Error) -> u8 {
    eprintln!("holdfast: {e}");
    run::EXIT_UNREACHABLE
}

fn exit(code: u8) -> ! {
    std::process::exit(code.into())
}

fn server(args: ServerArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    let config = server_config(&args)?;
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = args.worker_threads {
        runtime.worker_threads(threads.into());
    }
    // No LIFO slot: with it, a task woken by another ran next, so a batch of heartbeats answered together
    // woke each response stream and then its connection's task, which wrote that one acknowledgement
    // before the next stream ran: a write per acknowledgement. Without it the connection's task runs after
    // the batch, and writes its streams' answers at once: 64 clients +24-37 % (nodes' CPU per operation
    // 54-61 → 39-41 µs), one client 1-7 % slower, within noise (docs/perf-notes/2026-12-06-memory-per-session.md).
    // `disable_lifo_slot` is tokio's unstable API (`--cfg tokio_unstable`, .cargo/config.toml).
    let runtime = runtime.disable_lifo_slot().enable_all().build().context("starting the async runtime")?;
    runtime.block_on(async {
        let client = tokio::net::TcpListener::bind(args.client_addr)
            .await
            .with_context(|| format!("listening for clients on {}", args.client_addr))?;
        let peer = tokio::net::TcpListener::bind(args.peer_addr)
            .await
            .with_context(|| format!("listening for peers on {}", args.peer_addr))?;
        let health = match args.health_addr {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("listening for health checks on {addr}"))?,
            ),
            None => None,
        };
        let listeners = holdfast_server::Listeners { client, peer, health };
        holdfast_server::run(config, listeners, shutdown_signal()).await
    })
}

fn server_config(args: &ServerArgs) -> anyhow::Result<holdfast_server::Config> {
    let id = node_id(&args.id)?;
    let members = match &args.members {
        Some(list) if !args.join => parse_members(list)?,
        Some(_) => bail!("--join and --members do not go together: a joining node learns the members from the cluster"),
        None => BTreeMap::from([(id, args.peer_addr.to_string())]),
    };
    let admin_key = admin_key(args)?;
    // A node that is not in the initial member list joins: it waits until a member adds it. That lets a
    // StatefulSet grow past its initial list (pods 3 and 4 of a list of 3) with one pod template.
    let join = args.join || !members.contains_key(&id);
    if join && !args.join {
        eprintln!("holdfast: node {id} is not in --members, so it joins: it waits until `holdfast cluster add {id} …`");
    }
    check_times(args)?;
    Ok(holdfast_server::Config {
        id,
        members,
        data_dir: args.data_dir.clone(),
        limits: FrontLimits {
            ttl_ms_min: millis(args.ttl_min),
            ttl_ms_max: millis(args.ttl_max),
            wait_ms_max: millis(args.wait_max),
            lock_delay_ms_max: millis(args.lock_delay_max),
            overload_delay: args.overload_delay,
            overload_busy: args.overload_busy,
        },
        heartbeat_ms: millis(args.heartbeat_interval),
        election_timeout_ms: millis(args.election_timeout),
        snapshot_every_entries: args.snapshot_every.max(1),
        queue_hold: args.queue_hold,
        join,
        cache_bytes: args.storage_cache,
        disk_reserve: args.disk_reserve,
        disk_stall: Some(args.disk_stall).filter(|stall| !stall.is_zero()),
        clock: holdfast_server::WallClock::system(),
        rng_seed: None,
        bugs: holdfast_server::Bugs::default(),
        max_clock_skew: args.max_clock_skew,
        admin_key: admin_key.map(holdfast_server::Secret),
        auth: holdfast_server::AuthConfig {
            enabled: args.auth,
            open_signup: args.open_signup,
            locks_per_key_max: args.key_locks_max.max(1),
            sessions_per_key_max: args.key_sessions_max.max(1),
            requests_per_s_per_key: args.key_rate.max(1),
        },
        tls: tls_files(args),
    })
}

/// `--id`: a positive number, or `hostname` for the ordinal at the end of the host's name.
fn node_id(id: &str) -> anyhow::Result<u64> {
    Ok(match id {
        "hostname" => {
            let host = hostname().context("--id hostname: reading the host name")?;
            id_from_hostname(&host)?
        }
        number => match number.parse::<u64>() {
            Ok(0) | Err(_) => bail!("--id must be a positive number or `hostname` (got {number:?})"),
            Ok(id) => id,
        },
    })
}

/// The admin key, given or read from the first line of its file, if any.
fn admin_key(args: &ServerArgs) -> anyhow::Result<Option<String>> {
    let admin_key = match (&args.admin_key, &args.admin_key_file) {
        (Some(key), _) => Some(key.trim().to_owned()),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            Some(text.lines().next().unwrap_or_default().trim().to_owned())
        }
        (None, None) => None,
    };
    if admin_key.as_ref().is_some_and(|key| key.len() < ADMIN_KEY_LEN_MIN) {
        bail!("the admin key must be at least {ADMIN_KEY_LEN_MIN} characters");
    }
    Ok(admin_key)
}

/// Refuses TTLs, waits, a queue hold and Raft timings outside what the node accepts.
fn check_times(args: &ServerArgs) -> anyhow::Result<()> {
    if args.ttl_min > args.ttl_max {
        bail!("--ttl-min must not exceed --ttl-max");
    }
    if millis(args.ttl_min) < limits::TTL_MS_MIN || millis(args.ttl_max) > limits::TTL_MS_MAX {
        bail!("--ttl-min and --ttl-max must lie within {} ms..={} ms", limits::TTL_MS_MIN, limits::TTL_MS_MAX);
    }
    if millis(args.wait_max) > limits::WAIT_MS_MAX {
        bail!("--wait-max must be at most {} ms", limits::WAIT_MS_MAX);
    }
    if args.max_clock_skew.is_some_and(|skew| skew > Duration::from_secs(3600)) {
        bail!("--max-clock-skew must be at most 1h");
    }
    if millis(args.lock_delay_max) > limits::LOCK_DELAY_MS_MAX {
        bail!("--lock-delay-max must be at most {} ms", limits::LOCK_DELAY_MS_MAX);
    }
    if args.queue_hold > Duration::from_secs(10) {
        bail!("--queue-hold must be at most 10s");
    }
    if args.heartbeat_interval.is_zero() || args.election_timeout <= args.heartbeat_interval * 2 {
        bail!("--election-timeout must be more than twice --heartbeat-interval");
    }
    Ok(())
}

/// The node's certificate, key and CA when all three are given.
fn tls_files(args: &ServerArgs) -> Option<holdfast_server::tls::TlsFiles> {
    match (&args.tls_cert, &args.tls_key, &args.tls_ca) {
        (Some(cert), Some(key), Some(ca)) => Some(holdfast_server::tls::TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            ca: ca.clone(),
            client_auth: args.tls_client_auth,
        }),
        _ => None,
    }
}

fn millis(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// `64MiB`, `1GiB`, `500KiB` or a number of bytes.
fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| format!("{text:?}: expected a size like 64MiB"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => return Err(format!("{text:?}: unknown unit {other:?} (B, KiB, MiB, GiB)")),
    };
    number.checked_mul(scale).ok_or_else(|| format!("{text:?}: too large"))
}

/// A share, above 0 and at most 1: `0.9`.
fn parse_share(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(share) if share > 0.0 && share <= 1.0 => Ok(share),
        _ => Err(format!("{text:?}: expected a share above 0 and at most 1, like 0.9")),
    }
}

/// The shortest admin key accepted: a guessable key is no key.
const ADMIN_KEY_LEN_MIN: usize = 16;

/// The id of a node on host `name-N` (a StatefulSet pod's name ends in its ordinal N, from 0): N+1.
fn id_from_hostname(host: &str) -> anyhow::Result<u64> {
    let short = host.split('.').next().unwrap_or(host);
    let ordinal = short.rsplit_once('-').and_then(|(_, n)| n.parse::<u64>().ok());
    match ordinal.and_then(|n| n.checked_add(1)) {
        Some(id) => Ok(id),
        None => bail!("--id hostname: the host name {host:?} does not end in -N (as StatefulSet pods' do)"),
    }
}

fn hostname() -> anyhow::Result<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..len]).into_owned())
}

/// `1=h1:7071,2=h2:7071,3=h3:7071`.
fn parse_members(list: &str) -> anyhow::Result<BTreeMap<u64, String>> {
    let mut members = BTreeMap::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (id, addr) = item.split_once('=').with_context(|| format!("member {item:?}: expected ID=HOST:PORT"))?;
        let id: u64 = id.trim().parse().with_context(|| format!("member {item:?}: the id is not a number"))?;
        let addr = addr.trim();
        if id == 0 {
            bail!("member {item:?}: ids are positive");
        }
        match addr.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
            _ => bail!("member {item:?}: expected HOST:PORT after '='"),
        }
        if members.insert(id, addr.to_owned()).is_some() {
            bail!("member id {id} is listed twice");
        }
    }
    if members.is_empty() {
        bail!("--members is empty");
    }
    Ok(members)
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
    // Colours only for a person at a terminal: not in files, journald or `docker logs`, nor with NO_COLOR.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("installing SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_parse_and_refuse_bad_lists() {
        let m = parse_members("1=h1:7071, 2=h2:7071,3=10.0.0.3:7071").unwrap();
        assert_eq!(m, BTreeMap::from([(1, "h1:7071".into()), (2, "h2:7071".into()), (3, "10.0.0.3:7071".into())]));
        for bad in ["", "1", "x=h:1", "0=h:1", "1=h", "1=:7071", "1=h:99999", "1=h:1,1=h:2"] {
            assert!(parse_members(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn ids_come_from_a_statefulset_pods_ordinal() {
        assert_eq!(id_from_hostname("holdfast-0").unwrap(), 1);
        assert_eq!(id_from_hostname("holdfast-2.holdfast-peers.default.svc").unwrap(), 3);
        assert_eq!(id_from_hostname("my-lock-svc-11").unwrap(), 12);
        for bad in ["holdfast", "holdfast-", "holdfast-x", "web1", ""] {
            assert!(id_from_hostname(bad).is_err(), "{bad:?} must be refused");
        }
        let cli = Cli::try_parse_from(["holdfast", "server", "--id", "0"]).unwrap();
        let Commands::Server(args) = cli.command else { panic!("parsed as the server command") };
        assert!(server_config(&args).is_err(), "id 0 is refused");
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        for bad in ["", "MiB", "64MB", "-1", "99999999999999999999GiB"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn a_node_missing_from_the_member_list_joins() {
        let parse = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).unwrap();
            let Commands::Server(args) = cli.command else { panic!("parsed as the server command") };
            server_config(&args)
        };
        let listed = parse(&["holdfast", "server", "--id", "2", "--members", "1=h1:7071,2=h2:7071"]).unwrap();
        assert!(!listed.join);
        let extra = parse(&["holdfast", "server", "--id", "4", "--members", "1=h1:7071,2=h2:7071"]).unwrap();
        assert!(extra.join, "node 4 is not in the list: it waits to be added");
        assert!(parse(&["holdfast", "server", "--join", "--members", "1=h1:7071"]).is_err());
    }

    /// `holdfast server FLAG`'s arguments, or clap's error as text.
    fn server_with(flag: &str) -> Result<Box<ServerArgs>, String> {
        let cli = Cli::try_parse_from(["holdfast", "server", flag]).map_err(|e| e.to_string())?;
        let Commands::Server(args) = cli.command else { panic!("parsed as the server command") };
        Ok(args)
    }

    #[test]
    fn worker_threads_are_a_count_from_1_to_1024() {
        let threads = |value: &str| server_with(&format!("--worker-threads={value}")).map(|args| args.worker_threads);
        assert_eq!(threads("1"), Ok(Some(1)));
        assert_eq!(threads("1024"), Ok(Some(1024)));
        for bad in ["0", "1025", "-1", "two", ""] {
            let refused = threads(bad).expect_err(bad);
            assert!(refused.contains("--worker-threads"), "{bad:?}: {refused}");
        }
        let cli = Cli::try_parse_from(["holdfast", "server"]).unwrap();
        let Commands::Server(args) = cli.command else { panic!("parsed as the server command") };
        assert_eq!(args.worker_threads, None, "one per CPU unless given");
    }

    #[test]
    fn overload_busy_is_a_share_above_0_and_at_most_1() {
        let busy = |value: &str| server_with(&format!("--overload-busy={value}")).map(|args| args.overload_busy);
        assert_eq!(busy("0.75"), Ok(0.75));
        assert_eq!(busy("1"), Ok(1.0));
        for bad in ["0", "1.5", "-0.2", "NaN", "most", ""] {
            let refused = busy(bad).expect_err(bad);
            assert!(refused.contains("--overload-busy"), "{bad:?}: {refused}");
        }
    }

    #[test]
    fn no_flags_is_a_single_node_on_the_default_ports() {
        let cli = Cli::try_parse_from(["holdfast", "server"]).unwrap();
        let Commands::Server(args) = cli.command else { panic!("parsed as the server command") };
        let config = server_config(&args).unwrap();
        assert_eq!(config.id, 1);
        assert_eq!(config.members, BTreeMap::from([(1, "127.0.0.1:7071".to_string())]));
        assert_eq!(args.client_addr.to_string(), "127.0.0.1:7070");
        assert_eq!(config.data_dir, PathBuf::from("./holdfast-data"));
    }
}
