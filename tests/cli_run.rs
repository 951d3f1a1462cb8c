//! `holdfast run NAME -- CMD`: flock for a cluster, against real 3-process clusters.
//!
//! Shows that a copy that does not get the lock never runs its command, that `holdfast run` exits with its
//! command's code (and its own documented codes otherwise), that the command sees its lock, fence and token,
//! that signals reach the command, and that a command whose lock is lost is stopped. Each test starts its
//! own cluster (see `common`); every wait is bounded.

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{sh_wait_for_file, sh_write_file, wait_for, wait_for_file, ClientProc, Cluster, Reply};

/// Three nodes, as in the smallest production deployment.
const NODES: usize = 3;
/// How long a `holdfast run` may take to connect, take a free lock and start its command.
const START_BOUND: Duration = Duration::from_secs(30);
/// How long a `holdfast run` may take to exit once its command ended (or it was refused).
const EXIT_BOUND: Duration = Duration::from_secs(30);

/// The documented exit codes (docs/cli.md).
const EXIT_BUSY: i32 = 75;
const EXIT_UNREACHABLE: i32 = 69;
const EXIT_LOST: i32 = 70;
const EXIT_CANNOT_RUN: i32 = 126;
const EXIT_NOT_FOUND: i32 = 127;

/// The lock as the cluster's leader sees it (a 404 is returned, not failed).
async fn lock_via_leader(cluster: &Cluster, name: &str) -> Reply {
    let leader = cluster.leader().await;
    cluster.lock(leader, name).await
}

