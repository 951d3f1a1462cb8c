//! The documented shell recipe (`curl -sf` + `jq`) runs a job exactly once across a fleet.
//!
//! Three copies of the script, each pointed at a different node, start at once. The import they guard
//! records that it ran and then stays inside the lock until the test has seen the two other copies give
//! up, so the runs are known to overlap rather than hoped to.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::{wait_for, Cluster};

/// The script exactly as documented; only `HOST:7070` is replaced by a node's client address.
const SCRIPT: &str = r#"RESPONSE=$(curl -sf -X POST "http://HOST:7070/v1/locks/nightly-import?ttl=60&owner=$HOSTNAME") || { echo "someone else has it"; exit 0; }
TOKEN=$(jq -r .token <<< "$RESPONSE")
trap 'curl -sf -X DELETE "http://HOST:7070/v1/locks/nightly-import?token=$TOKEN" > /dev/null' EXIT
./import.sh
"#;

/// Stands in for the real `./import.sh`: appends a line to `imports`, then waits (bounded, 30 s) for the
/// test to create `go`.
const IMPORT: &str = r#"#!/bin/sh
echo "import ran in $$" >> imports
i=0
while [ ! -e go ] && [ "$i" -lt 300 ]; do
    sleep 0.1
    i=$((i + 1))
done
"#;

/// Kills the scripts still running when a test fails, so that none outlives it.
struct Scripts(Vec<Child>);

impl Drop for Scripts {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn require_tool(tool: &str) {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    assert!(found, "this test runs the documented script, which needs `{tool}` (.ci/run installs it)");
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_curl_script_runs_the_import_exactly_once_across_three_nodes() {
    require_tool("curl");
    require_tool("jq");
    let cluster = Cluster::start(3).await;
    let work = tempfile::tempdir().expect("temporary directory for the scripts");
    let import = work.path().join("import.sh");
    std::fs::write(&import, IMPORT).expect("write import.sh");
    let made_executable = Command::new("chmod").arg("+x").arg(&import).status().expect("run chmod");
    assert!(made_executable.success());

    let mut scripts = Scripts(Vec::new());
    for id in cluster.ids() {
        let script = SCRIPT.replace("HOST:7070", &cluster.client_addr(id).to_string());
        let path = work.path().join(format!("job-{id}.sh"));
        std::fs::write(&path, script).expect("write the script");
        let out =
            std::fs::File::create(work.path().join(format!("job-{id}.out"))).expect("create the script's output file");
        let err = out.try_clone().expect("clone the output file handle");
        let mut command = Command::new("bash");
        command
            .arg(&path)
            .current_dir(work.path())
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        // curl must talk to 127.0.0.1 directly, whatever proxy the environment names.
        for proxy in ["http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"] {
            command.env_remove(proxy);
        }
        command.env("no_proxy", "*").env("NO_PROXY", "*");
        scripts.0.push(command.spawn().expect("start bash"));
    }

    // Two copies must give up while the third is inside the import.
    let imports = work.path().join("imports");
    let outputs = |scripts: &Scripts| -> String {
        (1..=scripts.0.len())
            .map(|id| format!("job-{id}: {:?}", read(&work.path().join(format!("job-{id}.out")))))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let mut exited = vec![None; 3];
    wait_for(Duration::from_secs(30), "two scripts to give up while the third runs the import", async || {
        for (i, child) in scripts.0.iter_mut().enumerate() {
            if exited[i].is_none() {
                exited[i] = child.try_wait().expect("poll a script");
            }
        }
        let done = exited.iter().filter(|status| status.is_some()).count();
        let ran = read(&imports).lines().count();
        assert!(ran <= 1, "{ran} scripts are running the import at once; outputs {}", outputs(&scripts));
        if done == 2 && ran == 1 {
            Ok(())
        } else {
            Err(format!("exited {exited:?}, imports run {ran}, outputs {}", outputs(&scripts)))
        }
    })
    .await;

    // Let the import finish; its script's trap releases the lock.
    std::fs::write(work.path().join("go"), "").expect("create go");
    wait_for(Duration::from_secs(30), "every script to exit", async || {
        for (i, child) in scripts.0.iter_mut().enumerate() {
            if exited[i].is_none() {
                exited[i] = child.try_wait().expect("poll a script");
            }
        }
        if exited.iter().all(Option::is_some) {
            Ok(())
        } else {
            Err(format!("exited {exited:?}, outputs {}", outputs(&scripts)))
        }
    })
    .await;

    let outputs = outputs(&scripts);
    for (i, status) in exited.iter().enumerate() {
        let status = status.expect("every script exited");
        assert!(status.success(), "script {} exited {status}; outputs {outputs}", i + 1);
    }
    let ran = read(&imports);
    assert_eq!(ran.lines().count(), 1, "imports: {ran:?}; outputs {outputs}");
    let gave_up = outputs.matches("someone else has it").count();
    assert_eq!(gave_up, 2, "two scripts must say someone else has it: {outputs}");

    // The winner's EXIT trap released the lock (a trap's failure would not change its exit status).
    let leader = cluster.leader().await;
    cluster.lock(leader, "nightly-import").await.assert_problem(404, "not-found", "the lock after every script exited");
}
