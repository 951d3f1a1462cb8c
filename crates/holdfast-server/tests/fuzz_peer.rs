//! Fuzz targets for what a node decodes from its peers' bytes (issue 33): the peer port's stream (the
//! hello, frames, request bodies: `codec::hello`, `codec::read_request`, `codec::decode_request`) and the
//! answers a caller decodes (`codec::decode_answer`).
//!
//! Each target starts from valid frames of every call (AppendEntries holding each kind of log entry and
//! each `Command`, votes, a snapshot chunk, every forwarded request, a pre-vote; and every kind of answer),
//! mutates them (bits flipped, bytes set, cut, extended, removed, spliced, lengths replaced with telling
//! values), or makes up random bytes, and checks that decoding returns a value or an error: no panic, no
//! hang (time is simulated, and a read that waits for anything but its input would run it out), and no
//! allocation larger than [`allocation_bound_bytes`] of the input's length. A counting global allocator
//! measures the largest single allocation each decode asks for, on its own thread.
//!
//! Each target runs [`CASES_DEFAULT`] cases; `HOLDFAST_FUZZ_CASES=N` runs `N` (for hours, in a release
//! build: `HOLDFAST_FUZZ_CASES=100000 cargo test -p holdfast-server --test fuzz_peer --release`). A failure
//! is shrunk and its case saved in `fuzz_peer.proptest-regressions`; an input that found a bug is kept below
//! as a test of its own, named for what it shows.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use holdfast_core::{Command, LockState, SecretDigest, SessionSecret, Token};
use holdfast_server::peer::codec::{
    self, Call, Received, FRAME_GROWTH_BYTES, HELLO, MESSAGE_BYTES_MAX, READ_BUFFER_BYTES,
};
use holdfast_server::peer::protocol::{
    ForwardReply, ForwardRequest, NodeError, PreVote, PreVoteAnswer, Query, QueryReply, Request, SnapshotFetch, Written,
};
use holdfast_store::codec::element_bytes_max;
use holdfast_store::{NodeId, Response, TypeConfig};
use openraft::error::{Fatal, InstallSnapshotError, RaftError, SnapshotMismatch};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::{
    AnyError, BasicNode, CommittedLeaderId, Entry, EntryPayload, LogId, Membership, SnapshotMeta, SnapshotSegmentId,
    StorageError, StorageIOError, StoredMembership, Vote,
};
use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, BufReader, ReadBuf};

#[path = "../../holdfast-store/tests/fuzzing/mod.rs"]
mod fuzzing;
use fuzzing::{acquire, cases, every_command, largest_allocation, mutate, mutation, ELEMENT_BYTES_PER_BYTE_MOST};

/// Cases per target unless `HOLDFAST_FUZZ_CASES` says otherwise.
const CASES_DEFAULT: u32 = 2048;

/// The most one allocation may take while `len` bytes are read and decoded: a frame's buffer grows at most
/// [`FRAME_GROWTH_BYTES`] ahead of its bytes, or to twice them; a value's elements take at most what the
/// codec lets them ([`element_bytes_max`]) and [`ELEMENT_BYTES_PER_BYTE_MOST`] per byte, and the vector
/// that holds them may have twice that room; 16 KiB for error messages, the read buffer and the runtime.
fn allocation_bound_bytes(len: usize) -> usize {
    let elements = element_bytes_max(len).min(ELEMENT_BYTES_PER_BYTE_MOST * len);
    (16 << 10) + FRAME_GROWTH_BYTES.max(2 * len) + 2 * elements
}

// --- valid values of everything on the wire ---

