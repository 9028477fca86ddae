//! Reliable, ordered sending into the cross-core mesh.
//!
//! [`MeshSender::send`](super::xcore::MeshSender::send) never blocks: a full
//! inbox hands the message back. Messages that must not be lost — directory
//! announcements, frontends moving between cores, the packets and credit of
//! flows relayed between cores — go through an [`Outbound`] instead: a
//! message that does not fit waits in a queue of the sending worker for that
//! destination, and every later message to the same destination queues
//! behind it, so each (sender, receiver) pair stays first-in first-out. A
//! task of the sending worker ([`Outbound::run`]) moves the queue into the
//! inbox as the receiver drains it.
//!
//! The queues have no fixed cap; what bounds them is what the messages
//! carry: announcements are per connection, and relayed packets and credit
//! are bounded by the HTTP/2 windows that produced them (a frontend's stream
//! window one way, an agent tunnel's the other; see
//! docs/design/cross-core.md). [`Outbound::queued`] reports the depth for
//! metrics and leak checks.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::time::Duration;

use super::notify::Notify;
use super::runtime::{Either, StopToken, race, yield_now};
use super::xcore::{MeshSender, SendError};

/// The receiving worker has stopped; the message was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

/// A worker's reliable, ordered sender into the mesh (see the module docs).
/// Single-threaded: one per worker.
pub struct Outbound<T> {
    sender: MeshSender<T>,
    /// Per destination: messages waiting for room in its inbox.
    waiting: RefCell<Vec<VecDeque<T>>>,
    queued: Cell<usize>,
    wake: Notify,
}

impl<T> std::fmt::Debug for Outbound<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound")
            .field("queued", &self.queued.get())
            .finish()
    }
}

/// Fruitless retries (each after yielding to the worker's other tasks)
/// before [`Outbound::run`] backs off with a timer.
const SPINS: u32 = 16;
/// The back-off between retries while a receiver stays full.
const BACKOFF: Duration = Duration::from_millis(1);

impl<T: Send> Outbound<T> {
    /// An outbound sender over `sender`.
    pub fn new(sender: MeshSender<T>) -> Self {
        let workers = sender.workers();
        Self {
            sender,
            waiting: RefCell::new((0..workers).map(|_| VecDeque::new()).collect()),
            queued: Cell::new(0),
            wake: Notify::new(),
        }
    }

    /// Send `msg` to worker `to`: into its inbox now if nothing waits for it
    /// and there is room, else behind what waits. Fails only when that
    /// worker has stopped (or does not exist).
    pub fn send(&self, to: usize, msg: T) -> Result<(), Closed> {
        let mut waiting = self.waiting.borrow_mut();
        let Some(q) = waiting.get_mut(to) else {
            return Err(Closed);
        };
        if q.is_empty() {
            match self.sender.send(to, msg) {
                Ok(()) => return Ok(()),
                Err(SendError::Closed(_) | SendError::NoSuchWorker(_)) => return Err(Closed),
                Err(SendError::Full(msg)) => {
                    q.push_back(msg);
                    self.wake.notify();
                }
            }
        } else {
            q.push_back(msg);
        }
        self.queued.set(self.queued.get() + 1);
        Ok(())
    }

    /// Messages waiting for room, all destinations.
    pub fn queued(&self) -> usize {
        self.queued.get()
    }

    /// Move waiting messages into their inboxes, in order, until each
    /// destination is empty or full. Messages for a stopped worker are
    /// dropped. Returns how many still wait.
    pub fn flush(&self) -> usize {
        let mut waiting = self.waiting.borrow_mut();
        let mut left = 0;
        for (to, q) in waiting.iter_mut().enumerate() {
            while let Some(msg) = q.pop_front() {
                match self.sender.send(to, msg) {
                    Ok(()) => {}
                    Err(SendError::Full(msg)) => {
                        q.push_front(msg);
                        break;
                    }
                    Err(SendError::Closed(_) | SendError::NoSuchWorker(_)) => q.clear(),
                }
            }
            left += q.len();
        }
        self.queued.set(left);
        left
    }

    /// Keep flushing while anything waits, until `stop` fires. Run it as a
    /// task of the worker that owns this sender.
    pub async fn run(&self, stop: &StopToken) {
        let mut spins = 0;
        loop {
            if self.queued.get() == 0 {
                spins = 0;
                if let Either::Left(()) = race(stop.stopped(), self.wake.notified()).await {
                    return;
                }
            }
            if self.flush() == 0 {
                continue;
            }
            spins += 1;
            let retry = async {
                if spins < SPINS {
                    yield_now().await;
                } else {
                    monoio::time::sleep(BACKOFF).await;
                }
            };
            if let Either::Left(()) = race(stop.stopped(), retry).await {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::xcore::Mesh;

    #[test]
    fn full_inboxes_keep_order_and_lose_nothing() {
        let mesh: Mesh<u32> = Mesh::new(2, 4);
        let out = Outbound::new(mesh.sender());
        let rx = mesh.receiver(1).expect("receiver");
        for i in 0..10 {
            assert_eq!(out.send(1, i), Ok(()));
        }
        assert_eq!(out.queued(), 6, "4 fit, 6 wait");
        let mut got = Vec::new();
        while got.len() < 10 {
            while let Some(m) = rx.try_recv() {
                got.push(m);
            }
            out.flush();
        }
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        assert_eq!(out.queued(), 0);
        assert_eq!(out.send(7, 1), Err(Closed), "no such worker");
    }

    #[test]
    fn a_stopped_receiver_drops_what_waits_for_it() {
        let mesh: Mesh<u32> = Mesh::new(2, 1);
        let out = Outbound::new(mesh.sender());
        let rx = mesh.receiver(1).expect("receiver");
        assert_eq!(out.send(1, 1), Ok(()));
        assert_eq!(out.send(1, 2), Ok(()));
        assert_eq!(out.queued(), 1);
        drop(rx);
        assert_eq!(out.flush(), 0);
        assert_eq!(out.send(1, 3), Err(Closed));
    }
}
