//! The peer protocol's wire format.
//!
//! A connection opens with the 8 bytes [`HELLO`], which name the protocol and its version; a node refuses
//! (closes) a connection that does not. Then each call is a request frame and the answer frame back, one
//! call at a time per connection. A frame is a `u32` little-endian length and that many bytes. A request
//! is one byte naming the [`Call`], then the bincode encoding of openraft's request (or of a forwarded
//! client request, [`super::protocol`]); an answer is the bincode encoding of the call's `Result`,
//! openraft's errors included. Frames are at most [`MESSAGE_BYTES_MAX`] long. On a cluster with TLS, all
//! of it runs inside mutual TLS.
//!
//! What a node decodes from a peer's bytes is decoded here: [`read_frame`], [`decode_request`] (both:
//! [`read_request`], the peer port's side) and [`decode_answer`] (the caller's side, [`super::client`]).
//! None of them trusts a length it reads: a frame's buffer grows with the bytes that arrive (at most
//! [`FRAME_GROWTH_BYTES`] ahead of them), and a body decodes from the frame's bytes with
//! [`holdfast_store::codec`]'s bounds, so a length inside it claims no more than the frame holds and no
//! room is reserved for a sequence before its elements arrive; nor does it trust how deep a value nests.
//! `tests/fuzz_peer.rs` holds them to that.

use std::io;
use std::time::Duration;

use holdfast_store::{codec, NodeId, TypeConfig};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::protocol::{ForwardRequest, PreVote, SnapshotFetch};

/// Largest peer message: a snapshot chunk ([`SNAPSHOT_CHUNK_BYTES`]) plus its envelope, with room to spare.
pub const MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Size of one snapshot chunk sent to a lagging follower.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 8 * 1024 * 1024;

/// The first bytes on every peer connection: the protocol and its version. Version 2: log entries may be
/// a `Command::Group`, which builds of version 1 cannot decode. Version 3: log entries may be a
/// `Command::OpenSession` with its secret's digest, which builds of version 2 cannot decode. Version 4: log
/// entries may be a `Command::AcquireValued` or `Command::SetValue`, and grants, holders and lock views carry
/// values and revisions, which builds of version 3 cannot decode. Version 5: log entries may be a
/// `Command::AcquireDelayed`, forwarded acquires carry a lock-delay, and a holder's lease may be
/// `Lease::Delayed`, which builds of version 4 cannot decode. Version 6: log entries may be a
/// `Command::AcquireSemaphore`, and forwarded acquires carry a limit. Version 7: log entries may be a
/// `Command::OpenSessionCapped`, whose limit travels in the entry, and a refused open names the limit it met.
pub const HELLO: &[u8; 8] = b"HFPEER/7";
/// How long a new connection may take to say [`HELLO`].
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes read ahead on a peer connection, both ends: a small frame's length and body come in one read
/// (one syscall, where reading the length and then the body took two). Larger frames read the rest straight
/// into their own buffer.
pub const READ_BUFFER_BYTES: usize = 8 * 1024;
/// How far a frame's buffer may grow ahead of the bytes of it that arrived: its length is only a claim
/// until they do. Frames up to this size (all but snapshot chunks and the largest batches) are read into a
/// buffer of their size at once.
pub const FRAME_GROWTH_BYTES: usize = 64 * 1024;

/// What a request asks of the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// openraft's `append_entries`.
    Append,
    /// openraft's `vote`.
    Vote,
    /// openraft's `install_snapshot` (one chunk).
    Snapshot,
    /// A client request a follower forwards to the leader (served by the leader's dispatcher).
    Forward,
    /// Whether the peer would vote for this node now, asked before it campaigns.
    /// A build without it closes the connection on this call, which the asker takes for a refusal.
    PreVote,
    /// A piece of the peer's current snapshot, for a node whose own is damaged. A build without it closes
    /// the connection on this call, which the asker takes for a peer that cannot serve it.
    FetchSnapshot,
    /// Whether the peer leads, in which term, and its log's last index: what a node whose damaged log was
    /// cut catches up to before it votes again. A build without it closes the connection on this call.
    LogEnd,
}

impl Call {
    const ALL: [Call; 7] =
        [Call::Append, Call::Vote, Call::Snapshot, Call::Forward, Call::PreVote, Call::FetchSnapshot, Call::LogEnd];

    fn byte(self) -> u8 {
        match self {
            Call::Append => 1,
            Call::Vote => 2,
            Call::Snapshot => 3,
            Call::Forward => 4,
            Call::PreVote => 5,
            Call::FetchSnapshot => 6,
            Call::LogEnd => 7,
        }
    }

