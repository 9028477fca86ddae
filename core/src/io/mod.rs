//! I/O side of the engine: what the binaries share to run the sans-IO state
//! machines on real sockets.
//!
//! konn runs one monoio runtime per core ("thread-per-core"): tasks never
//! move between threads, state is `Rc`/`RefCell`, and a relayed flow is
//! served on a single core. The sans-IO protocol state machines know none of
//! this; drivers built on these modules pump bytes between sockets and them.
//!
//! - [`runtime`]: the worker threads and their runtimes, CPU pinning; it
//!   re-exports [`engine`] (io engine choice: io_uring with epoll fallback,
//!   probed at start-up, and test helpers that run a body under every
//!   engine), [`stop`] (the stop signal) and [`future`] (`race`, `join`).
//! - [`pool`]: per-core pools of fixed-size buffers (one HTTP/2 frame each)
//!   under a global memory budget that pushes back on readers.
//! - [`xcore`]: the cross-core mesh (bounded lock-free inboxes, one wake-up
//!   per batch) and socket migration between workers; [`outbound`]: the
//!   reliable, ordered sender on top of it (a full inbox queues, never drops).
//! - [`listen`]: `SO_REUSEPORT` TCP listeners per worker, the Unix-socket
//!   listener, and an accept loop that survives `EMFILE` and friends.
//! - [`tls`]: the TLS layer (rustls) that drivers put between a socket and the
//!   HTTP/2 state machine, and the configuration builders for the Go flags.
//! - [`driver`]: runs one HTTP/2 or gRPC session (optionally under TLS) on a
//!   socket with reader and writer tasks and one [`timers::Deadline`] (the
//!   thread's timer calls back when it passes); [`notify`] wakes the tasks
//!   and [`clock`] is where drivers read the time and draw seeds.
//! - [`uring`]: konn's own io_uring for the data-path sockets under the
//!   io_uring engine (multishot receive into provided buffers lent by the
//!   pool, batched submission).
//! - [`resolve`]: dial addresses to sockets (DNS on the blocking pool) with
//!   Go's error wording.
//!
//! Design notes: `docs/design/cross-core.md`, `docs/design/buffers.md`,
//! `docs/design/tls.md`.

pub mod clock;
pub mod driver;
pub mod engine;
pub mod future;
pub mod listen;
pub mod notify;
pub mod outbound;
pub mod pool;
pub mod resolve;
pub mod runtime;
pub mod signals;
pub mod sock;
pub mod stop;
pub mod timers;
pub mod tls;
pub mod uring;
pub mod xcore;