fn log_id(term: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn membership() -> Membership<NodeId, BasicNode> {
    let nodes: BTreeMap<NodeId, BasicNode> =
        (1..=4).map(|id| (id, BasicNode { addr: format!("10.0.0.{id}:7001") })).collect();
    Membership::new(vec![BTreeSet::from([1, 2, 3]), BTreeSet::from([2, 3, 4])], nodes)
}

fn entries() -> Vec<Entry<TypeConfig>> {
    let mut entries = vec![
        Entry { log_id: log_id(2, 10), payload: EntryPayload::Blank },
        Entry { log_id: log_id(2, 11), payload: EntryPayload::Membership(membership()) },
    ];
    for (i, cmd) in every_command().into_iter().enumerate() {
        let entry = holdfast_core::Entry { at_ms: 1_700_000_000_000 + i as u64, cmd };
        entries.push(Entry { log_id: log_id(2, 12 + i as u64), payload: EntryPayload::Normal(entry) });
    }
    entries
}

/// A lock state with locks, waiters, sessions and a key, for snapshot bytes and answers.
fn lock_state() -> LockState {
    let mut state = LockState::new();
    let commands = [
        Command::OpenSession { id: 7, owner: "s".into(), lease_ms: 2_000, secret: SecretDigest([7; 32]) },
        Command::CreateKey { tenant: 3, hash: [9; 32] },
        acquire("a", Some(7)),
        acquire("a", None),
        acquire("b", None),
    ];
    for (i, cmd) in commands.into_iter().enumerate() {
        state.apply(i as u64 + 1, &holdfast_core::Entry { at_ms: 1_000 + i as u64, cmd });
    }
    state
}

fn request_bodies() -> Vec<Vec<u8>> {
    let vote = Vote::new_committed(2, 1);
    let mut frames = vec![
        codec::request(
            Call::Append,
            &AppendEntriesRequest::<TypeConfig> {
                vote,
                prev_log_id: Some(log_id(2, 9)),
                entries: entries(),
                leader_commit: Some(log_id(2, 9)),
            },
        ),
        // A heartbeat: no entries.
        codec::request(
            Call::Append,
            &AppendEntriesRequest::<TypeConfig> { vote, prev_log_id: None, entries: Vec::new(), leader_commit: None },
        ),
        codec::request(Call::Vote, &VoteRequest::<NodeId>::new(Vote::new(3, 2), Some(log_id(2, 30)))),
        codec::request(
            Call::Snapshot,
            &InstallSnapshotRequest::<TypeConfig> {
                vote,
                meta: SnapshotMeta {
                    last_log_id: Some(log_id(2, 30)),
                    last_membership: StoredMembership::new(Some(log_id(2, 11)), membership()),
                    snapshot_id: "2-30-17".into(),
                },
                offset: 0,
                data: lock_state().snapshot(),
                done: true,
            },
        ),
        codec::request(Call::PreVote, &PreVote { candidate: 2, term: 3, last_log_id: Some(log_id(2, 30)) }),
        codec::request(Call::FetchSnapshot, &SnapshotFetch { through: 30, offset: 8 << 20 }),
        codec::request(Call::LogEnd, &()),
    ];
    let token = Token(77);
    let writes = vec![
        Request::Acquire {
            name: "a".into(),
            owner: "w".into(),
            ttl_ms: 5_000,
            wait_ms: 0,
            value: vec![],
            lock_delay_ms: 0,
            limit: 1,
        },
        Request::Acquire {
            name: "v".into(),
            owner: "w".into(),
            ttl_ms: 5_000,
            wait_ms: 0,
            value: b"addr".to_vec(),
            lock_delay_ms: 2_000,
            limit: 3,
        },
        Request::Release { name: "a".into(), token },
        Request::Renew { name: "a".into(), token, ttl_ms: Some(9_000) },
        Request::Renew { name: "a".into(), token, ttl_ms: None },
        Request::Cancel { name: "a".into(), token },
        Request::OpenSession { owner: "s".into(), lease_ms: 2_000 },
        Request::CloseSession { id: 7 },
        Request::SessionAcquire {
            id: 7,
            name: "b".into(),
            wait: true,
            value: vec![7; 3],
            lock_delay_ms: 1_000,
            limit: 2,
        },
        Request::SetValue { name: "v".into(), token, value: b"new".to_vec() },
        Request::CreateKey { tenant: 4, hash: [1; 32] },
        Request::RevokeKey { tenant: 4 },
    ];
    let mut forwarded: Vec<ForwardRequest> = writes.iter().cloned().map(ForwardRequest::Write).collect();
    forwarded.extend([
        ForwardRequest::Read(Query::Lock { name: "a".into() }),
        ForwardRequest::Read(Query::List { prefix: "a".into(), after: Some("a1".into()), limit: 100 }),
        ForwardRequest::Read(Query::Keys),
        ForwardRequest::Heartbeat(7),
        ForwardRequest::StillWaiting(vec![token, Token(78)]),
        ForwardRequest::Barrier,
        ForwardRequest::AddMember { id: 5, addr: "10.0.0.5:7001".into() },
        ForwardRequest::RemoveMember { id: 5 },
        ForwardRequest::Heartbeats(vec![7, 8, 9]),
        ForwardRequest::Writes(writes),
        ForwardRequest::HeartbeatsWaited { ids: vec![7, 8], waited_ms: 1500 },
    ]);
    frames.extend(forwarded.iter().map(|request| codec::request(Call::Forward, request)));
    // The body: what follows the 4 bytes `write_frame` fills with its length.
    frames.into_iter().map(|frame| frame[4..].to_vec()).collect()
}

/// A request's body as its frame would have it: what `decode_request` takes.
fn request_seeds() -> &'static [Vec<u8>] {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(request_bodies)
}

