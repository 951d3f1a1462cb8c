//! [`Deadlines`]: when each hold, session or waiter runs out, on this node's monotonic clock.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

/// Deadlines on this node's monotonic clock, by key and ordered by time. Each carries a tag (a fence), so
/// that the end of an old hold does not clear the deadline of a newer one, and its lease, so that a
/// promotion can give it a full lease without touching it.
///
/// **Promotion is O(1).** A node that becomes leader gives everything a full lease from its promotion
/// (`Events::promote`). Rewriting every deadline then would take time in proportion to the state
/// (seconds for a million held locks, with the keeper's lock held and the node's worker threads stalled
/// behind it, long enough for the followers to elect another leader, which would then do the same).
/// Instead the promotion only records its instant, the floor (kept by the keeper, one for every kind of
/// deadline, and passed in): a deadline set before it counts as the floor plus its lease
/// ([`Deadlines::effective`]). A deadline is moved to that later time only when it
/// comes up, once ([`Deadlines::settle`], at the keeper's look), so each promotion costs each item at most
/// one move, spread over the leases.
///
/// **An extension touches one map.** A session heartbeats every quarter lease, and with 100,000 sessions
/// moving its place in the time order each time (a removal and an insertion in a set of 100,000) was a
/// tenth of the leader's CPU (docs/perf-notes/2026-12-06-memory-per-session.md). An extension moves only
/// the deadline kept by key; its place in the time order, never later than the deadline, stays until it
/// comes up, and [`Deadlines::settle`] moves it then to the deadline it finds: once a lease at most,
/// however many heartbeats came in between. The map by key is a hash map: at 100,000 sessions a lookup in
/// an ordered map (17 levels of comparisons, most of them cache misses) was 8 % of the leader's CPU.
///
/// **A payload `P` beside each deadline**, for what the heartbeat that extends it answers with (a
/// session's counts of holds and waits), so that its answer takes no other lookup.
pub struct Deadlines<K, P = ()> {
    /// What the times below count from, in nanoseconds (before it, negative): a time in 8 bytes where an
    /// `Instant` takes 16, so that a session's deadline costs each node 48 bytes in the map by key with its
    /// counts, not 72.
    base: Instant,
    by_key: HashMap<K, Deadline<P>>,
    /// Each key once, at its deadline's `queued` time.
    by_time: BTreeSet<(Nanos, K)>,
}

/// A time as nanoseconds after [`Deadlines::base`], or a duration in nanoseconds.
type Nanos = i64;

/// One key's deadline: its tag, when it runs out (as set; see [`Deadlines::effective`]), its lease, where
/// it stands in the time order (`queued`, never after `at`), and its payload.
#[derive(Debug, Clone, Copy)]
struct Deadline<P> {
    tag: u64,
    at: Nanos,
    lease: Nanos,
    queued: Nanos,
    payload: P,
}

impl<K, P> Default for Deadlines<K, P> {
    fn default() -> Self {
        Deadlines { base: Instant::now(), by_key: HashMap::new(), by_time: BTreeSet::new() }
    }
}

/// `duration` in nanoseconds (at most about 292 years).
fn nanos(duration: Duration) -> Nanos {
    Nanos::try_from(duration.as_nanos()).unwrap_or(Nanos::MAX)
}

impl<K: Clone + Ord + Hash, P: Copy> Deadlines<K, P> {
    /// Deadlines for `items` (key, tag, lease, payload), each a full lease after `now`. Built whole rather
    /// than key by key: the time order is sorted once and built in bulk, faster for a million keys than
    /// inserting them one by one.
    pub fn of(items: impl IntoIterator<Item = (K, u64, Duration, P)>, now: Instant) -> Self {
        let by_key: HashMap<K, Deadline<P>> = items
            .into_iter()
            .map(|(key, tag, lease, payload)| {
                let (lease, at) = (nanos(lease), nanos(lease));
                (key, Deadline { tag, at, lease, queued: at, payload })
            })
            .collect();
        let by_time = by_key.iter().map(|(key, deadline)| (deadline.queued, key.clone())).collect();
        Deadlines { base: now, by_key, by_time }
    }

    /// `t` as nanoseconds after the base.
    fn since_base(&self, t: Instant) -> Nanos {
        match t.checked_duration_since(self.base) {
            Some(after) => nanos(after),
            None => -nanos(self.base - t),
        }
    }

