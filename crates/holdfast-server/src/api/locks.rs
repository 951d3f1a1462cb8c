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

/// A lock-delay within this node's configured bound.
pub fn check_lock_delay(api: &Api, lock_delay_ms: u64) -> Result<u64, ApiError> {
    let max = api.limits.lock_delay_ms_max;
    if lock_delay_ms <= max {
        return Ok(lock_delay_ms);
    }
    let detail = format!("lock_delay {} is longer than {}", show_ms(lock_delay_ms), show_ms(max));
    Err(ApiError::invalid("invalid-lock-delay", detail))
}

/// A semaphore's limit from 1 (a lock) to [`limits::SEMAPHORE_LIMIT_MAX`].
pub fn check_limit(limit: u32) -> Result<u32, ApiError> {
    if (1..=limits::SEMAPHORE_LIMIT_MAX).contains(&limit) {
        return Ok(limit);
    }
    let detail = format!("limit {limit}: a number from 1 (a lock) to {}", limits::SEMAPHORE_LIMIT_MAX);
    Err(ApiError::invalid("invalid-limit", detail))
}

/// A value of at most [`limits::VALUE_LEN_MAX`] bytes.
pub fn check_value(value: &[u8]) -> Result<(), ApiError> {
    if value.len() <= limits::VALUE_LEN_MAX {
        return Ok(());
    }
    let detail = format!("a value is at most {} bytes; this one has {}", limits::VALUE_LEN_MAX, value.len());
    Err(ApiError::invalid("invalid-value", detail))
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

/// What a one-shot acquire asks for.
#[derive(Debug, Clone)]
pub struct AcquireArgs {
    pub name: String,
    pub owner: String,
    pub ttl_ms: u64,
    /// 0: answer busy at once if held.
    pub wait_ms: u64,
    /// What the grant publishes (empty: nothing).
    pub value: Vec<u8>,
    /// How long the lock stays ungranted if the hold expires (0: not at all).
    pub lock_delay_ms: u64,
    /// How many may hold it at once: 1 for a lock, more for a semaphore.
    pub limit: u32,
}

/// Takes a lock for a TTL, waiting in its queue up to the wait asked for if it is held.
pub async fn acquire(api: &Arc<Api>, scope: &Scope, args: AcquireArgs) -> Result<Grant, ApiError> {
    check_name(&args.name)?;
    check_owner(&args.owner)?;
    check_ttl(api, args.ttl_ms)?;
    check_wait(api, args.wait_ms)?;
    check_value(&args.value)?;
    check_lock_delay(api, args.lock_delay_ms)?;
    check_limit(args.limit)?;
    api.admit_load()?;
    let args = AcquireArgs { name: scope.inner(&args.name), owner: scope.inner(&args.owner), ..args };
    let granted = acquire_stored(api, args).await;
    granted
        .map(|mut grant| {
            grant.fence = api.told_fence(grant.fence);
            scope.grant(grant)
        })
        .map_err(|e| scope.error(e))
}

async fn acquire_stored(api: &Arc<Api>, args: AcquireArgs) -> Result<Grant, ApiError> {
    let started = Instant::now();
    let AcquireArgs { name, owner, ttl_ms, wait_ms, value, lock_delay_ms, limit } = args;
    let request = Request::Acquire { name: name.clone(), owner, ttl_ms, wait_ms, value, lock_delay_ms, limit };
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
    hold_changed(api, scope, Request::Renew { name: scope.inner(&name), token, ttl_ms }).await
}

/// Writes `request`, a change to a hold (a renewal, a value), and answers the hold as it now is, in the
/// caller's scope.
async fn hold_changed(api: &Arc<Api>, scope: &Scope, request: Request) -> Result<Grant, ApiError> {
    let changed = async {
        match api.route.write(request).await?.outcome().clone() {
            Outcome::Renewed(grant) | Outcome::ValueSet(grant) => Ok(scope.grant(grant)),
            Outcome::Rejected(reject) => Err(reject.into()),
            other => Err(ApiError::unexpected(other)),
        }
    };
    changed.await.map_err(|e| scope.error(e))
}

/// Publishes `value` on the hold `token` has on `name` (one log entry; the fence stays).
pub async fn set_value(
    api: &Arc<Api>,
    scope: &Scope,
    name: String,
    token: Token,
    value: Vec<u8>,
) -> Result<Grant, ApiError> {
    check_name(&name)?;
    check_value(&value)?;
    hold_changed(api, scope, Request::SetValue { name: scope.inner(&name), token, value }).await
}

/// A lock as a watch sees it: held or not, and its revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    pub name: String,
    /// `None`: nobody holds it.
    pub view: Option<LockView>,
    /// The lock's revision ([`holdfast_core::LockState::revision`]).
    pub revision: u64,
    /// Whether the revision is not the one the watch was given: the lock changed (a higher revision) or
    /// the change is too old to be remembered (a lower one: a lock freed long ago shows 0).
    pub changed: bool,
}

