//! Snapshots on an operator's call: every node snapshots its own state; nothing is proposed.

use std::time::Duration;

use tokio::time::Instant;

use super::Leader;
use crate::peer::protocol::NodeError;

/// How long an asked-for snapshot may take to build and store (a million held locks take about a second).
pub const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one snapshot build is waited for before it is asked for again: a build that was already
/// running when it was asked for may cover less than was wanted, and openraft starts no second one meanwhile.
const SNAPSHOT_RETRY: Duration = Duration::from_secs(1);

impl Leader {
    /// Has this node snapshot its lock state now (an operator's call; snapshots are otherwise taken every
    /// `--snapshot-every` entries), and waits, at most [`SNAPSHOT_TIMEOUT`], until its stored snapshot
    /// covers every entry it had applied when asked. Answers that snapshot's last log index and size in
    /// bytes; `(0, 0)` if nothing was applied yet. Every node snapshots its own state; nothing is proposed.
    pub async fn snapshot(&self) -> Result<(u64, u64), NodeError> {
        let wanted = self.raft.metrics().borrow().last_applied.map_or(0, |id| id.index);
        let deadline = Instant::now() + SNAPSHOT_TIMEOUT;
        loop {
            match self.events.snapshot() {
                Some((index, bytes)) if index >= wanted => return Ok((index, bytes)),
                None if wanted == 0 => return Ok((0, 0)),
                _ => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(NodeError::Unavailable(format!(
                    "no snapshot up to index {wanted} was stored within {SNAPSHOT_TIMEOUT:?}"
                )));
            }
            self.raft.trigger().snapshot().await.map_err(|e| NodeError::Unavailable(e.to_string()))?;
            // Stored (and so reported to `events`) before openraft's metrics show it.
            let _ = self
                .raft
                .wait(Some(left.min(SNAPSHOT_RETRY)))
                .metrics(|m| m.snapshot.is_some_and(|id| id.index >= wanted), "snapshot stored")
                .await;
        }
    }
}
