//! `sessions`: N sessions, each holding its own lock and heartbeating (every lease/4, which the client
//! library does by itself), for a duration.
//!
//! Measured: how long opening a session and taking its lock took; heartbeat acknowledgement times during the
//! window, from the nodes' `holdfast_heartbeat_duration_seconds` histograms (summed over the nodes; the
//! quantiles are bucket bounds, to a factor of 2; the network to the client is not included); the latency
//! of a leader-confirmed read sampled during the window (a `get`, which waits for the same quorum
//! confirmation a heartbeat's acknowledgement waits for); sessions that lost their lock (there must be
//! none); the session expirations the nodes counted; and CPU per node.
//!
//! The client multiplexes every session of one `Client` over one HTTP/2 connection per node, and the server
//! allows 200 concurrent streams per connection (hyper's default). So the sessions are spread over several
//! `Client`s, `--per-connection` sessions each, every one made with `connect` (so it prefers the leader), or
//! with `--spread` client `i` attached to endpoint `i mod n` (as behind a load balancer).
//!
//! Each node's resident memory is read when the window ends and its high-water mark (`VmHWM`: the most it
//! held since it started) at the end of the run: start the nodes fresh for a run's peak.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast_client::{Client, ClientBuilder, HeldLock, Session};
use serde_json::json;
use tokio::sync::{watch, Semaphore};

use super::light;
use super::{
    bucket_quantile, histogram_everywhere, metric_everywhere, note, peak_rss_bytes, progress, rss_bytes, CpuUse,
    CpuWindow, Report, Samples,
};

/// How long an opener waits after the cluster refused a session as overloaded before it opens another: what
/// the HTTP API's `Retry-After: 1` asks of a one-shot acquire, so that the refused load does not come back at
/// once and cost the node as much again.
pub(super) const REFUSED_PAUSE: Duration = Duration::from_secs(1);
/// The histogram of heartbeat acknowledgement times in `/metrics` (from a heartbeat reaching a node to its
/// acknowledgement being sent).
const HEARTBEATS: &str = "holdfast_heartbeat_duration_seconds";
/// The series of session expirations in `/metrics`.
const EXPIRATIONS: &str = "holdfast_expirations_total{kind=\"session\"}";

#[derive(clap::Args)]
pub struct SessionsArgs {
    #[arg(long, default_value_t = 1000)]
    pub sessions: usize,
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub lease: Duration,
    /// How long the sessions are kept once all are open.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Sessions per client connection (the server allows 200 streams per connection).
    #[arg(long, default_value_t = 100)]
    pub per_connection: usize,
    /// Sessions opened at once. A fleet's clients do not wait for each other; at 64, each opener waiting
    /// out its open and then its acquire, opening 100,000 took a 2-core host 1.7 times as long as at 256.
    #[arg(long, default_value_t = 256)]
    pub open_concurrency: usize,
    /// Give up opening more sessions after this long.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub open_timeout: Duration,
    /// The nodes' process ids (comma-separated, on this machine): CPU per node from /proc.
    #[arg(long, value_delimiter = ',')]
    pub pids: Vec<u32>,
    /// Attach client connection `i` to endpoint `i mod n` (as a load balancer spreads them) instead of to
    /// the leader.
    #[arg(long)]
    pub spread: bool,
    /// Drive the sessions with raw streams, one task per connection (`bench/light.rs`), instead of the
    /// client library's task per session: a cheaper generator, for runs past what the library's can send.
    #[arg(long)]
    pub light: bool,
    /// How often a leader-confirmed read is timed during the window.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub probe_interval: Duration,
}

#[derive(Default)]
struct Opened {
    sessions: Vec<(Session, HeldLock)>,
    open: Samples,
    lock: Samples,
    failures: usize,
    /// Opens the cluster refused as overloaded (`RESOURCE_EXHAUSTED` `overloaded`): not failures.
    refused: usize,
}

