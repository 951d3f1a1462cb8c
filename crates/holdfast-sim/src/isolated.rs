//! Running one seed in a process of its own (the `holdfast-sim` binary), and reading back what it found.
//!
//! A run is a function of its seed only when nothing before it in the process can reach it. tokio numbers
//! its tasks process-wide, and a runtime's task list is sharded by that number, so the order in which a
//! crashed node's tasks (and with them its connections) are dropped depends on how many tasks the process
//! spawned before: seeds run one after another in one process took different paths than each run alone.
//! A fresh process per seed starts every run from the same place, so a seed that fails in a soak replays
//! exactly.

use std::io;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::sim::Report;

/// What a run found, as the binary's last line states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub seed: u64,
    /// The history's fingerprint ([`Report::digest`]).
    pub digest: u64,
    pub simulated: Duration,
    /// Calls the clients made.
    pub calls: usize,
    pub violations: usize,
}

const PREFIX: &str = "outcome";

impl Outcome {
    pub fn of(report: &Report) -> Self {
        Outcome {
            seed: report.seed,
            digest: report.digest(),
            simulated: report.simulated,
            calls: report.history.ops.len(),
            violations: report.violations.len(),
        }
    }

    /// The line the binary prints last.
    pub fn line(&self) -> String {
        format!(
            "{PREFIX} seed={} digest={:016x} simulated_ms={} calls={} violations={}",
            self.seed,
            self.digest,
            self.simulated.as_millis(),
            self.calls,
            self.violations
        )
    }

    /// Reads a line [`Outcome::line`] wrote; `None` for any other line.
    pub fn parse(line: &str) -> Option<Self> {
        let mut fields = line.strip_prefix(PREFIX)?.split_whitespace();
        let mut field = |name: &str| fields.next()?.strip_prefix(name)?.strip_prefix('=');
        let seed = field("seed")?.parse().ok()?;
        let digest = u64::from_str_radix(field("digest")?, 16).ok()?;
        let simulated = Duration::from_millis(field("simulated_ms")?.parse().ok()?);
        let calls = field("calls")?.parse().ok()?;
        let violations = field("violations")?.parse().ok()?;
        Some(Outcome { seed, digest, simulated, calls, violations })
    }
}

/// A finished run of the binary.
#[derive(Debug)]
pub struct Run {
    /// What it printed, but for its outcome line: the summary, and the fault trace if asked for.
    pub output: String,
    /// Its outcome; `None` if it ended without one (it panicked: `errors` says why).
    pub outcome: Option<Outcome>,
    /// What it printed on stderr.
    pub errors: String,
}

/// Runs seed `seed` in a new process of `exe` (the `holdfast-sim` binary), with the fault trace in its
/// output if `trace`. The environment (`RUST_LOG`) passes through.
pub fn run(exe: &Path, seed: u64, trace: bool) -> io::Result<Run> {
    let mut command = Command::new(exe);
    command.arg(seed.to_string());
    if trace {
        command.arg("--trace");
    }
    let out = command.output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The outcome is the last line; anything else (a log line) is output.
    let body = stdout.strip_suffix('\n').unwrap_or(&stdout);
    let (before, last) = body.rsplit_once('\n').unwrap_or(("", body));
    let (mut output, outcome) = match Outcome::parse(last) {
        Some(outcome) => (before.to_owned(), Some(outcome)),
        None => (body.to_owned(), None),
    };
    if !output.is_empty() {
        output.push('\n');
    }
    // An outcome from a process that then failed (other than by reporting violations) is not one.
    let clean = out.status.success() || out.status.code() == Some(EXIT_VIOLATIONS);
    Ok(Run { output, outcome: outcome.filter(|_| clean), errors: String::from_utf8_lossy(&out.stderr).into_owned() })
}

/// The environment variable that tells a test binary it runs one test in a process of its own.
const TEST_PROCESS: &str = "HOLDFAST_SIM_TEST_PROCESS";

/// Runs `body`, the body of the test named `name` (its path in the test binary), in a process of its own:
/// the test binary started again to run that test alone. For scenario tests, whose plans hold closures and
/// cannot go through the `holdfast-sim` binary: in a process shared with other tests, a scenario's path
/// would depend on what else the process ran (see the module's text). Panics, with the process's output,
/// if the test failed there or if no test of that name ran.
pub fn test_in_own_process(name: &str, body: impl FnOnce()) {
    if std::env::var(TEST_PROCESS).as_deref() == Ok(name) {
        body();
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(TEST_PROCESS, name)
        .output()
        .unwrap_or_else(|e| panic!("starting the test binary again for {name}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    print!("{stdout}");
    eprint!("{stderr}");
    assert!(out.status.success(), "{name} failed in its own process");
    assert!(stdout.contains("running 1 test"), "no test named {name} ran in its own process");
}

/// The binary's exit code when the run broke a guarantee.
pub const EXIT_VIOLATIONS: i32 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outcome_reads_back_as_written() {
        let outcome = Outcome {
            seed: 52,
            digest: 0x00ab_cdef_0123_4567,
            simulated: Duration::from_millis(25_631),
            calls: 471,
            violations: 2,
        };
        assert_eq!(Outcome::parse(&outcome.line()), Some(outcome));
    }

    #[test]
    fn other_lines_are_not_outcomes() {
        assert_eq!(Outcome::parse("seed 3 (history 2ba043d4546cb880): 25.6 s simulated"), None);
        assert_eq!(Outcome::parse("outcome seed=3 digest=zz simulated_ms=1 calls=1 violations=0"), None);
        assert_eq!(Outcome::parse("outcome seed=3"), None);
    }
}
