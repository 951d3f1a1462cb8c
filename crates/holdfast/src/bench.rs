//! `holdfast bench …`: load against a running cluster, with progress on stderr while it runs and a table
//! (or one JSON object, `--json`) on stdout at the end. Every run is bounded and stops by itself.
//!
//! - `loops.rs`: `uncontended`, `contended` and `reads`, cycles, hand-overs and answers for a duration;
//! - `http.rs`: `uncontended --http` and `contended --http`, the same through the HTTP API;
//! - `failover.rs`: a prober while the leader is killed by a command;
//! - `sessions.rs`: many sessions heartbeating, each holding a lock;
//! - `scale.rs`: filling the cluster with held locks;
//! - `watch.rs`: watchers over the nodes told of a lock's value changes;
//! - `elect.rs`: candidates taking turns leading an election (each resigning, or killed), and the gap
//!   between leaders;
//! - `host.rs`: the machine alone, no cluster: thread wake-up round trip and fdatasync;
//! - here: what they share (latency samples, the report, progress, plain HTTP GETs of `/metrics`, and
//!   reading a process's CPU time and memory from `/proc`).

mod elect;
mod failover;
mod host;
mod http;
mod light;
mod loops;
mod scale;
mod sessions;
mod watch;

use std::sync::Arc;
use std::time::{Duration, Instant};

use holdfast_client::{Client, ClientBuilder};
use serde_json::{Map, Value};

pub use elect::ElectArgs;
pub use failover::FailoverArgs;
pub use host::HostArgs;
pub use scale::ScaleArgs;
pub use sessions::SessionsArgs;
pub use watch::WatchArgs;

/// Which workload, with its settings.
pub enum Workload {
    /// Each client acquires and releases its own lock (one-shot calls; with `http`, `POST` and `DELETE`):
    /// cycles/s and latency.
    Uncontended { clients: usize, duration: Duration, http: bool },
    /// Every client's session wants the same lock and releases it as soon as it holds it (with `http`, a
    /// `POST` with `wait=`): hand-overs/s and the hand-over latency (release sent → next holder told).
    Contended { clients: usize, duration: Duration, http: bool },
    /// Every client asks about one held lock (`get`, or with `busy` a one-shot acquire that finds it
    /// held): answers/s and latency.
    Reads { clients: usize, duration: Duration, busy: bool },
    /// A prober acquires and releases while a command kills the leader.
    Failover(FailoverArgs),
    /// Many sessions heartbeat, each holding a lock.
    Sessions(SessionsArgs),
    /// Fill the cluster with held locks.
    Scale(ScaleArgs),
    /// Watchers told of a lock's value changes.
    Watch(WatchArgs),
    /// Candidates taking turns leading an election.
    Elect(ElectArgs),
    /// The machine alone: thread wake-up round trip and fdatasync.
    Host(HostArgs),
}

pub struct BenchArgs {
    /// Endpoints, TLS and credentials; every client the workload makes starts from a clone of it.
    pub builder: ClientBuilder,
    pub workload: Workload,
    pub json: bool,
}

