//! The one-shot lock operations both front doors (HTTP and gRPC) offer, with their input checks. The fronts
//! only parse and format; everything else is here, once.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use holdfast_core::{limits, Grant, LockView, Outcome, Token};

use crate::auth::Scope;
use crate::error::ApiError;
use crate::node::{Node, Query, QueryReply, Request, Watch, Written};

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
pub fn check_ttl(node: &Node, ttl_ms: u64) -> Result<u64, ApiError> {
    let (min, max) = (node.limits.ttl_ms_min, node.limits.ttl_ms_max);
    if (min..=max).contains(&ttl_ms) {
        return Ok(ttl_ms);
    }
    Err(ApiError::invalid(
        "invalid-ttl",
        format!("ttl {} is outside {}..={}", show_ms(ttl_ms), show_ms(min), show_ms(max)),
    ))
}

/// A wait within this node's configured bound.
pub fn check_wait(node: &Node, wait_ms: u64) -> Result<u64, ApiError> {
    let max = node.limits.wait_ms_max;
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
    node: &Arc<Node>,
    scope: &Scope,
    name: String,
    owner: String,
    ttl_ms: u64,
    wait_ms: u64,
) -> Result<Grant, ApiError> {
    check_name(&name)?;
    check_owner(&owner)?;
    check_ttl(node, ttl_ms)?;
    check_wait(node, wait_ms)?;
    let name = scope.inner(&name);
    let granted = acquire_stored(node, name, scope.inner(&owner), ttl_ms, wait_ms).await;
    granted
        .map(|mut grant| {
            grant.fence = node.told_fence(grant.fence);
            scope.grant(grant)
        })
        .map_err(|e| scope.error(e))
}

async fn acquire_stored(
    node: &Arc<Node>,
    name: String,
    owner: String,
    ttl_ms: u64,
    wait_ms: u64,
) -> Result<Grant, ApiError> {
    let started = Instant::now();
    let request = Request::Acquire { name: name.clone(), owner, ttl_ms, wait_ms };
    let written = acquire_or_undo(node, name.clone(), request).await?;
    match written.outcome().clone() {
        Outcome::Granted(grant) => Ok(grant),
        Outcome::Busy { holder } => Err(ApiError::Busy { name, holder: Some(holder) }),
        Outcome::Queued { .. } => {
            let token = written.token.expect("the leader returns the token of an acquire");
            let deadline = started + Duration::from_millis(wait_ms);
            wait_for_grant(node, name, token, written.index, deadline).await
        }
        Outcome::Rejected(reject) => Err(reject.into()),
        other => Err(ApiError::unexpected(other)),
    }
}

/// Proposes an acquire of `name` in a task of its own. If the caller goes away before the answer, the task
/// undoes what the acquire did (releases the grant, or leaves the queue), so that nobody holds or waits for
/// a lock on behalf of a client that is gone.
async fn acquire_or_undo(node: &Arc<Node>, name: String, request: Request) -> Result<Written, ApiError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task_node = node.clone();
    tokio::spawn(async move {
        let result = task_node.write(request).await;
        let Err(Ok(written)) = tx.send(result) else { return };
        let Some(token) = written.token else { return };
        if matches!(written.outcome(), Outcome::Granted(_) | Outcome::Queued { .. }) {
            tracing::debug!(name, "the client went away before its acquire was answered; undoing it");
            withdraw(&task_node, name, token).await;
        }
    });
    Ok(rx.await.map_err(|_| ApiError::Internal { detail: "the acquire task ended without an answer".into() })??)
}

/// Withdraws claim `token` on `name`: leaves the queue, or releases the lock if it was granted.
async fn withdraw(node: &Arc<Node>, name: String, token: Token) {
    node.events.unwatch(token);
    if let Err(e) = node.write(Request::Cancel { name: name.clone(), token }).await {
        tracing::warn!(%e, name, "could not withdraw the claim of a client that went away");
    }
}

