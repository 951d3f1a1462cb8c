//! ① The gRPC API on the client port (`proto/holdfast/v1/locks.proto`): one-shot calls, the `Calls`
//! stream and lock sessions.
//!
//! - [`one_shot`]: the unary calls, each as its HTTP twin through the API.
//! - [`calls`]: the `Calls` stream, one-shot calls multiplexed on one stream.
//! - [`session`]: the session stream, a connection that owns its claims.

pub mod calls;
pub mod one_shot;
pub mod request;
pub mod session;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use holdfast_proto::v1::{
    self, AcquireRequest, AddMemberRequest, Call, ClusterStatusRequest, ClusterStatusResponse, GetRequest, Hold,
    ListRequest, ListResponse, Locks, LocksServer, ReleaseRequest, ReleaseResponse, RemoveMemberRequest, RenewRequest,
    SessionRequest, SetValueRequest, SnapshotRequest, SnapshotResponse, WatchEvent, WatchRequest,
};
use tokio_stream::{Stream, StreamExt};
use tonic::codegen::{http, Service};
use tonic::{Request as GrpcRequest, Response as GrpcResponse, Status, Streaming};

use self::calls::CallStream;
use self::request::malformed;
use self::session::{EventStream, SESSION_OUTBOX};
use super::proto::{lock, watched_lock};
use crate::api::error::ApiError;
use crate::api::locks::PAGE_DEFAULT;
use crate::api::{admin, locks, Api};

/// The `Locks` service.
pub struct LocksService {
    pub api: Arc<Api>,
}

/// The `Locks` service as the client port serves it: [`LocksServer`] with [`WellFormed`] requests.
pub fn service(api: Arc<Api>) -> WellFormed<LocksServer<LocksService>> {
    WellFormed(LocksServer::new(LocksService { api }))
}

/// A gRPC service whose refusals of malformed request bodies are answered as the API documents bad input.
///
/// tonic decodes a unary call's request before any handler runs, and refuses a body that is not one
/// well-formed message by itself: INTERNAL when the message does not decode as protobuf (invalid UTF-8 in
/// a string, a cut varint, a bad tag), when its frame is cut short or flagged compressed, or when there is
/// none; OUT_OF_RANGE when it is larger than tonic takes. Clients read INTERNAL as a bug in holdfast, and
/// neither carries the problem type every other error has (`tests/fuzz_fronts.rs` sends them): such an answer,
/// a status in the headers without a `holdfast-problem`, becomes INVALID_ARGUMENT `invalid-message`.
#[derive(Clone)]
pub struct WellFormed<S>(S);

impl<S, B> Service<http::Request<B>> for WellFormed<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let answer = self.0.call(request);
        Box::pin(async move { Ok(malformed_as_invalid(answer.await?)) })
    }
}

fn malformed_as_invalid(response: http::Response<tonic::body::Body>) -> http::Response<tonic::body::Body> {
    if response.headers().contains_key(crate::front::problem::PROBLEM_METADATA) {
        return response;
    }
    match Status::from_header_map(response.headers()).and_then(|status| malformed(&status)) {
        Some(invalid) => invalid.into_http(),
        None => response,
    }
}

#[tonic::async_trait]
impl Locks for LocksService {
    type SessionStream = EventStream;
    type CallsStream = CallStream;
    type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, Status>> + Send>>;

    async fn session(
        &self,
        request: GrpcRequest<Streaming<SessionRequest>>,
    ) -> Result<GrpcResponse<Self::SessionStream>, Status> {
        let scope = self.api.authenticate(authorization(&request)).await?;
        let (tx, rx) = futures_channel::mpsc::channel(SESSION_OUTBOX);
        let start = session::Start { api: self.api.clone(), scope, inbound: request.into_inner(), tx };
        tokio::spawn(session::serve_session(Box::new(start)));
        Ok(GrpcResponse::new(Box::pin(rx.map(|event| *event))))
    }

    async fn acquire(&self, request: GrpcRequest<AcquireRequest>) -> Result<GrpcResponse<Hold>, Status> {
        let scope = self.api.authenticate(authorization(&request)).await?;
        Ok(GrpcResponse::new(one_shot::acquire(&self.api, &scope, request.into_inner()).await?))
    }

    async fn renew(&self, request: GrpcRequest<RenewRequest>) -> Result<GrpcResponse<Hold>, Status> {
        let scope = self.api.authenticate(authorization(&request)).await?;
        Ok(GrpcResponse::new(one_shot::renew(&self.api, &scope, request.into_inner()).await?))
    }

    async fn release(&self, request: GrpcRequest<ReleaseRequest>) -> Result<GrpcResponse<ReleaseResponse>, Status> {
        let scope = self.api.authenticate(authorization(&request)).await?;
        Ok(GrpcResponse::new(one_shot::release(&self.api, &scope, request.into_inner()).await?))
    }

    async fn set_value(&self, request: GrpcRequest<SetValueRequest>) -> Result<GrpcResponse<Hold>, Status> {
        let scope = self.api.authenticate(authorization(&request)).await?;
        Ok(GrpcResponse::new(one_shot::set_value(&self.api, &scope, request.into_inner()).await?))
    }

