//! Every checker is shown to catch a broken cluster: each scenario runs once on the real thing, which must
//! pass, and once with one rule the design depends on deliberately broken, where the checker that guards
//! that rule must report a violation. A checker that never failed proves nothing.

use std::time::Duration;

use holdfast_server::Bugs;
use holdfast_sim::isolated::test_in_own_process;
use holdfast_sim::sim::{run, script, Fault, Plan, Report, Role, Store};
use holdfast_sim::workload::{
    elector_hold, http_acquire, http_get, http_release, leader_of, session_hold, until, FENCED_LOCK, FENCED_TTL_MS,
    MODEL_TTL_MS,
};

const SEED: u64 = 42;
/// Sessions in these scenarios outlive a failover.
const LEASE: Duration = Duration::from_secs(3);

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// Runs `plan` as it is and with `bugs`; the real run must be clean, the broken one must be caught by
/// `checker`.
fn caught(plan: Plan, bugs: Bugs, checker: &str) {
    let real = run(&plan);
    println!("real:   {}", real.summary());
    assert!(real.violations.is_empty(), "the real cluster failed the scenario:\n{}\n{}", real.summary(), trace(&real));
    let broken = run(&Plan { bugs, ..plan });
    println!("broken: {}", broken.summary());
    assert!(
        broken.violations.iter().any(|v| v.checker == checker),
        "the {checker} checker did not catch {bugs:?}:\n{}\n{}",
        broken.summary(),
        trace(&broken)
    );
}

fn trace(report: &Report) -> String {
    let ops = report.history.ops.iter().map(|op| format!("{op:?}"));
    let holds = report.history.holds.iter().map(|hold| format!("{hold:?}"));
    report.trace.iter().cloned().chain(ops.chain(holds).take(60)).collect::<Vec<_>>().join("\n")
}

/// A holder's session outlives the leader: the new leader must give it a full lease from its promotion,
/// or it expires a session whose client still (rightly) believes it holds the lock, and hands the lock
/// to a waiter. The holder's process pauses from just before the crash until the heal, as a stalled
/// client would, so that it cannot learn of the expiry from its next heartbeat before the waiter is
/// granted (with an election 0.1 s faster since the election watch, it did, and stopped believing 40 ms
/// before the grant: caught only by that race until then).
#[test]
fn mutual_exclusion_catches_a_leader_without_promotion_grace() {
    test_in_own_process("mutual_exclusion_catches_a_leader_without_promotion_grace", || {
        let mut plan = Plan::quiet(SEED, 3, secs(9.0));
        plan.scripts.push(script(|ctx| async move {
            until(secs(0.5)).await;
            session_hold(&ctx, ctx.nodes.clone(), LEASE, "grace", secs(5.0), secs(8.0)).await
        }));
        plan.scripts.push(script(|ctx| async move {
            // Opened less than a lease before the crash, so that even the broken new leader keeps it.
            until(secs(2.5)).await;
            session_hold(&ctx, ctx.nodes.clone(), LEASE, "grace", secs(6.0), secs(8.5)).await
        }));
        // The holder's heartbeats go every 0.75 s from about 0.5 s; the last one answered before the stall
        // is the one of about 3.5 s, so it believes in its lease until about 6.5 s.
        plan.faults.push((secs(3.6), Fault::StallClient(1)));
        plan.faults.push((secs(4.0), Fault::CrashLeader));
        plan.healed_at = secs(6.0);
        caught(plan, Bugs { no_promotion_grace: true, ..Bugs::default() }, "mutual_exclusion");
    });
}

/// The same for an election: a new leader without the promotion's grace expires the session of a leader
/// whose process stalled while it still (rightly) believes it leads, and the waiting candidate is elected
/// beside it. Elections are judged as the lock they are: each leadership is a span its elector believed it
/// led, and `mutual_exclusion` finds two leaders at once.
#[test]
fn mutual_exclusion_catches_two_leaders_of_an_election() {
    test_in_own_process("mutual_exclusion_catches_two_leaders_of_an_election", || {
        let mut plan = Plan::quiet(SEED, 3, secs(9.0));
        plan.scripts.push(script(|ctx| async move {
            until(secs(0.5)).await;
            elector_hold(&ctx, ctx.nodes.clone(), LEASE, secs(5.0), secs(8.0)).await
        }));
        plan.scripts.push(script(|ctx| async move {
            until(secs(2.5)).await;
            elector_hold(&ctx, ctx.nodes.clone(), LEASE, secs(6.0), secs(8.5)).await
        }));
        plan.faults.push((secs(3.6), Fault::StallClient(1)));
        plan.faults.push((secs(4.0), Fault::CrashLeader));
        plan.healed_at = secs(6.0);
        caught(plan, Bugs { no_promotion_grace: true, ..Bugs::default() }, "mutual_exclusion");
    });
}