/// Long-polls a queued claim until it is granted or `deadline` passes. If the caller goes away (this
/// future is dropped), the claim is withdrawn.
async fn wait_for_grant(
    node: &Arc<Node>,
    name: String,
    token: Token,
    index: u64,
    deadline: Instant,
) -> Result<Grant, ApiError> {
    let mut guard = WithdrawOnDrop { node: node.clone(), name: name.clone(), token, armed: true };
    let granted = match node.watch(&name, token, index).await? {
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
    node.events.unwatch(token);
    node.write(Request::Cancel { name: name.clone(), token }).await?;
    let holder = node.state.read().expect("lock state poisoned").holder(&name);
    Err(ApiError::Busy { name, holder })
}

/// Withdraws a queued claim when dropped while armed: the waiter's request went away.
struct WithdrawOnDrop {
    node: Arc<Node>,
    name: String,
    token: Token,
    armed: bool,
}

impl Drop for WithdrawOnDrop {
    fn drop(&mut self) {
        if self.armed {
            let (node, name, token) = (self.node.clone(), std::mem::take(&mut self.name), self.token);
            tokio::spawn(async move { withdraw(&node, name, token).await });
        }
    }
}

/// Lets go of `name`; answers the fence of the hold that ended.
pub async fn release(node: &Arc<Node>, scope: &Scope, name: String, token: Token) -> Result<(String, u64), ApiError> {
    check_name(&name)?;
    let released = async {
        match node.write(Request::Release { name: scope.inner(&name), token }).await?.outcome().clone() {
            Outcome::Released { name, fence } => Ok((scope.outer(&name), fence)),
            Outcome::Rejected(reject) => Err(reject.into()),
            other => Err(ApiError::unexpected(other)),
        }
    };
    released.await.map_err(|e| scope.error(e))
}

/// Extends the TTL hold of `token` on `name` (for its current TTL when `ttl_ms` is `None`).
pub async fn renew(
    node: &Arc<Node>,
    scope: &Scope,
    name: String,
    token: Token,
    ttl_ms: Option<u64>,
) -> Result<Grant, ApiError> {
    check_name(&name)?;
    if let Some(ttl_ms) = ttl_ms {
        check_ttl(node, ttl_ms)?;
    }
    let renewed = async {
        match node.write(Request::Renew { name: scope.inner(&name), token, ttl_ms }).await?.outcome().clone() {
            Outcome::Renewed(grant) => Ok(scope.grant(grant)),
            Outcome::Rejected(reject) => Err(reject.into()),
            other => Err(ApiError::unexpected(other)),
        }
    };
    renewed.await.map_err(|e| scope.error(e))
}

/// Who holds `name` and who waits for it.
pub async fn get(node: &Arc<Node>, scope: &Scope, name: String) -> Result<LockView, ApiError> {
    check_name(&name)?;
    match node.read(Query::Lock { name: scope.inner(&name) }).await? {
        QueryReply::Lock(Some(view)) => Ok(scope.view(view)),
        QueryReply::Lock(None) => Err(ApiError::NotFound { name }),
        other => Err(ApiError::unexpected(other)),
    }
}

/// Up to `limit` locks whose names start with `prefix`, after `after`; and the `after` of the next page.
pub async fn list(
    node: &Arc<Node>,
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
    match node.read(Query::List { prefix, after, limit }).await? {
        QueryReply::List(views) => {
            let views: Vec<LockView> = views.into_iter().map(|view| scope.view(view)).collect();
            let next = if views.len() == limit { views.last().map(|v| v.name.clone()) } else { None };
            Ok((views, next))
        }
        other => Err(ApiError::unexpected(other)),
    }
}

/// Who makes a call, as far as admin checks need to know: the `Authorization` value it sent and the
/// address its connection came from (`None` when the transport does not say, which counts as remote).
#[derive(Debug, Clone, Copy, Default)]
pub struct Caller<'a> {
    pub authorization: Option<&'a str>,
    pub peer: Option<IpAddr>,
}

impl Caller<'_> {
    /// Whether the call came over loopback (127.0.0.0/8, `::1`, or IPv4 loopback mapped into IPv6).
    pub fn is_loopback(&self) -> bool {
        self.peer.is_some_and(|ip| ip.to_canonical().is_loopback())
    }
}

/// Whether `caller` may make an admin call (membership, snapshots, API keys):
/// - with an admin key: only with `Bearer KEY`, compared in constant time, from everywhere;
/// - without one, auth off: only from loopback, so that `holdfast cluster add` on the node's own host works
///   while a node bound to `0.0.0.0` does not hand its membership to whoever reaches the port;
/// - without one, auth on: never (a tenant's key must not become an admin's).
///
/// The table in `docs/security.md` is this function; `tests/admin_access.rs` walks it.
pub fn check_admin(node: &Node, caller: Caller<'_>) -> Result<(), ApiError> {
    let Some(crate::Secret(key)) = &node.admin_key else {
        if node.auth.config.enabled {
            let detail = "this cluster has --auth but no --admin-key: admin calls are off".into();
            return Err(ApiError::Forbidden { slug: "no-admin-key", detail });
        }
        if caller.is_loopback() {
            return Ok(());
        }
        let from = caller.peer.map_or_else(|| "an unknown address".to_owned(), |ip| ip.to_string());
        let detail = format!(
            "admin calls from {from} need an admin key: start every node with --admin-key KEY \
             (HOLDFAST_ADMIN_KEY) and send `Authorization: Bearer KEY`; without a key, admin calls are \
             accepted only from loopback"
        );
        return Err(ApiError::Forbidden { slug: "admin-loopback-only", detail });
    };
    let given = caller.authorization.and_then(|value| value.strip_prefix("Bearer ")).map(str::trim);
    match given {
        Some(given) if constant_time_eq(given.as_bytes(), key.as_bytes()) => Ok(()),
        Some(_) => Err(ApiError::Unauthenticated { detail: "wrong admin key".into() }),
        None => Err(ApiError::Unauthenticated { detail: "admin calls need `Authorization: Bearer ADMIN_KEY`".into() }),
    }
}

