//! `uncontended`, `contended` and `reads`: cycles, hand-overs or answers in a loop for a duration.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast_client::{Client, Error};

use super::{entry_commands, progress, rate_line, Counters, CpuWindow, ProgressGuard, Report, Samples};

/// Each client acquires and releases its own lock with one-shot calls until `duration` is over.
pub async fn uncontended(client: &Client, run_id: u32, clients: usize, duration: Duration) -> Report {
    let proposed_before = entry_commands(client).await;
    let window = Window::start(duration, "cycles");
    let (counters, deadline) = (window.counters.clone(), window.deadline);
    let mut tasks = Vec::new();
    for i in 0..clients {
        let (client, counters) = (client.clone(), counters.clone());
        tasks.push(tokio::spawn(async move {
            let mut samples = Samples::default();
            let name = format!("bench-{run_id:08x}-{i}");
            while Instant::now() < deadline {
                let t = Instant::now();
                let cycle = async {
                    let hold = client.acquire(&name, Duration::from_secs(30), Duration::ZERO).await?;
                    client.release(&name, &hold.token).await
                };
                match cycle.await {
                    Ok(_) => {
                        samples.push(t.elapsed());
                        counters.add_done();
                    }
                    Err(_) => counters.add_error(),
                }
            }
            samples
        }));
    }
    let mut samples = Samples::default();
    for task in tasks {
        if let Ok(s) = task.await {
            samples.extend(s);
        }
    }
    let mut report = finish("uncontended", "uncontended acquire+release", "cycles/s", clients, &window, &samples);
    // How many client commands each log entry carried (the leader batches one-lock commands that queue up).
    match (proposed_before, entry_commands(client).await) {
        (Some((commands_before, entries_before)), Some((commands, entries))) if entries > entries_before => {
            let (commands, entries) = (commands - commands_before, entries - entries_before);
            report.field("entries", entries);
            report.field("commands_per_entry", commands / entries);
            report.row(
                "batching",
                format!("{commands:.0} commands in {entries:.0} log entries, {:.1} per entry", commands / entries),
            );
        }
        _ => report.row("batching", "unknown (no /metrics answered)"),
    }
    report
}

/// Every client's session wants one lock and lets go as soon as it holds it, until `duration` is over.
pub async fn contended(client: &Client, run_id: u32, clients: usize, duration: Duration) -> Report {
    let name = format!("bench-{run_id:08x}-contended");
    let opened = futures_util::future::join_all((0..clients).map(|_| open_session(client))).await;
    let window = Window::start(duration, "hand-overs");
    let (counters, deadline) = (window.counters.clone(), window.deadline);
    let handoffs = Arc::new(HandOffs::default());
    let mut tasks = Vec::new();
    for session in opened {
        let Some(session) = session else {
            counters.add_error();
            continue;
        };
        let (counters, handoffs, name) = (counters.clone(), handoffs.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let wait = deadline.saturating_duration_since(Instant::now());
                let Ok(held) = session.lock(name.clone(), Some(wait)).await else { break };
                handoffs.granted(&counters);
                handoffs.releasing();
                if held.release().await.is_err() {
                    counters.add_error();
                }
            }
            let _ = session.close().await;
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let samples = handoffs.samples();
    finish("contended", "contended hand-over", "handovers/s", clients, &window, &samples)
}

/// How long a session's opening is retried while a node refuses it as overloaded.
const OPEN_RETRIED_FOR: Duration = Duration::from_secs(10);

/// A session with a 5 s lease, opened before the run's window. A node refuses new sessions for a second
/// or two after its workers were busy (`--overload-busy`), as they are after the workload before: the
/// opening is retried then, as a client of a busy cluster would, and any other failure is told on stderr.
async fn open_session(client: &Client) -> Option<holdfast_client::Session> {
    let give_up = Instant::now() + OPEN_RETRIED_FOR;
    loop {
        match client.session(Duration::from_secs(5)).await {
            Ok(session) => return Some(session),
            Err(Error::Overloaded(_)) if Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => {
                super::note(format!("could not open a session: {e}"));
                return None;
            }
        }
    }
}

/// Every client asks about one lock that another client holds, in a loop until `duration` is over: with
/// `get` or, `busy`, with one-shot acquires that find it held (a fleet woken together, all but one too
/// late). Each answer is the leader's, confirmed with a quorum: answers/s and latency.
pub async fn reads(
    client: &Client,
    run_id: u32,
    clients: usize,
    duration: Duration,
    busy: bool,
) -> anyhow::Result<Report> {
    let name = format!("bench-{run_id:08x}-read");
    let hold = client.acquire(&name, duration + Duration::from_secs(30), Duration::ZERO).await?;
    let window = Window::start(duration, "answers");
    let (counters, deadline) = (window.counters.clone(), window.deadline);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (client, counters, name) = (client.clone(), counters.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            let mut samples = Samples::default();
            while Instant::now() < deadline {
                let t = Instant::now();
                // The answer must name the lock held: anything else is counted as an error.
                let held = if busy {
                    matches!(
                        client.acquire(&name, Duration::from_secs(30), Duration::ZERO).await,
                        Err(Error::Busy { .. })
                    )
                } else {
                    matches!(client.get(&name).await, Ok(Some(_)))
                };
                if held {
                    samples.push(t.elapsed());
                    counters.add_done();
                } else {
                    counters.add_error();
                }
            }
            samples
        }));
    }
    let mut samples = Samples::default();
    for task in tasks {
        if let Ok(s) = task.await {
            samples.extend(s);
        }
    }
    let _ = client.release(&name, &hold.token).await;
    let (kind, what) = if busy { ("busy", "one-shot acquire of a held lock") } else { ("reads", "get of a held lock") };
    Ok(finish(kind, what, "answers/s", clients, &window, &samples))
}

