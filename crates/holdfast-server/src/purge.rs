//! How far each node purges its log: decided here, not by openraft.
//!
//! openraft 0.9 purges a node's log as soon as it has stored a snapshot, down to
//! `max_in_snapshot_log_to_keep` entries behind it, whatever its followers still need: a follower being sent
//! a snapshot does not hold the purge back. So a follower whose install takes longer than the leader takes
//! to write `--snapshot-every` entries and snapshot again finds, once installed, that the entries right after
//! its snapshot are gone, and is sent the next snapshot, and the next, for as long as the writes keep up
//! (the simulation found it: seed 129, with installs of 0.6 s and a snapshot every 10 entries; with the
//! defaults, 1.2 s installs at a million locks under about 16,000 writes/s would do it).
//!
//! Here openraft purges nothing on its own (`max_in_snapshot_log_to_keep` is `u64::MAX`), and every
//! [`PURGE_EVERY`] a node asks it to purge through [`upto`]: `keep` entries behind its snapshot, and on a
//! leader no further than what a follower still needs: the entries after the snapshot it is being sent, or
//! after its matched log. A follower that has not moved for [`FOLLOWER_GONE`] (down, cut off), or that is
//! further behind than [`HELD_MAX`] entries, holds nothing back: when it comes back it is sent a snapshot.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast_store::{NodeId, TypeConfig};
use openraft::Raft;
use tokio::time::Instant;

/// How often a node looks at what it may purge.
pub const PURGE_EVERY: Duration = Duration::from_millis(500);
/// How long a follower's matched log may stay where it is, with no snapshot on its way to it, before it
/// holds no entries back: past a node's restart, well short of an outage that a snapshot serves better.
pub const FOLLOWER_GONE: Duration = Duration::from_secs(3);
/// How far behind the leader's snapshot a follower may hold entries back.
pub const HELD_MAX: u64 = 1_000_000;
/// How long after its last chunk a snapshot counts as on its way (a chunk's timeout is 10 s).
const SENDING_FOR: Duration = Duration::from_secs(15);

/// The index through which a node may purge its log: `keep` entries behind its snapshot at `snapshot`, and no
/// further than the entries after each of `needs` (the log indexes after which followers still need the log).
pub fn upto(snapshot: u64, keep: u64, needs: impl IntoIterator<Item = u64>) -> u64 {
    needs.into_iter().fold(snapshot.saturating_sub(keep), u64::min)
}

/// The snapshots this node is sending, and what it decided of its followers; shared by its network (which
/// tells it of each chunk) and its purge task ([`Purges::run`]).
pub struct Purges {
    keep: u64,
    /// Per follower: the last log index of the snapshot on its way, and when its last chunk went.
    sending: Mutex<BTreeMap<NodeId, (u64, Instant)>>,
}

impl Purges {
    /// Keeping `keep` entries behind a snapshot.
    pub fn new(keep: u64) -> Arc<Purges> {
        Arc::new(Purges { keep, sending: Mutex::default() })
    }

    /// A chunk of the snapshot through `last` is going to `target`.
    pub fn sending(&self, target: NodeId, last: u64) {
        self.sending.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(target, (last, Instant::now()));
    }

    /// `target` has installed the snapshot it was sent.
    pub fn sent(&self, target: NodeId) {
        self.sending.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&target);
    }

    /// Until `stop`: every [`PURGE_EVERY`], has `raft` purge its log through [`upto`].
    pub async fn run(&self, raft: Raft<TypeConfig>, mut stop: tokio::sync::watch::Receiver<bool>) {
        // Per follower: its matched index, and since when it has been there.
        let mut moved: BTreeMap<NodeId, (u64, Instant)> = BTreeMap::new();
        let mut tick = tokio::time::interval(PURGE_EVERY);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            let metrics = raft.metrics().borrow().clone();
            let Some(snapshot) = metrics.snapshot.map(|id| id.index) else { continue };
            let base = snapshot.saturating_sub(self.keep);
            let matched = metrics.replication.unwrap_or_default();
            moved.retain(|id, _| matched.contains_key(id));
            let sending = self.sending.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
            let now = Instant::now();
            let needs = matched.iter().filter(|(id, _)| **id != metrics.id).filter_map(|(id, matched)| {
                let matched = matched.map_or(0, |id| id.index);
                let since = match moved.get(id) {
                    Some((was, since)) if *was == matched => *since,
                    _ => now,
                };
                moved.insert(*id, (matched, since));
                let need = match sending.get(id) {
                    Some((last, at)) if now.duration_since(*at) < SENDING_FOR => *last,
                    _ if now.duration_since(since) >= FOLLOWER_GONE => return None,
                    _ => matched,
                };
                (base.saturating_sub(need) <= HELD_MAX).then_some(need)
            });
            let upto = upto(snapshot, self.keep, needs.collect::<Vec<_>>());
            if upto > metrics.purged.map_or(0, |id| id.index) {
                if let Err(e) = raft.trigger().purge_log(upto).await {
                    tracing::debug!(%e, "purging the log");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_purges_keep_entries_behind_its_snapshot_and_no_further_than_a_follower_needs() {
        assert_eq!(upto(20_000, 1_000, []), 19_000, "a follower, or a leader whose followers are caught up");
        assert_eq!(upto(500, 1_000, []), 0, "not yet past keep entries");
        assert_eq!(upto(20_000, 1_000, [20_100, 19_500]), 19_000);
        assert_eq!(upto(20_000, 1_000, [20_100, 12_000]), 12_000, "a follower being sent the snapshot of 12,000");
    }
}
