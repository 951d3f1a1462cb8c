//! How far behind this node is: the overload signal (docs/operations.md, "Overload"). A node with more
//! sessions than it can serve falls behind, its heartbeat confirmations grow late, and clients lose leases
//! they did nothing to lose. Two measures, each the largest seen in the last one to two [`WINDOW`]s:
//!
//! - the **runtime lag**: how late a task that sleeps [`PROBE_EVERY`] wakes up ([`Load::run_probe`]). A
//!   node whose threads are all busy reads what arrives that much late: a heartbeat waits in its socket.
//!   Network faults do not move it.
//! - the **heartbeat lag**, on the leader: how long it took to confirm a heartbeat, from the heartbeat's
//!   arrival at the node its session is attached to, to the quorum round that confirmed it. A follower
//!   reports how long its batch's oldest heartbeat waited there (`ForwardRequest::HeartbeatsWaited`), but
//!   only since its requests were last left unserved: waiting out a failover is not load.
//!
//! Past `--overload-delay`, either one makes the node refuse what would add load (new sessions, one-shot
//! acquires) rather than let live sessions pay for it ([`Load::overloaded`]). The leader's keeper lets a
//! session live the larger lag past its deadline ([`Load::expiry_grace`]): a heartbeat that reached a node in
//! time but waited to be read, or waited in a batch (`Router::heartbeat`, which counts a batch from its
//! oldest heartbeat's arrival), is not the reason the session ends.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How long a measure counts: from the window it was taken in to the end of the next.
pub const WINDOW: Duration = Duration::from_secs(1);
/// How often the runtime probe sleeps and wakes.
pub const PROBE_EVERY: Duration = Duration::from_millis(10);
/// A probe this late is logged.
pub const LATE_WARNING: Duration = Duration::from_millis(250);
/// How long a follower's heartbeats may have waited there, at most, as the leader counts it in its
/// heartbeat lag. A follower counts a wait only while its leader serves it (`Router::waited_with_a_leader`),
/// so an honest report is far shorter; a wrong one must not keep every session alive for long.
pub const WAIT_COUNTED_MAX: Duration = Duration::from_secs(60);
/// The default `--overload-delay`.
pub const OVERLOAD_DELAY_DEFAULT: Duration = Duration::from_millis(500);

/// A node's lag, and whether it is overloaded.
pub struct Load {
    runtime: Mutex<Windowed>,
    heartbeats: Mutex<Windowed>,
    /// Past this lag, the node refuses new load.
    overload_delay: Duration,
}

/// The largest of the durations noted in the current window and the one before: (window start, largest).
#[derive(Default)]
struct Windowed([(Option<Instant>, Duration); 2]);

impl Windowed {
    /// Notes `took`, at `now`.
    fn note(&mut self, now: Instant, took: Duration) {
        let [previous, current] = &mut self.0;
        match current.0 {
            Some(start) if now < start + WINDOW => current.1 = current.1.max(took),
            Some(start) if now < start + 2 * WINDOW => {
                *previous = *current;
                *current = (Some(start + WINDOW), took);
            }
            _ => {
                *previous = (None, Duration::ZERO);
                *current = (Some(now), took);
            }
        }
    }

    /// The largest noted in a window that started less than two windows before `now`.
    fn largest(&self, now: Instant) -> Duration {
        let recent = |(start, took): &(Option<Instant>, Duration)| match start {
            Some(start) if now < *start + 2 * WINDOW => *took,
            _ => Duration::ZERO,
        };
        recent(&self.0[0]).max(recent(&self.0[1]))
    }
}

