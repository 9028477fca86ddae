//! Shutdown signals for the binaries.
//!
//! [`block_shutdown_signals`] blocks SIGTERM and SIGINT in the calling
//! thread; call it at the start of `main`, before any worker thread exists,
//! so every thread inherits the mask and no worker is ever interrupted.
//! The main thread then waits for them with [`wait_shutdown_signal`]
//! (`sigwait`) — no signal handler, no async-signal-safety concerns.
//! Upstream semantics built on this: the agent's first signal drains and
//! the second exits; the server's first signal starts a graceful shutdown.
//! The server with `--clusters-config` also blocks SIGHUP
//! ([`block_reload_signal`]) and reloads the file on it.

use std::io;

/// Which signal arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShutdownSignal {
    /// SIGTERM.
    Term,
    /// SIGINT.
    Int,
}

/// A signal set holding `signals`.
#[allow(unsafe_code)]
fn signal_set(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set we own; sigaddset only writes
    // into it; both are given valid pointers to a local.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

fn shutdown_set() -> libc::sigset_t {
    signal_set(&[libc::SIGTERM, libc::SIGINT])
}

fn hangup_set() -> libc::sigset_t {
    signal_set(&[libc::SIGHUP])
}

/// Block `set` in this thread (and threads it starts later).
#[allow(unsafe_code)]
fn block(set: &libc::sigset_t) -> io::Result<()> {
    // SAFETY: `set` is a valid, initialised signal set; a null old-set
    // pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, set, std::ptr::null_mut()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// Wait for one signal of `set` (blocked), retrying on EINTR.
#[allow(unsafe_code)]
fn wait(set: &libc::sigset_t) -> io::Result<libc::c_int> {
    let mut sig: libc::c_int = 0;
    loop {
        // SAFETY: `set` is a valid signal set and `sig` a valid out pointer.
        let rc = unsafe { libc::sigwait(set, &mut sig) };
        match rc {
            0 => return Ok(sig),
            libc::EINTR => continue,
            _ => return Err(io::Error::from_raw_os_error(rc)),
        }
    }
}

/// Block SIGTERM and SIGINT in this thread (and threads it starts later).
pub fn block_shutdown_signals() -> io::Result<()> {
    block(&shutdown_set())
}

/// Wait for SIGTERM or SIGINT (they must be blocked, see the module docs).
pub fn wait_shutdown_signal() -> io::Result<ShutdownSignal> {
    Ok(if wait(&shutdown_set())? == libc::SIGINT {
        ShutdownSignal::Int
    } else {
        ShutdownSignal::Term
    })
}

/// Block SIGHUP in this thread (and threads it starts later), for a binary
/// that reloads its configuration on it (the server with
/// `--clusters-config`); call it before any other thread exists. Without
/// this, SIGHUP keeps its default action (the process ends), as upstream.
pub fn block_reload_signal() -> io::Result<()> {
    block(&hangup_set())
}

/// Block every signal that can be blocked in this thread: for helper
/// threads that may exist before the binary blocks the signals it waits
/// for (the log flusher starts with the first log line, before the server
/// blocks SIGHUP), so a process-directed signal never lands on them and
/// takes its default action there.
pub fn block_all_signals() -> io::Result<()> {
    block(&all_set())
}

#[allow(unsafe_code)]
fn all_set() -> libc::sigset_t {
    // SAFETY: sigfillset initialises the set we own, given a valid pointer
    // to a local.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        set
    }
}

/// Wait for SIGHUP (blocked with [`block_reload_signal`]).
pub fn wait_reload_signal() -> io::Result<()> {
    wait(&hangup_set()).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(unsafe_code)]
    fn a_blocked_signal_is_received_by_sigwait() {
        // Run in a fresh thread so the mask does not leak into other tests.
        std::thread::spawn(|| {
            block_shutdown_signals().unwrap();
            // SAFETY: raise a signal that is blocked in this thread: it stays
            // pending until sigwait takes it.
            // (pthread_kill targets this thread only.)
            let rc = unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGINT) };
            assert_eq!(rc, 0);
            assert_eq!(wait_shutdown_signal().unwrap(), ShutdownSignal::Int);
        })
        .join()
        .unwrap();
    }
}
