//! The one-shot lock operations both front doors (HTTP and gRPC) offer, with their input checks.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use holdfast_core::{limits, Grant, LockView, Outcome, Token};

use super::auth::Scope;
use super::error::ApiError;
use super::Api;
use crate::peer::protocol::{Query, QueryReply, Request, Written};
use crate::route::Watch;

/// TTL when a client gives none.
pub const TTL_MS_DEFAULT: u64 = 30_000;
/// Default and largest page of a list.
pub const PAGE_DEFAULT: usize = 100;
pub const PAGE_MAX: usize = 1000;

/// A lock name: 1 to [`limits::NAME_LEN_MAX`] bytes of `A-Z a-z 0-9 . _ - :`.
pub fn check_name(name: &str) -> Result<(), ApiError> {
    if limits::valid_name(name) {
        return Ok(());
    }
    let detail = format!("lock names are 1 to {} bytes of A-Z a-z 0-9 . _ - :", limits::NAME_LEN_MAX);
    Err(ApiError::invalid("invalid-name", detail))
}

/// An owner: at most [`limits::OWNER_LEN_MAX`] bytes, no control characters.
pub fn check_owner(owner: &str) -> Result<(), ApiError> {
    if limits::valid_owner(owner) {
        return Ok(());
    }
    let detail = format!("owner: at most {} bytes, no control characters", limits::OWNER_LEN_MAX);
    Err(ApiError::invalid("invalid-owner", detail))
}

/// A TTL or session lease within this node's configured bounds.
pub fn check_ttl(api: &Api, ttl_ms: u64) -> Result<u64, ApiError> {
    let (min, max) = (api.limits.ttl_ms_min, api.limits.ttl_ms_max);
    if (min..=max).contains(&ttl_ms) {
        return Ok(ttl_ms);
    }
    Err(ApiError::invalid(
        "invalid-ttl",
        format!("ttl {} is outside {}..={}", show_ms(ttl_ms), show_ms(min), show_ms(max)),
    ))
}

/// A wait within this node's configured bound.
pub fn check_wait(api: &Api, wait_ms: u64) -> Result<u64, ApiError> {
    let max = api.limits.wait_ms_max;
    if wait_ms <= max {
        return Ok(wait_ms);
    }
    Err(ApiError::invalid("invalid-wait", format!("wait {} is longer than {}", show_ms(wait_ms), show_ms(max))))
}

/// A token as acquire returned it: 32 hex digits.
pub fn parse_token(text: &str) -> Result<Token, ApiError> {
    text.parse().map_err(|_| ApiError::invalid("invalid-token", "token: 32 hex digits, as acquire returned it".into()))
}

/// A page size from 1 to [`PAGE_MAX`].
pub fn check_page(limit: usize) -> Result<usize, ApiError> {
    if (1..=PAGE_MAX).contains(&limit) {
        return Ok(limit);
    }
    Err(ApiError::invalid("invalid-query", format!("limit: a number from 1 to {PAGE_MAX}")))
}

/// A duration for people: `500ms`, `2s`, `1day`.
pub fn show_ms(ms: u64) -> String {
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

/// Takes `name` for `ttl_ms`, waiting in its queue up to `wait_ms` if it is held.
pub async fn acquire(
    api: &Arc<Api>,
    scope: &Scope,
    name: String,
    owner: String,
    ttl_ms: u64,
    wait_ms: u64,
) -> Result<Grant, ApiError> {
    check_name(&name)?;
    check_owner(&owner)?;
    check_ttl(api, ttl_ms)?;
    check_wait(api, wait_ms)?;
    let name = scope.inner(&name);
    let granted = acquire_stored(api, name, scope.inner(&owner), ttl_ms, wait_ms).await;
    granted
        .map(|mut grant| {
            grant.fence = api.told_fence(grant.fence);
            scope.grant(grant)
        })
        .map_err(|e| scope.error(e))
}

async fn acquire_stored(
    api: &Arc<Api>,
    name: String,
    owner: String,
    ttl_ms: u64,
    wait_ms: u64,
) -> Result<Grant, ApiError> {
    let started = Instant::now();
    let request = Request::Acquire { name: name.clone(), owner, ttl_ms, wait_ms };
    let written = acquire_or_undo(api, name.clone(), request).await?;
    match written.outcome().clone() {
        Outcome::Granted(grant) => Ok(grant),
        Outcome::Busy { holder } => Err(ApiError::Busy { name, holder: Some(holder) }),
        Outcome::Queued { .. } => {
            let token = written.token.expect("the leader returns the token of an acquire");
            let deadline = started + Duration::from_millis(wait_ms);
            wait_for_grant(api, name, token, written.index, deadline).await
        }
        Outcome::Rejected(reject) => Err(reject.into()),
        other => Err(ApiError::unexpected(other)),
    }
}

/// Proposes an acquire of `name` in a task of its own. If the caller goes away before the answer, the task
/// undoes what the acquire did (releases the grant, or leaves the queue), so that nobody holds or waits for
/// a lock on behalf of a client that is gone.
async fn acquire_or_undo(api: &Arc<Api>, name: String, request: Request) -> Result<Written, ApiError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task_api = api.clone();
    tokio::spawn(async move {
        let result = task_api.route.write(request).await;
        let Err(Ok(written)) = tx.send(result) else { return };
        let Some(token) = written.token else { return };
        if matches!(written.outcome(), Outcome::Granted(_) | Outcome::Queued { .. }) {
            tracing::debug!(name, "the client went away before its acquire was answered; undoing it");
            withdraw(&task_api, name, token).await;
        }
    });
    Ok(rx.await.map_err(|_| ApiError::Internal { detail: "the acquire task ended without an answer".into() })??)
}