/// Fails unless nobody holds or waits for `name`.
async fn assert_free(cluster: &Cluster, name: &str, what: &str) {
    lock_via_leader(cluster, name).await.assert_problem(404, "not-found", what);
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losers_never_run_their_command_and_exit_with_the_busy_code() {
    let cluster = Cluster::start(NODES).await;
    let work = tempfile::tempdir().expect("temporary directory for the jobs");
    let dir = work.path();
    let node = |id: usize| cluster.client_addr(id).to_string();
    let marker = dir.join("marker");

    // The holder: a `holdfast run` whose command runs until told to stop.
    let script = format!("{}; {}", sh_write_file("holding", "\"$HOLDFAST_FENCE\""), sh_wait_for_file("stop"));
    let mut holder = ClientProc::run(dir, "holder", &["job", "--endpoints", &node(1)], &script);
    wait_for_file(&dir.join("holding"), START_BOUND, "the holder's command to start").await;

    // Two copies at once, through the two other nodes: both refused, neither runs its command.
    let loser_script = "echo ran >> marker";
    let mut losers: Vec<ClientProc> = [2, 3]
        .into_iter()
        .map(|id| ClientProc::run(dir, &format!("loser-{id}"), &["job", "-n", "--endpoints", &node(id)], loser_script))
        .collect();
    for loser in &mut losers {
        let code = loser.exit_code(EXIT_BOUND, &format!("{} to give up", loser.label())).await;
        assert_eq!(code, EXIT_BUSY, "{} with -n must exit {EXIT_BUSY}: {}", loser.label(), loser.output());
        assert!(!dir.join(format!("{}.pid", loser.label())).exists(), "{} started its command", loser.label());
    }
    assert!(!marker.exists(), "a loser ran its command: marker = {:?}", read(&marker));

    // -E sets the busy code, as flock's.
    let mut custom = ClientProc::run(dir, "custom", &["job", "-n", "-E", "3", "--endpoints", &node(2)], loser_script);
    assert_eq!(custom.exit_code(EXIT_BOUND, "the -E 3 copy to give up").await, 3, "{}", custom.output());

    // A bounded wait that runs out is busy too, and not before the wait.
    let waited = Instant::now();
    let mut patient = ClientProc::run(dir, "patient", &["job", "--wait", "1s", "--endpoints", &node(3)], loser_script);
    assert_eq!(patient.exit_code(EXIT_BOUND, "the --wait 1s copy to give up").await, EXIT_BUSY, "{}", patient.output());
    let waited = waited.elapsed();
    assert!(waited >= Duration::from_secs(1), "--wait 1s gave up after {waited:?}");
    assert!(!marker.exists(), "a loser ran its command: marker = {:?}", read(&marker));
    assert!(holder.try_status().is_none(), "the holder must still run: {}", holder.output());

    // Once the holder is done, the same command runs (once).
    std::fs::write(dir.join("stop"), "").expect("create stop");
    assert_eq!(holder.exit_code(EXIT_BOUND, "the holder to exit").await, 0, "{}", holder.output());
    let mut winner = ClientProc::run(dir, "winner", &["job", "-n", "--endpoints", &node(2)], loser_script);
    assert_eq!(winner.exit_code(EXIT_BOUND, "the copy on a free lock to exit").await, 0, "{}", winner.output());
    assert_eq!(read(&marker), "ran\n", "only the copy that got the lock ran its command");
    assert_free(&cluster, "job", "job after every copy exited").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_exits_with_the_commands_code_and_releases_the_lock() {
    let cluster = Cluster::start(NODES).await;
    let work = tempfile::tempdir().expect("temporary directory for the jobs");
    let dir = work.path();
    let endpoints = cluster.endpoints();
    let not_executable = dir.join("not-executable.sh");
    std::fs::write(&not_executable, "#!/bin/sh\nexit 0\n").expect("write a script without the execute bit");

    let cases: [(&str, Vec<String>, i32); 4] = [
        ("exit 7", vec!["sh".into(), "-c".into(), "exit 7".into()], 7),
        ("killed by SIGTERM", vec!["sh".into(), "-c".into(), "kill -TERM $$".into()], 128 + libc::SIGTERM),
        ("command not found", vec!["holdfast-test-no-such-command".into()], EXIT_NOT_FOUND),
        ("not executable", vec![not_executable.display().to_string()], EXIT_CANNOT_RUN),
    ];
    for (i, (case, command, expected)) in cases.into_iter().enumerate() {
        let mut args: Vec<String> = ["run", "codes", "--endpoints", &endpoints, "--"].map(String::from).to_vec();
        args.extend(command);
        let mut run = ClientProc::start(dir, &format!("case-{i}"), &args);
        let code = run.exit_code(EXIT_BOUND, &format!("`holdfast run` of a command that ends with {case}")).await;
        assert_eq!(code, expected, "{case}: {}", run.output());
        // Whatever became of the command, the lock was let go.
        assert_free(&cluster, "codes", &format!("the lock after a command that ended with {case}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_cluster_exits_69_without_running_the_command() {
    let work = tempfile::tempdir().expect("temporary directory for the job");
    let dir = work.path();
    // A port that was free a moment ago: nothing listens there.
    let closed = TcpListener::bind("127.0.0.1:0").expect("bind a probe").local_addr().expect("probe address");
    let started = Instant::now();
    let mut run = ClientProc::run(dir, "lonely", &["job", "--endpoints", &closed.to_string()], "touch ran");
    let code = run.exit_code(Duration::from_secs(60), "`holdfast run` against a closed port to give up").await;
    eprintln!("unreachable: `holdfast run` gave up after {:?}", started.elapsed());
    assert_eq!(code, EXIT_UNREACHABLE, "{}", run.output());
    assert!(!dir.join("ran").exists(), "the command ran without the lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_sees_its_lock_fence_and_token() {
    let cluster = Cluster::start(NODES).await;
    let work = tempfile::tempdir().expect("temporary directory for the job");
    let dir = work.path();
    let script = format!(
        "printf '%s\\n%s\\n%s\\n' \"$HOLDFAST_LOCK\" \"$HOLDFAST_FENCE\" \"$HOLDFAST_TOKEN\" > env.tmp && mv env.tmp env; {}",
        sh_wait_for_file("stop")
    );
    let mut run = ClientProc::run(dir, "envjob", &["env-job", "--endpoints", &cluster.endpoints()], &script);
    let env = wait_for_file(&dir.join("env"), START_BOUND, "the command to write its environment").await;
    let lines: Vec<&str> = env.lines().collect();
    let [lock, fence, token] = lines[..] else { panic!("expected three lines, got {env:?}") };
    assert_eq!(lock, "env-job", "HOLDFAST_LOCK");
    let fence: u64 = fence.parse().unwrap_or_else(|e| panic!("HOLDFAST_FENCE {fence:?} is not a number: {e}"));
    assert!(
        token.len() == 32 && token.chars().all(|c| c.is_ascii_hexdigit()),
        "HOLDFAST_TOKEN {token:?} must be the grant's token (32 hex digits)"
    );
    let reply = lock_via_leader(&cluster, "env-job").await;
    let body = reply.ok("GET env-job while the command runs");
    assert_eq!(body["holder"]["fence"].as_u64(), Some(fence), "HOLDFAST_FENCE must be the holder's fence: {body}");

    std::fs::write(dir.join("stop"), "").expect("create stop");
    assert_eq!(run.exit_code(EXIT_BOUND, "the job to exit").await, 0, "{}", run.output());
    assert_free(&cluster, "env-job", "env-job after the job").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_run_reaches_the_command_and_the_lock_is_released() {
    let cluster = Cluster::start(NODES).await;
    let work = tempfile::tempdir().expect("temporary directory for the job");
    let dir = work.path();
    // The command says it is ready only once its trap is set.
    let script = format!(
        "trap 'echo got-term > termed; exit 0' TERM; {}; {}",
        sh_write_file("ready", "yes"),
        sh_wait_for_file("never")
    );
    let mut run = ClientProc::run(dir, "trapper", &["trapjob", "--endpoints", &cluster.endpoints()], &script);
    wait_for_file(&dir.join("ready"), START_BOUND, "the command to set its trap").await;
    let held = lock_via_leader(&cluster, "trapjob").await;
    held.ok("GET trapjob while the command runs");

    run.signal(libc::SIGTERM);
    let status = run.wait_exit(EXIT_BOUND, "`holdfast run` to exit after SIGTERM").await;
    assert_eq!(read(&dir.join("termed")), "got-term\n", "the command's TERM trap did not run; {}", run.output());
    assert_eq!(
        status.code(),
        Some(0),
        "the command exited 0 from its trap, so must `holdfast run`: {status}; {}",
        run.output()
    );
    assert_free(&cluster, "trapjob", "trapjob after the job").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_lock_is_lost_is_stopped_and_run_exits_70() {
    let cluster = Cluster::start(NODES).await;
    let work = tempfile::tempdir().expect("temporary directory for the jobs");
    let dir = work.path();
    let leader = cluster.leader().await;
    let follower = cluster.other_than(&[leader]);
    let via_a = cluster.client_addr(follower).to_string();
    let via_b = cluster.client_addr(leader).to_string();

    let script_a = format!("{}; exec sleep 600", sh_write_file("started-A", "\"$HOLDFAST_FENCE\""));
    let run_a = ["lostjob", "--ttl", "2s", "--kill-after", "2s", "--endpoints", &via_a];
    let mut a = ClientProc::run(dir, "A", &run_a, &script_a);
    let fence_a = wait_for_file(&dir.join("started-A"), START_BOUND, "A's command to start").await;
    let fence_a: u64 = fence_a.trim().parse().expect("A's HOLDFAST_FENCE is a number");
    let child = a.command_pid().expect("A's command wrote its pid");

    // A's `holdfast run` (not its command) stops for longer than its lease; B gets the lock meanwhile.
    a.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    let script_b = sh_write_file("b-ran", "\"$HOLDFAST_FENCE\"");
    let mut b = ClientProc::run(dir, "B", &["lostjob", "--wait", "60s", "--endpoints", &via_b], &script_b);
    let fence_b = wait_for_file(&dir.join("b-ran"), Duration::from_secs(60), "B to be granted lostjob").await;
    let fence_b: u64 = fence_b.trim().parse().expect("B's HOLDFAST_FENCE is a number");
    eprintln!("lost: B ran {:?} after A was stopped", stopped.elapsed());
    assert!(fence_b > fence_a, "fences must grow: A {fence_a}, then B {fence_b}");
    assert_eq!(b.exit_code(EXIT_BOUND, "B to exit").await, 0, "{}", b.output());

    // A wakes up: by its own clock its lease is long gone, so it stops its command and exits 70.
    a.signal(libc::SIGCONT);
    let woke = Instant::now();
    let code = a.exit_code(EXIT_BOUND, "A to notice it lost the lock and exit").await;
    eprintln!("lost: A exited {:?} after SIGCONT", woke.elapsed());
    assert_eq!(code, EXIT_LOST, "{}", a.output());
    wait_for(Duration::from_secs(10), &format!("A's command (pid {child}) to be gone"), async || {
        // SAFETY: kill with signal 0 only checks that the process exists.
        match unsafe { libc::kill(child, 0) } {
            0 => Err("it still exists".to_string()),
            _ => match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::ESRCH) => Ok(()),
                other => Err(format!("kill(pid, 0) failed with {other:?}")),
            },
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_run_stopped_by_sigterm_leaves_the_queue_at_once() {
    let cluster = Cluster::start(NODES).await;
    let work = tempfile::tempdir().expect("temporary directory for the jobs");
    let dir = work.path();
    let endpoints = cluster.endpoints();
    let script = format!("{}; {}", sh_write_file("holding", "yes"), sh_wait_for_file("stop"));
    let mut holder = ClientProc::run(dir, "holder", &["queued-job", "--endpoints", &endpoints], &script);
    wait_for_file(&dir.join("holding"), START_BOUND, "the holder's command to start").await;

    // A long lease: if the waiter's session were left behind, its place would stay for 30 s.
    let mut waiter =
        ClientProc::run(dir, "waiter", &["queued-job", "--ttl", "30s", "--endpoints", &endpoints], "touch waiter-ran");
    let waiters = async |cluster: &Cluster| -> Result<usize, String> {
        let reply = lock_via_leader(cluster, "queued-job").await;
        let waiters = reply.ok("GET queued-job")["waiters"].as_array().map(Vec::len);
        waiters.ok_or_else(|| format!("{reply:?}"))
    };
    wait_for(START_BOUND, "the waiter to queue", async || match waiters(&cluster).await? {
        1 => Ok(()),
        n => Err(format!("{n} waiters")),
    })
    .await;

    waiter.signal(libc::SIGTERM);
    let code = waiter.exit_code(EXIT_BOUND, "the waiting `holdfast run` to exit on SIGTERM").await;
    assert_eq!(code, 128 + libc::SIGTERM, "{}", waiter.output());
    // It ended its session on the way out: the queue empties well before the 30 s lease could run out.
    let stopped = Instant::now();
    wait_for(Duration::from_secs(10), "the waiter's place to go", async || match waiters(&cluster).await? {
        0 => Ok(()),
        n => Err(format!("{n} waiters")),
    })
    .await;
    eprintln!("queue emptied {:?} after the waiter exited", stopped.elapsed());
    assert!(!dir.join("waiter-ran").exists(), "the stopped waiter must never run its command");

    std::fs::write(dir.join("stop"), "").expect("create stop");
    assert_eq!(holder.exit_code(EXIT_BOUND, "the holder to exit").await, 0, "{}", holder.output());
    assert_free(&cluster, "queued-job", "queued-job after the holder exited").await;
}