/// The frame of a request body: its length, then it.
fn framed(body: &[u8]) -> Vec<u8> {
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(body);
    frame
}

/// Which answer an answer frame is, as the caller who made the call decodes it.
#[derive(Debug, Clone, Copy)]
enum AnswerTo {
    Append,
    Vote,
    Snapshot,
    Forward,
    PreVote,
}

type AppendAnswer = Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>;
type VoteAnswer = Result<VoteResponse<NodeId>, RaftError<NodeId>>;
type SnapshotAnswer = Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>;
type ForwardAnswer = Result<ForwardReply, NodeError>;

/// Decodes `answer` as the answer to `to` and encodes it again: `None` if it does not decode.
fn decode_answer(to: AnswerTo, answer: &[u8]) -> Option<Vec<u8>> {
    fn again<T: DeserializeOwned + Serialize>(answer: &[u8]) -> Option<Vec<u8>> {
        codec::decode_answer::<T>(answer).ok().map(|value| bincode::serialize(&value).unwrap())
    }
    match to {
        AnswerTo::Append => again::<AppendAnswer>(answer),
        AnswerTo::Vote => again::<VoteAnswer>(answer),
        AnswerTo::Snapshot => again::<SnapshotAnswer>(answer),
        AnswerTo::Forward => again::<ForwardAnswer>(answer),
        AnswerTo::PreVote => again::<PreVoteAnswer>(answer),
    }
}

fn storage_failure() -> RaftError<NodeId> {
    let cause = AnyError::error("fdatasync: input/output error").add_context(|| "appending entry 12");
    let io = StorageIOError::write_log_entry(log_id(2, 12), cause);
    RaftError::Fatal(Fatal::StorageError(StorageError::from(io)))
}

fn written(index: u64, outcome: holdfast_core::Outcome) -> Written {
    Written {
        index,
        response: Response { at_ms: 1_000 + index, outcome: Some(outcome) },
        token: Some(Token(5)),
        secret: Some(SessionSecret(Token(6))),
    }
}