    fn from_byte(byte: u8) -> Option<Call> {
        Call::ALL.into_iter().find(|call| call.byte() == byte)
    }
}

/// A request frame for `call` with `value`, ready for [`write_frame`].
pub fn request(call: Call, value: &impl Serialize) -> Vec<u8> {
    let mut frame = vec![0, 0, 0, 0, call.byte()];
    bincode::serialize_into(&mut frame, value).expect("peer messages always encode");
    frame
}

/// Writes `frame`: its first 4 bytes are overwritten with the length of the rest.
pub async fn write_frame(io: &mut (impl AsyncWrite + Unpin + ?Sized), frame: &mut [u8]) -> io::Result<()> {
    let len = u32::try_from(frame.len() - 4)
        .ok()
        .filter(|&len| len as usize <= MESSAGE_BYTES_MAX)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("a {}-byte message", frame.len())))?;
    frame[..4].copy_from_slice(&len.to_le_bytes());
    io.write_all(frame).await?;
    io.flush().await
}

/// Reads one frame's body into `buf`. `Ok(false)`: the stream ended cleanly, before a frame began.
pub async fn read_frame(io: &mut (impl AsyncRead + Unpin + ?Sized), buf: &mut Vec<u8>, max: usize) -> io::Result<bool> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match io.read(&mut len[got..]).await? {
            0 if got == 0 => return Ok(false),
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a {len}-byte frame; at most {max} are taken")));
    }
    // Grown as the bytes arrive, doubling, rather than sized by the length at once: a connection that sends
    // the length of a whole `MESSAGE_BYTES_MAX` frame and then nothing held 64 MiB of zeros until it closed
    // (found by tests/fuzz_peer.rs), and a few hundred such connections would take a node's memory.
    buf.clear();
    while buf.len() < len {
        let start = buf.len();
        buf.resize(len.min(start + start.max(FRAME_GROWTH_BYTES)), 0);
        io.read_exact(&mut buf[start..]).await?;
    }
    Ok(true)
}

/// A request as the peer port received it: its call, decoded.
#[derive(Debug)]
pub enum Received {
    /// [`Call::Append`].
    Append(AppendEntriesRequest<TypeConfig>),
    /// [`Call::Vote`].
    Vote(VoteRequest<NodeId>),
    /// [`Call::Snapshot`].
    Snapshot(InstallSnapshotRequest<TypeConfig>),
    /// [`Call::Forward`].
    Forward(ForwardRequest),
    /// [`Call::PreVote`].
    PreVote(PreVote),
    /// [`Call::FetchSnapshot`].
    FetchSnapshot(SnapshotFetch),
    /// [`Call::LogEnd`] (its body is empty).
    LogEnd,
}

/// Decodes a request frame's body, as [`read_frame`] read it: the call's byte, then its bincode. An error
/// for an empty frame, an unknown call or a body that does not decode.
pub fn decode_request(request: &[u8]) -> io::Result<Received> {
    let Some((&call, body)) = request.split_first() else {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "an empty request"));
    };
    Ok(match Call::from_byte(call) {
        Some(Call::Append) => Received::Append(decode(body)?),
        Some(Call::Vote) => Received::Vote(decode(body)?),
        Some(Call::Snapshot) => Received::Snapshot(decode(body)?),
        Some(Call::Forward) => Received::Forward(decode(body)?),
        Some(Call::PreVote) => Received::PreVote(decode(body)?),
        Some(Call::FetchSnapshot) => Received::FetchSnapshot(decode(body)?),
        Some(Call::LogEnd) => decode::<()>(body).map(|()| Received::LogEnd)?,
        None => return Err(io::Error::new(io::ErrorKind::InvalidData, format!("unknown call {call}"))),
    })
}

/// Reads the next request on a peer connection (after its [`hello`]) into `buf` and decodes it: what the
/// peer port does with every frame it receives. `Ok(None)`: the connection ended cleanly between requests.
pub async fn read_request(
    io: &mut (impl AsyncRead + Unpin + ?Sized),
    buf: &mut Vec<u8>,
) -> io::Result<Option<Received>> {
    match read_frame(io, buf, MESSAGE_BYTES_MAX).await? {
        true => decode_request(buf).map(Some),
        false => Ok(None),
    }
}

/// Checks that a new connection speaks this protocol.
pub async fn hello(io: &mut (impl AsyncRead + Unpin)) -> io::Result<()> {
    let mut hello = [0u8; HELLO.len()];
    tokio::time::timeout(HELLO_TIMEOUT, io.read_exact(&mut hello))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no hello"))??;
    if &hello != HELLO {
        tracing::warn!(
            got = %String::from_utf8_lossy(&hello),
            "a peer connection opened without holdfast's peer hello: a node of another version, or not a node"
        );
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not holdfast's peer protocol"));
    }
    Ok(())
}

