//! A leader's failure in the ways a random schedule reaches only now and then, forced by a scenario.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast_server::Bugs;
use holdfast_sim::history::{At, Outcome};
use holdfast_sim::isolated::test_in_own_process;
use holdfast_sim::record::now;
use holdfast_sim::sim::{run, script, Fault, Plan, Report, Store};
use holdfast_sim::workload::{
    http_acquire, leader_of, session_hold, until, Ctx, KEPT_PREFIX, MODEL_TTL_MS, SESSION_LEASE,
};
use hyper::{Method, StatusCode};

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// The `n`th (from 0) node of a three-node cluster other than `leader`, lowest first: the one
/// `Fault::HoldFollower` holds is the 0th.
fn follower(leader: u64, n: usize) -> Result<u64, &'static str> {
    (1..=3).filter(|id| *id != leader).nth(n).ok_or("no such follower")
}

/// Whether the run applied `fault`, with its note (e.g. `CrashLeader (n3)`).
fn applied(report: &Report, fault: &str) -> bool {
    report.trace.iter().any(|line| line.ends_with(fault))
}

/// Adds a client to `plan` that finds the leader at 0.5 s and then runs `client` with the leader's id and
/// the place it records what it saw, which this answers.
fn client<T, F, Fut>(plan: &mut Plan, client: F) -> Arc<Mutex<T>>
where
    T: Default + 'static,
    F: Fn(Ctx, u64, Arc<Mutex<T>>) -> Fut + 'static,
    Fut: Future<Output = turmoil::Result> + 'static,
{
    let seen = Arc::new(Mutex::new(T::default()));
    let (shared, client) = (seen.clone(), Arc::new(client));
    plan.scripts.push(script(move |ctx| {
        let (seen, client) = (shared.clone(), client.clone());
        async move {
            until(secs(0.5)).await;
            let leader = leader_of(&ctx.nodes[0]).await.ok_or("no leader")?;
            client(ctx, leader, seen).await
        }
    }));
    seen
}

/// Sets `plan`'s faults, in order; the last must be the heal.
fn schedule(plan: &mut Plan, faults: Vec<(f64, Fault)>) {
    plan.healed_at = faults.last().map(|(at, _)| secs(*at)).expect("a heal");
    plan.faults = faults.into_iter().map(|(at, fault)| (secs(at), fault)).collect();
}

/// Runs `plan`, prints what it did, and checks that it kept every guarantee.
fn run_clean(plan: &Plan) -> Report {
    let report = run(plan);
    println!("{}\n{}", report.summary(), report.trace.join("\n"));
    println!("holds: {:?}\ncalls: {:?}", report.history.holds, report.history.ops);
    assert!(report.violations.is_empty(), "{}", report.summary());
    report
}

/// What the scenario's client saw.
#[derive(Debug, Default)]
struct Seen {
    /// The leader before the faults, and the follower cut off from it (the lowest-numbered other node).
    old: u64,
    cut: u64,
    /// The third node: it takes every write while the other follower is cut off, so its log is longer.
    other: u64,
    /// Grants through the old leader while the follower was cut off.
    granted_before: usize,
    /// When the third node first named a new leader after the old one crashed, if a lock taken through it
    /// then was granted.
    granted_after: Option<At>,
    /// The leader the third node knows of then.
    leader_after: Option<u64>,
    /// The third node's `holdfast_raft_early_campaigns_total`.
    early_campaigns: Option<u64>,
}

/// A follower is cut off from its leader (not from the other follower), the leader goes on with the other
/// follower, and then crashes. The cut-off follower, which heard the leader last, tries first: its pre-vote
/// reaches the other follower after the old leader's lease has run out there, and its log is behind, so
/// it is refused, and the follower that refused it, which has to lead (it alone holds the last entries),
/// campaigns at once rather than on its own election watch (`Elections::answer_pre_vote`; ARCHITECTURE.md,
/// "Election timing").
#[test]
fn a_follower_that_refuses_a_shorter_log_campaigns_at_once() {
    test_in_own_process("a_follower_that_refuses_a_shorter_log_campaigns_at_once", || {
        holdfast_sim::record::log_if_asked();
        let mut plan = Plan::quiet(7, 3, secs(8.0));
        let seen = client(&mut plan, |ctx, old, seen: Arc<Mutex<Seen>>| async move {
            let (cut, other) = (follower(old, 0)?, follower(old, 1)?);
            // The follower is cut off from 1 s: these entries reach the third node only.
            until(secs(1.1)).await;
            let mut granted_before = 0;
            for i in 0..3 {
                let lock = format!("{KEPT_PREFIX}elections-{i}");
                if let (Outcome::Granted { .. }, _) =
                    http_acquire(&ctx, &format!("n{old}:7070"), &lock, MODEL_TTL_MS).await
                {
                    granted_before += 1;
                }
            }
            // The leader crashes at 1.5 s. A write sent through the third node before it knows of a new
            // leader would wait for the old one (`Node::forward`), so ask it for the leader every 20 ms.
            until(secs(1.5)).await;
            let through = format!("n{other}:7070");
            let mut leader_after = None;
            while now() < secs(5.0) {
                leader_after = leader_of(&through).await.filter(|leader| *leader != old);
                if leader_after.is_some() {
                    break;
                }
                tokio::time::sleep(secs(0.02)).await;
            }
            let led_at = now();
            let lock = format!("{KEPT_PREFIX}elections-after");
            let granted_after = match http_acquire(&ctx, &through, &lock, MODEL_TTL_MS).await {
                (Outcome::Granted { .. }, _) => Some(led_at),
                _ => None,
            };
            let early_campaigns = metric(other, "holdfast_raft_early_campaigns_total").await;
            *seen.lock().expect("poisoned") =
                Seen { old, cut, other, granted_before, granted_after, leader_after, early_campaigns };
            Ok(())
        });
        schedule(&mut plan, vec![(1.0, Fault::CutFollower(0)), (1.5, Fault::CrashLeader), (6.0, Fault::Heal)]);
        let report = run_clean(&plan);
        let seen = seen.lock().expect("poisoned");
        println!("{seen:?}");
        // The faults hit the nodes the client took them for, and the third node's log was ahead.
        let (old, cut, other) = (seen.old, seen.cut, seen.other);
        assert!(applied(&report, &format!("CutFollower(0) (n{cut}, led by n{old})")));
        assert!(applied(&report, &format!("CrashLeader (n{old})")));
        assert!(seen.granted_before > 0, "nothing was written while the follower was cut off: {seen:?}");
        // The third node campaigned at once, and leads.
        assert!(seen.early_campaigns.is_some_and(|n| n >= 1), "n{other} did not campaign early: {seen:?}");
        assert_eq!(seen.leader_after, Some(other), "{seen:?}");
        // Its own watch would have tried a lease (300 ms) and an election timeout (at least 250 ms) after
        // it last heard from the old leader, which sent heartbeats every 100 ms until 1.5 s.
        let own_watch = secs(1.5 - 0.1 + 0.3 + 0.25);
        assert!(seen.granted_after.is_some_and(|at| at < own_watch), "granted only at {:?}", seen.granted_after);
    });
}