fn lock(windowed: &Mutex<Windowed>) -> std::sync::MutexGuard<'_, Windowed> {
    windowed.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Load {
    pub fn new(overload_delay: Duration) -> Self {
        Load { runtime: Mutex::default(), heartbeats: Mutex::default(), overload_delay }
    }

    /// Wakes every [`PROBE_EVERY`] and notes how late, until `shutdown` changes.
    pub async fn run_probe(&self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        loop {
            let asleep = Instant::now();
            tokio::select! {
                _ = tokio::time::sleep(PROBE_EVERY) => {}
                _ = shutdown.changed() => return,
            }
            let now = Instant::now();
            let late = now.saturating_duration_since(asleep).saturating_sub(PROBE_EVERY);
            lock(&self.runtime).note(now, late);
            if late >= LATE_WARNING {
                // At most a few times a second: a probe this late wakes that much apart.
                tracing::warn!(late_ms = late.as_millis() as u64, "this node's tasks woke late: its threads were busy");
            }
        }
    }

    /// A heartbeat that reached this node (or the follower that passed it on) at `arrived` was confirmed now.
    pub fn confirmed(&self, arrived: Instant) {
        let now = Instant::now();
        lock(&self.heartbeats).note(now, now.saturating_duration_since(arrived));
    }

    /// How late this node's tasks wake ([`Load`]).
    pub fn runtime_lag(&self) -> Duration {
        lock(&self.runtime).largest(Instant::now())
    }

    /// How late this node, as leader, confirms heartbeats ([`Load`]).
    pub fn heartbeat_lag(&self) -> Duration {
        lock(&self.heartbeats).largest(Instant::now())
    }

    /// The larger lag, if it is past `--overload-delay`: the node refuses new load.
    pub fn overloaded(&self) -> Option<Duration> {
        Some(self.runtime_lag().max(self.heartbeat_lag())).filter(|lag| *lag > self.overload_delay)
    }

    /// What a client is told when new load is refused at `lag`: how late, and what to do.
    pub fn refusal(&self, lag: Duration) -> String {
        format!(
            "overloaded: this node runs {} ms behind with its sessions' heartbeats (over --overload-delay {} \
             ms); new sessions and acquires are refused until the sessions already here are served in time: \
             retry later, or elsewhere",
            lag.as_millis(),
            self.overload_delay.as_millis()
        )
    }

    /// How long past its deadline the leader's keeper lets a session live: the larger lag, how long a
    /// heartbeat that reached this node waited to be read, or to be extended and confirmed.
    pub fn expiry_grace(&self) -> Duration {
        self.runtime_lag().max(self.heartbeat_lag())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_lag_counts_for_one_to_two_windows() {
        let load = Load::new(Duration::from_millis(500));
        assert_eq!(load.overloaded(), None, "nothing yet");
        let arrived = Instant::now();
        tokio::time::advance(Duration::from_millis(300)).await;
        load.confirmed(arrived);
        assert_eq!((load.heartbeat_lag(), load.overloaded()), (Duration::from_millis(300), None));
        let arrived = Instant::now();
        tokio::time::advance(Duration::from_millis(600)).await;
        load.confirmed(arrived);
        assert_eq!(load.overloaded(), Some(Duration::from_millis(600)));
        assert_eq!(load.expiry_grace(), Duration::from_millis(600), "a heartbeat that waited is waited for");
        // Into the next window: the last one's largest still counts; a quick heartbeat does not hide it.
        tokio::time::advance(WINDOW).await;
        load.confirmed(Instant::now());
        assert_eq!(load.heartbeat_lag(), Duration::from_millis(600));
        // A window later, it is forgotten.
        tokio::time::advance(WINDOW).await;
        load.confirmed(Instant::now());
        assert_eq!((load.heartbeat_lag(), load.overloaded()), (Duration::ZERO, None));
        assert_eq!(load.expiry_grace(), Duration::ZERO, "nothing was late for two windows");
    }

    #[test]
    fn a_busy_runtime_is_seen_late_by_the_probe() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let load = std::sync::Arc::new(Load::new(Duration::from_millis(500)));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        runtime.block_on(async {
            let probe = tokio::spawn({
                let load = load.clone();
                async move { load.run_probe(stopped).await }
            });
            tokio::time::sleep(PROBE_EVERY * 3).await;
            // The only thread is busy for 700 ms: the probe wakes at least that late.
            std::thread::sleep(Duration::from_millis(700));
            tokio::time::sleep(PROBE_EVERY * 3).await;
            assert!(load.runtime_lag() >= Duration::from_millis(600), "{:?}", load.runtime_lag());
            assert!(load.overloaded().is_some() && load.expiry_grace() >= Duration::from_millis(600));
            stop.send(true).unwrap();
            probe.await.unwrap();
        });
    }
}
