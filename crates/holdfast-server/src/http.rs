//! The HTTP/JSON API on the client port. See `docs/http-api.md`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::marker::PhantomData;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::{IncomingStream, Listener};
use axum::{Json, Router};
use holdfast_core::{Grant, HolderView, Lease, LockView, Token};
use serde_json::{json, Value};

use crate::auth;
use crate::error::ApiError;
use crate::node::{wall_ms, Node};
use crate::ops::{self, PAGE_DEFAULT, PAGE_MAX, TTL_MS_DEFAULT};

/// The HTTP routes of a node.
pub fn router(node: Arc<Node>) -> Router {
    Router::new()
        .route("/v1/locks", get(list))
        .route("/v1/locks/{name}", post(acquire).delete(release).get(get_lock))
        .route("/v1/locks/{name}/renew", post(renew))
        .route("/v1/cluster", get(cluster))
        .route("/v1/signup", post(signup))
        .route("/v1/keys", get(list_keys))
        .route("/v1/keys/{tenant}", axum::routing::delete(revoke_key))
        .route("/v1/cluster/members", post(add_member))
        .route("/v1/cluster/members/{id}", axum::routing::delete(remove_member))
        .route("/v1/cluster/snapshot", post(snapshot))
        .merge(crate::health::routes())
        .fallback(|| async { ApiError::NoRoute })
        .method_not_allowed_fallback(|| async { ApiError::NoMethod })
        .with_state(node)
}

async fn acquire(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Segment(name, _): Segment<LockName>,
    params: Params,
) -> Result<Response, ApiError> {
    let scope = auth::authenticate(&node, authorization(&headers))?;
    let p = Parsed::new(&params, &["ttl", "owner", "wait"])?;
    let default_ttl_ms = TTL_MS_DEFAULT.clamp(node.limits.ttl_ms_min, node.limits.ttl_ms_max);
    let ttl_ms = p.duration_ms("ttl", "invalid-ttl")?.unwrap_or(default_ttl_ms);
    let wait_ms = p.duration_ms("wait", "invalid-wait")?.unwrap_or(0);
    let owner = p.get("owner").unwrap_or("anonymous").to_owned();
    let grant = ops::acquire(&node, &scope, name, owner, ttl_ms, wait_ms).await?;
    Ok(Json(grant_json(&grant)).into_response())
}

async fn release(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Segment(name, _): Segment<LockName>,
    params: Params,
) -> Result<Response, ApiError> {
    let scope = auth::authenticate(&node, authorization(&headers))?;
    let p = Parsed::new(&params, &["token"])?;
    let (name, fence) = ops::release(&node, &scope, name, p.token()?).await?;
    Ok(Json(json!({"name": name, "fence": fence, "released": true})).into_response())
}

async fn renew(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Segment(name, _): Segment<LockName>,
    params: Params,
) -> Result<Response, ApiError> {
    let scope = auth::authenticate(&node, authorization(&headers))?;
    let p = Parsed::new(&params, &["token", "ttl"])?;
    let token = p.token()?;
    // Without a ttl, the leader renews for the TTL the hold already has.
    let ttl_ms = p.duration_ms("ttl", "invalid-ttl")?;
    let grant = ops::renew(&node, &scope, name, token, ttl_ms).await?;
    Ok(Json(grant_json(&grant)).into_response())
}

async fn get_lock(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Segment(name, _): Segment<LockName>,
    params: Params,
) -> Result<Response, ApiError> {
    let scope = auth::authenticate(&node, authorization(&headers))?;
    Parsed::new(&params, &[])?;
    let view = ops::get(&node, &scope, name).await?;
    Ok(Json(lock_json(&view)).into_response())
}

async fn list(State(node): State<Arc<Node>>, headers: HeaderMap, params: Params) -> Result<Response, ApiError> {
    let scope = auth::authenticate(&node, authorization(&headers))?;
    let p = Parsed::new(&params, &["prefix", "after", "limit"])?;
    let prefix = p.get("prefix").unwrap_or("").to_owned();
    let after = p.get("after").map(str::to_owned);
    let limit = match p.get("limit") {
        None => PAGE_DEFAULT,
        Some(text) => text.parse::<usize>().ok().filter(|n| *n <= PAGE_MAX).unwrap_or(0),
    };
    let (views, next) = ops::list(&node, &scope, prefix, after, limit).await?;
    let locks: Vec<Value> = views.iter().map(lock_json).collect();
    Ok(Json(json!({"locks": locks, "next": next})).into_response())
}

async fn cluster(State(node): State<Arc<Node>>) -> Response {
    Json(crate::cluster_status(&node)).into_response()
}

fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok())
}

/// The address a client connection came from, as the client port's listener accepted it: put in every
/// request's extensions (`ConnectInfo<PeerAddr>`) by [`crate::serve`], for HTTP and gRPC alike.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

/// The client port's listener as [`crate::serve`] runs it: any listener (TCP, TLS, the simulation's),
/// whose connections are told their [`PeerAddr`]. (A wrapper of our own, because axum's `Connected` for
/// any listener would overlap with axum's own.)
pub struct ClientPort<L>(pub L);

