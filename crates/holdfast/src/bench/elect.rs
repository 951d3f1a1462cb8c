//! `holdfast bench elect`: candidates spread over the nodes campaign in one election; each leader leads for
//! `--hold`, then resigns and campaigns again at the back of the queue. The gap between leaders is the time
//! from a leader sending its resignation to the next leader's campaign returning (the new leader knows it
//! leads); every fence must be higher than the one before.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast_client::ClientBuilder;

use super::{note, Report, Samples};

#[derive(clap::Args)]
pub struct ElectArgs {
    /// Candidates, spread evenly over the endpoints (candidate i on endpoint i mod N).
    #[arg(long, default_value_t = 3)]
    pub candidates: usize,
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Each candidate's session lease.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub lease: Duration,
    /// How long a leader leads before it resigns.
    #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
    pub hold: Duration,
}

/// What happened, in order of the instants: a leadership begun (its fence), or a resignation sent.
#[derive(Clone, Copy)]
enum Event {
    Led(u64),
    Resigned,
}

pub async fn run(
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