/// Withdraws claim `token` on `name`: leaves the queue, or releases the lock if it was granted.
async fn withdraw(api: &Arc<Api>, name: String, token: Token) {
    api.events.unwatch(token);
    if let Err(e) = api.route.write(Request::Cancel { name: name.clone(), token }).await {
        tracing::warn!(%e, name, "could not withdraw the claim of a client that went away");
    }
}

/// Long-polls a queued claim until it is granted or `deadline` passes. If the caller goes away (this
/// future is dropped), the claim is withdrawn.
async fn wait_for_grant(
    api: &Arc<Api>,
    name: String,
    token: Token,
    index: u64,
    deadline: Instant,
) -> Result<Grant, ApiError> {
    let mut guard = WithdrawOnDrop { api: api.clone(), name: name.clone(), token, armed: true };
    let granted = match api.route.watch(&name, token, index).await? {
        Watch::Granted(grant) => Some(grant),
        Watch::Gone => None,
        Watch::Waiting(rx) => match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(grant)) => Some(grant),
            Ok(Err(_)) | Err(_) => None,
        },
    };
    guard.armed = false;
    if let Some(grant) = granted {
        return Ok(grant);
    }
    // The wait is over: withdraw. If the grant came in between, this releases it again, so that nobody
    // holds a lock its requester was told it did not get.
    api.events.unwatch(token);
    // Boxed: a write is a large future, and every long poll's would carry it inline for this rare end.
    Box::pin(api.route.write(Request::Cancel { name: name.clone(), token })).await?;
    let holder = crate::state::read(&api.state).holder(&name);
    Err(ApiError::Busy { name, holder })
}

/// Withdraws a queued claim when dropped while armed: the waiter's request went away.
struct WithdrawOnDrop {
    api: Arc<Api>,
    name: String,
    token: Token,
    armed: bool,
}

impl Drop for WithdrawOnDrop {
    fn drop(&mut self) {
        if self.armed {
            let (api, name, token) = (self.api.clone(), std::mem::take(&mut self.name), self.token);
            tokio::spawn(async move { withdraw(&api, name, token).await });
        }
    }
}

/// Lets go of `name`; answers the fence of the hold that ended.
pub async fn release(api: &Arc<Api>, scope: &Scope, name: String, token: Token) -> Result<(String, u64), ApiError> {
    check_name(&name)?;
    let released = async {
        match api.route.write(Request::Release { name: scope.inner(&name), token }).await?.outcome().clone() {
            Outcome::Released { name, fence } => Ok((scope.outer(&name), fence)),
            Outcome::Rejected(reject) => Err(reject.into()),
            other => Err(ApiError::unexpected(other)),
        }
    };
    released.await.map_err(|e| scope.error(e))
}

/// Extends the TTL hold of `token` on `name` (for its current TTL when `ttl_ms` is `None`).
pub async fn renew(
    api: &Arc<Api>,
    scope: &Scope,
    name: String,
    token: Token,
    ttl_ms: Option<u64>,
) -> Result<Grant, ApiError> {
    check_name(&name)?;
    if let Some(ttl_ms) = ttl_ms {
        check_ttl(api, ttl_ms)?;
    }
    let renewed = async {
        match api.route.write(Request::Renew { name: scope.inner(&name), token, ttl_ms }).await?.outcome().clone() {
            Outcome::Renewed(grant) => Ok(scope.grant(grant)),
            Outcome::Rejected(reject) => Err(reject.into()),
            other => Err(ApiError::unexpected(other)),
        }
    };
    renewed.await.map_err(|e| scope.error(e))
}

/// Who holds `name` and who waits for it.
pub async fn get(api: &Arc<Api>, scope: &Scope, name: String) -> Result<LockView, ApiError> {
    check_name(&name)?;
    match api.route.read(Query::Lock { name: scope.inner(&name) }).await? {
        QueryReply::Lock(Some(view)) => Ok(scope.view(view)),
        QueryReply::Lock(None) => Err(ApiError::NotFound { name }),
        other => Err(ApiError::unexpected(other)),
    }
}

/// Up to `limit` locks whose names start with `prefix`, after `after`; and the `after` of the next page.
pub async fn list(
    api: &Arc<Api>,
    scope: &Scope,
    prefix: String,
    after: Option<String>,
    limit: usize,
) -> Result<(Vec<LockView>, Option<String>), ApiError> {
    if prefix.len() > limits::NAME_LEN_MAX || after.as_ref().is_some_and(|a| a.len() > limits::NAME_LEN_MAX) {
        return Err(ApiError::invalid(
            "invalid-query",
            format!("prefix, after: at most {} bytes", limits::NAME_LEN_MAX),
        ));
    }
    let limit = check_page(limit)?;
    let (prefix, after) = (scope.inner(&prefix), after.map(|after| scope.inner(&after)));
    match api.route.read(Query::List { prefix, after, limit }).await? {
        QueryReply::List(views) => {
            let views: Vec<LockView> = views.into_iter().map(|view| scope.view(view)).collect();
            let next = if views.len() == limit { views.last().map(|v| v.name.clone()) } else { None };
            Ok((views, next))
        }
        other => Err(ApiError::unexpected(other)),
    }
}
