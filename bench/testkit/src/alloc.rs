//! Counting heap allocations per thread, for the tests that prove a path
//! does not allocate. A test binary installs [`CountingAlloc`] as its
//! `#[global_allocator]`, checks that with [`assert_counting`] and measures
//! with [`allocations_in`] (see `frames/tests/packet_alloc.rs`).
//!
//! Counts are per thread, so tests running in parallel threads do not
//! disturb each other's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, counting the allocations of each thread.
#[derive(Debug)]
pub struct CountingAlloc;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_one() {
    // `try_with`: the thread-local may already be gone while a thread exits.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

/// Allocations (including reallocations) this thread has made so far.
pub fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Allocations `f` makes on this thread, and what it returns.
pub fn allocations_in<T>(f: impl FnOnce() -> T) -> (u64, T) {
    let before = allocations();
    let out = f();
    (allocations() - before, out)
}

/// Panics unless [`CountingAlloc`] is this test binary's global allocator:
/// the guard of every "does not allocate" test against a counter that never
/// counts.
pub fn assert_counting() {
    let (n, boxed) = allocations_in(|| std::hint::black_box(Box::new(7u64)));
    drop(boxed);
    assert_eq!(n, 1, "CountingAlloc is not this binary's global allocator");
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees carry over; counting touches only a
// const-initialised thread-local `Cell` without a destructor, which never
// allocates.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded as is; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: `ptr` and `layout` come from this allocator, i.e. `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` and `layout` come from this allocator, i.e. `System`.
        unsafe { System.dealloc(ptr, layout) }
    }
}