pub async fn run(client: &Client, builder: &ClientBuilder, run_id: u32, args: SessionsArgs) -> anyhow::Result<Report> {
    if args.per_connection == 0 || args.per_connection > 200 {
        anyhow::bail!("--per-connection must be 1..=200 (the server allows 200 streams per connection)");
    }
    let groups = args.sessions.div_ceil(args.per_connection);
    let endpoints = client.endpoints().to_vec();
    let mut clients = Vec::with_capacity(groups);
    for i in 0..groups {
        clients.push(if args.spread {
            // Endpoint i mod n first: the client's calls start there and fall back in order.
            let mut rotated = endpoints.clone();
            rotated.rotate_left(i % endpoints.len());
            builder.clone().with_endpoints(rotated).build()?
        } else {
            // As Client::connect does: to the leader first.
            builder.clone().connect().await?
        });
    }
    let expirations_before = metric_everywhere(client, EXPIRATIONS).await;

    let started = Instant::now();
    note(format!(
        "opening {} sessions (lease {:?}) over {} connections, {} at a time",
        args.sessions, args.lease, groups, args.open_concurrency
    ));
    let (opened, held) = match args.light {
        false => {
            let mut opened = open_all(&clients, run_id, &args, started).await;
            let sessions = Arc::new(std::mem::take(&mut opened.sessions));
            (opened, Held::Library(sessions))
        }
        true => open_light(&clients, run_id, &args, started).await,
    };
    let open_seconds = started.elapsed().as_secs_f64();
    let opened_count = held.count();
    note(format!(
        "{opened_count} sessions open with their locks in {open_seconds:.1} s ({} failed); keeping them for {:?}",
        opened.failures, args.duration
    ));

    let window = hold_window(client, &held, run_id, &args, started).await;

    note(format!("closing {opened_count} sessions"));
    let closing = Instant::now();
    let close_failures = held.close(args.open_concurrency).await;
    let close_seconds = closing.elapsed().as_secs_f64();

    let expirations = expirations_before
        .iter()
        .zip(&window.expirations_after)
        .map(|(b, a)| Some(a.as_ref()? - b.as_ref()?))
        .collect();
    let outcome = Outcome {
        args: &args,
        connections: groups,
        opened,
        opened_count,
        open_seconds,
        window,
        close_seconds,
        close_failures,
        expirations,
        peak_rss: args.pids.iter().map(|&pid| peak_rss_bytes(pid)).collect(),
    };
    Ok(outcome.report())
}

/// What the window (every session open and holding its lock) saw.
struct Window {
    /// Sessions whose lock was seen lost.
    lost: usize,
    /// The window's length in seconds.
    wall: f64,
    /// CPU use over the window: the nodes', then this process's.
    cpu: Vec<CpuUse>,
    /// Heartbeats acknowledged in the window, and the most their median took to be acknowledged at the
    /// nodes, in seconds (a bucket bound: see [`bucket_quantile`]).
    heartbeat_p50: Option<(f64, f64)>,
    /// The same, for the 99th percentile.
    heartbeat_p99: Option<(f64, f64)>,
    /// The leader-confirmed reads timed during the window, and those that failed.
    reads: Samples,
    read_errors: u64,
    /// Session expirations each node counted by the end of the window.
    expirations_after: Vec<Option<f64>>,
    /// Each node's resident bytes when the window ended.
    rss: Vec<Option<u64>>,
}

/// The lock session `i` of run `run_id` takes (whichever driver opens it).
pub fn lock_name(run_id: u32, i: usize) -> String {
    format!("bench-{run_id:08x}-session-{i}")
}

/// The open sessions: the client library's, or the light driver's (`--light`).
enum Held {
    Library(Arc<Vec<(Session, HeldLock)>>),
    Light { tally: Arc<light::Tally>, stop: watch::Sender<bool>, tasks: Vec<tokio::task::JoinHandle<()>> },
}

