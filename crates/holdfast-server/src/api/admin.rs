//! Admin calls (membership, snapshots, API keys) and who may make them.

use std::net::IpAddr;

use holdfast_core::Outcome;

use super::auth::Secret;
use super::error::ApiError;
use super::Api;
use crate::peer::protocol::{Query, QueryReply, Request};

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
pub fn check_admin(api: &Api, caller: Caller<'_>) -> Result<(), ApiError> {
    let Some(Secret(key)) = &api.admin_key else {
        if api.auth.config.enabled {
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

/// Adds node `id` at peer address `addr` (HOST:PORT); through the leader.
pub async fn add_member(api: &Api, id: u64, addr: &str) -> Result<(), ApiError> {
    if id == 0 {
        return Err(ApiError::invalid("invalid-member", "member ids are positive numbers".into()));
    }
    let valid_addr =
        matches!(addr.rsplit_once(':'), Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok());
    if !valid_addr || addr.len() > ADDR_LEN_MAX {
        let detail = format!("addr {addr:?}: expected HOST:PORT of the node's peer port");
        return Err(ApiError::invalid("invalid-member", detail));
    }
    api.route.add(id, addr.to_owned()).await?;
    seen_here(api, |voters, _| voters.contains(&id)).await;
    Ok(())
}

/// Removes node `id`; through the leader.
pub async fn remove_member(api: &Api, id: u64) -> Result<(), ApiError> {
    api.route.remove(id).await?;
    seen_here(api, |_, members| !members.contains(&id)).await;
    Ok(())
}

/// Waits, a few seconds at most, until this node has applied a membership change the leader committed
/// (`done` given its voters and members), so that the cluster view it answers with shows it: through a
/// follower, the answer showed the membership from before the change.
async fn seen_here(api: &Api, done: impl Fn(&[u64], &[u64]) -> bool) {
    let mut metrics = api.raft.metrics();
    let wait = metrics.wait_for(|m| {
        let membership = m.membership_config.membership();
        let voters: Vec<u64> = membership.voter_ids().collect();
        let members: Vec<u64> = membership.nodes().map(|(id, _)| *id).collect();
        done(&voters, &members)
    });
    // Past the bound the answer shows what this node has: the change is committed either way.
    let _ = tokio::time::timeout(SEEN_HERE_MAX, wait).await;
}

/// How long a membership call waits for its own node to apply the change it made.
const SEEN_HERE_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// The longest peer address a member may have.
const ADDR_LEN_MAX: usize = 255;

/// `POST /v1/signup`: makes an API key (its own tenant) for anyone when signup is open, else for the
/// admin. Answers the key, which exists nowhere else (the cluster keeps its hash), and the tenant id.
pub async fn signup(api: &Api, caller: Caller<'_>) -> Result<(String, u64), ApiError> {
    if !api.auth.config.enabled {
        let detail = "this cluster runs without --auth: requests need no key".into();
        return Err(ApiError::Forbidden { slug: "auth-off", detail });
    }
    if !api.auth.config.open_signup {
        check_admin(api, caller).map_err(|_| ApiError::Forbidden {
            slug: "signup-off",
            detail: "signup is off (--open-signup): the admin makes keys".into(),
        })?;
    }
    // Tenant ids and keys are random; a collision (never seen in practice) is refused by the state machine
    // and tried again.
    for _ in 0..3 {
        let (key, hash) = super::auth::new_key();
        let tenant = rand::random::<u64>();
        match api.route.write(Request::CreateKey { tenant, hash }).await?.outcome().clone() {
            Outcome::KeyCreated { tenant } => return Ok((key, tenant)),
            Outcome::Rejected(holdfast_core::Reject::KeyExists) => continue,
            Outcome::Rejected(reject) => return Err(reject.into()),
            other => return Err(ApiError::unexpected(other)),
        }
    }
    Err(ApiError::Internal { detail: "three random tenant ids in a row were taken".into() })
}

/// Every tenant with a key, and when it was made (admin).
pub async fn list_keys(api: &Api) -> Result<Vec<(u64, u64)>, ApiError> {
    match api.route.read(Query::Keys).await? {
        QueryReply::Keys(keys) => Ok(keys),
        other => Err(ApiError::unexpected(other)),
    }
}

/// Revokes tenant `tenant`'s key (admin): it stops working on every node as each applies this.
pub async fn revoke_key(api: &Api, tenant: u64) -> Result<(), ApiError> {
    match api.route.write(Request::RevokeKey { tenant }).await?.outcome().clone() {
        Outcome::KeyRevoked { .. } => Ok(()),
        Outcome::Rejected(holdfast_core::Reject::NoKey(_)) => {
            Err(ApiError::NotFound { name: format!("API key of tenant {tenant:016x}") })
        }
        Outcome::Rejected(reject) => Err(reject.into()),
        other => Err(ApiError::unexpected(other)),
    }
}

/// Has this node snapshot its lock state now (admin), and answers the snapshot's last log index and size
/// in bytes ([`crate::leader::Leader::snapshot`]).
pub async fn snapshot(api: &Api) -> Result<(u64, u64), ApiError> {
    Ok(api.leader.snapshot().await?)
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