/// What the client of the forwarding scenario saw.
#[derive(Debug, Default)]
struct Forwarded {
    old: u64,
    /// The follower the read went through.
    through: u64,
    /// When the read through it was answered, and with what.
    read: Option<(At, StatusCode)>,
}

/// The leader's host goes silent (a crash in the simulation sends nothing, as a host that loses power). A
/// follower that has not noticed yet forwards a read to it. The read must not wait out the request's whole
/// bound (5 s): once the follower stops following the old leader it goes to the new one, and is answered.
#[test]
fn a_read_forwarded_to_a_leader_that_went_silent_goes_to_the_next_one() {
    test_in_own_process("a_read_forwarded_to_a_leader_that_went_silent_goes_to_the_next_one", || {
        holdfast_sim::record::log_if_asked();
        let mut plan = Plan::quiet(11, 3, secs(9.0));
        let seen = client(&mut plan, |ctx, old, seen: Arc<Mutex<Forwarded>>| async move {
            let through = follower(old, 0)?;
            // A lock to read, written while the leader is up.
            let lock = format!("{KEPT_PREFIX}forwarded");
            http_acquire(&ctx, &format!("n{old}:7070"), &lock, MODEL_TTL_MS).await;
            // The leader crashes at 1.5 s; within a lease the follower still takes it for the leader.
            until(secs(1.6)).await;
            let node = format!("n{through}:7070");
            let answer = holdfast_sim::http::call(&node, Method::GET, &format!("/v1/locks/{lock}")).await;
            let read = answer.ok().map(|(status, _)| (now(), status));
            *seen.lock().expect("poisoned") = Forwarded { old, through, read };
            Ok(())
        });
        schedule(&mut plan, vec![(1.5, Fault::CrashLeader), (8.0, Fault::Heal)]);
        let report = run_clean(&plan);
        let seen = seen.lock().expect("poisoned");
        println!("{seen:?}");
        assert!(applied(&report, &format!("CrashLeader (n{})", seen.old)));
        // A new leader leads about 0.6 s after the crash; the read ends soon after, where before it waited
        // until 1.6 + 5 s.
        let (read_at, status) = seen.read.expect("the read was answered");
        assert_eq!(status, StatusCode::OK, "the read through n{} was not answered by the new leader", seen.through);
        assert!(read_at < secs(3.0), "the read was answered only at {read_at:?}");
    });
}

/// Adds a client to `plan` that holds `lock` in a session (2 s lease) through the leader's first follower
/// from about 0.5 s until it lets go at 6 s, runs the plan with `faults`, and checks that the client held
/// the lock from before `held_by` until it let go and that its release was acknowledged. Answers the report
/// and the leader before the faults.
fn a_session_holds_through_a_follower(
    mut plan: Plan,
    lock: &'static str,
    faults: Vec<(f64, Fault)>,
    held_by: f64,
) -> (Report, u64) {
    let through = client(&mut plan, move |ctx, leader, through: Arc<Mutex<Option<(u64, u64)>>>| async move {
        let node = follower(leader, 0)?;
        *through.lock().expect("poisoned") = Some((leader, node));
        session_hold(&ctx, vec![format!("n{node}:7070")], SESSION_LEASE, lock, secs(1.0), secs(6.0)).await
    });
    schedule(&mut plan, faults);
    let report = run_clean(&plan);
    let (leader, node) = through.lock().expect("poisoned").expect("the client found the leader");
    let [hold] = &report.history.holds[..] else { panic!("not one hold: {:?}", report.history.holds) };
    assert!(hold.from < secs(held_by) && hold.until >= secs(6.0), "through n{node}, the hold ended early: {hold:?}");
    let released = report.history.ops.iter().any(|op| op.outcome == Outcome::Released);
    assert!(released, "the release was not acknowledged: {:?}", report.history.ops);
    (report, leader)
}

/// A session holds a lock through a follower when the leader's host goes silent, and nothing else is
/// written. The new leader must acknowledge its heartbeats within the session's lease (2 s), or the client
/// gives the lock up although the new leader kept it: until bug 4's fix (testing.md) a new leader that had
/// applied no lock command since its election acknowledged none.
#[test]
fn a_session_through_a_follower_keeps_its_lock_when_the_leader_goes_silent() {
    test_in_own_process("a_session_through_a_follower_keeps_its_lock_when_the_leader_goes_silent", || {
        holdfast_sim::record::log_if_asked();
        // Held from before the crash until the client let go at 6 s.
        let faults = vec![(1.5, Fault::CrashLeader), (7.0, Fault::Heal)];
        let (report, old) = a_session_holds_through_a_follower(Plan::quiet(13, 3, secs(8.0)), "session", faults, 1.5);
        assert!(applied(&report, &format!("CrashLeader (n{old})")));
    });
}

/// A session holds a lock through a follower whose leader is of a build from before heartbeat batches
/// (acted by `Bugs::no_heartbeat_batches`): the leader closes the connection on the follower's first batch,
/// and the follower must then forward the heartbeats one by one, or every heartbeat fails and the client
/// gives the lock up after one lease (2 s). Writes through a follower must not be sent to it in batches
/// either. As during a rolling upgrade, followers first.
#[test]
fn a_session_through_a_follower_is_kept_by_a_leader_that_cannot_read_heartbeat_batches() {
    test_in_own_process("a_session_through_a_follower_is_kept_by_a_leader_that_cannot_read_heartbeat_batches", || {
        holdfast_sim::record::log_if_asked();
        let mut plan = Plan::quiet(23, 3, secs(8.0));
        plan.bugs = Bugs { no_heartbeat_batches: true, ..Bugs::default() };
        // Another client takes 20 locks through a follower meanwhile: its writes must go one by one too, each
        // granted, where a batch would leave them with unknown outcomes.
        let granted = client(&mut plan, |ctx, leader, granted: Arc<Mutex<usize>>| async move {
            let node = format!("n{}:7070", follower(leader, 1)?);
            until(secs(1.0)).await;
            for i in 0..20 {
                if let (Outcome::Granted { .. }, _) = http_acquire(&ctx, &node, &format!("upgrade-{i}"), 60_000).await {
                    *granted.lock().expect("poisoned") += 1;
                }
                tokio::time::sleep(secs(0.1)).await;
            }
            Ok(())
        });
        // Held from about 0.5 s until the client let go at 6 s: three leases.
        a_session_holds_through_a_follower(plan, "upgrade", vec![(7.5, Fault::Heal)], 1.0);
        assert_eq!(*granted.lock().expect("poisoned"), 20, "acquires through the follower not granted");
    });
}

