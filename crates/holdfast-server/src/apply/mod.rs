//! ⑤ Apply: what a node does with every entry it applies, on every node alike.
//!
//! - [`events`]: the apply observer ([`events::Events`]): watchers of grants, session streams, the lease
//!   deadlines the leader acts on, and the commits a follower may be waiting for.
//! - [`deadlines`]: those deadlines, ordered by time, with an O(1) promotion.
//! - [`notes`]: what a session's stream hears of its session ([`notes::Notes`]).
//! - [`waiting`]: the clients' writes waiting on this node, which decide where a follower syncs.
//!
//! [`wait_applied`] is how everything above waits for an entry to be applied here. Imports only the
//! leaves.

pub mod deadlines;
pub mod events;
pub mod notes;
pub mod waiting;

use holdfast_store::{SharedState, TypeConfig};
use openraft::Raft;

use crate::peer::protocol::{NodeError, Query, QueryReply, REQUEST_TIMEOUT};

/// Waits until this node applied the log up to `index`. At once when the lock state has applied an entry
/// at or past it (its index counts only entries with lock commands, so it never runs ahead of Raft's): a
/// read through a follower that is caught up, the usual case, looks at no watch.
pub async fn wait_applied(raft: &Raft<TypeConfig>, state: &SharedState, index: u64) -> Result<(), NodeError> {
    if crate::state::read(state).applied_index() >= index {
        return Ok(());
    }
    // Boxed: openraft's wait is over 1.5 KB, and every future that may wait here (a read, a barrier, a
    // heartbeat, a write's watch) would carry it inline, to be copied wherever it moves, though the
    // wait is rare (the state is almost always applied already).
    let wait = raft.wait(Some(REQUEST_TIMEOUT));
    let waited = Box::pin(wait.applied_index_at_least(Some(index), "applied here")).await;
    waited.map(|_| ()).map_err(|e| NodeError::Unavailable(e.to_string()))
}

/// Answers `query` from this node's lock state as it is.
pub fn answer_query(state: &SharedState, query: Query) -> QueryReply {
    let state = crate::state::read(state);
    match query {
        Query::Lock { name } => QueryReply::Lock(state.get(&name)),
        Query::List { prefix, after, limit } => {
            QueryReply::List(state.list(&prefix, after.as_deref(), limit), state.applied_index())
        }
        Query::Keys => QueryReply::Keys(state.keys().collect()),
    }
}