    /// `key` (tagged `tag`) runs out a full `lease` after `now`, and carries `payload`.
    pub fn set(&mut self, key: &K, tag: u64, now: Instant, lease: Duration, payload: P) {
        let (lease, now) = (nanos(lease), self.since_base(now));
        let at = now.saturating_add(lease);
        self.place(key, Deadline { tag, at, lease, queued: at, payload });
    }

    /// Replaces `key`'s payload; false if it has no deadline.
    pub fn set_payload(&mut self, key: &K, payload: P) -> bool {
        self.by_key.get_mut(key).map(|deadline| deadline.payload = payload).is_some()
    }

    pub fn contains(&self, key: &K) -> bool {
        self.by_key.contains_key(key)
    }

    /// The keys that have a deadline, in no particular order (for tests: the keeper follows the state's
    /// changes, not its own keys).
    #[cfg(test)]
    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.by_key.keys()
    }

    /// Gives `key` `deadline`, in the time order at `deadline.queued`.
    fn place(&mut self, key: &K, deadline: Deadline<P>) {
        if let Some(old) = self.by_key.insert(key.clone(), deadline) {
            self.by_time.remove(&(old.queued, key.clone()));
        }
        self.by_time.insert((deadline.queued, key.clone()));
    }

    /// When `deadline` runs out, counting the last promotion (at `floor`, after the base): at the floor
    /// plus its lease if that is later.
    fn effective(deadline: &Deadline<P>, floor: Option<Nanos>) -> Nanos {
        match floor {
            Some(floor) => deadline.at.max(floor.saturating_add(deadline.lease)),
            None => deadline.at,
        }
    }

    /// Moves `key`'s deadline to a full lease (its own) after `now` if it has not passed by `now` (counting
    /// the last promotion, at `floor`), and answers its payload. None if it passed or `key` has none: once
    /// passed, the leader may already be expiring it. Its place in the time order stays (see [`Deadlines`]).
    pub fn extend(&mut self, key: &K, now: Instant, floor: Option<Instant>) -> Option<P> {
        let (now, floor) = (self.since_base(now), floor.map(|f| self.since_base(f)));
        let deadline = self.by_key.get_mut(key)?;
        let at = Self::effective(deadline, floor);
        if at <= now {
            return None;
        }
        deadline.at = at.max(now.saturating_add(deadline.lease));
        Some(deadline.payload)
    }

    /// Whether `key`'s deadline was set before `floor` (a promotion): it counts from a lease given earlier.
    pub fn set_before(&self, key: &K, floor: Instant) -> bool {
        let floor = self.since_base(floor);
        self.by_key.get(key).is_some_and(|deadline| deadline.at < floor.saturating_add(deadline.lease))
    }

    pub fn end(&mut self, key: &K, tag: u64) {
        if let Some(deadline) = self.by_key.get(key) {
            if deadline.tag == tag {
                self.by_time.remove(&(deadline.queued, key.clone()));
                self.by_key.remove(key);
            }
        }
    }

    /// Moves the deadlines queued by `now` that have not passed, counting extensions and the last promotion
    /// (at `floor`), to their effective time in the time order, so that every deadline queued by `now`
    /// did pass.
    pub fn settle(&mut self, now: Instant, floor: Option<Instant>) {
        let (now, floor) = (self.since_base(now), floor.map(|f| self.since_base(f)));
        let late: Vec<(K, Deadline<P>)> = self
            .by_time
            .iter()
            .take_while(|(queued, _)| *queued <= now)
            .filter_map(|(_, key)| {
                let deadline = self.by_key[key];
                let at = Self::effective(&deadline, floor);
                (at > now).then(|| (key.clone(), Deadline { at, queued: at, ..deadline }))
            })
            .collect();
        for (key, deadline) in late {
            self.place(&key, deadline);
        }
    }

    /// Keys whose deadline passed by `now`, earliest first, with their tags. Call [`Deadlines::settle`]
    /// with the same `now` first.
    pub fn due(&self, now: Instant) -> impl Iterator<Item = (&K, u64)> + '_ {
        let now = self.since_base(now);
        self.by_time.iter().take_while(move |(queued, _)| *queued <= now).map(|(_, key)| (key, self.by_key[key].tag))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl<K> Deadlines<K> {
        /// The instant a time in the deadlines is (after the base).
        fn instant(&self, at: Nanos) -> Instant {
            self.base + Duration::from_nanos(at.try_into().expect("after the base"))
        }
    }

    #[test]
    fn a_deadline_moved_by_a_promotion_moves_once_and_still_ends() {
        let t0 = Instant::now();
        let lease = Duration::from_secs(10);
        let mut deadlines: Deadlines<u32> = Deadlines::default();
        for key in 0..3 {
            deadlines.set(&key, 7, t0, lease, ());
        }
        let floor = Some(t0 + Duration::from_secs(5));
        let now = t0 + Duration::from_secs(12);
        deadlines.settle(now, floor);
        assert_eq!(deadlines.due(now).count(), 0);
        let moved: Vec<Instant> = deadlines.by_time.iter().map(|(at, _)| deadlines.instant(*at)).collect();
        assert_eq!(moved, vec![t0 + Duration::from_secs(15); 3], "each at the floor plus its lease");
        deadlines.settle(now, floor);
        assert_eq!(deadlines.by_time.len(), 3);
        // Ending a moved deadline, under its tag only, removes it from both orders.
        deadlines.end(&1, 8);
        deadlines.end(&2, 7);
        assert_eq!((deadlines.by_key.len(), deadlines.by_time.len()), (2, 2));
        let later = t0 + Duration::from_secs(15);
        deadlines.settle(later, floor);
        assert_eq!(deadlines.due(later).map(|(key, tag)| (*key, tag)).collect::<Vec<_>>(), [(0, 7), (1, 7)]);
    }

    /// Deadlines rebuilt after a promotion count times before their base too: the promotion's floor, and a
    /// `now` moved back by a grace.
    #[test]
    fn times_before_the_base_count_as_they_are() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut deadlines: Deadlines<u32> = Deadlines::of([(1, 0, s(2), ())], t0 + s(20));
        let floor = Some(t0 + s(15));
        assert!(deadlines.set_before(&1, t0 + s(21)), "a promotion after the rebuild");
        assert!(!deadlines.set_before(&1, t0 + s(15)), "the promotion before it");
        assert_eq!(deadlines.due(t0 + s(5)).count(), 0);
        // Extended at 21 s: the rebuild's lease held to 22 s (the floor's only to 17 s), its own runs to 23 s.
        assert!(deadlines.extend(&1, t0 + s(21), floor).is_some());
        deadlines.settle(t0 + s(30), floor);
        assert_eq!(deadlines.due(t0 + s(30)).map(|(key, _)| *key).collect::<Vec<_>>(), [1]);
        deadlines.set(&2, 0, t0 + s(1), s(10), ());
        assert_eq!(deadlines.instant(deadlines.by_key[&1].at), t0 + s(23));
        deadlines.settle(t0 + s(11), None);
        assert_eq!(deadlines.due(t0 + s(11)).map(|(key, _)| *key).collect::<Vec<_>>(), [2], "set before its base");
        assert!(deadlines.extend(&2, t0 + s(11), None).is_none(), "passed");
    }

    #[test]
    fn an_extended_deadline_moves_in_the_time_order_only_when_it_comes_up() {
        let t0 = Instant::now();
        let (lease, s) = (Duration::from_secs(10), Duration::from_secs);
        let mut deadlines: Deadlines<u32> = Deadlines::default();
        deadlines.set(&1, 0, t0, lease, ());
        deadlines.set(&2, 0, t0, lease, ());
        // Extended three times: at 3, 6 and 9 s, so it runs out at 19 s.
        for at in [3, 6, 9] {
            assert!(deadlines.extend(&1, t0 + s(at), None).is_some());
        }
        assert_eq!(deadlines.by_time.len(), 2, "extensions leave the time order alone");
        let now = t0 + s(10);
        deadlines.settle(now, None);
        assert_eq!(deadlines.due(now).map(|(key, _)| *key).collect::<Vec<_>>(), [2], "only the one not extended");
        let queued = deadlines.by_time.iter().find(|(_, key)| *key == 1).map(|(at, _)| deadlines.instant(*at));
        assert_eq!(queued, Some(t0 + s(19)));
        // Ending it under its tag takes it from both orders, wherever it is queued.
        assert!(deadlines.extend(&1, t0 + s(12), None).is_some());
        deadlines.end(&1, 0);
        assert_eq!((deadlines.by_key.len(), deadlines.by_time.len()), (1, 1));
        // A deadline that passed is not revived, extended or not.
        assert!(deadlines.extend(&2, now, None).is_none());
        let later = t0 + s(30);
        deadlines.settle(later, None);
        assert_eq!(deadlines.due(later).map(|(key, _)| *key).collect::<Vec<_>>(), [2]);
    }
}