/// A queue through a failover in a cluster only sessions talk to: one session holds a lock through a
/// follower, another waits for it through the other follower; the leader's host goes silent. The new
/// leader keeps both, and when the holder lets go after the failover the waiter is granted at once.
#[test]
fn a_queue_survives_a_failover_in_a_cluster_only_sessions_talk_to() {
    test_in_own_process("a_queue_survives_a_failover_in_a_cluster_only_sessions_talk_to", || {
        holdfast_sim::record::log_if_asked();
        let mut plan = Plan::quiet(17, 3, secs(9.0));
        for (n, (wait, starts, hold_until)) in [(0.5, 0.5, 4.0), (6.0, 1.0, 7.0)].into_iter().enumerate() {
            client(&mut plan, move |ctx, old, _: Arc<Mutex<()>>| async move {
                // The first client goes through the lower-numbered follower, the second through the other.
                let node = follower(old, n)?;
                until(secs(starts)).await;
                session_hold(&ctx, vec![format!("n{node}:7070")], SESSION_LEASE, "queue", secs(wait), secs(hold_until))
                    .await
            });
        }
        schedule(&mut plan, vec![(1.5, Fault::CrashLeader), (8.0, Fault::Heal)]);
        let report = run_clean(&plan);
        let [first, second] = &report.history.holds[..] else { panic!("not two holds: {:?}", report.history.holds) };
        assert!(first.from < secs(1.0) && first.until >= secs(4.0), "the first hold ended early: {first:?}");
        // Granted within a few round trips of the release, and kept until the client let go.
        assert!(second.from >= secs(4.0) && second.from < secs(4.2), "the waiter was granted at {:?}", second.from);
        assert!(second.until >= secs(7.0), "the second hold ended early: {second:?}");
        assert!(second.fence > first.fence, "fences {} then {}", first.fence, second.fence);
    });
}

/// A hold with a short TTL through a failover in a cluster nobody else writes to: the new leader must
/// expire it (its keeper proposes the expiry) once the TTL has run out, counted from its promotion at the
/// latest, and a client polling through a follower then gets the lock.
#[test]
fn a_ttl_hold_expires_after_a_failover_in_a_quiet_cluster() {
    test_in_own_process("a_ttl_hold_expires_after_a_failover_in_a_quiet_cluster", || {
        holdfast_sim::record::log_if_asked();
        let mut plan = Plan::quiet(19, 3, secs(9.0));
        let granted = client(&mut plan, |ctx, old, granted: Arc<Mutex<Vec<At>>>| async move {
            let node = format!("n{}:7070", follower(old, 0)?);
            until(secs(1.2)).await;
            // Taken through the leader with a 1 s TTL and never released; then, from 2 s, tried through a
            // follower every 50 ms until it is granted again.
            if let (Outcome::Granted { .. }, _) = http_acquire(&ctx, &format!("n{old}:7070"), "quiet-ttl", 1_000).await
            {
                granted.lock().expect("poisoned").push(now());
            }
            until(secs(2.0)).await;
            while now() < secs(7.0) {
                if let (Outcome::Granted { .. }, _) = http_acquire(&ctx, &node, "quiet-ttl", 60_000).await {
                    granted.lock().expect("poisoned").push(now());
                    break;
                }
                tokio::time::sleep(secs(0.05)).await;
            }
            Ok(())
        });
        schedule(&mut plan, vec![(1.5, Fault::CrashLeader), (8.0, Fault::Heal)]);
        run_clean(&plan);
        let granted = granted.lock().expect("poisoned");
        println!("granted: {granted:?}");
        let [first, second] = granted[..] else { panic!("not granted twice: {granted:?}") };
        assert!(first < secs(1.5), "the first grant came at {first:?}");
        // Not before the TTL ran out; by the new leader's promotion (about 2 s) plus the TTL, and a tick.
        assert!(second >= first + secs(1.0) && second < secs(3.5), "granted again at {second:?}");
    });
}

/// A TTL hold taken at about 0.6 s with a 4 s TTL and never renewed, its leader crashing at 3.5 s: the
/// plan, and when the hold was granted and granted again (polled through a follower once it knows of a new
/// leader).
fn a_hold_across_a_late_failover(max_clock_skew: Option<Duration>, jumps: Vec<(f64, Fault)>) -> (Report, Vec<At>) {
    let mut plan = Plan::quiet(19, 3, secs(12.0));
    plan.max_clock_skew = max_clock_skew;
    let granted = client(&mut plan, |ctx, old, granted: Arc<Mutex<Vec<At>>>| async move {
        let node = format!("n{}:7070", follower(old, 0)?);
        if let (Outcome::Granted { .. }, _) = http_acquire(&ctx, &format!("n{old}:7070"), "late", 4_000).await {
            granted.lock().expect("poisoned").push(now());
        }
        // Once the follower knows of a new leader (a write it forwards to the old one would wait for it).
        until(secs(3.6)).await;
        while now() < secs(6.0) && leader_of(&node).await.is_none_or(|leader| leader == old) {
            tokio::time::sleep(secs(0.02)).await;
        }
        while now() < secs(10.0) {
            if let (Outcome::Granted { .. }, _) = http_acquire(&ctx, &node, "late", 60_000).await {
                granted.lock().expect("poisoned").push(now());
                break;
            }
            tokio::time::sleep(secs(0.05)).await;
        }
        Ok(())
    });
    let mut faults = jumps;
    faults.extend([(3.5, Fault::CrashLeader), (11.0, Fault::Heal)]);
    schedule(&mut plan, faults);
    let report = run_clean(&plan);
    let granted = granted.lock().expect("poisoned").clone();
    (report, granted)
}