/// Runs the benchmark; answers the exit code.
pub async fn run(args: BenchArgs) -> u8 {
    let workload = match args.workload {
        Workload::Host(host) => {
            // No cluster: the probe blocks its threads on purpose, so it runs off the runtime's workers.
            let report = tokio::task::spawn_blocking(move || host::run(host)).await.expect("the host probe panicked");
            return finish(report, args.json);
        }
        workload => workload,
    };
    let client = match args.builder.clone().connect().await {
        Ok(client) => client,
        Err(e) => {
            eprintln!("holdfast: {e}");
            return crate::run::EXIT_UNREACHABLE;
        }
    };
    let run_id = rand_id();
    let report = match workload {
        Workload::Uncontended { clients, duration, http: false } => {
            Ok(loops::uncontended(&client, run_id, clients, duration).await)
        }
        Workload::Uncontended { clients, duration, http: true } => {
            Ok(http::uncontended(client.endpoints(), run_id, clients, duration).await)
        }
        Workload::Contended { clients, duration, http: false } => {
            Ok(loops::contended(&client, run_id, clients, duration).await)
        }
        Workload::Contended { clients, duration, http: true } => {
            Ok(http::contended(client.endpoints(), run_id, clients, duration).await)
        }
        Workload::Reads { clients, duration, busy } => loops::reads(&client, run_id, clients, duration, busy).await,
        Workload::Failover(a) => failover::run(&client, &args.builder, run_id, a).await,
        Workload::Sessions(a) => sessions::run(&client, &args.builder, run_id, a).await,
        Workload::Scale(a) => scale::run(&client, run_id, a).await,
        Workload::Watch(a) => watch::run(&client, &args.builder, run_id, a).await,
        Workload::Elect(a) => elect::run(client.endpoints(), &args.builder, run_id, a).await,
        Workload::Host(_) => unreachable!("measured above, without a cluster"),
    };
    finish(report, args.json)
}

/// Prints `report` (or its error); answers the exit code.
fn finish(report: anyhow::Result<Report>, json: bool) -> u8 {
    match report {
        Ok(report) => {
            report.print(json);
            0
        }
        Err(e) => {
            eprintln!("holdfast bench: {e:#}");
            1
        }
    }
}

/// What a workload found: one JSON object, and the same as rows of a table for people.
pub struct Report {
    title: String,
    json: Map<String, Value>,
    rows: Vec<(String, String)>,
}

impl Report {
    fn new(workload: &str, title: impl Into<String>) -> Self {
        let mut json = Map::new();
        json.insert("workload".into(), workload.into());
        Report { title: title.into(), json, rows: Vec::new() }
    }

    /// A field of the JSON object only.
    fn field(&mut self, key: &str, value: impl Into<Value>) {
        self.json.insert(key.into(), value.into());
    }

    /// A row of the table only.
    fn row(&mut self, what: impl Into<String>, value: impl Into<String>) {
        self.rows.push((what.into(), value.into()));
    }

    fn print(&self, json: bool) {
        if json {
            println!("{}", Value::Object(self.json.clone()));
            return;
        }
        println!("{}", self.title);
        let width = self.rows.iter().map(|(what, _)| what.chars().count()).max().unwrap_or(0);
        for (what, value) in &self.rows {
            println!("  {what:<width$}  {value}");
        }
    }
}

/// Latency samples in microseconds.
#[derive(Default, Clone)]
pub struct Samples(Vec<u64>);

