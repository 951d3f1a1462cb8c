//! The checkers over a simulated run's [`History`]. Each is a pure function of what the run recorded (no IO,
//! no clock, no simulation) and returns every violation it finds, empty when the run kept its invariant: a
//! failing seed then reports everything it broke at once, not just the first thing.
//!
//! What each one guards:
//! - [`mutual_exclusion`]: no two clients believed they held the same lock at the same time.
//! - [`semaphore_limit`]: at no time did clients believe they held more places of a semaphore than its
//!   limit, and no two clients held one under the same fence.
//! - [`fenced_resource`]: the fenced counter never accepted a stale fence and never lost an update.
//! - [`fence_order`]: fences are distinct and follow real-time order.
//! - [`acknowledged`]: a grant or release the cluster acknowledged is still in effect at the end of the run.
//! - [`liveness`]: once faults heal, every call gets a definite answer within a bound.
//! - [`linearizable`]: the calls on each lock can be explained by one lock acting on them one at a time.
//! - [`all`]: all of the above over one [`History`].

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::time::Duration;

use crate::history::{Access, AccessKind, At, Call, Final, History, Hold, Leased, Op, Outcome, Watched};

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The checker that found it: the name of its function, e.g. `"mutual_exclusion"`.
    pub checker: &'static str,
    /// What broke, naming the lock, clients, fences and times involved.
    pub detail: String,
}

impl Violation {
    pub(crate) fn new(checker: &'static str, detail: String) -> Self {
        Self { checker, detail }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.checker, self.detail)
    }
}

/// Steps the linearizability search may take on one lock before [`linearizable`] gives up and reports the
/// lock as undecided. The search is exponential in how many calls overlap at once; this keeps a history
/// that is too large or too concurrent from hanging a test. On a history of a hundred-odd calls a step takes
/// about a microsecond in an optimised build and tens of microseconds unoptimised, so the budget is seconds
/// to a minute.
pub const LINEARIZABLE_STEPS_MAX: u64 = 2_000_000;

/// Every two holds of the same lock that overlap in time under different fences or by different clients.
/// Only locks' holds (limit 1) are judged: a semaphore's places may overlap, up to its limit
/// ([`semaphore_limit`]).
///
/// Spans are half-open, `[from, until)`, so one that ends when the next starts does not overlap it; a span
/// with `until <= from` is empty and overlaps nothing. Each overlapping pair is reported once.
pub fn mutual_exclusion(holds: &[Hold]) -> Vec<Violation> {
    const CHECKER: &str = "mutual_exclusion";
    let mut by_lock: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
    for hold in holds.iter().filter(|hold| hold.limit <= 1 && hold.from < hold.until) {
        by_lock.entry(&hold.lock).or_default().push(hold);
    }
    let mut violations = Vec::new();
    for (lock, mut spans) in by_lock {
        spans.sort_by_key(|hold| (hold.from, hold.until, hold.client, hold.fence));
        for (i, a) in spans.iter().enumerate() {
            // Sorted by start, so the spans after `a` that overlap it are exactly those that start before it
            // ends: the first that does not ends the scan, which keeps this linear in the overlaps found.
            for b in spans[i + 1..].iter().take_while(|b| b.from < a.until) {
                // A client may record several spans under one fence (each renewal extends its belief); those
                // overlapping are still one hold.
                if a.fence != b.fence || a.client != b.client {
                    violations.push(Violation::new(
                        CHECKER,
                        format!(
                            "lock {lock:?}: client {} held it under fence {} in [{:?}, {:?}) while client {} held \
                             it under fence {} in [{:?}, {:?})",
                            a.client, a.fence, a.from, a.until, b.client, b.fence, b.from, b.until
                        ),
                    ));
                }
            }
        }
    }
    violations
}

/// Every instant at which a semaphore had more holds than its limit, and every fence of a semaphore that
/// two clients believed they held a place under (a fence names one grant). Only semaphores' holds (limit
/// above 1) are judged, locks' are [`mutual_exclusion`]'s; a semaphore's limit is the smallest its holds
/// give (every acquirer of a name gives the same).
///
/// Spans are half-open as [`mutual_exclusion`]'s. One client's several spans under one fence (renewals)
/// are one hold, so what is counted at an instant is the distinct fences held then. Each time the count
/// rises above the limit is reported once, with the holds that overlap then.
pub fn semaphore_limit(holds: &[Hold]) -> Vec<Violation> {
    const CHECKER: &str = "semaphore_limit";
    let mut by_lock: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
    for hold in holds.iter().filter(|hold| hold.limit > 1) {
        by_lock.entry(&hold.lock).or_default().push(hold);
    }
    let mut violations = Vec::new();
    for (lock, holds) in by_lock {
        let limit = holds.iter().map(|hold| hold.limit).min().unwrap_or(1) as usize;
        let mut clients_by_fence: BTreeMap<u64, BTreeSet<u32>> = BTreeMap::new();
        for hold in &holds {
            clients_by_fence.entry(hold.fence).or_default().insert(hold.client);
        }
        for (fence, clients) in clients_by_fence.iter().filter(|(_, clients)| clients.len() > 1) {
            violations.push(Violation::new(
                CHECKER,
                format!("semaphore {lock:?}: clients {clients:?} each held a place under fence {fence}"),
            ));
        }
        // Each span's start and end in time order; at one instant ends come first (`false` sorts first), so
        // that a span ending as another starts does not overlap it.
        let mut edges: Vec<(At, bool, &Hold)> = holds
            .iter()
            .filter(|hold| hold.from < hold.until)
            .flat_map(|&hold| [(hold.from, true, hold), (hold.until, false, hold)])
            .collect();
        edges.sort_by_key(|&(at, starts, hold)| (at, starts, hold.fence, hold.client));
        // The spans that cover the current instant, by fence.
        let mut held: BTreeMap<u64, Vec<&Hold>> = BTreeMap::new();
        let mut over = false;
        for (at, starts, hold) in edges {
            if starts {
                held.entry(hold.fence).or_default().push(hold);
            } else if let Some(spans) = held.get_mut(&hold.fence) {
                spans.retain(|span| !std::ptr::eq(*span, hold));
                if spans.is_empty() {
                    held.remove(&hold.fence);
                }
            }
            let now_over = held.len() > limit;
            if now_over && !over {
                let places: Vec<String> = held
                    .values()
                    .map(|spans| {
                        let span = spans[0];
                        format!(
                            "client {} under fence {} in [{:?}, {:?})",
                            span.client, span.fence, span.from, span.until
                        )
                    })
                    .collect();
                violations.push(Violation::new(
                    CHECKER,
                    format!(
                        "semaphore {lock:?} (limit {limit}): {} places held at once at {at:?}: {}",
                        held.len(),
                        places.join(", ")
                    ),
                ));
            }
            over = now_over;
        }
    }
    violations
}

/// Every stale access the fenced counter accepted and every update it lost. `accesses` are in the order the
/// resource saw them.
///
/// - Stale: an accepted access whose fence is lower than the fence of an earlier accepted access. Fencing
///   exists to refuse exactly these: a holder that lost its lock without knowing it.
/// - Lost update: replaying the accepted writes in order from 0, a write whose `read` is not the counter's
///   value before it overwrote an update it never saw; a write whose `written` is not `read + 1` is not the
///   increment the workload performs.
pub fn fenced_resource(accesses: &[Access]) -> Vec<Violation> {
    const CHECKER: &str = "fenced_resource";
    let mut violations = Vec::new();
    // The accepted access with the highest fence so far: the one a stale access is stale against.
    let mut highest: Option<&Access> = None;
    // The counter as the accepted writes so far leave it.
    let mut counter: u64 = 0;
    for access in accesses.iter().filter(|access| access.accepted) {
        if let Some(top) = highest.filter(|top| access.fence < top.fence) {
            violations.push(Violation::new(
                CHECKER,
                format!(
                    "stale access accepted: client {} at {:?} under fence {} after client {} at {:?} under fence {}",
                    access.client, access.at, access.fence, top.client, top.at, top.fence
                ),
            ));
        }
        if highest.is_none_or(|top| access.fence > top.fence) {
            highest = Some(access);
        }
        if let AccessKind::Write { read, written } = access.kind {
            if read != counter {
                violations.push(Violation::new(
                    CHECKER,
                    format!(
                        "lost update: client {} at {:?} under fence {} wrote {written} computed from {read}, \
                         overwriting {counter}",
                        access.client, access.at, access.fence
                    ),
                ));
            }
            if read.checked_add(1) != Some(written) {
                violations.push(Violation::new(
                    CHECKER,
                    format!(
                        "bad increment: client {} at {:?} under fence {} wrote {written} computed from {read}",
                        access.client, access.at, access.fence
                    ),
                ));
            }
            // What the resource now holds, right or wrong: later writes are judged against it.
            counter = written;
        }
    }
    violations
}

