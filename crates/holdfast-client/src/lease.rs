//! A session's lease as the client keeps it: pure bookkeeping over instants, no IO and no clock reads.
//!
//! The server extends a session's deadline when it receives a heartbeat, and acknowledges the heartbeat only
//! after the leader confirmed it is still leader. So when an ack for a heartbeat SENT at `t` arrives, the
//! cluster's deadline for the session is at least `t + lease`: counting from the send (not from the ack)
//! keeps the client's view of its lease never longer than the cluster's, however long the heartbeat and its
//! ack were in flight. Until `confirmed_until` the session, and every lock it holds, is confirmed; after it
//! nothing is, whatever the network is doing.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// Heartbeats remembered while unacknowledged. Forgetting the oldest only ever makes the client more
/// conservative (a late ack for it can no longer extend the lease), so a stalled stream costs bounded memory.
const OUTSTANDING_MAX: usize = 64;

/// The client's conservative view of one session's lease.
#[derive(Debug, Clone)]
pub(crate) struct LeaseClock {
    lease: Duration,
    /// The lease is confirmed until this instant.
    confirmed_until: Instant,
    /// The next heartbeat's sequence number (1-based, so that 0 is never a valid ack).
    next_seq: u64,
    /// Heartbeats sent and not yet acknowledged, oldest first: (seq, send instant).
    outstanding: VecDeque<(u64, Instant)>,
    /// How long the last acknowledged heartbeat took to be acknowledged.
    last_round_trip: Duration,
}

/// What a heartbeat tells its node of how late a session's heartbeats are (`Heartbeat.late_ms`): the longer
/// of how long the last acknowledged one took and how long the oldest unacknowledged one has waited, in
/// milliseconds; at least 1, as the protocol's 0 says "not measured". The client library sends it, and so
/// must any load generator that stands in for it.
pub fn heartbeat_late_ms(last_round_trip: Duration, oldest_unacked_wait: Duration) -> u32 {
    let late = last_round_trip.max(oldest_unacked_wait).max(Duration::from_millis(1));
    late.as_millis().min(u32::MAX.into()) as u32
}

impl LeaseClock {
    /// A lease that was confirmed by a request sent at `sent_at` (the `Open` that created the session: the
    /// server starts the lease when it applies the open, which is after the client sent it).
    pub(crate) fn new(lease: Duration, sent_at: Instant) -> Self {
        assert!(!lease.is_zero(), "a lease must be longer than zero");
        LeaseClock {
            lease,
            confirmed_until: sent_at + lease,
            next_seq: 1,
            outstanding: VecDeque::new(),
            last_round_trip: Duration::ZERO,
        }
    }

    /// The lease length this clock counts with.
    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    /// The session is confirmed alive strictly before this instant.
    pub(crate) fn confirmed_until(&self) -> Instant {
        self.confirmed_until
    }

    /// Whether the session is still confirmed at `now`.
    pub(crate) fn is_alive(&self, now: Instant) -> bool {
        now < self.confirmed_until
    }

