//! What the byte-level fuzz targets share: their case count, a counting global allocator, and the mutations
//! they make to valid encodings, and a seed command of every kind. Included by
//! `fuzz_records.rs` here and by holdfast-server's `fuzz_peer.rs` (`#[path]`), each a test binary of its
//! own: including this module installs the allocator in that binary.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeSet;

use holdfast_core::{Acquire, Command, Expire, SessionSecret, Token};
use proptest::prelude::*;
use proptest::sample::Index;

/// The cases a target runs: `default`, unless `HOLDFAST_FUZZ_CASES` says otherwise.
pub fn cases(default: u32) -> u32 {
    match std::env::var("HOLDFAST_FUZZ_CASES") {
        Ok(n) => n.parse().expect("HOLDFAST_FUZZ_CASES is a number of cases"),
        Err(_) => default,
    }
}

/// The most memory any element of holdfast's takes per byte of its encoding: an `Outcome::Withdrawn` in a
/// batch's outcomes, 4 bytes on the wire and 128 in memory.
pub const ELEMENT_BYTES_PER_BYTE_MOST: usize = 32;

/// The system allocator, noting the largest single allocation each thread asks for.
struct Counting;

thread_local! {
    /// Const-initialized and without a destructor, so the allocator may touch it at any time.
    static LARGEST_BYTES: Cell<usize> = const { Cell::new(0) };
}

fn note(bytes: usize) {
    let _ = LARGEST_BYTES.try_with(|largest| largest.set(largest.get().max(bytes)));
}

// SAFETY: every call goes straight to `System`; noting a size touches only a thread-local `Cell`.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What `f` returns, and the largest single allocation it asked for on this thread.
pub fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST_BYTES.with(|largest| largest.set(0));
    let value = f();
    (value, LARGEST_BYTES.with(Cell::get))
}

// --- mutations ---

/// One change to a run of bytes; positions are fractions of its length at the time.
#[derive(Debug, Clone)]
pub enum Mutation {
    FlipBit {
        at: Index,
        bit: u8,
    },
    SetByte {
        at: Index,
        byte: u8,
    },
    /// A length, a count, a CRC or an enum's tag replaced.
    SetU32 {
        at: Index,
        value: u32,
    },
    /// A bincode length (of a string, bytes, a sequence or a map) or an index replaced.
    SetU64 {
        at: Index,
        value: u64,
    },
    Truncate {
        at: Index,
    },
    Insert {
        at: Index,
        bytes: Vec<u8>,
    },
    Remove {
        at: Index,
        len: usize,
    },
    /// A run of the bytes copied over another place, as a torn or misplaced write would.
    Splice {
        from: Index,
        to: Index,
        len: usize,
    },
}

/// One mutation, whose replaced integers are drawn from the target's telling values.
pub fn mutation(
    telling_u32: impl Strategy<Value = u32> + 'static,
    telling_u64: impl Strategy<Value = u64> + 'static,
) -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (any::<Index>(), 0..8u8).prop_map(|(at, bit)| Mutation::FlipBit { at, bit }),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(at, byte)| Mutation::SetByte { at, byte }),
        2 => (any::<Index>(), telling_u32).prop_map(|(at, value)| Mutation::SetU32 { at, value }),
        2 => (any::<Index>(), telling_u64).prop_map(|(at, value)| Mutation::SetU64 { at, value }),
        1 => any::<Index>().prop_map(|at| Mutation::Truncate { at }),
        1 => (any::<Index>(), prop::collection::vec(any::<u8>(), 1..32)).prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        1 => (any::<Index>(), 1..64usize).prop_map(|(at, len)| Mutation::Remove { at, len }),
        1 => (any::<Index>(), any::<Index>(), 1..64usize).prop_map(|(from, to, len)| Mutation::Splice { from, to, len }),
    ]
}

/// `bytes` with `mutations` made in order.
pub fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for mutation in mutations {
        // An index into the bytes as they are now (past the end for inserts and cuts).
        let at = |index: &Index, end: usize| if end == 0 { 0 } else { index.index(end) };
        match mutation {
            Mutation::FlipBit { at: i, bit } if !bytes.is_empty() => {
                let i = at(i, bytes.len());
                bytes[i] ^= 1 << bit;
            }
            Mutation::SetByte { at: i, byte } if !bytes.is_empty() => {
                let i = at(i, bytes.len());
                bytes[i] = *byte;
            }
            Mutation::SetU32 { at: i, value } => {
                let i = at(i, bytes.len() + 1);
                overwrite(&mut bytes, i, &value.to_le_bytes());
            }
            Mutation::SetU64 { at: i, value } => {
                let i = at(i, bytes.len() + 1);
                overwrite(&mut bytes, i, &value.to_le_bytes());
            }
            Mutation::Truncate { at: i } => bytes.truncate(at(i, bytes.len() + 1)),
            Mutation::Insert { at: i, bytes: new } => {
                let i = at(i, bytes.len() + 1);
                bytes.splice(i..i, new.iter().copied());
            }
            Mutation::Remove { at: i, len } if !bytes.is_empty() => {
                let i = at(i, bytes.len());
                bytes.drain(i..(i + len).min(bytes.len()));
            }
            Mutation::Splice { from, to, len } if !bytes.is_empty() => {
                let from = at(from, bytes.len());
                let run = bytes[from..(from + len).min(bytes.len())].to_vec();
                let to = at(to, bytes.len());
                overwrite(&mut bytes, to, &run);
            }
            _ => {}
        }
    }
    bytes
}

