//! Errors as the client sees them, whatever the transport: [`ApiError`], each with a stable problem type
//! (`urn:holdfast:<slug>`), a title and a detail. How each becomes an HTTP status and a gRPC code is in one
//! place, the front's `problem` module.

use holdfast_core::{HolderView, Reject};

use crate::peer::protocol::NodeError;

/// An error answered to a client.
#[derive(Debug, Clone)]
pub enum ApiError {
    /// Bad input; nothing changed. `slug` names the problem type.
    Invalid { slug: &'static str, detail: String },
    /// The lock is held by someone else (or the wait ran out).
    Busy { name: String, holder: Option<HolderView> },
    /// The token does not hold the lock.
    NotHolder { name: String },
    /// The hold ran out before the renew.
    Expired { name: String },
    /// No such lock is held.
    NotFound { name: String },
    /// The session expired or was closed.
    SessionGone { id: holdfast_core::SessionId },
    /// A limit was reached (queue full, too many locks…).
    Limit { slug: &'static str, detail: String },
    /// No leader could serve the request in time.
    Unavailable { detail: String },
    /// A change that conflicts with the cluster as it is (a membership change that cannot be made).
    Conflict { slug: String, detail: String },
    /// An admin call without the admin key (or with a wrong one).
    Unauthenticated { detail: String },
    /// A call this caller may not make here (signup that is off, admin calls with no admin key set).
    Forbidden { slug: &'static str, detail: String },
    /// No such endpoint.
    NoRoute,
    /// The endpoint does not take this method.
    NoMethod,
    /// A bug: an answer the endpoint does not expect.
    Internal { detail: String },
}

impl ApiError {
    pub fn invalid(slug: &'static str, detail: String) -> Self {
        ApiError::Invalid { slug, detail }
    }

    /// The same error with `f` applied to every text in it (names, owners, details).
    pub fn map_text(self, f: impl Fn(&str) -> String) -> Self {
        match self {
            ApiError::Invalid { slug, detail } => ApiError::Invalid { slug, detail: f(&detail) },
            ApiError::Busy { name, holder } => {
                ApiError::Busy { name: f(&name), holder: holder.map(|h| HolderView { owner: f(&h.owner), ..h }) }
            }
            ApiError::NotHolder { name } => ApiError::NotHolder { name: f(&name) },
            ApiError::Expired { name } => ApiError::Expired { name: f(&name) },
            ApiError::NotFound { name } => ApiError::NotFound { name: f(&name) },
            ApiError::Limit { slug, detail } => ApiError::Limit { slug, detail: f(&detail) },
            ApiError::Unavailable { detail } => ApiError::Unavailable { detail: f(&detail) },
            ApiError::Conflict { slug, detail } => ApiError::Conflict { slug, detail: f(&detail) },
            ApiError::Unauthenticated { detail } => ApiError::Unauthenticated { detail: f(&detail) },
            ApiError::Forbidden { slug, detail } => ApiError::Forbidden { slug, detail: f(&detail) },
            ApiError::Internal { detail } => ApiError::Internal { detail: f(&detail) },
            e @ (ApiError::SessionGone { .. } | ApiError::NoRoute | ApiError::NoMethod) => e,
        }
    }

    pub fn unexpected(what: impl std::fmt::Debug) -> Self {
        ApiError::Internal { detail: format!("unexpected answer from the state machine: {what:?}") }
    }
}

impl From<NodeError> for ApiError {
    fn from(e: NodeError) -> Self {
        match e {
            NodeError::Refused { slug, detail } => ApiError::Conflict { slug, detail },
            NodeError::Limit { slug, detail } => {
                let slug = match slug.as_str() {
                    "too-many-sessions" => "too-many-sessions",
                    "overloaded" => "overloaded",
                    _ => "too-many-locks",
                };
                ApiError::Limit { slug, detail }
            }
            e => ApiError::Unavailable { detail: e.to_string() },
        }
    }
}

impl From<Reject> for ApiError {
    fn from(reject: Reject) -> Self {
        let detail = reject.to_string();
        match reject {
            Reject::InvalidName => ApiError::invalid("invalid-name", detail),
            Reject::InvalidOwner => ApiError::invalid("invalid-owner", detail),
            Reject::InvalidTtl(_) => ApiError::invalid("invalid-ttl", detail),
            Reject::InvalidWait(_) => ApiError::invalid("invalid-wait", detail),
            Reject::ValueTooLong(_) => ApiError::invalid("invalid-value", detail),
            Reject::InvalidLockDelay(_) => ApiError::invalid("invalid-lock-delay", detail),
            Reject::InvalidLimit(_) => ApiError::invalid("invalid-limit", detail),
            Reject::LimitMismatch { .. } => ApiError::Conflict { slug: "limit-mismatch".into(), detail },
            Reject::NotHolder { name, .. } => ApiError::NotHolder { name },
            Reject::Expired { name } => ApiError::Expired { name },
            Reject::SessionHold { .. } => ApiError::invalid("session-hold", detail),
            Reject::QueueFull { .. } => ApiError::Limit { slug: "queue-full", detail },
            Reject::TooManyLocks => ApiError::Limit { slug: "too-many-locks", detail },
            Reject::TooManySessions { .. } => ApiError::Limit { slug: "too-many-sessions", detail },
            Reject::TooManyClaims => ApiError::Limit { slug: "too-many-claims", detail },
            Reject::NoKey(_) => ApiError::Unauthenticated { detail: "the API key was revoked".into() },
            Reject::TooManyKeys => ApiError::Limit { slug: "too-many-keys", detail },
            Reject::NoSession(_)
            | Reject::SessionExists(_)
            | Reject::DuplicateToken
            | Reject::BatchTooLarge(_)
            | Reject::InvalidBatch
            | Reject::KeyExists => ApiError::Internal { detail },
        }
    }
}

impl ApiError {
    /// The problem's slug, title and detail.
    pub fn describe(&self) -> (&str, &'static str, String) {
        match self {
            ApiError::Conflict { slug, detail } => (slug, "Conflict", detail.clone()),
            ApiError::Unauthenticated { detail } => ("unauthenticated", "Unauthenticated", detail.clone()),
            ApiError::Forbidden { slug, detail } => (slug, "Forbidden", detail.clone()),
            ApiError::Invalid { slug, detail } => (*slug, "Invalid request", detail.clone()),
            ApiError::Busy { name, holder } => {
                let detail = match holder {
                    Some(h) => {
                        format!("lock {name:?} is held by {:?} (fence {})", h.owner, h.fence)
                    }
                    None => format!("lock {name:?} was not granted in time"),
                };
                ("busy", "Lock is held", detail)
            }
            ApiError::NotHolder { name } => (
                "not-holder",
                "Token does not hold the lock",
                format!("the token does not hold lock {name:?}: it is wrong, or its hold already ended"),
            ),
            ApiError::Expired { name } => (
                "expired",
                "Hold expired",
                format!("the hold on {name:?} ran out before the renew arrived; acquire it again"),
            ),
            ApiError::NotFound { name } => ("not-found", "Lock not held", format!("nobody holds lock {name:?}")),
            ApiError::SessionGone { id } => {
                ("session-gone", "Session gone", format!("session {id} expired or was closed; its locks are lost"))
            }
            ApiError::Limit { slug, detail } => (*slug, "Limit reached", detail.clone()),
            ApiError::Unavailable { detail } => ("unavailable", "Cluster unavailable", detail.clone()),
            ApiError::NoMethod => ("method-not-allowed", "Method not allowed", "see docs/http-api.md".into()),
            ApiError::NoRoute => ("no-route", "No such endpoint", "see docs/http-api.md".into()),
            ApiError::Internal { detail } => {
                tracing::error!(detail, "internal error");
                ("internal", "Internal error", detail.clone())
            }
        }
    }
}
