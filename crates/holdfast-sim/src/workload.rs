//! The clients of a run: one-call HTTP clients (what a `curl` script does) and session clients on the
//! real Rust client library, each recording every call, every span it believed it held a lock (or a place
//! of a semaphore), and its accesses to the fenced resource.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast_client::{AcquireOptions, Client, Error as ClientError, Hold, Leadership};
use hyper::{Method, StatusCode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::history::{At, Call, Leased, Outcome};
use crate::http;
use crate::record::{now, Recorder, Resource};

/// The lock that guards the fenced resource; HTTP and session clients contend for it.
pub const FENCED_LOCK: &str = "fenced";
/// Locks only one-call clients take, with TTLs far longer than a run, so that the sequential model (no
/// expiry) fits them: the linearizability checker reads their history.
pub const MODEL_LOCKS: [&str; 2] = ["model-a", "model-b"];
/// Locks that keeper clients take, one name each, and keep or release; they never expire in a run, so the
/// linearizability checker reads them too.
pub const KEPT_PREFIX: &str = "kept-";
/// The TTL of a hold on a model lock: longer than any run.
pub const MODEL_TTL_MS: u64 = 3_600_000;
/// The TTL of a one-call client's hold on the fenced lock: short, so that stalled holders lose it.
pub const FENCED_TTL_MS: u64 = 1_000;
/// The lock the lock-delay clients contend for, the TTL of their holds, and the delay each asks for.
pub const DELAYED_LOCK: &str = "delayed";
pub const DELAYED_TTL_MS: u64 = 800;
pub const LOCK_DELAY_MS: u64 = 1_500;
/// The semaphore the semaphore clients contend for, how many may hold it at once (fewer than its clients),
/// and the TTL of a one-call client's place.
pub const SEMAPHORE: &str = "sem";
pub const SEMAPHORE_LIMIT: u32 = 2;
pub const SEMAPHORE_TTL_MS: u64 = 1_000;
/// The election the elector clients campaign in.
pub const ELECTION: &str = "elected";
/// The lease of a session client: long enough to outlive a leader's failover (an election takes about
/// half a second after the old leader's lease of about 0.4 s).
pub const SESSION_LEASE: Duration = Duration::from_secs(2);

/// What every client of a run shares.
#[derive(Clone)]
pub struct Ctx {
    /// The client's number in the history.
    pub client: u32,
    /// Every node's client address (`n1:7070`, ...).
    pub nodes: Vec<String>,
    pub recorder: Recorder,
    pub resource: Resource,
    /// No new operation starts after this.
    pub stop_at: At,
    /// Seeds this client's choices.
    pub seed: u64,
}

/// A one-call client's acquire of `lock` through `node`; records it. Answers the outcome and the token.
pub async fn http_acquire(ctx: &Ctx, node: &str, lock: &str, ttl_ms: u64) -> (Outcome, Option<String>) {
    let (outcome, grant) = http_acquire_with(ctx, node, lock, ttl_ms, "").await;
    (outcome, grant.and_then(|body| body["token"].as_str().map(str::to_owned)))
}

/// [`http_acquire`] with more of the query (`&lock_delay=…`); answers the grant's body.
async fn http_acquire_with(
    ctx: &Ctx,
    node: &str,
    lock: &str,
    ttl_ms: u64,
    query: &str,
) -> (Outcome, Option<serde_json::Value>) {
    let invoked = now();
    let path = format!("/v1/locks/{lock}?ttl={ttl_ms}ms&owner=c{}{query}", ctx.client);
    let answer = http::call(node, Method::POST, &path).await;
    let (outcome, completed, token) = match &answer {
        Ok((StatusCode::OK, body)) => match (body["fence"].as_u64(), body["token"].as_str()) {
            (Some(fence), Some(_)) => (Outcome::Granted { fence }, Some(now()), Some(body.clone())),
            _ => (Outcome::Unknown, Some(now()), None),
        },
        Ok((StatusCode::CONFLICT, body)) if body["type"] == "urn:holdfast:busy" => {
            (Outcome::Busy { holder: body["holder"]["fence"].as_u64() }, Some(now()), None)
        }
        Ok(_) => (Outcome::Unknown, Some(now()), None),
        Err(_) => (Outcome::Unknown, None, None),
    };
    ctx.recorder.op(ctx.client, lock, Call::Acquire { ttl_ms, wait: false }, invoked, completed, outcome);
    (outcome, token)
}

/// A one-call client's release of its hold of `lock` under `fence`; records it.
pub async fn http_release(ctx: &Ctx, node: &str, lock: &str, fence: u64, token: &str) -> Outcome {
    let invoked = now();
    let answer = http::call(node, Method::DELETE, &format!("/v1/locks/{lock}?token={token}")).await;
    let (outcome, completed) = match &answer {
        Ok((StatusCode::OK, _)) => (Outcome::Released, Some(now())),
        Ok((StatusCode::CONFLICT, body)) if body["type"] == "urn:holdfast:not-holder" => {
            (Outcome::NotHeld, Some(now()))
        }
        Ok(_) => (Outcome::Unknown, Some(now())),
        Err(_) => (Outcome::Unknown, None),
    };
    ctx.recorder.op(ctx.client, lock, Call::Release { fence }, invoked, completed, outcome);
    outcome
}

/// A read of `lock` through `node` (`GET /v1/locks/{lock}`); records it.
pub async fn http_get(ctx: &Ctx, node: &str, lock: &str) -> Outcome {
    let invoked = now();
    let answer = http::call(node, Method::GET, &format!("/v1/locks/{lock}")).await;
    let (outcome, completed) = match &answer {
        Ok((StatusCode::OK, body)) => match body["holder"]["fence"].as_u64() {
            Some(fence) => (Outcome::Holds { fence }, Some(now())),
            None => (Outcome::Unknown, Some(now())),
        },
        Ok((StatusCode::NOT_FOUND, body)) if body["type"] == "urn:holdfast:not-found" => (Outcome::Free, Some(now())),
        Ok(_) => (Outcome::Unknown, Some(now())),
        Err(_) => (Outcome::Unknown, None),
    };
    ctx.recorder.op(ctx.client, lock, Call::Get, invoked, completed, outcome);
    outcome
}

/// Releases until the answer is definite or the run is over: a hold left behind would keep a model lock
/// busy for the rest of the run.
async fn http_release_surely(ctx: &Ctx, rng: &mut StdRng, lock: &str, fence: u64, token: &str) {
    loop {
        let node = &ctx.nodes[rng.gen_range(0..ctx.nodes.len())];
        if http_release(ctx, node, lock, fence, token).await != Outcome::Unknown || now() >= ctx.stop_at {
            return;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(50..300))).await;
    }
}