/// Every pair of grants whose fences break the order fences promise. Fences are log indexes, so:
/// - no two grants of one lock share a fence (grants of different locks may: one entry can grant several
///   locks, a batch of one-lock commands or an expiry that hands several locks over);
/// - a grant that completed strictly before a one-call acquire was invoked has the lower fence (the later
///   one was committed at a later log index). A session's acquire is not judged so: it may be given the
///   session's own earlier claim, granted before the call was sent.
///
/// O(n log n): grants sorted by completion are swept in invocation order, keeping the highest fence among
/// those that completed before the current one was invoked; only that one need be compared.
pub fn fence_order(ops: &[Op]) -> Vec<Violation> {
    const CHECKER: &str = "fence_order";
    let grants: Vec<(&Op, u64)> = ops
        .iter()
        .filter_map(|op| match op.outcome {
            Outcome::Granted { fence } => Some((op, fence)),
            _ => None,
        })
        .collect();
    let mut violations = Vec::new();

    let mut by_fence = grants.clone();
    by_fence.sort_by_key(|&(op, fence)| (&op.lock, fence, op.invoked));
    for pair in by_fence.windows(2) {
        let ((a, fence), (b, other)) = (pair[0], pair[1]);
        if fence == other && a.lock == b.lock {
            violations.push(Violation::new(
                CHECKER,
                format!("fence {fence} granted twice: {} and {}", describe(a), describe(b)),
            ));
        }
    }

    // A grant with no completion time is a malformed record; it cannot precede anything, but it is still
    // judged against those that completed before it was invoked.
    let mut by_completion: Vec<(At, u64, &Op)> =
        grants.iter().filter_map(|&(op, fence)| op.completed.map(|completed| (completed, fence, op))).collect();
    by_completion.sort_by_key(|&(completed, fence, _)| (completed, fence));
    // Only a one-call acquire's grant is made after it was asked for. A session's acquire may be answered
    // with a grant made before it was sent: the session's own earlier claim on that lock (a call that gave
    // up waiting just before the grant reached it), which the next call is given. Such a grant's fence is
    // older than the call, rightly, and is judged only as a predecessor (and for being distinct) here; the
    // span it is held in is judged by `mutual_exclusion` and the fenced resource.
    let mut by_invocation: Vec<(&Op, u64)> =
        grants.into_iter().filter(|(op, _)| matches!(op.call, Call::Acquire { wait: false, .. })).collect();
    by_invocation.sort_by_key(|&(op, fence)| (op.invoked, fence));
    let mut completed_before = by_completion.iter().peekable();
    let mut highest_before: Option<(u64, &Op)> = None;
    for (op, fence) in by_invocation {
        while let Some(&(_, earlier_fence, earlier)) =
            completed_before.next_if(|&&(completed, _, _)| completed < op.invoked)
        {
            if highest_before.is_none_or(|(highest, _)| earlier_fence > highest) {
                highest_before = Some((earlier_fence, earlier));
            }
        }
        if let Some((highest, earlier)) = highest_before.filter(|&(highest, _)| highest >= fence) {
            violations.push(Violation::new(
                CHECKER,
                format!(
                    "fence {fence} is not above fence {highest}, granted before it was invoked: {} completed \
                     before {}",
                    describe(earlier),
                    describe(op)
                ),
            ));
        }
    }
    violations
}

/// Every acknowledged grant or release that the end state does not reflect.
///
/// - A grant (`Acquire` answered `Granted { fence }`) whose lease cannot have run out by `end.at` and that no
///   release of its lock under its fence was ever sent for (whatever came back) must be among the lock's
///   holders at the end: otherwise the cluster forgot a write it acknowledged.
/// - A release answered `Released` must not leave its fence among the lock's holders at the end.
pub fn acknowledged(ops: &[Op], end: &Final) -> Vec<Violation> {
    const CHECKER: &str = "acknowledged";
    // A release that got no definite answer may still have let go, so the grant it names is not owed to the
    // end state either.
    let released: HashSet<(&str, u64)> = ops
        .iter()
        .filter_map(|op| match op.call {
            Call::Release { fence } => Some((op.lock.as_str(), fence)),
            Call::Acquire { .. } | Call::Get => None,
        })
        .collect();
    let mut violations = Vec::new();
    for op in ops {
        let holders = end.holders.get(&op.lock).map_or(&[][..], Vec::as_slice);
        match (op.call, op.outcome) {
            (Call::Acquire { ttl_ms, .. }, Outcome::Granted { fence }) => {
                // The cluster counts the lease from a leader's stamp taken no earlier than the call was sent,
                // so it lasts at least until `invoked + ttl_ms`; from then on it may rightly have expired.
                let alive = op.invoked.checked_add(Duration::from_millis(ttl_ms)).is_none_or(|until| until > end.at);
                if alive && !released.contains(&(op.lock.as_str(), fence)) && !holders.contains(&fence) {
                    violations.push(Violation::new(
                        CHECKER,
                        format!(
                            "acknowledged grant lost: {}, lease of {ttl_ms}ms not run out by {:?}, but the end \
                             state has {}",
                            describe(op),
                            end.at,
                            describe_holders(holders)
                        ),
                    ));
                }
            }
            (Call::Release { fence }, Outcome::Released) if holders.contains(&fence) => {
                violations.push(Violation::new(
                    CHECKER,
                    format!(
                        "acknowledged release lost: {}, but at {:?} fence {fence} still holds it",
                        describe(op),
                        end.at
                    ),
                ));
            }
            _ => {}
        }
    }
    violations
}

/// Every watch that missed a change or saw them out of order. A watcher's states come on server streams
/// (its segments): the first of each is the lock as it was then, and the rest must be every change after it,
/// in log order. So:
///
/// - revisions never go backwards, across segments too (a freed lock is remembered longer than a run), and
///   a holder's fence is never above the revision that shows it;
/// - within a segment, every grant of the lock acknowledged to any client whose fence (its entry's index)
///   lies after the segment's first revision and at or before its last must show as a state with that
///   fence as the holder's.
pub fn watches(watched: &[Watched], ops: &[Op]) -> Vec<Violation> {
    const CHECKER: &str = "watches";
    let mut violations = Vec::new();
    let mut by_watcher: BTreeMap<(u32, &str), Vec<&Watched>> = BTreeMap::new();
    for state in watched {
        by_watcher.entry((state.client, state.lock.as_str())).or_default().push(state);
    }
    for ((client, lock), states) in by_watcher {
        for pair in states.windows(2) {
            if pair[1].revision < pair[0].revision {
                let detail = format!(
                    "watcher {client} of {lock:?} was sent revision {} after {}",
                    pair[1].revision, pair[0].revision
                );
                violations.push(Violation::new(CHECKER, detail));
            }
        }
        for state in states.iter().filter(|s| s.holder.is_some_and(|fence| fence > s.revision)) {
            violations.push(Violation::new(
                CHECKER,
                format!("watcher {client} was sent a holder from the future: {state:?}"),
            ));
        }
        let granted = ops.iter().filter_map(|op| match (op.call, op.outcome) {
            (Call::Acquire { .. }, Outcome::Granted { fence }) if op.lock == lock => Some(fence),
            _ => None,
        });
        let granted: BTreeSet<u64> = granted.collect();
        let mut segments: BTreeMap<u64, Vec<&Watched>> = BTreeMap::new();
        for state in &states {
            segments.entry(state.segment).or_default().push(state);
        }
        for (segment, states) in segments {
            let (first, last) = (states[0].revision, states[states.len() - 1].revision);
            if last <= first {
                continue;
            }
            let shown: BTreeSet<u64> = states.iter().filter_map(|s| s.holder).collect();
            for fence in granted.range(first + 1..=last).filter(|fence| !shown.contains(fence)) {
                violations.push(Violation::new(
                    CHECKER,
                    format!(
                        "watcher {client} of {lock:?} missed the grant under fence {fence}: its stream {segment} went \
                         from revision {first} to {last} without it"
                    ),
                ));
            }
        }
    }
    violations
}

/// Every call sent at or after `healed` that did not get a definite answer (anything but
/// [`Outcome::Unknown`]) within `bound` of being sent. Calls sent before `healed` are not judged: faults may
/// rightly have kept them from an answer.
pub fn liveness(ops: &[Op], healed: At, bound: Duration) -> Vec<Violation> {
    const CHECKER: &str = "liveness";
    let mut violations = Vec::new();
    for op in ops.iter().filter(|op| op.invoked >= healed) {
        let problem = match op.completed {
            None => "got no answer".to_string(),
            Some(_) if op.outcome == Outcome::Unknown => "got no definite answer".to_string(),
            Some(completed) => {
                let took = completed.saturating_sub(op.invoked);
                if took <= bound {
                    continue;
                }
                format!("took {took:?}")
            }
        };
        violations.push(Violation::new(
            CHECKER,
            format!("{}, sent after faults healed at {healed:?}, {problem} (bound {bound:?})", describe(op)),
        ));
    }
    violations
}

/// Every lock whose calls no sequential lock explains: the history is checked per lock, which is sound
/// because locks are independent objects (a history is linearizable exactly when each object's sub-history
/// is: P-compositionality).
///
/// The sequential model has no expiry, so pass only the calls on locks whose grants cannot expire during the
/// run. Its state is the holder (free, a fence, or a fence nobody learned) and the highest fence granted:
/// - `Acquire` on a free lock grants, under any fence above every earlier one (fences are log indexes, so
///   the model cannot say which); on a held lock it is `Busy`.
/// - `Release { fence }` by the holder's fence is `Released` and frees the lock; any other is `NotHeld`.
///
/// A call with no definite answer ([`Outcome::Unknown`], or no completion) may have taken effect at any time
/// after it was sent, or never. An unknown acquire that took effect holds the lock under a fence nobody
/// learned, which no later release can name (a client releases only fences it was given), so the lock stays
/// held for the rest of the history.
///
/// Only one-call calls are checked: `Acquire { wait: true }` is skipped, since a session's wait in a queue and
/// its end releasing its holds are outside the model. So a lock a session also acquires may be reported
/// (its holder explains `Busy` answers the model cannot): keep such locks out.
///
/// The search is Wing & Gong's with Lowe's memoization, bounded by [`LINEARIZABLE_STEPS_MAX`] steps per lock;
/// a lock it cannot decide within that is reported as `undecided`, so keep histories small.
pub fn linearizable(ops: &[Op]) -> Vec<Violation> {
    linearizable_within(ops, LINEARIZABLE_STEPS_MAX)
}

