//! `sessions --light`: the same sessions as the client library's, driven more cheaply, so that the load
//! generator is not what limits a run of hundreds of thousands of heartbeats a second.
//!
//! One task per connection owns its sessions' streams (raw `Locks.Session` calls): it opens them (`Open`,
//! then `Acquire` of the session's own lock), heartbeats all of them together every lease/4 from their
//! open on (as the library's session task does, while the lock is still being taken too), and reads every
//! stream's events. Each session's lease is kept by the client's rule: confirmed until the send
//! instant of the last acknowledged heartbeat (or the `Open`) plus the lease. A session whose lease ran out
//! by that clock, that was told `Lost`, or whose stream ended, counts as having lost its lock. What the
//! library also does and this does not: resume on another node, reconnect, TLS and API keys.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::stream::FuturesUnordered;
use holdfast_proto::v1::{
    Close, EventKind, Heartbeat, LocksClient, Open, RequestKind, SessionAcquire, SessionEvent, SessionRequest,
};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{StreamExt, StreamMap};
use tonic::Streaming;

use super::Samples;

/// What the light sessions did, shared with the run.
#[derive(Default)]
pub struct Tally {
    pub opened: AtomicUsize,
    pub lost: AtomicUsize,
    pub failures: AtomicUsize,
    pub refused: AtomicUsize,
    pub open: Mutex<Samples>,
    pub lock: Mutex<Samples>,
    /// The longest a heartbeat waited for its acknowledgement (or has waited, unacknowledged) since this
    /// was last taken, in ms: the lateness the sessions see, wherever the wait was.
    pub late_ms: AtomicU64,
    /// Heartbeats not sent because the stream's send queue was full (the node did not read them).
    pub unsent: AtomicUsize,
}

impl Tally {
    /// The longest wait for an acknowledgement since the last call ([`Tally::late_ms`]), and resets it.
    pub fn take_late(&self) -> Duration {
        Duration::from_millis(self.late_ms.swap(0, Ordering::Relaxed))
    }

    fn late(&self, waited: Duration) {
        self.late_ms.fetch_max(waited.as_millis() as u64, Ordering::Relaxed);
    }
}

/// One session's stream and lease.
struct Light {
    tx: mpsc::Sender<SessionRequest>,
    /// Heartbeats sent and not yet acknowledged: sequence number and send instant, oldest first.
    sent: VecDeque<(u64, Instant)>,
    confirmed_until: Instant,
    /// How long the last acknowledged heartbeat took to be acknowledged.
    last_round_trip: Duration,
    /// When its `Acquire` was sent, and its place among the sessions opened at once, until it was answered.
    taking: Option<(Instant, OwnedSemaphorePermit)>,
    /// Heartbeats no longer sent: its lock was lost, or could not be taken.
    lost: bool,
}

fn request(kind: RequestKind) -> SessionRequest {
    SessionRequest { kind: Some(kind) }
}

/// Runs connection `conn`'s sessions (`ids`, to `endpoint`) until `stop` turns true, then closes them.
pub async fn connection(
    endpoint: String,
    ids: std::ops::Range<usize>,
    run_id: u32,
    lease: Duration,
    opening: Arc<Semaphore>,
    tally: Arc<Tally>,
    mut stop: watch::Receiver<bool>,
) {
    let channel = match tonic::transport::Endpoint::from_shared(endpoint).map(|e| e.connect_lazy()) {
        Ok(channel) => channel,
        Err(_) => {
            tally.failures.fetch_add(ids.len(), Ordering::Relaxed);
            return;
        }
    };
    let client = LocksClient::new(channel);
    let ids_start = ids.start;
    // Each session heartbeats from when it is open, not from when the connection's last one is.
    let mut opens: FuturesUnordered<_> = ids
        .map(|i| open(client.clone(), super::sessions::lock_name(run_id, i), lease, opening.clone(), &tally))
        .collect();
    let mut sessions = Vec::new();
    let mut events = StreamMap::new();
    let period = lease / 4;
    // Connections heartbeat at different points of the period (as the library's clients draw theirs), not
    // all at once: the golden ratio spreads consecutive connections evenly.
    let phase = (ids_start as f64 * 0.618_034).fract();
    let mut ticks = tokio::time::interval_at((Instant::now() + period.mul_f64(phase)).into(), period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut seq = 0u64;
    loop {
        tokio::select! {
            Some(opened) = opens.next() => {
                if let Some((session, inbound)) = opened {
                    events.insert(sessions.len(), inbound);
                    sessions.push(session);
                }
            }
            _ = ticks.tick() => {
                seq += 1;
                beat_all(&mut sessions, seq, &tally);
            }
            Some((i, event)) = events.next() => match event.map(|e| e.kind) {
                Ok(Some(EventKind::HeartbeatAck(ack))) => sessions[i].acknowledged(ack.seq, lease, &tally),
                Ok(Some(EventKind::Acquired(_))) => sessions[i].took_lock(&tally),
                Ok(Some(EventKind::Lost(_))) | Err(_) => lose(&mut sessions[i], &tally),
                // Anything else answers the acquire: the lock was not taken.
                Ok(Some(_)) if sessions[i].taking.is_some() => sessions[i].not_taken(&tally),
                Ok(_) => {}
            },
            _ = stop.changed() => break,
        }
    }
    // The window's end: a lease that ran out by now is lost; the rest close, and the streams end.
    let now = Instant::now();
    for session in &mut sessions {
        if !session.lost && now >= session.confirmed_until {
            lose(session, &tally);
        }
        let _ = session.tx.send(request(RequestKind::Close(Close {}))).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), async { while events.next().await.is_some() {} }).await;
}

