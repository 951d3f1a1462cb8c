//! The integration tests: real `holdfast` processes (3-node clusters on 127.0.0.1, `holdfast run`, the
//! shell recipe, a node in a network namespace, a Compose cluster), built as one test binary that links
//! the harness in `common` once. Each module is one of the files beside this one; a test's name starts
//! with its module (`http_cluster::…`), so `cargo test -p holdfast --test cluster http_cluster::` runs one
//! file's tests.
//!
//! Four modules are ignored by default and run by `tests/run` when the machine allows:
//! `admin_access::` (root, for a network namespace), `disk_full::` (root, to mount a tmpfs), `overload::`
//! (root, for a CPU cgroup) and `containers::` (a Docker engine), with `cargo test -p holdfast --test cluster -- --ignored admin_access::`
//! and the same with the others.

mod common;

mod admin_access;
mod auth;
mod bench_report;
mod cli_run;
mod containers;
mod disk_damage;
mod disk_full;
mod disk_stall;
mod http_cluster;
mod lock_delay;
mod membership;
mod observability;
mod overload;
mod semaphores;
mod sessions_cluster;
mod shell_script;
mod tls;
mod values_watches;
