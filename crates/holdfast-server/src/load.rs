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
//! (new sessions, one-shot acquires) rather than let live sessions pay for it ([`Load::overloaded`]); once
//! refusing, it goes on until every measure is back under half the delay, so that it does not admit again
//! the moment the lag dips under the delay and sit at the edge of what it can serve. The leader's keeper
//! lets a session live the larger lag past its deadline ([`Load::expiry_grace`]): a heartbeat that reached
//! a node in time but waited to be read, or waited in a batch (`Router::heartbeat`, which counts a batch
//! from its oldest heartbeat's arrival), is not the reason the session ends. A follower counts its own
//! runtime lag in the wait it reports, as the time its heartbeats may have waited to be read there.

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
    /// How busy the runtime's worker threads were, in thousandths of their time, over the last two
    /// [`WINDOW`]s looked at, each with when it was looked at (the older first).
    busy: Mutex<[(Option<Instant>, u32); 2]>,
    /// Past this busy share, in thousandths, in either of the last two windows, the node refuses new
    /// sessions (`--overload-busy`; 1000 never).
    busy_limit: u32,
    heartbeats: Mutex<Windowed>,
    clients: Mutex<Told>,
    /// Past this lag, the node refuses new load.
    overload_delay: Duration,
    /// Whether the node refused new load when it last looked ([`Load::overloaded`]): then it goes on
    /// refusing until every measure is back under half the delay.
    refusing: std::sync::atomic::AtomicBool,
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
/// than the delay and than half of it, and the latest told.
type Told = Windows<Tally>;

#[derive(Default, Clone, Copy)]
struct Tally {
    told: usize,
    past_delay: usize,
    past_half: usize,
    latest: Duration,
}

impl Told {
    fn note(&mut self, now: Instant, late: Duration, delay: Duration) {
        let tally = self.current(now);
        tally.told += 1;
        tally.past_delay += usize::from(late > delay);
        tally.past_half += usize::from(late > delay / 2);
        tally.latest = tally.latest.max(late);
    }

    /// The latest a session told, if enough of them were later than the delay (or than half of it, with
    /// `half`) in the windows that started less than two windows before `now` ([`LATE_SESSIONS_MIN`],
    /// [`LATE_SESSIONS_PERCENT`]).
    fn late(&self, now: Instant, half: bool) -> Option<Duration> {
        let sum = self.recent(now).fold(Tally::default(), |sum, tally| Tally {
            told: sum.told + tally.told,
            past_delay: sum.past_delay + tally.past_delay,
            past_half: sum.past_half + tally.past_half,
            latest: sum.latest.max(tally.latest),
        });
        let late = if half { sum.past_half } else { sum.past_delay };
        (late >= LATE_SESSIONS_MIN && late * 100 >= sum.told * LATE_SESSIONS_PERCENT).then_some(sum.latest)
    }
}

impl Load {
    /// A node's load, refusing new load past `overload_delay` and new sessions past `overload_busy` (a
    /// share of the workers' time, 1 never).
    pub fn new(overload_delay: Duration, overload_busy: f64) -> Self {
        Load {
            runtime: Mutex::default(),
            busy: Mutex::default(),
            busy_limit: (overload_busy.clamp(0.0, 1.0) * 1000.0).round() as u32,
            heartbeats: Mutex::default(),
            clients: Mutex::default(),
            overload_delay,
            refusing: Default::default(),
        }
    }

