//! A single-threaded, single-waiter wake-up flag for tasks on one core.
//!
//! Drivers run several tasks per connection (reader, writer, timer) on the
//! same monoio thread; they wake each other with [`Notify`]. It never
//! allocates after creation and is `!Send`: cross-core wake-ups go through
//! `io::xcore` instead.

use std::cell::Cell;
use std::future::poll_fn;
use std::task::{Poll, Waker};

/// A wake-up flag. [`Notify::notify`] sets it and wakes the waiting task;
/// [`Notify::notified`] waits until it is set, then clears it. A notify with
/// no waiter is remembered (at most one).
#[derive(Default)]
pub struct Notify {
    set: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl std::fmt::Debug for Notify {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notify")
            .field("set", &self.set.get())
            .finish_non_exhaustive()
    }
}

impl Notify {
    /// A cleared flag.
    pub fn new() -> Self {
        Self::default()
    }

    /// Set the flag and wake the waiter, if any.
    pub fn notify(&self) {
        self.set.set(true);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// Wait until the flag is set, then clear it.
    pub async fn notified(&self) {
        poll_fn(|cx| {
            if self.set.replace(false) {
                Poll::Ready(())
            } else {
                let replace = match self.waker.take() {
                    Some(w) if w.will_wake(cx.waker()) => w,
                    _ => cx.waker().clone(),
                };
                self.waker.set(Some(replace));
                Poll::Pending
            }
        })
        .await;
    }
}

/// A single-threaded wake-up for many waiters: [`Broadcast::notify_all`]
/// wakes every task currently in [`Broadcast::wait`]. Waiters that arrive
/// after a notification wait for the next one. The waker list keeps its
/// capacity, so steady-state waits do not allocate.
#[derive(Default)]
pub struct Broadcast {
    generation: Cell<u64>,
    wakers: std::cell::RefCell<Vec<Waker>>,
}

impl std::fmt::Debug for Broadcast {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broadcast")
            .field("generation", &self.generation.get())
            .finish_non_exhaustive()
    }
}

impl Broadcast {
    /// No waiters yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wake every waiting task.
    pub fn notify_all(&self) {
        self.generation.set(self.generation.get().wrapping_add(1));
        let mut wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        for w in wakers.drain(..) {
            w.wake();
        }
        // Keep the allocation for the next round.
        let mut slot = self.wakers.borrow_mut();
        if slot.is_empty() {
            *slot = wakers;
        }
    }

    /// Wait for the next [`Broadcast::notify_all`].
    pub async fn wait(&self) {
        let start = self.generation.get();
        poll_fn(|cx| {
            if self.generation.get() != start {
                return Poll::Ready(());
            }
            let mut wakers = self.wakers.borrow_mut();
            if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
                wakers.push(cx.waker().clone());
            }
            Poll::Pending
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;

    #[test]
    fn notify_before_wait_is_remembered_once() {
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .build()
            .unwrap();
        rt.block_on(async {
            let n = Notify::new();
            n.notify();
            n.notify();
            n.notified().await; // consumes the (single) stored notification
            assert!(!n.set.get());
        });
    }

    #[test]
    fn broadcast_wakes_every_waiter() {
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        rt.block_on(async {
            let b = Rc::new(Broadcast::new());
            let tasks: Vec<_> = (0..3)
                .map(|i| {
                    let b = b.clone();
                    monoio::spawn(async move {
                        b.wait().await;
                        i
                    })
                })
                .collect();
            monoio::time::sleep(std::time::Duration::from_millis(1)).await;
            b.notify_all();
            let mut sum = 0;
            for t in tasks {
                sum += t.await;
            }
            assert_eq!(sum, 3);
        });
    }

    #[test]
    fn wakes_a_waiting_task() {
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        rt.block_on(async {
            let n = Rc::new(Notify::new());
            let n2 = n.clone();
            let waiter = monoio::spawn(async move {
                n2.notified().await;
                7
            });
            monoio::time::sleep(std::time::Duration::from_millis(1)).await;
            n.notify();
            assert_eq!(waiter.await, 7);
        });
    }
}
