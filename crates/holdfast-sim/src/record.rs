//! Recording a run's history as it happens, and the fenced resource the clients write through.

use std::sync::{Arc, Mutex};

use crate::history::{Access, AccessKind, At, Call, History, Hold, Leased, Op, Outcome, Watched};

/// Simulated time since the run began (zero outside a simulated host).
pub fn now() -> At {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// With `RUST_LOG` set, logs every node's and client's lines to the test's output, stamped with simulated
/// time and the host (`node{name="n2"}`). Once per process; later calls do nothing.
pub fn log_if_asked() {
    struct SimTime;
    impl tracing_subscriber::fmt::time::FormatTime for SimTime {
        fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
            write!(w, "{:>9.3}s", now().as_secs_f64())
        }
    }
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_timer(SimTime)
            .with_ansi(false)
            .with_test_writer()
            .try_init();
    }
}

/// Where every client of a run writes what it saw. Clones share the history.
#[derive(Clone, Default)]
pub struct Recorder(Arc<Mutex<History>>);

impl Recorder {
    /// Records a call made at `invoked` that has just come back with `outcome` (`completed`: `None` if no
    /// answer came).
    pub fn op(&self, client: u32, lock: &str, call: Call, invoked: At, completed: Option<At>, outcome: Outcome) {
        let op = Op { client, lock: lock.to_owned(), call, invoked, completed, outcome };
        self.history().ops.push(op);
    }

    /// Records a span in which `client` believed it held `lock` under `fence`.
    pub fn hold(&self, client: u32, lock: &str, fence: u64, from: At, until: At) {
        self.place(client, lock, 1, fence, from, until);
    }

    /// Records a span in which `client` believed it held one of the `limit` places of semaphore `lock`
    /// under `fence` (a limit of 1: the lock itself, as [`Recorder::hold`]).
    pub fn place(&self, client: u32, lock: &str, limit: u32, fence: u64, from: At, until: At) {
        self.history().holds.push(Hold { client, lock: lock.to_owned(), limit, fence, from, until });
    }

    /// Records a state of `lock` that watcher `client` was sent on its stream number `segment`.
    pub fn watched(&self, client: u32, lock: &str, segment: u64, revision: u64, holder: Option<u64>) {
        let watched = Watched { client, lock: lock.to_owned(), segment, revision, holder, at: now() };
        self.history().watched.push(watched);
    }

    /// Records a grant with a lock-delay, in the leader's time.
    pub fn leased(&self, leased: Leased) {
        self.history().leased.push(leased);
    }

    /// Records that a membership change was made at `at`.
    pub fn membership_changed(&self, at: At) {
        let mut history = self.history();
        history.last_membership_change = history.last_membership_change.max(Some(at));
    }

    /// A copy of everything recorded so far.
    pub fn snapshot(&self) -> History {
        self.history().clone()
    }

    fn history(&self) -> std::sync::MutexGuard<'_, History> {
        self.0.lock().expect("history poisoned")
    }
}

/// The resource a lock protects: a counter that accepts a read or a write only with a fence at least the
/// highest it has seen (and then remembers that fence), the way a storage system uses holdfast's fences.
#[derive(Clone, Default)]
pub struct Resource {
    inner: Arc<Mutex<(u64, u64)>>,
    recorder: Recorder,
}

impl Resource {
    pub fn new(recorder: Recorder) -> Self {
        Resource { inner: Arc::default(), recorder }
    }

    /// Reads the counter under `fence`; `None` if the fence is stale.
    pub fn read(&self, client: u32, fence: u64) -> Option<u64> {
        let mut inner = self.inner.lock().expect("resource poisoned");
        let (max_fence, value) = &mut *inner;
        let accepted = fence >= *max_fence;
        if accepted {
            *max_fence = fence;
        }
        let kind = AccessKind::Read { value: *value };
        self.record(Access { client, fence, at: now(), kind, accepted });
        accepted.then_some(*value)
    }

    /// Writes `read + 1` under `fence`; false if the fence is stale.
    pub fn write(&self, client: u32, fence: u64, read: u64) -> bool {
        let mut inner = self.inner.lock().expect("resource poisoned");
        let (max_fence, value) = &mut *inner;
        let accepted = fence >= *max_fence;
        if accepted {
            *max_fence = fence;
            *value = read + 1;
        }
        let kind = AccessKind::Write { read, written: read + 1 };
        self.record(Access { client, fence, at: now(), kind, accepted });
        accepted
    }

    fn record(&self, access: Access) {
        self.recorder.history().accesses.push(access);
    }
}