    /// Records a heartbeat about to be sent at `now` and returns its sequence number.
    ///
    /// Take `now` BEFORE handing the heartbeat to the transport: an earlier send instant can only make the
    /// lease end earlier.
    pub(crate) fn on_send(&mut self, now: Instant) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.outstanding.len() == OUTSTANDING_MAX {
            self.outstanding.pop_front();
        }
        self.outstanding.push_back((seq, now));
        seq
    }

    /// Records the ack of heartbeat `seq`, received at `now`. Returns whether it extended the lease. An ack
    /// for a heartbeat this clock never sent, or already forgot, changes nothing.
    pub(crate) fn on_ack(&mut self, seq: u64, now: Instant) -> bool {
        let Some(i) = self.outstanding.iter().position(|(s, _)| *s == seq) else {
            return false;
        };
        let sent_at = self.outstanding[i].1;
        self.last_round_trip = now.saturating_duration_since(sent_at);
        // Older heartbeats are superseded: their acks could only confirm an earlier deadline.
        self.outstanding.drain(..=i);
        let until = sent_at + self.lease;
        if until > self.confirmed_until {
            self.confirmed_until = until;
            true
        } else {
            false
        }
    }

    /// The send instant of the oldest heartbeat still waiting for its ack, if any: a stream whose acks stop
    /// coming is stuck even if the transport has not noticed.
    pub(crate) fn oldest_unacked(&self) -> Option<Instant> {
        self.outstanding.front().map(|(_, at)| *at)
    }

    /// How late this session's heartbeats are, as of `now`, in `Heartbeat.late_ms` ([`heartbeat_late_ms`]).
    pub(crate) fn late_ms(&self, now: Instant) -> u32 {
        let waiting = self.oldest_unacked().map_or(Duration::ZERO, |at| now.saturating_duration_since(at));
        heartbeat_late_ms(self.last_round_trip, waiting)
    }

    /// Forgets unacknowledged heartbeats, whose acks cannot come any more (their stream is gone).
    pub(crate) fn forget_outstanding(&mut self) {
        self.outstanding.clear();
        // A new stream starts with nothing to say of its lateness.
        self.last_round_trip = Duration::ZERO;
    }
}

/// How often to heartbeat a session with this lease: every lease/4, as the protocol asks, so that three
/// heartbeats in a row can be lost before the lease runs out.
pub(crate) fn heartbeat_interval(lease: Duration) -> Duration {
    (lease / 4).max(Duration::from_millis(1))
}