pub(super) fn finish(kind: &str, what: &str, unit: &str, clients: usize, window: &Window, samples: &Samples) -> Report {
    let counters = &window.counters;
    let elapsed = window.started.elapsed().as_secs_f64();
    let ops = counters.done();
    let rate = ops as f64 / elapsed;
    let mut report = Report::new(what, format!("{what}: {clients} clients, {elapsed:.1}s"));
    report.field("kind", kind);
    report.field("clients", clients);
    report.field("seconds", elapsed);
    report.field("ops", ops);
    report.field("rate_per_s", rate);
    report.field("errors", counters.errors());
    samples.fields(&mut report, "");
    report.row("rate", format!("{rate:.0} {unit}"));
    report.row("done", format!("{ops}"));
    report.row("errors", format!("{}", counters.errors()));
    report.row("latency", samples.describe());
    // The generator's own CPU, so that its cost is seen beside the nodes': it shares their cores.
    let (_, used) = window.cpu.finish();
    if let Some((seconds, cores)) = used.last().and_then(|own| own.seconds.zip(own.cores)) {
        let per_op_us = (ops > 0).then(|| seconds * 1e6 / ops as f64);
        report.field("bench_cpu_cores", cores);
        report.field("bench_cpu_us_per_op", per_op_us);
        let per_op = per_op_us.map_or_else(String::new, |us| format!(", {us:.0} µs per operation"));
        report.row("generator CPU", format!("{cores:.2} cores{per_op}"));
    }
    report
}

/// The hand-overs of one contended lock, as its clients see them: when the last holder sent its release,
/// and how long after it each next holder learned of its grant.
#[derive(Default)]
pub(super) struct HandOffs {
    released_at: Mutex<Option<Instant>>,
    samples: Mutex<Samples>,
}

impl HandOffs {
    /// A client was granted the lock: a hand-over, if a holder had released it before.
    pub(super) fn granted(&self, counters: &Counters) {
        if let Some(released_at) = self.released_at.lock().unwrap().take() {
            self.samples.lock().unwrap().push(released_at.elapsed());
            counters.add_done();
        }
    }

    /// The holder sends its release now.
    pub(super) fn releasing(&self) {
        *self.released_at.lock().unwrap() = Some(Instant::now());
    }

    pub(super) fn samples(&self) -> Samples {
        self.samples.lock().unwrap().clone()
    }
}

/// A loop's run: when it started and ends, what its clients counted (shown as `unit`s a second while it
/// runs), and the generator's own CPU since it started.
pub(super) struct Window {
    pub(super) started: Instant,
    pub(super) deadline: Instant,
    pub(super) counters: Arc<Counters>,
    cpu: CpuWindow,
    _progress: ProgressGuard,
}

impl Window {
    pub(super) fn start(duration: Duration, unit: &'static str) -> Window {
        let (started, counters) = (Instant::now(), Counters::shared());
        let progress = progress(started, rate_line(counters.clone(), unit));
        Window { started, deadline: started + duration, counters, cpu: CpuWindow::start(&[]), _progress: progress }
    }
}
