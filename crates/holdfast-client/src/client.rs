//! [`Client`] and [`ClientBuilder`]: endpoints, sessions, the lock conveniences and the one-shot calls.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use holdfast_proto::v1::{
    AcquireRequest, AddMemberRequest, CallKind, ClusterStatusRequest, GetRequest, ListRequest, ReleaseRequest,
    RemoveMemberRequest, RenewRequest, ResultKind, SetValueRequest, SnapshotRequest,
};
use tokio::task::JoinSet;
use tokio_stream::Stream;

use crate::election::{Leader, Leadership};
use crate::error::Error;
use crate::pool::{normalize, Config, Pool, Retry};
use crate::session::{HeldLock, Session};
use crate::types::{millis_ceil, AcquireOptions, ClusterStatus, Hold, ListPage, LockInfo, Released, SnapshotInfo};
use crate::watch::Watch;

/// One-shot `SetValue` through `pool` (also what a session's [`HeldLock::set_value`] uses).
pub(crate) async fn set_value_on(pool: &Pool, name: &str, token: &str, value: Vec<u8>) -> Result<Hold, Error> {
    let request = SetValueRequest { name: name.to_owned(), token: token.to_owned(), value };
    match pool.call_one_shot("set value", pool.retry(Duration::ZERO), CallKind::SetValue(request)).await? {
        ResultKind::Hold(hold) => Ok(hold.into()),
        other => Err(unexpected("set value", &other)),
    }
}

/// A one-shot call answered with a kind of answer that is not its own.
fn unexpected(what: &str, answer: &ResultKind) -> Error {
    Error::Protocol(format!("{what} was answered with {answer:?}"))
}

/// The session lease [`Client::campaign`] keeps a leadership with: a leader that dies is replaced this long
/// after its last heartbeat (plus an election of the cluster's, if its node died too).
pub const ELECTION_LEASE: Duration = Duration::from_secs(10);

/// Longest owner description the server accepts, in bytes.
const OWNER_LEN_MAX: usize = 128;

/// A handle to a holdfast cluster. Cheap to clone; clones share endpoints, channels and the preferred
/// endpoint.
///
/// Every call goes to the endpoint that answered last and falls back through the list in order when a node
/// does not answer or has no leader (see [`ClientBuilder`] for the bounds). Any node serves any call, so
/// this is correct whichever node leads; [`discover_leader`](Self::discover_leader) finds the leader to save
/// the followers' forwarding hop, and [`connect`](Self::connect) does so once.
///
/// A write whose attempt got no answer (a node died mid-call, or answered UNAVAILABLE) has an unknown
/// outcome, and the retry on the next endpoint may find it done: a retried [`acquire`](Self::acquire) can
/// then answer [`Error::Busy`] with this client's own owner as the holder, and a retried
/// [`release`](Self::release) can answer [`Error::NotHolder`]. Sessions do not have this problem: their
/// requests are idempotent and checked against the server's report after a resume.
#[derive(Clone)]
pub struct Client {
    pool: Arc<Pool>,
}

/// Configures a [`Client`]: owner name, timeouts and retry bounds.
///
/// ```no_run
/// # async fn example() -> Result<(), holdfast_client::Error> {
/// use std::time::Duration;
///
/// let client = holdfast_client::Client::builder(["10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"])
///     .owner("importer@host-7")
///     .request_timeout(Duration::from_secs(3))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    endpoints: Vec<String>,
    config: Config,
}

