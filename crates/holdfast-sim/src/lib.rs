//! holdfast under deterministic simulation: the real server, store and client crates running whole
//! clusters on turmoil's simulated network and clock, with faults from a seeded schedule, and checkers over
//! what the clients saw.
//!
//! Layout:
//! - [`sim`]: one run: the cluster, its clients, the fault schedule ([`sim::Plan`]), convergence at the
//!   end, and the verdict ([`sim::Report`]).
//! - [`workload`]: the clients: one-call HTTP clients (model locks; the fenced lock with a short TTL and
//!   stalls; places of a semaphore) and session clients on the Rust client library.
//! - [`history`]: what a run recorded, in simulated time; [`record`]: recording it, and the fenced resource.
//! - [`check`]: the checkers over a history; each returns every violation it finds.
//! - [`net`]: turmoil's sockets fitted to the server's listeners and the channels' dialer; [`http`]: a
//!   minimal HTTP/1.1 client on them.
//! - [`isolated`]: one seed in a process of its own (the `holdfast-sim` binary), as the seeds test runs them.
//!
//! A run in a fresh process is a function of its seed: turmoil's, openraft's election timeouts, tokio's
//! scheduler (`--cfg tokio_unstable`, set in `.cargo/config.toml`), the nodes' tokens and ids, and the
//! clients' choices all draw from it (docs/testing.md says what else had to be pinned down). This crate is
//! for tests: nothing in the service depends on it.

pub mod check;
pub mod history;
pub mod http;
pub mod isolated;
pub mod net;
pub mod record;
pub mod sim;
pub mod workload;