/// A one-call client on the model locks: try-lock through any node, hold a moment, release.
pub async fn model_client(ctx: Ctx) -> turmoil::Result {
    let mut rng = StdRng::seed_from_u64(ctx.seed);
    while now() < ctx.stop_at {
        let node = &ctx.nodes[rng.gen_range(0..ctx.nodes.len())];
        let lock = MODEL_LOCKS[rng.gen_range(0..MODEL_LOCKS.len())];
        if let (Outcome::Granted { fence }, Some(token)) = http_acquire(&ctx, node, lock, MODEL_TTL_MS).await {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(0..300))).await;
            http_release_surely(&ctx, &mut rng, lock, fence, &token).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(10..300))).await;
    }
    Ok(())
}

/// Reads the model locks through any node, now and then: each answer must fit the one-call history of
/// the lock (linearizability of reads).
pub async fn reader_client(ctx: Ctx) -> turmoil::Result {
    let mut rng = StdRng::seed_from_u64(ctx.seed);
    while now() < ctx.stop_at {
        let node = &ctx.nodes[rng.gen_range(0..ctx.nodes.len())];
        let lock = MODEL_LOCKS[rng.gen_range(0..MODEL_LOCKS.len())];
        http_get(&ctx, node, lock).await;
        tokio::time::sleep(Duration::from_millis(rng.gen_range(10..200))).await;
    }
    Ok(())
}