/// Writes `new` over `bytes` from `at`, extending them if it runs past their end.
fn overwrite(bytes: &mut Vec<u8>, at: usize, new: &[u8]) {
    if bytes.len() < at + new.len() {
        bytes.resize(at + new.len(), 0);
    }
    bytes[at..at + new.len()].copy_from_slice(new);
}

// --- seeds ---

/// An acquire of `name` by the seeds' one owner and token.
pub fn acquire(name: &str, session: Option<u64>) -> Command {
    Command::Acquire(Acquire {
        name: name.into(),
        owner: "worker-7".into(),
        token: Token(0x0123_4567_89ab_cdef_0011_2233_4455_6677),
        ttl_ms: 5_000,
        wait_ms: 60_000,
        session,
    })
}

/// One command of every kind, batches of each kind among them.
pub fn every_command() -> Vec<Command> {
    let token = Token(u128::MAX - 5);
    let cmds = vec![
        Command::OpenSession { id: 9, owner: "s".into(), lease_ms: 3_000, secret: SessionSecret(token).digest() },
        acquire("a", None),
        acquire("b", Some(9)),
        Command::Release { name: "a".into(), token },
        Command::Renew { name: "a".into(), token, ttl_ms: 10_000 },
        Command::Cancel { name: "b".into(), token },
        Command::OpenSessionWithoutSecret { id: 10, owner: "old-build".into(), lease_ms: 2_000 },
        Command::CloseSession { id: 10 },
        Command::Expire(Expire {
            locks: vec![("a".into(), 3), ("c".into(), 4)],
            waiters: vec![("b".into(), token)],
            sessions: vec![10, 11],
        }),
        Command::CreateKey { tenant: 3, hash: [0xab; 32] },
        Command::RevokeKey { tenant: 3 },
        Command::Batch(vec![acquire("x", None), Command::Release { name: "y".into(), token }]),
        Command::RenewKeepingTtl { name: "a".into(), token },
        Command::Group(vec![Command::Release { name: "x".into(), token }, acquire("x", None), acquire("x", None)]),
        Command::AcquireValued {
            acquire: Acquire {
                name: "v".into(),
                owner: "leader".into(),
                token,
                ttl_ms: 5_000,
                wait_ms: 0,
                session: None,
            },
            value: b"10.0.0.1:7070".to_vec(),
        },
        Command::SetValue { name: "v".into(), token, value: vec![0xff, 0, 1] },
        Command::AcquireDelayed {
            acquire: acquire("d", Some(9)).acquire().expect("an acquire").0.clone(),
            value: vec![],
            lock_delay_ms: 5_000,
        },
        Command::AcquireSemaphore {
            acquire: acquire("p", None).acquire().expect("an acquire").0.clone(),
            value: b"slot".to_vec(),
            lock_delay_ms: 0,
            limit: 3,
        },
        Command::OpenSessionCapped {
            id: 11,
            owner: "s".into(),
            lease_ms: 2_000,
            secret: SessionSecret(token).digest(),
            sessions_max: 2,
        },
    ];
    let mut kinds = BTreeSet::new();
    for cmd in &cmds {
        // A new kind of command fails to compile here until it is given a seed above (and a name here).
        kinds.insert(match cmd {
            Command::Acquire(_) => "acquire",
            Command::Release { .. } => "release",
            Command::Renew { .. } => "renew",
            Command::Cancel { .. } => "cancel",
            Command::OpenSessionWithoutSecret { .. } => "open-session-without-secret",
            Command::CloseSession { .. } => "close-session",
            Command::Expire(_) => "expire",
            Command::CreateKey { .. } => "create-key",
            Command::RevokeKey { .. } => "revoke-key",
            Command::Batch(_) => "batch",
            Command::RenewKeepingTtl { .. } => "renew-keeping-ttl",
            Command::Group(_) => "group",
            Command::OpenSession { .. } => "open-session",
            Command::AcquireValued { .. } => "acquire-valued",
            Command::SetValue { .. } => "set-value",
            Command::AcquireDelayed { .. } => "acquire-delayed",
            Command::AcquireSemaphore { .. } => "acquire-semaphore",
            Command::OpenSessionCapped { .. } => "open-session-capped",
        });
    }
    assert_eq!(kinds.len(), 18, "a seed of every kind of command");
    cmds
}
