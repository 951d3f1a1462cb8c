//! openraft's own storage conformance suite, run against the disk store and the memory store.

use std::sync::Arc;

use holdfast_store::{
    open, open_memory, LogStore, MemDisk, MemLogStore, MemStateMachine, NoObserver, NodeId, StateMachineStore,
    TypeConfig,
};
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
fn disk_store_passes_openraft_storage_suite() -> Result<(), Box<StorageError<NodeId>>> {
    Suite::test_all(FreshStore).map_err(Box::new)
}

/// Opens a fresh memory store, on a new disk, for every test of the suite; the disk is the guard.
struct FreshMemoryStore;

impl StoreBuilder<TypeConfig, MemLogStore, MemStateMachine, MemDisk> for FreshMemoryStore {
    async fn build(&self) -> Result<(MemDisk, MemLogStore, MemStateMachine), StorageError<NodeId>> {
        let disk = MemDisk::new();
        let (log, state_machine) = open_memory(&disk, Arc::new(NoObserver));
        Ok((disk, log, state_machine))
    }
}

#[test]
fn memory_store_passes_openraft_storage_suite() -> Result<(), Box<StorageError<NodeId>>> {
    Suite::test_all(FreshMemoryStore).map_err(Box::new)
}