/// A one-call client that takes locks of its own (`kept-cN-K`, TTL longer than the run) and keeps about
/// half of them to the end: every acknowledged grant it kept must be held by the healed cluster at the end,
/// and every acknowledged release must have stuck, through crashes of every node.
pub async fn keeper_client(ctx: Ctx) -> turmoil::Result {
    let mut rng = StdRng::seed_from_u64(ctx.seed);
    let mut k = 0;
    while now() < ctx.stop_at {
        let node = &ctx.nodes[rng.gen_range(0..ctx.nodes.len())];
        let lock = format!("{KEPT_PREFIX}c{}-{k}", ctx.client);
        match http_acquire(&ctx, node, &lock, MODEL_TTL_MS).await {
            (Outcome::Granted { fence }, Some(token)) => {
                k += 1;
                if rng.gen_ratio(1, 2) {
                    http_release_surely(&ctx, &mut rng, &lock, fence, &token).await;
                }
            }
            // Busy: an earlier attempt with no answer took it after all; that hold is this client's, and
            // the next name is tried.
            (Outcome::Busy { .. }, _) => k += 1,
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(100..600))).await;
    }
    Ok(())
}

/// A one-call client on the fenced lock with a short TTL: takes it, reads the counter, works (and now and
/// then stalls past its TTL, as a paused process would, and goes on as if it still held the lock), writes
/// the counter, releases.
pub async fn fenced_http_client(ctx: Ctx) -> turmoil::Result {
    let mut rng = StdRng::seed_from_u64(ctx.seed);
    while now() < ctx.stop_at {
        let node = &ctx.nodes[rng.gen_range(0..ctx.nodes.len())];
        let invoked = now();
        let (outcome, token) = http_acquire(&ctx, node, FENCED_LOCK, FENCED_TTL_MS).await;
        if let (Outcome::Granted { fence }, Some(token)) = (outcome, token) {
            let from = now();
            // The client counts its TTL from when it sent the request: the cluster's starts later.
            let lease_end = invoked + Duration::from_millis(FENCED_TTL_MS);
            work(&ctx, &mut rng, fence, lease_end).await;
            let released_at = now();
            ctx.recorder.hold(ctx.client, FENCED_LOCK, fence, from, lease_end.min(released_at));
            http_release_surely(&ctx, &mut rng, FENCED_LOCK, fence, &token).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(10..200))).await;
    }
    Ok(())
}

/// A one-call client of the delayed lock: try-locks it with a lock-delay through any node and, half the
/// time, walks away without a release (a holder that died or stalled past its TTL), so that the lock must
/// stay ungranted for the delay after its hold expires. Records each grant's leader times.
pub async fn delayed_client(ctx: Ctx) -> turmoil::Result {
    let mut rng = StdRng::seed_from_u64(ctx.seed);
    let query = format!("&lock_delay={LOCK_DELAY_MS}ms");
    while now() < ctx.stop_at {
        let node = &ctx.nodes[rng.gen_range(0..ctx.nodes.len())];
        let (outcome, grant) = http_acquire_with(&ctx, node, DELAYED_LOCK, DELAYED_TTL_MS, &query).await;
        if let (Outcome::Granted { fence }, Some(body)) = (outcome, grant) {
            let (expires_at_ms, ttl_ms) = (body["expires_at_ms"].as_u64(), body["ttl_ms"].as_u64());
            let (Some(expires_at_ms), Some(ttl_ms)) = (expires_at_ms, ttl_ms) else {
                return Err(format!("a grant without its lease: {body}").into());
            };
            let granted_at_ms = expires_at_ms - ttl_ms;
            let lock = DELAYED_LOCK.to_owned();
            let lock_delay_ms = LOCK_DELAY_MS;
            ctx.recorder.leased(Leased {
                client: ctx.client,
                lock,
                fence,
                granted_at_ms,
                expires_at_ms,
                lock_delay_ms,
            });
            if rng.gen_bool(0.5) {
                tokio::time::sleep(Duration::from_millis(rng.gen_range(0..300))).await;
                let token = body["token"].as_str().unwrap_or_default().to_owned();
                http_release_surely(&ctx, &mut rng, DELAYED_LOCK, fence, &token).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(10..400))).await;
    }
    Ok(())
}

