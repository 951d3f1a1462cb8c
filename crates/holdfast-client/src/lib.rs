//! The Rust client library for holdfast, a replicated lock service.
//!
//! Two ways to hold a lock, as in the server's gRPC API (`proto/holdfast/v1/locks.proto`):
//!
//! - **Sessions** ([`Client::session`], [`Session`], [`HeldLock`]): a stream that owns its claims. It
//!   heartbeats every lease/4 in the background, waits its turn in a lock's FIFO queue, hands a lock over at
//!   once when it lets go, and survives the loss of the node it talks to by resuming on another. The client
//!   keeps the lease by its own clock, counting from when it SENT the last acknowledged heartbeat, so its
//!   view of the lease is never longer than the cluster's: when [`HeldLock::lost`] has not fired, the lock
//!   is still yours. [`Client::with_lock`], [`Client::try_lock`] and [`Client::lock_timeout`] wrap the
//!   common shapes.
//! - **One-shot calls** ([`Client::acquire`], [`Client::renew`], [`Client::release`], [`Client::get`],
//!   [`Client::list`], [`Client::cluster_status`]): a lock with a TTL and a token, like the HTTP API.
//! - **Values and watches**: a holder publishes a small value with its lock ([`Session::lock_with_value`],
//!   [`Client::acquire_with_value`], [`HeldLock::set_value`]); [`Client::watch`] follows a lock's changes.
//! - **Leader election** ([`Client::campaign`], [`Leadership`], [`Client::leader`], [`Client::observe`]):
//!   sessions, values and watches, as etcd's `concurrency.Election` offers them.
//!
//! Every grant carries a **fence**, a number that only ever grows. Pass it to whatever the lock protects,
//! so that it can turn away a holder that was too slow to notice it lost the lock: no lease protocol can
//! stop a process that pauses (GC, swap, SIGSTOP) between checking its lock and acting on it.
//!
//! ```no_run
//! use std::time::Duration;
//! use holdfast_client::{CancellationToken, Client};
//!
//! async fn do_the_work(fence: u64, lost: CancellationToken) -> Result<(), std::io::Error> {
//!     tokio::select! {
//!         // Write with the fence, so that storage refuses a stale holder.
//!         _ = tokio::time::sleep(Duration::from_secs(30)) => Ok(()),
//!         // The lease could not be kept: stop before someone else starts.
//!         _ = lost.cancelled() => Err(std::io::Error::other(format!("lost the lock (fence {fence})"))),
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let client = Client::connect(["10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"]).await?;
//!     client.with_lock("nightly-import", Duration::from_secs(2), |held| async move {
//!         do_the_work(held.fence(), held.lost()).await
//!     }).await??;
//!     Ok(())
//! }
//! ```
//!
//! # Layout
//!
//! - `client.rs`: [`Client`] and [`ClientBuilder`]; leader discovery; the conveniences and one-shot calls.
//! - `session.rs`: [`Session`] and [`HeldLock`], and the background task that owns a session's stream.
//! - `lease.rs`: the lease bookkeeping, a pure struct over instants.
//! - `pool.rs`: endpoint spelling, cached channels, the one retry loop.
//! - `error.rs`: [`Error`], and the one place that maps gRPC statuses and problem types to it.
//! - `types.rs`: plain structs for the server's answers.
//! - `watch.rs`: [`Watch`], a lock's changes as the server streams them, resumed across nodes.
//! - `election.rs`: [`Leadership`] and [`Leader`], on sessions, values and watches.
//!
//! This crate talks to the server only through its public gRPC API (`holdfast-proto`); it must not depend
//! on holdfast-server, holdfast-store or holdfast-core.

#![warn(missing_docs)]

mod calls;
mod client;
mod election;
mod error;
mod lease;
mod pool;
mod session;
mod types;
mod watch;

pub use client::{Client, ClientBuilder, ELECTION_LEASE};
pub use election::{Leader, Leadership};
pub use error::{Error, PROBLEM_METADATA};
pub use lease::heartbeat_late_ms;
pub use pool::DEFAULT_PORT;
pub use session::{HeldLock, Session};
pub use tokio_util::sync::CancellationToken;
pub use types::{
    AcquireOptions, ClusterStatus, Hold, HolderInfo, ListPage, LockInfo, Released, SnapshotInfo, WaiterInfo,
};
pub use watch::Watch;