impl<L: Listener<Addr = SocketAddr>> Listener for ClientPort<L> {
    type Io = L::Io;
    type Addr = SocketAddr;

    fn accept(&mut self) -> impl std::future::Future<Output = (Self::Io, SocketAddr)> + Send {
        self.0.accept()
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

impl<L: Listener<Addr = SocketAddr>> Connected<IncomingStream<'_, ClientPort<L>>> for PeerAddr {
    fn connect_info(stream: IncomingStream<'_, ClientPort<L>>) -> Self {
        PeerAddr(*stream.remote_addr())
    }
}

/// The peer address of a request (HTTP or gRPC) from its extensions; `None` if it was not served by
/// [`crate::serve`] (a router driven directly, as in unit tests), which admin checks take for remote.
pub fn peer_ip(extensions: &axum::http::Extensions) -> Option<IpAddr> {
    extensions.get::<ConnectInfo<PeerAddr>>().map(|ConnectInfo(PeerAddr(addr))| addr.ip())
}

/// What an admin check needs of an HTTP request: its `Authorization` header and where it came from.
struct AdminCall {
    authorization: Option<String>,
    peer: Option<IpAddr>,
}

impl AdminCall {
    fn caller(&self) -> ops::Caller<'_> {
        ops::Caller { authorization: self.authorization.as_deref(), peer: self.peer }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for AdminCall {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        let authorization = authorization(&parts.headers).map(str::to_owned);
        Ok(AdminCall { authorization, peer: peer_ip(&parts.extensions) })
    }
}

async fn signup(State(node): State<Arc<Node>>, admin: AdminCall, params: Params) -> Result<Response, ApiError> {
    Parsed::new(&params, &[])?;
    let (key, tenant) = ops::signup(&node, admin.caller()).await?;
    Ok(Json(json!({"api_key": key, "tenant": format!("{tenant:016x}")})).into_response())
}

async fn list_keys(State(node): State<Arc<Node>>, admin: AdminCall, params: Params) -> Result<Response, ApiError> {
    ops::check_admin(&node, admin.caller())?;
    Parsed::new(&params, &[])?;
    let keys: Vec<Value> = ops::list_keys(&node)
        .await?
        .into_iter()
        .map(
            |(tenant, created_at_ms)| json!({"tenant": format!("{tenant:016x}"), "created_at": rfc3339(created_at_ms)}),
        )
        .collect();
    Ok(Json(json!({ "keys": keys })).into_response())
}

async fn revoke_key(
    State(node): State<Arc<Node>>,
    admin: AdminCall,
    Segment(tenant, _): Segment<Tenant>,
    params: Params,
) -> Result<Response, ApiError> {
    ops::check_admin(&node, admin.caller())?;
    Parsed::new(&params, &[])?;
    let id = u64::from_str_radix(&tenant, 16)
        .ok()
        .filter(|_| tenant.len() == 16)
        .ok_or_else(|| ApiError::invalid("invalid-tenant", format!("{tenant:?}: a tenant is 16 hex digits")))?;
    ops::revoke_key(&node, id).await?;
    Ok(Json(json!({"tenant": tenant, "revoked": true})).into_response())
}

async fn add_member(State(node): State<Arc<Node>>, admin: AdminCall, params: Params) -> Result<Response, ApiError> {
    ops::check_admin(&node, admin.caller())?;
    let p = Parsed::new(&params, &["id", "addr"])?;
    let id = p.get("id").and_then(|id| id.parse::<u64>().ok()).unwrap_or(0);
    let addr = p.get("addr").unwrap_or("");
    ops::add_member(&node, id, addr).await?;
    Ok(Json(crate::cluster_status(&node)).into_response())
}

async fn remove_member(
    State(node): State<Arc<Node>>,
    admin: AdminCall,
    Segment(id, _): Segment<MemberId>,
    params: Params,
) -> Result<Response, ApiError> {
    ops::check_admin(&node, admin.caller())?;
    Parsed::new(&params, &[])?;
    let id = id.parse::<u64>().map_err(|_| ApiError::invalid("invalid-member", format!("{id:?} is not a node id")))?;
    ops::remove_member(&node, id).await?;
    Ok(Json(crate::cluster_status(&node)).into_response())
}

async fn snapshot(State(node): State<Arc<Node>>, admin: AdminCall, params: Params) -> Result<Response, ApiError> {
    ops::check_admin(&node, admin.caller())?;
    Parsed::new(&params, &[])?;
    let (index, bytes) = node.snapshot().await?;
    Ok(Json(json!({"id": node.id, "snapshot_index": index, "snapshot_bytes": bytes})).into_response())
}

// --- parameters ---

/// A route's one path parameter, as text: a lock name, a tenant or a member id (`K` says which). One that
/// is not UTF-8 once percent-decoded (`%ff`) is refused as bad input of its kind, a problem like every
/// other answer; axum's own rejection would be plain text.
struct Segment<K>(String, PhantomData<K>);

/// What a path parameter is, for the problem that refuses it.
trait SegmentKind {
    /// The problem type's slug.
    const SLUG: &'static str;
    /// The parameter, for people.
    const WHAT: &'static str;
}

/// `/v1/locks/{name}…`
struct LockName;
/// `/v1/keys/{tenant}`
struct Tenant;
/// `/v1/cluster/members/{id}`
struct MemberId;

impl SegmentKind for LockName {
    const SLUG: &'static str = "invalid-name";
    const WHAT: &'static str = "the lock name";
}

impl SegmentKind for Tenant {
    const SLUG: &'static str = "invalid-tenant";
    const WHAT: &'static str = "the tenant";
}

impl SegmentKind for MemberId {
    const SLUG: &'static str = "invalid-member";
    const WHAT: &'static str = "the member id";
}

impl<S: Send + Sync, K: SegmentKind + Send> FromRequestParts<S> for Segment<K> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(text)) => Ok(Segment(text, PhantomData)),
            Err(rejection) => Err(ApiError::path(K::SLUG, K::WHAT, rejection)),
        }
    }
}

