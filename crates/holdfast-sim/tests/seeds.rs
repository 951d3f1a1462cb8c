//! Whole clusters under random fault schedules, one per seed, every checker over every run.
//!
//! `cargo test -p holdfast-sim --test seeds` runs a fixed set of seeds (a few minutes at most);
//! `HOLDFAST_SIM_SEEDS=5000` runs that many for a soak; `HOLDFAST_SIM_SEED=N` replays seed N alone, with
//! its fault schedule and every violation printed.
//!
//! Each seed runs in a process of its own (the `holdfast-sim` binary): only then is a run a function of its
//! seed (`holdfast_sim::isolated` says why), so a seed that fails here fails the same way when replayed.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use holdfast_sim::isolated::{self, Outcome, Run};

/// Seeds the README's test command runs: 1 to this.
const SEEDS_DEFAULT: u64 = 40;
/// Seeds of soaks that once broke a guarantee, run with the default seeds too (docs/testing.md, "Bugs the
/// simulation found"). A seed's path changes with the code, so each shows its bug only at the commit
/// that fixed it; later it is one more schedule.
const SEEDS_FOUND: &[u64] = &[90, 92, 114, 129, 147, 166, 507, 873];

/// The binary that runs one seed.
const SIM: &str = env!("CARGO_BIN_EXE_holdfast-sim");

fn env_u64(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    Some(text.trim().parse().unwrap_or_else(|_| panic!("{name}={text:?} is not a number")))
}

fn replay_command(seed: u64) -> String {
    format!("HOLDFAST_SIM_SEED={seed} cargo test -p holdfast-sim --test seeds -- --nocapture")
}

/// Runs `seed` in a process of its own; panics only if the process cannot be started.
fn run_alone(seed: u64, trace: bool) -> Run {
    isolated::run(Path::new(SIM), seed, trace).unwrap_or_else(|e| panic!("starting {SIM}: {e}"))
}

#[test]
fn every_seed_keeps_every_guarantee() {
    let seeds: Vec<u64> = match env_u64("HOLDFAST_SIM_SEED") {
        Some(seed) => vec![seed],
        None => match env_u64("HOLDFAST_SIM_SEEDS") {
            Some(n) => (1..=n).collect(),
            None => (1..=SEEDS_DEFAULT).chain(SEEDS_FOUND.iter().copied()).collect(),
        },
    };
    let verbose = seeds.len() == 1;
    let next = AtomicUsize::new(0);
    // Seeds that broke a guarantee, or whose process ended without an outcome, with what they printed.
    let failed: Mutex<Vec<(u64, String)>> = Mutex::default();
    let simulated = Mutex::new(Duration::ZERO);
    let started = std::time::Instant::now();
    // Seeds run side by side, one process each.
    let threads = env_u64("HOLDFAST_SIM_THREADS")
        .map_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()), |n| n.max(1) as usize)
        .min(seeds.len());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let Some(&seed) = seeds.get(next.fetch_add(1, Ordering::Relaxed)) else { return };
                let run = run_alone(seed, verbose);
                print!("{}", run.output);
                match run.outcome {
                    Some(Outcome { simulated: took, violations: 0, .. }) => *simulated.lock().unwrap() += took,
                    Some(Outcome { simulated: took, .. }) => {
                        *simulated.lock().unwrap() += took;
                        println!("  replay: {}", replay_command(seed));
                        failed.lock().unwrap().push((seed, run.output));
                    }
                    None => {
                        println!("seed {seed}: the run ended without an outcome:\n{}", run.errors);
                        println!("  replay: {}", replay_command(seed));
                        failed.lock().unwrap().push((seed, format!("{}{}", run.output, run.errors)));
                    }
                }
            });
        }
    });
    let simulated = *simulated.lock().unwrap();
    println!(
        "{} seeds, {:.2} simulated hours ({:.0} s), in {:.0} s",
        seeds.len(),
        simulated.as_secs_f64() / 3600.0,
        simulated.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    let failed = failed.into_inner().unwrap();
    assert!(
        failed.is_empty(),
        "{} of {} seeds broke a guarantee:\n{}",
        failed.len(),
        seeds.len(),
        failed
            .iter()
            .map(|(seed, output)| format!("{}  replay: {}", output, replay_command(*seed)))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// A run is a function of its seed: two processes running the same seed print the same summary and fault
/// trace, and the same history fingerprint (a hash of every call and its outcome, in simulated time).
#[test]
fn the_same_seed_gives_the_same_history() {
    let seed = 3;
    let (first, second) = std::thread::scope(|scope| {
        let first = scope.spawn(|| run_alone(seed, true));
        let second = scope.spawn(|| run_alone(seed, true));
        (first.join().unwrap(), second.join().unwrap())
    });
    let outcome = first.outcome.unwrap_or_else(|| panic!("seed {seed} ended without an outcome:\n{}", first.errors));
    assert!(outcome.calls > 0, "the run made no calls");
    assert_eq!(first.output, second.output);
    assert_eq!(Some(outcome), second.outcome);
    // And another seed gives another history, or the seed decides nothing.
    let other = run_alone(seed + 1, false).outcome.expect("seed 4 ended without an outcome");
    assert_ne!(outcome.digest, other.digest);
}
