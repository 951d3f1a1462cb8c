//! ① The HTTP/JSON API on the client port (`docs/http-api.md`): routes, handlers that parse a request,
//! call the API and format its answer.
//!
//! - [`params`]: path segments and query parameters, refused as problems when malformed.
//! - [`port`]: the client port's listener, which tells every request where it came from.
//! - [`watch`]: `GET /v1/watch`, a prefix watch as server-sent events.

pub mod params;
pub mod port;
pub mod watch;

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use axum::http::HeaderMap;

use self::params::{AdminCall, Body, Credentials, LockName, MemberId, Params, Parsed, Segment, Tenant};
use super::json::{cluster_json, grant_json, lock_json, rfc3339, watched_json};
use crate::api::error::ApiError;
use crate::api::locks::{AcquireArgs, PAGE_DEFAULT, PAGE_MAX, TTL_MS_DEFAULT};
use crate::api::{admin, locks, Api};

/// The OpenAPI 3.1 document of these routes (`crates/holdfast-server/openapi.json`), built into the binary
/// so that every node serves it with no file at run time. `tests/openapi.rs` checks it lists exactly the
/// routes below, and `tests/openapi-fuzz` fuzzes a node with it.
pub const OPENAPI_JSON: &str = include_str!("../../../openapi.json");

/// The HTTP routes of a node.
pub fn router(api: Arc<Api>) -> Router {
    Router::new()
        .route("/v1/locks", get(list))
        .route("/v1/locks/{name}", post(acquire).delete(release).get(get_lock))
        .route("/v1/locks/{name}/renew", post(renew))
        .route("/v1/locks/{name}/value", post(set_value))
        .route("/v1/cluster", get(cluster))
        .route("/v1/signup", post(signup))
        .route("/v1/keys", get(list_keys))
        .route("/v1/keys/{tenant}", axum::routing::delete(revoke_key))
        .route("/v1/cluster/members", post(add_member))
        .route("/v1/cluster/members/{id}", axum::routing::delete(remove_member))
        .route("/v1/cluster/snapshot", post(snapshot))
        .route("/v1/watch", get(watch::watch))
        .route("/v1/openapi.json", get(openapi))
        .merge(super::health::routes())
        .merge(super::page::routes())
        .fallback(|| async { ApiError::NoRoute })
        .method_not_allowed_fallback(|| async { ApiError::NoMethod })
        .with_state(api)
}

async fn acquire(
    State(api): State<Arc<Api>>,
    Credentials(authorization): Credentials,
    Segment(name, _): Segment<LockName>,
    params: Params,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let scope = api.authenticate(authorization.as_deref()).await?;
    let p = Parsed::new(&params, &["ttl", "owner", "wait", "value", "lock_delay", "limit"])?;
    let default_ttl_ms = TTL_MS_DEFAULT.clamp(api.limits().ttl_ms_min, api.limits().ttl_ms_max);
    let ttl_ms = p.duration_ms("ttl", "invalid-ttl")?.unwrap_or(default_ttl_ms);
    let wait_ms = p.duration_ms("wait", "invalid-wait")?.unwrap_or(0);
    let owner = p.get("owner").unwrap_or("anonymous").to_owned();
    let value = p.value(&headers, &body)?;
    let lock_delay_ms = p.duration_ms("lock_delay", "invalid-lock-delay")?.unwrap_or(0);
    let limit = p.limit()?;
    let args = AcquireArgs { name, owner, ttl_ms, wait_ms, value, lock_delay_ms, limit };
    let grant = locks::acquire(&api, &scope, args).await?;
    Ok(Json(grant_json(&grant)).into_response())
}

async fn set_value(
    State(api): State<Arc<Api>>,
    Credentials(authorization): Credentials,
    Segment(name, _): Segment<LockName>,
    params: Params,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let scope = api.authenticate(authorization.as_deref()).await?;
    let p = Parsed::new(&params, &["token", "value"])?;
    let token = p.token()?;
    let value = p.value(&headers, &body)?;
    let grant = locks::set_value(&api, &scope, name, token, value).await?;
    Ok(Json(grant_json(&grant)).into_response())
}

async fn release(
    State(api): State<Arc<Api>>,
    Credentials(authorization): Credentials,
    Segment(name, _): Segment<LockName>,
    params: Params,
) -> Result<Response, ApiError> {
    let scope = api.authenticate(authorization.as_deref()).await?;
    let p = Parsed::new(&params, &["token"])?;
    let (name, fence) = locks::release(&api, &scope, name, p.token()?).await?;
    Ok(Json(json!({"name": name, "fence": fence, "released": true})).into_response())
}

async fn renew(
    State(api): State<Arc<Api>>,
    Credentials(authorization): Credentials,
    Segment(name, _): Segment<LockName>,
    params: Params,
) -> Result<Response, ApiError> {
    let scope = api.authenticate(authorization.as_deref()).await?;
    let p = Parsed::new(&params, &["token", "ttl"])?;
    let token = p.token()?;
    // Without a ttl, the leader renews for the TTL the hold already has.
    let ttl_ms = p.duration_ms("ttl", "invalid-ttl")?;
    let grant = locks::renew(&api, &scope, name, token, ttl_ms).await?;
    Ok(Json(grant_json(&grant)).into_response())
}

