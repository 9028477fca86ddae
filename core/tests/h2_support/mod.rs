//! Shared pieces of the real-socket HTTP/2 tests (`h2spec.rs`,
//! `h2_defences.rs`): the test server ([`server`]), the raw-frame client
//! ([`raw`]), the io engines to run under, and descriptor counting.

#![allow(dead_code, unreachable_pub)]

pub mod raw;
pub mod server;

use konn_core::io::runtime::{Engine, available_engines, probe_io_uring};

/// The io engines to run the server under: every engine this machine
/// supports. Without io_uring the epoll run still happens (with a note),
/// unless `KONN_REQUIRE_IO_URING` is set, as in
/// `konn_core::io::runtime::run_on_each_engine`.
///
/// # Panics
/// If io_uring is required but unavailable.
pub fn engines() -> Vec<Engine> {
    let engines = available_engines();
    if !engines.contains(&Engine::IoUring) {
        assert!(
            std::env::var_os("KONN_REQUIRE_IO_URING").is_none(),
            "KONN_REQUIRE_IO_URING is set but io_uring is unavailable: {:?}",
            probe_io_uring().err()
        );
        eprintln!("note: io_uring unavailable here; running the epoll variant only");
    }
    engines
}

/// Open descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

/// Tests that count the process's descriptors run one at a time.
#[allow(clippy::disallowed_types)] // a test-only lock, not on any data path
static FD_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Serialises descriptor-counting tests (a panicked test does not poison
/// the others).
#[allow(clippy::disallowed_types)] // see FD_LOCK
pub fn fd_guard() -> std::sync::MutexGuard<'static, ()> {
    FD_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Checks that descriptors return to `before` within a second (a socket
/// the kernel still closes, or a thread still exiting, gets that long).
///
/// # Panics
/// If they do not.
pub fn assert_fds_back_to(before: usize, what: &str) {
    let deadline = konn_core::io::clock::now() + std::time::Duration::from_secs(1);
    loop {
        let now = open_fds();
        if now == before {
            return;
        }
        assert!(
            konn_core::io::clock::now() < deadline,
            "{what}: {now} descriptors open, {before} before (leak)"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
