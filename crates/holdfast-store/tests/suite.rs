//! openraft's own storage conformance suite, run against the sled store.

use std::sync::Arc;

use holdfast_store::{open, LogStore, NoObserver, NodeId, StateMachineStore, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{StorageError, StorageIOError};
use tempfile::TempDir;

/// Opens a fresh store in a new temporary directory for every test of the suite; the directory is
/// the guard, removed when the test is done with the store.
struct FreshStore;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for FreshStore {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<NodeId>> {
        let dir = tempfile::tempdir().map_err(|e| StorageIOError::write(&e))?;
        let (log, state_machine) = open(dir.path(), Arc::new(NoObserver)).map_err(|e| StorageIOError::write(&e))?;
        Ok((dir, log, state_machine))
    }
}

#[test]
fn sled_store_passes_openraft_storage_suite() -> Result<(), Box<StorageError<NodeId>>> {
    Suite::test_all(FreshStore).map_err(Box::new)
}
