//! What the gRPC front makes of a request before the API sees it: malformed messages refused as bad
//! input, and the defaults of fields left empty.

use tonic::Status;

use crate::api::error::ApiError;
use crate::api::locks::TTL_MS_DEFAULT;
use crate::api::Api;

/// tonic's refusal of a malformed request message (see `WellFormed`) as the API answers bad input; `None`
/// for any other status (the client went away, or cancelled).
pub fn malformed(status: &Status) -> Option<Status> {
    if !matches!(status.code(), tonic::Code::Internal | tonic::Code::OutOfRange) {
        return None;
    }
    let detail = format!("the request is not one well-formed message of this call: {}", status.message());
    Some(ApiError::invalid("invalid-message", detail).into())
}

/// An acquire's TTL: as given, or for `0` the default, within the server's bounds.
pub fn ttl_or_default(api: &Api, ttl_ms: u64) -> u64 {
    let limits = api.limits();
    if ttl_ms == 0 {
        TTL_MS_DEFAULT.clamp(limits.ttl_ms_min, limits.ttl_ms_max)
    } else {
        ttl_ms
    }
}

pub fn or_anonymous(owner: String) -> String {
    if owner.is_empty() {
        "anonymous".into()
    } else {
        owner
    }
}