impl ClientBuilder {
    /// A builder for `endpoints` (`"host:port"`, `"host"` for port 7070, `"[::1]:7070"`, or any of those after
    /// `http://`) with the default settings.
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientBuilder {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            config: Config {
                owner: default_owner(),
                connect_timeout: Duration::from_secs(2),
                request_timeout: Duration::from_secs(5),
                backoff_min: Duration::from_millis(50),
                backoff_max: Duration::from_secs(2),
                retry_timeout: Duration::from_secs(10),
                max_attempts: 10,
                tls: None,
                api_key: None,
                dialer: None,
                seed: None,
            },
        }
    }

    /// The same settings for other `endpoints` (to talk to one node only, say).
    pub fn with_endpoints<I, S>(mut self, endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.endpoints = endpoints.into_iter().map(Into::into).collect();
        self
    }

    /// Talks TLS to the cluster: `ca_pem` is the CA that signed the nodes' certificates; `identity`, this
    /// client's certificate and key (PEM), for a cluster that requires client certificates
    /// (`--tls-client-auth`). Endpoints then default to `https://`.
    pub fn tls(mut self, ca_pem: impl Into<Vec<u8>>, identity: Option<(Vec<u8>, Vec<u8>)>) -> Self {
        self.config.tls = Some(crate::pool::Tls { ca_pem: ca_pem.into(), identity });
        self
    }

    /// Sends `key` (from `POST /v1/signup`) with every call, for a cluster with `--auth`. Each key is its
    /// own namespace of locks.
    pub fn api_key(mut self, key: &str) -> Self {
        // A key that is not valid metadata cannot be valid at the server either; it is then sent as an
        // empty bearer, which the server refuses clearly.
        self.config.api_key =
            Some(format!("Bearer {key}").parse().unwrap_or_else(|_| "Bearer ".parse().expect("ASCII")));
        self
    }

    /// Makes connections through `dialer` instead of TCP: the simulation's network.
    pub fn dialer(mut self, dialer: holdfast_proto::dial::Dialer) -> Self {
        self.config.dialer = Some(dialer);
        self
    }

    /// Seeds the jitter of retry pauses, so that a simulated run is a function of its seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.config.seed = Some(seed);
        self
    }

    /// Who this client is, shown to people reading the lock table (default: `hostname/pid`). At most 128
    /// bytes, no control characters.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.config.owner = owner.into();
        self
    }

    /// How long to wait for a TCP connection to one endpoint (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// How long one attempt of a call may take before the next endpoint is tried (default 5 s). An acquire
    /// that waits in the queue gets its wait on top.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.config.request_timeout = timeout;
        self
    }

    /// The pause after every endpoint failed once (default 50 ms), doubling each round up to `max`
    /// (default 2 s). Pauses are jittered down to half.
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        self.config.backoff_min = min;
        self.config.backoff_max = max.max(min);
        self
    }

    /// No new attempt of a call starts this long after its first (default 10 s); then the call fails with
    /// [`Error::Unavailable`].
    pub fn retry_timeout(mut self, timeout: Duration) -> Self {
        self.config.retry_timeout = timeout;
        self
    }

    /// Attempts of one call over all endpoints (default 10, at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.config.max_attempts = attempts.max(1);
        self
    }

    /// Checks the settings and makes a client without contacting the cluster. Channels are made on first
    /// use.
    pub fn build(self) -> Result<Client, Error> {
        if self.endpoints.is_empty() {
            return Err(Error::InvalidArgument("no endpoints".into()));
        }
        let owner = &self.config.owner;
        if owner.len() > OWNER_LEN_MAX || owner.chars().any(char::is_control) {
            return Err(Error::InvalidArgument(format!(
                "owner {owner:?}: at most {OWNER_LEN_MAX} bytes, no control characters"
            )));
        }
        let tls = self.config.tls.is_some();
        let endpoints = self.endpoints.iter().map(|e| normalize(e, tls)).collect::<Result<Vec<_>, _>>()?;
        Ok(Client { pool: Pool::new(endpoints, self.config) })
    }

    /// Makes a client and finds the leader: asks every endpoint for its cluster status, prefers the one
    /// that leads (else the first that answered), and retries in rounds within the retry bounds. Fails with
    /// [`Error::Unavailable`] if no endpoint answers.
    pub async fn connect(self) -> Result<Client, Error> {
        let client = self.build()?;
        client.discover_leader().await?;
        Ok(client)
    }
}

