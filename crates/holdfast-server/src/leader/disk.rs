//! A leader whose disk fills up lets another lead.
//!
//! Once the store finds its disk full (holdfast-store's `Space`), its log takes no more entries: each
//! append waits for room, and openraft's core waits with it, sending no heartbeats. An idle leader would
//! append nothing, keep its followers, and still lead a cluster that cannot write through it; so on
//! finding the disk full it proposes an entry that changes nothing (an empty `Expire`). Its append waits,
//! the followers hear nothing for a lease and an election timeout, and elect one of their own. The entry
//! is never acknowledged here: once there is room it is appended, and the new leader's log replaces it.

use holdfast_core::{Command, Expire};
use holdfast_store::Space;

use super::Leader;

impl Leader {
    /// Until `shutdown`: each time the disk under `space` becomes full while this node leads, proposes an
    /// entry that changes nothing, so that its Raft waits for room and another node leads meanwhile.
    pub async fn run_disk_watch(&self, space: Space, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut room = space.room();
        let mut was_low = room.borrow_and_update().low;
        loop {
            let low = room.borrow_and_update().low;
            if low && !was_low && self.elections.is_leader() {
                tracing::warn!("the disk is full: this leader stops, so that another node leads");
                let appender = self.appender.clone();
                tokio::spawn(async move {
                    let _ = appender.propose_command(Command::Expire(Expire::default())).await;
                });
            }
            was_low = low;
            tokio::select! {
                changed = room.changed() => if changed.is_err() { return },
                _ = shutdown.changed() => return,
            }
        }
    }
}
