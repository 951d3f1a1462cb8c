//! ① Front: the client port's two ways in, HTTP/JSON and gRPC, served side by side, and the health
//! endpoints. A front parses a request, calls the API, and shapes the answer; nothing else.
//!
//! - [`http`]: routes, handlers, parameters, and the listener that tells where a request came from.
//! - [`grpc`]: the `Locks` service: unary calls, the `Calls` stream, sessions.
//! - [`health`]: `/livez`, `/readyz`, `/metrics`, `grpc.health.v1`, request metrics, systemd.
//! - [`page`]: the live page of who holds what (`GET /`).
//! - [`problem`]: how an API error becomes an HTTP problem document and a gRPC status (one place each).
//! - [`json`], [`proto`]: the shapes of answers on each transport.
//!
//! The top folder: it imports `api` (and, for session streams, the types of `apply` and `peer`), never
//! the other way round.

pub mod grpc;
pub mod health;
pub mod http;
pub mod json;
pub mod page;
pub mod problem;
pub mod proto;

use std::sync::Arc;

use tonic_health::server::HealthReporter;

use crate::api::Api;

/// The client port's whole service: the HTTP routes, the `Locks` gRPC service and `grpc.health.v1`, every
/// request counted by [`health::track`]. Also answers the reporter that sets the gRPC health status.
pub fn app(api: Arc<Api>) -> (axum::Router, HealthReporter) {
    let (reporter, health_service) = tonic_health::server::health_reporter();
    // Malformed request messages answered INVALID_ARGUMENT `invalid-message`, not tonic's INTERNAL.
    let locks = grpc::service(api.clone());
    let app = http::router(api.clone())
        .route_service("/holdfast.v1.Locks/{*method}", locks)
        .route_service("/grpc.health.v1.Health/{*method}", health_service)
        .layer(axum::middleware::from_fn_with_state(api.metrics().clone(), health::track));
    (app, reporter)
}
