//! Certificate, key and CA hot reload for every TLS input of both binaries.
//!
//! A [`ServerTls`](super::ServerTls) or [`ClientTls`](super::ClientTls)
//! built from files keeps its rustls configuration in a [`Live`] slot that
//! every new connection reads ([`ServerTls::layer`](super::ServerTls::layer)):
//! replacing the slot's content changes the material of the *next*
//! handshakes only; connections already established keep theirs, so no
//! tunnel or connection is dropped by a rotation.
//!
//! [`Watcher`] is the thread that notices changes: every `interval` it
//! takes a fingerprint of each file (device, inode, size, modification and
//! change times, following symlinks) and, when one differs, rebuilds the
//! whole configuration with the same checks as at start-up
//! (`ServerTlsOptions::build`): every PEM block parses, the key matches the
//! certificate, the CA bundle is valid. A configuration that fails them
//! keeps the previous one in use; one warning names the problem and the
//! caller's callback counts it (`konn_tls_reloads_total{result="error"}`).
//! Why polling and not inotify: docs/decisions/0004-certificate-reload.md.
//!
//! The slot is a `std::sync::RwLock`, read once per handshake (never per
//! packet) and written once per reload: a lock is the simplest correct
//! tool for shared, rarely changing, process-wide state.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::Error;

/// A shared, replaceable configuration (see the module docs).
#[derive(Debug)]
pub struct Live<T> {
    // Shared by every worker, read per handshake, written per reload.
    #[allow(clippy::disallowed_types)]
    slot: std::sync::RwLock<Arc<T>>,
}

impl<T> Live<T> {
    /// A slot holding `value`.
    #[allow(clippy::disallowed_types)]
    pub fn new(value: Arc<T>) -> Self {
        Self {
            slot: std::sync::RwLock::new(value),
        }
    }

    /// The configuration in use now.
    pub fn current(&self) -> Arc<T> {
        match self.slot.read() {
            Ok(g) => g.clone(),
            // A writer never panics while holding the lock (it only stores
            // an Arc), but a poisoned lock still holds a valid value.
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Use `value` from now on.
    pub fn set(&self, value: Arc<T>) {
        match self.slot.write() {
            Ok(mut g) => *g = value,
            Err(p) => *p.into_inner() = value,
        }
    }
}

/// The identity of one file's current content, as far as metadata tells.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp(Option<(u64, u64, u64, i64, i64, i64, i64)>);

fn stamp(path: &std::path::Path) -> Stamp {
    Stamp(std::fs::metadata(path).ok().map(|m| {
        (
            m.dev(),
            m.ino(),
            m.size(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
        )
    }))
}

/// The thread that reloads a configuration when its files change; stops
/// (and is joined) when dropped.
#[derive(Debug)]
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Watches `files` every `interval`; on a change calls `rebuild` and
    /// stores its result in `live`, or keeps the old value when it fails.
    /// `what` names the input in the log; `on_reload(ok)` is told each
    /// outcome.
    ///
    /// # Errors
    ///
    /// The thread could not be started.
    pub fn spawn<T: Send + Sync + 'static>(
        what: &'static str,
        files: Vec<PathBuf>,
        interval: Duration,
        live: Arc<Live<T>>,
        rebuild: impl Fn() -> Result<Arc<T>, Error> + Send + 'static,
        on_reload: impl Fn(bool) + Send + 'static,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("konn-tls-watch".into())
            .spawn(move || {
                let mut last: Vec<Stamp> = files.iter().map(|f| stamp(f)).collect();
                while !stopping.load(Ordering::Acquire) {
                    std::thread::park_timeout(interval);
                    if stopping.load(Ordering::Acquire) {
                        return;
                    }
                    let now: Vec<Stamp> = files.iter().map(|f| stamp(f)).collect();
                    if now == last {
                        continue;
                    }
                    last = now;
                    match rebuild() {
                        Ok(config) => {
                            live.set(config);
                            tracing::info!(input = what, "TLS files changed; reloaded");
                            on_reload(true);
                        }
                        Err(e) => {
                            tracing::warn!(
                                input = what,
                                error = %e,
                                "TLS files changed but cannot be used; keeping the previous certificates"
                            );
                            on_reload(false);
                        }
                    }
                }
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