impl Held {
    fn count(&self) -> usize {
        match self {
            Held::Library(sessions) => sessions.len(),
            Held::Light { tally, .. } => tally.opened.load(Ordering::Relaxed),
        }
    }

    /// Counts the sessions seen to have lost their lock so far.
    fn lost_counter(&self) -> Arc<dyn Fn() -> usize + Send + Sync> {
        match self {
            Held::Library(sessions) => {
                let (sessions, seen) = (sessions.clone(), Mutex::new(vec![false; sessions.len()]));
                Arc::new(move || {
                    let mut seen = seen.lock().unwrap();
                    for (i, (_, held)) in sessions.iter().enumerate() {
                        seen[i] |= held.is_lost();
                    }
                    seen.iter().filter(|&&l| l).count()
                })
            }
            Held::Light { tally, .. } => {
                let tally = tally.clone();
                Arc::new(move || tally.lost.load(Ordering::Relaxed))
            }
        }
    }

    /// Closes every session; how many closes failed (the light driver does not tell).
    async fn close(self, concurrency: usize) -> usize {
        match self {
            Held::Library(sessions) => close_all(&sessions, concurrency).await,
            Held::Light { stop, tasks, .. } => {
                let _ = stop.send(true);
                futures_util::future::join_all(tasks).await;
                0
            }
        }
    }
}

/// Opens the sessions with the light driver: a task per connection, `open_concurrency` opens at a time
/// over all of them, until all are open or the open timeout.
async fn open_light(clients: &[Client], run_id: u32, args: &SessionsArgs, started: Instant) -> (Opened, Held) {
    let tally = Arc::new(light::Tally::default());
    let opening = Arc::new(Semaphore::new(args.open_concurrency.max(1)));
    let (stop, stopped) = watch::channel(false);
    let tasks = clients
        .iter()
        .enumerate()
        .map(|(g, client)| {
            let ids = g * args.per_connection..((g + 1) * args.per_connection).min(args.sessions);
            let (endpoint, opening, tally) = (client.preferred_endpoint().to_owned(), opening.clone(), tally.clone());
            tokio::spawn(light::connection(endpoint, ids, run_id, args.lease, opening, tally, stopped.clone()))
        })
        .collect();
    let _progress = {
        let tally = tally.clone();
        progress(started, move || {
            let (opened, late) = (tally.opened.load(Ordering::Relaxed), tally.take_late().as_millis());
            let (lost, unsent) = (tally.lost.load(Ordering::Relaxed), tally.unsent.load(Ordering::Relaxed));
            format!("{opened:>7} sessions open  {lost} lost  heartbeats late ≤ {late} ms, {unsent} unsent")
        })
    };
    let deadline = started + args.open_timeout;
    let settled = |t: &light::Tally| {
        [&t.opened, &t.failures, &t.refused].iter().map(|c| c.load(Ordering::Relaxed)).sum::<usize>()
    };
    while settled(&tally) < args.sessions && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let opened = Opened {
        sessions: Vec::new(),
        open: std::mem::take(&mut *tally.open.lock().unwrap()),
        lock: std::mem::take(&mut *tally.lock.lock().unwrap()),
        failures: tally.failures.load(Ordering::Relaxed),
        refused: tally.refused.load(Ordering::Relaxed),
    };
    (opened, Held::Light { tally, stop, tasks })
}

