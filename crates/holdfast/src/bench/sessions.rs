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
//! `Client`s, `--per-connection` sessions each, every one made with `connect` (so it prefers the leader).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast_client::{Client, ClientBuilder, HeldLock, Session};
use serde_json::json;

use super::{bucket_quantile, histogram_everywhere, metric_everywhere, note, progress, CpuWindow, Report, Samples};

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
    /// Sessions opened at once.
    #[arg(long, default_value_t = 64)]
    pub open_concurrency: usize,
    /// Give up opening more sessions after this long.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub open_timeout: Duration,
    /// The nodes' process ids (comma-separated, on this machine): CPU per node from /proc.
    #[arg(long, value_delimiter = ',')]
    pub pids: Vec<u32>,
    /// How often a leader-confirmed read is timed during the window.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub probe_interval: Duration,
}

struct Opened {
    sessions: Vec<(Session, HeldLock)>,
    open: Samples,
    lock: Samples,
    failures: usize,
}

pub async fn run(client: &Client, builder: &ClientBuilder, run_id: u32, args: SessionsArgs) -> anyhow::Result<Report> {
    if args.per_connection == 0 || args.per_connection > 200 {
        anyhow::bail!("--per-connection must be 1..=200 (the server allows 200 streams per connection)");
    }
    let groups = args.sessions.div_ceil(args.per_connection);
    // Each connects as Client::connect does: to the leader first.
    let mut clients = Vec::with_capacity(groups);
    for _ in 0..groups {
        clients.push(builder.clone().connect().await?);
    }
    let expirations_before = metric_everywhere(client, EXPIRATIONS).await;

    let started = Instant::now();
    note(format!(
        "opening {} sessions (lease {:?}) over {} connections, {} at a time",
        args.sessions, args.lease, groups, args.open_concurrency
    ));
    let opened = open_all(&clients, run_id, &args, started).await;
    let open_seconds = started.elapsed().as_secs_f64();
    note(format!(
        "{} sessions open with their locks in {open_seconds:.1} s ({} failed); keeping them for {:?}",
        opened.sessions.len(),
        opened.failures,
        args.duration
    ));
    let opened_count = opened.sessions.len();
    let sessions = Arc::new(opened.sessions);

    // The window: every session open and holding its lock.
    let heartbeats_before = histogram_everywhere(client, HEARTBEATS).await;
    let cpu = CpuWindow::start(&args.pids);
    let window_end = Instant::now() + args.duration;
    let lost_seen = Arc::new(Mutex::new(vec![false; sessions.len()]));
    let check_lost = {
        let (sessions, lost_seen) = (sessions.clone(), lost_seen.clone());
        move || {
            let mut seen = lost_seen.lock().unwrap();
            for (i, (_, held)) in sessions.iter().enumerate() {
                seen[i] |= held.is_lost();
            }
            seen.iter().filter(|&&l| l).count()
        }
    };
    let probe_samples = Arc::new(Mutex::new(Samples::default()));
    let progress_guard = {
        let (check_lost, probe_samples, n) = (check_lost.clone(), probe_samples.clone(), sessions.len());
        progress(started, move || {
            let lost = check_lost();
            let probe = probe_samples.lock().unwrap().percentile(0.99);
            format!("{:>7} sessions holding  {lost} lost  read p99 {probe:.2} ms", n - lost)
        })
    };
    let probe_name = sessions.first().map(|(_, held)| held.name().to_owned()).unwrap_or_else(|| "bench-probe".into());
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
    drop(progress_guard);

    note(format!("closing {} sessions", sessions.len()));
    let closing = Instant::now();
    let close_failures = close_all(&sessions, args.open_concurrency).await;
    let close_seconds = closing.elapsed().as_secs_f64();

    let expirations: Vec<Option<f64>> =
        expirations_before.iter().zip(&expirations_after).map(|(b, a)| Some(a.as_ref()? - b.as_ref()?)).collect();
    // Every node applies the same expirations; the cluster's count is the most any node saw.
    let cluster_expirations = expirations.iter().flatten().copied().reduce(f64::max);
    let (node_cpu, own_cpu) = cpu_used.split_at(cpu_used.len() - 1);
    let total_cores: Option<f64> = node_cpu.iter().map(|c| c.cores).sum();
    let probe_samples = probe_samples.lock().unwrap().clone();
    let heartbeats_per_s = opened_count as f64 * 4.0 / args.lease.as_secs_f64();

    let mut report =
        Report::new("sessions", format!("sessions: {} × lease {:?}, {wall:.1} s window", args.sessions, args.lease));
    report.field("kind", "sessions");
    report.field("sessions", args.sessions);
    report.field("opened", opened_count);
    report.field("open_failures", opened.failures);
    report.field("lease_ms", args.lease.as_millis() as u64);
    report.field("connections", groups);
    report.field("open_seconds", open_seconds);
    report.field("window_seconds", wall);
    report.field("close_seconds", close_seconds);
    report.field("close_failures", close_failures);
    report.field("heartbeats_per_s", heartbeats_per_s);
    report.field("spurious_lost", lost);
    report.field("expirations_per_node", json!(expirations));
    report.field("expirations", cluster_expirations);
    report.field("heartbeats_acknowledged", heartbeat_p50.map(|(count, _)| count));
    report.field("heartbeat_p50_ms_at_most", heartbeat_p50.map(|(_, bound)| bound * 1000.0));
    report.field("heartbeat_p99_ms_at_most", heartbeat_p99.map(|(_, bound)| bound * 1000.0));
    report.field("probe_errors", probe_errors);
    opened.open.fields(&mut report, "open_");
    opened.lock.fields(&mut report, "lock_");
    probe_samples.fields(&mut report, "read_");
    report.field(
        "cpu",
        json!(node_cpu
            .iter()
            .map(|c| json!({"pid": c.pid, "cpu_seconds": c.seconds, "cores": c.cores}))
            .collect::<Vec<_>>()),
    );
    report.field("cpu_cores_total", total_cores);
    report.field("bench_cpu_cores", own_cpu[0].cores);

    report.row(
        "sessions open",
        format!("{opened_count} of {} ({} failed) in {open_seconds:.1} s", args.sessions, opened.failures),
    );
    report.row("open a session", opened.open.describe());
    report.row("take its lock", opened.lock.describe());
    report.row(
        "heartbeats",
        match (heartbeat_p50, heartbeat_p99) {
            (Some((count, p50)), Some((_, p99))) => format!(
                "{:.0}/s acknowledged ({heartbeats_per_s:.0}/s expected); p50 ≤ {:.1} ms, p99 ≤ {:.1} ms at the nodes",
                count / wall,
                p50 * 1000.0,
                p99 * 1000.0
            ),
            _ => format!("{heartbeats_per_s:.0}/s expected (every lease/4); latency unknown (no /metrics answered)"),
        },
    );
    report.row("leader-confirmed read", format!("{} (every {:?})", probe_samples.describe(), args.probe_interval));
    report.row("locks lost (spurious)", format!("{lost}"));
    report.row(
        "session expirations",
        match cluster_expirations {
            Some(n) => format!("{n:.0} (per node: {})", list(&expirations, |v| format!("{v:.0}"))),
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
    if let Some(total) = total_cores {
        report.row("cpu, nodes in total", format!("{total:.2} cores"));
    }
    report.row("cpu, this load generator", own_cpu[0].cores.map_or("unknown".into(), |c| format!("{c:.2} cores")));
    report.row("closed", format!("in {close_seconds:.1} s ({close_failures} failed)"));
    Ok(report)
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
            let mut out =
                Opened { sessions: Vec::new(), open: Samples::default(), lock: Samples::default(), failures: 0 };
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total || Instant::now() >= deadline {
                    return out;
                }
                let t = Instant::now();
                let session = match clients[i / per].session(lease).await {
                    Ok(session) => session,
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
                match session.lock(format!("bench-{run_id:08x}-session-{i}"), Some(Duration::from_secs(10))).await {
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
    let mut all = Opened { sessions: Vec::new(), open: Samples::default(), lock: Samples::default(), failures: 0 };
    for worker in workers {
        if let Ok(out) = worker.await {
            all.sessions.extend(out.sessions);
            all.open.extend(out.open);
            all.lock.extend(out.lock);
            all.failures += out.failures;
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
