//! [`LeanCodec`]: prost's gRPC codec with small per-call buffers.
//!
//! tonic gives every call an encode and a decode buffer of `buffer_size` bytes, 8 KiB each by default, kept
//! for as long as the call lasts. A session stream lasts as long as its session, and its messages are tens
//! of bytes: with the default, the two buffers were 16 KiB of the 36 KiB each open session cost the node
//! holding its stream (a heap profile of 10,000 sessions; docs/perf-notes/2026-12-06-memory-per-session.md).
//! A buffer grows when a message needs more (a long list page), so a small start costs only a few more
//! allocations on large messages.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// The bytes each call's encode and decode buffers start with: a session stream's heartbeat and its
/// acknowledgement are each under 32 bytes framed, and the buffers were 1 KiB of what a stream cost at 512.
pub const CALL_BUFFER: usize = 128;
/// How many bytes of ready messages a stream encodes before it hands them to HTTP/2 (tonic's default).
const YIELD_THRESHOLD: usize = 32 * 1024;

/// prost's codec ([`ProstCodec`]) with [`CALL_BUFFER`]-byte buffers. The generated client and server use it
/// for every method (`build.rs`).
#[derive(Debug, Clone)]
pub struct LeanCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        LeanCodec(PhantomData)
    }
}

fn settings() -> BufferSettings {
    BufferSettings::new(CALL_BUFFER, YIELD_THRESHOLD)
}

impl<T, U> Codec for LeanCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings())
    }
}