/// Lock `name` once its revision is not `after`, or as it is when `wait_ms` has passed (then `changed`
/// is false). The first look and the last are linearizable reads; in between, the watch waits on this
/// node's own apply, so a follower serves it without asking the leader about each change.
pub async fn watch(api: &Arc<Api>, scope: &Scope, name: String, after: u64, wait_ms: u64) -> Result<Watched, ApiError> {
    check_name(&name)?;
    check_wait(api, wait_ms)?;
    let inner = scope.inner(&name);
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let watched = async {
        api.route.caught_up().await?;
        loop {
            let (id, told) = {
                let state = crate::state::read(&api.state);
                let revision = state.revision(&inner);
                if revision != after {
                    return Ok(watched(&state, scope, &name, &inner, revision, true));
                }
                api.events.watch_lock(&inner)
            };
            let _forget = UnwatchOnDrop { api, name: &inner, id };
            if tokio::time::timeout_at(deadline, told).await.is_err() {
                break;
            }
        }
        // The wait ran out: a last linearizable look, so that a node cut off from the leader does not
        // answer "unchanged" from a state that is behind.
        api.route.caught_up().await?;
        let state = crate::state::read(&api.state);
        let revision = state.revision(&inner);
        Ok(watched(&state, scope, &name, &inner, revision, revision != after))
    };
    watched.await.map_err(|e: ApiError| scope.error(e))
}

fn watched(
    state: &holdfast_core::LockState,
    scope: &Scope,
    name: &str,
    inner: &str,
    revision: u64,
    changed: bool,
) -> Watched {
    let view = state.get(inner).map(|view| scope.view(view));
    Watched { name: name.to_owned(), view, revision, changed }
}

/// Locks a prefix watch may start with (changed since the revision it resumes after), at most.
pub const PREFIX_WATCH_START_MAX: usize = 10_000;

/// A state a watch stream sends: the lock, whether it is one of the states the watch began with (not a
/// change seen as it was applied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchNote {
    pub watched: Watched,
    pub initial: bool,
}

/// A watch stream of one lock or of every lock under a prefix: the states it begins with, then the state
/// of a lock after every entry that changed it, in log order. A lock's watch begins with the lock now
/// (`changed`: whether its revision is not the `after` given); a prefix's with every lock under it that
/// changed since `after`, in revision order (`changed` true). Ends when this node falls
/// [`crate::apply::events::WATCH_STREAM_BACKLOG`] changes behind or installs a snapshot; the client then
/// resumes from the last revision it saw.
pub struct WatchStream {
    api: Arc<Api>,
    scope: Scope,
    what: crate::apply::events::WatchTarget,
    id: u64,
    first: std::collections::VecDeque<Watched>,
    changes: tokio::sync::mpsc::Receiver<crate::apply::events::LockChange>,
}

/// Watches lock `name` as a stream ([`WatchStream`]). The first look is a linearizable read.
pub async fn watch_stream(api: &Arc<Api>, scope: &Scope, name: String, after: u64) -> Result<WatchStream, ApiError> {
    check_name(&name)?;
    let inner = scope.inner(&name);
    api.route.caught_up().await.map_err(|e| scope.error(e.into()))?;
    let what = crate::apply::events::WatchTarget::Lock(inner.clone());
    let state = crate::state::read(&api.state);
    let revision = state.revision(&inner);
    let first = watched(&state, scope, &name, &inner, revision, revision != after);
    let (id, changes) = api.events.watch_stream(&what);
    drop(state);
    Ok(WatchStream { api: api.clone(), scope: scope.clone(), what, id, first: [first].into(), changes })
}

