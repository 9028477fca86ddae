//! Allocator tuning for the binaries.
//!
//! `proxy-server` and `proxy-agent` use mimalloc as their global allocator
//! (per-thread heaps fit thread-per-core workers). Two of its defaults hurt
//! a proxy that holds many mostly idle connections, measured with
//! `konn-bench idle` (1000 idle tunnelled connections, docs/BENCHMARKS.md):
//!
//! - eager arena commit made the server's baseline RSS 22 MiB instead of
//!   9 MiB and its growth per idle connection 4× larger;
//! - delayed purging (10 ms by default, but carried out only when the
//!   thread allocates again) kept the memory of closed connections
//!   resident.
//!
//! [`tune_mimalloc`] turns eager commit off and sets a purge delay of
//! [`PURGE_DELAY_MS`]: purging at once (delay 0) made a busy relay give
//! pages back and fault them in again on every burst (~12 % of the agent's
//! CPU in bulk transfers, `konn-bench compare` S1). [`collect`], called by
//! every worker about once a second, carries out the purges that are due,
//! so an idle process still returns what it freed. `tune_mimalloc` must run
//! before mimalloc reads its options (its own constructor does, in
//! `.init_array`), so the binaries call it from a `.preinit_array` entry; an
//! option set first is kept.

/// mimalloc's `mi_option_arena_eager_commit` (same number in v2 and v3).
#[cfg(feature = "mimalloc")]
const ARENA_EAGER_COMMIT: i32 = 4;
/// mimalloc's `mi_option_purge_delay` (same number in v2 and v3).
#[cfg(feature = "mimalloc")]
const PURGE_DELAY: i32 = 15;

/// How long freed memory stays committed before it is returned (ms).
pub const PURGE_DELAY_MS: i64 = 50;

/// Commit arena memory on demand and return freed pages after
/// [`PURGE_DELAY_MS`]. A no-op without the `mimalloc` feature. Call it
/// before the process's first allocation (see the module docs).
#[allow(unsafe_code)]
pub fn tune_mimalloc() {
    #[cfg(feature = "mimalloc")]
    // SAFETY: mi_option_set only stores an integer option; both option
    // numbers exist in the vendored mimalloc (v3, libmimalloc-sys 0.1.49,
    // pinned by Cargo.lock) and 0 / a positive delay are valid values.
    unsafe {
        libmimalloc_sys::mi_option_set(ARENA_EAGER_COMMIT, 0);
        libmimalloc_sys::mi_option_set(PURGE_DELAY, PURGE_DELAY_MS);
    }
}

/// Carry out the calling thread's purges that are due (memory freed more
/// than [`PURGE_DELAY_MS`] ago goes back to the OS). Cheap; a no-op without
/// the `mimalloc` feature.
#[allow(unsafe_code)]
pub fn collect() {
    #[cfg(feature = "mimalloc")]
    // SAFETY: mi_collect(false) only frees or purges memory the calling
    // thread's heap no longer uses; it may be called at any time.
    unsafe {
        libmimalloc_sys::mi_collect(false);
    }
}

/// Installs mimalloc as the binary's global allocator and tunes it
/// ([`tune_mimalloc`]) from a `.preinit_array` entry, before the first
/// allocation. For `proxy-server` and `proxy-agent`, which depend on the
/// `mimalloc` crate and enable this crate's `mimalloc` feature.
#[macro_export]
macro_rules! mimalloc_global_allocator {
    () => {
        /// mimalloc: per-thread heaps without cross-thread locking on the
        /// worker threads; tuned by `konn_core::alloc::tune_mimalloc`.
        #[global_allocator]
        static GLOBAL: ::mimalloc::MiMalloc = ::mimalloc::MiMalloc;

        /// Tunes mimalloc before the first allocation (a process
        /// constructor runs before Rust's runtime allocates).
        #[used]
        #[allow(unsafe_code)]
        // SAFETY: the function only stores two integer allocator options;
        // it calls nothing that needs Rust's runtime, and runs once,
        // single-threaded.
        #[unsafe(link_section = ".preinit_array")]
        static TUNE_ALLOCATOR: extern "C" fn() = tune_allocator;

        extern "C" fn tune_allocator() {
            $crate::alloc::tune_mimalloc();
        }
    };
}
