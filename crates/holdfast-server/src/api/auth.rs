//! API keys and tenants (`--auth`).
//!
//! Each API key is its own tenant, with its own namespace of locks: the front doors put every lock name and
//! owner of a tenant under the tenant's prefix (`limits::tenant_prefix`, 16 hex digits and a `/`, which no
//! client-given name can contain) and take it off again in every answer. To a tenant, other tenants' locks
//! do not exist. The replicated state keeps only the SHA-256 of each key; the node that makes a key hands
//! it to the client once and keeps nothing. A revoked key stops working on a node as soon as the node has
//! applied the revocation; writes are also checked at apply (a name under a tenant without a key changes
//! nothing), so no write ordered after a revocation takes effect anywhere.
//!
//! Keys are 128 random bits, so a plain SHA-256 is enough (no slow hash); looking the hash up in the
//! state's map does not tell an attacker anything about other keys.

use std::collections::HashMap;
use std::sync::Mutex;
use tokio::time::Instant;

use holdfast_core::{limits, Grant, HolderView, LockView};
use sha2::{Digest, Sha256};

use holdfast_store::SharedState;

use super::error::ApiError;
use crate::leader::tenants::TenantLimits;

/// Settings of `--auth`.
/// A secret (a key) that never shows in debug output or logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// Requests need an API key (`Authorization: Bearer KEY`); off, everything is one open namespace.
    pub enabled: bool,
    /// `POST /v1/signup` makes keys for anyone (otherwise only with the admin key).
    pub open_signup: bool,
    /// Locks (held or waited for) one key may have at once.
    pub locks_per_key_max: usize,
    /// Sessions one key may have open at once.
    pub sessions_per_key_max: usize,
    /// Requests per second one key may make on one node (the burst is the same number).
    pub requests_per_s_per_key: u32,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            enabled: false,
            open_signup: false,
            locks_per_key_max: 10_000,
            sessions_per_key_max: 1_000,
            requests_per_s_per_key: 1_000,
        }
    }
}

/// A node's API-key checks and per-key request budgets.
#[derive(Debug, Default)]
pub struct Auth {
    pub config: AuthConfig,
    /// Token buckets by tenant: (tokens, last refill).
    buckets: Mutex<HashMap<u64, (f64, Instant)>>,
}

impl Auth {
    pub fn new(config: AuthConfig) -> Self {
        Auth { config, buckets: Mutex::default() }
    }

    /// Each key's limits on locks and sessions, which the leader enforces; `None` without `--auth`.
    pub fn tenant_limits(&self) -> Option<TenantLimits> {
        self.config.enabled.then_some(TenantLimits {
            locks_per_key_max: self.config.locks_per_key_max,
            sessions_per_key_max: self.config.sessions_per_key_max,
        })
    }

    fn spend(&self, tenant: u64) -> Result<(), ApiError> {
        let rate = f64::from(self.config.requests_per_s_per_key.max(1));
        let now = Instant::now();
        let mut buckets = self.buckets.lock().expect("rate buckets poisoned");
        let (tokens, last) = buckets.entry(tenant).or_insert((rate, now));
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * rate).min(rate);
        *last = now;
        if *tokens < 1.0 {
            let detail = format!("this API key may make {rate} requests per second on a node");
            return Err(ApiError::Limit { slug: "rate-limited", detail });
        }
        *tokens -= 1.0;
        Ok(())
    }
}

/// The SHA-256 of an API key, as the replicated state keeps it.
pub fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// A new API key (`hf_` and 32 hex digits: 128 random bits) and its hash.
pub fn new_key() -> (String, [u8; 32]) {
    let key = format!("hf_{:032x}", rand::random::<u128>());
    let hash = hash_key(&key);
    (key, hash)
}

/// The key in an `Authorization: Bearer KEY` value.
pub fn bearer(authorization: Option<&str>) -> Option<&str> {
    authorization.and_then(|value| value.strip_prefix("Bearer ")).map(str::trim).filter(|key| !key.is_empty())
}

/// Whose namespace a request acts in: a tenant's (auth on), or the one open namespace (auth off).
#[derive(Debug, Clone)]
pub struct Scope {
    tenant: Option<u64>,
    /// Put before every name and owner of the tenant; empty for the open namespace.
    prefix: String,
}

impl Scope {
    /// The open namespace: names and owners as clients give them.
    pub fn open() -> Scope {
        Scope { tenant: None, prefix: String::new() }
    }

    fn of(tenant: u64) -> Scope {
        Scope { tenant: Some(tenant), prefix: limits::tenant_prefix(tenant) }
    }

    /// The stored form of a name or owner the client gave.
    pub fn inner(&self, text: &str) -> String {
        format!("{}{text}", self.prefix)
    }

