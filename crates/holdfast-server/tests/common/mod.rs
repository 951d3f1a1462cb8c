//! What the in-process node tests share: the configuration of a single node on 127.0.0.1.

use std::collections::BTreeMap;
use std::path::PathBuf;

use holdfast_server::Config;
use holdfast_server::FrontLimits;

/// A single node (id 1) whose peer port is `peer_addr`, with its data in `data_dir`: quick timeouts, no
/// TLS, no auth, no admin key, the system clock. Tests change what they need with `..one_node(..)`.
pub fn one_node(peer_addr: String, data_dir: PathBuf) -> Config {
    Config {
        id: 1,
        members: BTreeMap::from([(1, peer_addr)]),
        data_dir,
        limits: FrontLimits {
            ttl_ms_min: 100,
            ttl_ms_max: 60_000,
            wait_ms_max: 60_000,
            lock_delay_ms_max: 60_000,
            overload_delay: holdfast_server::load::OVERLOAD_DELAY_DEFAULT,
            // A share of the test runtime's time, which the tests' own work shares: never.
            overload_busy: 1.0,
        },
        heartbeat_ms: 50,
        election_timeout_ms: 200,
        snapshot_every_entries: 1000,
        queue_hold: holdfast_server::QUEUE_HOLD,
        join: false,
        admin_key: None,
        tls: None,
        auth: Default::default(),
        cache_bytes: holdfast_store::CACHE_BYTES_DEFAULT,
        disk_reserve: holdfast_store::DISK_RESERVE_DEFAULT,
        disk_stall: Some(holdfast_store::DISK_STALL_DEFAULT),
        clock: holdfast_server::WallClock::system(),
        rng_seed: None,
        bugs: holdfast_server::Bugs::default(),
        max_clock_skew: None,
    }
}
