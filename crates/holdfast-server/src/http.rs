//! The HTTP/JSON API on the client port. See `docs/http-api.md`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use axum::extract::{Path, Query as QueryParams, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use holdfast_core::{limits, Grant, HolderView, Lease, LockView, Outcome, Token};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::node::{wall_ms, Node, Query, QueryReply, Request, Watch, Written};

/// Default TTL when `ttl` is not given.
const TTL_MS_DEFAULT: u64 = 30_000;
/// Default and largest page of `GET /v1/locks`.
const PAGE_DEFAULT: usize = 100;
const PAGE_MAX: usize = 1000;

type Params = QueryParams<HashMap<String, String>>;

/// The HTTP routes of a node.
pub fn router(node: Arc<Node>) -> Router {
    Router::new()
        .route("/v1/locks", get(list))
        .route(
            "/v1/locks/{name}",
            post(acquire).delete(release).get(get_lock),
        )
        .route("/v1/locks/{name}/renew", post(renew))
        .route("/v1/cluster", get(cluster))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .fallback(|| async { ApiError::NoRoute })
        .method_not_allowed_fallback(|| async { ApiError::NoMethod })
        .with_state(node)
}

async fn acquire(
    State(node): State<Arc<Node>>,
    Path(name): Path<String>,
    params: Params,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let p = Parsed::new(&params, &["ttl", "owner", "wait"])?;
    let name = valid_name(name)?;
    let ttl_ms = p
        .ttl(&node, "ttl")?
        .unwrap_or(TTL_MS_DEFAULT.clamp(node.limits.ttl_ms_min, node.limits.ttl_ms_max));
    let wait_ms = p.wait(&node)?;
    let owner = p.get("owner").unwrap_or("anonymous").to_owned();
    if !limits::valid_owner(&owner) {
        return Err(ApiError::invalid(
            "invalid-owner",
            format!(
                "owner: at most {} bytes, no control characters",
                limits::OWNER_LEN_MAX
            ),
        ));
    }
    let written = acquire_or_undo(
        &node,
        name.clone(),
        Request::Acquire {
            name: name.clone(),
            owner,
            ttl_ms,
            wait_ms,
        },
    )
    .await?;
    match written.outcome().clone() {
        Outcome::Granted(grant) => Ok(grant_json(&grant, true)),
        Outcome::Busy { holder } => Err(ApiError::Busy {
            name,
            holder: Some(holder),
        }),
        Outcome::Queued { .. } => {
            let token = written
                .token
                .expect("the leader returns the token of an acquire");
            let deadline = started + Duration::from_millis(wait_ms);
            wait_for_grant(&node, name, token, written.index, deadline).await
        }
        Outcome::Rejected(reject) => Err(reject.into()),
        other => Err(ApiError::unexpected(other)),
    }
}

/// Proposes an acquire of `name` in a task of its own. If the request goes away before the answer, the
/// task undoes what the acquire did (releases the grant, or leaves the queue), so that nobody holds or
/// waits for a lock on behalf of a client that is gone.
async fn acquire_or_undo(
    node: &Arc<Node>,
    name: String,
    request: Request,
) -> Result<Written, ApiError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task_node = node.clone();
    tokio::spawn(async move {
        let result = task_node.write(request).await;
        let Err(Ok(written)) = tx.send(result) else {
            return;
        };
        let Some(token) = written.token else { return };
        if !matches!(
            written.outcome(),
            Outcome::Granted(_) | Outcome::Queued { .. }
        ) {
            return;
        }
        tracing::debug!(
            name,
            "the client went away before its acquire was answered; undoing it"
        );
        if let Err(e) = task_node
            .write(Request::Cancel {
                name: name.clone(),
                token,
            })
            .await
        {
            tracing::warn!(%e, name, "could not undo the acquire of a client that went away");
        }
    });
    Ok(rx.await.map_err(|_| ApiError::Internal {
        detail: "the acquire task ended without an answer".into(),
    })??)
}