    /// What the client sees of a stored name or owner.
    pub fn outer(&self, text: &str) -> String {
        text.strip_prefix(self.prefix.as_str()).unwrap_or(text).to_owned()
    }

    /// Whether this scope's key still exists (it was not revoked since the request was authenticated).
    pub fn valid(&self, state: &SharedState) -> bool {
        match self.tenant {
            None => true,
            Some(tenant) => crate::state::read(state).has_key(tenant),
        }
    }

    /// Admits one more request under this scope, as [`authenticate`] admits one: the key must not have been
    /// revoked since, and the request is taken from the key's budget. For each call on a stream that was
    /// authenticated once, when it opened.
    pub fn admit(&self, auth: &Auth, state: &SharedState) -> Result<(), ApiError> {
        let Some(tenant) = self.tenant else { return Ok(()) };
        if !self.valid(state) {
            return Err(ApiError::Unauthenticated { detail: "the API key was revoked".into() });
        }
        auth.spend(tenant)
    }

    /// Whether a stored owner (of a session) belongs to this namespace.
    pub fn owns(&self, stored: &str) -> bool {
        stored.starts_with(self.prefix.as_str())
    }

    pub fn grant(&self, grant: Grant) -> Grant {
        Grant { name: self.outer(&grant.name), owner: self.outer(&grant.owner), ..grant }
    }

    pub fn holder(&self, holder: HolderView) -> HolderView {
        HolderView { owner: self.outer(&holder.owner), ..holder }
    }

    pub fn view(&self, view: LockView) -> LockView {
        LockView {
            name: self.outer(&view.name),
            holder: self.holder(view.holder),
            holders: view.holders.into_iter().map(|h| self.holder(h)).collect(),
            limit: view.limit,
            waiters: view
                .waiters
                .into_iter()
                .map(|w| holdfast_core::WaiterView { owner: self.outer(&w.owner), ..w })
                .collect(),
            revision: view.revision,
        }
    }

    /// `e` as the client sees it: names and owners without the tenant's prefix.
    pub fn error(&self, e: ApiError) -> ApiError {
        if self.prefix.is_empty() {
            return e;
        }
        e.map_text(|text| self.strip(text))
    }

    /// `text` (a message that may quote stored names) without the tenant's prefix anywhere.
    pub fn strip(&self, text: &str) -> String {
        match self.prefix.is_empty() {
            true => text.to_owned(),
            false => text.replace(self.prefix.as_str(), ""),
        }
    }
}

/// The scope of a request with `authorization` (the `Authorization` header or metadata): with auth off,
/// the open namespace; with auth on, the tenant of a valid key, within its request budget.
pub fn authenticate(auth: &Auth, state: &SharedState, authorization: Option<&str>) -> Result<Scope, ApiError> {
    if !auth.config.enabled {
        return Ok(Scope::open());
    }
    let Some(key) = bearer(authorization) else {
        return Err(ApiError::Unauthenticated { detail: "this cluster needs `Authorization: Bearer API_KEY`".into() });
    };
    let tenant = crate::state::read(state).key_tenant(&hash_key(key));
    let Some(tenant) = tenant else {
        return Err(ApiError::Unauthenticated { detail: "unknown or revoked API key".into() });
    };
    auth.spend(tenant)?;
    Ok(Scope::of(tenant))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_prefix_and_strip_names() {
        let scope = Scope::of(0xab);
        assert_eq!(scope.inner("job"), "00000000000000ab/job");
        assert_eq!(scope.outer("00000000000000ab/job"), "job");
        assert!(scope.owns("00000000000000ab/worker"));
        assert!(!scope.owns("00000000000000ac/worker"));
        let open = Scope::open();
        assert_eq!(open.inner("job"), "job");
        assert_eq!(open.outer("job"), "job");
    }

    #[test]
    fn keys_are_random_and_hash_to_what_was_stored() {
        let (a, hash) = new_key();
        let (b, _) = new_key();
        assert_ne!(a, b);
        assert!(a.starts_with("hf_") && a.len() == 35);
        assert_eq!(hash_key(&a), hash);
        assert_eq!(bearer(Some("Bearer hf_x")), Some("hf_x"));
        assert_eq!(bearer(Some("Basic hf_x")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
    }

    #[test]
    fn the_request_budget_refills_and_is_per_tenant() {
        let auth = Auth::new(AuthConfig { requests_per_s_per_key: 3, ..AuthConfig::default() });
        for _ in 0..3 {
            auth.spend(1).unwrap();
        }
        assert!(matches!(auth.spend(1), Err(ApiError::Limit { slug: "rate-limited", .. })));
        auth.spend(2).expect("another tenant has its own budget");
    }
}