/// Electors told the leader's term as their fence: one after another in a term, each leads under the
/// same fence, which `fence_order` reports as granted twice.
#[test]
fn fence_order_catches_two_leaders_under_one_fence() {
    test_in_own_process("fence_order_catches_two_leaders_under_one_fence", || {
        let mut plan = Plan::quiet(SEED, 3, secs(6.0));
        plan.roles = vec![Role::Elector, Role::Elector, Role::Elector];
        caught(plan, Bugs { term_as_fence: true, ..Bugs::default() }, "fence_order");
    });
}

/// The leader is cut off from the other nodes but not from its clients: it must not acknowledge
/// heartbeats it cannot confirm, or its client goes on believing in a lease the new leader lets run out.
#[test]
fn mutual_exclusion_catches_heartbeats_acknowledged_without_confirmation() {
    test_in_own_process("mutual_exclusion_catches_heartbeats_acknowledged_without_confirmation", || {
        let mut plan = Plan::quiet(SEED, 3, secs(10.0));
        plan.scripts.push(script(|ctx| async move {
            until(secs(0.5)).await;
            let leader = leader_of(&ctx.nodes[0]).await.ok_or("no leader")?;
            // The holder talks to the leader only: its session stays on the side the leader is cut off on.
            session_hold(&ctx, vec![format!("n{leader}:7070")], LEASE, "isolated", secs(2.0), secs(9.0)).await
        }));
        plan.scripts.push(script(|ctx| async move {
            until(secs(1.0)).await;
            let leader = leader_of(&ctx.nodes[0]).await.ok_or("no leader")?;
            let others: Vec<String> =
                ctx.nodes.iter().filter(|n| !n.starts_with(&format!("n{leader}:"))).cloned().collect();
            session_hold(&ctx, others, LEASE, "isolated", secs(7.0), secs(9.5)).await
        }));
        plan.faults.push((secs(2.5), Fault::IsolateLeader));
        plan.healed_at = secs(7.0);
        caught(plan, Bugs { unconfirmed_heartbeats: true, ..Bugs::default() }, "mutual_exclusion");
    });
}

/// Clients told the leader's term as their fence: fences repeat, and a holder that stalled past its TTL
/// gets its stale write accepted over a newer holder's.
#[test]
fn fence_checkers_catch_fences_that_repeat() {
    test_in_own_process("fence_checkers_catch_fences_that_repeat", || {
        let mut plan = Plan::quiet(SEED, 3, secs(15.0));
        plan.roles = vec![Role::FencedHttp, Role::FencedHttp, Role::FencedHttp, Role::Model];
        caught(plan.clone(), Bugs { term_as_fence: true, ..Bugs::default() }, "fence_order");
        caught(plan, Bugs { term_as_fence: true, ..Bugs::default() }, "fenced_resource");
    });
}

/// Disks that acknowledge appends before they are durable: when every node crashes at once, a grant the
/// client was told about is gone.
#[test]
fn acknowledged_catches_disks_that_ack_before_flushing() {
    test_in_own_process("acknowledged_catches_disks_that_ack_before_flushing", || {
        acknowledged_catches_a_broken(Store::Memory);
    });
}

/// The same on the disk store, over a file system whose syncs do nothing.
#[test]
fn acknowledged_catches_a_disk_store_whose_syncs_do_nothing() {
    test_in_own_process("acknowledged_catches_a_disk_store_whose_syncs_do_nothing", || {
        acknowledged_catches_a_broken(Store::Files);
    });
}