/// [`linearizable`] with the step budget per lock as an argument, so tests can exhaust it.
fn linearizable_within(ops: &[Op], steps_max: u64) -> Vec<Violation> {
    const CHECKER: &str = "linearizable";
    // A read or a busy answer that shows a fence no client was told: a grant to an acquire whose answer
    // never arrived. Its node undoes such a grant once it learns the client went away (`acquire_or_undo` in
    // holdfast-server's ops.rs), so the lock may be free again after it, which the model, where such a
    // grant holds the lock for good, cannot follow (a read sees the fence held, then a higher fence is
    // granted; or a try-lock is told busy while such a grant holds the lock, then a read finds it free and
    // another try-lock takes it). Such an answer is left out, as a session's acquire is; a read or busy
    // answer showing a told fence, a read of a free lock and a busy answer that showed no fence are judged.
    let told: HashSet<(&str, u64)> = ops
        .iter()
        .filter_map(|op| match op.outcome {
            Outcome::Granted { fence } => Some((op.lock.as_str(), fence)),
            _ => None,
        })
        .collect();
    let judged = |op: &&Op| match (op.call, op.outcome) {
        (Call::Acquire { wait: true, .. }, _) => false,
        (Call::Get, Outcome::Holds { fence }) | (Call::Acquire { .. }, Outcome::Busy { holder: Some(fence) }) => {
            told.contains(&(op.lock.as_str(), fence))
        }
        _ => true,
    };
    let mut by_lock: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in ops.iter().filter(judged) {
        by_lock.entry(&op.lock).or_default().push(op);
    }
    let mut violations = Vec::new();
    for (lock, lock_ops) in by_lock {
        let count = lock_ops.len();
        match search(lock_ops, steps_max) {
            Search::Linearizable => {}
            Search::Undecided => violations.push(Violation::new(
                CHECKER,
                format!("undecided: search budget exceeded for lock {lock:?} ({count} ops, {steps_max} steps)"),
            )),
            Search::Stuck { placed, definite, model, blocking } => violations.push(Violation::new(
                CHECKER,
                format!(
                    "lock {lock:?} is not linearizable: at best {placed} of its {definite} answered calls fit \
                     (lock then {model}), and then nothing fits; the first answered call left is {}",
                    describe(blocking)
                ),
            )),
        }
    }
    violations
}

/// Every grant made during a lock-delay: after a grant that asked for one and whose client never sent a
/// release (so it ended by expiry, no earlier than its advertised end), every later grant of the lock
/// (a higher fence) must come no earlier than that end plus the delay. Both times are the leader's log
/// time, which only goes forward, so clock faults do not excuse a miss.
pub fn lock_delay(leased: &[Leased], ops: &[Op]) -> Vec<Violation> {
    const CHECKER: &str = "lock_delay";
    let release_sent: BTreeSet<(&str, u64)> = ops
        .iter()
        .filter_map(|op| match op.call {
            Call::Release { fence } => Some((op.lock.as_str(), fence)),
            _ => None,
        })
        .collect();
    let mut violations = Vec::new();
    for expired in leased.iter().filter(|l| l.lock_delay_ms > 0 && !release_sent.contains(&(l.lock.as_str(), l.fence)))
    {
        let free_at_ms = expired.expires_at_ms + expired.lock_delay_ms;
        for later in leased.iter().filter(|l| l.lock == expired.lock && l.fence > expired.fence) {
            if later.granted_at_ms < free_at_ms {
                violations.push(Violation::new(
                    CHECKER,
                    format!(
                        "lock {:?}: client {} was granted fence {} at {} ms, during the lock-delay of fence {} \
                         (client {}, never released, expired at {} ms, free at {free_at_ms} ms)",
                        later.lock,
                        later.client,
                        later.fence,
                        later.granted_at_ms,
                        expired.fence,
                        expired.client,
                        expired.expires_at_ms
                    ),
                ));
            }
        }
    }
    violations
}

/// Every checker over `history`: [`linearizable`] only on the calls whose lock `model_locks` selects (those
/// whose grants cannot expire during the run), [`acknowledged`] only if the end state was read.
pub fn all(
    history: &History,
    healed: At,
    liveness_bound: Duration,
    model_locks: &dyn Fn(&str) -> bool,
) -> Vec<Violation> {
    let mut violations = mutual_exclusion(&history.holds);
    violations.extend(semaphore_limit(&history.holds));
    violations.extend(fenced_resource(&history.accesses));
    violations.extend(fence_order(&history.ops));
    if let Some(end) = &history.end {
        violations.extend(acknowledged(&history.ops, end));
    }
    violations.extend(liveness(&history.ops, healed, liveness_bound));
    violations.extend(watches(&history.watched, &history.ops));
    violations.extend(lock_delay(&history.leased, &history.ops));
    let modelled: Vec<Op> = history.ops.iter().filter(|op| model_locks(&op.lock)).cloned().collect();
    violations.extend(linearizable(&modelled));
    violations
}

/// One op in a line: who, what, when, and what came back.
fn describe(op: &Op) -> String {
    let call = match op.call {
        Call::Acquire { ttl_ms, wait: false } => format!("acquire({ttl_ms}ms)"),
        Call::Acquire { ttl_ms, wait: true } => format!("acquire({ttl_ms}ms, wait)"),
        Call::Release { fence } => format!("release({fence})"),
        Call::Get => "get".to_string(),
    };
    let completed = op.completed.map_or_else(|| "-".to_string(), |completed| format!("{completed:?}"));
    let outcome = match op.outcome {
        Outcome::Granted { fence } => format!("granted {fence}"),
        Outcome::Busy { holder: Some(fence) } => format!("busy (held under {fence})"),
        Outcome::Busy { holder: None } => "busy".to_string(),
        Outcome::Released => "released".to_string(),
        Outcome::NotHeld => "not held".to_string(),
        Outcome::Holds { fence } => format!("held under {fence}"),
        Outcome::Free => "free".to_string(),
        Outcome::Unknown => "unknown".to_string(),
    };
    format!("client {} {call} on {:?} [{:?}, {completed}] -> {outcome}", op.client, op.lock, op.invoked)
}

fn describe_holders(holders: &[u64]) -> String {
    match holders {
        [] => "it free".to_string(),
        [fence] => format!("fence {fence} holding it"),
        fences => format!("fences {fences:?} holding it"),
    }
}

/// Who holds a lock in the sequential model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Holder {
    Free,
    Fence(u64),
    /// Granted to an acquire whose answer never arrived: no client knows the fence, so none can release it.
    Unknown,
}

/// The sequential lock [`linearizable`] checks against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct LockModel {
    holder: Holder,
    /// The highest fence granted so far. An unknown acquire that took effect leaves it as it was, though its
    /// own fence is higher: the lock is then held for good, so no later grant is ever compared with it.
    fence_max: u64,
}

impl LockModel {
    const INITIAL: Self = Self { holder: Holder::Free, fence_max: 0 };

    /// The state after `call` answered `outcome`, or `None` if the lock could not have answered that.
    fn answered(self, call: Call, outcome: Outcome) -> Option<Self> {
        match (call, outcome, self.holder) {
            (Call::Acquire { .. }, Outcome::Granted { fence }, Holder::Free) if fence > self.fence_max => {
                Some(Self { holder: Holder::Fence(fence), fence_max: fence })
            }
            (Call::Acquire { .. }, Outcome::Busy { .. }, Holder::Fence(_) | Holder::Unknown) => Some(self),
            (Call::Release { fence }, Outcome::Released, Holder::Fence(held)) if held == fence => {
                Some(Self { holder: Holder::Free, ..self })
            }
            (Call::Release { fence }, Outcome::NotHeld, holder) if holder != Holder::Fence(fence) => Some(self),
            (Call::Get, Outcome::Free, Holder::Free) => Some(self),
            (Call::Get, Outcome::Holds { fence }, Holder::Fence(held)) if held == fence => Some(self),
            _ => None,
        }
    }

    /// The state after `call`, whose answer is unknown, took effect; `None` if it would change nothing
    /// here. An unknown call that changes nothing need never be placed: leaving it out is the same history.
    fn took_effect(self, call: Call) -> Option<Self> {
        match (call, self.holder) {
            (Call::Acquire { .. }, Holder::Free) => Some(Self { holder: Holder::Unknown, ..self }),
            (Call::Release { fence }, Holder::Fence(held)) if held == fence => {
                Some(Self { holder: Holder::Free, ..self })
            }
            // A read changes nothing, whether it took effect or not.
            _ => None,
        }
    }

    /// Whether `call`, whose answer is unknown, could still change the state, now or later.
    fn may_take_effect(self, call: Call) -> bool {
        match call {
            Call::Acquire { .. } => self.holder != Holder::Unknown,
            // Fences only grow: one not above every fence granted so far is never granted again, so a release
            // naming it can only ever let go of the holder it names now.
            Call::Release { fence } => self.holder == Holder::Fence(fence) || fence > self.fence_max,
            Call::Get => false,
        }
    }
}

impl fmt::Display for LockModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.holder {
            Holder::Free => write!(f, "free")?,
            Holder::Fence(fence) => write!(f, "held under fence {fence}")?,
            Holder::Unknown => write!(f, "held under a fence nobody learned")?,
        }
        write!(f, ", fences granted up to {}", self.fence_max)
    }
}

/// A set of op indexes: which ops a search node has placed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(len: usize) -> Self {
        Self(vec![0; len.div_ceil(64)])
    }

    fn contains(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }

    fn insert(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
}

/// What the search over one lock's calls found.
enum Search<'a> {
    Linearizable,
    /// No order fits; the node that placed the most answered calls, to say where it broke.
    Stuck {
        /// How many answered calls it placed.
        placed: usize,
        /// How many answered calls there are.
        definite: usize,
        model: LockModel,
        /// The unplaced answered call that answered first: it must be placed before anything sent after.
        blocking: &'a Op,
    },
    /// The step budget ran out first.
    Undecided,
}

