//! Reading the lock state a node applies to.
//!
//! A leaf: it imports no other module of this crate.

use std::sync::RwLockReadGuard;

use holdfast_core::LockState;
use holdfast_store::SharedState;

/// The lock state as applied so far, read-locked: no entry is applied while the guard lives. A poisoned
/// lock means an apply panicked, a broken invariant: this panics too.
pub fn read(state: &SharedState) -> RwLockReadGuard<'_, LockState> {
    state.read().expect("lock state poisoned")
}
