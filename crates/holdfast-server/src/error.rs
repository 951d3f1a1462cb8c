//! Errors as the client sees them: the one place that maps them to HTTP statuses and problem types.
//!
//! Bodies are RFC 9457 `application/problem+json` with a stable `type` of the form `urn:holdfast:<slug>`.

use axum::extract::path::ErrorKind;
use axum::extract::rejection::PathRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use holdfast_core::{HolderView, Reject};
use serde_json::json;

use crate::http::{holder_json, retry_after_s};
use crate::node::NodeError;

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

    /// A path parameter axum could not extract: bad input (`slug`) when the client sent it (`what`, not
    /// UTF-8 once percent-decoded), a bug when the route's parameters do not fit its handler.
    pub fn path(slug: &'static str, what: &str, rejection: PathRejection) -> Self {
        if !rejection.status().is_client_error() {
            return ApiError::Internal { detail: rejection.body_text() };
        }
        let detail = match &rejection {
            PathRejection::FailedToDeserializePathParams(e)
                if matches!(e.kind(), ErrorKind::InvalidUtf8InPathParam { .. }) =>
            {
                format!("{what} is not UTF-8 once percent-decoded")
            }
            _ => format!("{what}: {}", rejection.body_text()),
        };
        ApiError::invalid(slug, detail)
    }
}

