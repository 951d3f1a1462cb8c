//! Wall-clock time: where the leader's stamps come from (the system clock, or a simulation's).
//!
//! A leaf: it imports no other module of this crate.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Where a node reads wall-clock time for the leader's stamps: the system clock, or a simulation's.
#[derive(Clone, Default)]
pub struct WallClock(Option<Arc<dyn Fn() -> u64 + Send + Sync>>);

impl WallClock {
    /// The system clock.
    pub fn system() -> Self {
        WallClock(None)
    }

    /// A clock that reads `now_ms` (milliseconds since the Unix epoch): a simulation's, or a skewed one.
    pub fn from_fn(now_ms: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        WallClock(Some(Arc::new(now_ms)))
    }

    /// Milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        match &self.0 {
            Some(now_ms) => now_ms(),
            None => wall_ms(),
        }
    }
}

impl std::fmt::Debug for WallClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "WallClock(custom)" } else { "WallClock(system)" })
    }
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