    /// Wakes every [`PROBE_EVERY`] and notes how late, and once a [`WINDOW`] how busy the runtime's
    /// workers were, until `shutdown` changes.
    pub async fn run_probe(&self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut busy = Busy::new();
        loop {
            let asleep = Instant::now();
            tokio::select! {
                _ = tokio::time::sleep(PROBE_EVERY) => {}
                _ = shutdown.changed() => return,
            }
            let now = Instant::now();
            let late = now.saturating_duration_since(asleep).saturating_sub(PROBE_EVERY);
            lock(&self.runtime).note(now, late);
            if let Some(permille) = busy.look() {
                let mut looks = lock(&self.busy);
                *looks = [looks[1], (Some(now), permille)];
            }
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

    /// How busy this node's runtime workers were, in thousandths of their time: the larger of the last
    /// two [`WINDOW`]s looked at. A worker counts as busy from when it wakes to when it parks, including
    /// time it was runnable but not given a CPU (a CPU quota, a shared host).
    pub fn busy_permille(&self) -> u32 {
        let looks = *lock(&self.busy);
        looks
            .iter()
            .filter(|(at, _)| at.is_some_and(|at| at.elapsed() < 3 * WINDOW))
            .map(|(_, b)| *b)
            .max()
            .unwrap_or(0)
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
        lock(&self.clients).late(Instant::now(), false)
    }

    /// Whether the node refuses new load, and if so how late it runs: the larger lag, if it is past
    /// `--overload-delay`, or how late the sessions see their heartbeats, if enough of them are later than
    /// that ([`Load::sessions_late`]). Once refusing, the node goes on until each measure is back under
    /// half the delay: near its capacity the lag rises within a second, and a node that admitted again as
    /// soon as it dipped under the delay would sit at the edge, where a burst costs live sessions.
    pub fn overloaded(&self) -> Option<Duration> {
        use std::sync::atomic::Ordering::Relaxed;
        let refusing = self.refusing.load(Relaxed);
        let level = if refusing { self.overload_delay / 2 } else { self.overload_delay };
        let lag = Some(self.runtime_lag().max(self.heartbeat_lag())).filter(|lag| *lag > level);
        let overloaded = lag.max(lock(&self.clients).late(Instant::now(), refusing));
        if overloaded.is_some() != refusing {
            self.refusing.store(overloaded.is_some(), Relaxed);
        }
        overloaded
    }

    /// Why a new session is refused, if it is: what [`Load::overloaded`] refuses, and besides, while the
    /// node's workers were busier than `--overload-busy` in either of the last two windows. A session is
    /// load that stays, a heartbeat every quarter of its lease: a node admits one only while it has room to
    /// spare, not until its lag shows it has none, because the lag rises only once the node is past its
    /// capacity, and the sessions admitted by then stay past it. A one-shot acquire is load that passes,
    /// refused on the lag alone.
    pub fn refuses_session(&self) -> Option<String> {
        if let Some(refused) = self.refuses_acquire() {
            return Some(refused);
        }
        let busy = self.busy_permille();
        (busy > self.busy_limit).then(|| {
            format!(
                "overloaded: this node's workers were busy {} % of a recent second (over --overload-busy {} %); \
                 new sessions are refused while it has no room for their heartbeats: retry later, or \
                 elsewhere",
                busy / 10,
                self.busy_limit / 10
            )
        })
    }

    /// Why a new one-shot acquire is refused, if it is: what [`Load::overloaded`] refuses.
    pub fn refuses_acquire(&self) -> Option<String> {
        self.overloaded().map(|lag| self.refusal(lag))
    }

    /// What a client is told when new load is refused at `lag`: how late, and what to do.
    pub fn refusal(&self, lag: Duration) -> String {
        format!(
            "overloaded: this node runs {} ms behind with its sessions' heartbeats (refused past \
             --overload-delay {} ms, until back under half of it); new sessions and acquires are refused until \
             the sessions already here are served in time: retry later, or elsewhere",
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

/// The runtime's workers' busy time, looked at once a [`WINDOW`] of real time.
struct Busy {
    metrics: tokio::runtime::RuntimeMetrics,
    since: std::time::Instant,
    total: Duration,
}

impl Busy {
    fn new() -> Self {
        let metrics = tokio::runtime::Handle::current().metrics();
        let total = Busy::total(&metrics);
        Busy { metrics, since: std::time::Instant::now(), total }
    }

    fn total(metrics: &tokio::runtime::RuntimeMetrics) -> Duration {
        (0..metrics.num_workers()).map(|worker| metrics.worker_total_busy_duration(worker)).sum()
    }

    /// The workers' busy share since the last look, in thousandths, once a [`WINDOW`] has passed.
    fn look(&mut self) -> Option<u32> {
        let elapsed = self.since.elapsed();
        if elapsed < WINDOW {
            return None;
        }
        let total = Busy::total(&self.metrics);
        let busy = total.saturating_sub(self.total);
        let workers = u32::try_from(self.metrics.num_workers()).unwrap_or(u32::MAX).max(1);
        (self.since, self.total) = (std::time::Instant::now(), total);
        Some((busy.as_secs_f64() * 1000.0 / (elapsed.as_secs_f64() * f64::from(workers))).min(1000.0) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_lag_counts_for_one_to_two_windows() {
        let load = Load::new(Duration::from_millis(500), 0.9);
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
        let load = Load::new(delay, 0.9);
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

    #[tokio::test(start_paused = true)]
    async fn a_node_busier_than_its_limit_refuses_sessions_but_not_one_shot_acquires() {
        let load = Load::new(Duration::from_millis(500), 0.9);
        let look = |permille: u32| {
            let mut looks = lock(&load.busy);
            *looks = [looks[1], (Some(Instant::now()), permille)];
        };
        look(850);
        assert_eq!(load.refuses_session(), None, "85 % busy: room to spare");
        tokio::time::advance(WINDOW).await;
        look(950);
        let refused = load.refuses_session().expect("95 % busy: no room for more sessions");
        assert!(refused.contains("busy 95 %") && refused.contains("--overload-busy 90 %"), "{refused}");
        assert_eq!(load.overloaded(), None, "a one-shot acquire is refused on the lag alone");
        // The busy second counts while it is one of the last two looked at.
        tokio::time::advance(WINDOW).await;
        look(100);
        assert!(load.refuses_session().is_some(), "the busy second is still the larger of the last two");
        tokio::time::advance(WINDOW).await;
        look(100);
        assert_eq!(load.refuses_session(), None, "two quiet seconds");
        // Looks that stopped long ago count for nothing.
        look(990);
        tokio::time::advance(WINDOW * 3).await;
        assert_eq!((load.busy_permille(), load.refuses_session()), (0, None));
        // 1 never refuses on it.
        let never = Load::new(Duration::from_millis(500), 1.0);
        *lock(&never.busy) = [(Some(Instant::now()), 1000), (Some(Instant::now()), 1000)];
        assert_eq!(never.refuses_session(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn once_refusing_a_node_goes_on_until_its_lag_is_under_half_the_delay() {
        let load = Load::new(Duration::from_millis(500), 1.0);
        let confirmed_after = |ms: u64| {
            let arrived = Instant::now();
            let load = &load;
            async move {
                tokio::time::advance(Duration::from_millis(ms)).await;
                load.confirmed(arrived);
            }
        };
        confirmed_after(400).await;
        assert_eq!(load.overloaded(), None, "under the delay, not refusing yet");
        confirmed_after(600).await;
        assert!(load.overloaded().is_some(), "past the delay");
        // Two windows on the 600 ms is forgotten, but 400 ms is still over half the delay: still refusing.
        tokio::time::advance(WINDOW * 2).await;
        confirmed_after(400).await;
        assert_eq!(load.overloaded(), Some(Duration::from_millis(400)));
        tokio::time::advance(WINDOW * 2).await;
        confirmed_after(200).await;
        assert_eq!(load.overloaded(), None, "under half the delay: admitting again");
        confirmed_after(400).await;
        assert_eq!(load.overloaded(), None, "and not refusing again until past the delay");
        // The sessions' word has the same two levels.
        for _ in 0..LATE_SESSIONS_MIN {
            load.client_late(Duration::from_millis(300));
        }
        assert_eq!(load.sessions_late(), None, "300 ms is under the delay");
        assert_eq!(load.overloaded(), None);
        for _ in 0..LATE_SESSIONS_MIN {
            load.client_late(Duration::from_millis(700));
        }
        assert!(load.overloaded().is_some(), "enough sessions past the delay");
        tokio::time::advance(WINDOW * 2).await;
        for _ in 0..LATE_SESSIONS_MIN {
            load.client_late(Duration::from_millis(300));
        }
        assert_eq!(load.overloaded(), Some(Duration::from_millis(300)), "300 ms is over half the delay");
    }

    #[test]
    fn a_busy_runtime_is_seen_late_by_the_probe() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let load = std::sync::Arc::new(Load::new(Duration::from_millis(500), 0.9));
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
            // Once a window has been looked at, the 700 ms the only worker spent in that task count as busy.
            tokio::time::sleep(WINDOW).await;
            assert!(load.busy_permille() >= 300, "{} thousandths busy", load.busy_permille());
            stop.send(true).unwrap();
            probe.await.unwrap();
        });
    }
}
