//! Problems: how an [`ApiError`] becomes an HTTP answer (an RFC 9457 `application/problem+json` body with
//! its status) and a gRPC status (its code, with the problem type in metadata). The one place each
//! transport's codes are chosen.

use axum::extract::path::ErrorKind;
use axum::extract::rejection::PathRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::json::{holder_json, retry_after_s};
use crate::api::error::ApiError;

/// The HTTP status of `e`.
fn http_status(e: &ApiError) -> StatusCode {
    match e {
        ApiError::Invalid { .. } => StatusCode::BAD_REQUEST,
        ApiError::Busy { .. } | ApiError::NotHolder { .. } | ApiError::Conflict { .. } => StatusCode::CONFLICT,
        ApiError::Expired { .. } => StatusCode::GONE,
        ApiError::NotFound { .. } | ApiError::SessionGone { .. } | ApiError::NoRoute => StatusCode::NOT_FOUND,
        ApiError::Limit { .. } => StatusCode::TOO_MANY_REQUESTS,
        ApiError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        ApiError::Unauthenticated { .. } => StatusCode::UNAUTHORIZED,
        ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
        ApiError::NoMethod => StatusCode::METHOD_NOT_ALLOWED,
        ApiError::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A path parameter axum could not extract: bad input (`slug`) when the client sent it (`what`, not
/// UTF-8 once percent-decoded), a bug when the route's parameters do not fit its handler.
pub fn path_rejection(slug: &'static str, what: &str, rejection: PathRejection) -> ApiError {
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
        let (slug, _, detail) = e.describe();
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
            ApiError::Busy { holder: Some(holder), .. } => Some(super::proto::holder(holder)),
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

/// The problem document of `e` (RFC 9457): its type, title, HTTP status and detail, and a busy lock's
/// holder.
pub fn problem_json(e: &ApiError) -> serde_json::Value {
    let (slug, title, detail) = e.describe();
    let mut body = json!({
        "type": format!("urn:holdfast:{slug}"),
        "title": title,
        "status": http_status(e).as_u16(),
        "detail": detail,
    });
    if let ApiError::Busy { holder, .. } = e {
        body["holder"] = holder.as_ref().map(holder_json).unwrap_or(serde_json::Value::Null);
    }
    body
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = http_status(&self);
        let body = problem_json(&self);
        let mut retry_after = None;
        if let ApiError::Busy { holder, .. } = &self {
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