/// Keeps the sessions for `args.duration`, timing a leader-confirmed read every `args.probe_interval`.
async fn hold_window(client: &Client, held: &Held, run_id: u32, args: &SessionsArgs, started: Instant) -> Window {
    let heartbeats_before = histogram_everywhere(client, HEARTBEATS).await;
    let cpu = CpuWindow::start(&args.pids);
    let window_end = Instant::now() + args.duration;
    let check_lost = held.lost_counter();
    let probe_samples = Arc::new(Mutex::new(Samples::default()));
    let progress_guard = {
        let (check_lost, probe_samples, n) = (check_lost.clone(), probe_samples.clone(), held.count());
        progress(started, move || {
            let lost = check_lost();
            let probe = probe_samples.lock().unwrap().percentile(0.99);
            format!("{:>7} sessions holding  {lost} lost  read p99 {probe:.2} ms", n - lost)
        })
    };
    let probe_name = lock_name(run_id, 0);
    let mut probe_errors = 0u64;
    while Instant::now() < window_end {
        let t = Instant::now();
        match client.get(&probe_name).await {
            Ok(_) => probe_samples.lock().unwrap().push(t.elapsed()),
            Err(_) => probe_errors += 1,
        }
        tokio::time::sleep_until((t + args.probe_interval).min(window_end).into()).await;
    }
    let lost = check_lost();
    let (wall, cpu_used) = cpu.finish();
    let heartbeats_after = histogram_everywhere(client, HEARTBEATS).await;
    let heartbeat = |q: f64| bucket_quantile(heartbeats_before.as_deref()?, heartbeats_after.as_deref()?, q);
    let (heartbeat_p50, heartbeat_p99) = (heartbeat(0.5), heartbeat(0.99));
    let expirations_after = metric_everywhere(client, EXPIRATIONS).await;
    let rss = args.pids.iter().map(|&pid| rss_bytes(pid)).collect();
    drop(progress_guard);
    let reads = probe_samples.lock().unwrap().clone();
    Window {
        lost,
        wall,
        cpu: cpu_used,
        heartbeat_p50,
        heartbeat_p99,
        reads,
        read_errors: probe_errors,
        expirations_after,
        rss,
    }
}

/// Everything the run saw, for its report.
struct Outcome<'a> {
    args: &'a SessionsArgs,
    /// Client connections the sessions were spread over.
    connections: usize,
    /// The opening's samples and failures (its sessions taken out).
    opened: Opened,
    opened_count: usize,
    open_seconds: f64,
    window: Window,
    close_seconds: f64,
    close_failures: usize,
    /// Session expirations each node counted during the run.
    expirations: Vec<Option<f64>>,
    /// Each node's resident high-water mark at the end of the run.
    peak_rss: Vec<Option<u64>>,
}