fn answer_seeds() -> &'static [(AnswerTo, Vec<u8>)] {
    static SEEDS: OnceLock<Vec<(AnswerTo, Vec<u8>)>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let vote = Vote::new_committed(3, 2);
        let mut seeds = Vec::new();
        let mut add = |to, bytes: Vec<u8>| seeds.push((to, bytes));
        let appends: [AppendAnswer; 6] = [
            Ok(AppendEntriesResponse::Success),
            Ok(AppendEntriesResponse::PartialSuccess(Some(log_id(2, 20)))),
            Ok(AppendEntriesResponse::Conflict),
            Ok(AppendEntriesResponse::HigherVote(vote)),
            Err(storage_failure()),
            Err(RaftError::Fatal(Fatal::Stopped)),
        ];
        for answer in &appends {
            add(AnswerTo::Append, bincode::serialize(answer).unwrap());
        }
        let votes: [VoteAnswer; 2] = [Ok(VoteResponse::new(vote, Some(log_id(2, 30)), true)), Err(storage_failure())];
        for answer in &votes {
            add(AnswerTo::Vote, bincode::serialize(answer).unwrap());
        }
        let segment = |offset| SnapshotSegmentId { id: "2-30-17".into(), offset };
        let snapshots: [SnapshotAnswer; 2] = [
            Ok(InstallSnapshotResponse { vote }),
            Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(SnapshotMismatch {
                expect: segment(0),
                got: segment(8 << 20),
            }))),
        ];
        for answer in &snapshots {
            add(AnswerTo::Snapshot, bincode::serialize(answer).unwrap());
        }
        // Real outcomes and views, from a lock state: a grant, a queued waiter, a batch's outcomes.
        let mut state = lock_state();
        let mut outcome =
            |cmd| state.apply(state.applied_index() + 1, &holdfast_core::Entry { at_ms: 2_000, cmd }).outcome;
        let granted = outcome(acquire("c", None));
        let queued = outcome(acquire("c", None));
        let batch = outcome(Command::Batch(vec![acquire("d", None), acquire("e", None)]));
        let state = lock_state();
        let forwards: Vec<ForwardAnswer> = vec![
            Ok(ForwardReply::Written(written(6, granted.clone()))),
            Ok(ForwardReply::Read(QueryReply::Lock(state.get("a")))),
            Ok(ForwardReply::Read(QueryReply::List(state.list("", None, 10), 7))),
            Ok(ForwardReply::Read(QueryReply::Keys(state.keys().collect()))),
            Ok(ForwardReply::Heartbeat(Some((1, 2)))),
            Ok(ForwardReply::Heartbeat(None)),
            Ok(ForwardReply::Barrier(30)),
            Ok(ForwardReply::Noted),
            Ok(ForwardReply::Heartbeats(vec![Some((1, 0)), None])),
            Ok(ForwardReply::Writes(vec![
                Ok(written(7, queued)),
                Ok(written(8, batch)),
                Err(NodeError::Limit { slug: "locks".into(), detail: "tenant 3 holds 1000 locks".into() }),
            ])),
            Err(NodeError::NotLeader { leader: Some(1) }),
            Err(NodeError::Unreachable("connection refused".into())),
            Err(NodeError::Timeout(Duration::from_millis(5_000))),
            Err(NodeError::Unavailable("shutting down".into())),
            Err(NodeError::Refused { slug: "last-voter".into(), detail: "cannot remove the last voter".into() }),
        ];
        for answer in &forwards {
            add(AnswerTo::Forward, bincode::serialize(answer).unwrap());
        }
        for granted in [true, false] {
            add(AnswerTo::PreVote, bincode::serialize(&PreVoteAnswer { granted }).unwrap());
        }
        seeds
    })
}

// --- mutations ---

fn telling_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(0),
        Just(1),
        Just(u32::MAX),
        Just(MESSAGE_BYTES_MAX as u32),
        Just(MESSAGE_BYTES_MAX as u32 + 1),
        Just(FRAME_GROWTH_BYTES as u32 + 1),
        0..64u32,
        any::<u32>(),
    ]
}

fn telling_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0),
        Just(1),
        Just(u64::MAX),
        Just(1 << 32),
        Just(1 << 40),
        Just(isize::MAX as u64),
        Just(MESSAGE_BYTES_MAX as u64),
        0..4096u64,
        any::<u64>(),
    ]
}

/// A seed of `seeds` mutated, or now and then bytes made up from nothing.
fn mutated(seeds: &'static [Vec<u8>]) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => (0..seeds.len(), prop::collection::vec(mutation(telling_u32(), telling_u64()), 1..6))
            .prop_map(move |(seed, mutations)| mutate(seeds[seed].clone(), &mutations)),
        1 => prop::collection::vec(any::<u8>(), 0..256),
    ]
}

/// A connection's bytes: the hello and a few request frames, the whole mutated, or random bytes.
fn request_stream() -> impl Strategy<Value = Vec<u8>> {
    let seeds = request_seeds();
    prop_oneof![
        8 => (prop::collection::vec(0..seeds.len(), 1..4), prop::collection::vec(mutation(telling_u32(), telling_u64()), 0..6)).prop_map(
            move |(picked, mutations)| {
                let mut stream = HELLO.to_vec();
                for seed in picked {
                    stream.extend(framed(&seeds[seed]));
                }
                mutate(stream, &mutations)
            }
        ),
        1 => prop::collection::vec(any::<u8>(), 0..256).prop_map(|random| [&HELLO[..], &random].concat()),
    ]
}

// --- reading as a socket hands bytes over ---

/// `bytes`, read in the sizes `chunks` gives in turn; a size of 0 is a read that is not ready, woken at
/// once (as a socket's would be when the next bytes arrive).
struct Trickle {
    bytes: Vec<u8>,
    at: usize,
    chunks: Vec<usize>,
    turn: usize,
}

