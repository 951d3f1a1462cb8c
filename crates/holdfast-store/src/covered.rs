//! [`Covered`]: how far this node's stored snapshot covers its log, so that the purge that follows a
//! snapshot from the leader does not run ahead of it.
//!
//! openraft 0.9 purges the log that a snapshot from the leader covers as soon as it hands the snapshot to
//! the state machine (`install_full_snapshot`), before the state machine has stored it, and the install
//! takes a second or more at a million locks. A node that stopped in between came back with its log
//! purged past its last stored snapshot: openraft restores the state from that snapshot and re-applies
//! the log after it, and the entries were gone, so the node could not start (found by the simulation,
//! `tests/failover.rs`). So while a snapshot from the leader is on its way (from the first chunk until it
//! is stored), a purge past the stored snapshot waits until a stored snapshot covers it
//! ([`Covered::reached`]). Other purges go ahead at once: openraft purges after a snapshot built here only
//! once the build, which stores it, is done, and openraft's storage suite purges with no snapshot at all.
//! An install that fails leaves the purge waiting, and the log whole.

use tokio::sync::watch;

use crate::StoreError;

#[derive(Debug, Clone, Copy, Default)]
struct Coverage {
    /// The last log index the stored snapshot covers (0: none).
    stored: u64,
    /// Whether a snapshot from the leader is being received or installed.
    receiving: bool,
}

/// How far the stored snapshot covers the log, and whether one is on its way; log stores wait on it.
#[derive(Clone)]
pub(crate) struct Covered {
    rx: watch::Receiver<Coverage>,
}

/// Told by the state machine of each snapshot received and stored.
pub(crate) struct CoveredSender {
    tx: watch::Sender<Coverage>,
}

/// A new pair, with nothing covered yet.
pub(crate) fn covered() -> (CoveredSender, Covered) {
    let (tx, rx) = watch::channel(Coverage::default());
    (CoveredSender { tx }, Covered { rx })
}

impl CoveredSender {
    /// A snapshot from the leader is on its way (its first chunk came).
    pub(crate) fn receiving(&self) {
        self.tx.send_if_modified(|coverage| !std::mem::replace(&mut coverage.receiving, true));
    }

    /// A snapshot covering the log up to `index` is stored (restored at start, built or installed); an
    /// installed one is no longer on its way.
    pub(crate) fn stored(&self, index: u64, installed: bool) {
        self.tx.send_if_modified(|coverage| {
            let before = *coverage;
            coverage.stored = coverage.stored.max(index);
            coverage.receiving &= !installed;
            (before.stored, before.receiving) != (coverage.stored, coverage.receiving)
        });
    }
}

impl Covered {
    /// Waits until the log up to `index` may be purged: no snapshot is on its way, or a stored one covers
    /// it.
    pub(crate) async fn reached(&self, index: u64) -> Result<(), StoreError> {
        let mut rx = self.rx.clone();
        rx.wait_for(|coverage| !coverage.receiving || coverage.stored >= index)
            .await
            .map(|_| ())
            .map_err(|_| StoreError::MachineGone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_purge_waits_only_for_a_snapshot_on_its_way() {
        let (sender, covered) = covered();
        covered.reached(7).await.expect("nothing on its way: a purge goes ahead");
        sender.stored(5, false);
        sender.receiving();
        covered.reached(5).await.expect("covered by the stored snapshot");
        let waiting = tokio::spawn({
            let covered = covered.clone();
            async move { covered.reached(9).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "index 9 is not covered yet");
        sender.stored(8, false);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a snapshot built here to 8 does not cover 9");
        sender.stored(9, true);
        waiting.await.unwrap().unwrap();
        covered.reached(12).await.expect("installed: nothing on its way any more");
        sender.receiving();
        drop(sender);
        assert!(matches!(covered.reached(10).await, Err(StoreError::MachineGone)));
    }
}