/// A one-call client of the semaphore: try-locks one of its [`SEMAPHORE_LIMIT`] places with a short TTL,
/// over HTTP through any node or over gRPC through the client library (which finds the leader), and half
/// the time walks away from it (a holder that died: it counts the place held until its TTL runs out, and
/// goes on to take another), else holds it a moment and releases it. Records each place it believed it
/// held.
pub async fn semaphore_client(ctx: Ctx) -> turmoil::Result {
    let mut rng = StdRng::seed_from_u64(ctx.seed);
    let client = library_client(&ctx, ctx.nodes.clone())?;
    let query = format!("&limit={SEMAPHORE_LIMIT}");
    let ttl = Duration::from_millis(SEMAPHORE_TTL_MS);
    while now() < ctx.stop_at {
        let invoked = now();
        let granted = if rng.gen_bool(0.5) {
            let node = &ctx.nodes[rng.gen_range(0..ctx.nodes.len())];
            match http_acquire_with(&ctx, node, SEMAPHORE, SEMAPHORE_TTL_MS, &query).await {
                (Outcome::Granted { fence }, Some(body)) => {
                    body["token"].as_str().map(|token| (fence, token.to_owned()))
                }
                _ => None,
            }
        } else {
            let hold = grpc_acquire(&ctx, &client, SEMAPHORE, ttl, SEMAPHORE_LIMIT).await;
            hold.map(|hold| (hold.fence, hold.token))
        };
        if let Some((fence, token)) = granted {
            let from = now();
            // The client counts its TTL from when it sent the request: the cluster's starts later.
            let lease_end = invoked + ttl;
            if rng.gen_bool(0.5) {
                ctx.recorder.place(ctx.client, SEMAPHORE, SEMAPHORE_LIMIT, fence, from, lease_end);
            } else {
                tokio::time::sleep(Duration::from_millis(rng.gen_range(0..600))).await;
                ctx.recorder.place(ctx.client, SEMAPHORE, SEMAPHORE_LIMIT, fence, from, lease_end.min(now()));
                http_release_surely(&ctx, &mut rng, SEMAPHORE, fence, &token).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(10..300))).await;
    }
    Ok(())
}

/// A one-call try-lock of one of `limit` places of `lock` for `ttl` on the client library (gRPC); records
/// it. Answers the hold if it was granted.
async fn grpc_acquire(ctx: &Ctx, client: &Client, lock: &str, ttl: Duration, limit: u32) -> Option<Hold> {
    let invoked = now();
    let options = AcquireOptions { limit, ..AcquireOptions::default() };
    let (hold, completed, outcome) = match client.acquire_with(lock, ttl, Duration::ZERO, options).await {
        Ok(hold) => {
            let fence = hold.fence;
            (Some(hold), Some(now()), Outcome::Granted { fence })
        }
        Err(ClientError::Busy { holder }) => (None, Some(now()), Outcome::Busy { holder: holder.map(|h| h.fence) }),
        Err(_) => (None, None, Outcome::Unknown),
    };
    let call = Call::Acquire { ttl_ms: ttl.as_millis() as u64, wait: false };
    ctx.recorder.op(ctx.client, lock, call, invoked, completed, outcome);
    hold
}

/// A read-modify-write of the fenced counter under `fence`. One time in five the client stalls well past
/// `lease_end` between the read and the write and then writes anyway: the resource must turn it away if
/// anyone newer came by.
async fn work(ctx: &Ctx, rng: &mut StdRng, fence: u64, lease_end: At) {
    let Some(value) = ctx.resource.read(ctx.client, fence) else { return };
    let pause = if rng.gen_ratio(1, 5) {
        lease_end.saturating_sub(now()) + Duration::from_millis(rng.gen_range(200..1_500))
    } else {
        Duration::from_millis(rng.gen_range(0..100))
    };
    tokio::time::sleep(pause).await;
    ctx.resource.write(ctx.client, fence, value);
}

/// `instant` on this host's clock (tokio's, driven by the simulation) as simulated time.
fn at_of(instant: tokio::time::Instant) -> At {
    let here = tokio::time::Instant::now();
    match instant.checked_duration_since(here) {
        Some(ahead) => now() + ahead,
        None => now().saturating_sub(here - instant),
    }
}

/// A session client on the real client library: opens a session, queues for the fenced lock, works under
/// it, releases; opens a new session when one is lost.
pub async fn session_client(ctx: Ctx) -> turmoil::Result {
    let mut rng = StdRng::seed_from_u64(ctx.seed);
    let client = library_client(&ctx, ctx.nodes.clone())?;
    while let Some(session) = open_session(&ctx, &client, &mut rng).await {
        while now() < ctx.stop_at && !session.is_lost() {
            let wait = Duration::from_millis(rng.gen_range(500..3_000));
            if let Some((held, from)) = session_acquire(&ctx, &session, FENCED_LOCK, 1, wait).await {
                work(&ctx, &mut rng, held.fence(), at_of(held.confirmed_until())).await;
                session_release(&ctx, held, 1, from).await;
            }
            tokio::time::sleep(Duration::from_millis(rng.gen_range(10..200))).await;
        }
        let _ = session.close().await;
    }
    Ok(())
}