impl AsyncRead for Trickle {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let chunk = this.chunks[this.turn % this.chunks.len()];
        this.turn += 1;
        if chunk == 0 {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let n = chunk.min(buf.remaining()).min(this.bytes.len() - this.at);
        buf.put_slice(&this.bytes[this.at..this.at + n]);
        this.at += n;
        Poll::Ready(Ok(()))
    }
}

/// Read sizes for a [`Trickle`]: the first is never 0, so that every round of them moves on.
fn chunks() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(prop_oneof![1 => Just(0usize), 4 => 1..64usize, 1 => Just(usize::MAX)], 1..6).prop_map(
        |mut chunks| {
            chunks[0] = chunks[0].max(1);
            chunks
        },
    )
}

/// What the peer port made of a connection's bytes: the requests it read, and how the connection ended.
#[derive(Debug)]
struct Served {
    requests: usize,
    end: io::Result<()>,
}

/// A runtime whose time is simulated: it jumps ahead whenever every task waits, so a read that waits for
/// anything but its bytes runs out its timeout at once.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap()
}

/// Reads `stream` as the peer port reads a connection (through the same buffer), on `runtime`: `None` if
/// it did not end within an hour of simulated time, which nothing but waiting for bytes that never come
/// can take (a `Trickle` ends when its bytes do).
fn serve(runtime: &tokio::runtime::Runtime, stream: Vec<u8>, chunks: Vec<usize>) -> Option<Served> {
    let mut io = BufReader::with_capacity(READ_BUFFER_BYTES, Trickle { bytes: stream, at: 0, chunks, turn: 0 });
    runtime.block_on(async move {
        let mut requests = 0;
        let read = async {
            codec::hello(&mut io).await?;
            let mut buf = Vec::new();
            while let Some(received) = codec::read_request(&mut io, &mut buf).await? {
                requests += 1;
                drop(received);
            }
            Ok(())
        };
        let end = tokio::time::timeout(Duration::from_secs(3600), read).await.ok()?;
        Some(Served { requests, end })
    })
}

/// Encodes a received request again, as its call's byte and body.
fn encoded(received: &Received) -> Vec<u8> {
    let (call, body) = match received {
        Received::Append(rpc) => (Call::Append, bincode::serialize(rpc)),
        Received::Vote(rpc) => (Call::Vote, bincode::serialize(rpc)),
        Received::Snapshot(rpc) => (Call::Snapshot, bincode::serialize(rpc)),
        Received::Forward(forwarded) => (Call::Forward, bincode::serialize(forwarded)),
        Received::PreVote(asked) => (Call::PreVote, bincode::serialize(asked)),
        Received::FetchSnapshot(asked) => (Call::FetchSnapshot, bincode::serialize(asked)),
        Received::LogEnd => (Call::LogEnd, bincode::serialize(&())),
    };
    [&codec::request(call, &())[4..], &body.unwrap()[..]].concat()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(CASES_DEFAULT), ..ProptestConfig::default() })]

    /// A connection's bytes, mutated, read in any sizes: the peer port reads requests until it closes the
    /// connection or the bytes end, without a panic, a hang or an allocation past the bound.
    #[test]
    fn a_mutated_connection_reads_to_requests_and_an_end(stream in request_stream(), chunks in chunks()) {
        let (len, runtime) = (stream.len(), runtime());
        let (served, largest) = largest_allocation(|| serve(&runtime, stream, chunks));
        let served = served.expect("the reads ended with the bytes");
        // Every request takes a frame's 4-byte length and its call's byte at least.
        prop_assert!(served.requests <= len / 5, "{served:?} from {len} bytes");
        prop_assert!(largest <= allocation_bound_bytes(len), "{largest} bytes allocated reading {len}: {served:?}");
    }

    /// A request's body, mutated: it decodes to a request or is an error, within the bound; and a request
    /// it decodes to encodes to no more bytes than it had (a decoder never makes up what was not there).
    #[test]
    fn a_mutated_request_body_decodes_to_a_request_or_an_error(body in mutated(request_seeds())) {
        let (decoded, largest) = largest_allocation(|| codec::decode_request(&body));
        prop_assert!(largest <= allocation_bound_bytes(body.len()), "{largest} bytes allocated decoding {}", body.len());
        if let Ok(received) = decoded {
            let again = encoded(&received);
            prop_assert!(again.len() <= body.len(), "{} bytes decoded to {received:?}", body.len());
        }
    }

    /// An answer, mutated, decoded as the answer to each call: a value or an error, within the bound.
    #[test]
    fn a_mutated_answer_decodes_to_an_answer_or_an_error(
        seed in 0..answer_seeds().len(),
        mutations in prop::collection::vec(mutation(telling_u32(), telling_u64()), 1..6),
    ) {
        let answer = mutate(answer_seeds()[seed].1.clone(), &mutations);
        for to in [AnswerTo::Append, AnswerTo::Vote, AnswerTo::Snapshot, AnswerTo::Forward, AnswerTo::PreVote] {
            let (again, largest) = largest_allocation(|| decode_answer(to, &answer));
            prop_assert!(largest <= allocation_bound_bytes(answer.len()), "{largest} bytes allocated decoding {}", answer.len());
            if let Some(again) = again {
                prop_assert!(again.len() <= answer.len(), "{to:?}: {} bytes decoded to {} again", answer.len(), again.len());
            }
        }
    }
}

