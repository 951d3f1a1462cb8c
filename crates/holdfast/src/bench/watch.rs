//! `holdfast bench watch`: a writer changes one lock's value as fast as it is answered (or every
//! `--interval`), and watchers spread over the nodes watch the lock: changes made a second, states
//! delivered a second, and each change's latency from the moment the writer sent it to the moment a
//! watcher was told, as well as changes a watcher was not told of one by one (a resumed stream may skip).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast_client::{Client, ClientBuilder};

use super::loops::Window;
use super::{note, Report, Samples};

#[derive(clap::Args)]
pub struct WatchArgs {
    /// Watch streams, spread evenly over the endpoints (watcher i on endpoint i mod N).
    #[arg(long, default_value_t = 64)]
    pub watchers: usize,
    /// How long the writer changes the value.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Pause between two changes (0: the next is sent as soon as the last is answered).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
}

/// How long watchers may take, after the last change, to be told of it.
const DRAIN: Duration = Duration::from_secs(5);

/// What one watcher saw: its latencies, states told, and changes it was not told of one by one.
#[derive(Default)]
struct Seen {
    latency: Samples,
    states: u64,
    skipped: u64,
}

pub async fn run(client: &Client, builder: &ClientBuilder, run_id: u32, args: WatchArgs) -> anyhow::Result<Report> {
    let name = format!("bench-{run_id:08x}-watch");
    let hold = client.acquire_with_value(&name, args.duration + Duration::from_secs(60), Duration::ZERO, "0").await?;
    // When each change was sent, by its number (the value it publishes); the grant is number 0.
    let sent = Arc::new(Mutex::new(vec![Instant::now()]));
    // The number of the writer's last answered change, once it has stopped (0 until then).
    let last = Arc::new(AtomicU64::new(0));
    let endpoints = client.endpoints().to_vec();
    let mut watchers = Vec::new();
    for i in 0..args.watchers {
        let watcher = builder.clone().with_endpoints([endpoints[i % endpoints.len()].clone()]).build()?;
        let (name, sent, last) = (name.clone(), sent.clone(), last.clone());
        watchers.push(tokio::spawn(async move { watch(watcher, name, sent, last).await }));
    }
    // Every watcher must have its first state before the changes begin.
    tokio::time::sleep(Duration::from_millis(500)).await;
    note(format!("{} watchers of {name}; changing its value for {:?}", args.watchers, args.duration));
    let window = Window::start(args.duration, "changes");
    let (mut errors, mut answered) = (0u64, 0u64);
    let mut seq = 0u64;
    while Instant::now() < window.deadline {
        seq += 1;
        sent.lock().expect("sent poisoned").push(Instant::now());
        match client.set_value(&name, &hold.token, seq.to_string()).await {
            Ok(_) => {
                window.counters.add_done();
                answered = seq;
            }
            Err(_) => errors += 1,
        }
        if !args.interval.is_zero() {
            tokio::time::sleep(args.interval).await;
        }
    }
    let changed_for = window.started.elapsed().as_secs_f64();
    last.store(answered, Ordering::Release);
    let mut seen = Seen::default();
    for watcher in watchers {
        let one = watcher.await?;
        seen.latency.extend(one.latency);
        seen.states += one.states;
        seen.skipped += one.skipped;
    }
    let _ = client.release(&name, &hold.token).await;
    let changes = window.counters.done();
    let mut report = Report::new("watch", format!("watch: {} watchers, {changed_for:.1}s", args.watchers));
    report.field("watchers", args.watchers);
    report.field("seconds", changed_for);
    report.field("changes", changes);
    report.field("changes_per_s", changes as f64 / changed_for);
    report.field("states_told", seen.states);
    report.field("states_per_s", seen.states as f64 / changed_for);
    report.field("skipped", seen.skipped);
    report.field("errors", errors);
    seen.latency.fields(&mut report, "change_to_watcher_");
    report.row("changes made", format!("{changes} ({:.0}/s, {errors} failed)", changes as f64 / changed_for));
    report.row("states told", format!("{} ({:.0}/s)", seen.states, seen.states as f64 / changed_for));
    report.row("change sent -> watcher told", seen.latency.describe());
    report.row("changes not told one by one", seen.skipped.to_string());
    Ok(report)
}

/// Watches `name` until it has been told of the writer's last change (or [`DRAIN`] after the writer
/// stopped).
async fn watch(client: Client, name: String, sent: Arc<Mutex<Vec<Instant>>>, last: Arc<AtomicU64>) -> Seen {
    let mut watch = client.watch(&name);
    let mut seen = Seen::default();
    let mut told: Option<u64> = None;
    loop {
        let next = tokio::time::timeout(DRAIN, watch.next()).await;
        let Ok(Ok(lock)) = next else { return seen };
        let Some(number) = lock.holder.and_then(|h| String::from_utf8(h.value).ok()?.parse::<u64>().ok()) else {
            return seen;
        };
        let at = Instant::now();
        if let Some(before) = told {
            seen.states += 1;
            seen.skipped += number.saturating_sub(before + 1);
            if let Some(sent_at) = sent.lock().expect("sent poisoned").get(number as usize) {
                seen.latency.push(at.saturating_duration_since(*sent_at));
            }
        }
        told = Some(number);
        let last = last.load(Ordering::Acquire);
        if last > 0 && number >= last {
            return seen;
        }
    }
}