impl Samples {
    fn push(&mut self, d: Duration) {
        self.0.push(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn extend(&mut self, other: Samples) {
        self.0.extend(other.0);
    }

    /// The `p` quantile (0..=1) in milliseconds; 0 without samples.
    fn percentile(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        let mut sorted = self.0.clone();
        sorted.sort_unstable();
        let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
        sorted[i] as f64 / 1000.0
    }

    /// `p50 1.23 ms, p99 4.56 ms, max 7.89 ms (N samples)`.
    fn describe(&self) -> String {
        self.describe_in(Unit::Millis)
    }

    /// [`Samples::describe`] in `unit`: to the microsecond, `p50 94 us, p99 151 us, max 980 us (N samples)`.
    fn describe_in(&self, unit: Unit) -> String {
        if self.0.is_empty() {
            return "no samples".into();
        }
        let (per_ms, decimals, name) = match unit {
            Unit::Millis => (1.0, 2, "ms"),
            Unit::Micros => (1000.0, 0, "us"),
        };
        let at = |p| self.percentile(p) * per_ms;
        format!(
            "p50 {:.decimals$} {name}, p99 {:.decimals$} {name}, max {:.decimals$} {name} ({} samples)",
            at(0.5),
            at(0.99),
            at(1.0),
            self.len()
        )
    }

    /// Puts `{prefix}p50_ms`, `{prefix}p99_ms` and `{prefix}max_ms` into `report`.
    fn fields(&self, report: &mut Report, prefix: &str) {
        report.field(&format!("{prefix}p50_ms"), round3(self.percentile(0.5)));
        report.field(&format!("{prefix}p99_ms"), round3(self.percentile(0.99)));
        report.field(&format!("{prefix}max_ms"), round3(self.percentile(1.0)));
    }
}

/// The unit [`Samples::describe_in`] gives times in.
#[derive(Debug, Clone, Copy)]
enum Unit {
    Millis,
    /// For times of tens or hundreds of microseconds (a thread's wake-up, an fdatasync).
    Micros,
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn ms(d: Duration) -> f64 {
    round3(d.as_secs_f64() * 1000.0)
}

/// Prints `  12.0s  <line()>` on stderr every second until aborted.
fn progress(started: Instant, line: impl Fn() -> String + Send + 'static) -> ProgressGuard {
    ProgressGuard(tokio::spawn(async move {
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + Duration::from_secs(1), Duration::from_secs(1));
        loop {
            tick.tick().await;
            eprintln!("  {:>6.1}s  {}", started.elapsed().as_secs_f64(), line());
        }
    }))
}

/// Stops its progress printer when dropped, whichever way the workload ends.
struct ProgressGuard(tokio::task::JoinHandle<()>);

impl Drop for ProgressGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A note on stderr, between progress lines.
fn note(text: impl AsRef<str>) {
    eprintln!("  {}", text.as_ref());
}

/// A random id so that runs do not collide on lock names.
fn rand_id() -> u32 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos());
    nanos.unwrap_or(0) ^ std::process::id()
}

/// `host:port` of a client endpoint as the client spells it (`http://host:port`).
fn authority(endpoint: &str) -> &str {
    let rest = endpoint.strip_prefix("http://").unwrap_or(endpoint);
    rest.strip_suffix('/').unwrap_or(rest)
}

/// A plain HTTP/1.0 GET of `path` on `endpoint`'s client port: the status and the body. Bounded by
/// `timeout` as a whole.
async fn http_get(endpoint: &str, path: &str, timeout: Duration) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let host = authority(endpoint);
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(host).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes())
            .await?;
        let mut answer = Vec::new();
        stream.take(64 << 20).read_to_end(&mut answer).await?;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok());
        let status = status.ok_or_else(|| anyhow::anyhow!("GET {path} on {host}: not an HTTP answer"))?;
        anyhow::Ok((status, body.to_owned()))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| anyhow::anyhow!("GET {path}: no answer in {timeout:?}"))?
}

/// The value of the series `series` (name and labels exactly as the node writes them, e.g.
/// `holdfast_expirations_total{kind="session"}`) in a `/metrics` answer.
fn metric(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.split_whitespace().next()?.parse().ok())
}

/// Several series from every endpoint's `/metrics`, one page read per endpoint, in endpoint order: each
/// node's values in the order of `series` (`None` where a node did not answer). A series a node does not
/// show counts as 0: a labelled counter appears only once it was first counted.
async fn metrics_everywhere(client: &Client, series: &[&str]) -> Vec<Option<Vec<f64>>> {
    let mut values = Vec::new();
    for endpoint in client.endpoints() {
        let value = match http_get(endpoint, "/metrics", Duration::from_secs(3)).await {
            Ok((200, body)) => Some(series.iter().map(|s| metric(&body, s).unwrap_or(0.0)).collect()),
            _ => None,
        };
        values.push(value);
    }
    values
}

/// One series from every endpoint's `/metrics`, as [`metrics_everywhere`] reads it.
async fn metric_everywhere(client: &Client, series: &str) -> Vec<Option<f64>> {
    metrics_everywhere(client, &[series]).await.into_iter().map(|node| node.map(|values| values[0])).collect()
}

