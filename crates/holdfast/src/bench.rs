//! `holdfast bench …`: load against a running cluster, with progress while it runs and a table (or JSON)
//! at the end. Every run is bounded by `--duration` and stops by itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast_client::Client;
use serde_json::json;

/// Which workload.
pub enum Workload {
    /// Each client acquires and releases its own lock (one-shot calls): cycles/s and latency.
    Uncontended,
    /// Every client's session wants the same lock and releases it as soon as it holds it: hand-overs/s and
    /// the hand-over latency (release sent → next holder told).
    Contended,
}

pub struct BenchArgs {
    pub endpoints: Vec<String>,
    pub workload: Workload,
    pub clients: usize,
    pub duration: Duration,
    pub json: bool,
}

/// Latency samples in microseconds.
#[derive(Default)]
struct Samples(Vec<u64>);

impl Samples {
    fn percentile(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        let mut sorted = self.0.clone();
        sorted.sort_unstable();
        let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
        sorted[i] as f64 / 1000.0
    }
}

/// Runs the benchmark; answers the exit code.
pub async fn run(args: BenchArgs) -> u8 {
    let client = match Client::connect(args.endpoints.clone()).await {
        Ok(client) => client,
        Err(e) => {
            eprintln!("holdfast: {e}");
            return crate::run::EXIT_UNREACHABLE;
        }
    };
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let samples = Arc::new(Mutex::new(Samples::default()));
    let started = Instant::now();
    let deadline = started + args.duration;
    let run_id: u32 = rand_id();
    let mut tasks = Vec::new();
    let handoff = Arc::new(Mutex::new(None::<Instant>));
    for i in 0..args.clients {
        let (client, done, errors, samples, handoff) =
            (client.clone(), done.clone(), errors.clone(), samples.clone(), handoff.clone());
        let kind = match args.workload {
            Workload::Uncontended => 0,
            Workload::Contended => 1,
        };
        tasks.push(tokio::spawn(async move {
            if kind == 0 {
                let name = format!("bench-{run_id:08x}-{i}");
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let cycle = async {
                        let hold = client.acquire(&name, Duration::from_secs(30), Duration::ZERO).await?;
                        client.release(&name, &hold.token).await
                    };
                    match cycle.await {
                        Ok(_) => {
                            samples.lock().unwrap().0.push(t.elapsed().as_micros() as u64);
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            } else {
                let name = format!("bench-{run_id:08x}-contended");
                let Ok(session) = client.session(Duration::from_secs(5)).await else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    return;
                };
                while Instant::now() < deadline {
                    let wait = deadline.saturating_duration_since(Instant::now());
                    let Ok(held) = session.lock(name.clone(), Some(wait)).await else { break };
                    if let Some(released_at) = handoff.lock().unwrap().take() {
                        samples.lock().unwrap().0.push(released_at.elapsed().as_micros() as u64);
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    *handoff.lock().unwrap() = Some(Instant::now());
                    if held.release().await.is_err() {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let _ = session.close().await;
            }
        }));
    }
    let progress = {
        let done = done.clone();
        let quiet = args.json;
        tokio::spawn(async move {
            let mut last = 0;
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let now = done.load(Ordering::Relaxed);
                if !quiet {
                    eprintln!("  {:>5.1}s  {:>8} ops  {:>8}/s", started.elapsed().as_secs_f64(), now, now - last);
                }
                last = now;
            }
        })
    };
    for task in tasks {
        let _ = task.await;
    }
    progress.abort();
    let elapsed = started.elapsed().as_secs_f64();
    let samples = samples.lock().unwrap();
    let ops = done.load(Ordering::Relaxed);
    let (what, unit) = match args.workload {
        Workload::Uncontended => ("uncontended acquire+release", "cycles/s"),
        Workload::Contended => ("contended hand-over", "handovers/s"),
    };
    let result = json!({
        "workload": what, "clients": args.clients, "seconds": elapsed, "ops": ops,
        "rate_per_s": ops as f64 / elapsed, "errors": errors.load(Ordering::Relaxed),
        "p50_ms": samples.percentile(0.5), "p99_ms": samples.percentile(0.99), "max_ms": samples.percentile(1.0),
    });
    if args.json {
        println!("{result}");
    } else {
        println!(
            "{what}: {} clients, {:.1}s\n  {:.0} {unit}, errors {}\n  latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            args.clients,
            elapsed,
            ops as f64 / elapsed,
            errors.load(Ordering::Relaxed),
            samples.percentile(0.5),
            samples.percentile(0.99),
            samples.percentile(1.0)
        );
    }
    0
}

/// A random id so that runs do not collide on lock names.
fn rand_id() -> u32 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos());
    nanos.unwrap_or(0) ^ std::process::id()
}
