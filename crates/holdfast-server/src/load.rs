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
//! A third measure is the sessions' own: each stream's client tells, with its heartbeats, how late it sees
//! them acknowledged ([`Load::client_late`]), which counts the waits no node measures (a heartbeat unread in
//! a busy node's socket).
//!
//! Past `--overload-delay`, either lag, or enough sessions' word, makes the node refuse what would add load
//! (new sessions, one-shot acquires) rather than let live sessions pay for it ([`Load::overloaded`]). The leader's keeper lets a
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
/// heartbeat lag. A follower counts a wait only while its leader serves it (`Router::waited_while_served`),
/// so an honest report is far shorter; a wrong one must not keep every session alive for long.
pub const WAIT_COUNTED_MAX: Duration = Duration::from_secs(60);
/// Sessions, at least, that must tell a node their heartbeats are late past `--overload-delay` within one
/// to two [`WINDOW`]s for the node to refuse new load on their word ([`Load::client_late`]).
pub const LATE_SESSIONS_MIN: usize = 32;
/// ... and the share of the sessions that told it anything, at least, in percent: one client, or a few,
/// cannot make a node refuse everybody.
pub const LATE_SESSIONS_PERCENT: usize = 1;
/// The default `--overload-delay`.
pub const OVERLOAD_DELAY_DEFAULT: Duration = Duration::from_millis(500);

/// A node's lag, and whether it is overloaded.
pub struct Load {
    runtime: Mutex<Windowed>,
    heartbeats: Mutex<Windowed>,
    clients: Mutex<Told>,
    /// Past this lag, the node refuses new load.
    overload_delay: Duration,
}

/// What was noted in the current [`WINDOW`] and the one before, each with its start: a measure counts for
/// one to two windows.
#[derive(Default)]
struct Windows<T>([(Option<Instant>, T); 2]);

impl<T: Default + Copy> Windows<T> {
    /// The current window as of `now`, started afresh (and the one before it kept) once `now` is past it.
    fn current(&mut self, now: Instant) -> &mut T {
        let [previous, current] = &mut self.0;
        match current.0 {
            Some(start) if now < start + WINDOW => {}
            Some(start) if now < start + 2 * WINDOW => {
                *previous = *current;
                *current = (Some(start + WINDOW), T::default());
            }
            _ => {
                *previous = (None, T::default());
                *current = (Some(now), T::default());
            }
        }
        &mut current.1
    }

    /// What was noted in the windows that started less than two windows before `now`.
    fn recent(&self, now: Instant) -> impl Iterator<Item = &T> {
        self.0.iter().filter(move |(start, _)| start.is_some_and(|start| now < start + 2 * WINDOW)).map(|(_, t)| t)
    }
}

/// The largest duration noted.
type Windowed = Windows<Duration>;

impl Windowed {
    /// Notes `took`, at `now`.
    fn note(&mut self, now: Instant, took: Duration) {
        let largest = self.current(now);
        *largest = (*largest).max(took);
    }

    /// The largest noted in a window that started less than two windows before `now`.
    fn largest(&self, now: Instant) -> Duration {
        self.recent(now).copied().max().unwrap_or_default()
    }
}

fn lock<T>(windowed: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    windowed.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What sessions told a node of their lateness in a window: how many told, how many of them were later
/// than the delay, and the latest of those.
type Told = Windows<(usize, usize, Duration)>;

impl Told {
    fn note(&mut self, now: Instant, late: Duration, delay: Duration) {
        let (told, late_count, latest) = self.current(now);
        *told += 1;
        if late > delay {
            *late_count += 1;
            *latest = (*latest).max(late);
        }
    }

    /// The latest a session told, if enough of them were late ([`LATE_SESSIONS_MIN`],
    /// [`LATE_SESSIONS_PERCENT`]) in the windows that started less than two windows before `now`.
    fn late(&self, now: Instant) -> Option<Duration> {
        let (told, late, latest) = self
            .recent(now)
            .fold((0, 0, Duration::ZERO), |(t, l, m), (told, late, latest)| (t + told, l + late, m.max(*latest)));
        (late >= LATE_SESSIONS_MIN && late * 100 >= told * LATE_SESSIONS_PERCENT).then_some(latest)
    }
}

impl Load {
    pub fn new(overload_delay: Duration) -> Self {
        Load { runtime: Mutex::default(), heartbeats: Mutex::default(), clients: Mutex::default(), overload_delay }
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

    /// A session's client sees its heartbeats `late`: the longer of how long its last acknowledged one took
    /// and how long its oldest unacknowledged one has waited, by its own clock (each stream tells this at
    /// most once a window). Heartbeats that wait before a node reads them, in its sockets, are in no lag
    /// the node measures; the sessions see them.
    pub fn client_late(&self, late: Duration) {
        lock(&self.clients).note(Instant::now(), late, self.overload_delay);
    }

    /// How late the sessions that told this node see their heartbeats, if enough of them are later than
    /// `--overload-delay` ([`LATE_SESSIONS_MIN`], [`LATE_SESSIONS_PERCENT`]): the latest told.
    pub fn sessions_late(&self) -> Option<Duration> {
        lock(&self.clients).late(Instant::now())
    }

    /// The larger lag, if it is past `--overload-delay`, or how late the sessions see their heartbeats, if
    /// enough of them are later than that ([`Load::sessions_late`]): the node refuses new load.
    pub fn overloaded(&self) -> Option<Duration> {
        let lag = Some(self.runtime_lag().max(self.heartbeat_lag())).filter(|lag| *lag > self.overload_delay);
        lag.max(self.sessions_late())
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

    #[tokio::test(start_paused = true)]
    async fn sessions_that_see_their_heartbeats_late_make_the_node_refuse_when_enough_of_them_do() {
        let delay = Duration::from_millis(500);
        let load = Load::new(delay);
        let (late, prompt) = (Duration::from_millis(900), Duration::from_millis(20));
        // One session, however late it says it is, is not enough.
        load.client_late(Duration::from_secs(30));
        assert_eq!(load.overloaded(), None);
        // Enough late sessions, but under the share of those that told: not enough either.
        let prompt_count = LATE_SESSIONS_MIN * 100 / LATE_SESSIONS_PERCENT + 100;
        for _ in 0..prompt_count {
            load.client_late(prompt);
        }
        for _ in 1..LATE_SESSIONS_MIN {
            load.client_late(late);
        }
        assert_eq!(load.overloaded(), None, "{} late of {prompt_count} prompt", LATE_SESSIONS_MIN);
        // Twice as many late, and the share is reached: the node refuses, saying how late the latest told.
        for _ in 0..LATE_SESSIONS_MIN {
            load.client_late(late);
        }
        assert_eq!(load.sessions_late(), Some(Duration::from_secs(30)));
        assert_eq!(load.overloaded(), Some(Duration::from_secs(30)));
        // Into the next window it still counts; two windows on, with only prompt sessions telling, it is over.
        tokio::time::advance(WINDOW).await;
        load.client_late(prompt);
        assert!(load.overloaded().is_some());
        tokio::time::advance(WINDOW * 2).await;
        load.client_late(prompt);
        assert_eq!(load.overloaded(), None);
        assert_eq!(load.expiry_grace(), Duration::ZERO, "what the sessions see does not stretch expiry");
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
