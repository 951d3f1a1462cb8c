//! The etcd side of `cluster/bench-etcd.sh`: `holdfast bench uncontended` and `contended` through etcd's
//! v3 lock API, one JSON line on stdout with the fields `cluster/compare.sh` reads.
//!
//! ```text
//! holdfast-etcd-driver ENDPOINTS uncontended|contended CLIENTS SECONDS
//! ```
//!
//! Client `i` talks to endpoint `i mod n` (one gRPC channel per endpoint), with a lease of its own granted
//! once (its TTL outlives the run, so no keep-alive runs). `uncontended`: each client locks and unlocks a
//! name of its own, in a loop. `contended`: every client locks one name, waiting in etcd's queue, and
//! unlocks it as soon as it holds it; a hand-over's latency runs from the unlock sent to the next holder's
//! lock answered. `probe` (CLIENTS is 1): one client on a channel to every endpoint, locking and unlocking
//! a name of its own, for a failover's gap: the report's `longest_gap_ms` is the longest time between the
//! ends of two cycles in a row (or the run's start and the first, or the last and the run's end). Every loop stops at the end of the run.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use etcd_client::{Client, LockOptions};

/// A lease's TTL beyond the run, so that it never needs a keep-alive.
const LEASE_SLACK_S: i64 = 30;
/// How long a probe's call may take before it is given up and tried again.
const PROBE_CALL_TIMEOUT: Duration = Duration::from_secs(1);

#[tokio::main(worker_threads = 1)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, endpoints, kind, clients, seconds] = &args[..] else {
        bail!("usage: holdfast-etcd-driver ENDPOINTS uncontended|contended|probe CLIENTS SECONDS");
    };
    let endpoints: Vec<&str> = endpoints.split(',').collect();
    let clients: usize = clients.parse().context("CLIENTS")?;
    let duration = Duration::from_secs_f64(seconds.parse().context("SECONDS")?);
    let mut channels = Vec::new();
    if kind == "probe" {
        channels.push(Client::connect(&endpoints, None).await.context("connecting to the endpoints")?);
    } else {
        for endpoint in &endpoints {
            let channel = Client::connect([*endpoint], None).await;
            channels.push(channel.with_context(|| format!("connecting to {endpoint}"))?);
        }
    }
    let run = Run::new(duration);
    let contended = match kind.as_str() {
        "uncontended" | "probe" => false,
        "contended" => true,
        other => bail!("unknown workload {other:?}"),
    };
    let mut tasks = Vec::new();
    for i in 0..clients {
        let (client, run) = (channels[i % channels.len()].clone(), run.clone());
        let probe = kind == "probe";
        tasks.push(tokio::spawn(async move { run.client(client, i, contended, probe).await }));
    }
    for task in tasks {
        task.await?;
    }
    println!("{}", run.report(kind, clients));
    Ok(())
}

/// One run: its deadline, what its clients counted, and the driver's CPU at its start.
#[derive(Clone)]
struct Run {
    started: Instant,
    deadline: Instant,
    cpu_before: Option<f64>,
    counts: Arc<Mutex<Counts>>,
}

#[derive(Default)]
struct Counts {
    done: u64,
    errors: u64,
    samples_ns: Vec<u64>,
    /// When the last holder of the contended lock sent its unlock.
    released_at: Option<Instant>,
    /// When the last cycle ended, and the longest time between two such ends (or the start and the first).
    last_end: Option<Instant>,
    longest_gap: Duration,
}

impl Run {
    fn new(duration: Duration) -> Run {
        let started = Instant::now();
        let counts = Arc::default();
        Run { started, deadline: started + duration, cpu_before: cpu_seconds(), counts }
    }

