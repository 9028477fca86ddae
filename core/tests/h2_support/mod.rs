//! Shared pieces of the real-socket HTTP/2 tests (`h2spec.rs`,
//! `h2_defences.rs`): the test server ([`server`]), the raw-frame client
//! ([`raw`]) and the io engines to run under (descriptor counting is
//! konn-testkit's).

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
