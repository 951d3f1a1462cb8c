//! holdfast's gRPC messages and services, generated at build time from the repository's `proto/` folder.
//!
//! - [`peer`]: the internal API between nodes (Raft messages and forwarded client requests).
//!
//! This crate holds generated code only; it must not depend on any other holdfast crate.

/// The peer API (`proto/holdfast/v1/peer.proto`).
pub mod peer {
    tonic::include_proto!("holdfast.v1");
}
