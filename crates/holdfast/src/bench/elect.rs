//! `holdfast bench elect`: candidates spread over the nodes campaign in one election, and the gap between
//! leaders is timed; every fence must be higher than the one before. Two ways for a leader to go:
//!
//! - resigning (the default): each leader leads for `--hold`, then resigns and campaigns again at the back of
//!   the queue. The gap is from the resignation's send to the next leader's campaign returning (the new
//!   leader knows it leads). These candidates are tasks of this process.
//! - dying (`--kill-leaders`): the candidates are `holdfast elect` processes, and each leader is killed with
//!   SIGKILL a random time (up to `--kill-delay`) after an observer sees it, so its session goes silent and
//!   the cluster hands the election on only once the session's lease has run out. A new candidate takes the
//!   dead one's place. The gap is from the kill to the observer seeing the next leader.

use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast_client::{Client, ClientBuilder, Leader};
use tokio_stream::{Stream, StreamExt};

use super::{authority, ms, note, progress, round3, Counters, Report, Samples};

#[derive(clap::Args)]
pub struct ElectArgs {
    /// Candidates, spread evenly over the endpoints (candidate i on endpoint i mod N).
    #[arg(long, default_value_t = 3)]
    pub candidates: usize,
    /// How long to run (with --kill-leaders: no failover begins after it, unless --failovers is given).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Each candidate's session lease (with --kill-leaders, the candidates' --ttl).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub lease: Duration,
    /// How long a leader leads before it resigns.
    #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
    pub hold: Duration,
    /// Kill each leader instead of letting it resign: the candidates are `holdfast elect NAME -- sleep 3600`
    /// processes (this binary), each leader is sent SIGKILL shortly after it is seen (--kill-delay) and a new
    /// candidate takes its place; times the kill to the next leader seen. The candidates talk plain HTTP/2
    /// with no API key: not for a cluster with TLS or --auth.
    #[arg(long, conflicts_with = "hold")]
    pub kill_leaders: bool,
    /// With --kill-leaders: stop after this many failovers instead of after --duration.
    #[arg(long, requires = "kill_leaders")]
    pub failovers: Option<u64>,
    /// With --kill-leaders: each leader is killed a random time between 0 and this after it is seen
    /// (default: a quarter of the lease, one heartbeat interval, so that the kill falls anywhere between two
    /// of its heartbeats; 0: at once).
    #[arg(long, requires = "kill_leaders", value_parser = humantime::parse_duration)]
    pub kill_delay: Option<Duration>,
}

/// What happened, in order of the instants: a leadership begun (its fence), or a resignation sent.
#[derive(Clone, Copy)]
enum Event {
    Led(u64),
    Resigned,
}

/// The workload: leaders resigning, or with `--kill-leaders` dying.
pub async fn run(
    endpoints: &[String],
    builder: &ClientBuilder,
    run_id: u32,
    args: ElectArgs,
) -> anyhow::Result<Report> {
    if args.kill_leaders {
        return run_killing(endpoints, builder, run_id, args).await;
    }
    run_resigning(endpoints, builder, run_id, args).await
}

