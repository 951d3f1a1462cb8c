//! The peer port: answers the calls of [`super::codec`] on every connection a peer opens, in order, with
//! what a [`Handler`] (the node) answers.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use holdfast_store::{NodeId, SnapshotPiece, TypeConfig};
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_stream::{Stream, StreamExt};

use super::codec::{self, encode_into, Received, READ_BUFFER_BYTES};
use super::protocol::{ForwardReply, ForwardRequest, LogEnd, NodeError, PreVote, PreVoteAnswer, SnapshotFetch};

/// A connection's buffers that grew past this (for a snapshot chunk) are let go after the call.
const BUFFER_KEPT_BYTES: usize = 1 << 20;

/// What the peer port serves. The node implements it: this folder knows nothing above it.
pub trait Handler: Send + Sync + 'static {
    /// openraft's `append_entries`.
    fn append(
        &self,
        rpc: AppendEntriesRequest<TypeConfig>,
    ) -> impl Future<Output = Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>> + Send;
    /// openraft's `vote`.
    fn vote(
        &self,
        rpc: VoteRequest<NodeId>,
    ) -> impl Future<Output = Result<VoteResponse<NodeId>, RaftError<NodeId>>> + Send;
    /// openraft's `install_snapshot` (one chunk).
    fn snapshot(
        &self,
        rpc: InstallSnapshotRequest<TypeConfig>,
    ) -> impl Future<Output = Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>> + Send;
    /// A follower's forwarded request. An error closes the connection unanswered, as a node that cannot
    /// decode the request does.
    fn forward(
        &self,
        request: ForwardRequest,
    ) -> impl Future<Output = io::Result<Result<ForwardReply, NodeError>>> + Send;
    /// Whether this node would vote for the asker now.
    fn pre_vote(&self, asked: &PreVote) -> PreVoteAnswer;
    /// A piece of this node's current snapshot, for a peer whose own is damaged.
    fn fetch_snapshot(&self, asked: SnapshotFetch) -> impl Future<Output = Result<SnapshotPiece, NodeError>> + Send;
    /// Whether this node leads, in which term, and its log's last index.
    fn log_end(&self) -> LogEnd;
}

/// Serves peer connections from `incoming` with `handler` until `stop` changes; then closes them all.
pub async fn serve<H, P, IO, E>(handler: Arc<H>, incoming: P, mut stop: tokio::sync::watch::Receiver<bool>)
where
    H: Handler,
    P: Stream<Item = Result<IO, E>>,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    E: std::fmt::Display,
{
    let mut incoming = std::pin::pin!(incoming);
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            accepted = incoming.next() => match accepted {
                Some(Ok(io)) => {
                    let handler = handler.clone();
                    conns.spawn(async move {
                        if let Err(e) = answer_calls(&*handler, io).await {
                            tracing::debug!(%e, "peer connection closed");
                        }
                    });
                }
                Some(Err(e)) => {
                    // Out of file descriptors and the like: wait a little rather than spin.
                    tracing::warn!(%e, "accepting a peer connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                None => break,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.shutdown().await;
}

/// Answers the calls on one connection, in order, until it closes.
async fn answer_calls(handler: &impl Handler, io: impl AsyncRead + AsyncWrite + Unpin) -> io::Result<()> {
    let mut io = tokio::io::BufReader::with_capacity(READ_BUFFER_BYTES, io);
    codec::hello(&mut io).await?;
    let mut request = Vec::new();
    let mut answer = Vec::new();
    while let Some(received) = codec::read_request(&mut io, &mut request).await? {
        answer.clear();
        answer.extend_from_slice(&[0; 4]);
        match received {
            Received::Append(rpc) => encode_into(&mut answer, &handler.append(rpc).await),
            Received::Vote(rpc) => encode_into(&mut answer, &handler.vote(rpc).await),
            Received::Snapshot(rpc) => encode_into(&mut answer, &handler.snapshot(rpc).await),
            Received::Forward(forwarded) => encode_into(&mut answer, &handler.forward(forwarded).await?),
            Received::PreVote(asked) => encode_into(&mut answer, &handler.pre_vote(&asked)),
            Received::FetchSnapshot(asked) => encode_into(&mut answer, &handler.fetch_snapshot(asked).await),
            Received::LogEnd => encode_into(&mut answer, &handler.log_end()),
        }
        codec::write_frame(&mut io, &mut answer).await?;
        for buf in [&mut request, &mut answer] {
            if buf.capacity() > BUFFER_KEPT_BYTES {
                *buf = Vec::new();
            }
        }
    }
    Ok(())
}