/// `--max-clock-skew`: a new leader keeps a TTL hold's stamped end (plus the bound and its election)
/// instead of giving it a whole TTL again from its promotion, so a hold whose holder died long before the
/// failover is granted again about when it ran out, not a TTL after the failover. Whether the new leader's
/// clock is within the bound of the old one's (150 ms ahead) or far outside it (3 s ahead), no hold ends
/// before its TTL by the new leader's own monotonic clock, counted from when it applied the grant: every run
/// keeps every guarantee (`run_clean`).
#[test]
fn a_bound_on_clock_skew_keeps_a_ttl_holds_stamped_end_through_a_failover() {
    test_in_own_process("a_bound_on_clock_skew_keeps_a_ttl_holds_stamped_end_through_a_failover", || {
        holdfast_sim::record::log_if_asked();
        let (report, granted) = a_hold_across_a_late_failover(None, Vec::new());
        let [first, second] = granted[..] else { panic!("not granted twice: {granted:?}") };
        println!("without a bound: granted at {first:?}, again at {second:?}");
        assert!(second >= secs(3.5 + 4.0), "a whole TTL from the promotion: granted again at {second:?}");
        let old = (1..=3).find(|id| applied(&report, &format!("CrashLeader (n{id})"))).expect("a leader crashed");
        for by_ms in [150, 3_000] {
            let jumps = (1..=3).filter(|id| *id != old).map(|node| (1.0, Fault::ClockJump { node, by_ms })).collect();
            let (_, granted) = a_hold_across_a_late_failover(Some(secs(0.2)), jumps);
            let [first, second] = granted[..] else { panic!("not granted twice: {granted:?}") };
            println!("bound 200 ms, survivors {by_ms} ms ahead: granted at {first:?}, again at {second:?}");
            assert!(second >= first + secs(4.0), "granted again at {second:?}, before the TTL ran out");
            assert!(second < secs(3.5 + 4.0), "not the stamped end: granted again at {second:?}");
        }
    });
}

/// Both survivors of a leader's crash once campaigned and were refused for a shorter log: each follower
/// in turn is cut off while the leader writes, and its candidacies are refused when it comes back.
/// openraft 0.9 then adds twice the longest election timeout (600 ms) to a node's election timer for as
/// long as it once saw a longer log as a candidate, a mark only its own next timed campaign clears; with
/// both survivors marked nobody campaigned until 1.05 s after the crash (found by the quiet failover that
/// ends every random run: seeds 110 and 296). A follower that has heard no leader for a lease and an
/// election timeout campaigns by itself (`Node::run_election_watch`). Since openraft's timer is off and
/// the watch asks a pre-vote first, the followers' candidacies while cut off no longer happen, and the
/// case this covers is two followers whose watches fire within a round trip of each other: both win
/// their pre-votes, and the one that granted the other's vote meanwhile must not campaign.
#[test]
fn followers_once_refused_for_a_shorter_log_still_campaign_on_time() {
    test_in_own_process("followers_once_refused_for_a_shorter_log_still_campaign_on_time", || {
        holdfast_sim::record::log_if_asked();
        // Seeds 1, 3 and 4 marked both followers: without the watch each named a new leader only 1.06-1.07 s
        // after the crash (as did 21 more of seeds 1-30); with it 0.43-0.48 s (all of seeds 1-30 but 6,
        // whose leader changed before the crash). With the pre-vote, seeds 1-60 all take 0.42-0.47 s, and
        // seeds 10, 15 and 21 take 1.01-1.02 s if a follower that granted a vote during its own pre-vote
        // campaigns anyway (the second campaign deposes the leader just elected), unless the deposed leader
        // campaigns at once (the next test).
        for seed in [1, 3, 4, 10, 15, 21] {
            survivors_marked_elect_on_time(seed, Bugs::default());
        }
    });
}

/// The same two followers, when the one that granted the other's vote during its own pre-vote campaigns
/// anyway, as it still can on real processes: the grant comes after its watch last looked, and before
/// openraft's core takes the campaign (a failover of 1.18 s in a `cluster/bench.sh` run). The leader just
/// elected is deposed by the higher term and refuses the second candidate for its shorter log; it then
/// campaigns at once (`Node::answered_vote`), where the cluster used to wait a lease and an election
/// timeout for the second candidate's next try.
#[test]
fn a_leader_deposed_by_a_candidate_with_a_shorter_log_campaigns_at_once() {
    test_in_own_process("a_leader_deposed_by_a_candidate_with_a_shorter_log_campaigns_at_once", || {
        holdfast_sim::record::log_if_asked();
        // In seeds 10, 15 and 21 a follower grants the other's vote during its own pre-vote.
        for seed in [10, 15, 21] {
            survivors_marked_elect_on_time(seed, Bugs { campaign_despite_a_vote_granted: true, ..Bugs::default() });
        }
    });
}

/// The leader the scenario's client found, and its calls: when each was sent (for the last, when a new
/// leader was first named) and what came back.
#[derive(Debug, Default)]
struct Calls {
    leader: u64,
    calls: Vec<(At, Outcome)>,
}

fn survivors_marked_elect_on_time(seed: u64, bugs: Bugs) {
    let mut plan = Plan::quiet(seed, 3, secs(10.0));
    plan.bugs = bugs;
    let seen = client(&mut plan, |ctx, old, seen: Arc<Mutex<Calls>>| async move {
        seen.lock().expect("poisoned").leader = old;
        // A lock granted while each follower is away leaves its log behind.
        for (i, at) in [1.5, 3.5].into_iter().enumerate() {
            until(secs(at)).await;
            let lock = format!("{KEPT_PREFIX}behind-{i}");
            let (outcome, _) = http_acquire(&ctx, &format!("n{old}:7070"), &lock, MODEL_TTL_MS).await;
            seen.lock().expect("poisoned").calls.push((now(), outcome));
        }
        // The leader crashes at 6 s; from then the followers are asked for the leader every 20 ms (a
        // write sent to one before it knows of a new leader would wait for the old), and a lock is
        // taken through the first new leader named.
        until(secs(6.0)).await;
        let others: Vec<String> = (1..=3).filter(|id| *id != old).map(|id| format!("n{id}:7070")).collect();
        let led = 'found: loop {
            for node in &others {
                if let Some(leader) = leader_of(node).await.filter(|leader| *leader != old) {
                    break 'found Some((now(), leader));
                }
            }
            if now() > secs(9.0) {
                break None;
            }
            tokio::time::sleep(secs(0.02)).await;
        };
        let (at, leader) = led.ok_or("no new leader by 9 s")?;
        let lock = format!("{KEPT_PREFIX}after");
        let (outcome, _) = http_acquire(&ctx, &format!("n{leader}:7070"), &lock, MODEL_TTL_MS).await;
        seen.lock().expect("poisoned").calls.push((at, outcome));
        Ok(())
    });
    schedule(
        &mut plan,
        vec![
            (1.0, Fault::IsolateFollower(0)),
            (2.5, Fault::Heal),
            (3.0, Fault::IsolateFollower(1)),
            (4.5, Fault::Heal),
            (6.0, Fault::CrashLeader),
            (9.5, Fault::Heal),
        ],
    );
    let report = run_clean(&plan);
    let Calls { leader: old, calls } = &*seen.lock().expect("poisoned");
    println!("{calls:?}");
    // The same leader throughout, each follower cut off once while a lock was granted.
    for n in 0..2 {
        let cut = follower(*old, n).expect("a follower");
        assert!(applied(&report, &format!("IsolateFollower({n}) (n{cut}, led by n{old})")), "{:?}", report.trace);
    }
    assert!(applied(&report, &format!("CrashLeader (n{old})")));
    let [(_, first), (_, second), (led, last)] = calls[..] else { panic!("calls: {calls:?}") };
    assert!(
        matches!((first, second, last), (Outcome::Granted { .. }, Outcome::Granted { .. }, Outcome::Granted { .. })),
        "{calls:?}"
    );
    // An unmarked timer fires a lease (300 ms) and an election timeout (250-300 ms) after the last
    // heartbeat, which comes on openraft's tick (every 150 ms), so by 0.75 s after the crash; the watch
    // as late as that and a tick of its own (50 ms); a marked timer 600 ms later.
    assert!(led < secs(6.0 + 0.85), "seed {seed}: a new leader named only at {led:?}");
}