/// The first instant after `now` on the grid of ticks `period` apart that passes through `origin`.
///
/// A client's sessions with the same lease heartbeat on one such grid (its origin drawn once per client),
/// so that their heartbeats leave together: one write for all of them on the client's connection, one read
/// and one round of acknowledgements at the node, where one each per session was most of a node's work at
/// 100,000 sessions. Clients draw different origins, so a fleet's heartbeats stay spread over the period.
pub(crate) fn next_tick(now: Instant, origin: Instant, period: Duration) -> Instant {
    if origin > now {
        return origin;
    }
    let since = now.duration_since(origin).as_nanos();
    let period_ns = period.as_nanos().max(1);
    let ticks = since / period_ns + 1;
    origin + Duration::from_nanos(u64::try_from(ticks * period_ns).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_millis(2000);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_new_session_is_confirmed_for_one_lease_from_the_open() {
        let t0 = Instant::now();
        let clock = LeaseClock::new(LEASE, t0);
        assert_eq!(clock.confirmed_until(), t0 + LEASE);
        assert!(clock.is_alive(t0 + ms(1999)));
        assert!(!clock.is_alive(t0 + LEASE), "the deadline itself is already past");
    }

    #[test]
    fn an_ack_extends_the_lease_from_the_send_not_from_the_ack() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::new(LEASE, t0);
        let seq = clock.on_send(t0 + ms(500));
        // The ack takes 1.4 s to come back: the lease still counts from 500 ms.
        assert!(clock.on_ack(seq, Instant::now()));
        assert_eq!(clock.confirmed_until(), t0 + ms(2500));
        assert!(clock.is_alive(t0 + ms(2499)));
        assert!(!clock.is_alive(t0 + ms(2500)));
    }

    #[test]
    fn lateness_is_the_longer_of_the_last_round_trip_and_the_oldest_unacknowledged_wait() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::new(ms(2000), t0);
        assert_eq!(clock.late_ms(t0), 1, "nothing measured yet: the least a measure says");
        let first = clock.on_send(t0);
        clock.on_ack(first, t0 + ms(30));
        assert_eq!(clock.late_ms(t0 + ms(500)), 30, "the last round trip");
        clock.on_send(t0 + ms(500));
        assert_eq!(clock.late_ms(t0 + ms(1300)), 800, "an unacknowledged heartbeat waiting longer");
        clock.forget_outstanding();
        assert_eq!(clock.late_ms(t0 + ms(1300)), 1, "a new stream starts afresh");
    }

    #[test]
    fn unacknowledged_heartbeats_extend_nothing() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::new(LEASE, t0);
        for i in 1..=10 {
            clock.on_send(t0 + ms(500 * i));
        }
        assert_eq!(clock.confirmed_until(), t0 + LEASE);
        assert_eq!(clock.oldest_unacked(), Some(t0 + ms(500)));
    }

    #[test]
    fn a_late_ack_of_an_older_heartbeat_never_moves_the_lease_back() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::new(LEASE, t0);
        let first = clock.on_send(t0 + ms(500));
        let second = clock.on_send(t0 + ms(1000));
        assert!(clock.on_ack(second, Instant::now()));
        assert_eq!(clock.confirmed_until(), t0 + ms(3000));
        // The first was superseded by the second's ack: its ack changes nothing.
        assert!(!clock.on_ack(first, Instant::now()));
        assert_eq!(clock.confirmed_until(), t0 + ms(3000));
        assert_eq!(clock.oldest_unacked(), None);
    }

    #[test]
    fn acks_for_unknown_or_repeated_sequence_numbers_are_ignored() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::new(LEASE, t0);
        assert!(!clock.on_ack(0, Instant::now()));
        assert!(!clock.on_ack(42, Instant::now()));
        let seq = clock.on_send(t0 + ms(500));
        assert!(clock.on_ack(seq, Instant::now()));
        assert!(!clock.on_ack(seq, Instant::now()));
        assert_eq!(clock.confirmed_until(), t0 + ms(2500));
    }

    #[test]
    fn forgotten_heartbeats_cannot_extend_the_lease() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::new(LEASE, t0);
        let seq = clock.on_send(t0 + ms(500));
        clock.forget_outstanding();
        assert!(!clock.on_ack(seq, Instant::now()));
        assert_eq!(clock.oldest_unacked(), None);
        assert_eq!(clock.confirmed_until(), t0 + LEASE);
    }

    #[test]
    fn outstanding_heartbeats_are_bounded_by_dropping_the_oldest() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::new(LEASE, t0);
        let first = clock.on_send(t0);
        for i in 1..=OUTSTANDING_MAX as u64 {
            clock.on_send(t0 + ms(i));
        }
        assert!(!clock.on_ack(first, Instant::now()), "the oldest was forgotten");
        assert_eq!(clock.oldest_unacked(), Some(t0 + ms(1)));
    }

    #[test]
    fn ticks_fall_on_the_grid_through_the_origin() {
        let origin = Instant::now();
        let period = ms(500);
        assert_eq!(next_tick(origin, origin, period), origin + period, "after now, never at it");
        assert_eq!(next_tick(origin + ms(1), origin, period), origin + period);
        assert_eq!(next_tick(origin + ms(1_250), origin, period), origin + ms(1_500));
        assert_eq!(next_tick(origin + ms(1_500), origin, period), origin + ms(2_000));
        assert_eq!(next_tick(origin, origin + ms(300), period), origin + ms(300), "an origin still ahead");
    }

    #[test]
    fn heartbeats_every_quarter_lease() {
        assert_eq!(heartbeat_interval(LEASE), ms(500));
        assert_eq!(heartbeat_interval(Duration::from_micros(10)), ms(1));
    }

    #[tokio::test(start_paused = true)]
    async fn the_lease_runs_out_on_the_paused_clock() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::new(LEASE, t0);
        tokio::time::advance(ms(400)).await;
        let seq = clock.on_send(Instant::now());
        tokio::time::advance(ms(1900)).await;
        // 2.3 s after the open and no ack yet: the open's lease is gone.
        assert!(!clock.is_alive(Instant::now()));
        // The ack arrives now; counted from its send at 400 ms it confirms until 2.4 s. (The clock only does
        // the arithmetic: the session task declared everything lost at 2 s and never revives a session.)
        assert!(clock.on_ack(seq, Instant::now()));
        assert!(clock.is_alive(Instant::now()));
        tokio::time::advance(ms(100)).await;
        assert!(!clock.is_alive(Instant::now()));
    }
}
