//! A leader whose disk fills up, or whose syncs stall, lets another lead.
//!
//! While the store finds its disk full or its log's syncs stalled (holdfast-store's `Disk`), its log takes
//! no more entries: each append waits, and openraft's core waits with it, sending no heartbeats. An idle
//! leader would append nothing, keep its followers, and still lead a cluster that cannot write through it
//! (or that waits on its sync to apply anything); so when its disk stops being writable it proposes an
//! entry that changes nothing (an empty `Expire`). Its append waits, the followers hear nothing for a lease
//! and an election timeout, and elect one of their own. The entry is never acknowledged here: once the
//! disk is writable it is appended, and the new leader's log replaces it.

use holdfast_core::{Command, Expire};
use holdfast_store::Disk;

use super::Leader;

impl Leader {
    /// Until `shutdown`: each time `disk` stops being writable while this node leads, proposes an entry that
    /// changes nothing, so that its Raft waits for the disk and another node leads meanwhile.
    pub async fn run_disk_watch(&self, disk: Disk, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut state = disk.state();
        let mut was_writable = state.borrow_and_update().writable();
        loop {
            let now = *state.borrow_and_update();
            if was_writable && !now.writable() && self.elections.is_leader() {
                let why = if now.full { "full" } else { "stalled" };
                tracing::warn!("the disk is {why}: this leader stops, so that another node leads");
                let appender = self.appender.clone();
                tokio::spawn(async move {
                    let _ = appender.propose_command(Command::Expire(Expire::default())).await;
                });
            }
            was_writable = now.writable();
            tokio::select! {
                changed = state.changed() => if changed.is_err() { return },
                _ = shutdown.changed() => return,
            }
        }
    }
}