/// A point in the search: the ops placed so far (in some order) and the state they leave.
#[derive(Clone)]
struct Node {
    placed: Bits,
    /// How many of the placed ops are answered ones: the search is done when all of those are placed.
    definite_placed: usize,
    model: LockModel,
}

/// Wing & Gong's search for an order of `ops` (all on one lock) that the sequential lock explains and that
/// respects real time, depth first, with Lowe's memoization of (placed ops, state) so each such node is
/// expanded once.
fn search(ops: Vec<&Op>, steps_max: u64) -> Search<'_> {
    let ops = LockOps::new(ops);
    let root = Node { placed: Bits::new(ops.ops.len()), definite_placed: 0, model: LockModel::INITIAL };
    let mut seen: HashSet<(Bits, LockModel)> = HashSet::new();
    seen.insert((root.placed.clone(), root.model));
    let mut deepest = root.clone();
    let mut stack = vec![root];
    let mut steps: u64 = 0;
    while let Some(node) = stack.pop() {
        if node.definite_placed == ops.definite {
            return Search::Linearizable;
        }
        steps += 1;
        if steps > steps_max {
            return Search::Undecided;
        }
        if node.model.holder == Holder::Unknown {
            let settled = ops.settle_held_for_good(node);
            if settled.definite_placed == ops.definite {
                return Search::Linearizable;
            }
            if settled.definite_placed > deepest.definite_placed {
                deepest = settled;
            }
            continue;
        }
        if node.definite_placed > deepest.definite_placed {
            deepest = node.clone();
        }
        ops.expand(&node, &mut seen, &mut stack);
    }
    let (blocking, _) =
        earliest_unplaced(&ops.deadlines, &deepest.placed).expect("a stuck search has an answered op left to place");
    Search::Stuck {
        placed: deepest.definite_placed,
        definite: ops.definite,
        model: deepest.model,
        blocking: ops.ops[blocking],
    }
}

/// One lock's ops as the search sees them, in the order they were sent.
struct LockOps<'a> {
    ops: Vec<&'a Op>,
    /// When each answered op answered: it must be placed by then. Unknown ops have no deadline (they may
    /// take effect after their error or timeout reached the client, while the request is still in the
    /// cluster), and need never be placed.
    deadlines: Vec<Option<At>>,
    /// How many ops are answered ones.
    definite: usize,
    /// The indexes of the unknown ops.
    unknown: Vec<usize>,
}

impl<'a> LockOps<'a> {
    fn new(mut ops: Vec<&'a Op>) -> Self {
        ops.sort_by_key(|op| op.invoked);
        let deadlines: Vec<Option<At>> =
            ops.iter().map(|op| op.completed.filter(|_| op.outcome != Outcome::Unknown)).collect();
        let definite = deadlines.iter().filter(|deadline| deadline.is_some()).count();
        let unknown: Vec<usize> = (0..ops.len()).filter(|&i| deadlines[i].is_none()).collect();
        Self { ops, deadlines, definite, unknown }
    }

    /// `node`, whose lock is held for good, with every answered op left that a held lock gives placed, in
    /// the order they answered, up to the first that it does not give.
    fn settle_held_for_good(&self, node: Node) -> Node {
        // Held for good: nothing can change the state again, so there is nothing left to search. The
        // rest fits exactly when every answered op left is one a held lock gives (`Busy`, `NotHeld`):
        // such ops change nothing, so placing each at its answer respects real time. Settling it here
        // rather than searching keeps every unknown acquire from opening a subtree of its own.
        let mut settled = node;
        for i in unplaced_by_deadline(&self.deadlines, &settled.placed) {
            if settled.model.answered(self.ops[i].call, self.ops[i].outcome).is_none() {
                break;
            }
            settled.placed.insert(i);
            settled.definite_placed += 1;
        }
        settled
    }

    /// Pushes onto `stack` each child of `node` (`node` with one more op placed) not `seen` before.
    fn expand(&self, node: &Node, seen: &mut HashSet<(Bits, LockModel)>, stack: &mut Vec<Node>) {
        // The unplaced answered op that answered first bounds what can go next: an op sent after that answer
        // came after it in real time, so cannot precede it.
        let horizon = earliest_unplaced(&self.deadlines, &node.placed).map(|(_, deadline)| deadline);
        let candidates = self
            .ops
            .iter()
            .enumerate()
            .take_while(|(_, op)| horizon.is_none_or(|horizon| op.invoked <= horizon))
            .filter(|&(i, _)| !node.placed.contains(i));
        // Unknown ops are pushed first so the answered ones, which the search must place anyway, are tried
        // first; the order changes only how soon a linearizable history is found.
        let mut unknown_children = Vec::new();
        let mut definite_children = Vec::new();
        for (i, op) in candidates {
            let (model, children) = match self.deadlines[i] {
                Some(_) => (node.model.answered(op.call, op.outcome), &mut definite_children),
                None => (node.model.took_effect(op.call), &mut unknown_children),
            };
            let Some(model) = model else { continue };
            let placed = self.placed_after(node, i, model);
            if seen.insert((placed.clone(), model)) {
                let definite_placed = node.definite_placed + usize::from(self.deadlines[i].is_some());
                children.push(Node { placed, definite_placed, model });
            }
        }
        stack.extend(unknown_children);
        // Reversed so the earliest-sent answered op is popped first.
        stack.extend(definite_children.into_iter().rev());
    }

    /// The ops placed once op `i` is placed after `node`, leaving the state `model`.
    fn placed_after(&self, node: &Node, i: usize, model: LockModel) -> Bits {
        // Unknown ops that can no longer take effect are marked placed, so that whether one took effect
        // earlier or never makes no difference to the memo: otherwise each unknown release that might
        // have let go would double the search for the rest of the history.
        let mut placed = node.placed.clone();
        placed.insert(i);
        // Which can take effect depends on the state alone, so a child in its parent's state inherits
        // its parent's marks.
        if model != node.model {
            for &j in &self.unknown {
                if !model.may_take_effect(self.ops[j].call) {
                    placed.insert(j);
                }
            }
        }
        placed
    }
}

/// The indexes of the answered ops not in `placed`, in the order they answered.
fn unplaced_by_deadline(deadlines: &[Option<At>], placed: &Bits) -> Vec<usize> {
    let mut unplaced: Vec<(At, usize)> = deadlines
        .iter()
        .enumerate()
        .filter(|&(i, _)| !placed.contains(i))
        .filter_map(|(i, deadline)| deadline.map(|deadline| (deadline, i)))
        .collect();
    unplaced.sort_unstable();
    unplaced.into_iter().map(|(_, i)| i).collect()
}