/// What the slow-install scenario's client saw.
#[derive(Debug, Default)]
struct Install {
    /// The leader and its term before the faults, and the follower that crashed.
    old: u64,
    term: u64,
    crashed: u64,
    /// Locks granted through the leader while the follower was down, one entry each.
    granted: usize,
    /// When the restarted follower had applied everything the leader held at the heal.
    caught_up: Option<At>,
    /// Each node's leader and term at the end.
    last: Vec<(Option<u64>, Option<u64>)>,
    /// The restarted follower's `holdfast_raft_silent_leader_campaigns_total` at the end.
    watch_campaigns: Option<u64>,
}

/// The value of `metric` (a counter's or gauge's full name) on `node`.
async fn metric(node: u64, metric: &str) -> Option<u64> {
    let metrics = holdfast_sim::http::text(&format!("n{node}:7070"), "/metrics").await.ok()?.1;
    metrics.lines().find_map(|line| line.strip_prefix(metric)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The schedule of a follower that must install a snapshot: installs take `install` from 0.6 s, the leader's
/// first follower crashes at 1 s, and everything heals at `heal`.
fn crash_a_follower_with_slow_installs(plan: &mut Plan, install: f64, heal: f64) {
    schedule(
        plan,
        vec![(0.6, Fault::SlowSnapshotInstalls(secs(install))), (1.0, Fault::CrashFollower(0)), (heal, Fault::Heal)],
    );
}

/// Takes locks through `leader`, one entry each, one after the other until `until`; answers how many.
async fn grant_until(ctx: &Ctx, leader: u64, until: At) -> Result<usize, Box<dyn std::error::Error>> {
    let leader = format!("n{leader}:7070");
    let mut granted = 0;
    while now() < until {
        let lock = format!("{KEPT_PREFIX}install-{granted}");
        match http_acquire(ctx, &leader, &lock, MODEL_TTL_MS).await {
            (Outcome::Granted { .. }, _) => granted += 1,
            _ => return Err(format!("{lock} was not granted").into()),
        }
    }
    Ok(granted)
}

/// When `node` first reported it had applied the log through `index`, looking every 50 ms until `by`.
async fn applied_through(node: u64, index: u64, by: At) -> Option<At> {
    while now() < by {
        match status(node).await.and_then(|s| s["applied_index"].as_u64()) {
            Some(applied) if applied >= index => return Some(now()),
            _ => tokio::time::sleep(secs(0.05)).await,
        }
    }
    None
}

/// Each node's leader and term, as its `/v1/cluster` tells.
async fn leaders_and_terms() -> Vec<(Option<u64>, Option<u64>)> {
    let mut all = Vec::new();
    for node in 1..=3 {
        let status = status(node).await;
        all.push((
            status.as_ref().and_then(|s| s["leader"].as_u64()),
            status.as_ref().and_then(|s| s["term"].as_u64()),
        ));
    }
    all
}

/// A node's `/v1/cluster` answer.
async fn status(node: u64) -> Option<serde_json::Value> {
    match holdfast_sim::http::call(&format!("n{node}:7070"), Method::GET, "/v1/cluster").await {
        Ok((StatusCode::OK, body)) => Some(body),
        _ => None,
    }
}

/// A follower that comes back so far behind that the leader sends it a snapshot answers the snapshot's
/// last chunk only once it is installed, seconds later at a million locks, and the leader sends it nothing
/// else meanwhile. Its election watch took that silence for a leader gone and campaigned, and the
/// campaign's higher term, in the answer to the last chunk, made the healthy leader step down (a real
/// cluster's failover benchmark at a million locks, docs/perf-notes/2026-12-03-snapshot-install-and-leader.md).
/// A leader's call being answered counts as word from it (`LeaderContact` in the server's election core).
#[test]
fn a_follower_installing_a_slow_snapshot_leaves_its_leader_alone() {
    test_in_own_process("a_follower_installing_a_slow_snapshot_leaves_its_leader_alone", || {
        holdfast_sim::record::log_if_asked();
        const HEAL: f64 = 6.0;
        const INSTALL: f64 = 2.0;
        let mut plan = Plan::quiet(11, 3, secs(12.0));
        let seen = client(&mut plan, |ctx, old, seen: Arc<Mutex<Install>>| async move {
            let term = status(old).await.and_then(|s| s["term"].as_u64()).ok_or("no term")?;
            let crashed = follower(old, 0)?;
            // The follower is down from 1 s: the leader writes an entry per lock, snapshots every 200
            // entries and keeps 200 behind its snapshot, so the follower's next entries are soon gone.
            until(secs(1.1)).await;
            let granted = grant_until(&ctx, old, secs(HEAL - 0.5)).await?;
            let target = status(old).await.and_then(|s| s["last_log_index"].as_u64()).ok_or("no last index")?;
            // Back at the heal; the install alone takes INSTALL.
            until(secs(HEAL + INSTALL / 2.0)).await;
            let caught_up = applied_through(crashed, target, secs(HEAL + INSTALL + 3.0)).await;
            // Whatever the leader did once the install was answered has happened a second later.
            until(secs(HEAL + INSTALL + 4.0)).await;
            let last = leaders_and_terms().await;
            let watch_campaigns = metric(crashed, "holdfast_raft_silent_leader_campaigns_total").await;
            *seen.lock().expect("poisoned") = Install { old, term, crashed, granted, caught_up, last, watch_campaigns };
            Ok(())
        });
        crash_a_follower_with_slow_installs(&mut plan, INSTALL, HEAL);
        let report = run_clean(&plan);
        let seen = &*seen.lock().expect("poisoned");
        println!("{seen:?}");
        let Install { old, term, crashed, granted, caught_up, last, watch_campaigns } = seen;
        assert!(applied(&report, &format!("CrashFollower(0) (n{crashed}, led by n{old})")), "{:?}", report.trace);
        assert!(*granted >= 600, "only {granted} entries while the follower was down: it may not need a snapshot");
        // Caught up no sooner than the install allows: it did install a snapshot.
        let caught_up = caught_up.expect("the follower never caught up");
        assert!(caught_up >= secs(HEAL + INSTALL), "caught up at {caught_up:?}, without the slow install");
        assert_eq!(*watch_campaigns, Some(0), "the restarted follower campaigned");
        assert!(last.iter().all(|node| *node == (Some(*old), Some(*term))), "leader and term changed: {last:?}");
    });
}

/// openraft 0.9 purges the log a snapshot covers as soon as it hands the snapshot to the state machine,
/// before the state machine has stored it. A follower that crashed in between came back with its log
/// purged past its last stored snapshot and could not start ("Failed to get log entries"; found by a
/// random run whose installs are slow, seed 92). A purge now waits until a stored snapshot covers it.
#[test]
fn a_follower_that_crashes_while_installing_a_snapshot_starts_again() {
    test_in_own_process("a_follower_that_crashes_while_installing_a_snapshot_starts_again", || {
        holdfast_sim::record::log_if_asked();
        let mut plan = Plan::quiet(11, 3, secs(14.0));
        let seen = client(&mut plan, |ctx, old, seen: Arc<Mutex<Install>>| async move {
            let crashed = follower(old, 0)?;
            until(secs(1.1)).await;
            let granted = grant_until(&ctx, old, secs(5.5)).await?;
            // Restarted at 6 s, crashed again at 7 s in the middle of its 2 s install, restarted at 9 s.
            let target = status(old).await.and_then(|s| s["last_log_index"].as_u64()).ok_or("no last index")?;
            until(secs(9.0)).await;
            let caught_up = applied_through(crashed, target, secs(13.5)).await;
            *seen.lock().expect("poisoned") = Install { old, crashed, granted, caught_up, ..Install::default() };
            Ok(())
        });
        schedule(
            &mut plan,
            vec![
                (0.6, Fault::SlowSnapshotInstalls(secs(2.0))),
                (1.0, Fault::CrashFollower(0)),
                (6.0, Fault::Heal),
                (7.0, Fault::CrashFollower(0)),
                (9.0, Fault::Heal),
            ],
        );
        let report = run_clean(&plan);
        let Install { old, crashed, granted, caught_up, .. } = &*seen.lock().expect("poisoned");
        for at in ["1.000s", "7.000s"] {
            let crash = format!("{at} CrashFollower(0) (n{crashed}, led by n{old})");
            assert!(report.trace.iter().any(|line| line.trim_start() == crash), "{crash}: {:?}", report.trace);
        }
        assert!(*granted >= 600, "only {granted} entries while the follower was down: it may not need a snapshot");
        // Restarted at 9 s, it installs the snapshot again (2 s) and catches up.
        let caught_up = caught_up.expect("the follower never caught up");
        assert!(caught_up >= secs(11.0), "caught up at {caught_up:?}, without installing the snapshot again");
    });
}

/// What a cut-off scenario's client saw.
#[derive(Debug, Default)]
struct CutOff {
    /// The leader and its term before the cut, and the follower cut off.
    old: u64,
    term: u64,
    cut: u64,
    /// Locks granted through the leader during the cut, one entry each.
    granted: usize,
    /// When the follower had applied everything the leader held at the heal.
    caught_up: Option<At>,
    /// Each node's leader and term at the end.
    last: Vec<(Option<u64>, Option<u64>)>,
    /// The follower's `holdfast_raft_pre_votes_lost_total` and `holdfast_raft_silent_leader_campaigns_total`
    /// at the end.
    pre_votes_lost: Option<u64>,
    campaigns: Option<u64>,
    /// A read sent through the follower early in the cut, before it noticed its leader's silence, and a
    /// write sent once it had: when each was answered, and with what.
    read_through: Option<(At, StatusCode)>,
    write_through: Option<(At, Outcome)>,
}

/// Cuts the leader's first follower off by `fault` from 1 s to 4 s (ten election timeouts) while the leader
/// grants locks, and checks that the leader and its term are the same everywhere once the follower has
/// caught up: the follower never campaigned, as a majority still heard the leader and refused its
/// pre-votes (`Node::pre_vote`). openraft 0.9 alone has no pre-vote: the follower campaigned in higher and
/// higher terms, and the first answer it gave the leader after the heal made the leader step down.
///
/// Requests sent to the cut-off follower meanwhile wait for word from the leader, and are answered after
/// the heal: the follower stays a follower of that leader, and until it took silence as no leader
/// (`Node::leader`) it forwarded them into the cut.
fn a_follower_cut_off_leaves_its_leader_alone(name: &str, fault: Fault, note: &str) {
    test_in_own_process(name, || {
        holdfast_sim::record::log_if_asked();
        const HEAL: f64 = 4.0;
        let mut plan = Plan::quiet(5, 3, secs(8.0));
        let seen = client(&mut plan, |ctx, old, seen: Arc<Mutex<CutOff>>| async move {
            let term = status(old).await.and_then(|s| s["term"].as_u64()).ok_or("no term")?;
            let cut = follower(old, 0)?;
            let through = format!("n{cut}:7070");
            until(secs(1.1)).await;
            let read = async {
                until(secs(1.2)).await;
                let answer =
                    holdfast_sim::http::call(&through, Method::GET, &format!("/v1/locks/{KEPT_PREFIX}read")).await;
                answer.ok().map(|(status, _)| (now(), status))
            };
            let write = async {
                until(secs(2.0)).await;
                let (outcome, _) =
                    http_acquire(&ctx, &through, &format!("{KEPT_PREFIX}through-cut"), MODEL_TTL_MS).await;
                Some((now(), outcome))
            };
            let (granted, read_through, write_through) =
                tokio::join!(grant_until(&ctx, old, secs(HEAL - 0.1)), read, write);
            let granted = granted?;
            let target = status(old).await.and_then(|s| s["last_log_index"].as_u64()).ok_or("no last index")?;
            let caught_up = applied_through(cut, target, secs(HEAL + 2.0)).await;
            // Whatever the leader did on the follower's first answers after the heal has happened by now.
            until(secs(HEAL + 2.5)).await;
            let last = leaders_and_terms().await;
            let pre_votes_lost = metric(cut, "holdfast_raft_pre_votes_lost_total").await;
            let campaigns = metric(cut, "holdfast_raft_silent_leader_campaigns_total").await;
            *seen.lock().expect("poisoned") = CutOff {
                old,
                term,
                cut,
                granted,
                caught_up,
                last,
                pre_votes_lost,
                campaigns,
                read_through,
                write_through,
            };
            Ok(())
        });
        schedule(&mut plan, vec![(1.0, fault), (HEAL, Fault::Heal)]);
        let report = run_clean(&plan);
        let seen = &*seen.lock().expect("poisoned");
        println!("{seen:?}");
        let CutOff { old, term, cut, granted, caught_up, last, pre_votes_lost, campaigns, read_through, write_through } =
            seen;
        assert!(applied(&report, &format!("{note} (n{cut}, led by n{old})")), "{:?}", report.trace);
        // Both requests waited for word from the leader and went to it after the heal. The read was sent
        // into the cut before the follower noticed the silence, and stopped waiting for that answer when it
        // did; before, it waited until 5 s after it was sent (a 503). The write came once the silence was
        // noticed, and was sent nowhere until the heal: a write sent into the cut would wait out its bound
        // and end with an unknown outcome. (In the simulation the follower's pooled connections to its
        // leader do not outlive the cut, and a new one fails at once, so the write passes here also when
        // the follower takes a silent leader for one; on a real network an idle connection does outlive a
        // cut.)
        let (read_at, status) = read_through.expect("the read through the follower was not answered");
        assert_eq!(status, StatusCode::NOT_FOUND, "the read through n{cut}");
        let (write_at, outcome) = write_through.expect("the write through the follower was not answered");
        assert!(matches!(outcome, Outcome::Granted { .. }), "the write through n{cut}: {outcome:?}");
        for (what, at) in [("read", read_at), ("write", write_at)] {
            assert!(at > secs(HEAL) && at < secs(HEAL + 1.0), "the {what} through n{cut} was answered at {at:?}");
        }
        assert!(*granted > 0, "nothing granted during the cut");
        assert!(caught_up.is_some(), "the follower never caught up");
        assert!(last.iter().all(|node| *node == (Some(*old), Some(*term))), "leader and term changed: {last:?}");
        // The follower tried, lost every pre-vote, and never campaigned.
        assert!(pre_votes_lost.is_some_and(|lost| lost >= 3), "pre-votes lost: {pre_votes_lost:?}");
        assert_eq!(*campaigns, Some(0), "the follower campaigned");
    });
}

/// The follower is cut off from every other node: its pre-votes reach nobody.
#[test]
fn a_follower_cut_off_from_every_node_leaves_its_leader_alone() {
    a_follower_cut_off_leaves_its_leader_alone(
        "a_follower_cut_off_from_every_node_leaves_its_leader_alone",
        Fault::IsolateFollower(0),
        "IsolateFollower(0)",
    );
}

/// Only the link between the leader and the follower is cut: the other follower, which still hears the
/// leader, refuses the follower's pre-votes.
#[test]
fn a_follower_cut_off_from_its_leader_only_leaves_it_alone() {
    a_follower_cut_off_leaves_its_leader_alone(
        "a_follower_cut_off_from_its_leader_only_leaves_it_alone",
        Fault::CutFollower(0),
        "CutFollower(0)",
    );
}

/// What the restart scenario's client saw.
#[derive(Debug, Default)]
struct Restarted {
    old: u64,
    term: u64,
    cut: u64,
    restarted: u64,
    /// When a lock was granted through the old leader after the restart.
    granted_after: Option<At>,
    /// Each node's leader and term at the end.
    last: Vec<(Option<u64>, Option<u64>)>,
}

/// A follower is cut off from its leader, and the other follower crashes and comes back while the cut
/// lasts. The cut-off follower's pre-votes reach the restarted node, which has not heard from the leader
/// yet: a node just started says no for as long as one that has just heard from a leader (`LeaderContact`),
/// and hears from the leader meanwhile, so the leader goes on with it, in its term.
fn a_restarted_node_does_not_help_a_cut_off_follower_depose_its_leader(seed: u64) {
    let mut plan = Plan::quiet(seed, 3, secs(8.0));
    let seen = Arc::new(Mutex::new(Restarted::default()));
    let shared = seen.clone();
    plan.scripts.push(script(move |ctx| {
        let seen = shared.clone();
        async move {
            // A fresh cluster may still be settling its first election at 0.5 s (a split in `initialize`'s
            // campaigns is settled by the watch, about 0.6 s after the start): ask just before the faults.
            until(secs(0.9)).await;
            let old = leader_of(&ctx.nodes[0]).await.ok_or("no leader")?;
            let term = status(old).await.and_then(|s| s["term"].as_u64()).ok_or("no term")?;
            let (cut, restarted) = (follower(old, 0)?, follower(old, 1)?);
            // Restarted at 2 s; the cut lasts until 5 s.
            until(secs(2.5)).await;
            let lock = format!("{KEPT_PREFIX}after-restart");
            let granted_after = match http_acquire(&ctx, &format!("n{old}:7070"), &lock, MODEL_TTL_MS).await {
                (Outcome::Granted { .. }, _) => Some(now()),
                _ => None,
            };
            until(secs(4.5)).await;
            let last = leaders_and_terms().await;
            *seen.lock().expect("poisoned") = Restarted { old, term, cut, restarted, granted_after, last };
            Ok(())
        }
    }));
    schedule(
        &mut plan,
        vec![
            (1.0, Fault::CutFollower(0)),
            (1.2, Fault::CrashFollower(1)),
            (2.0, Fault::RestartCrashed),
            (5.0, Fault::Heal),
        ],
    );
    let report = run_clean(&plan);
    let seen = &*seen.lock().expect("poisoned");
    println!("{seen:?}");
    let Restarted { old, term, cut, restarted, granted_after, last } = seen;
    assert!(applied(&report, &format!("CutFollower(0) (n{cut}, led by n{old})")), "{:?}", report.trace);
    assert!(applied(&report, &format!("CrashFollower(1) (n{restarted}, led by n{old})")), "{:?}", report.trace);
    assert!(granted_after.is_some(), "seed {seed}: no grant through the old leader after the restart");
    // The cut-off follower kept its term; the other two name the old leader, in its term.
    assert_eq!(last[(*cut - 1) as usize].1, Some(*term), "seed {seed}: the cut-off follower's term moved: {last:?}");
    for node in [*old, *restarted] {
        assert_eq!(last[(node - 1) as usize], (Some(*old), Some(*term)), "seed {seed}: n{node}: {last:?}");
    }
}

#[test]
fn a_restarted_node_does_not_help_a_cut_off_follower_depose_its_leader_in_any_seed() {
    test_in_own_process("a_restarted_node_does_not_help_a_cut_off_follower_depose_its_leader_in_any_seed", || {
        holdfast_sim::record::log_if_asked();
        for seed in 1..=20 {
            a_restarted_node_does_not_help_a_cut_off_follower_depose_its_leader(seed);
        }
    });
}

/// openraft 0.9 purges a node's log right after each snapshot, whatever a follower being sent one still
/// needs. A follower whose install took longer than the leader took to write `--snapshot-every` entries
/// and snapshot again found, once installed, the entries after its snapshot gone, and was sent the next
/// snapshot, and the next, for as long as the writes went on (random seeds 129, 202, 312 and 318: a read
/// unanswered after the heal). The log is now purged no further than a follower still needs
/// (`purge::Purges` in the server): here, once the follower has been down long enough for the leader to
/// purge past it, the entries after the snapshot on its way.
#[test]
fn a_follower_catches_up_while_its_leader_snapshots_faster_than_it_installs() {
    test_in_own_process("a_follower_catches_up_while_its_leader_snapshots_faster_than_it_installs", || {
        holdfast_sim::record::log_if_asked();
        // Down for longer than the leader holds its log for a follower that does not move (3 s).
        const HEAL: f64 = 6.0;
        const INSTALL: f64 = 1.0;
        const WRITES_END: f64 = HEAL + 8.0;
        let mut plan = Plan::quiet(11, 3, secs(WRITES_END + 2.0));
        plan.snapshot_every_entries = 10;
        let seen = client(&mut plan, |ctx, old, seen: Arc<Mutex<(usize, Option<At>)>>| async move {
            let crashed = follower(old, 0)?;
            until(secs(1.1)).await;
            // The leader writes from before the follower's restart to long after it: every install sees far
            // more than 10 entries written and snapshot.
            let (granted, caught_up) = tokio::join!(grant_until(&ctx, old, secs(WRITES_END)), async {
                until(secs(HEAL + 0.5)).await;
                let target = status(old).await.and_then(|s| s["last_log_index"].as_u64())?;
                applied_through(crashed, target, secs(WRITES_END)).await
            });
            *seen.lock().expect("poisoned") = (granted?, caught_up);
            Ok(())
        });
        crash_a_follower_with_slow_installs(&mut plan, INSTALL, HEAL);
        run_clean(&plan);
        let (granted, caught_up) = *seen.lock().expect("poisoned");
        println!("granted {granted}, caught up at {caught_up:?}");
        assert!(granted >= 1_000, "only {granted} entries written: too few to outrun the installs");
        let caught_up = caught_up.expect("the follower never caught up while the leader wrote");
        // By a snapshot (the leader had purged past the follower), and one install, not one after another.
        assert!(caught_up >= secs(HEAL + INSTALL), "caught up at {caught_up:?}, without a snapshot");
        assert!(caught_up < secs(HEAL + 1.5 * INSTALL), "caught up only at {caught_up:?}");
    });
}

/// What the clients of the follower-sync scenario saw.
#[derive(Debug, Default)]
struct Aside {
    old: u64,
    /// The follower the writers talk to, and the one cut off from the leader.
    busy: u64,
    cut: u64,
    /// Grants through the busy follower before the crash, over all writers.
    granted: usize,
    /// The busy follower's `holdfast_storage_appends_synced_aside_total` just before the crash.
    aside: Option<u64>,
}

/// Writers through one follower, each acquiring kept locks one after another.
const ASIDE_WRITERS: usize = 40;
/// The seed's first leader, the follower the writers talk to (its first follower) and the other one: the
/// schedule names them, and the test checks that the run agrees.
const ASIDE_LEADER: u64 = 3;
const ASIDE_BUSY: u64 = 1;
const ASIDE_CUT: u64 = 2;

/// A follower with 32 or more of its clients' writes waiting syncs its appends on the log's own thread (a
/// task of the runtime in the simulation) and acknowledges each only once durable (`Events::sync_aside`,
/// holdfast-store's `LogStore::append_now`). Here 40 writers talk to one follower, on the disk store whose
/// syncs by the log's task take 50 ms there (longer than a grant takes from the leader back to its writer,
/// 1-5 ms a message) and none on the leader, while the other follower is cut off from the leader, so that
/// every commit counts the busy follower's acknowledgement. The leader and the busy follower crash
/// together, keeping only what their disks synced; the follower starts again first and, with the other
/// follower, elects a leader before the old leader is back. Had the busy follower acknowledged an append
/// before its sync, the grants it carried, answered to their writers, would live on in the old leader's log
/// alone, and the new leader would overwrite them: the checkers report each (shown by hand).
#[test]
fn a_follower_that_syncs_aside_and_crashes_with_its_leader_loses_no_acknowledged_write() {
    test_in_own_process("a_follower_that_syncs_aside_and_crashes_with_its_leader_loses_no_acknowledged_write", || {
        holdfast_sim::record::log_if_asked();
        let mut plan = Plan::quiet(23, 3, secs(8.0));
        plan.store = Store::Files;
        plan.flush.insert(ASIDE_BUSY, Duration::from_millis(50));
        let seen = client(&mut plan, |_ctx, old, seen: Arc<Mutex<Aside>>| async move {
            let (busy, cut) = (follower(old, 0)?, follower(old, 1)?);
            until(secs(2.45)).await;
            let aside = metric(busy, "holdfast_storage_appends_synced_aside_total").await;
            let mut seen = seen.lock().expect("poisoned");
            (seen.old, seen.busy, seen.cut, seen.aside) = (old, busy, cut, aside);
            Ok(())
        });
        for _ in 0..ASIDE_WRITERS {
            let seen = seen.clone();
            client(&mut plan, move |ctx, old, _: Arc<Mutex<()>>| {
                let seen = seen.clone();
                async move {
                    let node = format!("n{}:7070", follower(old, 0)?);
                    until(secs(1.1)).await;
                    let mut k = 0;
                    while now() < secs(2.5) {
                        let lock = format!("{KEPT_PREFIX}aside-c{}-{k}", ctx.client);
                        if let (Outcome::Granted { .. }, _) = http_acquire(&ctx, &node, &lock, MODEL_TTL_MS).await {
                            seen.lock().expect("poisoned").granted += 1;
                        }
                        k += 1;
                    }
                    Ok(())
                }
            });
        }
        schedule(
            &mut plan,
            vec![
                (1.0, Fault::CutFollower(1)),
                (2.5, Fault::Crash(ASIDE_BUSY)),
                (2.5, Fault::Crash(ASIDE_LEADER)),
                (2.6, Fault::Restart(ASIDE_BUSY)),
                (4.5, Fault::Restart(ASIDE_LEADER)),
                (6.0, Fault::Heal),
            ],
        );
        let report = run_clean(&plan);
        let seen = seen.lock().expect("poisoned");
        println!("{seen:?}");
        let Aside { old, busy, cut, granted, aside } = &*seen;
        assert_eq!(
            (*old, *busy, *cut),
            (ASIDE_LEADER, ASIDE_BUSY, ASIDE_CUT),
            "the seed's roles moved: name them anew"
        );
        assert!(applied(&report, &format!("CutFollower(1) (n{cut}, led by n{old})")), "{:?}", report.trace);
        assert!(*granted >= 200, "only {granted} grants through n{busy} before the crash");
        assert!(aside.is_some_and(|n| n > 0), "n{busy} synced no append aside: {aside:?}");
    });
}
