//! The unary calls, each as its HTTP twin: parse, call the API, shape the answer.

use std::sync::Arc;

use holdfast_proto::v1::{
    self, AcquireRequest, GetRequest, Hold, ReleaseRequest, ReleaseResponse, RenewRequest, SetValueRequest,
};

use super::request::{or_anonymous, ttl_or_default};
use crate::api::auth;
use crate::api::error::ApiError;
use crate::api::locks::AcquireArgs;
use crate::api::{locks, Api};
use crate::front::proto::{hold, lock};

pub async fn acquire(api: &Arc<Api>, scope: &auth::Scope, r: AcquireRequest) -> Result<Hold, ApiError> {
    let ttl_ms = ttl_or_default(api, r.ttl_ms);
    let args = AcquireArgs {
        name: r.name,
        owner: or_anonymous(r.owner),
        ttl_ms,
        wait_ms: r.wait_ms,
        value: r.value,
        lock_delay_ms: r.lock_delay_ms,
        // Unset (0) is a lock, as 1 is.
        limit: r.limit.max(1),
    };
    let grant = locks::acquire(api, scope, args).await?;
    Ok(hold(&grant))
}

pub async fn set_value(api: &Arc<Api>, scope: &auth::Scope, r: SetValueRequest) -> Result<Hold, ApiError> {
    let grant = locks::set_value(api, scope, r.name, locks::parse_token(&r.token)?, r.value).await?;
    Ok(hold(&grant))
}

pub async fn renew(api: &Arc<Api>, scope: &auth::Scope, r: RenewRequest) -> Result<Hold, ApiError> {
    let ttl_ms = (r.ttl_ms != 0).then_some(r.ttl_ms);
    let grant = locks::renew(api, scope, r.name, locks::parse_token(&r.token)?, ttl_ms).await?;
    Ok(hold(&grant))
}

pub async fn release(api: &Arc<Api>, scope: &auth::Scope, r: ReleaseRequest) -> Result<ReleaseResponse, ApiError> {
    let (name, fence) = locks::release(api, scope, r.name, locks::parse_token(&r.token)?).await?;
    Ok(ReleaseResponse { name, fence })
}

pub async fn get(api: &Arc<Api>, scope: &auth::Scope, r: GetRequest) -> Result<v1::Lock, ApiError> {
    Ok(lock(&locks::get(api, scope, r.name).await?))
}