async fn run_resigning(
    endpoints: &[String],
    builder: &ClientBuilder,
    run_id: u32,
    args: ElectArgs,
) -> anyhow::Result<Report> {
    let name = format!("bench-{run_id:08x}-elect");
    let events: Arc<Mutex<Vec<(Instant, Event)>>> = Arc::default();
    let started = Instant::now();
    let deadline = started + args.duration;
    note(format!(
        "{} candidates campaign in {name} for {:?}, each leading {:?}",
        args.candidates, args.duration, args.hold
    ));
    let mut tasks = Vec::new();
    for i in 0..args.candidates {
        let client = builder.clone().with_endpoints([endpoints[i % endpoints.len()].clone()]).build()?;
        let (name, events, lease, hold) = (name.clone(), events.clone(), args.lease, args.hold);
        tasks.push(tokio::spawn(async move {
            let mut failures = 0u64;
            while Instant::now() < deadline {
                let campaign = client.campaign_with_lease(&name, lease, format!("candidate-{i}"));
                let leadership = match tokio::time::timeout_at(deadline.into(), campaign).await {
                    Ok(Ok(leadership)) => leadership,
                    Ok(Err(_)) => {
                        failures += 1;
                        continue;
                    }
                    Err(_) => break,
                };
                events.lock().expect("events").push((Instant::now(), Event::Led(leadership.fence())));
                tokio::time::sleep(hold).await;
                events.lock().expect("events").push((Instant::now(), Event::Resigned));
                if leadership.resign().await.is_err() {
                    failures += 1;
                }
            }
            failures
        }));
    }
    let mut failures = 0;
    for task in tasks {
        failures += task.await?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut events = std::mem::take(&mut *events.lock().expect("events"));
    events.sort_by_key(|(at, _)| *at);
    let (mut gaps, mut leaderships, mut out_of_order) = (Samples::default(), 0u64, 0u64);
    let (mut resigned_at, mut last_fence): (Option<Instant>, u64) = (None, 0);
    for (at, event) in events {
        match event {
            Event::Resigned => resigned_at = Some(at),
            Event::Led(fence) => {
                leaderships += 1;
                if fence <= last_fence {
                    out_of_order += 1;
                }
                last_fence = fence;
                if let Some(resigned) = resigned_at.take() {
                    gaps.push(at.saturating_duration_since(resigned));
                }
            }
        }
    }
    let mut report = Report::new("elect", format!("elect: {} candidates, {seconds:.1}s", args.candidates));
    report.field("candidates", args.candidates);
    report.field("seconds", seconds);
    report.field("leaderships", leaderships);
    report.field("leaderships_per_s", leaderships as f64 / seconds);
    report.field("fences_out_of_order", out_of_order);
    report.field("failures", failures);
    gaps.fields(&mut report, "gap_");
    report
        .row("leaderships", format!("{leaderships} ({:.0}/s, {failures} failed calls)", leaderships as f64 / seconds));
    report.row("resignation sent -> next leader knows", gaps.describe());
    report.row("fences not above the one before", out_of_order.to_string());
    Ok(report)
}

/// At most this many candidate processes at once.
const CANDIDATES_MAX: usize = 64;
/// At most this many failovers in one run.
const FAILOVERS_MAX: u64 = 10_000;
/// What the candidates run while they lead: something that only ends when killed.
const LEADER_COMMAND: [&str; 2] = ["sleep", "3600"];
/// How often, while waiting for a leader, candidates are checked for having exited by themselves.
const CHECK_EVERY: Duration = Duration::from_millis(100);
/// Besides the lease and the keeper's tick, what an expiry's hand-over takes to reach the observer: a quorum
/// round, one commit and a watch's delivery. A few ms on a quiet cluster (`holdfast bench watch`: p99 3-6
/// ms); 50 ms leaves room for a busy host.
const DELIVERY_ALLOWANCE: Duration = Duration::from_millis(50);

/// What a `--kill-leaders` run waits for, checked from its arguments.
struct KillPlan {
    lease: Duration,
    /// Each leader is killed a random time up to this after it is seen.
    kill_delay: Duration,
    /// How long a failover may take before the run calls it a hang.
    bound: Duration,
    keeper_tick: Duration,
    /// The gaps the cluster's guarantees lead one to expect.
    expected_min: Duration,
    expected_max: Duration,
}

impl KillPlan {
    fn new(endpoints: &[String], args: &ElectArgs) -> anyhow::Result<Self> {
        if !(1..=CANDIDATES_MAX).contains(&args.candidates) {
            anyhow::bail!("--kill-leaders runs 1 to {CANDIDATES_MAX} candidates, not {}", args.candidates);
        }
        if args.failovers.is_some_and(|n| !(1..=FAILOVERS_MAX).contains(&n)) {
            anyhow::bail!("--failovers must be 1 to {FAILOVERS_MAX}");
        }
        if endpoints.iter().any(|e| e.starts_with("https://")) {
            anyhow::bail!("--kill-leaders starts its candidates in plain HTTP/2: it does not pass TLS settings on");
        }
        let lease = args.lease;
        let (lease_ms_min, lease_ms_max) = (holdfast_server::limits::TTL_MS_MIN, holdfast_server::limits::TTL_MS_MAX);
        if !(lease_ms_min..=lease_ms_max).contains(&(lease.as_millis() as u64)) {
            anyhow::bail!("--lease must be {lease_ms_min} ms to {lease_ms_max} ms, as the cluster accepts");
        }
        let kill_delay = args.kill_delay.unwrap_or(lease / 4);
        if kill_delay > lease {
            anyhow::bail!("--kill-delay ({kill_delay:?}) must be at most the lease ({lease:?})");
        }
        // The cluster's side, by the guarantees: a session is expired a lease after the last heartbeat that
        // reached the leader; heartbeats go every lease/4, so that is 3/4 of a lease to a lease after the
        // kill, found by the keeper within a tick, then handed on and told to the observer.
        let keeper_tick = holdfast_server::leader::expiry::KEEPER_TICK;
        Ok(KillPlan {
            lease,
            kill_delay,
            // A dead leader is replaced a lease after its last heartbeat at the latest; four leases and 10 s
            // more cover a slow keeper, a leader change of the cluster's and a slow host.
            bound: lease * 4 + Duration::from_secs(10),
            keeper_tick,
            expected_min: lease * 3 / 4,
            expected_max: lease + keeper_tick + DELIVERY_ALLOWANCE,
        })
    }
}

impl KillPlan {
    /// What a run of this plan does, for its log.
    fn describe(&self, args: &ElectArgs, name: &str) -> String {
        let until = match args.failovers {
            Some(n) => format!("{n} failovers"),
            None => format!("failovers for {:?}", args.duration),
        };
        format!(
            "{} `holdfast elect` processes campaign in {name} with {:?} leases; each leader is killed up to {:?} \
             after it is seen ({until}, each bounded by {:?})",
            args.candidates, self.lease, self.kill_delay, self.bound
        )
    }
}

/// What the failovers of a `--kill-leaders` run showed.
#[derive(Default)]
struct Tally {
    gaps: Samples,
    gaps_ms: Vec<f64>,
    out_of_order: u64,
    /// Leaders replaced before this run killed them.
    unkilled: u64,
    within: u64,
    over: u64,
    last_fence: u64,
}

impl Tally {
    /// A leader seen under `fence`: it must be above the one before.
    fn led(&mut self, fence: u64) {
        self.out_of_order += u64::from(fence <= self.last_fence);
        self.last_fence = fence;
    }

    /// A gap from a kill to the next leader seen.
    fn gap(&mut self, gap: Duration, plan: &KillPlan) {
        self.gaps.push(gap);
        self.gaps_ms.push(ms(gap));
        self.within += u64::from(gap >= plan.expected_min && gap <= plan.expected_max);
        self.over += u64::from(gap > plan.expected_max);
    }

    fn report(self, plan: &KillPlan, candidates: usize, spawned: usize, seconds: f64, failovers: u64) -> Report {
        let (lease, gaps) = (plan.lease, &self.gaps);
        let fraction = |p: f64| gaps.percentile(p) / ms(lease);
        let title = format!("elect, leaders killed: {candidates} candidates, {lease:?} leases, {seconds:.1}s");
        let mut report = Report::new("elect", title);
        report.field("kill_leaders", true);
        report.field("kill_delay_max_ms", ms(plan.kill_delay));
        report.field("leaders_replaced_before_their_kill", self.unkilled);
        report.field("candidates", candidates);
        report.field("candidates_started", spawned);
        report.field("seconds", seconds);
        report.field("lease_ms", ms(lease));
        report.field("keeper_tick_ms", ms(plan.keeper_tick));
        report.field("expected_min_ms", ms(plan.expected_min));
        report.field("expected_max_ms", ms(plan.expected_max));
        report.field("failovers", failovers);
        report.field("fences_out_of_order", self.out_of_order);
        report.field("gaps_over_expected", self.over);
        report.field("gap_min_ms", round3(gaps.percentile(0.0)));
        gaps.fields(&mut report, "gap_");
        report.field("gaps_ms", self.gaps_ms.clone());
        let killed = format!("each leader killed 0-{:.0} ms after it was seen", ms(plan.kill_delay));
        report.row("failovers", format!("{failovers} ({spawned} candidate processes started; {killed})"));
        report.row("leader killed -> next leader seen", gaps.describe());
        let leases = [0.0, 0.5, 0.99, 1.0].map(fraction);
        let leases = format!("min {:.2}, p50 {:.2}, p99 {:.2}, max {:.2}", leases[0], leases[1], leases[2], leases[3]);
        report.row("the same, in leases", leases);
        report.row(
            "expected",
            format!(
                "{:.0}-{:.0} ms: 3/4 of a lease to a lease (heartbeats every lease/4), + the keeper's {:.0} ms \
                 tick, + {:.0} ms for a quorum round, a commit and the watch; {} of {failovers} within, {} over",
                ms(plan.expected_min),
                ms(lease),
                ms(plan.keeper_tick),
                ms(DELIVERY_ALLOWANCE),
                self.within,
                self.over,
            ),
        );
        report.row("fences not above the one before", self.out_of_order.to_string());
        report.row("leaders replaced before their kill", self.unkilled.to_string());
        report
    }
}

/// Leaders killed one after another: see the module's docs.
async fn run_killing(
    endpoints: &[String],
    builder: &ClientBuilder,
    run_id: u32,
    args: ElectArgs,
) -> anyhow::Result<Report> {
    let plan = KillPlan::new(endpoints, &args)?;
    let name = format!("bench-{run_id:08x}-elect-kill");
    let observer = builder.clone().build()?;
    let mut leaders = observer.observe(&name);
    let started = Instant::now();
    note(plan.describe(&args, &name));
    // Caught, so that an interrupted run still kills its candidates (they have sessions of their own, out of
    // reach of a terminal's Ctrl-C).
    let mut interrupts = Interrupts::install()?;
    let mut fleet = Fleet::new(std::env::current_exe()?, name.clone(), plan.lease, endpoints);
    for _ in 0..args.candidates {
        fleet.spawn()?;
    }
    let first_by = Instant::now() + plan.bound;
    let (mut seen_at, mut leader) =
        next_leader(&mut leaders, &mut fleet, &mut interrupts, first_by, "the first leader").await?;
    // Every candidate in the queue before the first kill, so that the first gap does not wait for one.
    let queue_by = Instant::now() + plan.bound;
    wait_for_queue(&observer, &name, args.candidates - 1, &mut fleet, &mut interrupts, queue_by).await?;

    let counters = Counters::shared();
    let progress_guard = {
        let counters = counters.clone();
        progress(started, move || format!("{:>6} failovers", counters.done()))
    };
    let random = holdfast_server::random::Random::new(None);
    let mut tally = Tally { last_fence: leader.fence, ..Tally::default() };
    loop {
        if enough(&args, &plan, started, counters.done())? {
            break;
        }
        let kill_by = Instant::now() + plan.kill_delay.mul_f64(random.draw::<f64>());
        let (at, next) = match leader_by(&mut leaders, &mut fleet, &mut interrupts, kill_by).await? {
            // Not a failover of this workload's making: a session that lost its lease (a starved host, a lease
            // shorter than the cluster's own failover). Counted, and the new leader is the next to die.
            Some((at, next)) => {
                tally.unkilled += 1;
                note(format!("fence {} was replaced before its kill by fence {}", leader.fence, next.fence));
                (at, next)
            }
            None => {
                let (killed_at, next_seen_at, next) =
                    failover(&mut leaders, &mut fleet, &mut interrupts, &plan, &leader).await?;
                let gap = next_seen_at.saturating_duration_since(killed_at);
                tally.gap(gap, &plan);
                counters.add_done();
                note(format!(
                    "failover {}: fence {} killed {:.1} ms after it was seen; fence {} seen {:.1} ms later",
                    counters.done(),
                    leader.fence,
                    ms(killed_at.saturating_duration_since(seen_at)),
                    next.fence,
                    ms(gap),
                ));
                (next_seen_at, next)
            }
        };
        tally.led(next.fence);
        (leader, seen_at) = (next, at);
    }
    drop(progress_guard);
    let seconds = started.elapsed().as_secs_f64();
    let spawned = fleet.spawned;
    // Every candidate, and the command of any that was leading, killed now rather than a lease later.
    drop(fleet);
    Ok(tally.report(&plan, args.candidates, spawned, seconds, counters.done()))
}

/// Whether a `--kill-leaders` run has made `done` failovers enough (or run its `--duration`); an error if
/// it is behind what its bound allows.
fn enough(args: &ElectArgs, plan: &KillPlan, started: Instant, done: u64) -> anyhow::Result<bool> {
    Ok(match args.failovers {
        Some(n) if done < n && Instant::now() >= started + plan.bound.saturating_mul(n as u32 + 1) => {
            anyhow::bail!("{done} of {n} failovers in {:?}", started.elapsed())
        }
        Some(n) => done >= n,
        None => Instant::now() >= started + args.duration,
    } || done >= FAILOVERS_MAX)
}

/// Kills `leader`'s process, starts a candidate in its place, and waits for the next leader: answers when
/// the kill was sent, when the next leader was seen, and that leader.
async fn failover(
    leaders: &mut (impl Stream<Item = Result<Option<Leader>, holdfast_client::Error>> + Unpin),
    fleet: &mut Fleet,
    interrupts: &mut Interrupts,
    plan: &KillPlan,
    leader: &Leader,
) -> anyhow::Result<(Instant, Instant, Leader)> {
    let value = String::from_utf8_lossy(&leader.value).into_owned();
    let killed_at = fleet.kill(&value)?;
    fleet.spawn()?;
    let what = format!("a leader after {value} (fence {}) was killed", leader.fence);
    let (seen_at, next) = next_leader(leaders, fleet, interrupts, killed_at + plan.bound, &what).await?;
    Ok((killed_at, seen_at, next))
}

/// The next leader the observer sees (skipping "nobody leads"), and the instant it was seen. An error if
/// `deadline` passes first, if the observation fails, or if a candidate exits by itself meanwhile.
async fn next_leader(
    leaders: &mut (impl Stream<Item = Result<Option<Leader>, holdfast_client::Error>> + Unpin),
    fleet: &mut Fleet,
    interrupts: &mut Interrupts,
    deadline: Instant,
    what: &str,
) -> anyhow::Result<(Instant, Leader)> {
    let next = leader_by(leaders, fleet, interrupts, deadline).await?;
    next.ok_or_else(|| anyhow::anyhow!("no leader seen within the bound: waiting for {what}"))
}

/// The next leader the observer sees before `deadline`, and the instant it was seen; `None` if it sees none
/// by then. An error if the observation fails, a candidate exits by itself or this process is interrupted
/// meanwhile.
async fn leader_by(
    leaders: &mut (impl Stream<Item = Result<Option<Leader>, holdfast_client::Error>> + Unpin),
    fleet: &mut Fleet,
    interrupts: &mut Interrupts,
    deadline: Instant,
) -> anyhow::Result<Option<(Instant, Leader)>> {
    let mut check = tokio::time::interval(CHECK_EVERY);
    loop {
        tokio::select! {
            next = leaders.next() => match next {
                Some(Ok(Some(leader))) => return Ok(Some((Instant::now(), leader))),
                Some(Ok(None)) => {}
                Some(Err(e)) => anyhow::bail!("observing the election: {e}"),
                None => anyhow::bail!("the observation of the election ended"),
            },
            _ = tokio::time::sleep_until(deadline.into()) => return Ok(None),
            _ = check.tick() => fleet.check()?,
            signal = interrupts.recv() => anyhow::bail!("interrupted ({signal})"),
        }
    }
}

/// Waits until `waiters` candidates are queued behind the leader of `name` (or `deadline`).
async fn wait_for_queue(
    observer: &Client,
    name: &str,
    waiters: usize,
    fleet: &mut Fleet,
    interrupts: &mut Interrupts,
    deadline: Instant,
) -> anyhow::Result<()> {
    loop {
        let queued = observer.get(name).await?.map_or(0, |lock| lock.waiters.len());
        if queued >= waiters {
            return Ok(());
        }
        if Instant::now() >= deadline {
            anyhow::bail!("only {queued} of {waiters} candidates queued in {name} within the bound");
        }
        fleet.check()?;
        tokio::select! {
            _ = tokio::time::sleep(CHECK_EVERY) => {}
            signal = interrupts.recv() => anyhow::bail!("interrupted ({signal})"),
        }
    }
}

/// SIGINT and SIGTERM, caught while candidates run.
struct Interrupts {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Interrupts {
    fn install() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Interrupts { int: signal(SignalKind::interrupt())?, term: signal(SignalKind::terminate())? })
    }

    /// The next signal's name.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
        }
    }
}