/// Decodes a request's body. Not `bincode::deserialize`: that recursed without bound into a frame of
/// nested `Command::Batch`es, and 120 KB of them overflowed the stack (see holdfast-store's `codec`).
/// Its elements may take at most half of [`MESSAGE_BYTES_MAX`], so that no allocation decoding it is larger
/// than a frame may be: a request's largest are a snapshot chunk's bytes
/// ([`SNAPSHOT_CHUNK_BYTES`]).
fn decode<T: DeserializeOwned>(body: &[u8]) -> io::Result<T> {
    let elements_bytes_max = codec::element_bytes_max(body.len()).min(MESSAGE_BYTES_MAX / 2);
    codec::decode_within(body, elements_bytes_max)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("undecodable: {e}")))
}

/// Decodes an answer frame's body, as read by [`read_frame`], within [`codec::decode`]'s bounds on nesting
/// (an answer's openraft error nests an `AnyError` per source) and on memory per byte; not within half a
/// frame, as a request is: a list of 1,000 locks with full queues takes some 50 MB.
pub fn decode_answer<T: DeserializeOwned>(answer: &[u8]) -> bincode::Result<T> {
    codec::decode(answer)
}

pub(super) fn encode_into(buf: &mut Vec<u8>, value: &impl Serialize) {
    bincode::serialize_into(buf, value).expect("peer messages always encode");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_frame_reads_back_as_written_and_a_clean_end_is_told_from_a_cut_one() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let mut frame = request(Call::Vote, &("vote", 7u64));
        write_frame(&mut a, &mut frame).await.unwrap();
        let mut buf = Vec::new();
        assert!(read_frame(&mut b, &mut buf, MESSAGE_BYTES_MAX).await.unwrap());
        assert_eq!(Call::from_byte(buf[0]), Some(Call::Vote));
        assert_eq!(decode::<(String, u64)>(&buf[1..]).unwrap(), ("vote".to_owned(), 7));

        // A frame cut in its body is an error; the end of the stream between frames is not.
        let mut frame = request(Call::Append, &vec![1u8; 100]);
        let len = (frame.len() - 4) as u32;
        frame[..4].copy_from_slice(&len.to_le_bytes());
        a.write_all(&frame[..50]).await.unwrap();
        drop(a);
        let cut = read_frame(&mut b, &mut buf, MESSAGE_BYTES_MAX).await.unwrap_err();
        assert_eq!(cut.kind(), io::ErrorKind::UnexpectedEof);
        let (a, mut b) = tokio::io::duplex(1024);
        drop(a);
        assert!(!read_frame(&mut b, &mut buf, MESSAGE_BYTES_MAX).await.unwrap());
    }

    #[tokio::test]
    async fn a_frame_longer_than_the_limit_is_refused_unread() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        a.write_all(&1_000_000u32.to_le_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let refused = read_frame(&mut b, &mut buf, 1000).await.unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::InvalidData);
        assert!(buf.is_empty(), "nothing was allocated for it");
    }

    #[tokio::test]
    async fn a_frame_larger_than_a_growth_step_reads_back_whole() {
        let body: Vec<u8> = (0..3 * FRAME_GROWTH_BYTES + 5).map(|i| i as u8).collect();
        let mut sent = (body.len() as u32).to_le_bytes().to_vec();
        sent.extend_from_slice(&body);
        let mut buf = vec![9; 10];
        assert!(read_frame(&mut sent.as_slice(), &mut buf, MESSAGE_BYTES_MAX).await.unwrap());
        assert!(buf == body, "the frame's bytes, and only them");
    }

    #[tokio::test]
    async fn every_call_has_its_own_byte() {
        for call in Call::ALL {
            assert_eq!(Call::from_byte(call.byte()), Some(call));
        }
        assert_eq!(Call::from_byte(0), None);
        assert_eq!(Call::from_byte(8), None);
    }

    #[tokio::test]
    async fn a_connection_without_the_hello_is_refused() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        a.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
        assert_eq!(hello(&mut b).await.unwrap_err().kind(), io::ErrorKind::InvalidData);
        // A node of the version before, which cannot decode every entry this one writes.
        let (mut a, mut b) = tokio::io::duplex(1024);
        a.write_all(b"HFPEER/1").await.unwrap();
        assert_eq!(hello(&mut b).await.unwrap_err().kind(), io::ErrorKind::InvalidData);
        let (mut a, mut b) = tokio::io::duplex(1024);
        a.write_all(HELLO).await.unwrap();
        hello(&mut b).await.unwrap();
    }
}
