//! `holdfast bench host`: the two properties of a machine that bound a lock's write latency, measured
//! without a cluster, so that runs on different hosts can be told apart.
//!
//! - **Thread wake-up round trips**: two threads hand a token back and forth through channels, each
//!   blocking until the other wakes it, both pinned to one core, then one to each of two (the first
//!   cores the process may run on). A holdfast write
//!   crosses a dozen such wake-ups (client, leader, follower, their tasks and threads), most of them
//!   from one core to another. Where an idle core halts and waking it takes the hypervisor (a virtual
//!   machine without guest halt polling), the two-core round trip is tens of microseconds, against a few
//!   on one core.
//! - **fdatasync**: small appends to a preallocated file, each synced, as the log appends an entry
//!   (`crates/holdfast-store/src/wal.rs`). Every write waits for one on a follower.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Instant;

use anyhow::Context;

use super::{Report, Samples, Unit};

/// `holdfast bench host`.
#[derive(clap::Args, Debug, Clone)]
pub struct HostArgs {
    /// Where to make the file the fdatasync probe appends to (deleted afterwards): a directory on the
    /// disk the nodes' data goes to.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Round trips between the two threads.
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub round_trips: u32,
    /// Synced appends.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub syncs: u32,
}

/// The size of one probe append: about a log entry of one lock command and its framing.
const APPEND: usize = 128;

pub fn run(args: HostArgs) -> anyhow::Result<Report> {
    // The first two cores this process may run on (a container's cpuset may leave out core 0).
    let cores = allowed_cores();
    let first = *cores.first().context("this process may run on no core, by sched_getaffinity")?;
    let one_core = wake_round_trips(args.round_trips, (first, first))
        .with_context(|| format!("cannot pin a thread to core {first}"))?;
    let two_cores = cores.get(1).and_then(|&second| wake_round_trips(args.round_trips, (first, second)));
    let sync = synced_appends(&args.dir, args.syncs)?;
    let mut report = Report::new("host", "host: thread wake-up round trips and fdatasync");
    report.row("wake-up, one core", format!("round trip {}", one_core.describe_in(Unit::Micros)));
    report.field("wake_round_trips", one_core.len());
    one_core.fields(&mut report, "wake_one_core_");
    match &two_cores {
        Some(two_cores) => {
            report.row("wake-up, two cores", format!("round trip {}", two_cores.describe_in(Unit::Micros)));
            two_cores.fields(&mut report, "wake_two_cores_");
        }
        None => report.row("wake-up, two cores", "not measured: this process may run on one core only"),
    }
    report.row("fdatasync", format!("{APPEND}-byte append + fdatasync {}", sync.describe_in(Unit::Micros)));
    report.row("file in", args.dir.display().to_string());
    report.field("syncs", sync.len());
    sync.fields(&mut report, "fdatasync_");
    Ok(report)
}

/// `count` round trips of a token between two threads, each blocked until the other wakes it, the
/// threads pinned to `cores` (this thread's core, the other's); `None` if they cannot be pinned there.
fn wake_round_trips(count: u32, cores: (usize, usize)) -> Option<Samples> {
    let (to_echo, echo_in) = mpsc::channel::<()>();
    let (echo_out, back) = mpsc::channel::<()>();
    let echo = std::thread::spawn(move || {
        if !pin_to(cores.1) {
            return;
        }
        while echo_in.recv().is_ok() {
            if echo_out.send(()).is_err() {
                return;
            }
        }
    });
    // On a thread of its own, so that pinning leaves the caller's thread alone. It drops its end of the
    // channel when it returns, which ends the echo thread.
    let probe = std::thread::spawn(move || {
        if !pin_to(cores.0) {
            return None;
        }
        let mut samples = Samples::default();
        for _ in 0..count {
            let sent = Instant::now();
            to_echo.send(()).ok()?;
            back.recv().ok()?;
            samples.push(sent.elapsed());
        }
        Some(samples)
    });
    let samples = probe.join().expect("the probe thread does not panic");
    let _ = echo.join();
    samples
}

/// The cores this process may run on, in order (empty if the kernel will not say).
fn allowed_cores() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is an empty set; sched_getaffinity fills it for this thread (pid 0) and
    // CPU_ISSET reads inside it (every index is below its size).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..8 * std::mem::size_of::<libc::cpu_set_t>()).filter(|&core| libc::CPU_ISSET(core, &set)).collect()
    }
}

/// Pins the calling thread to core `core`; false if it cannot be.
fn pin_to(core: usize) -> bool {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes inside it (core is checked against its
    // size), and sched_setaffinity reads it for the calling thread (pid 0).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if core >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
            return false;
        }
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// `count` appends of [`APPEND`] bytes into a preallocated file in `dir`, each followed by fdatasync.
fn synced_appends(dir: &Path, count: u32) -> anyhow::Result<Samples> {
    let path = dir.join(format!(".holdfast-bench-host-{}", std::process::id()));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    // Deleted however the probe ends.
    let _remove = RemoveOnDrop(path.clone());
    // Written and synced up front, as the log preallocates its segments: the appends below change no
    // file size, so fdatasync writes data only.
    let size = APPEND as u64 * u64::from(count);
    let mut filled = &file;
    filled.write_all(&vec![0; size as usize]).with_context(|| format!("writing {}", path.display()))?;
    file.sync_all().with_context(|| format!("syncing {}", path.display()))?;
    let entry = [0x5a; APPEND];
    let mut samples = Samples::default();
    for i in 0..u64::from(count) {
        let started = Instant::now();
        file.write_all_at(&entry, i * APPEND as u64).with_context(|| format!("writing {}", path.display()))?;
        file.sync_data().with_context(|| format!("fdatasync of {}", path.display()))?;
        samples.push(started.elapsed());
    }
    Ok(samples)
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_measures_both_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let report = run(HostArgs { dir: dir.path().to_owned(), round_trips: 20, syncs: 10 }).unwrap();
        assert_eq!(report.json["wake_round_trips"], 20);
        assert_eq!(report.json["syncs"], 10);
        assert!(report.json["wake_one_core_p50_ms"].as_f64().unwrap() > 0.0);
        if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 {
            assert!(report.json["wake_two_cores_p50_ms"].as_f64().unwrap() > 0.0);
        }
        assert!(report.json["fdatasync_p50_ms"].as_f64().unwrap() > 0.0);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the probe's file is deleted");
    }

    #[test]
    fn a_directory_that_does_not_exist_is_a_clear_error() {
        let Err(error) = run(HostArgs { dir: "/nonexistent/holdfast".into(), round_trips: 1, syncs: 1 }) else {
            panic!("a missing directory is an error");
        };
        assert!(format!("{error:#}").contains("creating /nonexistent/holdfast/.holdfast-bench-host-"), "{error:#}");
    }
}