async fn get_lock(
    State(api): State<Arc<Api>>,
    Credentials(authorization): Credentials,
    Segment(name, _): Segment<LockName>,
    params: Params,
) -> Result<Response, ApiError> {
    let scope = api.authenticate(authorization.as_deref()).await?;
    let p = Parsed::new(&params, &["after", "wait"])?;
    let Some(after) = p.revision()? else {
        if p.get("wait").is_some() {
            return Err(ApiError::invalid("invalid-query", "wait= needs after=REVISION: see docs/http-api.md".into()));
        }
        let view = locks::get(&api, &scope, name).await?;
        return Ok(Json(lock_json(&view)).into_response());
    };
    let wait_ms = p.duration_ms("wait", "invalid-wait")?.unwrap_or(0);
    let watched = locks::watch(&api, &scope, name, after, wait_ms).await?;
    Ok(Json(watched_json(&watched)).into_response())
}

async fn list(
    State(api): State<Arc<Api>>,
    Credentials(authorization): Credentials,
    params: Params,
) -> Result<Response, ApiError> {
    let scope = api.authenticate(authorization.as_deref()).await?;
    let p = Parsed::new(&params, &["prefix", "after", "limit"])?;
    let prefix = p.get("prefix").unwrap_or("").to_owned();
    let after = p.get("after").map(str::to_owned);
    let limit = match p.get("limit") {
        None => PAGE_DEFAULT,
        Some(text) => text.parse::<usize>().ok().filter(|n| *n <= PAGE_MAX).unwrap_or(0),
    };
    let page = locks::list(&api, &scope, prefix, after, limit).await?;
    let locks: Vec<Value> = page.locks.iter().map(lock_json).collect();
    Ok(Json(json!({"locks": locks, "next": page.next, "revision": page.revision})).into_response())
}

/// `GET /v1/openapi.json`: public reference, so no key is asked for and the query string is ignored.
async fn openapi() -> Response {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], OPENAPI_JSON).into_response()
}

async fn cluster(State(api): State<Arc<Api>>) -> Response {
    Json(cluster_json(&api.cluster())).into_response()
}

async fn signup(State(api): State<Arc<Api>>, admin: AdminCall, params: Params) -> Result<Response, ApiError> {
    Parsed::new(&params, &[])?;
    let (key, tenant) = admin::signup(&api, admin.caller()).await?;
    Ok(Json(json!({"api_key": key, "tenant": format!("{tenant:016x}")})).into_response())
}

async fn list_keys(State(api): State<Arc<Api>>, admin: AdminCall, params: Params) -> Result<Response, ApiError> {
    admin::check_admin(&api, admin.caller())?;
    Parsed::new(&params, &[])?;
    let keys: Vec<Value> = admin::list_keys(&api)
        .await?
        .into_iter()
        .map(
            |(tenant, created_at_ms)| json!({"tenant": format!("{tenant:016x}"), "created_at": rfc3339(created_at_ms)}),
        )
        .collect();
    Ok(Json(json!({ "keys": keys })).into_response())
}

async fn revoke_key(
    State(api): State<Arc<Api>>,
    admin: AdminCall,
    Segment(tenant, _): Segment<Tenant>,
    params: Params,
) -> Result<Response, ApiError> {
    admin::check_admin(&api, admin.caller())?;
    Parsed::new(&params, &[])?;
    let id = u64::from_str_radix(&tenant, 16)
        .ok()
        .filter(|_| tenant.len() == 16)
        .ok_or_else(|| ApiError::invalid("invalid-tenant", format!("{tenant:?}: a tenant is 16 hex digits")))?;
    admin::revoke_key(&api, id).await?;
    Ok(Json(json!({"tenant": tenant, "revoked": true})).into_response())
}

async fn add_member(State(api): State<Arc<Api>>, admin: AdminCall, params: Params) -> Result<Response, ApiError> {
    admin::check_admin(&api, admin.caller())?;
    let p = Parsed::new(&params, &["id", "addr"])?;
    let id = p.get("id").and_then(|id| id.parse::<u64>().ok()).unwrap_or(0);
    let addr = p.get("addr").unwrap_or("");
    admin::add_member(&api, id, addr).await?;
    Ok(Json(cluster_json(&api.cluster())).into_response())
}

async fn remove_member(
    State(api): State<Arc<Api>>,
    admin: AdminCall,
    Segment(id, _): Segment<MemberId>,
    params: Params,
) -> Result<Response, ApiError> {
    admin::check_admin(&api, admin.caller())?;
    Parsed::new(&params, &[])?;
    let id = id.parse::<u64>().map_err(|_| ApiError::invalid("invalid-member", format!("{id:?} is not a node id")))?;
    admin::remove_member(&api, id).await?;
    Ok(Json(cluster_json(&api.cluster())).into_response())
}

async fn snapshot(State(api): State<Arc<Api>>, admin: AdminCall, params: Params) -> Result<Response, ApiError> {
    admin::check_admin(&api, admin.caller())?;
    Parsed::new(&params, &[])?;
    let (index, bytes) = admin::snapshot(&api).await?;
    Ok(Json(json!({"id": api.id(), "snapshot_index": index, "snapshot_bytes": bytes})).into_response())
}