impl Outcome<'_> {
    fn report(&self) -> Report {
        let (args, wall) = (self.args, self.window.wall);
        let mut report = Report::new(
            "sessions",
            format!("sessions: {} × lease {:?}, {wall:.1} s window", args.sessions, args.lease),
        );
        self.fields(&mut report);
        self.rows(&mut report);
        report
    }

    /// The cluster's session expirations.
    fn cluster_expirations(&self) -> Option<f64> {
        // Every node applies the same expirations; the cluster's count is the most any node saw.
        self.expirations.iter().flatten().copied().reduce(f64::max)
    }

    /// The nodes' CPU use, and this process's.
    fn cpu(&self) -> (&[CpuUse], &CpuUse) {
        let (node_cpu, own_cpu) = self.window.cpu.split_at(self.window.cpu.len() - 1);
        (node_cpu, &own_cpu[0])
    }

    /// The nodes' CPU use in all, in cores.
    fn total_cores(&self) -> Option<f64> {
        self.cpu().0.iter().map(|c| c.cores).sum()
    }

    /// Heartbeats a second the open sessions send (every lease/4).
    fn heartbeats_per_s(&self) -> f64 {
        self.opened_count as f64 * 4.0 / self.args.lease.as_secs_f64()
    }

    /// The JSON object's fields.
    fn fields(&self, report: &mut Report) {
        let (args, window, opened) = (self.args, &self.window, &self.opened);
        let (node_cpu, own_cpu) = self.cpu();
        report.field("kind", "sessions");
        report.field("sessions", args.sessions);
        report.field("opened", self.opened_count);
        report.field("open_failures", opened.failures);
        report.field("open_refused_overloaded", opened.refused);
        report.field("lease_ms", args.lease.as_millis() as u64);
        report.field("connections", self.connections);
        report.field("open_seconds", self.open_seconds);
        report.field("window_seconds", window.wall);
        report.field("close_seconds", self.close_seconds);
        report.field("close_failures", self.close_failures);
        report.field("heartbeats_per_s", self.heartbeats_per_s());
        report.field("spurious_lost", window.lost);
        report.field("expirations_per_node", json!(self.expirations));
        report.field("expirations", self.cluster_expirations());
        report.field("heartbeats_acknowledged", window.heartbeat_p50.map(|(count, _)| count));
        report.field("heartbeat_p50_ms_at_most", window.heartbeat_p50.map(|(_, bound)| bound * 1000.0));
        report.field("heartbeat_p99_ms_at_most", window.heartbeat_p99.map(|(_, bound)| bound * 1000.0));
        report.field("probe_errors", window.read_errors);
        opened.open.fields(report, "open_");
        opened.lock.fields(report, "lock_");
        window.reads.fields(report, "read_");
        report.field(
            "cpu",
            json!(node_cpu
                .iter()
                .map(|c| json!({"pid": c.pid, "cpu_seconds": c.seconds, "cores": c.cores}))
                .collect::<Vec<_>>()),
        );
        report.field("cpu_cores_total", self.total_cores());
        report.field("spread", args.spread);
        report.field(
            "memory",
            json!(args
                .pids
                .iter()
                .zip(window.rss.iter().zip(&self.peak_rss))
                .map(|(pid, (held, peak))| json!({"pid": pid, "rss_bytes_holding": held, "rss_bytes_peak": peak}))
                .collect::<Vec<_>>()),
        );
        report.field("bench_cpu_cores", own_cpu.cores);
    }

    /// The table's rows.
    fn rows(&self, report: &mut Report) {
        let (args, window, opened) = (self.args, &self.window, &self.opened);
        let (wall, heartbeats_per_s, (node_cpu, own_cpu)) = (window.wall, self.heartbeats_per_s(), self.cpu());
        report.row(
            "sessions open",
            format!(
                "{} of {} ({} refused as overloaded, {} failed) in {:.1} s",
                self.opened_count, args.sessions, opened.refused, opened.failures, self.open_seconds
            ),
        );
        report.row("open a session", opened.open.describe());
        report.row("take its lock", opened.lock.describe());
        report.row(
            "heartbeats",
            match (window.heartbeat_p50, window.heartbeat_p99) {
                (Some((count, p50)), Some((_, p99))) => format!(
                    "{:.0}/s acknowledged ({heartbeats_per_s:.0}/s expected); p50 ≤ {:.1} ms, p99 ≤ {:.1} ms at the nodes",
                    count / wall,
                    p50 * 1000.0,
                    p99 * 1000.0
                ),
                _ => format!("{heartbeats_per_s:.0}/s expected (every lease/4); latency unknown (no /metrics answered)"),
            },
        );
        report.row("leader-confirmed read", format!("{} (every {:?})", window.reads.describe(), args.probe_interval));
        report.row("locks lost (spurious)", format!("{}", window.lost));
        report.row(
            "session expirations",
            match self.cluster_expirations() {
                Some(n) => format!("{n:.0} (per node: {})", list(&self.expirations, |v| format!("{v:.0}"))),
                None => "unknown (no /metrics answered)".into(),
            },
        );
        for c in node_cpu {
            report.row(
                format!("cpu pid {}", c.pid),
                match (c.seconds, c.cores) {
                    (Some(s), Some(cores)) => format!("{cores:.2} cores ({s:.1} s in {wall:.1} s)"),
                    _ => "unknown".into(),
                },
            );
        }
        if let Some(total) = self.total_cores() {
            report.row("cpu, nodes in total", format!("{total:.2} cores"));
        }
        report.row("cpu, this load generator", own_cpu.cores.map_or("unknown".into(), |c| format!("{c:.2} cores")));
        let mib = |b: &Option<u64>| b.map_or("?".into(), |b| format!("{:.0} MiB", b as f64 / 1048576.0));
        for (pid, (held, peak)) in args.pids.iter().zip(window.rss.iter().zip(&self.peak_rss)) {
            report.row(format!("memory pid {pid}"), format!("{} resident holding, {} at most", mib(held), mib(peak)));
        }
        report.row("closed", format!("in {:.1} s ({} failed)", self.close_seconds, self.close_failures));
    }
}

