//! ① The live page on the client port (`GET /`): who holds what, who waits, and the cluster, updated as
//! locks change. One HTML file, one script and one style sheet, built into the binary: no build step and
//! nothing loaded from outside the node, so it works air-gapped and under the strict
//! [`CONTENT_SECURITY_POLICY`] it is served with. The script reads only the public API (`/v1/cluster`,
//! `/readyz`, `/v1/locks`, `/v1/watch`) with the API key the user types (under `--auth`), so it shows what
//! that key may read and nothing else: no tokens, no session secrets (the API never shows them).

use axum::http::header::{self, HeaderName};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use std::sync::Arc;

use crate::api::Api;

const INDEX_HTML: &str = include_str!("index.html");
const PAGE_JS: &str = include_str!("page.js");
const PAGE_CSS: &str = include_str!("page.css");

/// The page and its assets may load and connect to this node only; no inline script or style, no frames,
/// no forms sent anywhere.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /` and its two assets.
pub fn routes() -> Router<Arc<Api>> {
    Router::new()
        .route("/", get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }))
        .route("/ui/page.js", get(|| async { asset("text/javascript; charset=utf-8", PAGE_JS) }))
        .route("/ui/page.css", get(|| async { asset("text/css; charset=utf-8", PAGE_CSS) }))
}

/// `body` as `content_type`, with the headers that keep it to itself: the CSP, no sniffing, no referrer,
/// and no caching (a node upgraded in place serves its own page at once).
fn asset(content_type: &'static str, body: &'static str) -> Response {
    let headers: [(HeaderName, &'static str); 5] = [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-cache"),
    ];
    (headers, body).into_response()
}