// --- the seeds themselves, and the inputs that found bugs ---

/// The seeds are what they should be: every request frame, read from a connection, decodes to the request
/// it encodes (so the fuzzing starts from valid frames), within the allocation bound.
#[test]
fn every_seed_request_reads_back_as_it_was_sent() {
    let mut stream = HELLO.to_vec();
    for body in request_seeds() {
        stream.extend(framed(body));
        let (received, largest) = largest_allocation(|| codec::decode_request(body).unwrap());
        assert_eq!(encoded(&received), *body);
        assert!(largest <= allocation_bound_bytes(body.len()), "{largest} bytes for {received:?}");
    }
    let served = serve(&runtime(), stream, vec![7, 0, 4096]).unwrap();
    assert_eq!(served.requests, request_seeds().len());
    served.end.unwrap();
}

#[test]
fn every_seed_answer_decodes_back_as_it_was_sent() {
    for (to, answer) in answer_seeds() {
        assert_eq!(decode_answer(*to, answer).as_ref(), Some(answer), "{to:?}");
    }
}

/// A connection that sends a frame's length of [`MESSAGE_BYTES_MAX`] (`00 00 00 04`: 64 MiB) and one byte
/// of it. The buffer was sized from the length before its bytes arrived: 64 MiB held for 13 bytes received
/// (found by the connection target, as a length of 128 KiB in 21 bytes).
#[test]
fn a_frame_that_claims_the_limit_holds_no_more_than_arrived() {
    let stream = [&HELLO[..], &[0x00, 0x00, 0x00, 0x04, 0x02]].concat();
    let runtime = runtime();
    let (served, largest) = largest_allocation(|| serve(&runtime, stream.clone(), vec![4096]).unwrap());
    assert_eq!(served.requests, 0);
    assert_eq!(served.end.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    assert!(largest <= allocation_bound_bytes(stream.len()), "{largest} bytes allocated for {} received", stream.len());
}

/// The head of an AppendEntries body of one entry at index 1 from the leader of term 1, node 1, up to its
/// command: the call's byte, the vote, no previous log id, one entry, its log id, `Normal`, its time.
const APPEND_ONE_ENTRY_HEAD: [u8; 63] = [
    1, // Call::Append
    1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, // vote: term 1, node 1, committed
    0, // prev_log_id: None
    1, 0, 0, 0, 0, 0, 0, 0, // one entry
    1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, // its log id: term 1, node 1, index 1
    1, 0, 0, 0, // EntryPayload::Normal
    1, 0, 0, 0, 0, 0, 0, 0, // at_ms: 1
];

/// An entry whose command is a `Command::Batch` of one batch of one batch…, 10,000 deep, then a
/// `CloseSession`: 120 KB, well inside a frame. `bincode::deserialize` recursed once per level and
/// overflowed the stack (a release build's 2 MiB too), which aborts the process.
#[test]
fn an_append_of_nested_batches_is_refused_not_a_stack_overflow() {
    let batch_of_one = [9, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]; // Command::Batch, one command
    let close_session = [5, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]; // Command::CloseSession { id: 1 }
    let mut body = APPEND_ONE_ENTRY_HEAD.to_vec();
    for _ in 0..10_000 {
        body.extend_from_slice(&batch_of_one);
    }
    body.extend_from_slice(&close_session);
    body.push(0); // leader_commit: None
                  // The same head and tail around a plain command decode: the bytes are right but for the nesting.
    let plain = [&APPEND_ONE_ENTRY_HEAD[..], &batch_of_one, &close_session, &[0]].concat();
    assert!(matches!(codec::decode_request(&plain), Ok(Received::Append(rpc)) if rpc.entries.len() == 1));
    let refused = codec::decode_request(&body).unwrap_err();
    assert!(refused.to_string().contains("nested more than"), "{refused}");
}

/// An AppendEntries answer whose storage error's cause has a source with a source…, 10,000 deep (each
/// level of `AnyError` is 10 bytes on the way in, 9 on the way out).
#[test]
fn an_answer_of_nested_error_sources_is_refused_not_a_stack_overflow() {
    let answer: AppendAnswer = Err(storage_failure());
    let plain = bincode::serialize(&answer).unwrap();
    // The cause's encoding, inside the answer's: it is replaced by a chain of causes.
    let cause =
        bincode::serialize(&AnyError::error("fdatasync: input/output error").add_context(|| "appending entry 12"))
            .unwrap();
    let at = plain.windows(cause.len()).position(|w| w == cause).expect("the cause is in the answer");
    let level_in = [0, 0, 0, 0, 0, 0, 0, 0, 0, 1]; // typ: None, msg: "", source: Some(…
    let innermost = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]; // None, "", None, [], None
    let level_out = [0, 0, 0, 0, 0, 0, 0, 0, 0]; // …), context: [], backtrace: None
    let mut nested = plain[..at].to_vec();
    for _ in 0..10_000 {
        nested.extend_from_slice(&level_in);
    }
    nested.extend_from_slice(&innermost);
    for _ in 0..10_000 {
        nested.extend_from_slice(&level_out);
    }
    nested.extend_from_slice(&plain[at + cause.len()..]);
    let refused = codec::decode_answer::<AppendAnswer>(&nested).unwrap_err();
    assert!(refused.to_string().contains("nested more than"), "{refused}");
}

