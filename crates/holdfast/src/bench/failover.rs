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
use holdfast_client::{Client, ClientBuilder};
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

    let mut held = Vec::new();
    for i in 0..args.held {
        let name = format!("bench-{run_id:08x}-held-{i}");
        let hold =
            client.acquire(&name, args.held_ttl, Duration::ZERO).await.with_context(|| format!("acquiring {name}"))?;
        held.push(hold);
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
        held.len(),
        args.held_ttl,
        args.session_lease
    ));

    let started = Instant::now();
    let counters = Counters::shared();
    let probe = Arc::new(Mutex::new(Probe::default()));
    let stop = Arc::new(AtomicBool::new(false));
    // A hard bound on the prober, whatever happens to the rest.
    let hard_stop = started + args.warmup + KILL_TIMEOUT + args.after + Duration::from_secs(10);
    let progress_guard = progress(started, rate_line(counters.clone(), "cycles"));
    let prober_task = {
        let (counters, probe, stop) = (counters.clone(), probe.clone(), stop.clone());
        tokio::spawn(async move {
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
        })
    };

    tokio::time::sleep(args.warmup).await;
    let kill = match kill_and_watch(client, &watcher, &args).await {
        Ok(kill) => kill,
        Err(e) => {
            stop.store(true, Ordering::Relaxed);
            let _ = prober_task.await;
            release_all(client, &held).await;
            return Err(e);
        }
    };
    let (leader, kill_at) = (kill.leader, kill.at());
    tokio::time::sleep_until((kill_at.max(kill.command_end) + args.after).into()).await;
    stop.store(true, Ordering::Relaxed);
    let _ = prober_task.await;
    drop(progress_guard);

    // Every lock held before the fault must still be held, by the same grant.
    let mut kept = 0;
    let mut lost = Vec::new();
    for hold in &held {
        match client.get(&hold.name).await {
            Ok(Some(info)) if info.holder.as_ref().is_some_and(|h| h.fence == hold.fence) => kept += 1,
            Ok(info) => lost.push(format!("{}: {:?}", hold.name, info.and_then(|i| i.holder).map(|h| h.fence))),
            Err(e) => lost.push(format!("{}: {e}", hold.name)),
        }
    }
    release_all(client, &held).await;
    // The session's lock: its client must never have seen it lost (its token fires the moment a lease ran
    // out without an ack, and stays fired), and the cluster must show the same grant.
    let session_seen_lost = session_held.lost().is_cancelled() || session_held.is_lost();
    let session_lost = match client.get(&session_lock).await {
        Ok(Some(info)) if info.holder.as_ref().is_some_and(|h| h.fence == session_held.fence()) => None,
        Ok(info) => Some(format!("held by {:?}", info.and_then(|i| i.holder).map(|h| h.fence))),
        Err(e) => Some(e.to_string()),
    };
    let session_kept = !session_seen_lost && session_lost.is_none();
    let _ = session_held.release().await;
    let _ = session.close().await;

    let restart = match &args.restart {
        Some(command) => {
            let t = Instant::now();
            let outcome = shell(command, leader, RESTART_TIMEOUT).await;
            if let Err(e) = &outcome {
                note(format!("restart failed: {e:#}"));
            }
            Some((outcome.is_ok(), t.elapsed()))
        }
        None => None,
    };

    let probe = probe.lock().unwrap();
    let longest_gap = probe.cycles.windows(2).map(|w| w[1] - w[0]).max();
    // A grant answered after the old leader's port closed came from a new leader.
    let first_grant = probe.grants.iter().find(|&&g| g >= kill_at).map(|&g| g - kill_at);
    let new_leader = kill.new_leader;
    let command_ms = ms(kill.command_end - kill.command_start);
    let target = args.election_timeout.map(|e| e + Duration::from_millis(500));

    let mut report = Report::new("failover", format!("failover: leader (node {leader}) killed"));
    report.field("kind", "failover");
    report.field("killed_node", leader);
    report.field("kill_command_ms", command_ms);
    report.field("death_seen_after_command_start_ms", kill.dead_at.map(|d| ms(d - kill.command_start)));
    report.field("cycles", counters.done());
    report.field("errors", counters.errors());
    report.field("seconds", started.elapsed().as_secs_f64());
    report.field("longest_gap_ms", longest_gap.map(ms));
    report.field("first_grant_after_kill_ms", first_grant.map(ms));
    report.field("new_leader", new_leader.map(|(id, _)| id));
    report.field("new_leader_after_kill_ms", new_leader.map(|(_, at)| ms(at - kill_at)));
    report.field("election_timeout_ms", args.election_timeout.map(ms));
    report.field("target_ms", target.map(ms));
    report.field(
        "target_met",
        match (first_grant, target) {
            (Some(g), Some(t)) => json!(g <= t && lost.is_empty() && session_kept),
            _ => json!(null),
        },
    );
    report.field("held", held.len());
    report.field("held_kept", kept);
    report.field("held_all_kept", lost.is_empty());
    report.field("session_lease_ms", ms(args.session_lease));
    report.field("session_kept", session_kept);
    report.field("restarted", restart.map(|(ok, _)| ok));
    report.field("restart_ms", restart.map(|(_, t)| ms(t)));
    probe.latency.fields(&mut report, "cycle_");

    let or_none = |d: Option<Duration>| d.map_or("none".to_owned(), |d| format!("{:.0} ms", ms(d)));
    report.row(
        "killed",
        match kill.dead_at {
            Some(d) => format!(
                "node {leader}: its port closed {:.0} ms into the kill command ({command_ms:.0} ms in all)",
                ms(d - kill.command_start)
            ),
            None => format!("node {leader}: its port never closed; times count from the command ({command_ms:.0} ms)"),
        },
    );
    report.row(
        "new leader",
        new_leader
            .map_or("not seen".to_owned(), |(id, at)| format!("node {id}, {:.0} ms after the kill", ms(at - kill_at))),
    );
    report.row("first grant after the kill", or_none(first_grant));
    report.row("longest gap between cycles", or_none(longest_gap));
    report.row(
        "election timeout",
        match (args.election_timeout, target) {
            (Some(e), Some(t)) => format!("{:.0} ms (target: a grant within {:.0} ms)", ms(e), ms(t)),
            _ => "not given (--election-timeout)".into(),
        },
    );
    report.row(
        "locks held before the fault",
        match lost.is_empty() {
            true => format!("{kept} of {} still held, same fence", held.len()),
            false => format!("{kept} of {} still held; lost: {}", held.len(), lost.join(", ")),
        },
    );
    report.row(
        "a session's lock",
        match (session_seen_lost, &session_lost) {
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
            counters.done(),
            probe.release_not_holder,
            counters.errors(),
            probe.own_hold
        ),
    );
    report.field("granted_unanswered", probe.own_hold);
    report.field("released_not_holder", probe.release_not_holder);
    report.row("cycle latency", probe.latency.describe());
    for (at, e) in &probe.errors {
        let offset = at.saturating_duration_since(kill_at).as_secs_f64() * 1000.0
            - kill_at.saturating_duration_since(*at).as_secs_f64() * 1000.0;
        report.row("prober error", format!("{offset:+.0} ms from the kill: {e}"));
    }
    report.field(
        "prober_errors",
        json!(probe
            .errors
            .iter()
            .map(|(at, e)| {
                let offset = at.saturating_duration_since(kill_at).as_secs_f64() * 1000.0
                    - kill_at.saturating_duration_since(*at).as_secs_f64() * 1000.0;
                json!({"ms_from_kill": round3(offset), "error": e})
            })
            .collect::<Vec<_>>()),
    );
    if let Some((ok, t)) = restart {
        report.row("restart", format!("{} in {:.1} s", if ok { "ok" } else { "FAILED" }, t.as_secs_f64()));
    }
    Ok(report)
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

async fn release_all(client: &Client, held: &[holdfast_client::Hold]) {
    for hold in held {
        let _ = client.release(&hold.name, &hold.token).await;
    }
}