fn list(values: &[Option<f64>], show: impl Fn(f64) -> String) -> String {
    values.iter().map(|v| v.map_or("?".into(), &show)).collect::<Vec<_>>().join(", ")
}

/// Opens the sessions, `open_concurrency` at a time, each taking its own lock; stops starting new ones at
/// the open timeout.
async fn open_all(clients: &[Client], run_id: u32, args: &SessionsArgs, started: Instant) -> Opened {
    let next = Arc::new(AtomicUsize::new(0));
    let deadline = started + args.open_timeout;
    let opened = Arc::new(AtomicUsize::new(0));
    let _progress = {
        let opened = opened.clone();
        progress(started, move || format!("{:>7} sessions open", opened.load(Ordering::Relaxed)))
    };
    let mut workers = Vec::new();
    for _ in 0..args.open_concurrency.max(1) {
        let (clients, next, opened) = (clients.to_vec(), next.clone(), opened.clone());
        let (total, per, lease) = (args.sessions, args.per_connection, args.lease);
        workers.push(tokio::spawn(async move {
            let mut out = Opened::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total || Instant::now() >= deadline {
                    return out;
                }
                let t = Instant::now();
                let session = match clients[i / per].session(lease).await {
                    Ok(session) => session,
                    Err(e @ holdfast_client::Error::Overloaded(_)) => {
                        if out.refused == 0 {
                            note(format!("the cluster refused a session: {e}"));
                        }
                        out.refused += 1;
                        // As a client that honours the refusal would: the refused node is not asked again
                        // at once.
                        tokio::time::sleep(REFUSED_PAUSE).await;
                        continue;
                    }
                    Err(e) => {
                        if out.failures == 0 {
                            note(format!("opening a session failed: {e}"));
                        }
                        out.failures += 1;
                        continue;
                    }
                };
                out.open.push(t.elapsed());
                let t = Instant::now();
                match session.lock(lock_name(run_id, i), Some(Duration::from_secs(10))).await {
                    Ok(held) => {
                        out.lock.push(t.elapsed());
                        out.sessions.push((session, held));
                        opened.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        if out.failures == 0 {
                            note(format!("taking a session's lock failed: {e}"));
                        }
                        out.failures += 1;
                        let _ = session.close().await;
                    }
                }
            }
        }));
    }
    let mut all = Opened::default();
    for worker in workers {
        if let Ok(out) = worker.await {
            all.sessions.extend(out.sessions);
            all.open.extend(out.open);
            all.lock.extend(out.lock);
            all.failures += out.failures;
            all.refused += out.refused;
        }
    }
    all
}

/// Closes every session, `concurrency` at a time (each close is bounded by the client's request timeout).
/// The session hands its lock over as it closes; the lock handles, dropped later, send nothing more.
async fn close_all(sessions: &Arc<Vec<(Session, HeldLock)>>, concurrency: usize) -> usize {
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (sessions, next) = (sessions.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut failures = 0;
            loop {
                let Some((session, _)) = sessions.get(next.fetch_add(1, Ordering::Relaxed)) else { return failures };
                if session.clone().close().await.is_err() {
                    failures += 1;
                }
            }
        }));
    }
    let mut failures = 0;
    for worker in workers {
        failures += worker.await.unwrap_or(0);
    }
    failures
}
