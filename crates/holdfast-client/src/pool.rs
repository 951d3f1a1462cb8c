//! Endpoints: spelling them, a lazily made and cached gRPC channel for each, and the one retry loop that
//! every call goes through.
//!
//! Any node answers any call (followers forward to the leader), so the pool does not need to know which
//! node leads to be correct: it prefers the endpoint that last answered, and falls back through the list in
//! order when a node does not answer or says no leader could serve the request. Knowing the leader only
//! saves the forwarding hop; [`Client::discover_leader`](crate::Client::discover_leader) finds it.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast_proto::dial::Dialer;
use holdfast_proto::v1::{CallKind, LocksClient, ResultKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::calls::CallStream;
use crate::error::Error;

/// The client port a node listens on when an endpoint names no port.
pub const DEFAULT_PORT: u16 = 7070;

/// How the client talks to the cluster; set through [`ClientBuilder`](crate::ClientBuilder).
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// Who this client is, for people reading the lock table.
    pub(crate) owner: String,
    /// How long to wait for a TCP connection to an endpoint.
    pub(crate) connect_timeout: Duration,
    /// How long one attempt of a call may take (plus the wait of an acquire that waits).
    pub(crate) request_timeout: Duration,
    /// The first pause after every endpoint failed once.
    pub(crate) backoff_min: Duration,
    /// The longest pause between rounds.
    pub(crate) backoff_max: Duration,
    /// No new attempt starts this long after a call's first.
    pub(crate) retry_timeout: Duration,
    /// Attempts of one call, over all endpoints.
    pub(crate) max_attempts: u32,
    /// TLS to the nodes, if the cluster's client port uses it.
    pub(crate) tls: Option<Tls>,
    /// `Bearer KEY`, sent with every call, for a cluster with `--auth`.
    pub(crate) api_key: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    /// Makes connections; `None`: tonic's TCP connector.
    pub(crate) dialer: Option<Dialer>,
    /// Seeds the backoff's jitter (simulations); `None`: the operating system's entropy.
    pub(crate) seed: Option<u64>,
}

/// A gRPC client of one node that sends the API key, if there is one.
pub(crate) type NodeClient = LocksClient<InterceptedService<Channel, ApiKey>>;

/// Adds `authorization: Bearer KEY` to every call.
#[derive(Clone)]
pub(crate) struct ApiKey(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for ApiKey {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            if !request.metadata().contains_key("authorization") {
                request.metadata_mut().insert("authorization", value.clone());
            }
        }
        Ok(request)
    }
}

/// TLS settings: the CA that signed the nodes' certificates, and this client's own certificate and key
/// for a cluster that asks for one (all PEM).
#[derive(Clone)]
pub(crate) struct Tls {
    pub(crate) ca_pem: Vec<u8>,
    pub(crate) identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of debug output.
        f.debug_struct("Tls").field("client_certificate", &self.identity.is_some()).finish()
    }
}

/// Checks an endpoint and spells it the one way the pool uses: `http://host:port`, or `https://host:port`
/// when the client has TLS settings (`tls`).
///
/// Accepts `host:port`, `host` (port [`DEFAULT_PORT`]), `[v6]:port`, and the same with an `http://` (or,
/// with TLS, `https://`) prefix and an optional trailing `/`. Refuses the other scheme, paths, queries and
/// user names, rather than quietly ignoring them.
pub(crate) fn normalize(endpoint: &str, tls: bool) -> Result<String, Error> {
    let bad = |why: &str| Error::InvalidArgument(format!("endpoint {endpoint:?}: {why}"));
    let text = endpoint.trim();
    let scheme = if tls { "https" } else { "http" };
    let rest = match text.split_once("://") {
        Some((given, rest)) if given.eq_ignore_ascii_case(scheme) => rest,
        Some((given, _)) if given.eq_ignore_ascii_case("https") => {
            return Err(bad("https needs the cluster's CA (ClientBuilder::tls, or --ca); or use http://"))
        }
        Some((given, _)) if given.eq_ignore_ascii_case("http") => {
            return Err(bad("this client has TLS settings: use https:// or no scheme"))
        }
        Some((given, _)) => return Err(bad(&format!("unknown scheme {given:?}; use {scheme}://"))),
        None => text,
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() {
        return Err(bad("no host"));
    }
    if authority.contains(['/', '?', '#', '@']) || authority.contains(char::is_whitespace) {
        return Err(bad("expected host[:port], without a path, query or user name"));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (address, after) = v6.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or_else(|| bad("expected ':port' after ']'"))?),
        };
        (format!("[{address}]"), port)
    } else {
        match authority.split_once(':') {
            Some((_, port)) if port.contains(':') => return Err(bad("write an IPv6 address in brackets: [::1]:7070")),
            Some((host, port)) => (host.to_owned(), Some(port)),
            None => (authority.to_owned(), None),
        }
    };
    if host.is_empty() || host == "[]" {
        return Err(bad("no host"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p != 0 => p,
            _ => return Err(bad(&format!("bad port {p:?}"))),
        },
    };
    let uri = format!("{scheme}://{host}:{port}");
    Endpoint::from_shared(uri.clone()).map_err(|e| bad(&e.to_string()))?;
    Ok(uri)
}

