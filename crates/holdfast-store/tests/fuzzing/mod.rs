//! What the byte-level fuzz targets share: their case count and a counting global allocator. Included by
//! `fuzz_records.rs` here and by holdfast-server's `fuzz_peer.rs` (`#[path]`), each a test binary of its
//! own: including this module installs the allocator in that binary.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The cases a target runs: `default`, unless `HOLDFAST_FUZZ_CASES` says otherwise.
pub fn cases(default: u32) -> u32 {
    match std::env::var("HOLDFAST_FUZZ_CASES") {
        Ok(n) => n.parse().expect("HOLDFAST_FUZZ_CASES is a number of cases"),
        Err(_) => default,
    }
}

/// The most memory any element of holdfast's takes per byte of its encoding: an `Outcome::Withdrawn` in a
/// batch's outcomes, 4 bytes on the wire and 128 in memory.
pub const ELEMENT_BYTES_PER_BYTE_MOST: usize = 32;

/// The system allocator, noting the largest single allocation each thread asks for.
struct Counting;

thread_local! {
    /// Const-initialized and without a destructor, so the allocator may touch it at any time.
    static LARGEST_BYTES: Cell<usize> = const { Cell::new(0) };
}

fn note(bytes: usize) {
    let _ = LARGEST_BYTES.try_with(|largest| largest.set(largest.get().max(bytes)));
}

// SAFETY: every call goes straight to `System`; noting a size touches only a thread-local `Cell`.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What `f` returns, and the largest single allocation it asked for on this thread.
pub fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST_BYTES.with(|largest| largest.set(0));
    let value = f();
    (value, LARGEST_BYTES.with(Cell::get))
}
