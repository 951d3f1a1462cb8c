//! `GET /v1/watch`: a prefix watch as server-sent events (`text/event-stream`), the HTTP twin of the gRPC
//! `Watch` stream. `curl -N` reads it; the live page (`GET /`) reads it with `fetch`, which can send an API
//! key where `EventSource` cannot.
//!
//! Each change is one event, `event: lock`, its `id` the lock's revision and its `data` the lock as a
//! watch shows it ([`watched_json`]) with `initial`. When the stream falls behind this node's apply, it
//! ends with `event: behind` (a problem document): the client watches again after the last `id` it saw.
//! A comment every [`KEEP_ALIVE`] keeps proxies from closing an idle stream.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::params::{Credentials, Params, Parsed};
use crate::api::error::ApiError;
use crate::api::locks::{self, WatchStream};
use crate::api::Api;
use crate::front::json::watched_json;
use crate::front::problem::problem_json;

/// How often an idle stream sends a comment.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// `GET /v1/watch?prefix=P&after=REVISION`: every lock under `prefix` changed since `after` (0: those held
/// now and those freed lately), then each change as it is applied.
pub async fn watch(
    State(api): State<Arc<Api>>,
    Credentials(authorization): Credentials,
    params: Params,
) -> Result<Response, ApiError> {
    let scope = api.authenticate(authorization.as_deref()).await?;
    let p = Parsed::new(&params, &["prefix", "after"])?;
    let prefix = p.get("prefix").unwrap_or("").to_owned();
    let after = p.revision()?.unwrap_or(0);
    let watch = locks::watch_prefix_stream(&api, &scope, prefix, after).await?;
    let events = futures_util::stream::unfold(Some(watch), next_event);
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)).into_response())
}

/// The next event of `watch`, and the watch again unless it just ended.
async fn next_event(
    watch: Option<WatchStream>,
) -> Option<(Result<Event, std::convert::Infallible>, Option<WatchStream>)> {
    let mut watch = watch?;
    match watch.next().await {
        Some(note) => {
            let mut data = watched_json(&note.watched);
            data["initial"] = json!(note.initial);
            let event = Event::default().event("lock").id(note.watched.revision.to_string()).data(data.to_string());
            Some((Ok(event), Some(watch)))
        }
        // The stream fell behind this node's apply (or the node stops): the client resumes.
        None => {
            let detail = "the watch fell behind the changes; watch again after the last id seen".to_owned();
            let problem = problem_json(&ApiError::Limit { slug: "watch-behind", detail });
            Some((Ok(Event::default().event("behind").data(problem.to_string())), None))
        }
    }
}
