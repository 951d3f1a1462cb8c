//! holdfast's gRPC messages and services, generated at build time from the repository's `proto/` folder.
//!
//! - [`v1`]: the public API (`proto/holdfast/v1/locks.proto`): lock sessions and one-shot calls.
//! - [`codec`]: prost's codec with small per-call buffers, which every generated method uses.
//! - [`dial`]: how a connection reaches a node, replaceable so the simulation runs the same code on its
//!   network.
//!
//! Nodes talk to each other in their own wire format, not gRPC (`holdfast-server`'s `wire` module).
//!
//! This crate holds generated code and the dialer; it must not depend on any other holdfast crate.

pub mod codec;
pub mod dial;

/// The package `holdfast.v1`.
mod generated {
    tonic::include_proto!("holdfast.v1");
}

/// The public API (`proto/holdfast/v1/locks.proto`).
pub mod v1 {
    pub use super::generated::call::Kind as CallKind;
    pub use super::generated::call_result::Kind as ResultKind;
    pub use super::generated::locks_client::LocksClient;
    pub use super::generated::locks_server::{Locks, LocksServer, SERVICE_NAME as LOCKS_SERVICE};
    pub use super::generated::session_event::Kind as EventKind;
    pub use super::generated::session_request::Kind as RequestKind;
    pub use super::generated::{
        AcquireRequest, Acquired, AddMemberRequest, Busy, Call, CallError, CallResult, Cancel, Close,
        ClusterStatusRequest, ClusterStatusResponse, GetRequest, Heartbeat, HeartbeatAck, Hold, Holder, ListRequest,
        ListResponse, Lock, Lost, Open, Opened, ReleaseRequest, ReleaseResponse, Released, RemoveMemberRequest,
        RenewRequest, Resume, SessionAcquire, SessionError, SessionEvent, SessionRelease, SessionRequest,
        SessionSetValue, SetValueRequest, SnapshotRequest, SnapshotResponse, ValueSet, Waiter, Waiting, WatchEvent,
        WatchRequest,
    };
}