/// A session with [`SESSION_LEASE`], tried again every 50-300 ms until one opens; `None` once the run is
/// over.
async fn open_session(ctx: &Ctx, client: &Client, rng: &mut StdRng) -> Option<holdfast_client::Session> {
    while now() < ctx.stop_at {
        match client.session(SESSION_LEASE).await {
            Ok(session) => return Some(session),
            Err(_) => tokio::time::sleep(Duration::from_millis(rng.gen_range(50..300))).await,
        }
    }
    None
}

/// A session client of the semaphore on the client library: opens a session, queues for one of the
/// semaphore's places (waiting up to 0.5-3 s), holds it a while or until the session is lost, releases it;
/// opens a new session when one is lost.
pub async fn semaphore_session_client(ctx: Ctx) -> turmoil::Result {
    let mut rng = StdRng::seed_from_u64(ctx.seed);
    let client = library_client(&ctx, ctx.nodes.clone())?;
    while let Some(session) = open_session(&ctx, &client, &mut rng).await {
        while now() < ctx.stop_at && !session.is_lost() {
            let wait = Duration::from_millis(rng.gen_range(500..3_000));
            if let Some((held, from)) = session_acquire(&ctx, &session, SEMAPHORE, SEMAPHORE_LIMIT, wait).await {
                let lost = held.lost();
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(rng.gen_range(50..1_500))) => {}
                    _ = lost.cancelled() => {}
                }
                session_release(&ctx, held, SEMAPHORE_LIMIT, from).await;
            }
            tokio::time::sleep(Duration::from_millis(rng.gen_range(10..200))).await;
        }
        let _ = session.close().await;
    }
    Ok(())
}

/// A watcher on the real client library: watches the fenced lock through the nodes (starting at one its
/// seed picks) until the run stops, recording every state it is sent; a watch that fails (no node answered
/// within the client's bounds) is started again after the last revision seen, on a new segment.
pub async fn watcher_client(ctx: Ctx) -> turmoil::Result {
    let mut nodes = ctx.nodes.clone();
    let first = (ctx.seed % nodes.len() as u64) as usize;
    nodes.rotate_left(first);
    let client = library_client(&ctx, nodes)?;
    let mut watch = client.watch(FENCED_LOCK);
    let mut segment = 0;
    while now() < ctx.stop_at {
        match tokio::time::timeout(ctx.stop_at.saturating_sub(now()), watch.next()).await {
            Ok(Ok(lock)) => {
                let holder = lock.holder.map(|h| h.fence);
                ctx.recorder.watched(ctx.client, FENCED_LOCK, segment + watch.resumes(), lock.revision, holder);
            }
            Ok(Err(_)) => {
                segment += watch.resumes() + 1;
                watch = client.watch_after(FENCED_LOCK, watch.revision());
            }
            Err(_) => break,
        }
    }
    Ok(())
}

/// An elector on the client library: campaigns in [`ELECTION`] (`Client::campaign_with_lease`, giving up
/// after a while), leads for a while or until its leadership is lost, and resigns; records each campaign as
/// a waiting acquire and each leadership as a span it believed it led, by its own clock, so that the
/// checkers of locks judge elections too (one leader at a time, fences that grow, liveness).
pub async fn elector_client(ctx: Ctx) -> turmoil::Result {
    let mut rng = StdRng::seed_from_u64(ctx.seed);
    let client = library_client(&ctx, ctx.nodes.clone())?;
    while now() < ctx.stop_at {
        let give_up = Duration::from_millis(rng.gen_range(500..3_000));
        if let Some((leadership, from)) = campaign(&ctx, &client, SESSION_LEASE, give_up).await {
            lead(&ctx, leadership, from, Duration::from_millis(rng.gen_range(50..1_500))).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(10..200))).await;
    }
    Ok(())
}