/// A grant, then every node crashed at once: kept on `store` as it is, lost on a broken one.
fn acknowledged_catches_a_broken(store: Store) {
    let mut plan = Plan { store, ..Plan::quiet(SEED, 3, secs(8.0)) };
    plan.scripts.push(script(|ctx| async move {
        until(secs(1.0)).await;
        for attempt in 0..20 {
            let node = &ctx.nodes[attempt % ctx.nodes.len()];
            if let (holdfast_sim::history::Outcome::Granted { .. }, _) =
                http_acquire(&ctx, node, "kept-durable", MODEL_TTL_MS).await
            {
                break;
            }
            tokio::time::sleep(secs(0.2)).await;
        }
        // Nothing else is written after the grant until every node crashed.
        until(ctx.stop_at).await;
        Ok(())
    }));
    plan.faults.push((secs(3.0), Fault::CrashAll));
    plan.faults.push((secs(3.5), Fault::Heal));
    plan.healed_at = secs(3.5);
    let real = run(&plan);
    println!("real:   {}", real.summary());
    assert!(real.violations.is_empty(), "{}\n{}", real.summary(), trace(&real));
    let broken = run(&Plan { broken_disks: true, ..plan });
    println!("broken: {}", broken.summary());
    assert!(
        broken.violations.iter().any(|v| v.checker == "acknowledged"),
        "the acknowledged checker did not catch a disk that acks before flushing:\n{}\n{}",
        broken.summary(),
        trace(&broken)
    );
}

/// A deposed leader that answers "busy" from its own state without confirming its leadership answers from
/// the past: a try-lock told "busy" after the holder's release was acknowledged is not linearizable.
#[test]
fn linearizable_catches_busy_answered_without_confirming_leadership() {
    test_in_own_process("linearizable_catches_busy_answered_without_confirming_leadership", || {
        let plan = asked_after_a_release(Cut::Leader, Asked::TryLock);
        caught(plan, Bugs { unconfirmed_busy: true, ..Bugs::default() }, "linearizable");
    });
}

/// The same for a read: a `get` that shows the holder after its release was acknowledged.
#[test]
fn linearizable_catches_reads_answered_without_confirming_leadership() {
    test_in_own_process("linearizable_catches_reads_answered_without_confirming_leadership", || {
        let plan = asked_after_a_release(Cut::Leader, Asked::Read);
        caught(plan, Bugs { unconfirmed_reads: true, ..Bugs::default() }, "linearizable");
    });
}

/// And for a follower: one cut off from the others before the release, answering a `get` from its own
/// state at once, shows the holder after its release was acknowledged.
#[test]
fn linearizable_catches_follower_reads_answered_without_a_barrier() {
    test_in_own_process("linearizable_catches_follower_reads_answered_without_a_barrier", || {
        let plan = asked_after_a_release(Cut::Follower, Asked::Read);
        caught(plan, Bugs { unconfirmed_follower_reads: true, ..Bugs::default() }, "linearizable");
    });
}

/// Which node is cut off from the others before the release, and asked after it.
#[derive(Clone, Copy)]
enum Cut {
    /// The leader (clients still reach it): the others elect a new one, which the release goes through.
    Leader,
    /// The lowest-numbered follower (clients still reach it): the release goes through the leader.
    Follower,
}

/// What the node cut off is asked about the lock once its holder let go.
#[derive(Clone, Copy)]
enum Asked {
    TryLock,
    Read,
}

/// A lock taken through the leader; a node (`cut`) cut off at 2 s; the holder's release through the others
/// (once they elected a new leader, if the leader was cut off); then `asked` through the node cut off, which
/// has not heard of the release.
fn asked_after_a_release(cut: Cut, asked: Asked) -> Plan {
    let mut plan = Plan::quiet(SEED, 3, secs(9.0));
    plan.scripts.push(script(move |ctx| async move {
        until(secs(0.5)).await;
        let leader = format!("n{}:7070", leader_of(&ctx.nodes[0]).await.ok_or("no leader")?);
        let cut_off = match cut {
            Cut::Leader => leader.clone(),
            Cut::Follower => ctx.nodes.iter().find(|node| **node != leader).ok_or("no follower")?.clone(),
        };
        let (granted, token) = http_acquire(&ctx, &leader, "model-a", MODEL_TTL_MS).await;
        let (holdfast_sim::history::Outcome::Granted { fence }, Some(token)) = (granted, token) else {
            return Err("the first acquire was not granted".into());
        };
        until(secs(3.5)).await;
        let others: Vec<String> = ctx.nodes.iter().filter(|n| **n != cut_off).cloned().collect();
        for attempt in 0..20 {
            let outcome = http_release(&ctx, &others[attempt % others.len()], "model-a", fence, &token).await;
            if outcome != holdfast_sim::history::Outcome::Unknown {
                break;
            }
            tokio::time::sleep(secs(0.2)).await;
        }
        // A moment later, so that the two calls do not overlap in time.
        tokio::time::sleep(secs(0.05)).await;
        // What came back is recorded for the checkers.
        match asked {
            Asked::TryLock => {
                http_acquire(&ctx, &cut_off, "model-a", MODEL_TTL_MS).await;
            }
            Asked::Read => {
                http_get(&ctx, &cut_off, "model-a").await;
            }
        }
        Ok(())
    }));
    let isolate = match cut {
        Cut::Leader => Fault::IsolateLeader,
        Cut::Follower => Fault::IsolateFollower(0),
    };
    plan.faults.push((secs(2.0), isolate));
    plan.faults.push((secs(7.0), Fault::Heal));
    plan.healed_at = secs(7.0);
    plan
}