impl Client {
    /// Connects to a cluster through `endpoints` with the default settings; see [`ClientBuilder::connect`].
    pub async fn connect<I, S>(endpoints: I) -> Result<Client, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientBuilder::new(endpoints).connect().await
    }

    /// A builder, to set the owner, timeouts and retry bounds.
    pub fn builder<I, S>(endpoints: I) -> ClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientBuilder::new(endpoints)
    }

    /// The owner description this client acquires locks and opens sessions with.
    pub fn owner(&self) -> &str {
        &self.pool.config.owner
    }

    /// The endpoints, normalised to `http://host:port`, in fallback order.
    pub fn endpoints(&self) -> &[String] {
        self.pool.endpoints()
    }

    /// The endpoint calls start at: the one that answered last.
    pub fn preferred_endpoint(&self) -> &str {
        &self.pool.endpoints()[self.pool.preferred()]
    }

    /// Asks every endpoint for its cluster status at once and prefers the endpoint of the leader: the one
    /// whose node says it leads, or whose node id another node names as leader. Returns that leader's
    /// status, or `Ok(None)` if some node answered but none is (known to be) the leader, in which case the
    /// first that answered is preferred. Retries in rounds within the retry bounds while no node answers,
    /// then fails with [`Error::Unavailable`].
    pub async fn discover_leader(&self) -> Result<Option<ClusterStatus>, Error> {
        let config = &self.pool.config;
        let deadline = tokio::time::Instant::now() + config.retry_timeout;
        let mut round = 0;
        loop {
            let statuses = self.probe_all().await;
            let answered: Vec<&ClusterStatus> = statuses.iter().flatten().collect();
            if let Some(first) = answered.first() {
                // A node id that some node names as leader, mapped to the endpoint that answered as that id.
                let leader = answered.iter().find(|s| s.is_leader()).or_else(|| {
                    let id = answered.iter().find_map(|s| s.leader)?;
                    answered.iter().find(|s| s.id == id)
                });
                let chosen = leader.unwrap_or(first);
                let index = statuses.iter().position(|s| s.as_ref().map(|s| &s.endpoint) == Some(&chosen.endpoint));
                self.pool.prefer(index.expect("chosen among the answers"));
                return Ok(leader.map(|s| (*s).clone()));
            }
            round += 1;
            let pause = crate::pool::backoff_ceiling(config.backoff_min, config.backoff_max, round);
            if round >= config.max_attempts || tokio::time::Instant::now() + pause >= deadline {
                return Err(Error::Unavailable(format!(
                    "no endpoint answered a cluster status request ({round} rounds over {} endpoints)",
                    self.pool.endpoints().len()
                )));
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// One cluster status from every endpoint, in endpoint order (`None` where no answer came in time).
    async fn probe_all(&self) -> Vec<Option<ClusterStatus>> {
        let timeout = self.pool.config.request_timeout;
        let mut probes = JoinSet::new();
        for (i, endpoint) in self.pool.endpoints().iter().enumerate() {
            let mut client = self.pool.client(i);
            let endpoint = endpoint.clone();
            probes.spawn(async move {
                let answer = tokio::time::timeout(timeout, client.cluster_status(ClusterStatusRequest {})).await;
                let status = match answer {
                    Ok(Ok(response)) => Some(ClusterStatus::from_proto(endpoint.clone(), response.into_inner())),
                    Ok(Err(status)) => {
                        tracing::debug!(endpoint, error = %Error::from(status), "cluster status probe failed");
                        None
                    }
                    Err(_) => {
                        tracing::debug!(endpoint, "cluster status probe timed out");
                        None
                    }
                };
                (i, status)
            });
        }
        let mut statuses = vec![None; self.pool.endpoints().len()];
        while let Some(joined) = probes.join_next().await {
            if let Ok((i, status)) = joined {
                statuses[i] = status;
            }
        }
        statuses
    }

    // ---- sessions ----

    /// Opens a session with `lease` (within the server's bounds; a 2 s lease is typical). See [`Session`].
    pub async fn session(&self, lease: Duration) -> Result<Session, Error> {
        Session::open(self.pool.clone(), lease).await
    }

    /// Runs `work` while holding the lock `name`: opens a session with `lease`, waits in the lock's queue
    /// for as long as it takes, runs `work` with the lock, then closes the session (which hands the lock to
    /// the next waiter at once) and returns what `work` returned.
    ///
    /// `work` should watch [`HeldLock::lost`] and pass [`HeldLock::fence`] to what it protects: if the lease
    /// cannot be kept (the cluster or the network failed for longer than the lease) the lock is lost while
    /// `work` runs, and `with_lock` does not stop `work` by itself. Use [`Session::lock`] with a wait to
    /// bound the wait.
    pub async fn with_lock<F, Fut, T>(&self, name: impl Into<String>, lease: Duration, work: F) -> Result<T, Error>
    where
        F: FnOnce(HeldLock) -> Fut,
        Fut: Future<Output = T>,
    {
        let session = self.session(lease).await?;
        let held = match session.lock(name, None).await {
            Ok(held) => held,
            Err(e) => {
                let _ = session.close().await;
                return Err(e);
            }
        };
        let output = work(held).await;
        if let Err(e) = session.close().await {
            tracing::debug!(error = %e, "closing the session after with_lock");
        }
        Ok(output)
    }

    /// Opens a session with `lease` and takes the lock `name` if it is free: `Ok(None)` (and the session
    /// closed) if someone else holds it. Dropping both the session and the lock releases the lock and
    /// closes the session in the background.
    pub async fn try_lock(
        &self,
        name: impl Into<String>,
        lease: Duration,
    ) -> Result<Option<(Session, HeldLock)>, Error> {
        let session = self.session(lease).await?;
        match session.try_lock(name).await {
            Ok(Some(held)) => Ok(Some((session, held))),
            Ok(None) => {
                let _ = session.close().await;
                Ok(None)
            }
            Err(e) => {
                let _ = session.close().await;
                Err(e)
            }
        }
    }

    /// Opens a session with `lease` and takes the lock `name`, waiting in its queue up to `wait`; fails with
    /// [`Error::Timeout`] (and closes the session) if it was not granted in time.
    pub async fn lock_timeout(
        &self,
        name: impl Into<String>,
        lease: Duration,
        wait: Duration,
    ) -> Result<(Session, HeldLock), Error> {
        let session = self.session(lease).await?;
        match session.lock(name, Some(wait)).await {
            Ok(held) => Ok((session, held)),
            Err(e) => {
                let _ = session.close().await;
                Err(e)
            }
        }
    }

    // ---- one-shot calls ----

    /// One-shot call `kind`, on the `Calls` stream of one endpoint after another as `plan` says.
    async fn one_shot(&self, what: &str, plan: Retry, kind: CallKind) -> Result<ResultKind, Error> {
        self.pool.call_one_shot(what, plan, kind).await
    }

    /// Takes the lock `name` for `ttl` (renew before it runs out), as this client's owner. With a non-zero
    /// `wait`, queues and waits up to that long. Fails with [`Error::Busy`] if it was not granted.
    pub async fn acquire(&self, name: &str, ttl: Duration, wait: Duration) -> Result<Hold, Error> {
        self.acquire_with_value(name, ttl, wait, Vec::new()).await
    }

    /// [`acquire`](Self::acquire), publishing `value` (at most 1 KiB) while the hold lasts: reads, busy
    /// answers and watches of the lock show it.
    pub async fn acquire_with_value(
        &self,
        name: &str,
        ttl: Duration,
        wait: Duration,
        value: impl Into<Vec<u8>>,
    ) -> Result<Hold, Error> {
        self.acquire_with(name, ttl, wait, AcquireOptions { value: value.into(), ..AcquireOptions::default() }).await
    }

    /// [`acquire`](Self::acquire) with [`AcquireOptions`]: a value to publish, a lock-delay.
    pub async fn acquire_with(
        &self,
        name: &str,
        ttl: Duration,
        wait: Duration,
        options: AcquireOptions,
    ) -> Result<Hold, Error> {
        let request = AcquireRequest {
            name: name.to_owned(),
            owner: self.pool.config.owner.clone(),
            ttl_ms: millis_ceil(ttl),
            wait_ms: millis_ceil(wait),
            value: options.value,
            lock_delay_ms: millis_ceil(options.lock_delay),
            limit: options.limit,
        };
        match self.one_shot("acquire", self.pool.retry(wait), CallKind::Acquire(request)).await? {
            ResultKind::Hold(hold) => Ok(hold.into()),
            other => Err(unexpected("acquire", &other)),
        }
    }

    /// Extends the hold of `token` on `name` to `ttl` from now (`None`: its current TTL). Fails with
    /// [`Error::Expired`] if it already ran out and [`Error::NotHolder`] if the token does not hold the lock.
    pub async fn renew(&self, name: &str, token: &str, ttl: Option<Duration>) -> Result<Hold, Error> {
        let request =
            RenewRequest { name: name.to_owned(), token: token.to_owned(), ttl_ms: ttl.map_or(0, millis_ceil) };
        match self.one_shot("renew", self.pool.retry(Duration::ZERO), CallKind::Renew(request)).await? {
            ResultKind::Hold(hold) => Ok(hold.into()),
            other => Err(unexpected("renew", &other)),
        }
    }

    /// Publishes `value` on the hold of `token` on `name` (one log entry: the fence stays, the lock's
    /// revision moves). Fails with [`Error::NotHolder`] if the token does not hold the lock.
    pub async fn set_value(&self, name: &str, token: &str, value: impl Into<Vec<u8>>) -> Result<Hold, Error> {
        set_value_on(&self.pool, name, token, value.into()).await
    }

    /// Lets go of the hold of `token` on `name`; the next waiter is granted at once.
    pub async fn release(&self, name: &str, token: &str) -> Result<Released, Error> {
        let request = ReleaseRequest { name: name.to_owned(), token: token.to_owned() };
        match self.one_shot("release", self.pool.retry(Duration::ZERO), CallKind::Release(request)).await? {
            ResultKind::Released(released) => Ok(released.into()),
            other => Err(unexpected("release", &other)),
        }
    }

    /// Campaigns in election `name` (a lock) with a session of [`ELECTION_LEASE`]: waits its turn behind
    /// the candidates before it, then leads, publishing `value` (its address, say), until it resigns or
    /// its lease is lost. See [`Leadership`].
    pub async fn campaign(&self, name: &str, value: impl Into<Vec<u8>>) -> Result<Leadership, Error> {
        self.campaign_with_lease(name, ELECTION_LEASE, value).await
    }

    /// [`campaign`](Self::campaign) with a session lease of `lease`.
    pub async fn campaign_with_lease(
        &self,
        name: &str,
        lease: Duration,
        value: impl Into<Vec<u8>>,
    ) -> Result<Leadership, Error> {
        let session = self.session(lease).await?;
        match session.lock_with_value(name, None, value).await {
            Ok(held) => Ok(Leadership::new(session, held)),
            Err(e) => {
                let _ = session.close().await;
                Err(e)
            }
        }
    }

    /// Who leads election `name` now (a linearizable read); `None` if nobody does.
    pub async fn leader(&self, name: &str) -> Result<Option<Leader>, Error> {
        Ok(self.get(name).await?.and_then(|lock| lock.holder).map(Leader::of))
    }

    /// The leaders of election `name` as they change, starting with the one now (`None`: nobody leads).
    pub fn observe(&self, name: &str) -> Pin<Box<dyn Stream<Item = Result<Option<Leader>, Error>> + Send>> {
        crate::election::leaders(self.watch(name))
    }

    /// Watches lock `name` from now on: see [`Watch`]. Nothing is sent until the first
    /// [`Watch::next`].
    pub fn watch(&self, name: &str) -> Watch {
        Watch::new(self.pool.clone(), name.to_owned(), 0)
    }

    /// Watches lock `name` resuming after `revision` (the [`LockInfo::revision`] last seen): the first state
    /// is the lock as it is now, and if its revision is still `revision` nothing changed meanwhile.
    pub fn watch_after(&self, name: &str, revision: u64) -> Watch {
        Watch::new(self.pool.clone(), name.to_owned(), revision)
    }

    /// Watches every lock whose name starts with `prefix` (empty: every lock): the first states are every
    /// lock held under it (and those freed in the last 10 minutes, with no holder), in revision order, then
    /// each lock's state after every change, in the order the cluster made them. A resume (after a node
    /// went away) sends again only the locks changed since the last revision answered. See [`Watch`].
    pub fn watch_prefix(&self, prefix: &str) -> Watch {
        Watch::of_prefix(self.pool.clone(), prefix.to_owned(), 0)
    }

    /// [`watch_prefix`](Self::watch_prefix) after `revision` (a [`ListPage::revision`], or the last
    /// [`LockInfo::revision`] seen): the first states are the locks under `prefix` changed since. Fails with
    /// [`Error::Compacted`] if a lock freed since may have been forgotten: list again, then watch after
    /// the list's revision.
    pub fn watch_prefix_after(&self, prefix: &str, revision: u64) -> Watch {
        Watch::of_prefix(self.pool.clone(), prefix.to_owned(), revision)
    }

    /// Who holds `name` and who waits for it (a linearizable read); `Ok(None)` if nobody holds it.
    pub async fn get(&self, name: &str) -> Result<Option<LockInfo>, Error> {
        let request = GetRequest { name: name.to_owned() };
        match self.one_shot("get", self.pool.retry(Duration::ZERO), CallKind::Get(request)).await {
            Ok(ResultKind::Lock(lock)) => Ok(Some(lock.into())),
            Ok(other) => Err(unexpected("get", &other)),
            Err(Error::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One page of the held locks whose names start with `prefix`, by name, after `after` (the previous
    /// page's [`ListPage::next`]; `None` for the first page). `limit` 0 means the server's default (100).
    pub async fn list(&self, prefix: &str, after: Option<&str>, limit: u32) -> Result<ListPage, Error> {
        let request = ListRequest { prefix: prefix.to_owned(), after: after.unwrap_or_default().to_owned(), limit };
        let page = self
            .pool
            .call("list", self.pool.retry(Duration::ZERO), |_, mut client| {
                let request = request.clone();
                async move { Ok(client.list(request).await?.into_inner()) }
            })
            .await?;
        Ok(page.into())
    }

    /// The cluster as the preferred endpoint's node sees it (or the first that answers).
    pub async fn cluster_status(&self) -> Result<ClusterStatus, Error> {
        let pool = &self.pool;
        pool.call("cluster status", pool.retry(Duration::ZERO), |i, mut client| async move {
            let status = client.cluster_status(ClusterStatusRequest {}).await?.into_inner();
            Ok(ClusterStatus::from_proto(pool.endpoints()[i].clone(), status))
        })
        .await
    }

    /// Admin: adds node `id`, started with `--join`, whose peer port the other nodes reach at `peer_addr`
    /// (`HOST:PORT`). The leader adds it as a learner, waits until it caught up (up to a minute), then makes
    /// it a voter; the answer is the cluster afterwards. `admin_key` is the server's `--admin-key`, if it has
    /// one. Adding a voter again at the same address changes nothing.
    pub async fn add_member(&self, id: u64, peer_addr: &str, admin_key: Option<&str>) -> Result<ClusterStatus, Error> {
        let request = AddMemberRequest { id, addr: peer_addr.to_owned() };
        let pool = &self.pool;
        pool.call("add member", pool.retry(MEMBERSHIP_WAIT), |i, mut client| {
            let request = admin_request(request.clone(), admin_key);
            async move {
                let status = client.add_member(request?).await?.into_inner();
                Ok(ClusterStatus::from_proto(pool.endpoints()[i].clone(), status))
            }
        })
        .await
    }

    /// Admin: the node that answers (the preferred endpoint's, or the first that answers: give the client
    /// one endpoint to choose the node) snapshots its lock state now, and answers once its stored snapshot
    /// covers everything it had applied (up to a minute). Every node keeps a snapshot of its own and takes
    /// one every `--snapshot-every` entries by itself; nothing is proposed.
    pub async fn snapshot(&self, admin_key: Option<&str>) -> Result<SnapshotInfo, Error> {
        let pool = &self.pool;
        pool.call("snapshot", pool.retry(SNAPSHOT_WAIT), |i, mut client| {
            let request = admin_request(SnapshotRequest {}, admin_key);
            async move {
                let answer = client.snapshot(request?).await?.into_inner();
                Ok(SnapshotInfo {
                    endpoint: pool.endpoints()[i].clone(),
                    id: answer.id,
                    index: answer.snapshot_index,
                    bytes: answer.snapshot_bytes,
                })
            }
        })
        .await
    }

    /// Admin: removes node `id` (a voter or a learner) from the cluster; the answer is the cluster
    /// afterwards.
    pub async fn remove_member(&self, id: u64, admin_key: Option<&str>) -> Result<ClusterStatus, Error> {
        let pool = &self.pool;
        pool.call("remove member", pool.retry(MEMBERSHIP_WAIT), |i, mut client| {
            let request = admin_request(RemoveMemberRequest { id }, admin_key);
            async move {
                let status = client.remove_member(request?).await?.into_inner();
                Ok(ClusterStatus::from_proto(pool.endpoints()[i].clone(), status))
            }
        })
        .await
    }
}

/// How long the server may take over a membership change (it waits for a new node to catch up).
const MEMBERSHIP_WAIT: Duration = Duration::from_secs(60);
/// How long the server may take to build and store a snapshot it was asked for.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(60);

/// `message` with `authorization: Bearer KEY` metadata when there is a key.
fn admin_request<T>(message: T, admin_key: Option<&str>) -> Result<tonic::Request<T>, Error> {
    let mut request = tonic::Request::new(message);
    if let Some(key) = admin_key {
        let value = format!("Bearer {key}")
            .parse()
            .map_err(|_| Error::InvalidArgument("the admin key has characters that cannot be sent".into()))?;
        request.metadata_mut().insert("authorization", value);
    }
    Ok(request)
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("endpoints", &self.pool.endpoints())
            .field("preferred", &self.preferred_endpoint())
            .field("owner", &self.owner())
            .finish()
    }
}

/// `hostname/pid`, cut to what the server accepts.
fn default_owner() -> String {
    let host = ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned());
    let mut owner: String = format!("{host}/{}", std::process::id()).chars().filter(|c| !c.is_control()).collect();
    while owner.len() > OWNER_LEN_MAX {
        owner.pop();
    }
    owner
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_owner_is_host_and_pid() {
        let owner = default_owner();
        assert!(owner.ends_with(&format!("/{}", std::process::id())), "{owner}");
        assert!(owner.len() <= OWNER_LEN_MAX);
    }

    #[test]
    fn building_normalises_and_checks_endpoints() {
        let client = Client::builder(["127.0.0.1:18070", "http://node-2"]).build().unwrap();
        assert_eq!(client.endpoints(), ["http://127.0.0.1:18070", "http://node-2:7070"]);
        assert_eq!(client.preferred_endpoint(), "http://127.0.0.1:18070");
        assert!(matches!(Client::builder(Vec::<String>::new()).build(), Err(Error::InvalidArgument(_))));
        assert!(matches!(Client::builder(["https://x:1"]).build(), Err(Error::InvalidArgument(_))));
        assert!(matches!(Client::builder(["x:1"]).owner("a\nb").build(), Err(Error::InvalidArgument(_))));
        assert!(matches!(Client::builder(["x:1"]).owner("o".repeat(129)).build(), Err(Error::InvalidArgument(_))));
    }

    #[tokio::test]
    async fn a_dead_cluster_is_unavailable_within_the_retry_bounds() {
        // Port 1 on loopback: nothing listens, connections are refused at once.
        let client = Client::builder(["127.0.0.1:1", "127.0.0.1:2"])
            .backoff(Duration::from_millis(1), Duration::from_millis(2))
            .max_attempts(4)
            .build()
            .unwrap();
        let answer = client.get("x").await;
        let Err(Error::Unavailable(why)) = answer else { panic!("{answer:?}") };
        assert!(why.contains("4 attempts"), "{why}");
        let Err(Error::Unavailable(_)) = client.discover_leader().await else { panic!("expected Unavailable") };
        let Err(Error::Unavailable(_)) = client.session(Duration::from_secs(2)).await else {
            panic!("expected Unavailable")
        };
    }
}
