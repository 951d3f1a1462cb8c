//! Bugs the simulation found, each with the scenario that shows it fixed (docs/testing.md keeps the table).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use holdfast_sim::isolated::test_in_own_process;
use holdfast_sim::sim::{run, script, Fault, Plan};
use holdfast_sim::workload::{leader_of, until};
use hyper::{Method, StatusCode};

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// Bug 1 (seed 52 of the random schedule): a deposed leader, cut off before it heard of a member's
/// removal, answered an admin's request to add that member back with 200 "already a voter" and changed
/// nothing. Membership answers now come from a confirmed leader only.
#[test]
fn a_deposed_leader_does_not_answer_membership_changes_from_its_stale_view() {
    test_in_own_process("a_deposed_leader_does_not_answer_membership_changes_from_its_stale_view", || {
        holdfast_sim::record::log_if_asked();
        let answered_ok = Arc::new(AtomicBool::new(false));
        let removed_ok = Arc::new(AtomicBool::new(false));
        let victim = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut plan = Plan::quiet(52, 5, secs(10.0));
        let (ok, removed, removal_ok) = (answered_ok.clone(), victim.clone(), removed_ok.clone());
        plan.scripts.push(script(move |ctx| {
            let (ok, removed, removal_ok) = (ok.clone(), removed.clone(), removal_ok.clone());
            async move {
                until(secs(0.5)).await;
                let old = leader_of(&ctx.nodes[0]).await.ok_or("no leader")?;
                let others: Vec<u64> = (1..=5).filter(|n| *n != old).collect();
                let (through, victim) = (others[0], others[1]);
                removed.store(victim, Ordering::Relaxed);
                // The old leader is cut off at 1 s; the others elect a new one and remove the victim.
                until(secs(3.0)).await;
                let removal = format!("/v1/cluster/members/{victim}");
                for _ in 0..20 {
                    if let Ok((StatusCode::OK, _)) =
                        holdfast_sim::http::call(&format!("n{through}:7070"), Method::DELETE, &removal).await
                    {
                        removal_ok.store(true, Ordering::Relaxed);
                        break;
                    }
                    tokio::time::sleep(secs(0.2)).await;
                }
                // Ask the old leader, which never heard of the removal, to add the victim back (the client's call
                // may take until the heal: its bound is the run's).
                let addition = format!("/v1/cluster/members?id={victim}&addr=n{victim}:7071");
                if let Ok((StatusCode::OK, _)) =
                    holdfast_sim::http::call(&format!("n{old}:7070"), Method::POST, &addition).await
                {
                    ok.store(true, Ordering::Relaxed);
                }
                Ok(())
            }
        }));
        plan.faults.push((secs(1.0), Fault::IsolateLeader));
        plan.faults.push((secs(8.0), Fault::Heal));
        plan.healed_at = secs(8.0);
        let report = run(&plan);
        println!("{}\n{}\nmembers at the end: {:?}", report.summary(), report.trace.join("\n"), report.members);
        let victim = victim.load(Ordering::Relaxed);
        assert!(removed_ok.load(Ordering::Relaxed), "the removal was not made: the scenario shows nothing");
        // The old leader must not answer from its stale view: it answers once it knows (here: after the heal,
        // through the new leader), and then what it answered is true.
        assert!(
            !answered_ok.load(Ordering::Relaxed) || report.members.contains(&victim),
            "adding node {victim} back was answered 200, but it is not a member at the end"
        );
        assert!(answered_ok.load(Ordering::Relaxed), "adding node {victim} back was never answered");
    });
}