/// An elector through `nodes` with a session lease of `lease`: campaigns in [`ELECTION`] (giving up after
/// `give_up`), leads until `lead_until` or until its leadership is lost, and resigns; recorded as
/// [`elector_client`] records.
pub async fn elector_hold(
    ctx: &Ctx,
    nodes: Vec<String>,
    lease: Duration,
    give_up: Duration,
    lead_until: At,
) -> turmoil::Result {
    let client = library_client(ctx, nodes)?;
    if let Some((leadership, from)) = campaign(ctx, &client, lease, give_up).await {
        lead(ctx, leadership, from, lead_until.saturating_sub(now())).await;
    }
    Ok(())
}

/// One campaign in [`ELECTION`] with a session lease of `lease`, given up after `give_up`; records it as a
/// waiting acquire. Answers the leadership won and when.
async fn campaign(ctx: &Ctx, client: &Client, lease: Duration, give_up: Duration) -> Option<(Leadership, At)> {
    let call = Call::Acquire { ttl_ms: 0, wait: true };
    let invoked = now();
    let campaign = client.campaign_with_lease(ELECTION, lease, format!("c{}", ctx.client));
    match tokio::time::timeout(give_up, campaign).await {
        Ok(Ok(leadership)) => {
            let (fence, from) = (leadership.fence(), now());
            ctx.recorder.op(ctx.client, ELECTION, call, invoked, Some(from), Outcome::Granted { fence });
            Some((leadership, from))
        }
        Ok(Err(_)) => {
            ctx.recorder.op(ctx.client, ELECTION, call, invoked, None, Outcome::Unknown);
            None
        }
        Err(_) => {
            ctx.recorder.op(ctx.client, ELECTION, call, invoked, Some(now()), Outcome::Busy { holder: None });
            None
        }
    }
}

/// Leads for `time` or until the leadership won at `from` is lost, and resigns; records the span it
/// believed it led, by its own clock.
async fn lead(ctx: &Ctx, leadership: Leadership, from: At, time: Duration) {
    let lost = leadership.lost();
    tokio::select! {
        _ = tokio::time::sleep(time) => {}
        _ = lost.cancelled() => {}
    }
    let until = now().min(at_of(leadership.confirmed_until()));
    ctx.recorder.hold(ctx.client, ELECTION, leadership.fence(), from, until);
    let _ = leadership.resign().await;
}

/// The leader's id, as `node` knows it (`GET /v1/cluster`).
pub async fn leader_of(node: &str) -> Option<u64> {
    match http::call(node, Method::GET, "/v1/cluster").await {
        Ok((StatusCode::OK, body)) => body["leader"].as_u64(),
        _ => None,
    }
}

/// Waits until `at` (simulated time).
pub async fn until(at: At) {
    tokio::time::sleep(at.saturating_sub(now())).await;
}

/// A client on the Rust client library through `nodes`, with the simulation's network.
pub fn library_client(ctx: &Ctx, nodes: Vec<String>) -> Result<Client, ClientError> {
    Client::builder(nodes)
        .dialer(crate::net::dialer())
        .seed(ctx.seed)
        .owner(format!("c{}", ctx.client))
        .request_timeout(Duration::from_secs(2))
        .retry_timeout(Duration::from_secs(3))
        .build()
}

/// A session with `lease` through `nodes` takes `lock` (waiting as long as `wait`), holds it until `hold_until` or
/// until it is lost, and releases it; records the acquire, the span it believed it held the lock, and the
/// release.
pub async fn session_hold(
    ctx: &Ctx,
    nodes: Vec<String>,
    lease: Duration,
    lock: &str,
    wait: Duration,
    hold_until: At,
) -> turmoil::Result {
    let client = library_client(ctx, nodes)?;
    let session = client.session(lease).await?;
    if let Some((held, from)) = session_acquire(ctx, &session, lock, 1, wait).await {
        while now() < hold_until && !held.is_lost() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        session_release(ctx, held, 1, from).await;
    }
    Ok(())
}