/// Sends heartbeat `seq` on every session still open (holding its lock or taking it), and counts those whose
/// lease ran out as lost.
fn beat_all(sessions: &mut [Light], seq: u64, tally: &Tally) {
    let now = Instant::now();
    for session in sessions.iter_mut().filter(|s| !s.lost) {
        if now >= session.confirmed_until {
            lose(session, tally);
            continue;
        }
        // As the client library tells it.
        let waiting = session.sent.front().map_or(Duration::ZERO, |&(_, oldest)| now - oldest);
        let late_ms = holdfast_client::heartbeat_late_ms(session.last_round_trip, waiting);
        tally.late(waiting);
        session.sent.push_back((seq, now));
        if session.sent.len() > 8 {
            session.sent.pop_front();
        }
        if session.tx.try_send(request(RequestKind::Heartbeat(Heartbeat { seq, late_ms }))).is_err() {
            tally.unsent.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Light {
    /// Its lock was taken: the session counts as opened.
    fn took_lock(&mut self, tally: &Tally) {
        if let Some((taking, _opening)) = self.taking.take() {
            tally.lock.lock().unwrap().push(taking.elapsed());
            tally.opened.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Its lock was not taken: counted as failed, and the session closed. The close is sent from a task of
    /// its own: a stream whose queue is full must not hold up the connection's other sessions.
    fn not_taken(&mut self, tally: &Tally) {
        self.taking = None;
        self.lost = true;
        tally.failures.fetch_add(1, Ordering::Relaxed);
        let tx = self.tx.clone();
        drop(tokio::spawn(async move { tx.send(request(RequestKind::Close(Close {}))).await }));
    }

    /// Heartbeat `seq` was acknowledged: the lease holds until its send instant plus the lease.
    fn acknowledged(&mut self, seq: u64, lease: Duration, tally: &Tally) {
        while let Some(&(sent_seq, at)) = self.sent.front() {
            if sent_seq > seq {
                break;
            }
            self.sent.pop_front();
            if sent_seq == seq {
                self.confirmed_until = self.confirmed_until.max(at + lease);
                self.last_round_trip = at.elapsed();
                tally.late(self.last_round_trip);
            }
        }
    }
}

fn lose(session: &mut Light, tally: &Tally) {
    if !session.lost {
        session.lost = true;
        tally.lost.fetch_add(1, Ordering::Relaxed);
    }
}

/// Opens a session and asks for its lock `name` (the answer comes on the stream it returns, which the
/// connection's task reads while it heartbeats the session); `None` (counted) if the open failed or was
/// refused.
async fn open(
    mut client: LocksClient<tonic::transport::Channel>,
    name: String,
    lease: Duration,
    opening: Arc<Semaphore>,
    tally: &Tally,
) -> Option<(Light, Streaming<SessionEvent>)> {
    // Held until the lock is taken, or not: an opener waits out its open and then its acquire.
    let permit = opening.acquire_owned().await.ok()?;
    let (tx, rx) = mpsc::channel(16);
    let sent = Instant::now();
    let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
    let owner = "bench-light".to_owned();
    tx.send(request(RequestKind::Open(Open { owner, lease_ms }))).await.ok()?;
    // Counted as refused if the status says so, else as failed.
    let failed = async |status: Option<tonic::Status>| {
        if status.is_some_and(|status| status.code() == tonic::Code::ResourceExhausted) {
            tally.refused.fetch_add(1, Ordering::Relaxed);
            // As a client that honours the refusal would: this opener asks again only after a pause.
            tokio::time::sleep(super::sessions::REFUSED_PAUSE).await;
        } else {
            tally.failures.fetch_add(1, Ordering::Relaxed);
        }
        None
    };
    let mut inbound = match client.session(ReceiverStream::new(rx)).await {
        Ok(response) => response.into_inner(),
        Err(status) => return failed(Some(status)).await,
    };
    match inbound.message().await {
        Ok(Some(SessionEvent { kind: Some(EventKind::Opened(_)) })) => {}
        Err(status) => return failed(Some(status)).await,
        Ok(_) => return failed(None).await,
    }
    tally.open.lock().unwrap().push(sent.elapsed());
    let acquire = SessionAcquire { name, wait: false, value: Vec::new(), lock_delay_ms: 0, limit: 0 };
    let taking = Instant::now();
    tx.send(request(RequestKind::Acquire(acquire))).await.ok()?;
    let light = Light {
        tx,
        sent: VecDeque::new(),
        confirmed_until: sent + lease,
        last_round_trip: Duration::ZERO,
        taking: Some((taking, permit)),
        lost: false,
    };
    Some((light, inbound))
}