/// Equal contents, in a time that depends on the lengths only.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Adds node `id` at peer address `addr` (HOST:PORT); see `Node::add`.
pub async fn add_member(node: &Node, id: u64, addr: &str) -> Result<(), ApiError> {
    if id == 0 {
        return Err(ApiError::invalid("invalid-member", "member ids are positive numbers".into()));
    }
    let valid_addr =
        matches!(addr.rsplit_once(':'), Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok());
    if !valid_addr || addr.len() > ADDR_LEN_MAX {
        let detail = format!("addr {addr:?}: expected HOST:PORT of the node's peer port");
        return Err(ApiError::invalid("invalid-member", detail));
    }
    Ok(node.add(id, addr.to_owned()).await?)
}

/// Removes node `id`; see `Node::remove`.
pub async fn remove_member(node: &Node, id: u64) -> Result<(), ApiError> {
    Ok(node.remove(id).await?)
}

/// The longest peer address a member may have.
const ADDR_LEN_MAX: usize = 255;

/// `POST /v1/signup`: makes an API key (its own tenant) for anyone when signup is open, else for the
/// admin. Answers the key, which exists nowhere else (the cluster keeps its hash), and the tenant id.
pub async fn signup(node: &Arc<Node>, caller: Caller<'_>) -> Result<(String, u64), ApiError> {
    if !node.auth.config.enabled {
        let detail = "this cluster runs without --auth: requests need no key".into();
        return Err(ApiError::Forbidden { slug: "auth-off", detail });
    }
    if !node.auth.config.open_signup {
        check_admin(node, caller).map_err(|_| ApiError::Forbidden {
            slug: "signup-off",
            detail: "signup is off (--open-signup): the admin makes keys".into(),
        })?;
    }
    // Tenant ids and keys are random; a collision (never seen in practice) is refused by the state machine
    // and tried again.
    for _ in 0..3 {
        let (key, hash) = crate::auth::new_key();
        let tenant = rand::random::<u64>();
        match node.write(Request::CreateKey { tenant, hash }).await?.outcome().clone() {
            Outcome::KeyCreated { tenant } => return Ok((key, tenant)),
            Outcome::Rejected(holdfast_core::Reject::KeyExists) => continue,
            Outcome::Rejected(reject) => return Err(reject.into()),
            other => return Err(ApiError::unexpected(other)),
        }
    }
    Err(ApiError::Internal { detail: "three random tenant ids in a row were taken".into() })
}

/// Every tenant with a key, and when it was made (admin).
pub async fn list_keys(node: &Arc<Node>) -> Result<Vec<(u64, u64)>, ApiError> {
    match node.read(Query::Keys).await? {
        QueryReply::Keys(keys) => Ok(keys),
        other => Err(ApiError::unexpected(other)),
    }
}

/// Revokes tenant `tenant`'s key (admin): it stops working on every node as each applies this.
pub async fn revoke_key(node: &Arc<Node>, tenant: u64) -> Result<(), ApiError> {
    match node.write(Request::RevokeKey { tenant }).await?.outcome().clone() {
        Outcome::KeyRevoked { .. } => Ok(()),
        Outcome::Rejected(holdfast_core::Reject::NoKey(_)) => {
            Err(ApiError::NotFound { name: format!("API key of tenant {tenant:016x}") })
        }
        Outcome::Rejected(reject) => Err(reject.into()),
        other => Err(ApiError::unexpected(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_127_0_0_0_8_and_ipv6_loopback_and_an_unknown_peer_is_remote() {
        let from = |ip: &str| Caller { authorization: None, peer: Some(ip.parse().unwrap()) };
        for ip in ["127.0.0.1", "127.12.0.9", "::1", "::ffff:127.0.0.1"] {
            assert!(from(ip).is_loopback(), "{ip}");
        }
        for ip in ["10.0.0.1", "172.17.0.1", "0.0.0.0", "::", "::ffff:10.0.0.1", "fe80::1"] {
            assert!(!from(ip).is_loopback(), "{ip}");
        }
        assert!(!Caller::default().is_loopback(), "no peer address: remote");
    }
}
