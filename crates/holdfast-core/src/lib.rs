//! The holdfast lock state machine.
//!
//! A pure, deterministic function of its log: [`LockState::apply`] takes the Raft log index of an entry
//! and the entry itself, and answers with an [`Applied`] that says everything the entry did (who was
//! granted, who was queued, what expired). Every replica that applies the same entries in the same order
//! holds byte-identical state ([`LockState::snapshot`]).
//!
//! Layout:
//! - [`command`]: what the log carries ([`Entry`], [`Command`]): leader-stamped time, leader-made tokens.
//! - [`state`]: [`LockState`], apply, queries, snapshot and restore.
//! - [`limits`]: the hard limits every replica enforces identically.
//!
//! This crate must not depend on IO, async, a clock or a random source: time, tokens and session ids come
//! in as data. `clippy.toml` bans clocks and hash maps here.

mod claims;
pub mod command;
pub mod limits;
mod sessions;
pub mod state;

pub use command::{Acquire, Command, Entry, Expire, SecretDigest, SessionId, SessionSecret, Token};
pub use state::{
    Applied, Ended, Grant, HolderView, Lease, LockState, LockView, Outcome, Reject, SessionView, SessionWait,
    SnapshotError, WaiterView,
};
