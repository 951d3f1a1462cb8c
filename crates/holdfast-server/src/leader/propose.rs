//! A client's request becomes a command: the leader makes its token, session id and secret, checks its
//! tenant's limits, and proposes it (one-lock commands through the batching [`super::proposer`]).

use holdfast_core::{Acquire, Command, Outcome, SessionSecret, Token};
use holdfast_store::Response;

use super::Leader;
use crate::peer::protocol::{NodeError, Request, Written};

/// An acquire publishing `value` with a lock-delay: a plain `Acquire` when there is neither, which every
/// build reads, and an `AcquireValued` when there is no delay.
fn acquire_command(acquire: Acquire, value: Vec<u8>, lock_delay_ms: u64) -> Command {
    match (value.is_empty(), lock_delay_ms) {
        (true, 0) => Command::Acquire(acquire),
        (false, 0) => Command::AcquireValued { acquire, value },
        (_, lock_delay_ms) => Command::AcquireDelayed { acquire, value, lock_delay_ms },
    }
}

impl Leader {
    /// Proposes `request` and answers once its entry is committed and applied here.
    pub(super) async fn propose(&self, request: Request) -> Result<Written, NodeError> {
        self.check_tenant_limits(&request)?;
        if let Request::Acquire { name, wait_ms: 0, .. } = &request {
            if let Some(busy) = self.busy_without_a_log_entry(name).await? {
                return Ok(busy);
            }
        }
        let (cmd, token, secret) = self.command(request);
        let (index, response) = match cmd.batchable() {
            true => self.proposer.propose(cmd).await?,
            // Boxed: openraft's client write is a large future, and the batchable commands, the common
            // ones, would carry its size inline too.
            false => Box::pin(self.appender.propose_command(cmd)).await?,
        };
        Ok(Written { index, response, token, secret })
    }

    /// Refuses a new lock or session beyond its tenant's limit (`--auth`); nothing is proposed. Without
    /// `--auth`, no write pays for the state's lock here.
    fn check_tenant_limits(&self, request: &Request) -> Result<(), NodeError> {
        let Some(tenants) = &self.tenants else { return Ok(()) };
        let state = crate::state::read(&self.state);
        let checked = match request {
            Request::Acquire { name, .. } | Request::SessionAcquire { name, .. } => {
                tenants.check_new_lock(&state, name)
            }
            Request::OpenSession { owner, .. } => tenants.check_new_session(&state, owner),
            _ => Ok(()),
        };
        checked.map_err(|(slug, detail)| NodeError::Limit { slug: slug.to_owned(), detail })
    }

    /// The command for `request`, with the token the leader made for an acquire and the secret for an
    /// opened session: the leader makes them before it proposes, so apply stays deterministic.
    fn command(&self, request: Request) -> (Command, Option<Token>, Option<SessionSecret>) {
        match request {
            Request::Acquire { name, owner, ttl_ms, wait_ms, value, lock_delay_ms } => {
                let lock_delay_ms = if self.bugs.lock_delay_dropped() { 0 } else { lock_delay_ms };
                let token = Token(self.random.draw());
                let acquire = Acquire { name, owner, token, ttl_ms, wait_ms, session: None };
                (acquire_command(acquire, value, lock_delay_ms), Some(token), None)
            }
            Request::SetValue { name, token, value } => (Command::SetValue { name, token, value }, None, None),
            Request::Release { name, token } => (Command::Release { name, token }, None, None),
            // Without a TTL, the state machine takes the hold's own when it applies: this node's state may
            // not have applied the grant yet (a new leader), so a TTL read here could be wrong.
            Request::Renew { name, token, ttl_ms: Some(ttl_ms) } => {
                (Command::Renew { name, token, ttl_ms }, None, None)
            }
            Request::Renew { name, token, ttl_ms: None } => (Command::RenewKeepingTtl { name, token }, None, None),
            Request::Cancel { name, token } => (Command::Cancel { name, token }, None, None),
            Request::OpenSession { owner, lease_ms } => {
                // Ids are made by the leader, like tokens; 0 is never used so it can mean "none" on the wire.
                let id = self.random.draw::<u64>().max(1);
                let secret = SessionSecret(Token(self.random.draw()));
                (Command::OpenSession { id, owner, lease_ms, secret: secret.digest() }, None, Some(secret))
            }
            Request::CloseSession { id } => (Command::CloseSession { id }, None, None),
            Request::CreateKey { tenant, hash } => (Command::CreateKey { tenant, hash }, None, None),
            Request::RevokeKey { tenant } => (Command::RevokeKey { tenant }, None, None),
            Request::SessionAcquire { id, name, wait, value, lock_delay_ms } => {
                let owner = crate::state::read(&self.state).session_summary(id).map(|(owner, ..)| owner.to_owned());
                let token = Token(self.random.draw());
                let acquire = Acquire {
                    name,
                    owner: owner.unwrap_or_default(),
                    token,
                    ttl_ms: 0,
                    wait_ms: wait.into(),
                    session: Some(id),
                };
                (acquire_command(acquire, value, lock_delay_ms), Some(token), None)
            }
        }
    }

    /// A try-lock of a lock that is held needs no log entry: if this leader's state says `name` is held,
    /// it confirms its leadership (a quorum round, and everything committed before it applied here) and, if
    /// the lock is still held, answers busy from its state. That answer is linearizable, and polling
    /// clients (cron fleets) do not grow the log or pay an fsync. A lock that looks free is proposed as
    /// usual, so the uncontended path costs nothing more.
    async fn busy_without_a_log_entry(&self, name: &str) -> Result<Option<Written>, NodeError> {
        self.elections.check_leader()?;
        if crate::state::read(&self.state).holder(name).is_none() {
            return Ok(None);
        }
        if !self.bugs.unconfirmed_busy() {
            self.confirmer.confirm_leader().await?;
        }
        let state = crate::state::read(&self.state);
        Ok(state.holder(name).map(|holder| Written {
            index: state.applied_index(),
            response: Response { at_ms: state.now_ms(), outcome: Some(Outcome::Busy { holder }) },
            token: None,
            secret: None,
        }))
    }
}
