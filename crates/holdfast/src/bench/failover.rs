//! `failover`: a prober acquires and releases its own lock in a loop while a command kills the leader.
//!
//! Before the fault, a few locks are taken with a TTL long enough to outlive it, and one more by a session
//! (heartbeats, a short lease). After a warm-up the leader is found and the kill command runs with its id.
//! The prober goes on for a while after the kill; then the locks taken before the fault are read back: each
//! must still be held, with the same fence, and the session's client must never have seen its lock lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use holdfast_client::{Client, ClientBuilder, HeldLock, Hold, Session};
use serde_json::json;

use super::{ms, note, progress, rate_line, round3, shell, Counters, Report, Samples};

/// How long the kill and restart commands may take.
const KILL_TIMEOUT: Duration = Duration::from_secs(60);
const RESTART_TIMEOUT: Duration = Duration::from_secs(120);
/// The TTL of each prober lock: a cycle whose release got lost leaves nothing behind for long.
const PROBE_TTL: Duration = Duration::from_secs(5);

#[derive(clap::Args)]
pub struct FailoverArgs {
    /// The command that kills a node, run with `sh -c`; `{id}` becomes the leader's id
    /// (e.g. 'cluster/cluster.sh kill {id}').
    #[arg(long)]
    pub kill: String,
    /// A command run at the end to bring the killed node back; `{id}` as for --kill.
    #[arg(long)]
    pub restart: Option<String>,
    /// Locks taken before the kill, which must still be held after it.
    #[arg(long, default_value_t = 3)]
    pub held: usize,
    /// Their TTL: longer than the whole run.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub held_ttl: Duration,
    /// The lease of a session that holds one more lock through the kill.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub session_lease: Duration,
    /// Probing before the kill.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Probing after the kill.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub after: Duration,
    /// The nodes' --election-timeout, for the report and its target (a grant within it + 0.5 s).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub election_timeout: Option<Duration>,
}

/// What the prober saw: when each grant came, when each cycle ended, and the cycles' latency.
#[derive(Default)]
struct Probe {
    grants: Vec<Instant>,
    cycles: Vec<Instant>,
    latency: Samples,
    /// The first few failed calls: when, and why.
    errors: Vec<(Instant, String)>,
    /// Acquires retried after a lost answer that found their own hold (granted, token unknown).
    own_hold: u64,
    /// Releases answered NotHolder: the hold had ended either way (a retry after an attempt that took
    /// effect but whose answer was lost, or a hold that ran out).
    release_not_holder: u64,
}

/// Failed calls remembered for the report.
const ERRORS_KEPT: usize = 5;

impl Probe {
    fn error(&mut self, what: &str, e: holdfast_client::Error) {
        if self.errors.len() < ERRORS_KEPT {
            self.errors.push((Instant::now(), format!("{what}: {e}")));
        }
    }
}

pub async fn run(client: &Client, builder: &ClientBuilder, run_id: u32, args: FailoverArgs) -> anyhow::Result<Report> {
    if args.held_ttl <= args.warmup + args.after + Duration::from_secs(5) {
        anyhow::bail!(
            "--held-ttl ({:?}) must outlast the warm-up, the time after the kill and some slack",
            args.held_ttl
        );
    }
    // The prober's own client: short attempts and short pauses, so it notices a new leader soon.
    let prober = builder
        .clone()
        .request_timeout(Duration::from_secs(1))
        .backoff(Duration::from_millis(10), Duration::from_millis(100))
        .retry_timeout(Duration::from_secs(10))
        .max_attempts(1000)
        .connect()
        .await?;
    let watcher = builder
        .clone()
        .request_timeout(Duration::from_millis(500))
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        .retry_timeout(Duration::from_secs(2))
        .build()?;
    let before = Held::take(client, run_id, &args).await?;

    let started = Instant::now();
    let counters = Counters::shared();
    let probe = Arc::new(Mutex::new(Probe::default()));
    let stop = Arc::new(AtomicBool::new(false));
    // A hard bound on the prober, whatever happens to the rest.
    let hard_stop = started + args.warmup + KILL_TIMEOUT + args.after + Duration::from_secs(10);
    let progress_guard = progress(started, rate_line(counters.clone(), "cycles"));
    let prober_task = {
        let (counters, probe, stop) = (counters.clone(), probe.clone(), stop.clone());
        tokio::spawn(probe_cycles(prober, run_id, hard_stop, counters, probe, stop))
    };

    tokio::time::sleep(args.warmup).await;
    let kill = match kill_and_watch(client, &watcher, &args).await {
        Ok(kill) => kill,
        Err(e) => {
            stop.store(true, Ordering::Relaxed);
            let _ = prober_task.await;
            release_all(client, &before.holds).await;
            return Err(e);
        }
    };
    tokio::time::sleep_until((kill.at().max(kill.command_end) + args.after).into()).await;
    stop.store(true, Ordering::Relaxed);
    let _ = prober_task.await;
    drop(progress_guard);

    let after = before.check(client).await;
    let restart = restart(&args, kill.leader).await;
    let probe = std::mem::take(&mut *probe.lock().unwrap());
    Ok(Outcome { args: &args, kill, started, counters, probe, after, restart }.report())
}

