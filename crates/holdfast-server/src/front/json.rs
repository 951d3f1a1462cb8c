//! The JSON shapes of the HTTP API (`docs/http-api.md`): grants, holders and locks, times in RFC 3339.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use holdfast_core::{Grant, HolderView, Lease, LockView};
use serde_json::{json, Value};

use crate::api::cluster::ClusterView;
use crate::api::locks::Watched;
use crate::clock::wall_ms;

/// RFC 3339 with milliseconds, UTC.
pub fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

pub fn grant_json(grant: &Grant) -> Value {
    let mut body = json!({
        "name": grant.name,
        "owner": grant.owner,
        "token": grant.token.to_string(),
        "fence": grant.fence,
        "granted_at": rfc3339(grant.granted_at_ms),
    });
    add_lease(&mut body, grant.lease);
    add_value(&mut body, &grant.value);
    body
}

/// A value as text when it is UTF-8 (`value`), else as base64 (`value_base64`); an empty one as `""`.
fn add_value(body: &mut Value, value: &[u8]) {
    use base64::Engine;
    match std::str::from_utf8(value) {
        Ok(text) => body["value"] = json!(text),
        Err(_) => body["value_base64"] = json!(base64::engine::general_purpose::STANDARD.encode(value)),
    }
}

fn add_lease(body: &mut Value, lease: Lease) {
    match lease {
        Lease::Ttl { ttl_ms, expires_at_ms } => {
            body["expires_at"] = json!(rfc3339(expires_at_ms));
            body["expires_at_ms"] = json!(expires_at_ms);
            body["ttl_ms"] = json!(ttl_ms);
        }
        Lease::Session(id) => body["session"] = json!(id.to_string()),
        // Nobody holds it: this hold expired, and the lock is in its lock-delay until then.
        Lease::Delayed { free_at_ms } => {
            body["free_at"] = json!(rfc3339(free_at_ms));
            body["free_at_ms"] = json!(free_at_ms);
        }
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
    add_value(&mut body, &holder.value);
    body
}

pub fn lock_json(view: &LockView) -> Value {
    let waiters: Vec<Value> =
        view.waiters.iter().map(|w| json!({"owner": w.owner, "queued_at": rfc3339(w.queued_at_ms)})).collect();
    let holders: Vec<Value> = view.holders.iter().map(holder_json).collect();
    json!({
        "name": view.name,
        "holder": holder_json(&view.holder),
        "holders": holders,
        "limit": view.limit,
        "waiters": waiters,
        "revision": view.revision,
    })
}

/// A watch's answer: the lock as [`lock_json`] shows it (`holder` null and no waiters when nobody holds
/// it), its revision, and whether that differs from the watch's `after`.
pub fn watched_json(watched: &Watched) -> Value {
    let mut body = match &watched.view {
        Some(view) => lock_json(view),
        None => json!({"name": watched.name, "holder": null, "holders": [], "waiters": []}),
    };
    body["revision"] = json!(watched.revision);
    body["changed"] = json!(watched.changed);
    body
}

/// Seconds until `holder` may be free, for `Retry-After` (at least 1).
pub fn retry_after_s(holder: &HolderView) -> u64 {
    match holder.lease.expires_at_ms().or(holder.lease.free_at_ms()) {
        Some(end) => end.saturating_sub(wall_ms()).div_ceil(1000).max(1),
        None => 1,
    }
}

/// `GET /v1/cluster`: this node, the leader, term, members, and how far the log is.
pub fn cluster_json(view: &ClusterView) -> Value {
    let members: BTreeMap<String, &String> = view.members.iter().map(|(id, addr)| (id.to_string(), addr)).collect();
    let peers: BTreeMap<String, Value> = view
        .peers
        .iter()
        .map(|(id, p)| (id.to_string(), json!({"matched_index": p.matched_index, "last_heard_ms": p.last_heard_ms})))
        .collect();
    json!({
        "id": view.id,
        "state": view.state,
        "leader": view.leader,
        "term": view.term,
        "members": members,
        "voters": view.voters,
        "learners": view.learners,
        "last_log_index": view.last_log_index,
        "committed_index": view.committed_index,
        "applied_index": view.applied_index,
        "snapshot_index": view.snapshot_index,
        "millis_since_quorum_ack": view.millis_since_quorum_ack,
        "peers": peers,
        "now_ms": view.now_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc_with_millis() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
