//! `holdfast run NAME -- CMD ARGS…`: flock for a cluster. Holds a lock while a command runs.
//!
//! The lock is held by a session whose lease is `--ttl`: the client heartbeats it every ttl/4 and the lock
//! is lost if a heartbeat goes unacknowledged for a whole lease (by this process's own clock, counted from
//! when the heartbeat was sent). Exit codes are documented in `docs/cli.md`.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::ExitStatus;
use std::time::Duration;

use holdfast_client::{AcquireOptions, Error as ClientError};
use tokio::signal::unix::{signal, SignalKind};

/// The lock is held by someone else (with `--no-wait`) or the wait ran out; `-E` changes it, as flock's.
pub const EXIT_BUSY: u8 = 75;
/// The cluster could not be reached (no endpoint answered within the retry bounds), or refused new load as
/// overloaded: either passes, and the same call may succeed later.
pub const EXIT_UNREACHABLE: u8 = 69;
/// The lock was lost while the command ran; the command was terminated.
pub const EXIT_LOST: u8 = 70;
/// The command could not be run (not executable).
pub const EXIT_CANNOT_RUN: u8 = 126;
/// The command was not found.
pub const EXIT_NOT_FOUND: u8 = 127;
/// Bad usage or any other error before the command ran.
pub const EXIT_USAGE: u8 = 64;

/// How `holdfast run` waits for the lock.
pub enum Wait {
    /// Answer busy at once (`-n`).
    No,
    /// Up to this long (`-w`).
    For(Duration),
    /// As long as it takes.
    Forever,
}

pub struct RunArgs {
    /// The cluster, with any TLS settings.
    pub client: holdfast_client::ClientBuilder,
    pub name: String,
    pub ttl: Duration,
    pub wait: Wait,
    /// What the holder publishes while it holds the lock (`holdfast elect --value`), and its lock-delay.
    pub options: AcquireOptions,
    pub busy_code: u8,
    pub kill_after: Duration,
    pub command: Vec<String>,
}

/// SIGINT, SIGTERM and SIGHUP, caught from the start: while waiting for the lock they end the session
/// (leaving the queue) instead of killing this process with its session still queued; while the command
/// runs they are forwarded to it.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal's number.
    async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hup.recv() => libc::SIGHUP,
        }
    }
}

/// Runs the command under the lock; answers the process's exit code.
pub async fn run(args: RunArgs) -> u8 {
    let mut signals = match Signals::install() {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("holdfast: cannot install signal handlers: {e}");
            return EXIT_USAGE;
        }
    };
    let client = match args.client.clone().connect().await {
        Ok(client) => client,
        Err(e) => return report(&e),
    };
    let session = match client.session(args.ttl).await {
        Ok(session) => session,
        Err(e) => return report(&e),
    };
    let acquire = async {
        match args.wait {
            // A zero wait is a try-lock whose Busy names the holder.
            Wait::No => session.lock_with(&args.name, Some(Duration::ZERO), args.options.clone()).await,
            Wait::For(wait) => session.lock_with(&args.name, Some(wait), args.options.clone()).await,
            Wait::Forever => session.lock_with(&args.name, None, args.options.clone()).await,
        }
    };
    let held = tokio::select! {
        held = acquire => held,
        signal = signals.recv() => {
            // Leave the queue now rather than when the lease runs out.
            let _ = session.close().await;
            return 128u8.saturating_add(signal as u8);
        }
    };
    let held = match held {
        Ok(held) => held,
        Err(busy @ ClientError::Busy { .. }) => {
            eprintln!("holdfast: {}: {busy}", args.name);
            let _ = session.close().await;
            return args.busy_code;
        }
        Err(ClientError::Timeout) => {
            eprintln!("holdfast: {} was not granted within the wait", args.name);
            let _ = session.close().await;
            return args.busy_code;
        }
        Err(e) => return report(&e),
    };
    let code = supervise(&args, held.fence(), held.token(), held.lost(), &mut signals).await;
    if code != EXIT_LOST {
        if let Err(e) = held.release().await {
            eprintln!("holdfast: releasing {}: {e}", args.name);
        }
    }
    let _ = session.close().await;
    code
}

/// Runs the command in its own process group; forwards SIGINT, SIGTERM and SIGHUP to it; if the lock is
/// lost, terminates the group (SIGTERM, then SIGKILL after `kill_after`).
async fn supervise(
    args: &RunArgs,
    fence: u64,
    token: &str,
    lost: tokio_util::sync::CancellationToken,
    signals: &mut Signals,
) -> u8 {
    let mut command = tokio::process::Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("HOLDFAST_LOCK", &args.name)
        .env("HOLDFAST_FENCE", fence.to_string())
        .env("HOLDFAST_TOKEN", token);
    // Its own process group, so that on loss the whole tree it started is stopped, not only its leader.
    command.as_std_mut().process_group(0);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("holdfast: cannot run {:?}: {e}", args.command[0]);
            return if e.kind() == std::io::ErrorKind::NotFound { EXIT_NOT_FOUND } else { EXIT_CANNOT_RUN };
        }
    };
    let pgid = child.id().expect("a running child has a pid") as i32;
    loop {
        tokio::select! {
            status = child.wait() => return exit_code(status),
            signal = signals.recv() => kill_group(pgid, signal),
            _ = lost.cancelled() => {
                eprintln!("holdfast: lost the lock {}; stopping the command", args.name);
                kill_group(pgid, libc::SIGTERM);
                if tokio::time::timeout(args.kill_after, child.wait()).await.is_err() {
                    kill_group(pgid, libc::SIGKILL);
                    let _ = child.wait().await;
                }
                return EXIT_LOST;
            }
        }
    }
}

fn kill_group(pgid: i32, signal: i32) {
    // SAFETY: killpg has no memory-safety preconditions; a stale group only makes it fail with ESRCH.
    unsafe {
        libc::killpg(pgid, signal);
    }
}

/// The child's exit code, or 128+N when signal N ended it (as shells report it).
fn exit_code(status: std::io::Result<ExitStatus>) -> u8 {
    match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => code as u8,
            (None, Some(signal)) => 128u8.saturating_add(signal as u8),
            (None, None) => EXIT_CANNOT_RUN,
        },
        Err(e) => {
            eprintln!("holdfast: waiting for the command: {e}");
            EXIT_CANNOT_RUN
        }
    }
}

fn report(e: &ClientError) -> u8 {
    eprintln!("holdfast: {e}");
    // Unreachable or overloaded: the same call may get past it later.
    if e.is_transient() {
        return EXIT_UNREACHABLE;
    }
    EXIT_USAGE
}