/// The pause before round `round` (1 = after every endpoint failed once) of a call's attempts, before
/// jitter: `min` doubling each round, never above `max`.
pub(crate) fn backoff_ceiling(min: Duration, max: Duration, round: u32) -> Duration {
    let doublings = round.saturating_sub(1).min(30);
    min.saturating_mul(1 << doublings).min(max)
}

/// How one call retries: where it starts, how long each attempt may take and when to stop.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Retry {
    /// The endpoint to try first.
    pub(crate) start: usize,
    /// How long one attempt may take.
    pub(crate) attempt_timeout: Duration,
    /// No attempt starts at or after this instant.
    pub(crate) deadline: Instant,
    /// Whether an attempt must also end by the deadline (a session resuming before its lease runs out),
    /// rather than only start before it.
    pub(crate) hard_deadline: bool,
    /// Attempts, over all endpoints.
    pub(crate) max_attempts: u32,
}

/// The endpoints of one cluster and their channels. Shared by a client, its clones and its sessions.
pub(crate) struct Pool {
    endpoints: Vec<String>,
    /// One channel per endpoint, made on first use. A tonic channel reconnects by itself, so a cached one
    /// stays good after its node restarts.
    channels: Mutex<Vec<Option<Channel>>>,
    /// One `Calls` stream per endpoint for the one-shot calls, opened on first use.
    streams: Vec<Mutex<Streamed>>,
    /// The endpoint that answered last; calls start there.
    preferred: AtomicUsize,
    /// Jitters the backoff between rounds of retries.
    jitter: Mutex<StdRng>,
    /// When the client was made, and a random fraction of a heartbeat period: its heartbeat grids pass
    /// through `made + fraction × period` ([`Pool::beat_origin`]).
    made: Instant,
    beat_phase: f64,
    pub(crate) config: Config,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("endpoints", &self.endpoints)
            .field("preferred", &self.preferred.load(Ordering::Relaxed))
            .field("config", &self.config)
            .finish()
    }
}

impl Pool {
    /// A pool over already normalised, non-empty `endpoints`. Makes no connection.
    pub(crate) fn new(endpoints: Vec<String>, config: Config) -> Arc<Pool> {
        assert!(!endpoints.is_empty(), "a pool needs an endpoint");
        let channels = Mutex::new(vec![None; endpoints.len()]);
        let mut rng = config.seed.map_or_else(StdRng::from_entropy, StdRng::seed_from_u64);
        let beat_phase = rng.gen_range(0.0..1.0);
        let streams = endpoints.iter().map(|_| Mutex::new(Streamed::NotYet)).collect();
        let (jitter, made, preferred) = (Mutex::new(rng), Instant::now(), AtomicUsize::new(0));
        Arc::new(Pool { endpoints, channels, streams, preferred, jitter, made, beat_phase, config })
    }

    /// A point of the grid this client's sessions heartbeat on, every `period` (see
    /// [`crate::lease::next_tick`]): clients made at the same moment still heartbeat at different ones.
    pub(crate) fn beat_origin(&self, period: Duration) -> Instant {
        self.made + period.mul_f64(self.beat_phase)
    }

    pub(crate) fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    pub(crate) fn preferred(&self) -> usize {
        self.preferred.load(Ordering::Relaxed)
    }

    pub(crate) fn prefer(&self, i: usize) {
        assert!(i < self.endpoints.len());
        self.preferred.store(i, Ordering::Relaxed);
    }

