//! The protobuf shapes of the gRPC API (`proto/holdfast/v1/locks.proto`): holds, holders and locks.

use holdfast_core::{Grant, HolderView, Lease, LockView};
use holdfast_proto::v1::{self, Hold, Holder};

/// A grant as its holder sees it, with its token.
pub fn hold(grant: &Grant) -> Hold {
    let (expires_at_ms, ttl_ms) = match grant.lease {
        Lease::Ttl { ttl_ms, expires_at_ms } => (expires_at_ms, ttl_ms),
        Lease::Session(_) | Lease::Delayed { .. } => (0, 0),
    };
    Hold {
        name: grant.name.clone(),
        owner: grant.owner.clone(),
        token: grant.token.to_string(),
        fence: grant.fence,
        granted_at_ms: grant.granted_at_ms,
        expires_at_ms,
        ttl_ms,
        value: grant.value.clone(),
    }
}

/// A holder as anyone sees it: no token.
pub fn holder(h: &HolderView) -> Holder {
    let (expires_at_ms, ttl_ms, session_id) = match h.lease {
        Lease::Ttl { ttl_ms, expires_at_ms } => (expires_at_ms, ttl_ms, 0),
        Lease::Session(id) => (0, 0, id),
        Lease::Delayed { .. } => (0, 0, 0),
    };
    Holder {
        owner: h.owner.clone(),
        fence: h.fence,
        granted_at_ms: h.granted_at_ms,
        expires_at_ms,
        ttl_ms,
        session_id,
        value: h.value.clone(),
        free_at_ms: h.lease.free_at_ms().unwrap_or(0),
    }
}

/// A lock, its holder and its queue.
pub fn lock(view: &LockView) -> v1::Lock {
    v1::Lock {
        name: view.name.clone(),
        holder: Some(holder(&view.holder)),
        waiters: view
            .waiters
            .iter()
            .map(|w| v1::Waiter {
                owner: w.owner.clone(),
                queued_at_ms: w.queued_at_ms,
                session_id: w.session.unwrap_or(0),
            })
            .collect(),
        revision: view.revision,
        holders: view.holders.iter().map(holder).collect(),
        limit: view.limit,
    }
}

/// A watch's view of a lock: as [`lock`] shows it, or only its name and revision when nobody holds it.
pub fn watched_lock(watched: &crate::api::locks::Watched) -> v1::Lock {
    match &watched.view {
        Some(view) => lock(view),
        None => v1::Lock {
            name: watched.name.clone(),
            holder: None,
            waiters: vec![],
            revision: watched.revision,
            holders: vec![],
            limit: 0,
        },
    }
}