/// The index and answer time of the answered op not in `placed` that answered first.
fn earliest_unplaced(deadlines: &[Option<At>], placed: &Bits) -> Option<(usize, At)> {
    deadlines
        .iter()
        .enumerate()
        .filter(|&(i, _)| !placed.contains(i))
        .filter_map(|(i, deadline)| deadline.map(|deadline| (i, deadline)))
        .min_by_key(|&(_, deadline)| deadline)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A busy answer that showed no holder's fence (as a session's try-lock's).
    const BUSY: Outcome = Outcome::Busy { holder: None };

    fn ms(millis: u64) -> At {
        Duration::from_millis(millis)
    }

    fn op(client: u32, lock: &str, call: Call, invoked_ms: u64, completed_ms: Option<u64>, outcome: Outcome) -> Op {
        Op { client, lock: lock.to_string(), call, invoked: ms(invoked_ms), completed: completed_ms.map(ms), outcome }
    }

    /// A one-call acquire of `lock` with a long lease, sent at `invoked_ms`, answered at `completed_ms`.
    fn acquire(client: u32, lock: &str, invoked_ms: u64, completed_ms: u64, outcome: Outcome) -> Op {
        op(client, lock, Call::Acquire { ttl_ms: 60_000, wait: false }, invoked_ms, Some(completed_ms), outcome)
    }

    /// An acquire that never got an answer.
    fn acquire_unanswered(client: u32, lock: &str, invoked_ms: u64) -> Op {
        op(client, lock, Call::Acquire { ttl_ms: 60_000, wait: false }, invoked_ms, None, Outcome::Unknown)
    }

    fn release(client: u32, lock: &str, fence: u64, invoked_ms: u64, completed_ms: u64, outcome: Outcome) -> Op {
        op(client, lock, Call::Release { fence }, invoked_ms, Some(completed_ms), outcome)
    }

    fn granted(fence: u64) -> Outcome {
        Outcome::Granted { fence }
    }

    /// A read of `lock`, sent at `invoked_ms`, answered at `completed_ms`.
    fn get(client: u32, lock: &str, invoked_ms: u64, completed_ms: u64, outcome: Outcome) -> Op {
        op(client, lock, Call::Get, invoked_ms, Some(completed_ms), outcome)
    }

    fn hold(client: u32, lock: &str, fence: u64, from_ms: u64, until_ms: u64) -> Hold {
        place(client, lock, 1, fence, from_ms, until_ms)
    }

    /// A hold of one of `limit` places of semaphore `lock`.
    fn place(client: u32, lock: &str, limit: u32, fence: u64, from_ms: u64, until_ms: u64) -> Hold {
        Hold { client, lock: lock.to_string(), limit, fence, from: ms(from_ms), until: ms(until_ms) }
    }

    fn write(client: u32, fence: u64, at_ms: u64, read: u64, written: u64, accepted: bool) -> Access {
        Access { client, fence, at: ms(at_ms), kind: AccessKind::Write { read, written }, accepted }
    }

    fn read(client: u32, fence: u64, at_ms: u64, value: u64, accepted: bool) -> Access {
        Access { client, fence, at: ms(at_ms), kind: AccessKind::Read { value }, accepted }
    }

    fn end(at_ms: u64, holders: &[(&str, u64)]) -> Final {
        let mut end = Final { at: ms(at_ms), ..Final::default() };
        for &(lock, fence) in holders {
            end.holders.entry(lock.to_string()).or_default().push(fence);
        }
        end
    }

    /// Asserts every violation is `checker`'s and each detail contains its expected fragment, in order.
    #[track_caller]
    fn assert_violations(violations: &[Violation], checker: &str, fragments: &[&str]) {
        assert_eq!(violations.len(), fragments.len(), "{violations:#?}");
        for (violation, fragment) in violations.iter().zip(fragments) {
            assert_eq!(violation.checker, checker, "{violation}");
            assert!(violation.detail.contains(fragment), "{violation:?} lacks {fragment:?}");
        }
    }

    #[test]
    fn violation_displays_checker_then_detail() {
        let violation = Violation::new("liveness", "slow".to_string());
        assert_eq!(violation.to_string(), "liveness: slow");
    }

    // mutual_exclusion

    #[test]
    fn mutual_exclusion_passes_disjoint_holds() {
        let holds = [
            hold(1, "a", 3, 0, 5),
            // Touching: [0, 5) ends as [5, 10) starts.
            hold(2, "a", 7, 5, 10),
            // Another lock may be held at the same time.
            hold(3, "b", 4, 0, 10),
            // One client's renewals under one fence overlap each other.
            hold(2, "a", 7, 8, 20),
            // Empty spans overlap nothing.
            hold(4, "a", 9, 12, 12),
            hold(5, "a", 11, 15, 13),
        ];
        assert_eq!(mutual_exclusion(&holds), vec![]);
    }

    #[test]
    fn mutual_exclusion_reports_overlap_between_clients() {
        let holds = [hold(1, "a", 3, 0, 10), hold(2, "a", 7, 9, 20)];
        assert_violations(
            &mutual_exclusion(&holds),
            "mutual_exclusion",
            &["lock \"a\": client 1 held it under fence 3 in [0ns, 10ms) while client 2 held it under fence 7 in \
               [9ms, 20ms)"],
        );
    }

    #[test]
    fn mutual_exclusion_reports_one_client_under_two_fences() {
        let holds = [hold(1, "a", 3, 0, 10), hold(1, "a", 7, 5, 6)];
        assert_violations(
            &mutual_exclusion(&holds),
            "mutual_exclusion",
            &["client 1 held it under fence 3 in [0ns, 10ms) while client 1 held it under fence 7 in [5ms, 6ms)"],
        );
    }

    #[test]
    fn mutual_exclusion_reports_each_overlapping_pair_once() {
        // Input order does not matter; all three overlap each other, and the fourth overlaps none of them.
        let holds = [hold(3, "a", 5, 2, 8), hold(1, "a", 1, 0, 10), hold(2, "a", 4, 1, 9), hold(4, "a", 6, 10, 11)];
        assert_violations(
            &mutual_exclusion(&holds),
            "mutual_exclusion",
            &["client 1 held it under fence 1", "client 1 held it under fence 1", "client 2 held it under fence 4"],
        );
    }

    #[test]
    fn mutual_exclusion_leaves_a_semaphores_places_to_semaphore_limit() {
        // Two places of a semaphore of limit 2 overlap, as they may; so do three (semaphore_limit's to judge).
        let holds = [place(1, "s", 2, 3, 0, 10), place(2, "s", 2, 7, 5, 20), place(3, "s", 2, 9, 6, 8)];
        assert_eq!(mutual_exclusion(&holds), vec![]);
    }

    // semaphore_limit

    #[test]
    fn semaphore_limit_passes_places_within_the_limit() {
        let holds = [
            place(1, "s", 2, 3, 0, 10),
            place(2, "s", 2, 7, 5, 20),
            // Touching: starts as fence 3's place ends, so two at once still.
            place(3, "s", 2, 9, 10, 30),
            // Client 2's renewal under fence 7 overlaps its own first span: one place.
            place(2, "s", 2, 7, 15, 25),
            // Empty spans hold nothing.
            place(4, "s", 2, 11, 12, 12),
            place(5, "s", 2, 12, 14, 13),
            // Another semaphore, and a lock (mutual_exclusion's), at the same time.
            place(6, "t", 2, 4, 0, 30),
            hold(7, "s", 5, 0, 30),
        ];
        assert_eq!(semaphore_limit(&holds), vec![]);
    }

    #[test]
    fn semaphore_limit_reports_each_time_more_places_are_held_than_the_limit() {
        // Input order does not matter. Three places at once from 5 ms to 8 ms, two from 8 ms, three again
        // from 12 ms: two excesses.
        let holds = [
            place(3, "s", 2, 9, 5, 8),
            place(1, "s", 2, 3, 0, 20),
            place(2, "s", 2, 7, 2, 20),
            place(4, "s", 2, 11, 12, 14),
            // One client's two places count as two.
            place(4, "s", 2, 13, 13, 14),
        ];
        assert_violations(
            &semaphore_limit(&holds),
            "semaphore_limit",
            &[
                "semaphore \"s\" (limit 2): 3 places held at once at 5ms: client 1 under fence 3 in [0ns, 20ms), \
                 client 2 under fence 7 in [2ms, 20ms), client 3 under fence 9 in [5ms, 8ms)",
                "3 places held at once at 12ms",
            ],
        );
    }

    #[test]
    fn semaphore_limit_reports_a_fence_two_clients_held_a_place_under() {
        // Never more than two places at once, counted by fence; but fence 7 went to two clients.
        let holds = [place(1, "s", 2, 7, 0, 10), place(2, "s", 2, 7, 20, 30), place(3, "s", 2, 8, 0, 30)];
        assert_violations(
            &semaphore_limit(&holds),
            "semaphore_limit",
            &["semaphore \"s\": clients {1, 2} each held a place under fence 7"],
        );
    }

    // fenced_resource

    #[test]
    fn fenced_resource_passes_increments_under_rising_fences() {
        let accesses = [
            read(1, 3, 0, 0, true),
            write(1, 3, 1, 0, 1, true),
            // A stale client is refused: refusals are the resource doing its job.
            read(2, 2, 2, 0, false),
            write(2, 2, 3, 0, 1, false),
            // Same fence again is fine, higher is fine.
            write(1, 3, 4, 1, 2, true),
            read(3, 8, 5, 2, true),
            write(3, 8, 6, 2, 3, true),
        ];
        assert_eq!(fenced_resource(&accesses), vec![]);
    }

    #[test]
    fn fenced_resource_reports_stale_access_accepted() {
        let accesses = [write(1, 5, 0, 0, 1, true), read(2, 4, 1, 1, true), write(3, 6, 2, 1, 2, true)];
        assert_violations(
            &fenced_resource(&accesses),
            "fenced_resource",
            &["stale access accepted: client 2 at 1ms under fence 4 after client 1 at 0ns under fence 5"],
        );
    }

    #[test]
    fn fenced_resource_reports_lost_update() {
        // Two clients under one fence (as if it were granted twice): fencing cannot tell them apart, both
        // read 0, both writes are accepted, and client 1's increment is lost.
        let accesses =
            [read(1, 5, 0, 0, true), read(2, 5, 1, 0, true), write(1, 5, 2, 0, 1, true), write(2, 5, 3, 0, 1, true)];
        assert_violations(
            &fenced_resource(&accesses),
            "fenced_resource",
            &["lost update: client 2 at 3ms under fence 5 wrote 1 computed from 0, overwriting 1"],
        );
    }

    #[test]
    fn fenced_resource_reports_bad_increment_and_judges_later_writes_by_what_was_written() {
        let accesses = [write(1, 5, 0, 0, 7, true), write(1, 5, 1, 7, 8, true)];
        assert_violations(&fenced_resource(&accesses), "fenced_resource", &["bad increment: client 1"]);
    }

    // fence_order

    #[test]
    fn fence_order_passes_rising_fences_and_any_order_among_concurrent_grants() {
        let ops = [
            acquire(1, "a", 0, 10, granted(5)),
            // Concurrent with the first (sent before it answered): either fence order is fine.
            acquire(2, "b", 5, 15, granted(4)),
            // Sent the instant the first answered: not strictly after, so still concurrent.
            acquire(3, "c", 10, 12, granted(3)),
            acquire(1, "d", 20, 30, granted(9)),
            // Grants are the only answers with fences.
            acquire(4, "a", 40, 41, BUSY),
            release(1, "a", 5, 42, 43, Outcome::Released),
        ];
        assert_eq!(fence_order(&ops), vec![]);
    }

    #[test]
    fn fence_order_reports_a_fence_granted_twice() {
        let ops = [acquire(1, "a", 0, 10, granted(5)), acquire(2, "a", 2, 8, granted(5))];
        assert_violations(&fence_order(&ops), "fence_order", &["fence 5 granted twice: client 1"]);
    }

    /// One entry may grant several locks (a batch, an expiry's hand-overs): they share its index.
    #[test]
    fn fence_order_passes_one_fence_on_different_locks() {
        let ops = [acquire(1, "a", 0, 10, granted(5)), acquire(2, "b", 2, 8, granted(5))];
        assert_eq!(fence_order(&ops), vec![]);
    }

    #[test]
    fn fence_order_reports_a_later_grant_with_a_lower_fence() {
        let ops = [
            acquire(1, "a", 0, 10, granted(5)),
            acquire(2, "b", 0, 3, granted(8)),
            // Sent after both answered: must be above 8, the highest of them.
            acquire(3, "c", 11, 12, granted(7)),
            acquire(4, "d", 13, 14, granted(9)),
        ];
        assert_violations(
            &fence_order(&ops),
            "fence_order",
            &["fence 7 is not above fence 8, granted before it was invoked: client 2"],
        );
    }

    /// A session that gave up waiting just before its grant arrived is given that grant by its next acquire,
    /// whose fence is then older than the call. Only a one-call acquire is judged by real-time order;
    /// distinct fences are still required of every grant of a lock.
    #[test]
    fn fence_order_judges_only_one_call_acquires_by_real_time() {
        let session = |fence| op(2, "f", Call::Acquire { ttl_ms: 0, wait: true }, 20, Some(21), granted(fence));
        let earlier = acquire(1, "m", 0, 10, granted(8));
        assert_eq!(fence_order(&[earlier.clone(), session(5)]), vec![]);
        assert_violations(
            &fence_order(&[earlier.clone(), acquire(2, "f", 20, 21, granted(5))]),
            "fence_order",
            &["fence 5 is not above fence 8"],
        );
        let same_lock = op(2, "m", Call::Acquire { ttl_ms: 0, wait: true }, 20, Some(21), granted(8));
        assert_violations(&fence_order(&[earlier, same_lock]), "fence_order", &["fence 8 granted twice"]);
    }

    #[test]
    fn fence_order_handles_many_grants() {
        // Ten thousand sequential grants under rising fences, listed newest first so that the order of the
        // input is not the order of time.
        let mut ops: Vec<Op> = (0..10_000u64).map(|i| acquire(1, "a", 10 * i, 10 * i + 5, granted(i + 1))).collect();
        ops.reverse();
        assert_eq!(fence_order(&ops), vec![]);
        ops[0].outcome = granted(1);
        assert_eq!(fence_order(&ops).len(), 2, "one duplicate fence, one inversion");
    }

    // acknowledged

    #[test]
    fn acknowledged_passes_when_the_end_state_keeps_every_acknowledgement() {
        let short = Call::Acquire { ttl_ms: 100, wait: false };
        let ops = [
            // Still held at the end.
            acquire(1, "a", 0, 10, granted(5)),
            // Granted and released.
            acquire(2, "b", 0, 10, granted(6)),
            release(2, "b", 6, 20, 30, Outcome::Released),
            // Granted; a release was sent and got no answer: it may have let go.
            acquire(3, "c", 0, 10, granted(7)),
            release(3, "c", 7, 20, 30, Outcome::Unknown),
            // Granted with a lease that ran out exactly when the end was read: it may be gone.
            op(4, "d", short, 900, Some(910), granted(8)),
            // Busy and failed calls promise nothing.
            acquire(5, "a", 20, 30, BUSY),
            acquire(5, "e", 20, 30, Outcome::Unknown),
            release(5, "a", 99, 20, 30, Outcome::NotHeld),
        ];
        assert_eq!(acknowledged(&ops, &end(1_000, &[("a", 5)])), vec![]);
    }

    #[test]
    fn acknowledged_reports_a_lost_grant() {
        let short = Call::Acquire { ttl_ms: 100, wait: false };
        let ops = [
            acquire(1, "a", 0, 10, granted(5)),
            // Its lease outlasts the end by a millisecond.
            op(2, "b", short, 901, Some(910), granted(6)),
            acquire(3, "c", 0, 10, granted(7)),
            // A release of another fence does not excuse it.
            release(3, "c", 4, 20, 30, Outcome::Unknown),
        ];
        assert_violations(
            &acknowledged(&ops, &end(1_000, &[("c", 9)])),
            "acknowledged",
            &[
                "acknowledged grant lost: client 1 acquire(60000ms) on \"a\" [0ns, 10ms] -> granted 5",
                "acknowledged grant lost: client 2",
                "but the end state has fence 9 holding it",
            ],
        );
    }

    #[test]
    fn acknowledged_finds_grants_among_a_semaphores_holders() {
        let ops = [
            acquire(1, "s", 0, 10, granted(5)),
            acquire(2, "s", 0, 10, granted(6)),
            acquire(3, "s", 20, 30, granted(8)),
            release(3, "s", 8, 40, 50, Outcome::Released),
        ];
        assert_eq!(acknowledged(&ops, &end(1_000, &[("s", 5), ("s", 6)])), vec![]);
        assert_violations(
            &acknowledged(&ops, &end(1_000, &[("s", 5), ("s", 8)])),
            "acknowledged",
            &[
                "client 2 acquire(60000ms) on \"s\" [0ns, 10ms] -> granted 6, lease of 60000ms not run out by 1s, \
               but the end state has fences [5, 8] holding it",
                "acknowledged release lost: client 3",
            ],
        );
    }

    #[test]
    fn acknowledged_reports_a_lost_release() {
        let ops = [acquire(1, "a", 0, 10, granted(5)), release(1, "a", 5, 20, 30, Outcome::Released)];
        assert_violations(
            &acknowledged(&ops, &end(1_000, &[("a", 5)])),
            "acknowledged",
            &["acknowledged release lost: client 1 release(5) on \"a\" [20ms, 30ms] -> released"],
        );
    }

    // liveness

    #[test]
    fn liveness_passes_definite_answers_within_the_bound_after_healing() {
        let ops = [
            // Before healing anything goes.
            acquire_unanswered(1, "a", 0),
            acquire(2, "a", 10, 5_000, Outcome::Unknown),
            // After: definite, and the slowest exactly at the bound.
            acquire(1, "a", 100, 200, granted(3)),
            release(1, "a", 3, 300, 1_300, Outcome::Released),
        ];
        assert_eq!(liveness(&ops, ms(100), ms(1_000)), vec![]);
    }

    #[test]
    fn liveness_reports_calls_after_healing_without_a_timely_definite_answer() {
        let ops = [
            acquire_unanswered(1, "a", 100),
            acquire(2, "a", 200, 300, Outcome::Unknown),
            release(3, "a", 3, 300, 1_301, Outcome::NotHeld),
            acquire(4, "a", 400, 500, BUSY),
        ];
        assert_violations(
            &liveness(&ops, ms(100), ms(1_000)),
            "liveness",
            &["client 1", "client 2 acquire(60000ms) on \"a\" [200ms, 300ms] -> unknown", "took 1.001s"],
        );
    }

    // linearizable

    #[test]
    fn linearizable_passes_a_sequential_history() {
        let ops = [
            acquire(1, "a", 0, 10, granted(3)),
            acquire(2, "a", 20, 30, BUSY),
            // A fence of client 2's from before: not the holder's.
            release(2, "a", 2, 40, 50, Outcome::NotHeld),
            release(1, "a", 3, 60, 70, Outcome::Released),
            release(1, "a", 3, 80, 90, Outcome::NotHeld),
            acquire(2, "a", 100, 110, granted(9)),
        ];
        assert_eq!(linearizable(&ops), vec![]);
    }

    #[test]
    fn linearizable_passes_concurrent_calls_placed_out_of_send_order() {
        let ops = [
            // Client 2 is sent first but told Busy: it must have taken effect after client 1's grant.
            acquire(2, "a", 0, 30, BUSY),
            acquire(1, "a", 5, 10, granted(3)),
            // The release and a fresh grant overlap a Busy, which falls between them.
            release(1, "a", 3, 40, 60, Outcome::Released),
            acquire(3, "a", 45, 70, BUSY),
            acquire(4, "a", 50, 80, granted(4)),
        ];
        assert_eq!(linearizable(&ops), vec![]);
    }

    #[test]
    fn linearizable_checks_each_lock_on_its_own() {
        // Interleaved on two locks: each is sequentially fine, though fences interleave across them.
        let ops = [
            acquire(1, "a", 0, 10, granted(3)),
            acquire(2, "b", 5, 15, granted(4)),
            acquire(2, "a", 20, 30, BUSY),
            acquire(1, "b", 20, 30, BUSY),
        ];
        assert_eq!(linearizable(&ops), vec![]);
    }

    #[test]
    fn linearizable_reports_busy_after_the_release_completed() {
        let ops = [
            acquire(1, "a", 0, 10, granted(3)),
            release(1, "a", 3, 20, 30, Outcome::Released),
            // Sent after the release answered, and nobody else acquired: the lock was free.
            acquire(2, "a", 40, 50, BUSY),
        ];
        assert_violations(
            &linearizable(&ops),
            "linearizable",
            &["lock \"a\" is not linearizable: at best 2 of its 3 answered calls fit (lock then free, fences \
               granted up to 3), and then nothing fits; the first answered call left is client 2 acquire(60000ms) \
               on \"a\" [40ms, 50ms] -> busy"],
        );
    }

    #[test]
    fn linearizable_passes_reads_of_the_holder_and_of_a_free_lock() {
        let ops = [
            get(3, "a", 0, 5, Outcome::Free),
            acquire(1, "a", 10, 20, granted(3)),
            get(3, "a", 30, 40, Outcome::Holds { fence: 3 }),
            // Overlapping the release: either answer fits.
            release(1, "a", 3, 50, 70, Outcome::Released),
            get(3, "a", 55, 65, Outcome::Holds { fence: 3 }),
            get(2, "a", 56, 66, Outcome::Free),
        ];
        assert_eq!(linearizable(&ops), vec![]);
    }

    #[test]
    fn linearizable_leaves_out_a_read_of_a_fence_nobody_was_told() {
        // Client 1's acquire got no answer; its node granted it under fence 64, a read saw that, then the
        // node undid the grant (its client had gone), and client 2 was granted 84.
        let ops = [
            acquire(1, "a", 0, 10, granted(58)),
            release(1, "a", 58, 20, 30, Outcome::Released),
            acquire_unanswered(1, "a", 40),
            get(9, "a", 100, 200, Outcome::Holds { fence: 64 }),
            acquire(2, "a", 300, 310, granted(84)),
        ];
        assert_eq!(linearizable(&ops), vec![]);
    }

    #[test]
    fn linearizable_reports_a_read_of_a_holder_that_had_let_go() {
        let ops = [
            acquire(1, "a", 0, 10, granted(3)),
            release(1, "a", 3, 20, 30, Outcome::Released),
            // Sent after the release answered: a stale read, as from a deposed leader.
            get(2, "a", 40, 50, Outcome::Holds { fence: 3 }),
        ];
        assert_violations(&linearizable(&ops), "linearizable", &["client 2 get on \"a\" [40ms, 50ms] -> held under 3"]);
    }

    #[test]
    fn linearizable_reports_a_read_of_a_free_lock_while_it_was_held() {
        let ops = [acquire(1, "a", 0, 10, granted(3)), get(2, "a", 20, 30, Outcome::Free)];
        assert_violations(&linearizable(&ops), "linearizable", &["client 2 get on \"a\" [20ms, 30ms] -> free"]);
        // Nor an older holder's fence while an unanswered acquire holds it.
        let ops = [
            acquire(1, "a", 0, 10, granted(3)),
            release(1, "a", 3, 20, 30, Outcome::Released),
            acquire_unanswered(2, "a", 40),
            get(3, "a", 100, 110, Outcome::Holds { fence: 3 }),
        ];
        assert_violations(&linearizable(&ops), "linearizable", &["-> held under 3"]);
    }

    #[test]
    fn linearizable_reports_two_holders_at_once() {
        let ops = [acquire(1, "a", 0, 10, granted(3)), acquire(2, "a", 20, 30, granted(4))];
        assert_violations(&linearizable(&ops), "linearizable", &["lock then held under fence 3"]);
    }

    #[test]
    fn linearizable_reports_a_fence_not_above_an_earlier_one_on_the_lock() {
        for fence in [4, 5] {
            let ops = [
                acquire(1, "a", 0, 10, granted(5)),
                release(1, "a", 5, 20, 30, Outcome::Released),
                acquire(2, "a", 40, 50, granted(fence)),
            ];
            assert_violations(&linearizable(&ops), "linearizable", &["the first answered call left is client 2"]);
        }
    }

    #[test]
    fn linearizable_reports_release_of_a_fence_that_does_not_hold() {
        let ops = [acquire(1, "a", 0, 10, granted(5)), release(2, "a", 4, 20, 30, Outcome::Released)];
        assert_violations(&linearizable(&ops), "linearizable", &["release(4)"]);
    }

    #[test]
    fn linearizable_reports_answers_a_lock_never_gives() {
        let ops = [acquire(1, "a", 0, 10, Outcome::Released)];
        assert_violations(
            &linearizable(&ops),
            "linearizable",
            &["client 1 acquire(60000ms) on \"a\" [0ns, 10ms] -> released"],
        );
    }

    #[test]
    fn linearizable_passes_an_unknown_acquire_that_must_have_taken_effect() {
        // Nobody was granted the lock, yet client 2 was told Busy: only the unanswered acquire explains it.
        let ops = [acquire_unanswered(1, "a", 0), acquire(2, "a", 10, 20, BUSY)];
        assert_eq!(linearizable(&ops), vec![]);
        // Answered with an error rather than not at all: the same.
        let ops = [acquire(1, "a", 0, 5, Outcome::Unknown), acquire(2, "a", 10, 20, BUSY)];
        assert_eq!(linearizable(&ops), vec![]);
    }

    #[test]
    fn linearizable_passes_an_unknown_acquire_that_must_not_have_taken_effect() {
        let ops = [
            acquire_unanswered(1, "a", 0),
            // The lock is granted twice after the unknown acquire was sent: had it taken effect before either
            // grant, the lock would have been held for good under a fence nobody knows, and not free.
            acquire(2, "a", 10, 20, granted(3)),
            release(2, "a", 3, 30, 40, Outcome::Released),
            acquire(3, "a", 50, 60, granted(4)),
        ];
        assert_eq!(linearizable(&ops), vec![]);
    }

    #[test]
    fn linearizable_passes_an_unknown_release_either_way() {
        let took_effect = [
            acquire(1, "a", 0, 10, granted(3)),
            release(1, "a", 3, 20, 30, Outcome::Unknown),
            acquire(2, "a", 40, 50, granted(4)),
        ];
        assert_eq!(linearizable(&took_effect), vec![]);
        let did_not = [
            acquire(1, "a", 0, 10, granted(3)),
            release(1, "a", 3, 20, 30, Outcome::Unknown),
            acquire(2, "a", 40, 50, BUSY),
        ];
        assert_eq!(linearizable(&did_not), vec![]);
    }

    #[test]
    fn linearizable_reports_busy_that_an_unknown_acquire_sent_later_cannot_explain() {
        let ops = [acquire(2, "a", 10, 20, BUSY), acquire_unanswered(1, "a", 30)];
        assert_violations(&linearizable(&ops), "linearizable", &["client 2"]);
    }

    #[test]
    fn linearizable_reports_a_grant_after_an_unknown_acquire_that_must_have_taken_effect() {
        // The Busy at 20 needs the unknown acquire to hold the lock, under a fence nobody can release, so the
        // lock cannot be free for the grant at 40.
        let ops = [acquire_unanswered(1, "a", 0), acquire(2, "a", 10, 20, BUSY), acquire(3, "a", 30, 40, granted(5))];
        assert_violations(&linearizable(&ops), "linearizable", &["client 3"]);
    }

    #[test]
    fn linearizable_leaves_out_a_busy_answer_showing_a_fence_nobody_was_told() {
        // Client 1's acquire got no answer, its node granted it and undid the grant once the client had
        // gone; meanwhile client 2 was told busy, showing that grant's fence. Then a read found the lock free
        // and client 3 took it. Judged, the busy answer needs the unanswered acquire to hold the lock for
        // good, and nothing after it fits.
        let ops = |shown: Option<u64>| {
            [
                acquire_unanswered(1, "a", 0),
                acquire(2, "a", 10, 20, Outcome::Busy { holder: shown }),
                get(8, "a", 30, 35, Outcome::Free),
                acquire(3, "a", 40, 50, granted(95)),
            ]
        };
        assert_eq!(linearizable(&ops(Some(93))), vec![]);
        assert_violations(&linearizable(&ops(None)), "linearizable", &["client 8"]);
        // A busy answer showing a fence a client was told is judged: here it shows a hold already released.
        let told = [
            acquire(1, "a", 0, 10, granted(3)),
            release(1, "a", 3, 20, 30, Outcome::Released),
            acquire(2, "a", 40, 50, Outcome::Busy { holder: Some(3) }),
        ];
        assert_violations(&linearizable(&told), "linearizable", &["client 2"]);
    }

    #[test]
    fn linearizable_keeps_a_lock_an_unknown_acquire_took_held_for_good() {
        // The Busy needs the unknown acquire to have taken effect between the release and it. Nobody learned
        // its fence, so nobody can release it, and a later grant cannot fit, whatever its fence.
        let ops = [
            acquire(1, "a", 0, 10, granted(3)),
            release(1, "a", 3, 20, 30, Outcome::Released),
            acquire_unanswered(2, "a", 15),
            acquire(3, "a", 40, 50, BUSY),
        ];
        assert_eq!(linearizable(&ops), vec![]);
        let mut more = ops.to_vec();
        more.push(acquire(4, "a", 60, 70, granted(100)));
        assert_violations(&linearizable(&more), "linearizable", &["client 4"]);
    }

    #[test]
    fn linearizable_skips_waiting_acquires() {
        // A session's acquire queues; the model does not, so it is left out rather than misjudged.
        let waiting = Call::Acquire { ttl_ms: 60_000, wait: true };
        let ops = [acquire(1, "a", 0, 10, granted(3)), op(2, "a", waiting, 20, Some(30), granted(4))];
        assert_eq!(linearizable(&ops), vec![]);
    }

    #[test]
    fn linearizable_reports_undecided_when_the_budget_runs_out() {
        let ops = [
            acquire(1, "a", 0, 10, granted(3)),
            release(1, "a", 3, 20, 30, Outcome::Released),
            acquire(2, "a", 40, 50, granted(4)),
            release(2, "a", 4, 60, 70, Outcome::Released),
        ];
        assert_eq!(linearizable_within(&ops, 4), vec![]);
        assert_violations(
            &linearizable_within(&ops, 3),
            "linearizable",
            &["undecided: search budget exceeded for lock \"a\" (4 ops, 3 steps)"],
        );
    }

    /// A tiny deterministic generator (an LCG), so the generated histories are the same on every run.
    struct Lcg(u64);

    impl Lcg {
        fn below(&mut self, bound: u64) -> u64 {
            self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 33) % bound
        }
    }

    /// A history that is linearizable by construction: `count` calls on one lock by four clients take
    /// effect one at a time, 10ms apart, on a sequential lock, and each call's span is then widened around
    /// its moment of effect by up to `spread_ms` either way, so about `spread_ms / 5` overlap at once. One
    /// call in `unknown_one_in` gets no definite answer (releases among them take effect or not at random).
    /// Returns the history and the highest fence granted.
    fn generated(seed: u64, count: u64, spread_ms: u64, unknown_one_in: u64) -> (Vec<Op>, u64) {
        let mut rng = Lcg(seed);
        let mut holder: Option<u64> = None;
        let mut fence_last = 0;
        // The fence each client last got, so its releases name fences it learned.
        let mut learned = [None::<u64>; 4];
        let mut ops = Vec::new();
        for k in 0..count {
            let effect_ms = spread_ms + 10 * k;
            let invoked_ms = effect_ms - rng.below(spread_ms + 1);
            let completed_ms = effect_ms + rng.below(spread_ms + 1);
            let client = rng.below(4) as usize;
            let unknown = rng.below(unknown_one_in) == 0;
            let (call, outcome) = match learned[client] {
                Some(fence) if rng.below(2) == 0 => {
                    let call = Call::Release { fence };
                    if unknown {
                        if holder == Some(fence) && rng.below(2) == 0 {
                            holder = None;
                        }
                        (call, Outcome::Unknown)
                    } else if holder == Some(fence) {
                        holder = None;
                        (call, Outcome::Released)
                    } else {
                        (call, Outcome::NotHeld)
                    }
                }
                _ => {
                    let call = Call::Acquire { ttl_ms: 60_000, wait: false };
                    // An unknown acquire never takes effect here: one that did would hold the lock for good.
                    if unknown {
                        (call, Outcome::Unknown)
                    } else if holder.is_some() {
                        (call, Outcome::Busy { holder })
                    } else {
                        // Log indexes: other locks' entries leave gaps.
                        fence_last += 1 + rng.below(3);
                        holder = Some(fence_last);
                        learned[client] = Some(fence_last);
                        (call, granted(fence_last))
                    }
                }
            };
            let completed = (!unknown || rng.below(2) == 0).then_some(completed_ms);
            ops.push(op(client as u32, "a", call, invoked_ms, completed, outcome));
        }
        (ops, fence_last)
    }

    /// Checks the generated history, then two broken by calls after all of it, which no order can explain.
    #[track_caller]
    fn check_generated(seed: u64, count: u64, spread_ms: u64, unknown_one_in: u64) {
        let (ops, fence_last) = generated(seed, count, spread_ms, unknown_one_in);
        assert_eq!(linearizable(&ops), vec![], "seed {seed}");
        // Sent after every generated call answered, by a client of its own.
        let after_ms = 100_000;

        // Whatever order the generated calls take, a grant after all of them needs a fence above theirs.
        let mut reused_fence = ops.clone();
        reused_fence.push(acquire(9, "a", after_ms, after_ms + 1, granted(fence_last)));
        assert_violations(&linearizable(&reused_fence), "linearizable", &["client 9"]);

        // Two grants in a row with nothing between: nobody else learned the first's fence, so nobody released
        // it, and the second cannot find the lock free.
        let mut granted_twice = ops;
        granted_twice.push(acquire(9, "a", after_ms, after_ms + 1, granted(fence_last + 10)));
        granted_twice.push(acquire(9, "a", after_ms + 2, after_ms + 3, granted(fence_last + 20)));
        assert_violations(&linearizable(&granted_twice), "linearizable", &["client 9"]);
    }

    #[test]
    fn linearizable_passes_generated_linearizable_histories_and_reports_them_broken() {
        for seed in 0..20 {
            check_generated(seed, 150, 40, 8);
        }
    }

    #[test]
    fn linearizable_decides_highly_concurrent_histories_with_many_unknown_calls() {
        // About twenty calls overlap at once and a third have no answer. A broken history makes the search
        // try every order, so this is what the step budget must cover: the detail would say "undecided" and
        // lack "client 9" if it did not.
        for seed in 0..3 {
            check_generated(seed, 100, 100, 3);
        }
    }

    // all

    #[test]
    fn all_passes_a_clean_history() {
        let history = History {
            ops: vec![acquire(1, "a", 0, 10, granted(3)), acquire(2, "a", 20, 30, BUSY)],
            holds: vec![hold(1, "a", 3, 10, 60_000), place(2, "s", 2, 4, 0, 10), place(3, "s", 2, 5, 0, 10)],
            accesses: vec![write(1, 3, 15, 0, 1, true)],
            watched: vec![seen(9, "a", 0, 0, None), seen(9, "a", 0, 3, Some(3))],
            leased: vec![leased(1, "a", 3, 1_000, 61_000, 500)],
            end: Some(end(100, &[("a", 3)])),
            last_membership_change: None,
        };
        assert_eq!(all(&history, ms(0), ms(1_000), &|_| true), vec![]);
    }

    #[test]
    fn all_runs_every_checker() {
        let history = History {
            ops: vec![
                acquire(1, "a", 0, 10, granted(3)),
                acquire(2, "a", 20, 30, granted(3)),
                acquire(3, "b", 40, 5_000, BUSY),
            ],
            holds: vec![
                hold(1, "a", 3, 10, 60_000),
                hold(2, "a", 3, 30, 60_000),
                place(3, "s", 2, 4, 0, 10),
                place(4, "s", 2, 5, 0, 10),
                place(5, "s", 2, 6, 0, 10),
            ],
            accesses: vec![write(1, 3, 15, 0, 1, true), write(2, 3, 35, 0, 1, true)],
            watched: vec![seen(9, "a", 0, 1, None), seen(9, "a", 0, 5, None)],
            leased: vec![leased(1, "d", 1, 0, 1_000, 500), leased(2, "d", 2, 1_400, 2_400, 500)],
            end: Some(end(100, &[])),
            last_membership_change: None,
        };
        let checkers: Vec<&str> =
            all(&history, ms(0), ms(1_000), &|_| true).iter().map(|violation| violation.checker).collect();
        assert_eq!(
            checkers,
            [
                "mutual_exclusion",
                "semaphore_limit",
                "fenced_resource",
                "fence_order",
                "fence_order",
                "acknowledged",
                "acknowledged",
                "liveness",
                "watches",
                "lock_delay",
                "linearizable",
                "linearizable",
            ]
        );
    }

    fn leased(client: u32, lock: &str, fence: u64, granted_at_ms: u64, expires_at_ms: u64, delay: u64) -> Leased {
        Leased { client, lock: lock.to_owned(), fence, granted_at_ms, expires_at_ms, lock_delay_ms: delay }
    }

    #[test]
    fn lock_delay_holds_a_grant_after_an_expiry_to_the_end_of_the_delay_and_not_after_a_release() {
        // Fence 3 expired at 2 000 ms with a 500 ms delay: fence 9 at 2 500 ms is on time, fence 7 at 2 499 ms
        // is not. Fence 9's client sent a release (answered or not): nothing waits after it.
        let leased = [
            leased(1, "d", 3, 1_000, 2_000, 500),
            leased(2, "d", 7, 2_499, 3_499, 500),
            leased(3, "d", 9, 2_500, 3_500, 500),
            leased(4, "d", 11, 3_500, 4_500, 0),
            leased(5, "e", 1, 1_000, 1_100, 500),
        ];
        let ops = [
            Op {
                client: 3,
                lock: "d".into(),
                call: Call::Release { fence: 9 },
                invoked: ms(3_000),
                completed: None,
                outcome: Outcome::Unknown,
            },
            Op {
                client: 2,
                lock: "d".into(),
                call: Call::Release { fence: 7 },
                invoked: ms(2_600),
                completed: Some(ms(2_610)),
                outcome: Outcome::Released,
            },
        ];
        let found = lock_delay(&leased, &ops);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(found[0].detail.contains("fence 7 at 2499 ms") && found[0].detail.contains("fence 3"), "{found:?}");
        assert_eq!(lock_delay(&leased[2..], &ops), vec![], "a grant after a released hold waits for nothing");
    }

    fn seen(client: u32, lock: &str, segment: u64, revision: u64, holder: Option<u64>) -> Watched {
        Watched { client, lock: lock.to_owned(), segment, revision, holder, at: ms(revision) }
    }

    #[test]
    fn watches_pass_a_stream_with_every_grant_and_forgive_what_fell_between_streams() {
        let ops = [
            acquire(1, "a", 0, 10, granted(3)),
            acquire(2, "a", 20, 30, granted(7)),
            acquire(3, "a", 40, 50, granted(12)),
            acquire(4, "b", 40, 50, granted(5)),
        ];
        let watched = [
            // A stream from before the first grant to the second's release: both grants shown.
            seen(9, "a", 0, 0, None),
            seen(9, "a", 0, 3, Some(3)),
            seen(9, "a", 0, 4, Some(3)),
            seen(9, "a", 0, 7, Some(7)),
            seen(9, "a", 0, 7, Some(7)),
            seen(9, "a", 0, 9, None),
            // The next stream begins after the third grant: what came between is not owed.
            seen(9, "a", 1, 13, Some(12)),
        ];
        assert_eq!(watches(&watched, &ops), vec![]);
    }

    #[test]
    fn watches_report_a_missed_grant_a_revision_going_back_and_a_holder_from_the_future() {
        let ops = [acquire(1, "a", 0, 10, granted(3)), acquire(2, "a", 20, 30, granted(7))];
        let missed = [seen(9, "a", 0, 2, None), seen(9, "a", 0, 7, Some(7))];
        let found = watches(&missed, &ops);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].detail.contains("missed the grant under fence 3"), "{found:?}");
        let backwards = [seen(9, "a", 0, 3, Some(3)), seen(9, "a", 1, 2, None)];
        assert!(watches(&backwards, &ops)[0].detail.contains("revision 2 after 3"));
        let future = [seen(9, "a", 0, 3, Some(7))];
        assert!(watches(&future, &ops)[0].detail.contains("from the future"));
    }

    #[test]
    fn all_checks_linearizability_only_on_modelled_locks_and_acknowledgements_only_with_an_end() {
        let history = History {
            ops: vec![acquire(1, "leased", 0, 10, granted(3)), acquire(2, "leased", 20, 30, granted(4))],
            ..History::default()
        };
        // Two grants in a row on a lock whose lease may have expired between them: not for the model.
        assert_eq!(all(&history, ms(0), ms(1_000), &|lock| lock != "leased"), vec![]);
        assert_violations(&all(&history, ms(0), ms(1_000), &|_| true), "linearizable", &["lock \"leased\""]);
        // An end state read with neither grant in it: both acknowledged grants were lost.
        let with_end = History { end: Some(end(100, &[])), ..history };
        assert_violations(
            &all(&with_end, ms(0), ms(1_000), &|lock| lock != "leased"),
            "acknowledged",
            &["granted 3", "granted 4"],
        );
    }
}
