//! A client's request becomes a command: the leader makes its token, session id and secret, checks its
//! tenant's limits, and proposes it (one-lock commands through the batching [`super::proposer`]).

use holdfast_core::{limits, Acquire, Command, Outcome, SessionSecret, Token};
use holdfast_store::Response;

use super::Leader;
use crate::peer::protocol::{NodeError, Request, Written};

/// An acquire of one of `limit` places publishing `value` with a lock-delay: the oldest command that
/// carries them, so that builds from before semaphores, lock-delays or values read what does not need
/// them: a plain `Acquire` when there is none, an `AcquireValued` with only a value, an `AcquireDelayed`
/// with a lock-delay, an `AcquireSemaphore` with a limit above 1.
fn acquire_command(acquire: Acquire, value: Vec<u8>, lock_delay_ms: u64, limit: u32) -> Command {
    match (value.is_empty(), lock_delay_ms, limit) {
        (true, 0, 1) => Command::Acquire(acquire),
        (false, 0, 1) => Command::AcquireValued { acquire, value },
        (_, lock_delay_ms, 1) => Command::AcquireDelayed { acquire, value, lock_delay_ms },
        (_, lock_delay_ms, limit) => Command::AcquireSemaphore { acquire, value, lock_delay_ms, limit },
    }
}

impl Leader {
    /// Proposes `request` and answers once its entry is committed and applied here.
    pub(super) async fn propose(&self, request: Request) -> Result<Written, NodeError> {
        self.check_tenant_limits(&request)?;
        self.check_load(&request)?;
        if let Request::Acquire { name, wait_ms: 0, limit, .. } = &request {
            if let Some(busy) = self.busy_without_a_log_entry(name, *limit).await? {
                return Ok(busy);
            }
        }
        let (cmd, token, secret) = self.command(request);
        let (index, response) = match cmd.batchable() {
            true => self.proposer.propose(cmd).await?,
            // In a box, once a place is free (`Appender::propose_alone`): openraft's client write is a large
            // future, and the batchable commands, the common ones, would carry its size inline too.
            false => self.appender.propose_alone(cmd).await?,
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

    /// Refuses a new session or one-shot acquire while this leader confirms heartbeats later than
    /// `--overload-delay`, and a new session while its workers have no room to spare (`--overload-busy`)
    /// ([`crate::load`]): the sessions it has come first. Nothing is proposed.
    fn check_load(&self, request: &Request) -> Result<(), NodeError> {
        let refused = match request {
            Request::OpenSession { .. } => self.load.refuses_session(),
            Request::Acquire { .. } => self.load.refuses_acquire(),
            _ => None,
        };
        let Some(detail) = refused else { return Ok(()) };
        self.metrics.overload_refusals.inc();
        Err(NodeError::Limit { slug: "overloaded".into(), detail })
    }

    /// The command for `request`, with the token the leader made for an acquire and the secret for an
    /// opened session: the leader makes them before it proposes, so apply stays deterministic.
    fn command(&self, request: Request) -> (Command, Option<Token>, Option<SessionSecret>) {
        match request {
            Request::Acquire { name, owner, ttl_ms, wait_ms, value, lock_delay_ms, limit } => {
                let lock_delay_ms = if self.bugs.lock_delay_dropped() { 0 } else { lock_delay_ms };
                let limit = if self.bugs.semaphore_limit_raised() && limit > 1 { limit + 1 } else { limit };
                let token = Token(self.random.draw());
                let acquire = Acquire { name, owner, token, ttl_ms, wait_ms, session: None };
                (acquire_command(acquire, value, lock_delay_ms, limit), Some(token), None)
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
                let sessions_max = limits::SESSIONS_MAX;
                (
                    Command::OpenSessionCapped { id, owner, lease_ms, secret: secret.digest(), sessions_max },
                    None,
                    Some(secret),
                )
            }
            Request::CloseSession { id } => (Command::CloseSession { id }, None, None),
            Request::CreateKey { tenant, hash } => (Command::CreateKey { tenant, hash }, None, None),
            Request::RevokeKey { tenant } => (Command::RevokeKey { tenant }, None, None),
            Request::SessionAcquire { id, name, wait, value, lock_delay_ms, limit } => {
                let limit = if self.bugs.semaphore_limit_raised() && limit > 1 { limit + 1 } else { limit };
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
                (acquire_command(acquire, value, lock_delay_ms, limit), Some(token), None)
            }
        }
    }

    /// A try-lock of a lock that is held needs no log entry: if this leader's state says every place of
    /// `name` is taken, under the `limit` the acquire gives (another limit is refused through the log), it
    /// confirms its leadership (a quorum round, and everything committed before it applied here) and, if
    /// that is still so, answers busy from its state. That answer is linearizable, and polling
    /// clients (cron fleets) do not grow the log or pay an fsync. A lock that looks free is proposed as
    /// usual, so the uncontended path costs nothing more.
    async fn busy_without_a_log_entry(&self, name: &str, limit: u32) -> Result<Option<Written>, NodeError> {
        self.elections.check_leader()?;
        let busy = |state: &holdfast_core::LockState| state.is_full(name) && state.limit(name) == Some(limit);
        if !busy(&crate::state::read(&self.state)) {
            return Ok(None);
        }
        if !self.bugs.unconfirmed_busy() {
            self.confirmer.confirm_leader().await?;
        }
        let state = crate::state::read(&self.state);
        Ok(state.holder(name).filter(|_| busy(&state)).map(|holder| Written {
            index: state.applied_index(),
            response: Response { at_ms: state.now_ms(), outcome: Some(Outcome::Busy { holder }) },
            token: None,
            secret: None,
        }))
    }
}
