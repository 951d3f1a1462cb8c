//! `scale`: fill the cluster with held locks, many one-shot acquires at once with a long TTL, and report
//! how fast it filled, what the nodes hold, and (given their pids) their memory.
//!
//! The locks are left held (until their TTL runs out): the point is a cluster that holds them. Restart and
//! catch-up times are measured by `cluster/bench.sh`, which can restart a node.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use holdfast_client::Client;
use serde_json::json;

use super::{metric_everywhere, note, progress, rate_line, rss_bytes, Counters, Report, Samples};

#[derive(clap::Args)]
pub struct ScaleArgs {
    #[arg(long, default_value_t = 100_000)]
    pub locks: usize,
    /// Acquires in flight at once.
    #[arg(long, default_value_t = 128)]
    pub clients: usize,
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// No acquire starts after this long.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub max_duration: Duration,
    /// The nodes' process ids (comma-separated, on this machine): memory per node from /proc.
    #[arg(long, value_delimiter = ',')]
    pub pids: Vec<u32>,
}

pub async fn run(client: &Client, run_id: u32, args: ScaleArgs) -> anyhow::Result<Report> {
    let held_before = metric_everywhere(client, "holdfast_locks_held").await;
    let counters = Counters::shared();
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + args.max_duration;
    note(format!("filling {} locks (TTL {:?}), {} acquires at a time", args.locks, args.ttl, args.clients));
    let progress_guard = progress(started, rate_line(counters.clone(), "locks"));
    let mut workers = Vec::new();
    for _ in 0..args.clients.max(1) {
        let (client, counters, next) = (client.clone(), counters.clone(), next.clone());
        let (total, ttl) = (args.locks, args.ttl);
        workers.push(tokio::spawn(async move {
            let mut samples = Samples::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total || Instant::now() >= deadline {
                    return samples;
                }
                let t = Instant::now();
                match client.acquire(&format!("bench-{run_id:08x}-scale-{i:07}"), ttl, Duration::ZERO).await {
                    Ok(_) => {
                        samples.push(t.elapsed());
                        counters.add_done();
                    }
                    Err(_) => counters.add_error(),
                }
            }
        }));
    }
    let mut samples = Samples::default();
    for worker in workers {
        if let Ok(s) = worker.await {
            samples.extend(s);
        }
    }
    drop(progress_guard);
    let seconds = started.elapsed().as_secs_f64();
    let filled = counters.done();
    let rate = filled as f64 / seconds;
    let million_s = (rate > 0.0).then(|| 1_000_000.0 / rate);
    // Followers apply a moment after the leader answers.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held_after = metric_everywhere(client, "holdfast_locks_held").await;
    let rss: Vec<(u32, Option<u64>)> = args.pids.iter().map(|&pid| (pid, rss_bytes(pid))).collect();
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);

    let mut report = Report::new("scale", format!("scale: {filled} locks filled in {seconds:.1} s"));
    report.field("kind", "scale");
    report.field("locks", args.locks);
    report.field("filled", filled);
    report.field("errors", counters.errors());
    report.field("clients", args.clients);
    report.field("seconds", seconds);
    report.field("rate_per_s", rate);
    report.field("projected_1m_seconds", million_s);
    report.field("locks_held_before", json!(held_before));
    report.field("locks_held_after", json!(held_after));
    report.field("rss", json!(rss.iter().map(|(pid, b)| json!({"pid": pid, "bytes": b})).collect::<Vec<_>>()));
    samples.fields(&mut report, "");

    report.row("filled", format!("{filled} of {} ({} errors)", args.locks, counters.errors()));
    report.row("fill rate", format!("{rate:.0} locks/s"));
    if let Some(s) = million_s {
        report.row("1,000,000 locks would take", format!("{:.0} s ({:.1} min) at this rate", s, s / 60.0));
    }
    report.row("acquire latency", samples.describe());
    report.row(
        "locks held per node",
        held_after.iter().map(|v| v.map_or("?".into(), |v| format!("{v:.0}"))).collect::<Vec<_>>().join(", "),
    );
    for (pid, bytes) in &rss {
        report.row(format!("rss pid {pid}"), bytes.map_or("unknown".into(), |b| format!("{:.1} MiB", mib(b))));
    }
    Ok(report)
}
