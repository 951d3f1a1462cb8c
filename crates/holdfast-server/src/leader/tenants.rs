//! [`TenantLimits`]: how many locks and sessions each API key may have (`--auth`), enforced by the leader
//! before it proposes anything new.

use holdfast_core::{limits, LockState};

/// Each tenant's limits.
#[derive(Debug, Clone, Copy)]
pub struct TenantLimits {
    pub locks_per_key_max: usize,
    pub sessions_per_key_max: usize,
}

/// A limit reached: its problem slug and what to tell the client.
pub type Exceeded = (&'static str, String);

impl TenantLimits {
    /// Refuses a new lock `name` (stored form) when its tenant already has as many as it may; a lock that
    /// exists already (to wait for) is no new lock. The leader checks before proposing, against its own
    /// state: requests in flight together may pass it together, so the bound is the limit plus those.
    pub fn check_new_lock(&self, state: &LockState, name: &str) -> Result<(), Exceeded> {
        let (Some(tenant), _) = limits::split_tenant(name) else { return Ok(()) };
        let max = self.locks_per_key_max;
        if state.holder(name).is_some() || state.count_locks_with_prefix(&limits::tenant_prefix(tenant), max) < max {
            return Ok(());
        }
        Err(("too-many-locks", format!("this API key has {max} locks, its limit")))
    }

    /// Refuses a new session of `owner` (stored form) when its tenant has as many open as it may (the same
    /// bound as [`TenantLimits::check_new_lock`]).
    pub fn check_new_session(&self, state: &LockState, owner: &str) -> Result<(), Exceeded> {
        let (Some(tenant), _) = limits::split_tenant(owner) else { return Ok(()) };
        let max = self.sessions_per_key_max;
        if state.count_sessions_with_owner_prefix(&limits::tenant_prefix(tenant), max) < max {
            return Ok(());
        }
        Err(("too-many-sessions", format!("this API key has {max} sessions open, its limit")))
    }
}