/// Watches every lock whose name starts with `prefix` as a stream ([`WatchStream`]), beginning with those
/// changed since `after` (0: every lock held, and those freed in the last 10 minutes). Refused with
/// `compacted` if a lock's free after `after` may have been forgotten (the client lists the prefix again
/// and watches after the list's revision), and with `too-many-changes` past [`PREFIX_WATCH_START_MAX`].
pub async fn watch_prefix_stream(
    api: &Arc<Api>,
    scope: &Scope,
    prefix: String,
    after: u64,
) -> Result<WatchStream, ApiError> {
    if prefix.len() > limits::NAME_LEN_MAX {
        return Err(ApiError::invalid("invalid-query", format!("prefix: at most {} bytes", limits::NAME_LEN_MAX)));
    }
    let inner = scope.inner(&prefix);
    api.route.caught_up().await.map_err(|e| scope.error(e.into()))?;
    let what = crate::apply::events::WatchTarget::Prefix(inner.clone());
    let state = crate::state::read(&api.state);
    if after > 0 && after < state.forgotten_through() {
        let detail = format!(
            "locks freed after revision {after} may have been forgotten (through {}): list the prefix again and \
             watch after the list's revision",
            state.forgotten_through()
        );
        return Err(ApiError::Conflict { slug: "compacted".into(), detail });
    }
    let Some(changed) = state.changed_since(&inner, after, PREFIX_WATCH_START_MAX) else {
        let detail = format!("more than {PREFIX_WATCH_START_MAX} locks under the prefix changed since {after}");
        return Err(ApiError::Limit { slug: "too-many-changes", detail });
    };
    let first = changed
        .into_iter()
        .map(|(name, view, revision)| Watched {
            name: scope.outer(&name),
            view: view.map(|view| scope.view(view)),
            revision,
            changed: true,
        })
        .collect();
    let (id, changes) = api.events.watch_stream(&what);
    drop(state);
    Ok(WatchStream { api: api.clone(), scope: scope.clone(), what, id, first, changes })
}

impl WatchStream {
    /// The next state: the first ones, then each change; `None` once the stream fell behind (or the node
    /// stopped, or installed a snapshot).
    pub async fn next(&mut self) -> Option<WatchNote> {
        if let Some(first) = self.first.pop_front() {
            return Some(WatchNote { watched: first, initial: true });
        }
        let change = self.changes.recv().await?;
        let view = change.view.map(|view| self.scope.view(view));
        let watched = Watched { name: self.scope.outer(&change.name), view, revision: change.revision, changed: true };
        Some(WatchNote { watched, initial: false })
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        self.api.events.unwatch_stream(&self.what, self.id);
    }
}

/// Forgets a lock watcher when its wait ends, told or not.
struct UnwatchOnDrop<'a> {
    api: &'a Api,
    name: &'a str,
    id: u64,
}

impl Drop for UnwatchOnDrop<'_> {
    fn drop(&mut self) {
        self.api.events.unwatch_lock(self.name, self.id);
    }
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

/// A page of [`list`]: the locks, the `after` of the next page, and the revision the page was read at.
pub struct Page {
    pub locks: Vec<LockView>,
    pub next: Option<String>,
    pub revision: u64,
}

/// Up to `limit` locks whose names start with `prefix`, after `after`; and the `after` of the next page.
pub async fn list(
    api: &Arc<Api>,
    scope: &Scope,
    prefix: String,
    after: Option<String>,
    limit: usize,
) -> Result<Page, ApiError> {
    if prefix.len() > limits::NAME_LEN_MAX || after.as_ref().is_some_and(|a| a.len() > limits::NAME_LEN_MAX) {
        return Err(ApiError::invalid(
            "invalid-query",
            format!("prefix, after: at most {} bytes", limits::NAME_LEN_MAX),
        ));
    }
    let limit = check_page(limit)?;
    let (prefix, after) = (scope.inner(&prefix), after.map(|after| scope.inner(&after)));
    match api.route.read(Query::List { prefix, after, limit }).await? {
        QueryReply::List(views, revision) => {
            let locks: Vec<LockView> = views.into_iter().map(|view| scope.view(view)).collect();
            let next = if locks.len() == limit { locks.last().map(|v| v.name.clone()) } else { None };
            Ok(Page { locks, next, revision })
        }
        other => Err(ApiError::unexpected(other)),
    }
}