/// Client commands the leader proposed and the log entries that carried them, summed over every endpoint
/// (only a leader proposes); `None` if no node answered. Between two readings: how well writes were batched.
async fn entry_commands(client: &Client) -> Option<(f64, f64)> {
    let series = ["holdfast_raft_entry_commands_sum", "holdfast_raft_entry_commands_count"];
    let answered: Vec<Vec<f64>> = metrics_everywhere(client, &series).await.into_iter().flatten().collect();
    (!answered.is_empty()).then(|| (answered.iter().map(|v| v[0]).sum(), answered.iter().map(|v| v[1]).sum()))
}

/// A histogram's buckets summed over every endpoint's `/metrics`: (upper bound in seconds, cumulative count),
/// in bound order; `None` if no node answered.
async fn histogram_everywhere(client: &Client, name: &str) -> Option<Vec<(f64, f64)>> {
    let prefix = format!("{name}_bucket{{le=\"");
    let mut buckets: std::collections::BTreeMap<u64, (f64, f64)> = std::collections::BTreeMap::new();
    let mut answered = false;
    for endpoint in client.endpoints() {
        let Ok((200, body)) = http_get(endpoint, "/metrics", Duration::from_secs(3)).await else { continue };
        answered = true;
        for line in body.lines() {
            let Some((bound, count)) = line.strip_prefix(&prefix).and_then(|rest| rest.split_once("\"} ")) else {
                continue;
            };
            let bound: f64 = if bound == "+Inf" { f64::INFINITY } else { bound.parse().unwrap_or(f64::NAN) };
            let (Ok(count), false) = (count.trim().parse::<f64>(), bound.is_nan()) else { continue };
            buckets.entry(bound.to_bits()).or_insert((bound, 0.0)).1 += count;
        }
    }
    let mut buckets: Vec<(f64, f64)> = buckets.into_values().collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    answered.then_some(buckets)
}

/// Of the observations made between two readings of a histogram: how many, and the upper bound (seconds) of
/// the bucket that holds quantile `q` (so a bound, to the histogram's resolution: a factor of 2).
fn bucket_quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<(f64, f64)> {
    let counted = |bound: f64, of: &[(f64, f64)]| of.iter().find(|(b, _)| *b == bound).map_or(0.0, |(_, c)| *c);
    let between: Vec<(f64, f64)> =
        after.iter().map(|&(bound, count)| (bound, count - counted(bound, before))).collect();
    let total = between.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let bound = between.iter().find(|(_, cumulative)| *cumulative >= q * total)?.0;
    Some((total, bound))
}

/// A process's CPU time so far (user + system), from `/proc/PID/stat`.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; fields 14 and 15 (utime, stime) count from after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then(|| (utime + stime) / ticks as f64)
}

/// A process's resident memory in bytes, from `/proc/PID/status`.
fn rss_bytes(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmRSS:")
}

/// The most memory a process has held resident since it started, in bytes (`VmHWM`, its high-water mark).
fn peak_rss_bytes(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmHWM:")
}

/// A field of `/proc/PID/status` given in kB, in bytes.
fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// CPU use of some processes over a window: started with [`CpuWindow::start`], read with
/// [`CpuWindow::finish`].
struct CpuWindow {
    started: Instant,
    before: Vec<(u32, Option<f64>)>,
}

impl CpuWindow {
    fn start(pids: &[u32]) -> Self {
        let mut all = pids.to_vec();
        all.push(std::process::id());
        CpuWindow { started: Instant::now(), before: all.into_iter().map(|pid| (pid, cpu_seconds(pid))).collect() }
    }

    /// Per process (the given pids, then this process): its CPU use over the window. Answers the window's
    /// length in seconds too.
    fn finish(&self) -> (f64, Vec<CpuUse>) {
        let wall = self.started.elapsed().as_secs_f64();
        let used = self
            .before
            .iter()
            .map(|&(pid, before)| {
                let seconds = match (before, cpu_seconds(pid)) {
                    (Some(b), Some(a)) => Some(a - b),
                    _ => None,
                };
                CpuUse { pid, seconds, cores: seconds.map(|s| s / wall) }
            })
            .collect();
        (wall, used)
    }
}