    /// Client `i`'s loop until the deadline.
    async fn client(&self, mut client: Client, i: usize, contended: bool, probe: bool) {
        let ttl = self.deadline.saturating_duration_since(Instant::now()).as_secs() as i64 + LEASE_SLACK_S;
        let Ok(lease) = client.lease_grant(ttl, None).await else {
            self.counts.lock().unwrap().errors += 1;
            return;
        };
        let name = if contended { "bench-contended".to_owned() } else { format!("bench-{i}") };
        let options = || Some(LockOptions::new().with_lease(lease.id()));
        while Instant::now() < self.deadline {
            let t = Instant::now();
            // Bounded by the run: a lock waiting in the queue, or sent to a member that was killed. A probe
            // gives each call a second, then tries again, as a client with a deadline on its calls does:
            // etcd answers a proposal lost with its leader only after its request timeout (7 s).
            let left = self.deadline.saturating_duration_since(Instant::now());
            let bound = if probe { left.min(PROBE_CALL_TIMEOUT) } else { left };
            let lock = match tokio::time::timeout(bound, client.lock(name.as_str(), options())).await {
                Ok(locked) => locked,
                Err(_) if probe && Instant::now() < self.deadline => {
                    self.counts.lock().unwrap().errors += 1;
                    continue;
                }
                Err(_) => break,
            };
            let locked = match lock {
                Ok(locked) => locked,
                Err(e) => {
                    let mut counts = self.counts.lock().unwrap();
                    counts.errors += 1;
                    if counts.errors <= 5 {
                        eprintln!("holdfast-etcd-driver: client {i}: lock: {e}");
                    }
                    continue;
                }
            };
            if contended {
                let mut counts = self.counts.lock().unwrap();
                if let Some(released_at) = counts.released_at.take() {
                    counts.samples_ns.push(released_at.elapsed().as_nanos() as u64);
                    counts.done += 1;
                }
                counts.released_at = Some(Instant::now());
            }
            let unlocked = if probe {
                match tokio::time::timeout(PROBE_CALL_TIMEOUT, client.unlock(locked.key())).await {
                    Ok(unlocked) => unlocked,
                    Err(_) => {
                        self.counts.lock().unwrap().errors += 1;
                        continue;
                    }
                }
            } else {
                client.unlock(locked.key()).await
            };
            let mut counts = self.counts.lock().unwrap();
            match unlocked {
                Ok(_) if !contended => {
                    counts.samples_ns.push(t.elapsed().as_nanos() as u64);
                    counts.done += 1;
                    let gap = counts.last_end.unwrap_or(self.started).elapsed();
                    counts.longest_gap = counts.longest_gap.max(gap);
                    counts.last_end = Some(Instant::now());
                }
                Ok(_) => {}
                Err(_) => counts.errors += 1,
            }
        }
        let _ = client.lease_revoke(lease.id()).await;
    }

    /// The run's JSON line.
    fn report(&self, kind: &str, clients: usize) -> serde_json::Value {
        let seconds = self.started.elapsed().as_secs_f64();
        let mut counts = self.counts.lock().unwrap();
        counts.samples_ns.sort_unstable();
        // A run that ends while a cycle still waits (a failover not over yet) counts that wait too.
        let tail = counts.last_end.unwrap_or(self.started).elapsed();
        counts.longest_gap = counts.longest_gap.max(tail);
        let quantile = |q: f64| {
            let samples = &counts.samples_ns;
            (!samples.is_empty()).then(|| samples[((samples.len() - 1) as f64 * q) as usize] as f64 / 1e6)
        };
        let cpu = cpu_seconds().zip(self.cpu_before).map(|(after, before)| after - before);
        serde_json::json!({
            "kind": kind,
            "system": "etcd",
            "clients": clients,
            "seconds": seconds,
            "ops": counts.done,
            "rate_per_s": counts.done as f64 / seconds,
            "errors": counts.errors,
            "p50_ms": quantile(0.5),
            "p99_ms": quantile(0.99),
            "longest_gap_ms": counts.longest_gap.as_secs_f64() * 1e3,
            "bench_cpu_us_per_op": cpu.filter(|_| counts.done > 0).map(|s| s * 1e6 / counts.done as f64),
        })
    }
}

/// This process's CPU time so far (user + system), from `/proc/self/stat`.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_s > 0).then(|| ticks / per_s as f64)
}
