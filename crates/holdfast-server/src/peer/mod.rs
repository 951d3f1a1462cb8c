//! ⑦ Peers: what nodes say to each other, and how.
//!
//! - [`protocol`]: the forwarded requests, their answers and the pre-vote (plain data).
//! - [`codec`]: the peer port's frames, and bounded decoding of what a peer sends.
//! - [`client`]: calls to peers, over a pool of connections ([`client::Peers`]).
//! - [`raft`]: openraft's network on those calls, which holds back commit notices.
//! - [`server`]: the peer port, answering with what a [`server::Handler`] (the node) says.
//! - [`refetch`]: a node whose stored snapshot is damaged fetching a member's in its place.
//!
//! The bottom folder: it imports only the leaves (`tls`), never a folder above it.

pub mod client;
pub mod codec;
pub mod protocol;
pub mod raft;
pub mod refetch;
pub mod server;
