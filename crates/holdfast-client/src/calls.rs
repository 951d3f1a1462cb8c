//! One-shot calls multiplexed on one `Calls` stream per node (`proto/holdfast/v1/locks.proto`).
//!
//! A unary gRPC call costs both ends an HTTP/2 stream of its own (headers, trailers, a task on the
//! server, a trip through the channel's buffer task here); on a `Calls` stream a call is one message each
//! way. The pool opens a node's stream with its first one-shot call (which travels with the opening) and
//! keeps it; a task reads the answers and hands each to the call waiting under its id. A call given up
//! (its attempt timed out, its future dropped) is cancelled on the stream, as a unary call's stream would
//! be reset. When the stream fails, every call waiting on it fails as a unary call on a broken connection
//! does, and the next call opens a new one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use holdfast_proto::v1::{Call, CallError, CallKind, Cancel, ResultKind};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status, Streaming};

use crate::error::{HOLDER_METADATA, PROBLEM_METADATA};
use crate::pool::NodeClient;

type Answer = Result<ResultKind, Status>;

/// A `Calls` stream to one node.
pub(crate) struct CallStream {
    /// The stream's requests; dropping the last sender ends the client's side (the node then answers the
    /// calls outstanding and ends the stream).
    tx: mpsc::UnboundedSender<Call>,
    waiting: Arc<Mutex<Waiting>>,
    next_id: AtomicU64,
}

/// The calls waiting for their answers, shared with the task that reads them.
#[derive(Default)]
struct Waiting {
    calls: HashMap<u64, oneshot::Sender<Answer>>,
    /// The node accepted the stream (its answer's headers came).
    opened: bool,
    /// Why the stream ended, once it has: no call may wait on it any more.
    ended: Option<Status>,
}

impl CallStream {
    /// Opens a `Calls` stream on `client`'s node. Calls may be sent at once: the first travels with the
    /// stream's opening, so it costs no extra round trip. If the node refuses the stream, the calls on it
    /// fail with its status, and [`refused`](Self::refused) says so (`UNIMPLEMENTED`: an older server).
    pub(crate) fn open(mut client: NodeClient) -> CallStream {
        let (tx, rx) = mpsc::unbounded_channel();
        let waiting = Arc::new(Mutex::new(Waiting::default()));
        let shared = waiting.clone();
        tokio::spawn(async move {
            let status = match client.calls(UnboundedReceiverStream::new(rx)).await {
                Ok(answers) => {
                    shared.lock().expect("calls poisoned").opened = true;
                    read_answers(answers.into_inner(), &shared).await
                }
                Err(status) => status,
            };
            tracing::debug!(%status, "calls stream ended");
            let calls = {
                let mut waiting = shared.lock().expect("calls poisoned");
                waiting.ended = Some(ended(&status));
                std::mem::take(&mut waiting.calls)
            };
            // Dropping their senders wakes them; each reads why from `ended`.
            drop(calls);
        });
        CallStream { tx, waiting, next_id: AtomicU64::new(1) }
    }

    /// Whether the stream ended (a call on it would fail at once).
    pub(crate) fn ended(&self) -> bool {
        self.waiting.lock().expect("calls poisoned").ended.is_some()
    }

    /// Whether the node accepted the stream; until it has, a call on it may still fail with the node's
    /// refusal.
    pub(crate) fn opened(&self) -> bool {
        self.waiting.lock().expect("calls poisoned").opened
    }

    /// Whether the node refused the stream: it ended without being accepted.
    pub(crate) fn refused(&self) -> bool {
        let waiting = self.waiting.lock().expect("calls poisoned");
        waiting.ended.is_some() && !waiting.opened
    }

    /// Sends one call and waits for its answer: the answer's kind, or the status the unary call would have
    /// failed with. Dropping the future cancels the call.
    pub(crate) async fn call(&self, kind: CallKind) -> Answer {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer_tx, answer) = oneshot::channel();
        {
            let mut waiting = self.waiting.lock().expect("calls poisoned");
            if let Some(status) = &waiting.ended {
                return Err(ended(status));
            }
            waiting.calls.insert(id, answer_tx);
        }
        let mut cancel = CancelOnDrop { stream: self, id: Some(id) };
        if self.tx.send(Call { id, kind: Some(kind) }).is_err() {
            return Err(Status::unavailable("the calls stream is closed"));
        }
        let answer = answer.await;
        cancel.id = None;
        // Dropped unanswered only when the stream ended, after recording why.
        answer.unwrap_or_else(|_| {
            let waiting = self.waiting.lock().expect("calls poisoned");
            Err(waiting.ended.as_ref().map_or_else(|| Status::unavailable("the calls stream ended"), ended))
        })
    }
}

/// Cancels call `id` on the stream unless it was answered.
struct CancelOnDrop<'a> {
    stream: &'a CallStream,
    id: Option<u64>,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        let Some(id) = self.id else { return };
        let outstanding = self.stream.waiting.lock().expect("calls poisoned").calls.remove(&id).is_some();
        if outstanding {
            let _ = self.stream.tx.send(Call { id, kind: Some(CallKind::Cancel(Cancel {})) });
        }
    }
}

/// A status for a call on a stream that ended with `status`: the same code and message, and the transport
/// error (if any) in the message, since a `Status` cannot be cloned with its source.
fn ended(status: &Status) -> Status {
    let mut text = format!("the calls stream ended: {}", status.message());
    let source = std::error::Error::source(status);
    if let Some(source) = source {
        text.push_str(&format!(": {source}"));
    }
    // A stream cut off by a transport failure says nothing about the calls on it: as for a unary call's
    // transport failure (see `Error`'s `From<Status>`), they are unavailable, their outcome unknown.
    let code = match status.code() {
        Code::Unknown | Code::Internal | Code::Cancelled if source.is_some() => Code::Unavailable,
        code => code,
    };
    Status::new(code, text)
}

/// Hands each answer on `answers` to the call waiting under its id, until the stream ends; returns why it
/// ended.
async fn read_answers(mut answers: Streaming<holdfast_proto::v1::CallResult>, waiting: &Mutex<Waiting>) -> Status {
    loop {
        match answers.message().await {
            Ok(Some(result)) => {
                let answer = match result.kind {
                    Some(ResultKind::Error(e)) => Err(status(e)),
                    Some(kind) => Ok(kind),
                    None => Err(Status::internal("an answer with no kind")),
                };
                let call = waiting.lock().expect("calls poisoned").calls.remove(&result.id);
                // No call waits under an id it gave up (cancelled); its late answer is dropped.
                if let Some(call) = call {
                    let _ = call.send(answer);
                }
            }
            Ok(None) => return Status::unavailable("the node ended the calls stream"),
            Err(status) => return status,
        }
    }
}

/// The status a unary call would have failed with, from a call's error: the same code, message, problem
/// type and holder metadata, so that one conversion ([`crate::Error`]'s `From<Status>`) reads both.
pub(crate) fn status(e: CallError) -> Status {
    let mut metadata = MetadataMap::new();
    if let Ok(problem) = e.problem.parse() {
        metadata.insert(PROBLEM_METADATA, problem);
    }
    if let Some(holder) = e.holder {
        let bytes = prost::Message::encode_to_vec(&holder);
        metadata.insert_bin(HOLDER_METADATA, MetadataValue::from_bytes(&bytes));
    }
    Status::with_metadata(Code::from_i32(e.code), e.message, metadata)
}