/// Long-polls a queued claim until it is granted or `deadline` passes. If the request goes away (the
/// client disconnected and this future is dropped), the claim is withdrawn.
async fn wait_for_grant(
    node: &Arc<Node>,
    name: String,
    token: Token,
    index: u64,
    deadline: Instant,
) -> Result<Response, ApiError> {
    let mut guard = Withdraw {
        node: node.clone(),
        name: name.clone(),
        token,
        armed: true,
    };
    let granted = match node.watch(&name, token, index).await? {
        Watch::Granted(grant) => Some(grant),
        Watch::Gone => None,
        Watch::Waiting(rx) => match tokio::time::timeout_at(deadline.into(), rx).await {
            Ok(Ok(grant)) => Some(grant),
            Ok(Err(_)) | Err(_) => None,
        },
    };
    guard.armed = false;
    if let Some(grant) = granted {
        return Ok(grant_json(&grant, true));
    }
    node.events.unwatch(token);
    // The wait is over: withdraw. If the grant came in between, this releases it again, so that nobody
    // holds a lock its requester was told it did not get.
    node.write(Request::Cancel {
        name: name.clone(),
        token,
    })
    .await?;
    let holder = node
        .state
        .read()
        .expect("lock state poisoned")
        .get(&name)
        .map(|l| l.holder);
    Err(ApiError::Busy { name, holder })
}

/// Withdraws a queued claim when dropped while armed: the waiter's request went away.
struct Withdraw {
    node: Arc<Node>,
    name: String,
    token: Token,
    armed: bool,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (node, name, token) = (
            self.node.clone(),
            std::mem::take(&mut self.name),
            self.token,
        );
        node.events.unwatch(token);
        tokio::spawn(async move {
            if let Err(e) = node
                .write(Request::Cancel {
                    name: name.clone(),
                    token,
                })
                .await
            {
                tracing::warn!(%e, name, "could not withdraw the claim of a waiter that went away");
            }
        });
    }
}

async fn release(
    State(node): State<Arc<Node>>,
    Path(name): Path<String>,
    params: Params,
) -> Result<Response, ApiError> {
    let p = Parsed::new(&params, &["token"])?;
    let name = valid_name(name)?;
    let token = p.token()?;
    let written = node.write(Request::Release { name, token }).await?;
    match written.outcome().clone() {
        Outcome::Released { name, fence } => {
            Ok(Json(json!({"name": name, "fence": fence, "released": true})).into_response())
        }
        Outcome::Rejected(reject) => Err(reject.into()),
        other => Err(ApiError::unexpected(other)),
    }
}

async fn renew(
    State(node): State<Arc<Node>>,
    Path(name): Path<String>,
    params: Params,
) -> Result<Response, ApiError> {
    let p = Parsed::new(&params, &["token", "ttl"])?;
    let name = valid_name(name)?;
    let token = p.token()?;
    let ttl_ms = match p.ttl(&node, "ttl")? {
        Some(ttl_ms) => ttl_ms,
        // Without a ttl, renew for the TTL the hold already has.
        None => match node
            .state
            .read()
            .expect("lock state poisoned")
            .grant(&name, token)
            .map(|g| g.lease)
        {
            Some(Lease::Ttl { ttl_ms, .. }) => ttl_ms,
            _ => TTL_MS_DEFAULT.clamp(node.limits.ttl_ms_min, node.limits.ttl_ms_max),
        },
    };
    let written = node
        .write(Request::Renew {
            name,
            token,
            ttl_ms,
        })
        .await?;
    match written.outcome().clone() {
        Outcome::Renewed(grant) => Ok(grant_json(&grant, true)),
        Outcome::Rejected(reject) => Err(reject.into()),
        other => Err(ApiError::unexpected(other)),
    }
}