/// One process's CPU use over a window: seconds, and seconds per wall second (cores).
struct CpuUse {
    pid: u32,
    seconds: Option<f64>,
    cores: Option<f64>,
}

/// Runs `command` with `sh -c`, `{id}` replaced by `id`, bounded by `timeout`; its output goes to stderr.
async fn shell(command: &str, id: u64, timeout: Duration) -> anyhow::Result<()> {
    let command = command.replace("{id}", &id.to_string());
    note(format!("$ {command}"));
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&command)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(timeout, child)
        .await
        .map_err(|_| anyhow::anyhow!("`{command}` did not finish within {timeout:?}"))??;
    for line in String::from_utf8_lossy(&output.stdout).lines().chain(String::from_utf8_lossy(&output.stderr).lines()) {
        note(format!("| {line}"));
    }
    if !output.status.success() {
        anyhow::bail!("`{command}` failed ({})", output.status);
    }
    Ok(())
}

/// Shared counters for progress lines.
#[derive(Default)]
struct Counters {
    done: std::sync::atomic::AtomicU64,
    errors: std::sync::atomic::AtomicU64,
}

impl Counters {
    fn shared() -> Arc<Counters> {
        Arc::new(Counters::default())
    }

    fn done(&self) -> u64 {
        self.done.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn errors(&self) -> u64 {
        self.errors.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn add_done(&self) {
        self.done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn add_error(&self) {
        self.errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `ops  N/s` for a progress line, remembering the last count.
fn rate_line(counters: Arc<Counters>, unit: &'static str) -> impl Fn() -> String + Send + 'static {
    let last = std::sync::atomic::AtomicU64::new(0);
    move || {
        let now = counters.done();
        let delta = now - last.swap(now, std::sync::atomic::Ordering::Relaxed);
        format!("{now:>9} {unit}  {delta:>7}/s  errors {}", counters.errors())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_read_by_exact_series() {
        let body = "# TYPE holdfast_expirations_total counter\n\
                    holdfast_expirations_total{kind=\"lock\"} 3\n\
                    holdfast_expirations_total{kind=\"session\"} 17\n\
                    holdfast_locks_held 42\n";
        assert_eq!(metric(body, "holdfast_expirations_total{kind=\"session\"}"), Some(17.0));
        assert_eq!(metric(body, "holdfast_locks_held"), Some(42.0));
        assert_eq!(metric(body, "holdfast_locks"), None);
        assert_eq!(metric(body, "holdfast_sessions"), None);
    }

    #[test]
    fn percentiles_are_in_milliseconds() {
        let mut s = Samples::default();
        for us in [1000, 2000, 3000, 4000] {
            s.push(Duration::from_micros(us));
        }
        assert_eq!(s.percentile(0.0), 1.0);
        assert_eq!(s.percentile(1.0), 4.0);
        assert_eq!(Samples::default().percentile(0.5), 0.0);
    }

    #[test]
    fn samples_are_described_in_milliseconds_or_microseconds() {
        let mut s = Samples::default();
        for us in [94, 120, 151] {
            s.push(Duration::from_micros(us));
        }
        assert_eq!(s.describe(), "p50 0.12 ms, p99 0.15 ms, max 0.15 ms (3 samples)");
        assert_eq!(s.describe_in(Unit::Micros), "p50 120 us, p99 151 us, max 151 us (3 samples)");
        assert_eq!(Samples::default().describe_in(Unit::Micros), "no samples");
    }

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let pid = std::process::id();
        assert!(cpu_seconds(pid).is_some());
        let (now, peak) = (rss_bytes(pid).unwrap_or(0), peak_rss_bytes(pid).unwrap_or(0));
        assert!(now > 0 && peak >= now, "resident {now}, peak {peak}");
        assert_eq!(cpu_seconds(u32::MAX), None);
    }

    #[test]
    fn endpoints_become_authorities() {
        assert_eq!(authority("http://127.0.0.1:7070"), "127.0.0.1:7070");
        assert_eq!(authority("127.0.0.1:7170/"), "127.0.0.1:7170");
    }
}
