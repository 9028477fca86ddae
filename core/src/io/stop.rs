//! The stop signal: [`Stopper::stop`] (from any thread) sets a flag and
//! wakes one watcher task per worker, which wakes every local
//! [`StopToken::stopped`] future. Worker futures are expected to return once
//! their token fires; nothing is cancelled forcibly: protocol drivers decide
//! how to drain.

use std::{
    cell::{Cell, RefCell},
    fmt,
    future::{Future, poll_fn},
    pin::Pin,
    rc::{Rc, Weak},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering, fence},
    },
    task::{Context, Poll, Waker},
};

use crossbeam_queue::SegQueue;
use crossbeam_utils::atomic::AtomicCell;

/// Asks workers to stop; cheap to clone, usable from any thread.
#[derive(Clone, Default)]
pub struct Stopper {
    shared: Arc<StopShared>,
}

#[derive(Default)]
struct StopShared {
    stopped: AtomicBool,
    /// One waker slot per thread that created a [`StopToken`]; each slot
    /// holds the waker of that thread's watcher task.
    watchers: SegQueue<Arc<AtomicCell<Option<Waker>>>>,
}

impl Stopper {
    /// A stopper that has not fired.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires every token made from this stopper (idempotent).
    pub fn stop(&self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        // Pairs with the fence in the watcher: either the watcher sees the
        // flag, or this loop sees its waker.
        fence(Ordering::SeqCst);
        while let Some(slot) = self.shared.watchers.pop() {
            if let Some(waker) = slot.take() {
                waker.wake();
            }
        }
    }

    /// Whether [`stop`](Self::stop) was called.
    pub fn is_stopped(&self) -> bool {
        self.shared.stopped.load(Ordering::Acquire)
    }

    /// A token for the current thread. Spawns one watcher task on the current
    /// monoio runtime, so call it once per thread (inside the runtime) and
    /// clone the token. Before that runtime ends, await
    /// [`StopToken::close`] (the [`Workers`] do) so no waker of this thread
    /// stays reachable from other threads.
    ///
    /// # Panics
    ///
    /// Outside a monoio runtime (monoio cannot spawn there).
    pub fn token(&self) -> StopToken {
        let local = Rc::new(LocalStop::default());
        self.shared.watchers.push(Arc::clone(&local.slot));
        let watcher = monoio::spawn(watch_stop(Arc::clone(&self.shared), Rc::downgrade(&local)));
        *local.watcher.borrow_mut() = Some(watcher);
        StopToken {
            shared: Arc::clone(&self.shared),
            local,
        }
    }
}

impl fmt::Debug for Stopper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stopper")
            .field("stopped", &self.is_stopped())
            .finish()
    }
}

/// Waits for the shared flag on behalf of every local waiter, so one
/// cross-thread wake-up per thread suffices. Holds only a weak reference so
/// that dropping the last token clears the cross-thread slot.
async fn watch_stop(shared: Arc<StopShared>, local: Weak<LocalStop>) {
    let fired = poll_fn(|cx| {
        let Some(local) = local.upgrade() else {
            return Poll::Ready(None);
        };
        if local.closed.get() {
            return Poll::Ready(None);
        }
        if shared.stopped.load(Ordering::Acquire) {
            return Poll::Ready(Some(local));
        }
        local.slot.store(Some(cx.waker().clone()));
        // Pairs with the fence in `Stopper::stop`.
        fence(Ordering::SeqCst);
        if shared.stopped.load(Ordering::Acquire) {
            Poll::Ready(Some(local))
        } else {
            Poll::Pending
        }
    })
    .await;
    if let Some(local) = fired {
        local.fire();
    }
}

/// Per-thread fan-out of the stop signal to local tasks.
#[derive(Default)]
struct LocalStop {
    fired: Cell<bool>,
    closed: Cell<bool>,
    /// Cross-thread slot holding the watcher task's waker; also queued in
    /// [`StopShared::watchers`].
    slot: Arc<AtomicCell<Option<Waker>>>,
    watcher: RefCell<Option<monoio::task::JoinHandle<()>>>,
    /// Slab of waiting tasks; a [`Stopped`] future owns one entry.
    waiters: RefCell<Vec<Option<Waker>>>,
    free: RefCell<Vec<usize>>,
}

impl LocalStop {
    fn fire(&self) {
        self.fired.set(true);
        let wakers: Vec<Waker> = self
            .waiters
            .borrow_mut()
            .iter_mut()
            .filter_map(Option::take)
            .collect();
        for waker in wakers {
            waker.wake();
        }
    }
}

impl Drop for LocalStop {
    fn drop(&mut self) {
        // Runs on the owning thread (Rc): dropping the watcher's waker here
        // means no other thread can end up releasing this thread's task.
        drop(self.slot.take());
    }
}

/// Fires when its [`Stopper`] stops. Clones share the thread's watcher.
/// Not `Send`: make one per thread with [`Stopper::token`].
#[derive(Clone)]
pub struct StopToken {
    shared: Arc<StopShared>,
    local: Rc<LocalStop>,
}

impl StopToken {
    /// Whether the stop was requested (or this thread's tokens were closed).
    pub fn is_stopped(&self) -> bool {
        self.local.fired.get() || self.shared.stopped.load(Ordering::Acquire)
    }

    /// Resolves once the stop was requested (immediately if it already was).
    pub fn stopped(&self) -> Stopped<'_> {
        Stopped {
            token: self,
            slot: None,
        }
    }

    /// Retires this thread's watcher: fires every local waiter and waits for
    /// the watcher task to end, leaving no waker of this thread where a
    /// later [`Stopper::stop`] from another thread could reach it. Await it
    /// before the runtime that created the token ends: monoio does not drop
    /// tasks that are still pending when a runtime is dropped.
    pub async fn close(&self) {
        let local = &self.local;
        local.closed.set(true);
        if let Some(waker) = local.slot.take() {
            // Same thread: this schedules the watcher locally.
            waker.wake();
        }
        local.fire();
        let watcher = local.watcher.borrow_mut().take();
        if let Some(watcher) = watcher {
            watcher.await;
        }
    }
}

impl fmt::Debug for StopToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopToken")
            .field("stopped", &self.is_stopped())
            .finish()
    }
}

/// Future returned by [`StopToken::stopped`].
#[derive(Debug)]
pub struct Stopped<'a> {
    token: &'a StopToken,
    slot: Option<usize>,
}

impl Future for Stopped<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.token.is_stopped() {
            return Poll::Ready(());
        }
        let local = &self.token.local;
        let mut waiters = local.waiters.borrow_mut();
        let waker = Some(cx.waker().clone());
        if let Some(entry) = self.slot.and_then(|slot| waiters.get_mut(slot)) {
            *entry = waker;
            return Poll::Pending;
        }
        let reused = local.free.borrow_mut().pop();
        let slot = match reused {
            Some(slot) => {
                if let Some(entry) = waiters.get_mut(slot) {
                    *entry = waker;
                }
                slot
            }
            None => {
                waiters.push(waker);
                waiters.len() - 1
            }
        };
        drop(waiters);
        self.slot = Some(slot);
        Poll::Pending
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            let local = &self.token.local;
            if let Some(entry) = local.waiters.borrow_mut().get_mut(slot) {
                *entry = None;
            }
            local.free.borrow_mut().push(slot);
        }
    }
}