async fn get_lock(
    State(node): State<Arc<Node>>,
    Path(name): Path<String>,
    params: Params,
) -> Result<Response, ApiError> {
    Parsed::new(&params, &[])?;
    let name = valid_name(name)?;
    match node.read(Query::Lock { name: name.clone() }).await? {
        QueryReply::Lock(Some(view)) => Ok(Json(lock_json(&view)).into_response()),
        QueryReply::Lock(None) => Err(ApiError::NotFound { name }),
        QueryReply::List(_) => Err(ApiError::unexpected("a list")),
    }
}

async fn list(State(node): State<Arc<Node>>, params: Params) -> Result<Response, ApiError> {
    let p = Parsed::new(&params, &["prefix", "after", "limit"])?;
    let prefix = p.get("prefix").unwrap_or("").to_owned();
    if prefix.len() > limits::NAME_LEN_MAX {
        return Err(ApiError::invalid(
            "invalid-query",
            format!("prefix: at most {} bytes", limits::NAME_LEN_MAX),
        ));
    }
    let after = p.get("after").map(str::to_owned);
    let limit = match p.get("limit") {
        None => PAGE_DEFAULT,
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=PAGE_MAX).contains(&n) => n,
            _ => {
                return Err(ApiError::invalid(
                    "invalid-query",
                    format!("limit: a number from 1 to {PAGE_MAX}"),
                ))
            }
        },
    };
    let QueryReply::List(views) = node
        .read(Query::List {
            prefix,
            after,
            limit,
        })
        .await?
    else {
        return Err(ApiError::unexpected("a single lock"));
    };
    let next = (views.len() == limit)
        .then(|| views.last().map(|v| v.name.clone()))
        .flatten();
    let locks: Vec<Value> = views.iter().map(lock_json).collect();
    Ok(Json(json!({"locks": locks, "next": next})).into_response())
}

async fn cluster(State(node): State<Arc<Node>>) -> Response {
    Json(crate::cluster_status(&node)).into_response()
}

async fn readyz(State(node): State<Arc<Node>>) -> Response {
    match crate::readiness(&node) {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

// --- parameters ---

/// Query parameters, with unknown ones refused so that a typo (`tll=`) is not silently ignored.
struct Parsed<'a>(&'a HashMap<String, String>);

impl<'a> Parsed<'a> {
    fn new(params: &'a Params, known: &[&str]) -> Result<Self, ApiError> {
        if let Some(unknown) = params.0.keys().find(|k| !known.contains(&k.as_str())) {
            let detail = format!("unknown parameter {unknown:?}; this endpoint takes {known:?}");
            return Err(ApiError::invalid("invalid-query", detail));
        }
        Ok(Parsed(&params.0))
    }

    fn get(&self, key: &str) -> Option<&'a str> {
        self.0.get(key).map(String::as_str)
    }

    fn ttl(&self, node: &Node, key: &str) -> Result<Option<u64>, ApiError> {
        let Some(text) = self.get(key) else {
            return Ok(None);
        };
        let (min, max) = (node.limits.ttl_ms_min, node.limits.ttl_ms_max);
        match parse_duration_ms(text) {
            Some(ms) if (min..=max).contains(&ms) => Ok(Some(ms)),
            _ => Err(ApiError::invalid(
                "invalid-ttl",
                format!(
                    "{key}={text:?}: seconds or a duration (500ms, 2s, 1m) from {} to {}",
                    show_ms(min),
                    show_ms(max)
                ),
            )),
        }
    }

    fn wait(&self, node: &Node) -> Result<u64, ApiError> {
        let Some(text) = self.get("wait") else {
            return Ok(0);
        };
        let max = node.limits.wait_ms_max;
        match parse_duration_ms(text) {
            Some(ms) if ms <= max => Ok(ms),
            _ => Err(ApiError::invalid(
                "invalid-wait",
                format!(
                    "wait={text:?}: seconds or a duration (500ms, 2s, 1m) up to {}",
                    show_ms(max)
                ),
            )),
        }
    }

    fn token(&self) -> Result<Token, ApiError> {
        let Some(text) = self.get("token") else {
            return Err(ApiError::invalid(
                "invalid-token",
                "token is required".into(),
            ));
        };
        text.parse().map_err(|_| {
            ApiError::invalid(
                "invalid-token",
                "token: 32 hex digits, as acquire returned it".into(),
            )
        })
    }
}