/// The prober: acquires and releases a lock of its own, a new one each cycle, until told to stop or
/// `hard_stop`.
async fn probe_cycles(
    prober: Client,
    run_id: u32,
    hard_stop: Instant,
    counters: Arc<Counters>,
    probe: Arc<Mutex<Probe>>,
    stop: Arc<AtomicBool>,
) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) && Instant::now() < hard_stop {
        // A new name each cycle: a grant whose answer was lost in the fault cannot block the next.
        let name = format!("bench-{run_id:08x}-probe-{n}");
        n += 1;
        let t = Instant::now();
        match prober.acquire(&name, PROBE_TTL, Duration::ZERO).await {
            Ok(hold) => {
                probe.lock().unwrap().grants.push(Instant::now());
                let released = prober.release(&name, &hold.token).await;
                match released {
                    Ok(_) | Err(holdfast_client::Error::NotHolder) => {
                        // NotHolder: the hold ended either way (docs/client.md); the client
                        // retries a release whose answer was lost when the leader died.
                        let mut p = probe.lock().unwrap();
                        p.cycles.push(Instant::now());
                        p.latency.push(t.elapsed());
                        p.release_not_holder += u64::from(released.is_err());
                        counters.add_done();
                    }
                    Err(e) => {
                        probe.lock().unwrap().error("release", e);
                        counters.add_error();
                    }
                }
            }
            // A retried acquire whose first attempt was applied but not answered (the leader died
            // in between) finds its own hold: the cluster did grant it. Its token is unknown; the
            // hold runs out with its short TTL.
            Err(holdfast_client::Error::Busy { holder: Some(h) }) if h.owner == prober.owner() => {
                let mut p = probe.lock().unwrap();
                p.grants.push(Instant::now());
                p.own_hold += 1;
            }
            Err(e) => {
                probe.lock().unwrap().error("acquire", e);
                counters.add_error();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

/// The locks taken before the fault: with a TTL, and one in a session.
struct Held {
    holds: Vec<Hold>,
    session: Session,
    session_lock: String,
    session_held: HeldLock,
}

impl Held {
    async fn take(client: &Client, run_id: u32, args: &FailoverArgs) -> anyhow::Result<Held> {
        let mut holds = Vec::new();
        for i in 0..args.held {
            let name = format!("bench-{run_id:08x}-held-{i}");
            let hold = client
                .acquire(&name, args.held_ttl, Duration::ZERO)
                .await
                .with_context(|| format!("acquiring {name}"))?;
            holds.push(hold);
        }
        let session = client.session(args.session_lease).await.context("opening a session")?;
        let session_lock = format!("bench-{run_id:08x}-session");
        let session_held = session
            .try_lock(session_lock.as_str())
            .await
            .with_context(|| format!("taking {session_lock} in a session"))?
            .with_context(|| format!("{session_lock} is held by someone else"))?;
        note(format!(
            "holding {} locks (TTL {:?}) and one in a session ({:?} lease) through the fault",
            holds.len(),
            args.held_ttl,
            args.session_lease
        ));
        Ok(Held { holds, session, session_lock, session_held })
    }

    /// Reads every lock back, then lets go of them all.
    async fn check(self, client: &Client) -> After {
        // Every lock held before the fault must still be held, by the same grant.
        let mut kept = 0;
        let mut lost = Vec::new();
        for hold in &self.holds {
            match client.get(&hold.name).await {
                Ok(Some(info)) if info.holder.as_ref().is_some_and(|h| h.fence == hold.fence) => kept += 1,
                Ok(info) => lost.push(format!("{}: {:?}", hold.name, info.and_then(|i| i.holder).map(|h| h.fence))),
                Err(e) => lost.push(format!("{}: {e}", hold.name)),
            }
        }
        release_all(client, &self.holds).await;
        // The session's lock: its client must never have seen it lost (its token fires the moment a lease ran
        // out without an ack, and stays fired), and the cluster must show the same grant.
        let session_seen_lost = self.session_held.lost().is_cancelled() || self.session_held.is_lost();
        let session_lost = match client.get(&self.session_lock).await {
            Ok(Some(info)) if info.holder.as_ref().is_some_and(|h| h.fence == self.session_held.fence()) => None,
            Ok(info) => Some(format!("held by {:?}", info.and_then(|i| i.holder).map(|h| h.fence))),
            Err(e) => Some(e.to_string()),
        };
        let _ = self.session_held.release().await;
        let _ = self.session.close().await;
        After { held: self.holds.len(), kept, lost, session_seen_lost, session_lost }
    }
}

/// What became of the locks taken before the fault.
struct After {
    held: usize,
    kept: usize,
    /// Each lock not held by its grant any more, and what holds it (or the error reading it).
    lost: Vec<String>,
    /// Whether the session's client saw its lock lost.
    session_seen_lost: bool,
    /// What the cluster showed of the session's lock if not its grant.
    session_lost: Option<String>,
}

impl After {
    fn session_kept(&self) -> bool {
        !self.session_seen_lost && self.session_lost.is_none()
    }
}

/// Runs the restart command, if any, for the killed node; answers whether it worked and how long it took.
async fn restart(args: &FailoverArgs, leader: u64) -> Option<(bool, Duration)> {
    let command = args.restart.as_ref()?;
    let t = Instant::now();
    let outcome = shell(command, leader, RESTART_TIMEOUT).await;
    if let Err(e) = &outcome {
        note(format!("restart failed: {e:#}"));
    }
    Some((outcome.is_ok(), t.elapsed()))
}

/// Everything the run saw, for its report.
struct Outcome<'a> {
    args: &'a FailoverArgs,
    kill: Kill,
    /// When the prober started.
    started: Instant,
    counters: Arc<Counters>,
    probe: Probe,
    after: After,
    restart: Option<(bool, Duration)>,
}

impl Outcome<'_> {
    fn report(&self) -> Report {
        let leader = self.kill.leader;
        let mut report = Report::new("failover", format!("failover: leader (node {leader}) killed"));
        self.fields(&mut report);
        self.rows(&mut report);
        report
    }

    /// The moment the leader died (see [`Kill::at`]).
    fn kill_at(&self) -> Instant {
        self.kill.at()
    }

    /// The longest time between the ends of two cycles in a row.
    fn longest_gap(&self) -> Option<Duration> {
        self.probe.cycles.windows(2).map(|w| w[1] - w[0]).max()
    }

    /// How long after the kill the first grant came.
    fn first_grant(&self) -> Option<Duration> {
        let kill_at = self.kill_at();
        // A grant answered after the old leader's port closed came from a new leader.
        self.probe.grants.iter().find(|&&g| g >= kill_at).map(|&g| g - kill_at)
    }

    /// How long the kill command took, in milliseconds.
    fn command_ms(&self) -> f64 {
        ms(self.kill.command_end - self.kill.command_start)
    }

    /// A grant within the election timeout plus half a second.
    fn target(&self) -> Option<Duration> {
        self.args.election_timeout.map(|e| e + Duration::from_millis(500))
    }

    /// Milliseconds from the kill to `at` (negative: before it).
    fn ms_from_kill(&self, at: Instant) -> f64 {
        let kill_at = self.kill_at();
        at.saturating_duration_since(kill_at).as_secs_f64() * 1000.0
            - kill_at.saturating_duration_since(at).as_secs_f64() * 1000.0
    }

    /// The JSON object's fields.
    fn fields(&self, report: &mut Report) {
        let (args, kill, after, probe) = (self.args, &self.kill, &self.after, &self.probe);
        let (kill_at, first_grant, new_leader, target) =
            (self.kill_at(), self.first_grant(), kill.new_leader, self.target());
        report.field("kind", "failover");
        report.field("killed_node", kill.leader);
        report.field("kill_command_ms", self.command_ms());
        report.field("death_seen_after_command_start_ms", kill.dead_at.map(|d| ms(d - kill.command_start)));
        report.field("cycles", self.counters.done());
        report.field("errors", self.counters.errors());
        report.field("seconds", self.started.elapsed().as_secs_f64());
        report.field("longest_gap_ms", self.longest_gap().map(ms));
        report.field("first_grant_after_kill_ms", first_grant.map(ms));
        report.field("new_leader", new_leader.map(|(id, _)| id));
        report.field("new_leader_after_kill_ms", new_leader.map(|(_, at)| ms(at - kill_at)));
        report.field("election_timeout_ms", args.election_timeout.map(ms));
        report.field("target_ms", target.map(ms));
        report.field(
            "target_met",
            match (first_grant, target) {
                (Some(g), Some(t)) => json!(g <= t && after.lost.is_empty() && after.session_kept()),
                _ => json!(null),
            },
        );
        report.field("held", after.held);
        report.field("held_kept", after.kept);
        report.field("held_all_kept", after.lost.is_empty());
        report.field("session_lease_ms", ms(args.session_lease));
        report.field("session_kept", after.session_kept());
        report.field("restarted", self.restart.map(|(ok, _)| ok));
        report.field("restart_ms", self.restart.map(|(_, t)| ms(t)));
        probe.latency.fields(report, "cycle_");
        report.field("granted_unanswered", probe.own_hold);
        report.field("released_not_holder", probe.release_not_holder);
        report.field(
            "prober_errors",
            json!(probe
                .errors
                .iter()
                .map(|(at, e)| json!({"ms_from_kill": round3(self.ms_from_kill(*at)), "error": e}))
                .collect::<Vec<_>>()),
        );
    }

    /// The table's rows.
    fn rows(&self, report: &mut Report) {
        let (args, kill, after, probe) = (self.args, &self.kill, &self.after, &self.probe);
        let (leader, kill_at, command_ms, target) = (kill.leader, self.kill_at(), self.command_ms(), self.target());
        let or_none = |d: Option<Duration>| d.map_or("none".to_owned(), |d| format!("{:.0} ms", ms(d)));
        report.row(
            "killed",
            match kill.dead_at {
                Some(d) => format!(
                    "node {leader}: its port closed {:.0} ms into the kill command ({command_ms:.0} ms in all)",
                    ms(d - kill.command_start)
                ),
                None => {
                    format!("node {leader}: its port never closed; times count from the command ({command_ms:.0} ms)")
                }
            },
        );
        report.row(
            "new leader",
            kill.new_leader.map_or("not seen".to_owned(), |(id, at)| {
                format!("node {id}, {:.0} ms after the kill", ms(at - kill_at))
            }),
        );
        report.row("first grant after the kill", or_none(self.first_grant()));
        report.row("longest gap between cycles", or_none(self.longest_gap()));
        report.row(
            "election timeout",
            match (args.election_timeout, target) {
                (Some(e), Some(t)) => format!("{:.0} ms (target: a grant within {:.0} ms)", ms(e), ms(t)),
                _ => "not given (--election-timeout)".into(),
            },
        );
        let (kept, held) = (after.kept, after.held);
        report.row(
            "locks held before the fault",
            match after.lost.is_empty() {
                true => format!("{kept} of {held} still held, same fence"),
                false => format!("{kept} of {held} still held; lost: {}", after.lost.join(", ")),
            },
        );
        report.row(
            "a session's lock",
            match (after.session_seen_lost, &after.session_lost) {
                (false, None) => format!("kept through the fault ({:?} lease), same fence", args.session_lease),
                (seen, cluster) => format!(
                    "LOST: {}{}",
                    if seen { "its client saw it lost; " } else { "" },
                    cluster.as_deref().map_or("the cluster still shows it".to_owned(), |c| format!("the cluster: {c}"))
                ),
            },
        );
        report.row(
            "cycles",
            format!(
                "{} ok ({} of them released with the answer NotHolder: the hold had ended either way), {} errors, {} acquires granted without an answer (a retry found its own hold)",
                self.counters.done(),
                probe.release_not_holder,
                self.counters.errors(),
                probe.own_hold
            ),
        );
        report.row("cycle latency", probe.latency.describe());
        for (at, e) in &probe.errors {
            report.row("prober error", format!("{:+.0} ms from the kill: {e}", self.ms_from_kill(*at)));
        }
        if let Some((ok, t)) = self.restart {
            report.row("restart", format!("{} in {:.1} s", if ok { "ok" } else { "FAILED" }, t.as_secs_f64()));
        }
    }
}

/// When the kill happened, as precisely as this process can tell.
struct Kill {
    /// The killed node's id.
    leader: u64,
    /// When the kill command started and returned.
    command_start: Instant,
    command_end: Instant,
    /// When the old leader's client port first refused a connection (its process is gone), if seen.
    dead_at: Option<Instant>,
    /// The next leader, and when it was first seen.
    new_leader: Option<(u64, Instant)>,
}

impl Kill {
    /// The moment the leader died: when its port first refused, else when the kill command started (which
    /// counts the command's own start-up as outage).
    fn at(&self) -> Instant {
        self.dead_at.unwrap_or(self.command_start)
    }
}

/// Finds the leader, runs the kill command while watching the leader's port, and then watches for the next
/// leader (bounded by `args.after`).
///
/// The kill command may return well after the process died (a script that waits until the process is
/// reaped), so the moment of death is taken from the leader's client port instead: a process that is gone
/// no longer accepts connections.
async fn kill_and_watch(client: &Client, watcher: &Client, args: &FailoverArgs) -> anyhow::Result<Kill> {
    let status = client.discover_leader().await?.context("no node knows a leader: nothing to kill")?;
    let leader = status.id;
    note(format!("the leader is node {leader} (term {}) at {}; killing it", status.term, status.endpoint));
    let address = super::authority(&status.endpoint).to_owned();
    let command = args.kill.clone();
    let command_start = Instant::now();
    let mut killing = tokio::spawn(async move {
        let outcome = shell(&command, leader, KILL_TIMEOUT).await;
        (outcome, Instant::now())
    });
    // Until its port refuses a connection (or the command returned and the port still answers).
    let mut dead_at = None;
    let mut finished = None;
    while dead_at.is_none() && command_start.elapsed() < KILL_TIMEOUT {
        let connect = tokio::net::TcpStream::connect(&address);
        match tokio::time::timeout(Duration::from_millis(200), connect).await {
            Ok(Err(_)) => dead_at = Some(Instant::now()),
            Ok(Ok(_)) | Err(_) if finished.is_some() => break,
            Ok(Ok(_)) | Err(_) => {
                tokio::select! {
                    joined = &mut killing, if finished.is_none() => finished = Some(joined),
                    _ = tokio::time::sleep(Duration::from_millis(2)) => {}
                }
            }
        }
    }
    let kill_at = dead_at.unwrap_or(command_start);
    match dead_at {
        Some(at) => note(format!(
            "node {leader} stopped accepting connections {:.0} ms after the kill command started",
            ms(at - command_start)
        )),
        None => note(format!("node {leader} still accepts connections: counting from the kill command's start")),
    }
    // The next leader, while the command may still be finishing.
    let mut new_leader = None;
    let deadline = kill_at + args.after;
    while dead_at.is_some() && new_leader.is_none() && Instant::now() < deadline {
        if let Ok(Some(s)) = watcher.discover_leader().await {
            if s.id != leader {
                new_leader = Some((s.id, Instant::now()));
                note(format!("node {} leads (term {})", s.id, s.term));
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (outcome, command_end) = match finished {
        Some(joined) => joined?,
        None => killing.await?,
    };
    outcome.context("the kill command")?;
    Ok(Kill { leader, command_start, command_end, dead_at, new_leader })
}

async fn release_all(client: &Client, held: &[Hold]) {
    for hold in held {
        let _ = client.release(&hold.name, &hold.token).await;
    }
}
