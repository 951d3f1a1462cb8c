//! The node's one source of randomness: tokens, session ids and election timeouts are drawn from it in
//! the order the node asks, so that a simulation seeds it and replays a run exactly.
//!
//! A leaf: it imports no other module of this crate.

use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A CSPRNG seeded by the operating system, or by a simulation.
#[derive(Debug)]
pub struct Random(Mutex<StdRng>);

impl Random {
    /// Seeded with `seed` (simulations), or else with the operating system's entropy.
    pub fn new(seed: Option<u64>) -> Self {
        Random(Mutex::new(seed.map_or_else(StdRng::from_entropy, StdRng::seed_from_u64)))
    }

    /// A random value for a token or an id.
    pub fn draw<T>(&self) -> T
    where
        rand::distributions::Standard: rand::distributions::Distribution<T>,
    {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).gen()
    }

    /// A duration between `min_ms` and `max_ms` milliseconds, both included.
    pub fn millis_between(&self, min_ms: u64, max_ms: u64) -> Duration {
        Duration::from_millis(self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).gen_range(min_ms..=max_ms))
    }
}
