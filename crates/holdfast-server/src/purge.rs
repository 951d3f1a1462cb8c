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
//!
//! openraft holds a purge back only for the replication it tracks: a stream of an older membership, left
//! running after a change, may still read entries purged meanwhile. The store then answers that read with
//! nothing rather than with the entries after the purge (holdfast-store's `log::sent_from`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast_store::{NodeId, TypeConfig};
use openraft::Raft;
use tokio::time::Instant;

/// How often a node looks at what it may purge.
pub const PURGE_EVERY: Duration = Duration::from_millis(500);
/// How long a follower's matched log may stay where it is, with no snapshot on its way to it, before it
/// holds no entries back: longer than a node takes to restart, well short of an outage that a snapshot
/// serves better.
pub const FOLLOWER_GONE: Duration = Duration::from_secs(3);
/// How far behind the leader's snapshot a follower may hold entries back.
pub const HELD_MAX: u64 = 1_000_000;
/// How long after its last chunk a snapshot counts as on its way (a chunk's timeout is 10 s).
const SENDING_FOR: Duration = Duration::from_secs(15);

/// What a leader knows of one follower, for [`need`].
#[derive(Debug, Clone, Copy)]
pub struct Follower {
    /// The index of its matched log (0: none known).
    pub matched: u64,
    /// How long its matched log has stayed where it is.
    pub still_for: Duration,
    /// The last log index of the snapshot on its way to it, and how long ago its last chunk went.
    pub sending: Option<(u64, Duration)>,
}

/// The index after which `follower` still needs the leader's log, if it holds any back from a purge while
/// the leader's `keep` entries behind its snapshot begin at `base`: after the snapshot on its way, else
/// after its matched log; nothing if it has not moved for [`FOLLOWER_GONE`] or is more than [`HELD_MAX`]
/// entries behind.
pub fn need(follower: Follower, base: u64) -> Option<u64> {
    let need = match follower.sending {
        Some((last, since)) if since < SENDING_FOR => last,
        _ if follower.still_for >= FOLLOWER_GONE => return None,
        _ => follower.matched,
    };
    (base.saturating_sub(need) <= HELD_MAX).then_some(need)
}

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
                let sending = sending.get(id).map(|(last, at)| (*last, now.duration_since(*at)));
                need(Follower { matched, still_for: now.duration_since(since), sending }, base)
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

    #[test]
    fn a_follower_needs_the_log_after_its_snapshot_on_its_way_or_its_matched_log_until_it_stops_moving() {
        let (second, gone) = (Duration::from_secs(1), FOLLOWER_GONE);
        let follower = |matched, still_for, sending| Follower { matched, still_for, sending };
        assert_eq!(need(follower(900, second, None), 1_000), Some(900), "catching up: after its matched log");
        assert_eq!(need(follower(900, gone, None), 1_000), None, "down: holds nothing back");
        let sent = Some((950, second));
        assert_eq!(need(follower(0, gone, sent), 1_000), Some(950), "installing: after the snapshot, however still");
        let stale = Some((950, SENDING_FOR));
        assert_eq!(need(follower(0, gone, stale), 1_000), None, "a transfer that went quiet counts no more");
        assert_eq!(
            need(follower(0, second, stale), 1_000),
            Some(0),
            "a stale transfer, a follower that moved lately: after its matched log"
        );
        assert_eq!(need(follower(5, second, None), HELD_MAX + 6), None, "too far behind");
        assert_eq!(need(follower(5, second, None), HELD_MAX + 5), Some(5));
    }
}