/// A session's acquire of `lock` (one of its `limit` places: 1 for a lock), waiting up to `wait`; records
/// the call. Answers the hold and when it came back.
async fn session_acquire(
    ctx: &Ctx,
    session: &holdfast_client::Session,
    lock: &str,
    limit: u32,
    wait: Duration,
) -> Option<(holdfast_client::HeldLock, At)> {
    let invoked = now();
    // A session's hold has no TTL of its own: it lasts as long as the session.
    let call = Call::Acquire { ttl_ms: 0, wait: true };
    let options = AcquireOptions { limit, ..AcquireOptions::default() };
    let (held, completed, outcome) = match session.lock_with(lock, Some(wait), options).await {
        Ok(held) => {
            let fence = held.fence();
            (Some(held), Some(now()), Outcome::Granted { fence })
        }
        Err(ClientError::Timeout | ClientError::Busy { .. }) => (None, Some(now()), Outcome::Busy { holder: None }),
        Err(_) => (None, None, Outcome::Unknown),
    };
    ctx.recorder.op(ctx.client, lock, call, invoked, completed, outcome);
    held.map(|held| (held, now()))
}

/// Ends a session's hold granted at `from` (one of `limit` places): records the span it was believed held
/// (until the release is sent or the lease ran out by this client's clock, whichever came first), releases
/// it and records the call.
async fn session_release(ctx: &Ctx, held: holdfast_client::HeldLock, limit: u32, from: At) {
    let (lock, fence, invoked) = (held.name().to_owned(), held.fence(), now());
    ctx.recorder.place(ctx.client, &lock, limit, fence, from, invoked.min(at_of(held.confirmed_until())));
    let (outcome, completed) = match held.release().await {
        Ok(()) => (Outcome::Released, Some(now())),
        // Lost before the release: nothing was held any more.
        Err(ClientError::SessionLost) => (Outcome::NotHeld, Some(now())),
        Err(_) => (Outcome::Unknown, None),
    };
    ctx.recorder.op(ctx.client, &lock, Call::Release { fence }, invoked, completed, outcome);
}

/// Changes the membership under load: adds node `spare` (started with `--join`), removes `victim`, adds it
/// back (with the data it kept), removes the spare; each step through any member, retried until it is
/// answered. Nothing is begun after `changes_by`.
pub async fn admin_client(ctx: Ctx, spare: u64, victim: u64, changes_by: At) -> turmoil::Result {
    let mut rng = StdRng::seed_from_u64(ctx.seed);
    let steps = [(Method::POST, spare), (Method::DELETE, victim), (Method::POST, victim), (Method::DELETE, spare)];
    tokio::time::sleep(Duration::from_millis(rng.gen_range(1_000..4_000))).await;
    if now() >= changes_by {
        return Ok(());
    }
    // Once begun, every step is made, so that the cluster ends with the members it began with.
    for (method, id) in steps {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1_500))).await;
        let path = match method {
            Method::POST => format!("/v1/cluster/members?id={id}&addr=n{id}:7071"),
            _ => format!("/v1/cluster/members/{id}"),
        };
        // Not through the victim while it is out: a removed node no longer hears from the leader.
        let through: Vec<&String> = ctx.nodes.iter().filter(|n| !n.starts_with(&format!("n{victim}:"))).collect();
        loop {
            let node = through[rng.gen_range(0..through.len())];
            match http::call(node, method.clone(), &path).await {
                Ok((StatusCode::OK, _)) => break,
                // Removed already (an earlier attempt went through after all).
                Ok((StatusCode::CONFLICT, body)) if body["type"] == "urn:holdfast:not-a-member" => break,
                // A refusal is the run's own mistake (the admin key): retrying would quietly make no change.
                Ok((status @ (StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN), body)) => {
                    return Err(format!("{method} {path} refused: {status} {body}").into());
                }
                answer => tracing::debug!(?answer, %path, "membership change not made yet"),
            }
            if now() >= ctx.stop_at {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(rng.gen_range(100..500))).await;
        }
        tracing::info!(%method, id, at = ?now(), "membership changed");
        ctx.recorder.membership_changed(now());
    }
    Ok(())
}

/// What the quiet failover probe ([`quiet_probe`]) and the run's driver tell each other.
#[derive(Debug, Default)]
pub struct Probe {
    /// Set by the probe once it holds both its locks.
    pub ready: bool,
    /// Set by the driver: when it crashed the leader.
    pub crashed_at: Option<At>,
    /// What went wrong, each in a line.
    pub problems: Vec<String>,
}