    /// A client on endpoint `i`'s channel, making the channel on first use (without connecting yet).
    pub(crate) fn client(&self, i: usize) -> NodeClient {
        let mut channels = self.channels.lock().expect("channel cache poisoned");
        let channel = channels[i].get_or_insert_with(|| {
            let mut endpoint = Endpoint::from_shared(self.endpoints[i].clone())
                .expect("endpoints are normalised when the client is built");
            if let Some(tls) = &self.config.tls {
                let mut config = tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(&tls.ca_pem));
                if let Some((cert, key)) = &tls.identity {
                    config = config.identity(tonic::transport::Identity::from_pem(cert, key));
                }
                endpoint = endpoint.tls_config(config).expect("TLS settings are checked when the client is built");
            }
            let endpoint = endpoint
                .connect_timeout(self.config.connect_timeout)
                .tcp_nodelay(true)
                // Lets a session stream notice a node that vanished without closing its connections
                // (power loss, partition) even when the session's own heartbeats are far apart.
                .http2_keep_alive_interval(Duration::from_secs(5))
                .keep_alive_timeout(Duration::from_secs(5));
            match &self.config.dialer {
                Some(dialer) => dialer.channel(&endpoint),
                None => endpoint.connect_lazy(),
            }
        });
        LocksClient::with_interceptor(channel.clone(), ApiKey(self.config.api_key.clone()))
    }

    /// One-shot call `kind`, on the `Calls` stream of one endpoint after another as `plan` says.
    pub(crate) async fn call_one_shot(&self, what: &str, plan: Retry, kind: CallKind) -> Result<ResultKind, Error> {
        self.call(what, plan, |i, client| self.one_shot(i, client, kind.clone())).await
    }

    /// Makes one-shot call `kind` to endpoint `i` (whose client is `client`): on the endpoint's `Calls`
    /// stream, opened on first use, or as a unary call if the node has no such stream.
    pub(crate) async fn one_shot(&self, i: usize, client: NodeClient, kind: CallKind) -> Result<ResultKind, Error> {
        let Some(stream) = self.stream(i, &client) else { return Ok(unary(client, kind).await?) };
        // Until the node has accepted the stream, it may refuse it as an older server does; the call is then
        // made again as a unary call.
        let fallback = (!stream.opened()).then(|| kind.clone());
        match (stream.call(kind).await, fallback) {
            (Err(status), Some(kind)) if status.code() == tonic::Code::Unimplemented && stream.refused() => {
                tracing::debug!(endpoint = self.endpoints[i], "no Calls stream on this node; one-shot calls are unary");
                *self.streams[i].lock().expect("streams poisoned") = Streamed::Unary;
                Ok(unary(client, kind).await?)
            }
            (answer, _) => Ok(answer?),
        }
    }

    /// Endpoint `i`'s `Calls` stream, opened with `client` if there is none (or it ended); `None` if its
    /// node has none.
    fn stream(&self, i: usize, client: &NodeClient) -> Option<Arc<CallStream>> {
        let mut streamed = self.streams[i].lock().expect("streams poisoned");
        match &*streamed {
            Streamed::Open(stream) if !stream.ended() => return Some(stream.clone()),
            Streamed::Unary => return None,
            _ => {}
        }
        let stream = Arc::new(CallStream::open(client.clone()));
        *streamed = Streamed::Open(stream.clone());
        Some(stream)
    }

    /// The retry plan of an ordinary call: start at the preferred endpoint, give each attempt the request
    /// timeout plus `extra` (an acquire's wait), stop starting attempts after the retry timeout.
    pub(crate) fn retry(&self, extra: Duration) -> Retry {
        Retry {
            start: self.preferred(),
            attempt_timeout: self.config.request_timeout.saturating_add(extra),
            deadline: Instant::now() + self.config.retry_timeout,
            hard_deadline: false,
            max_attempts: self.config.max_attempts.max(1),
        }
    }

    /// Runs `attempt` on one endpoint after another until it succeeds, fails with an error that another
    /// endpoint would not change, or the plan runs out (then [`Error::Unavailable`]).
    ///
    /// Endpoints are tried in list order from `plan.start`; after each full round the loop pauses, doubling
    /// the pause each round (with jitter, so that clients that lost the same node do not come back in step).
    /// Retrying a write whose first attempt got no answer may apply it twice: see the notes on
    /// [`Client`](crate::Client).
    pub(crate) async fn call<T, F, Fut>(&self, what: &str, plan: Retry, mut attempt: F) -> Result<T, Error>
    where
        F: FnMut(usize, NodeClient) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let n = self.endpoints.len();
        let started = Instant::now();
        let mut last: Option<(usize, Error)> = None;
        let mut tried = 0;
        for k in 0..plan.max_attempts {
            if k > 0 && k as usize % n == 0 {
                let round = k / n as u32;
                let ceiling = backoff_ceiling(self.config.backoff_min, self.config.backoff_max, round);
                let pause = ceiling.mul_f64(self.jitter.lock().expect("jitter poisoned").gen_range(0.5..=1.0));
                tokio::time::sleep_until((Instant::now() + pause).min(plan.deadline)).await;
            }
            let now = Instant::now();
            if k > 0 && now >= plan.deadline {
                break;
            }
            let i = (plan.start + k as usize) % n;
            let timeout = match plan.hard_deadline {
                true => plan.attempt_timeout.min(plan.deadline.saturating_duration_since(now)),
                false => plan.attempt_timeout,
            };
            tried += 1;
            let result = match tokio::time::timeout(timeout, attempt(i, self.client(i))).await {
                Ok(result) => result,
                Err(_) => Err(Error::Unavailable(format!("no answer within {timeout:?}"))),
            };
            match result {
                Ok(value) => {
                    self.prefer(i);
                    return Ok(value);
                }
                Err(e) if e.is_retryable() => {
                    let endpoint = &self.endpoints[i];
                    tracing::debug!(endpoint, error = %e, what, "endpoint failed; trying the next");
                    last = Some((i, e));
                }
                Err(e) => {
                    // The node answered, so it is a good one to start from next time.
                    self.prefer(i);
                    return Err(e);
                }
            }
        }
        let elapsed = started.elapsed();
        Err(match last {
            Some((i, e)) => Error::Unavailable(format!(
                "{what}: no endpoint answered ({tried} attempts in {elapsed:?}); last, {}: {e}",
                self.endpoints[i]
            )),
            None => Error::Unavailable(format!("{what}: no attempt was made before the deadline")),
        })
    }
}