    async fn watch(&self, request: GrpcRequest<WatchRequest>) -> Result<GrpcResponse<Self::WatchStream>, Status> {
        let scope = self.api.authenticate(authorization(&request)).await?;
        let r = request.into_inner();
        let watch = match r.prefix {
            Some(_) if !r.name.is_empty() => {
                let detail = "a watch names a lock or a prefix, not both".to_owned();
                return Err(ApiError::invalid("invalid-query", detail).into());
            }
            Some(prefix) => locks::watch_prefix_stream(&self.api, &scope, prefix, r.after).await?,
            None => locks::watch_stream(&self.api, &scope, r.name, r.after).await?,
        };
        let events = futures_util::stream::unfold((Some(watch), ()), |(watch, ())| async move {
            let mut watch = watch?;
            match watch.next().await {
                Some(note) => {
                    let event = WatchEvent { lock: Some(watched_lock(&note.watched)), initial: note.initial };
                    Some((Ok(event), (Some(watch), ())))
                }
                // The stream fell behind this node's apply (or the node stops): the client resumes.
                None => {
                    let detail = "the watch fell behind the changes; watch again from the last revision seen";
                    Some((Err(ApiError::Limit { slug: "watch-behind", detail: detail.into() }.into()), (None, ())))
                }
            }
        });
        Ok(GrpcResponse::new(Box::pin(events)))
    }

    async fn calls(&self, request: GrpcRequest<Streaming<Call>>) -> Result<GrpcResponse<CallStream>, Status> {
        let scope = self.api.authenticate(authorization(&request)).await?;
        Ok(GrpcResponse::new(CallStream::new(self.api.clone(), scope, request.into_inner())))
    }

    async fn get(&self, request: GrpcRequest<GetRequest>) -> Result<GrpcResponse<v1::Lock>, Status> {
        let scope = self.api.authenticate(authorization(&request)).await?;
        Ok(GrpcResponse::new(one_shot::get(&self.api, &scope, request.into_inner()).await?))
    }

    async fn list(&self, request: GrpcRequest<ListRequest>) -> Result<GrpcResponse<ListResponse>, Status> {
        let scope = self.api.authenticate(authorization(&request)).await?;
        let r = request.into_inner();
        let limit = if r.limit == 0 { PAGE_DEFAULT } else { r.limit as usize };
        let after = (!r.after.is_empty()).then_some(r.after);
        let page = locks::list(&self.api, &scope, r.prefix, after, limit).await?;
        Ok(GrpcResponse::new(ListResponse {
            locks: page.locks.iter().map(lock).collect(),
            next: page.next.unwrap_or_default(),
            revision: page.revision,
        }))
    }

    async fn cluster_status(
        &self,
        _request: GrpcRequest<ClusterStatusRequest>,
    ) -> Result<GrpcResponse<ClusterStatusResponse>, Status> {
        Ok(GrpcResponse::new(self.status()))
    }

    async fn add_member(
        &self,
        request: GrpcRequest<AddMemberRequest>,
    ) -> Result<GrpcResponse<ClusterStatusResponse>, Status> {
        admin::check_admin(&self.api, caller(&request))?;
        let r = request.into_inner();
        admin::add_member(&self.api, r.id, &r.addr).await?;
        Ok(GrpcResponse::new(self.status()))
    }

    async fn remove_member(
        &self,
        request: GrpcRequest<RemoveMemberRequest>,
    ) -> Result<GrpcResponse<ClusterStatusResponse>, Status> {
        admin::check_admin(&self.api, caller(&request))?;
        admin::remove_member(&self.api, request.into_inner().id).await?;
        Ok(GrpcResponse::new(self.status()))
    }

    async fn snapshot(&self, request: GrpcRequest<SnapshotRequest>) -> Result<GrpcResponse<SnapshotResponse>, Status> {
        admin::check_admin(&self.api, caller(&request))?;
        let (snapshot_index, snapshot_bytes) = admin::snapshot(&self.api).await?;
        Ok(GrpcResponse::new(SnapshotResponse { id: self.api.id(), snapshot_index, snapshot_bytes }))
    }
}

fn authorization<T>(request: &GrpcRequest<T>) -> Option<&str> {
    request.metadata().get("authorization").and_then(|v| v.to_str().ok())
}

/// Who makes an admin call: its `authorization` metadata and the address its connection came from.
fn caller<T>(request: &GrpcRequest<T>) -> admin::Caller<'_> {
    admin::Caller {
        authorization: authorization(request),
        peer: crate::front::http::port::peer_ip(request.extensions()),
    }
}

impl LocksService {
    /// This node's view of the cluster.
    fn status(&self) -> ClusterStatusResponse {
        let view = self.api.cluster();
        ClusterStatusResponse {
            id: view.id,
            leader: view.leader.unwrap_or(0),
            term: view.term,
            state: view.state,
            members: view.members.into_iter().collect(),
            last_log_index: view.last_log_index.unwrap_or(0),
            applied_index: view.applied_index.unwrap_or(0),
            voters: view.voters.into_iter().collect(),
        }
    }
}
