//! The `Calls` stream: the one-shot calls (acquire, renew, release, get, set value) multiplexed on one gRPC stream.
//!
//! A unary call costs the node an HTTP/2 stream of its own: headers to decode and encode, a task, the
//! router and the middleware, trailers. On a `Calls` stream a call is one message each way. Each call runs
//! exactly as its unary twin ([`super::one_shot`]), concurrently with the stream's other calls, and its answer is sent
//! when it is done, in any order, under the id the client gave it.
//!
//! The stream is driven by whoever polls its answers (hyper, sending the response body): no task of its own
//! and none per call. A batch of answers applied together wakes it once.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures_util::future::{abortable, AbortHandle};
use futures_util::stream::FuturesUnordered;
use holdfast_proto::v1::{Call, CallError, CallKind, CallResult, ResultKind};
use tokio_stream::Stream;
use tonic::{Status, Streaming};

use super::one_shot;
use crate::api::auth::Scope;
use crate::api::error::ApiError;
use crate::api::Api;
use crate::front::problem::GrpcError;
use crate::metrics;

/// Calls of one stream outstanding at once, at most; the stream reads no further call until one is done.
pub const CALLS_MAX: usize = 1024;

/// A call running: its id, its sequence number on the stream, and its answer (`None` if it was cancelled).
type Running = Pin<Box<dyn Future<Output = (u64, u64, Option<CallResult>)> + Send>>;

/// The answers of one `Calls` stream, as a stream: reading it reads the calls and runs them.
pub struct CallStream {
    api: Arc<Api>,
    scope: Arc<Scope>,
    inbound: Streaming<Call>,
    /// The client ended its side (or it failed): no more calls.
    inbound_done: bool,
    running: FuturesUnordered<Running>,
    /// The calls outstanding, by id: the sequence number each was started with and what cancels it.
    outstanding: HashMap<u64, (u64, AbortHandle)>,
    started: u64,
}

impl CallStream {
    /// The answers to the calls read from `inbound`, each run under `scope` (the stream's authentication).
    pub fn new(api: Arc<Api>, scope: Scope, inbound: Streaming<Call>) -> Self {
        CallStream {
            api,
            scope: Arc::new(scope),
            inbound,
            inbound_done: false,
            running: FuturesUnordered::new(),
            outstanding: HashMap::new(),
            started: 0,
        }
    }

    /// Starts `call`, or cancels the call it names. A protocol error ends the stream.
    fn start(&mut self, call: Call) -> Result<(), Status> {
        let id = call.id;
        let kind = match call.kind {
            Some(CallKind::Cancel(_)) => {
                if let Some((_, cancel)) = self.outstanding.remove(&id) {
                    cancel.abort();
                }
                return Ok(());
            }
            other => other,
        };
        if self.outstanding.contains_key(&id) {
            let detail = format!("call id {id} is already outstanding on this stream");
            return Err(ApiError::invalid("invalid-call", detail).into());
        }
        self.started += 1;
        let seq = self.started;
        let (api, scope) = (self.api.clone(), self.scope.clone());
        let (answer, cancel) = abortable(async move {
            let began = Instant::now();
            let (endpoint, answer) = run(&api, &scope, kind).await;
            let code = match &answer {
                ResultKind::Error(e) => e.code,
                _ => 0,
            };
            api.metrics().request(metrics::Api::Grpc, endpoint, code as u16, began.elapsed());
            CallResult { id, kind: Some(answer) }
        });
        self.outstanding.insert(id, (seq, cancel));
        self.running.push(Box::pin(async move { (id, seq, answer.await.ok()) }));
        Ok(())
    }

    /// Reads no more calls and drops the running ones: the stream ends.
    fn abandon(&mut self) {
        self.inbound_done = true;
        self.running.clear();
        self.outstanding.clear();
    }
}