/// The candidate processes, by the value each publishes. Dropping it kills them all, with whatever command
/// a leader among them runs, and reaps them: on every way out of the workload.
struct Fleet {
    exe: std::path::PathBuf,
    name: String,
    lease: Duration,
    /// `host:port` of each endpoint: candidate i campaigns through endpoint i mod N.
    endpoints: Vec<String>,
    /// Candidates started so far; the next is `candidate-{spawned}`.
    spawned: usize,
    live: Vec<(String, Child)>,
    /// Killed, not yet reaped.
    dead: Vec<Child>,
}

impl Fleet {
    fn new(exe: std::path::PathBuf, name: String, lease: Duration, endpoints: &[String]) -> Self {
        let endpoints = endpoints.iter().map(|e| authority(e).to_owned()).collect();
        Fleet { exe, name, lease, endpoints, spawned: 0, live: Vec::new(), dead: Vec::new() }
    }

    /// Starts the next candidate: `holdfast elect NAME --value candidate-i --ttl LEASE --endpoints E --
    /// sleep 3600`, with none of this process's `HOLDFAST_*` settings, in a session of its own.
    fn spawn(&mut self) -> anyhow::Result<()> {
        let i = self.spawned;
        let value = format!("candidate-{i}");
        let mut command = std::process::Command::new(&self.exe);
        command
            .arg("elect")
            .arg(&self.name)
            .args(["--value", &value])
            .args(["--ttl", &humantime::format_duration(self.lease).to_string()])
            .args(["--endpoints", &self.endpoints[i % self.endpoints.len()]])
            .arg("--")
            .args(LEADER_COMMAND)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HOLDFAST_") {
                command.env_remove(key);
            }
        }
        // `holdfast elect` runs its command in a process group of its own, so a kill of the candidate's
        // group would leave a leader's `sleep` behind; in a session of the candidate's own, the command is
        // found by its session (see `kill_session`).
        in_own_session(&mut command);
        let child = command.spawn().map_err(|e| anyhow::anyhow!("starting {}: {e}", self.exe.display()))?;
        self.spawned += 1;
        self.live.push((value, child));
        Ok(())
    }

    /// Kills the candidate publishing `value` (SIGKILL), then the command it ran as leader; answers the
    /// instant the kill was sent.
    fn kill(&mut self, value: &str) -> anyhow::Result<Instant> {
        let at = self.live.iter().position(|(v, _)| v == value);
        let Some(at) = at else { anyhow::bail!("the leader {value:?} is not one of this run's candidates") };
        let (_, mut child) = self.live.swap_remove(at);
        child.kill()?;
        let killed_at = Instant::now();
        // Its command, if it started one. After the kill, which a fork under way either finishes before or
        // fails on, so nothing joins the session once it was looked over; and before the candidate is reaped,
        // so its pid (the session's id) cannot have been given to another process.
        kill_session(child.id());
        self.dead.push(child);
        Ok(killed_at)
    }

    /// An error if a live candidate has exited by itself (it could not reach the cluster, say); reaps the
    /// killed ones that are gone.
    fn check(&mut self) -> anyhow::Result<()> {
        self.dead.retain_mut(|child| !matches!(child.try_wait(), Ok(Some(_))));
        for (value, child) in &mut self.live {
            if let Some(status) = child.try_wait()? {
                anyhow::bail!(
                    "{value} exited by itself ({status}): its error is above (--kill-leaders candidates speak \
                     plain HTTP/2 with no API key)"
                );
            }
        }
        Ok(())
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for (_, child) in &mut self.live {
            // The candidate first, so that it starts no command after its session was looked over (see
            // `Fleet::kill`).
            let _ = child.kill();
            kill_session(child.id());
        }
        for child in self.live.iter_mut().map(|(_, child)| child).chain(&mut self.dead) {
            let _ = child.wait();
        }
    }
}