fn valid_name(name: String) -> Result<String, ApiError> {
    if limits::valid_name(&name) {
        Ok(name)
    } else {
        Err(ApiError::invalid(
            "invalid-name",
            format!(
                "lock names are 1 to {} bytes of A-Z a-z 0-9 . _ - :",
                limits::NAME_LEN_MAX
            ),
        ))
    }
}

/// Seconds as a bare number (`60`, `0.5`), or a duration with a unit (`500ms`, `2s`, `1m`, `1h`).
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    if text.is_empty() || text.len() > 32 {
        return None;
    }
    if text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        let seconds: f64 = text.parse().ok()?;
        let ms = seconds * 1000.0;
        return (ms.is_finite() && ms <= u64::MAX as f64 / 2.0).then_some(ms.round() as u64);
    }
    humantime::parse_duration(text)
        .ok()
        .and_then(|d| u64::try_from(d.as_millis()).ok())
}

fn show_ms(ms: u64) -> String {
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

// --- JSON shapes ---

/// RFC 3339 with milliseconds, UTC.
pub fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

fn grant_json(grant: &Grant, with_token: bool) -> Response {
    let mut body = json!({
        "name": grant.name,
        "owner": grant.owner,
        "fence": grant.fence,
        "granted_at": rfc3339(grant.granted_at_ms),
    });
    if with_token {
        body["token"] = json!(grant.token.to_string());
    }
    add_lease(&mut body, grant.lease);
    Json(body).into_response()
}

fn add_lease(body: &mut Value, lease: Lease) {
    match lease {
        Lease::Ttl {
            ttl_ms,
            expires_at_ms,
        } => {
            body["expires_at"] = json!(rfc3339(expires_at_ms));
            body["expires_at_ms"] = json!(expires_at_ms);
            body["ttl_ms"] = json!(ttl_ms);
        }
        Lease::Session(id) => body["session"] = json!(id.to_string()),
    }
}

/// A holder as the API shows it (no token).
pub fn holder_json(holder: &HolderView) -> Value {
    let mut body = json!({
        "owner": holder.owner,
        "fence": holder.fence,
        "granted_at": rfc3339(holder.granted_at_ms),
    });
    add_lease(&mut body, holder.lease);
    body
}

fn lock_json(view: &LockView) -> Value {
    let waiters: Vec<Value> = view
        .waiters
        .iter()
        .map(|w| json!({"owner": w.owner, "queued_at": rfc3339(w.queued_at_ms)}))
        .collect();
    json!({"name": view.name, "holder": holder_json(&view.holder), "waiters": waiters})
}

/// Seconds until `holder` may be free, for `Retry-After` (at least 1).
pub fn retry_after_s(holder: &HolderView) -> u64 {
    match holder.lease.expires_at_ms() {
        Some(end) => end.saturating_sub(wall_ms()).div_ceil(1000).max(1),
        None => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_documented() {
        assert_eq!(parse_duration_ms("60"), Some(60_000));
        assert_eq!(parse_duration_ms("0.5"), Some(500));
        assert_eq!(parse_duration_ms("500ms"), Some(500));
        assert_eq!(parse_duration_ms("2s"), Some(2_000));
        assert_eq!(parse_duration_ms("1m"), Some(60_000));
        assert_eq!(parse_duration_ms("1h"), Some(3_600_000));
        assert_eq!(parse_duration_ms(""), None);
        assert_eq!(parse_duration_ms("abc"), None);
        assert_eq!(parse_duration_ms("-1"), None);
        assert_eq!(parse_duration_ms("1e400"), None);
        assert_eq!(parse_duration_ms(&"9".repeat(40)), None);
    }

    #[test]
    fn times_are_rfc3339_utc_with_millis() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