impl Stream for CallStream {
    type Item = Result<CallResult, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        while !this.inbound_done && this.running.len() < CALLS_MAX {
            match Pin::new(&mut this.inbound).poll_next(cx) {
                Poll::Ready(Some(Ok(call))) => {
                    if let Err(status) = this.start(call) {
                        this.abandon();
                        return Poll::Ready(Some(Err(status)));
                    }
                }
                // A Call that does not decode: the stream ends with bad input, so that the client knows the
                // calls outstanding have unknown outcomes (ending it cleanly would say nothing of them).
                Poll::Ready(Some(Err(status))) => {
                    this.abandon();
                    if let Some(invalid) = super::request::malformed(&status) {
                        return Poll::Ready(Some(Err(invalid)));
                    }
                    // Otherwise the client's side failed: nobody is left to read the answers.
                }
                Poll::Ready(None) => this.inbound_done = true,
                Poll::Pending => break,
            }
        }
        loop {
            match Pin::new(&mut this.running).poll_next(cx) {
                Poll::Ready(Some((id, seq, answer))) => {
                    // A call cancelled (or cancelled and its id reused) is no longer outstanding under `seq`.
                    if this.outstanding.get(&id).is_none_or(|(s, _)| *s != seq) {
                        continue;
                    }
                    this.outstanding.remove(&id);
                    if let Some(answer) = answer {
                        return Poll::Ready(Some(Ok(answer)));
                    }
                }
                Poll::Ready(None) if this.inbound_done => return Poll::Ready(None),
                _ => return Poll::Pending,
            }
        }
    }
}

/// Runs one call as its unary twin would, returning the metrics endpoint it counts under and its answer.
async fn run(api: &Arc<Api>, scope: &Scope, kind: Option<CallKind>) -> (&'static str, ResultKind) {
    let endpoint = match &kind {
        Some(CallKind::Acquire(_)) => "/holdfast.v1.Locks/Calls/Acquire",
        Some(CallKind::Renew(_)) => "/holdfast.v1.Locks/Calls/Renew",
        Some(CallKind::Release(_)) => "/holdfast.v1.Locks/Calls/Release",
        Some(CallKind::Get(_)) => "/holdfast.v1.Locks/Calls/Get",
        Some(CallKind::SetValue(_)) => "/holdfast.v1.Locks/Calls/SetValue",
        Some(CallKind::Cancel(_)) | None => "unmatched",
    };
    // Each call is admitted as a unary call is: not under a key revoked since the stream opened, and within
    // the key's request budget.
    let answer = match api.admit(scope) {
        // Boxed as a `dyn` future: the layout of the ops' futures nested in the call's is too deep to compute.
        Ok(()) => {
            let answer: Pin<Box<dyn Future<Output = Result<ResultKind, ApiError>> + Send + '_>> =
                Box::pin(answer(api, scope, kind));
            answer.await
        }
        Err(e) => Err(e),
    };
    (endpoint, answer.unwrap_or_else(|e| ResultKind::Error(call_error(e))))
}

async fn answer(api: &Arc<Api>, scope: &Scope, kind: Option<CallKind>) -> Result<ResultKind, ApiError> {
    match kind {
        Some(CallKind::Acquire(r)) => Ok(ResultKind::Hold(one_shot::acquire(api, scope, r).await?)),
        Some(CallKind::Renew(r)) => Ok(ResultKind::Hold(one_shot::renew(api, scope, r).await?)),
        Some(CallKind::Release(r)) => Ok(ResultKind::Released(one_shot::release(api, scope, r).await?)),
        Some(CallKind::Get(r)) => Ok(ResultKind::Lock(one_shot::get(api, scope, r).await?)),
        Some(CallKind::SetValue(r)) => Ok(ResultKind::Hold(one_shot::set_value(api, scope, r).await?)),
        Some(CallKind::Cancel(_)) | None => {
            Err(ApiError::invalid("invalid-call", "a call with no kind, or a kind this server does not know".into()))
        }
    }
}

fn call_error(e: ApiError) -> CallError {
    let e = GrpcError::from(e);
    CallError { code: e.code as i32, message: e.detail, problem: e.problem, holder: e.holder }
}
