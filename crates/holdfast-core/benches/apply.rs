//! The state machine's apply path: what one replica spends per entry, without Raft, storage or network.
//!
//! `cargo bench -p holdfast-core` prints the time per entry for the common entries: a grant on a free lock,
//! a release, an acquire and release of one lock (a pair), a hand-over to the next waiter, a renew, a batch of 64 grants in one entry, and a snapshot of
//! a large state; and a look at a session among 100,000 (what a heartbeat's answer did before the lease
//! keeper kept its counts).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use holdfast_core::{Acquire, Command, Entry, LockState, SecretDigest, SessionId, Token};

const T0: u64 = 1_800_000_000_000;

fn acquire(name: String, token: u128, wait_ms: u64) -> Entry {
    let cmd = Command::Acquire(Acquire {
        name,
        owner: "bench".into(),
        token: Token(token),
        ttl_ms: 30_000,
        wait_ms,
        session: None,
    });
    Entry { at_ms: T0, cmd }
}

/// A state holding `n` locks, `lock-0` … `lock-{n-1}`, with tokens 1..=n; the last index used is `n`.
fn holding(n: u64) -> LockState {
    let mut state = LockState::new();
    for i in 0..n {
        state.apply(i + 1, &acquire(format!("lock-{i}"), u128::from(i) + 1, 0));
    }
    state
}

fn apply(c: &mut Criterion) {
    let mut group = c.benchmark_group("apply");
    group.throughput(Throughput::Elements(1));
    group.bench_function("grant a free lock among 100k held", |b| {
        b.iter_batched_ref(
            || (holding(100_000), 100_001u64),
            |(state, index)| {
                *index += 1;
                black_box(state.apply(*index, &acquire(format!("new-{index}"), u128::from(*index), 0)))
            },
            BatchSize::LargeInput,
        )
    });
    group.bench_function("grant a free lock among 100k held, a snapshot's copy alive", |b| {
        b.iter_batched_ref(
            || {
                let state = holding(100_000);
                let copy = state.clone();
                (state, copy, 100_001u64)
            },
            |(state, _copy, index)| {
                *index += 1;
                black_box(state.apply(*index, &acquire(format!("new-{index}"), u128::from(*index), 0)))
            },
            BatchSize::LargeInput,
        )
    });
    group.bench_function("release a lock among 100k held", |b| {
        b.iter_batched_ref(
            || holding(100_000),
            |state| {
                let cmd = Command::Release { name: "lock-50000".into(), token: Token(50_001) };
                black_box(state.apply(100_001, &Entry { at_ms: T0 + 1, cmd }))
            },
            BatchSize::LargeInput,
        )
    });
    // The uncontended clients' cycle: 64 locks, each taken and let go over and over, in one state that
    // lives through the whole measurement (each release leaves its lock's revision behind; past
    // `FREED_MAX` frees, each also forgets the oldest).
    group.bench_function("acquire and release, 64 locks in turn among 100k held", |b| {
        let (mut state, mut index) = (holding(100_000), 100_000u64);
        let names: Vec<String> = (0..64).map(|i| format!("cycle-{i}")).collect();
        b.iter(|| {
            index += 2;
            let name = &names[(index / 2 % 64) as usize];
            state.apply(index - 1, &acquire(name.clone(), 7, 0));
            let cmd = Command::Release { name: name.clone(), token: Token(7) };
            black_box(state.apply(index, &Entry { at_ms: T0 + 1, cmd }))
        })
    });
    group.bench_function("hand over to the next of 8 waiters", |b| {
        b.iter_batched_ref(
            || {
                let mut state = holding(1);
                for w in 0..8u64 {
                    state.apply(2 + w, &acquire("lock-0".into(), 1_000 + u128::from(w), 60_000));
                }
                state
            },
            |state| {
                let cmd = Command::Release { name: "lock-0".into(), token: Token(1) };
                black_box(state.apply(100, &Entry { at_ms: T0 + 1, cmd }))
            },
            BatchSize::SmallInput,
        )
    });
    group.bench_function("renew a lock among 100k held", |b| {
        b.iter_batched_ref(
            || (holding(100_000), 100_001u64),
            |(state, index)| {
                *index += 1;
                let cmd = Command::Renew { name: "lock-777".into(), token: Token(778), ttl_ms: 30_000 };
                black_box(state.apply(*index, &Entry { at_ms: T0 + 1, cmd }))
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();

    // What the leader's proposer makes under load: one entry carrying many one-lock commands. Time per
    // command, through `apply_each` as the store calls it.
    let mut group = c.benchmark_group("batch");
    group.throughput(Throughput::Elements(64));
    group.bench_function("grant 64 free locks in one entry among 100k held", |b| {
        b.iter_batched_ref(
            || {
                let cmds = (0..64).map(|i| acquire(format!("new-{i}"), 200_000 + i, 0).cmd).collect();
                (holding(100_000), Entry { at_ms: T0 + 1, cmd: Command::Batch(cmds) })
            },
            |(state, entry)| {
                black_box(state.apply_each(100_001, entry, |_, _, applied| {
                    black_box(applied);
                }))
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();

    let mut group = c.benchmark_group("snapshot");
    group.sample_size(10);
    let state = holding(100_000);
    group.throughput(Throughput::Elements(100_000));
    group.bench_function("copy of 100k held locks", |b| b.iter(|| black_box(state.clone())));
    group.bench_function("snapshot of 100k held locks", |b| b.iter(|| black_box(state.snapshot())));
    let bytes = state.snapshot();
    group.bench_function("restore of 100k held locks", |b| b.iter(|| black_box(LockState::restore(&bytes).unwrap())));
    group.finish();
}

/// A state with `n` sessions, each holding a lock of its own; their ids, drawn as a leader draws them
/// (spread over the whole range), in an order unrelated to theirs.
fn sessions(n: u64) -> (LockState, Vec<SessionId>) {
    let mut state = LockState::new();
    // A 64-bit mix of the counter: ids spread as random ones are, and the same every run.
    let id_of = |i: u64| {
        let mut x = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    };
    let ids: Vec<SessionId> = (0..n).map(id_of).collect();
    for (i, &id) in ids.iter().enumerate() {
        let index = 2 * i as u64 + 1;
        let open = Command::OpenSessionCapped {
            id,
            owner: format!("worker-{i}"),
            lease_ms: 10_000,
            secret: SecretDigest([7; 32]),
            sessions_max: n,
        };
        state.apply(index, &Entry { at_ms: T0, cmd: open });
        let mut take = acquire(format!("job-{i}"), u128::from(index) + 1, 0);
        if let Command::Acquire(a) = &mut take.cmd {
            a.session = Some(id);
        }
        state.apply(index + 1, &take);
    }
    // The heartbeats' order: every 7919th session in turn (a prime), unrelated to the ids' order.
    let order = (0..n as usize).map(|i| ids[i * 7919 % n as usize]).collect();
    (state, order)
}

fn heartbeats(c: &mut Criterion) {
    let mut group = c.benchmark_group("heartbeat");
    let (state, order) = sessions(100_000);
    assert!(state.session_summary(order[0]).is_some_and(|(_, _, holds, _)| holds == 1));
    group.throughput(Throughput::Elements(order.len() as u64));
    group.bench_function("look at each of 100k sessions (session_summary)", |b| {
        b.iter(|| {
            for &id in &order {
                black_box(state.session_summary(id));
            }
        })
    });
    group.finish();
}

criterion_group!(benches, apply, heartbeats);
criterion_main!(benches);