/// Makes `command` start a session of its own (its session id is then its pid), and die with SIGKILL if
/// the thread that started it ends (this process killed, say, so that no `Drop` ran).
fn in_own_session(command: &mut std::process::Command) {
    // SAFETY: setsid and prctl are async-signal-safe and touch no memory of the parent's.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() == -1 || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Sends SIGKILL to every process of session `sid` (a candidate, and the command `holdfast elect` started
/// in a process group of its own), found in `/proc`.
fn kill_session(sid: u32) {
    let Ok(processes) = std::fs::read_dir("/proc") else { return };
    for entry in processes.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else { continue };
        if session_of(pid) == Some(sid) {
            // SAFETY: kill has no memory-safety preconditions; a process gone meanwhile makes it fail (ESRCH).
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// The session id of process `pid`, from `/proc/PID/stat`.
fn session_of(pid: i32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the session (field 6) counts from after it.
    stat[stat.rfind(')')? + 1..].split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_session_is_read_from_proc() {
        // SAFETY: getsid has no memory-safety preconditions.
        let sid = unsafe { libc::getsid(0) };
        assert_eq!(session_of(std::process::id() as i32), u32::try_from(sid).ok());
        assert_eq!(session_of(-1), None);
    }

    /// The live processes of session `sid`, from `/proc` (a zombie is dead, whenever it is reaped).
    fn members(sid: u32) -> Vec<i32> {
        let zombie = |pid: i32| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        };
        let processes = std::fs::read_dir("/proc").expect("/proc");
        let pids = processes.flatten().filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok());
        pids.filter(|&pid| session_of(pid) == Some(sid) && !zombie(pid)).collect()
    }

    #[test]
    fn killing_a_candidates_session_kills_what_it_started() {
        let mut command = std::process::Command::new("sh");
        command.args(["-c", "sleep 60 & wait"]).stdin(Stdio::null());
        in_own_session(&mut command);
        let mut child = command.spawn().expect("sh");
        let sid = child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        // The shell and its sleep.
        while members(sid).len() < 2 {
            assert!(Instant::now() < deadline, "the shell's sleep never started");
            std::thread::sleep(Duration::from_millis(5));
        }
        kill_session(sid);
        let status = child.wait().expect("wait");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
        // The orphaned sleep dies a moment later, if not yet.
        while !members(sid).is_empty() {
            assert!(Instant::now() < deadline, "the sleep survived its session's kill");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
