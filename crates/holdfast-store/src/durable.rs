//! [`Durable`]: how far a node's log is on disk, for a leader that acknowledges its own appends before
//! their sync.
//!
//! openraft 0.9 sends a leader's new entries to its followers only after the leader's own append has
//! called back, and counts the leader towards a quorum from then on. A store that calls back only after
//! its sync puts the leader's sync and a follower's sync in series on every write. A store opened with
//! [`crate::LogStore::acknowledge_own_appends`] calls back as soon as the leader's own entries are
//! written, and syncs them in the background, in parallel with the followers' syncs. openraft may then
//! count an entry committed before the leader's copy is durable: in a 3-node cluster, on one durable copy.
//! Nothing may act on such an entry until it is durable on a majority, so:
//!
//! - the state machine applies an entry only once the node's own log is durable through it
//!   ([`Durable::reached`]): the leader answers a client, and a leader-confirmed read returns, only from
//!   applied entries;
//! - the leader tells its followers a commit index no higher than its own durable log
//!   ([`Durable::clamp`]): a follower applies an entry only once the leader's copy and its own are durable;
//! - the committed log id is saved only when the log is durable through it, so that a node restarted
//!   after losing its unsynced tail never re-applies past its log.
//!
//! With these, an entry is visible anywhere only once a majority holds it durably, as when the leader
//! synced first; what openraft believes committed before that is never seen. A sync that fails marks the
//! log failed: no later apply waits for it, they fail and the node's Raft stops.

use std::sync::Arc;

use openraft::LogId;
use tokio::sync::watch;

use crate::{NodeId, StoreError};

/// How far the log is durable, as its store last synced it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Synced {
    /// The log id of the last entry durable on disk: every entry of the log up to it is.
    pub(crate) last: Option<LogId<NodeId>>,
    /// Whether entries after `last` are written and wait for the log's own thread to sync them: a
    /// leader's own, acknowledged before their sync, or a follower's synced aside, acknowledged after.
    /// While none are, every entry the log holds is durable.
    pub(crate) pending: bool,
    /// Why a sync failed, once one did: the log's durability is unknown from then on.
    pub(crate) failed: Option<Arc<str>>,
}

/// What a store tells of its syncs.
pub(crate) type SyncedSender = watch::Sender<Synced>;

/// How far a node's log is durable (see the module docs); clones follow the same log.
#[derive(Clone)]
pub struct Durable {
    rx: watch::Receiver<Synced>,
    /// Syncs what is written now, for a store that syncs only when asked (the memory store). `None` for a
    /// store that syncs in the background by itself.
    sync_now: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl Durable {
    pub(crate) fn new(rx: watch::Receiver<Synced>, sync_now: Option<Arc<dyn Fn() + Send + Sync>>) -> Self {
        Self { rx, sync_now }
    }

    /// The log id of the last entry durable in this node's log.
    pub fn last(&self) -> Option<LogId<NodeId>> {
        self.rx.borrow().last
    }

    /// `commit`, lowered to the last durable entry of this node's log if it is beyond it: what a leader may
    /// tell its followers is committed. Both are log ids of this node's log.
    pub fn clamp(&self, commit: Option<LogId<NodeId>>) -> Option<LogId<NodeId>> {
        let durable = self.last();
        match (commit, durable) {
            (Some(commit), Some(durable)) if durable.index < commit.index => Some(durable),
            (Some(_), None) => None,
            _ => commit,
        }
    }

    /// Waits until this node's log is durable through `index`: at once when no entry waits for the log's
    /// own thread to sync it (every append synced in place, or all synced).
    pub(crate) async fn reached(&self, index: u64) -> Result<(), StoreError> {
        let mut rx = self.rx.clone();
        let mut asked = false;
        loop {
            {
                let synced = rx.borrow_and_update();
                if let Some(why) = &synced.failed {
                    return Err(StoreError::SyncFailed(why.to_string()));
                }
                if !synced.pending || synced.last.is_some_and(|last| last.index >= index) {
                    return Ok(());
                }
            }
            if let (Some(sync_now), false) = (&self.sync_now, asked) {
                asked = true;
                sync_now();
                continue;
            }
            if rx.changed().await.is_err() {
                return Err(StoreError::SyncFailed("the log store is gone".to_string()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use super::*;

    fn id(index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    #[test]
    fn clamp_lowers_a_commit_beyond_the_durable_log_only() {
        let (tx, rx) = watch::channel(Synced { last: Some(id(5)), pending: true, failed: None });
        let durable = Durable::new(rx, None);
        assert_eq!(durable.clamp(Some(id(7))), Some(id(5)));
        assert_eq!(durable.clamp(Some(id(5))), Some(id(5)));
        assert_eq!(durable.clamp(Some(id(3))), Some(id(3)));
        assert_eq!(durable.clamp(None), None);
        tx.send_replace(Synced::default());
        assert_eq!(durable.clamp(Some(id(1))), None);
    }

    #[tokio::test]
    async fn reached_waits_for_the_sync_and_fails_with_it() {
        let (tx, rx) = watch::channel(Synced { last: Some(id(5)), pending: true, failed: None });
        let durable = Durable::new(rx, None);
        durable.reached(5).await.unwrap();
        let waiter = tokio::spawn({
            let durable = durable.clone();
            async move { durable.reached(6).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        tx.send_replace(Synced { last: Some(id(6)), pending: true, failed: None });
        waiter.await.unwrap().unwrap();
        // Nothing acknowledged before its sync: nothing to wait for (the entry is not in the log).
        tx.send_replace(Synced { last: Some(id(6)), pending: false, failed: None });
        durable.reached(8).await.unwrap();
        tx.send_replace(Synced { last: Some(id(6)), pending: true, failed: None });

        let waiter = tokio::spawn({
            let durable = durable.clone();
            async move { durable.reached(9).await }
        });
        tx.send_replace(Synced { last: Some(id(6)), pending: true, failed: Some("EIO".into()) });
        assert!(matches!(waiter.await.unwrap(), Err(StoreError::SyncFailed(why)) if why == "EIO"));
    }

    #[tokio::test]
    async fn reached_asks_a_store_that_syncs_on_demand() {
        let (tx, rx) = watch::channel(Synced { last: Some(id(2)), pending: true, failed: None });
        let tx = Arc::new(tx);
        let sync_now: Arc<dyn Fn() + Send + Sync> = {
            let tx = tx.clone();
            Arc::new(move || {
                tx.send_replace(Synced { last: Some(id(4)), pending: false, failed: None });
            })
        };
        Durable::new(rx, Some(sync_now)).reached(4).await.unwrap();
    }
}