/// A forwarded batch's answer of 10,000 `Err(NotLeader { leader: None })`: 9 bytes each on the wire, 224
/// in memory (`size_of::<Result<Written, NodeError>>()`). Decoded as they came, they took 25 times the
/// frame (a frame at the limit: 1.6 GB).
#[test]
fn an_answer_whose_elements_take_many_times_its_bytes_is_refused() {
    let mut answer = vec![0, 0, 0, 0, 6, 0, 0, 0]; // Ok(ForwardReply::Writes(…
    answer.extend_from_slice(&10_000u64.to_le_bytes());
    for _ in 0..10_000 {
        answer.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 0]); // Err(NodeError::NotLeader { leader: None })
    }
    let plain: ForwardAnswer = bincode::deserialize(&answer).unwrap();
    assert!(matches!(plain, Ok(ForwardReply::Writes(writes)) if writes.len() == 10_000));
    let (refused, largest) = largest_allocation(|| codec::decode_answer::<ForwardAnswer>(&answer));
    assert!(refused.unwrap_err().to_string().contains("more memory than its length allows"));
    assert!(largest <= allocation_bound_bytes(answer.len()), "{largest} bytes allocated for {}", answer.len());
}

/// A forwarded `StillWaiting` whose list of tokens claims 2^40 of them, in 13 bytes (found by the request
/// target, from a flipped bit in a list's length). serde reserved room for as many as fit in 1 MiB before
/// it read the first: a 1 MiB allocation per 13 bytes received. Now a sequence grows as its elements come.
#[test]
fn a_short_request_claiming_a_long_list_reserves_nothing_for_it() {
    let body = [4, 3, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0]; // Call::Forward, StillWaiting, 2^40 tokens, none
    let (refused, largest) = largest_allocation(|| codec::decode_request(&body));
    assert_eq!(refused.unwrap_err().kind(), io::ErrorKind::InvalidData);
    assert!(largest <= allocation_bound_bytes(body.len()), "{largest} bytes allocated for {}", body.len());
    assert!(largest < 4096, "{largest} bytes allocated for {}", body.len());
}