/// The query string's parameters, decoded as HTML forms encode them (`+` is a space, `%XX` a byte; a `%`
/// not followed by two hex digits stands for itself). A query that is not UTF-8 once decoded, or that gives
/// a parameter twice, is refused (when the handler first reads it, so that an admin call without its key
/// is refused for that first): a value must not be silently replaced (`%ff` by U+FFFD), nor one of two
/// values silently chosen.
struct Params(Result<HashMap<String, String>, ApiError>);

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(Params(parse_query(parts.uri.query().unwrap_or(""))))
    }
}

fn parse_query(query: &str) -> Result<HashMap<String, String>, ApiError> {
    let mut params = HashMap::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let (key, value) = (form_decode(key)?, form_decode(value)?);
        if params.contains_key(&key) {
            return Err(ApiError::invalid("invalid-query", format!("parameter {key:?} is given more than once")));
        }
        params.insert(key, value);
    }
    Ok(params)
}

fn form_decode(text: &str) -> Result<String, ApiError> {
    let hex = |b: u8| (b as char).to_digit(16);
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match bytes.get(i..i + 3) {
            Some([b'%', high, low]) => hex(*high).zip(hex(*low)),
            _ => None,
        };
        match (bytes[i], escaped) {
            (_, Some((high, low))) => {
                decoded.push((high * 16 + low) as u8);
                i += 3;
            }
            (b'+', None) => {
                decoded.push(b' ');
                i += 1;
            }
            (b, None) => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(decoded)
        .map_err(|_| ApiError::invalid("invalid-query", format!("{text:?} is not UTF-8 once percent-decoded")))
}

/// Query parameters, with unknown ones refused so that a typo (`tll=`) is not silently ignored.
struct Parsed<'a>(&'a HashMap<String, String>);

impl<'a> Parsed<'a> {
    fn new(params: &'a Params, known: &[&str]) -> Result<Self, ApiError> {
        let params = params.0.as_ref().map_err(Clone::clone)?;
        if let Some(unknown) = params.keys().find(|k| !known.contains(&k.as_str())) {
            let detail = format!("unknown parameter {unknown:?}; this endpoint takes {known:?}");
            return Err(ApiError::invalid("invalid-query", detail));
        }
        Ok(Parsed(params))
    }

    fn get(&self, key: &str) -> Option<&'a str> {
        self.0.get(key).map(String::as_str)
    }

    /// A duration parameter (bounds are checked by the operation).
    fn duration_ms(&self, key: &str, slug: &'static str) -> Result<Option<u64>, ApiError> {
        let Some(text) = self.get(key) else { return Ok(None) };
        match parse_duration_ms(text) {
            Some(ms) => Ok(Some(ms)),
            None => Err(ApiError::invalid(slug, format!("{key}={text:?}: seconds or a duration (500ms, 2s, 1m)"))),
        }
    }

    fn token(&self) -> Result<Token, ApiError> {
        let Some(text) = self.get("token") else {
            return Err(ApiError::invalid("invalid-token", "token is required".into()));
        };
        ops::parse_token(text)
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
    humantime::parse_duration(text).ok().and_then(|d| u64::try_from(d.as_millis()).ok())
}

// --- JSON shapes ---

/// RFC 3339 with milliseconds, UTC.
pub fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

fn grant_json(grant: &Grant) -> Value {
    let mut body = json!({
        "name": grant.name,
        "owner": grant.owner,
        "token": grant.token.to_string(),
        "fence": grant.fence,
        "granted_at": rfc3339(grant.granted_at_ms),
    });
    add_lease(&mut body, grant.lease);
    body
}

fn add_lease(body: &mut Value, lease: Lease) {
    match lease {
        Lease::Ttl { ttl_ms, expires_at_ms } => {
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
    let waiters: Vec<Value> =
        view.waiters.iter().map(|w| json!({"owner": w.owner, "queued_at": rfc3339(w.queued_at_ms)})).collect();
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
        assert_eq!(ops::show_ms(1_500), "1s 500ms");
    }

    #[test]
    fn times_are_rfc3339_utc_with_millis() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
