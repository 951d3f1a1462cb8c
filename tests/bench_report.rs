//! `cluster/any-node.sh --report`: the tables it prints from a run's JSON lines, judged on figures made
//! up for the test so that each cell's value is known: the targets' ratios and verdicts, what bounds them,
//! and "not run" where a side is missing.

use std::path::Path;
use std::process::Command;

/// One JSON line as `compare.sh` and `bench-etcd.sh` write them, with the round and system `any-node.sh`
/// adds.
fn line(system: &str, workload: &str, round: u32, rate: f64, p50_ms: f64, cpu: f64, generator: f64) -> String {
    format!(
        r#"{{"build":"{system}","workload":"{workload}","round":{round},"system":"{system}","rate":{rate},"p50_ms":{p50_ms},"cpu_us_per_op":{cpu},"generator_us_per_op":{generator}}}"#
    )
}

fn report(dir: &Path) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("bash")
        .arg(root.join("cluster/any-node.sh"))
        .arg("--report")
        .arg(dir)
        .output()
        .expect("running cluster/any-node.sh");
    assert!(out.status.success(), "any-node.sh --report failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("the report is UTF-8")
}

/// The row of the report's table whose first cell is `name`.
fn row<'a>(report: &'a str, name: &str) -> &'a str {
    let start = format!("| {name} |");
    report.lines().find(|line| line.starts_with(&start)).unwrap_or_else(|| panic!("no row {name:?} in:\n{report}"))
}

#[test]
fn the_report_judges_each_target_and_shows_what_bounds_them() {
    let dir = tempfile::tempdir().unwrap();
    let lines = [
        line("holdfast", "uncontended-1@follower@http", 1, 800.0, 1.25, 1200.0, 60.0),
        line("holdfast", "uncontended-64@http", 1, 12_000.0, 5.0, 110.0, 15.0),
        line("holdfast", "uncontended-64@leader@http", 1, 15_000.0, 4.0, 85.0, 15.0),
        line("holdfast", "contended-8@http", 1, 1_600.0, 0.6, 700.0, 50.0),
        line("holdfast", "uncontended-64@follower", 1, 18_000.0, 3.4, 60.0, 7.0),
        line("holdfast", "uncontended-64@leader", 1, 20_000.0, 2.7, 50.0, 7.0),
        line("holdfast", "contended-8@follower", 1, 1_500.0, 0.66, 690.0, 75.0),
        line("holdfast", "contended-8@leader", 1, 1_600.0, 0.55, 510.0, 65.0),
        line("holdfast", "uncontended-1@follower", 1, 700.0, 1.3, 1250.0, 110.0),
        line("holdfast", "uncontended-1@leader", 1, 950.0, 1.0, 900.0, 100.0),
        line("etcd", "uncontended-1", 1, 500.0, 2.0, 2600.0, 270.0),
        line("etcd", "uncontended-64", 1, 3_000.0, 19.0, 540.0, 60.0),
        line("etcd", "contended-8", 1, 80.0, 2.5, 4800.0, 320.0),
    ];
    std::fs::write(dir.path().join("results.jsonl"), lines.join("\n") + "\n").unwrap();
    let report = report(dir.path());

    let targets = [
        ("HTTP, 64 clients spread over the nodes / the same on the leader", "≥ 0.9", "0.8, not met"),
        ("HTTP, 64 clients spread / etcd 64 clients", "≥ 6", "4, not met"),
        ("HTTP, one client through a follower, acquire+release p50 (ms)", "≤ 1.2 ms", "1.25, not met"),
        ("HTTP `wait=`, 8 on one lock spread / etcd hand-overs", "≥ 20", "20, met"),
        ("gRPC, 64 clients through a follower / through the leader", "≥ 0.9", "0.9, met"),
        ("gRPC, 8 on one lock through a follower / through the leader", "≥ 0.9", "0.94, met"),
        ("gRPC, 64 clients through a follower / etcd 64 clients", "≥ 8", "6, not met"),
    ];
    for (name, goal, cell) in targets {
        assert_eq!(row(&report, name), format!("| {name} | {goal} | {cell} |"));
    }
    let bounds = [
        ("HTTP, 64 clients on the leader alone / etcd 64 clients", "5"),
        ("gRPC, 64 clients through the leader / etcd 64 clients", "6.67"),
        // 1.3 ms a cycle through a follower, 1.0 through the leader.
        ("gRPC, one client: p50 through a follower less through the leader (ms)", "0.3"),
        ("gRPC, 8 on one lock through the leader, hand-over p50 (ms)", "0.55"),
        // 12,000 a second at 110 + 15 µs each: 1.5 cores.
        ("cores busy: HTTP, 64 clients spread", "1.5"),
        ("cores busy: HTTP, 64 clients on the leader", "1.5"),
        ("cores busy: gRPC, 64 clients through a follower", "1.21"),
        ("cores busy: gRPC, 64 clients through the leader", "1.14"),
        ("cores busy: etcd, 64 clients", "1.8"),
    ];
    for (name, cell) in bounds {
        assert_eq!(row(&report, name), format!("| {name} | {cell} |"));
    }
}

#[test]
fn without_etcd_its_ratios_are_not_run_and_the_rest_is_judged() {
    let dir = tempfile::tempdir().unwrap();
    let lines = [
        line("holdfast", "uncontended-64@http", 1, 13_500.0, 5.0, 110.0, 15.0),
        line("holdfast", "uncontended-64@leader@http", 1, 15_000.0, 4.0, 85.0, 15.0),
        line("holdfast", "uncontended-64@leader", 1, 20_000.0, 2.7, 50.0, 7.0),
    ];
    std::fs::write(dir.path().join("results.jsonl"), lines.join("\n") + "\n").unwrap();
    let report = report(dir.path());

    let name = "HTTP, 64 clients spread over the nodes / the same on the leader";
    assert_eq!(row(&report, name), format!("| {name} | ≥ 0.9 | 0.9, met |"));
    let name = "HTTP, 64 clients spread / etcd 64 clients";
    assert_eq!(row(&report, name), format!("| {name} | ≥ 6 | — (not run) |"));
    let name = "gRPC, 64 clients through the leader / etcd 64 clients";
    assert_eq!(row(&report, name), format!("| {name} | — (not run) |"));
    let name = "gRPC, one client: p50 through a follower less through the leader (ms)";
    assert_eq!(row(&report, name), format!("| {name} | — (not run) |"));
    let name = "cores busy: gRPC, 64 clients through the leader";
    assert_eq!(row(&report, name), format!("| {name} | 1.14 |"));
}
