//! The keeper's loop: the leader proposes one `Expire` entry for every hold, session and one-shot waiter
//! whose deadline passed (`apply::events` keeps the deadlines on every node; only the leader acts).

use std::time::Duration;

use tokio::time::Instant;

use super::Leader;

/// How often the leader looks for run-out leases.
pub const KEEPER_TICK: Duration = Duration::from_millis(50);

impl Leader {
    /// Runs the lease keeper until `shutdown` resolves. Acts only while this node is leader.
    pub async fn run_keeper(&self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(KEEPER_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            if !self.elections.is_leader() {
                self.events.demote();
                continue;
            }
            // Promotion: nobody is expired early because of a heartbeat the old leader saw and we did not.
            if self.promote() {
                continue;
            }
            self.expire_due().await;
        }
    }

    /// Proposes one `Expire` for what ran out, once a quorum round confirmed this node still leads.
    async fn expire_due(&self) {
        let mut expire = {
            let state = crate::state::read(&self.state);
            let wall = self.appender.wall_ms().max(state.now_ms());
            self.events.due(&state, Instant::now(), wall, self.load.expiry_grace())
        };
        if expire.is_empty() || self.bugs.never_expire() {
            return;
        }
        // Only a confirmed leader decides expiry.
        if let Err(e) = self.confirmer.confirm_leader().await {
            tracing::debug!(%e, "not expiring: leadership not confirmed");
            return;
        }
        let count = expire.len();
        expire.sessions.sort_unstable();
        match self.appender.propose_command(holdfast_core::Command::Expire(expire)).await {
            Ok((index, response)) => tracing::debug!(index, ?response.outcome, count, "proposed expiry"),
            Err(e) => tracing::warn!(%e, count, "expiry proposal failed; will retry"),
        }
    }
}