impl From<NodeError> for ApiError {
    fn from(e: NodeError) -> Self {
        match e {
            NodeError::Refused { slug, detail } => ApiError::Conflict { slug, detail },
            NodeError::Limit { slug, detail } => {
                let slug = if slug == "too-many-sessions" { "too-many-sessions" } else { "too-many-locks" };
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
            Reject::NotHolder { name, .. } => ApiError::NotHolder { name },
            Reject::Expired { name } => ApiError::Expired { name },
            Reject::SessionHold { .. } => ApiError::invalid("session-hold", detail),
            Reject::QueueFull { .. } => ApiError::Limit { slug: "queue-full", detail },
            Reject::TooManyLocks => ApiError::Limit { slug: "too-many-locks", detail },
            Reject::TooManySessions => ApiError::Limit { slug: "too-many-sessions", detail },
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
    /// HTTP status, problem slug, title and detail.
    fn describe(&self) -> (StatusCode, &str, &'static str, String) {
        match self {
            ApiError::Conflict { slug, detail } => (StatusCode::CONFLICT, slug, "Conflict", detail.clone()),
            ApiError::Unauthenticated { detail } => {
                (StatusCode::UNAUTHORIZED, "unauthenticated", "Unauthenticated", detail.clone())
            }
            ApiError::Forbidden { slug, detail } => (StatusCode::FORBIDDEN, slug, "Forbidden", detail.clone()),
            ApiError::Invalid { slug, detail } => (StatusCode::BAD_REQUEST, *slug, "Invalid request", detail.clone()),
            ApiError::Busy { name, holder } => {
                let detail = match holder {
                    Some(h) => {
                        format!("lock {name:?} is held by {:?} (fence {})", h.owner, h.fence)
                    }
                    None => format!("lock {name:?} was not granted in time"),
                };
                (StatusCode::CONFLICT, "busy", "Lock is held", detail)
            }
            ApiError::NotHolder { name } => (
                StatusCode::CONFLICT,
                "not-holder",
                "Token does not hold the lock",
                format!("the token does not hold lock {name:?}: it is wrong, or its hold already ended"),
            ),
            ApiError::Expired { name } => (
                StatusCode::GONE,
                "expired",
                "Hold expired",
                format!("the hold on {name:?} ran out before the renew arrived; acquire it again"),
            ),
            ApiError::NotFound { name } => {
                (StatusCode::NOT_FOUND, "not-found", "Lock not held", format!("nobody holds lock {name:?}"))
            }
            ApiError::SessionGone { id } => (
                StatusCode::NOT_FOUND,
                "session-gone",
                "Session gone",
                format!("session {id} expired or was closed; its locks are lost"),
            ),
            ApiError::Limit { slug, detail } => (StatusCode::TOO_MANY_REQUESTS, *slug, "Limit reached", detail.clone()),
            ApiError::Unavailable { detail } => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable", "Cluster unavailable", detail.clone())
            }
            ApiError::NoMethod => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
                "see docs/http-api.md".into(),
            ),
            ApiError::NoRoute => (StatusCode::NOT_FOUND, "no-route", "No such endpoint", "see docs/http-api.md".into()),
            ApiError::Internal { detail } => {
                tracing::error!(detail, "internal error");
                (StatusCode::INTERNAL_SERVER_ERROR, "internal", "Internal error", detail.clone())
            }
        }
    }
}

/// An error as gRPC gives it: a status code, the stable problem type (`urn:holdfast:<slug>`), the detail,
/// and for a busy lock the holder when known. A unary call's status and a `Calls` stream's `CallError`
/// both carry these.
pub struct GrpcError {
    pub code: tonic::Code,
    pub problem: String,
    pub detail: String,
    pub holder: Option<holdfast_proto::v1::Holder>,
}

impl From<ApiError> for GrpcError {
    fn from(e: ApiError) -> Self {
        let (_, slug, _, detail) = e.describe();
        let code = match e {
            ApiError::Invalid { .. } => tonic::Code::InvalidArgument,
            ApiError::Busy { .. } => tonic::Code::AlreadyExists,
            ApiError::NotHolder { .. } | ApiError::Expired { .. } => tonic::Code::FailedPrecondition,
            ApiError::NotFound { .. } | ApiError::SessionGone { .. } => tonic::Code::NotFound,
            ApiError::Conflict { .. } => tonic::Code::FailedPrecondition,
            ApiError::Unauthenticated { .. } => tonic::Code::Unauthenticated,
            ApiError::Forbidden { .. } => tonic::Code::PermissionDenied,
            ApiError::Limit { .. } => tonic::Code::ResourceExhausted,
            ApiError::Unavailable { .. } => tonic::Code::Unavailable,
            ApiError::NoRoute | ApiError::NoMethod => tonic::Code::Unimplemented,
            ApiError::Internal { .. } => tonic::Code::Internal,
        };
        let holder = match &e {
            ApiError::Busy { holder: Some(holder), .. } => Some(crate::grpc::holder(holder)),
            _ => None,
        };
        GrpcError { code, problem: format!("urn:holdfast:{slug}"), detail, holder }
    }
}

/// The gRPC mapping: a status code, the detail as message, and the stable problem type in the
/// `holdfast-problem` metadata entry (and a busy lock's holder in `holdfast-holder-bin`).
impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        let e = GrpcError::from(e);
        let mut metadata = tonic::metadata::MetadataMap::new();
        metadata.insert(PROBLEM_METADATA, e.problem.parse().expect("problem types are ASCII"));
        if let Some(holder) = &e.holder {
            let bytes = prost::Message::encode_to_vec(holder);
            metadata.insert_bin(HOLDER_METADATA, tonic::metadata::MetadataValue::from_bytes(&bytes));
        }
        tonic::Status::with_metadata(e.code, e.detail, metadata)
    }
}

/// The gRPC metadata entry that carries an error's problem type.
pub const PROBLEM_METADATA: &str = "holdfast-problem";
/// The gRPC binary metadata entry that carries, with a busy answer, who holds the lock (a `Holder` message).
pub const HOLDER_METADATA: &str = "holdfast-holder-bin";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, slug, title, detail) = self.describe();
        let mut body = json!({
            "type": format!("urn:holdfast:{slug}"),
            "title": title,
            "status": status.as_u16(),
            "detail": detail,
        });
        let mut retry_after = None;
        if let ApiError::Busy { holder, .. } = &self {
            body["holder"] = holder.as_ref().map(holder_json).unwrap_or(serde_json::Value::Null);
            retry_after = Some(holder.as_ref().map(retry_after_s).unwrap_or(1));
        }
        if let ApiError::Limit { .. } | ApiError::Unavailable { .. } = &self {
            retry_after = Some(1);
        }
        let mut response = (status, body.to_string()).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if let Some(seconds) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