/// A cluster that never expires anything leaves a waiter waiting for a holder that went away.
#[test]
fn liveness_catches_leases_that_never_run_out() {
    test_in_own_process("liveness_catches_leases_that_never_run_out", || {
        let mut plan = Plan::quiet(SEED, 3, secs(20.0));
        plan.liveness_bound = secs(10.0);
        plan.scripts.push(script(|ctx| async move {
            until(secs(1.0)).await;
            // Takes the lock and goes away without releasing it.
            for attempt in 0..20 {
                let node = &ctx.nodes[attempt % ctx.nodes.len()];
                if let (holdfast_sim::history::Outcome::Granted { .. }, _) =
                    http_acquire(&ctx, node, FENCED_LOCK, FENCED_TTL_MS).await
                {
                    break;
                }
            }
            Ok(())
        }));
        plan.scripts.push(script(|ctx| async move {
            until(secs(4.0)).await;
            session_hold(&ctx, ctx.nodes.clone(), LEASE, FENCED_LOCK, secs(14.0), secs(19.0)).await
        }));
        caught(plan, Bugs { never_expire: true, ..Bugs::default() }, "liveness");
    });
}

/// The failover in a quiet cluster that ends every random run ([`Plan::quiet_failover`]), here on a
/// cluster nobody used before: a keeper that never expires leaves the probe's TTL hold held after it, and
/// a new leader without the promotion's full lease expires the probe's session, opened a lease before the
/// crash, on the followers' deadline, which heartbeats (sent to the leader only) never moved. (The check's first purpose, bug 4 in testing.md, is a plain bug with no
/// switch here: put back, it fails every seed.)
#[test]
fn quiet_failover_catches_leases_that_never_run_out_and_a_leader_without_promotion_grace() {
    test_in_own_process(
        "quiet_failover_catches_leases_that_never_run_out_and_a_leader_without_promotion_grace",
        || {
            let plan = Plan { quiet_failover: true, ..Plan::quiet(SEED, 3, secs(1.0)) };
            caught(plan.clone(), Bugs { never_expire: true, ..Bugs::default() }, "quiet_failover");
            caught(plan, Bugs { no_promotion_grace: true, ..Bugs::default() }, "quiet_failover");
        },
    );
}

/// A watch stream that is not sent every change: the watcher misses grants other clients were told of.
#[test]
fn watches_catch_a_stream_that_skips_changes() {
    test_in_own_process("watches_catch_a_stream_that_skips_changes", || {
        let mut plan = Plan::quiet(SEED, 3, secs(8.0));
        plan.roles = vec![Role::FencedHttp, Role::FencedHttp, Role::Session, Role::Watcher];
        caught(plan, Bugs { watch_skips_changes: true, ..Bugs::default() }, "watches");
    });
}

/// A leader that proposes acquires without their lock-delay: a lock whose holder walked away is granted
/// again as soon as the hold expires.
#[test]
fn lock_delay_catches_a_leader_that_drops_the_delay() {
    test_in_own_process("lock_delay_catches_a_leader_that_drops_the_delay", || {
        let mut plan = Plan::quiet(SEED, 3, secs(8.0));
        plan.roles = vec![Role::Delayed, Role::Delayed, Role::Delayed];
        caught(plan, Bugs { lock_delay_dropped: true, ..Bugs::default() }, "lock_delay");
    });
}

/// A leader that proposes a semaphore's acquires with one place more than their clients asked for: more
/// clients hold places of the semaphore at once than its limit.
#[test]
fn semaphore_limit_catches_a_leader_that_raises_the_limit() {
    test_in_own_process("semaphore_limit_catches_a_leader_that_raises_the_limit", || {
        let mut plan = Plan::quiet(SEED, 3, secs(8.0));
        plan.roles = vec![Role::Semaphore, Role::Semaphore, Role::Semaphore, Role::SemaphoreSession];
        caught(plan, Bugs { semaphore_limit_raised: true, ..Bugs::default() }, "semaphore_limit");
    });
}
