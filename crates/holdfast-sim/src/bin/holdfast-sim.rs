//! Runs one seed of the simulation and prints what it found: `holdfast-sim SEED [--trace]`.
//!
//! Prints the run's summary (its history's fingerprint, counts and violations), the fault trace with
//! `--trace`, and last an outcome line the seeds test reads ([`holdfast_sim::isolated`]). Exits 0 when every
//! guarantee held, 1 when one broke, 2 on bad arguments. `RUST_LOG` logs the nodes and clients.

use std::process::ExitCode;

use holdfast_sim::isolated::{Outcome, EXIT_VIOLATIONS};
use holdfast_sim::sim::{run, Plan};

const USAGE: &str = "usage: holdfast-sim SEED [--trace]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (seed, trace) = match args.as_slice() {
        [seed] => (seed, false),
        [seed, flag] if flag == "--trace" => (seed, true),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let Ok(seed) = seed.parse::<u64>() else {
        eprintln!("holdfast-sim: the seed must be a number, not {seed:?}\n{USAGE}");
        return ExitCode::from(2);
    };
    holdfast_sim::record::log_if_asked();
    let report = run(&Plan::random(seed));
    println!("{}", report.summary());
    if trace {
        println!("{}", report.trace.join("\n"));
    }
    println!("{}", Outcome::of(&report).line());
    if report.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_VIOLATIONS as u8)
    }
}