/// An endpoint's `Calls` stream.
enum Streamed {
    NotYet,
    Open(Arc<CallStream>),
    /// Its node has none (an older server): one-shot calls to it are unary.
    Unary,
}

/// One-shot call `kind` as a unary call.
async fn unary(mut client: NodeClient, kind: CallKind) -> Result<ResultKind, tonic::Status> {
    Ok(match kind {
        CallKind::Acquire(r) => ResultKind::Hold(client.acquire(r).await?.into_inner()),
        CallKind::Renew(r) => ResultKind::Hold(client.renew(r).await?.into_inner()),
        CallKind::Release(r) => ResultKind::Released(client.release(r).await?.into_inner()),
        CallKind::Get(r) => ResultKind::Lock(client.get(r).await?.into_inner()),
        CallKind::SetValue(r) => ResultKind::Hold(client.set_value(r).await?.into_inner()),
        CallKind::Cancel(_) => return Err(tonic::Status::invalid_argument("a cancel is not a call")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_spelled_one_way() {
        let cases = [
            ("127.0.0.1:7070", "http://127.0.0.1:7070"),
            ("http://127.0.0.1:7070", "http://127.0.0.1:7070"),
            ("http://127.0.0.1:7070/", "http://127.0.0.1:7070"),
            ("HTTP://node-1:9000", "http://node-1:9000"),
            ("  node-1:9000 ", "http://node-1:9000"),
            ("localhost", "http://localhost:7070"),
            ("http://db.example", "http://db.example:7070"),
            ("[::1]:7071", "http://[::1]:7071"),
            ("[::1]", "http://[::1]:7070"),
            ("http://[fe80::1]:18070/", "http://[fe80::1]:18070"),
        ];
        for (input, want) in cases {
            assert_eq!(normalize(input, false).as_deref(), Ok(want), "{input}");
            let tls = want.replacen("http://", "https://", 1);
            let input = input.replacen("http://", "https://", 1).replacen("HTTP://", "HTTPS://", 1);
            assert_eq!(normalize(&input, true).as_deref(), Ok(tls.as_str()), "{input} with TLS");
        }
    }

    #[test]
    fn bad_endpoints_are_refused_with_a_reason() {
        for input in [
            "",
            "   ",
            "http://",
            "https://node:7070",
            "grpc://node:7070",
            "node:port",
            "node:0",
            "node:70700",
            "node:7070/path",
            "user@node:7070",
            "::1:7070",
            "[::1",
            "[::1]7070",
            "[]:7070",
            ":7070",
            "node 1:7070",
        ] {
            match normalize(input, false) {
                Err(Error::InvalidArgument(why)) => assert!(why.contains("endpoint"), "{why}"),
                other => panic!("{input:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn backoff_doubles_per_round_up_to_its_bound() {
        let min = Duration::from_millis(50);
        let max = Duration::from_secs(2);
        let rounds: Vec<u64> = (1..=8).map(|r| backoff_ceiling(min, max, r).as_millis() as u64).collect();
        assert_eq!(rounds, [50, 100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(backoff_ceiling(min, max, u32::MAX), max);
    }

    fn config() -> Config {
        Config {
            owner: "test".into(),
            connect_timeout: Duration::from_millis(100),
            request_timeout: Duration::from_millis(100),
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(40),
            retry_timeout: Duration::from_secs(60),
            max_attempts: 7,
            tls: None,
            api_key: None,
            dialer: None,
            seed: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn calls_fall_back_through_the_list_in_order_and_then_prefer_the_one_that_answered() {
        let pool = Pool::new(vec!["http://a:1".into(), "http://b:1".into(), "http://c:1".into()], config());
        let mut seen = vec![];
        let answer = pool
            .call("test", pool.retry(Duration::ZERO), |i, _| {
                seen.push(i);
                async move {
                    match i {
                        2 => Ok(i),
                        _ => Err(Error::Unavailable("down".into())),
                    }
                }
            })
            .await;
        assert_eq!(answer, Ok(2));
        assert_eq!(seen, [0, 1, 2]);
        assert_eq!(pool.preferred(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_that_another_node_would_not_change_is_not_retried() {
        let pool = Pool::new(vec!["http://a:1".into(), "http://b:1".into()], config());
        pool.prefer(1);
        let mut attempts = 0;
        let answer: Result<(), _> = pool
            .call("test", pool.retry(Duration::ZERO), |_, _| {
                attempts += 1;
                async { Err(Error::NotFound) }
            })
            .await;
        assert_eq!(answer, Err(Error::NotFound));
        assert_eq!(attempts, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_are_bounded_in_attempts_and_back_off_between_rounds() {
        let pool = Pool::new(vec!["http://a:1".into(), "http://b:1".into()], config());
        let start = Instant::now();
        let mut at = vec![];
        let answer: Result<(), _> = pool
            .call("test", pool.retry(Duration::ZERO), |i, _| {
                at.push((i, start.elapsed()));
                async { Err(Error::Unavailable("down".into())) }
            })
            .await;
        let Err(Error::Unavailable(why)) = answer else { panic!("{answer:?}") };
        assert!(why.contains("7 attempts"), "{why}");
        assert_eq!(at.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [0, 1, 0, 1, 0, 1, 0]);
        // No pause inside a round; a jittered pause of at most 10, 20, 40 ms between rounds.
        assert_eq!(at[1].1, at[0].1);
        let pauses: Vec<Duration> = [2, 4, 6].iter().map(|&k| at[k].1 - at[k - 1].1).collect();
        for (pause, ceiling) in pauses.iter().zip([10, 20, 40]) {
            assert!(*pause >= Duration::from_millis(ceiling / 2), "{pauses:?}");
            assert!(*pause <= Duration::from_millis(ceiling), "{pauses:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hard_deadline_cuts_the_attempt_that_would_outlive_it() {
        let pool = Pool::new(vec!["http://a:1".into()], config());
        let start = Instant::now();
        let plan = Retry {
            start: 0,
            attempt_timeout: Duration::from_secs(10),
            deadline: start + Duration::from_millis(250),
            hard_deadline: true,
            max_attempts: 100,
        };
        let answer: Result<(), _> =
            pool.call("test", plan, |_, _| async { std::future::pending::<Result<(), Error>>().await }).await;
        assert!(matches!(answer, Err(Error::Unavailable(_))), "{answer:?}");
        assert_eq!(start.elapsed(), Duration::from_millis(250));
    }
}