/// The session lock and the TTL lock of the quiet failover probe.
const PROBE_LOCKS: [&str; 2] = ["probe-session", "probe-ttl"];
/// The TTL of the quiet failover probe's one-call hold.
const PROBE_TTL: Duration = Duration::from_secs(3);
/// How long the probe's session must keep its lock after the crash: three leases.
const PROBE_KEEP: Duration = Duration::from_secs(6);

/// A session and a one-call TTL hold, through one node (a follower), in a cluster nobody else talks to, while
/// the run's driver crashes the leader a lease after they were taken: the session must keep its lock for
/// three leases after the crash, and the TTL hold must run out and be granted again (under a larger fence)
/// within its TTL, an election, a request's bound and `clock_slack` (how far a leader's clock may lag the
/// log's time). Until bug 4's fix a new leader acknowledged no heartbeat in a cluster nobody wrote to; a
/// random schedule's clients always write through its failovers and never showed it. Problems go to
/// `probe.problems`.
pub async fn quiet_probe(ctx: Ctx, clock_slack: Duration, probe: Arc<Mutex<Probe>>) -> turmoil::Result {
    let problem = |text: String| probe.lock().expect("probe poisoned").problems.push(text);
    let through = ctx.nodes[0].clone();
    let [session_lock, ttl_lock] = PROBE_LOCKS;
    // The cluster is healed and converged: each step is answered at once, give or take a retry.
    let client = library_client(&ctx, ctx.nodes.clone())?;
    let session = match client.session(SESSION_LEASE).await {
        Ok(session) => session,
        Err(e) => {
            problem(format!("no session through {through} in a healed cluster: {e}"));
            return Ok(());
        }
    };
    let held = match session.lock(session_lock, Some(Duration::from_secs(2))).await {
        Ok(held) => held,
        Err(e) => {
            problem(format!("the session through {through} was not granted {session_lock:?}: {e}"));
            return Ok(());
        }
    };
    let (ttl_fence, ttl_from) = match http_acquire(&ctx, &through, ttl_lock, PROBE_TTL.as_millis() as u64).await {
        (Outcome::Granted { fence }, _) => (fence, now()),
        (outcome, _) => {
            problem(format!("{ttl_lock:?} through {through} in a healed cluster: {outcome:?}"));
            return Ok(());
        }
    };
    // Held for a lease before the crash: the other nodes' deadlines for the session, set when they applied
    // its opening and never moved (heartbeats go to the leader), have then run out; a new leader must give
    // it a full lease from its promotion.
    tokio::time::sleep(SESSION_LEASE).await;
    probe.lock().expect("probe poisoned").ready = true;
    let crashed_at = loop {
        if let Some(at) = probe.lock().expect("probe poisoned").crashed_at {
            break at;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let keep_until = crashed_at + PROBE_KEEP;
    // A new leader gives the hold a full TTL from its promotion: tried from a TTL after the crash, by
    // when the node the probe talks to has usually heard of the new leader. One already sent to the old
    // leader waits out the request bound (a write is not sent twice).
    let regrant_from = crashed_at + PROBE_TTL;
    let regrant_by = regrant_from + Duration::from_secs(3) + clock_slack + holdfast_server::REQUEST_TIMEOUT;
    let mut regranted = false;
    while now() < keep_until || (!regranted && now() < regrant_by) {
        if now() < keep_until && held.is_lost() {
            problem(format!(
                "the session through {through} lost {session_lock:?} at {:?}, {:?} after the leader crashed",
                now(),
                now() - crashed_at
            ));
            return Ok(());
        }
        if !regranted && now() >= regrant_from {
            match http_acquire(&ctx, &through, ttl_lock, 60_000).await {
                (Outcome::Granted { fence }, _) if fence > ttl_fence => regranted = true,
                (Outcome::Granted { fence }, _) => {
                    problem(format!("{ttl_lock:?} granted again under fence {fence}, not above {ttl_fence}"));
                    regranted = true;
                }
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !regranted {
        problem(format!(
            "{ttl_lock:?} (TTL {PROBE_TTL:?}, taken at {ttl_from:?}) was not granted again by {regrant_by:?}; the \
             leader crashed at {crashed_at:?}"
        ));
    }
    if let Err(e) = held.release().await {
        problem(format!("the session through {through} could not release {session_lock:?}: {e}"));
    }
    let _ = session.close().await;
    Ok(())
}
