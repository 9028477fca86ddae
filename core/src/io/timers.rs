//! Deadlines of many connections on one timer per thread.
//!
//! A monoio `Sleep` is 640 bytes (its timer entry is cache-padded to 128
//! bytes), and a connection that keeps one in a task of its own pays that
//! task too — about 0.8 KiB per idle connection for a keepalive deadline an
//! hour away. Here each connection owns a [`Deadline`]: a slot in this
//! thread's indexed min-heap (about 40 bytes), and one task per thread
//! sleeps towards the earliest deadline and calls the owner's
//! [`Expire::expire`] when it passes.
//!
//! The heap is indexed (every slot knows its position), so moving a
//! deadline is one sift and a cleared or dropped deadline leaves nothing
//! behind: the heap holds exactly the armed deadlines.
//!
//! The task runs while any deadline is armed and ends when none is (so a
//! runtime whose connections have all ended has no timer task left, as
//! `docs/ARCHITECTURE.md` requires of every task). The next deadline armed
//! after that starts a new one. A task that is not polled by its deadline
//! plus [`STALE_AFTER`] is taken for dead (its runtime ended with deadlines
//! still armed, e.g. a leaked connection) and replaced; if it was only
//! late, it notices it was replaced and ends.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::time::Duration;

use monoio::time::Instant;

use super::future::{Either, race};
use super::notify::Notify;

/// How late the timer task may be before [`Deadline::set`] replaces it.
pub const STALE_AFTER: Duration = Duration::from_secs(5);

/// The owner of a [`Deadline`].
pub trait Expire {
    /// The deadline has passed (it was cleared just before the call; set it
    /// again for the next one). Runs on the thread's timer task.
    fn expire(&self);
}

/// A slot's position when it is not in the heap.
const NOT_QUEUED: u32 = u32::MAX;

struct Slot {
    at: Option<Instant>,
    /// Index in `Wheel::heap`, or [`NOT_QUEUED`].
    pos: u32,
    target: Weak<dyn Expire>,
}

/// The running timer task's shared state.
struct Task {
    /// A sooner deadline was armed, or the last one went.
    wake: Notify,
    /// The deadline it sleeps towards (`None`: not polled yet).
    until: Cell<Option<Instant>>,
    /// When it was spawned.
    spawned: Instant,
}

#[derive(Default)]
struct Wheel {
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Slot ids, a binary min-heap on their deadlines.
    heap: Vec<u32>,
    /// The current timer task (`None`: none runs).
    task: Option<Rc<Task>>,
}

thread_local! {
    static WHEEL: RefCell<Wheel> = RefCell::new(Wheel::default());
}

impl Wheel {
    fn at(&self, pos: usize) -> Option<Instant> {
        let id = *self.heap.get(pos)?;
        self.slots.get(id as usize).and_then(|s| s.at)
    }

    fn earliest(&self) -> Option<Instant> {
        self.at(0)
    }

    fn place(&mut self, pos: usize) {
        if let Some(&id) = self.heap.get(pos)
            && let Some(s) = self.slots.get_mut(id as usize)
        {
            s.pos = pos as u32;
        }
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.place(a);
        self.place(b);
    }

    fn sift_up(&mut self, mut pos: usize) {
        while pos > 0 {
            let parent = (pos - 1) / 2;
            if self.at(pos) >= self.at(parent) {
                break;
            }
            self.swap(pos, parent);
            pos = parent;
        }
    }

    fn sift_down(&mut self, mut pos: usize) {
        loop {
            let (l, r) = (2 * pos + 1, 2 * pos + 2);
            let mut least = pos;
            if l < self.heap.len() && self.at(l) < self.at(least) {
                least = l;
            }
            if r < self.heap.len() && self.at(r) < self.at(least) {
                least = r;
            }
            if least == pos {
                return;
            }
            self.swap(pos, least);
            pos = least;
        }
    }

    fn remove_at(&mut self, pos: usize) {
        let last = self.heap.len() - 1;
        if pos != last {
            self.swap(pos, last);
        }
        if let Some(id) = self.heap.pop()
            && let Some(s) = self.slots.get_mut(id as usize)
        {
            s.pos = NOT_QUEUED;
        }
        if pos < self.heap.len() {
            self.sift_down(pos);
            self.sift_up(pos);
        }
    }

    /// Sets slot `id`'s deadline; returns the task to wake or `true` when a
    /// task must be started.
    fn set(&mut self, id: u32, at: Option<Instant>) -> Action {
        let Some(slot) = self.slots.get_mut(id as usize) else {
            return Action::None;
        };
        let old = std::mem::replace(&mut slot.at, at);
        let pos = slot.pos;
        match (pos == NOT_QUEUED, at) {
            (true, None) => return Action::None,
            (true, Some(_)) => {
                self.heap.push(id);
                let last = self.heap.len() - 1;
                self.place(last);
                self.sift_up(last);
            }
            (false, None) => self.remove_at(pos as usize),
            (false, Some(new)) => {
                if old.is_some_and(|o| new < o) {
                    self.sift_up(pos as usize);
                } else {
                    self.sift_down(pos as usize);
                }
            }
        }
        self.after_change(at)
    }

    /// What the timer task needs after a change that armed `armed` (if any).
    fn after_change(&mut self, armed: Option<Instant>) -> Action {
        let Some(task) = self.task.clone() else {
            return if self.heap.is_empty() {
                Action::None
            } else {
                Action::Start
            };
        };
        if self.heap.is_empty() {
            // The task ends when woken with nothing armed.
            self.task = None;
            return Action::Wake(task);
        }
        let now = Instant::now();
        if task.until.get().unwrap_or(task.spawned) + STALE_AFTER < now {
            return Action::Start;
        }
        match task.until.get() {
            Some(until) if armed.is_none_or(|a| a >= until) => Action::None,
            _ => Action::Wake(task),
        }
    }

    /// Takes every slot due at `now` out of the heap.
    fn pop_due(&mut self, now: Instant, due: &mut Vec<Weak<dyn Expire>>) {
        while self.earliest().is_some_and(|at| at <= now) {
            let Some(&id) = self.heap.first() else { break };
            self.remove_at(0);
            if let Some(s) = self.slots.get_mut(id as usize) {
                s.at = None;
                due.push(s.target.clone());
            }
        }
    }
}

/// What [`Deadline::set`] must do after updating the heap (outside the
/// borrow).
enum Action {
    None,
    Wake(Rc<Task>),
    Start,
}

fn act(action: Action) {
    match action {
        Action::None => {}
        Action::Wake(t) => t.wake.notify(),
        Action::Start => {
            let task = Rc::new(Task {
                wake: Notify::new(),
                until: Cell::new(None),
                spawned: Instant::now(),
            });
            // The previous task, if any, finds itself replaced and ends.
            let old = WHEEL.with(|w| w.borrow_mut().task.replace(task.clone()));
            if let Some(old) = old {
                old.wake.notify();
            }
            drop(monoio::spawn(run(task)));
        }
    }
}

/// The thread's timer task: sleeps towards the earliest deadline and
/// expires what is due, until no deadline is armed or it was replaced.
async fn run(me: Rc<Task>) {
    // One timer for the task's whole life, boxed (640 bytes, pinned).
    let mut sleep: Option<std::pin::Pin<Box<monoio::time::Sleep>>> = None;
    let mut due: Vec<Weak<dyn Expire>> = Vec::new();
    loop {
        let next = WHEEL.with(|w| {
            let w = w.borrow();
            let current = w.task.as_ref().is_some_and(|t| Rc::ptr_eq(t, &me));
            current.then(|| w.earliest()).flatten()
        });
        let Some(next) = next else { break };
        me.until.set(Some(next));
        let timer = match &mut sleep {
            Some(s) => {
                if s.deadline() != next {
                    s.as_mut().reset(next);
                }
                s
            }
            None => sleep.insert(Box::pin(monoio::time::sleep_until(next))),
        };
        if let Either::Right(()) = race(timer.as_mut(), me.wake.notified()).await {
            continue;
        }
        let now = Instant::now();
        WHEEL.with(|w| w.borrow_mut().pop_due(now, &mut due));
        for target in due.drain(..) {
            if let Some(t) = target.upgrade() {
                t.expire();
            }
        }
    }
    me.until.set(None);
    WHEEL.with(|w| {
        let mut w = w.borrow_mut();
        if w.task.as_ref().is_some_and(|t| Rc::ptr_eq(t, &me)) {
            w.task = None;
        }
    });
}

/// One deadline on this thread's timer, owned by an [`Expire`] target
/// (`!Send`: use it on the thread that made it).
pub struct Deadline {
    slot: u32,
    /// `!Send`, `!Sync`.
    _local: std::marker::PhantomData<Rc<()>>,
}

impl std::fmt::Debug for Deadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deadline").field("at", &self.get()).finish()
    }
}

impl Deadline {
    /// A cleared deadline of `target`.
    pub fn new(target: Weak<dyn Expire>) -> Self {
        let slot = WHEEL.with(|w| {
            let mut w = w.borrow_mut();
            let slot = Slot {
                at: None,
                pos: NOT_QUEUED,
                target,
            };
            match w.free.pop() {
                Some(id) => {
                    if let Some(s) = w.slots.get_mut(id as usize) {
                        *s = slot;
                    }
                    id
                }
                None => {
                    w.slots.push(slot);
                    (w.slots.len() - 1) as u32
                }
            }
        });
        Self {
            slot,
            _local: std::marker::PhantomData,
        }
    }

    /// When it expires (`None`: cleared).
    pub fn get(&self) -> Option<Instant> {
        WHEEL.with(|w| w.borrow().slots.get(self.slot as usize).and_then(|s| s.at))
    }

    /// Arm it for `at`, move it, or clear it (`None`). Arming must happen
    /// inside a monoio runtime: the thread's timer task is started on it
    /// when none runs.
    pub fn set(&self, at: Option<Instant>) {
        let action = WHEEL.with(|w| w.borrow_mut().set(self.slot, at));
        act(action);
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        let action = WHEEL.try_with(|w| {
            let mut w = w.borrow_mut();
            let action = w.set(self.slot, None);
            if let Some(s) = w.slots.get_mut(self.slot as usize) {
                s.target = Weak::<Inert>::new();
            }
            w.free.push(self.slot);
            action
        });
        // Only ever a wake-up here: a drop may happen outside a runtime,
        // and the next armed deadline starts a task if one is needed.
        if let Ok(Action::Wake(t)) = action {
            t.wake.notify();
        }
    }
}

/// The target of a free slot.
struct Inert;

impl Expire for Inert {
    fn expire(&self) {}
}

/// Deadlines armed on this thread (tests and leak checks).
pub fn armed() -> usize {
    WHEEL.with(|w| w.borrow().heap.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::runtime::{Engine, block_on};

    /// Counts its expiries and logs its id in a shared order.
    struct Probe {
        id: u32,
        fired: Cell<u32>,
        log: Rc<RefCell<Vec<u32>>>,
    }

    impl Expire for Probe {
        fn expire(&self) {
            self.fired.set(self.fired.get() + 1);
            self.log.borrow_mut().push(self.id);
        }
    }

    /// The expiry order all probes of one [`probes`] call log into.
    type Log = Rc<RefCell<Vec<u32>>>;

    fn probes(n: u32) -> (Vec<Rc<Probe>>, Vec<Deadline>, Log) {
        let log = Rc::new(RefCell::new(Vec::new()));
        let probes: Vec<Rc<Probe>> = (0..n)
            .map(|id| {
                Rc::new(Probe {
                    id,
                    fired: Cell::new(0),
                    log: log.clone(),
                })
            })
            .collect();
        let deadlines = probes
            .iter()
            .map(|p| Deadline::new(Rc::downgrade(p) as Weak<dyn Expire>))
            .collect();
        (probes, deadlines, log)
    }

    /// Pops what is due at `now` and expires it, as the task does.
    fn expire_due(now: Instant) {
        let mut due = Vec::new();
        WHEEL.with(|w| w.borrow_mut().pop_due(now, &mut due));
        for t in due {
            if let Some(t) = t.upgrade() {
                t.expire();
            }
        }
    }

    /// Arms without starting a task (no runtime in these tests).
    fn arm(d: &Deadline, at: Option<Instant>) {
        WHEEL.with(|w| {
            let mut w = w.borrow_mut();
            let _ = w.set(d.slot, at);
            w.task = None;
        });
    }

    #[test]
    fn the_heap_expires_in_deadline_order_after_moves_and_clears() {
        let (probes, ds, log) = probes(64);
        let t0 = Instant::now() + Duration::from_secs(3600);
        let ms = |m: u64| t0 + Duration::from_millis(m);
        for (i, d) in ds.iter().enumerate() {
            arm(d, Some(ms((i as u64 * 29) % 64)));
        }
        // Move every third later, every fifth sooner, clear every seventh.
        for (i, d) in ds.iter().enumerate() {
            if i % 3 == 0 {
                arm(d, Some(ms(100 + (i as u64 * 13) % 64)));
            }
            if i % 5 == 0 {
                arm(d, Some(ms((i as u64 * 7) % 64)));
            }
            if i % 7 == 0 {
                arm(d, None);
            }
        }
        let want: Vec<u32> = {
            let mut v: Vec<(Instant, u32)> = ds
                .iter()
                .zip(&probes)
                .filter_map(|(d, p)| d.get().map(|at| (at, p.id)))
                .collect();
            v.sort();
            v.into_iter().map(|(_, id)| id).collect()
        };
        assert_eq!(armed(), want.len());
        // One millisecond at a time: the order is the deadlines' order
        // (ties, which the heap may expire in any order, sorted by id as
        // `want` is).
        let mut got = Vec::new();
        for m in 0..200 {
            log.borrow_mut().clear();
            expire_due(ms(m));
            let mut now: Vec<u32> = log.borrow().clone();
            now.sort_unstable();
            got.extend(now);
        }
        assert_eq!(got, want);
        assert_eq!(armed(), 0);
        assert!(probes.iter().all(|p| p.fired.get() <= 1));
        assert!(ds.iter().all(|d| d.get().is_none()));
    }

    #[test]
    fn a_dropped_deadline_leaves_nothing_and_its_slot_is_reused() {
        let (_p, ds, log) = probes(3);
        let far = Instant::now() + Duration::from_secs(3600);
        for d in &ds {
            arm(d, Some(far));
        }
        let slots = WHEEL.with(|w| w.borrow().slots.len());
        drop(ds);
        assert_eq!(armed(), 0);
        let (_q, again, _) = probes(3);
        assert_eq!(
            WHEEL.with(|w| w.borrow().slots.len()),
            slots,
            "slots reused"
        );
        drop(again);
        expire_due(far);
        assert!(log.borrow().is_empty());
    }

    #[test]
    fn deadlines_fire_in_order_and_the_task_ends_with_the_last() {
        for engine in [Engine::Epoll, Engine::IoUring] {
            let r = block_on(engine, async {
                let (probes, ds, log) = probes(3);
                let now = Instant::now();
                ds[0].set(Some(now + Duration::from_millis(30)));
                ds[1].set(Some(now + Duration::from_millis(10)));
                ds[2].set(Some(now + Duration::from_secs(3600)));
                // Moving the far one sooner wakes the sleeping task.
                ds[2].set(Some(now + Duration::from_millis(20)));
                let limit = now + Duration::from_secs(10);
                while probes.iter().any(|p| p.fired.get() == 0) && Instant::now() < limit {
                    monoio::time::sleep(Duration::from_millis(5)).await;
                }
                let cleared = ds.iter().all(|d| d.get().is_none());
                while WHEEL.with(|w| w.borrow().task.is_some()) && Instant::now() < limit {
                    monoio::time::sleep(Duration::from_millis(5)).await;
                }
                let running = WHEEL.with(|w| w.borrow().task.is_some());
                (log.take(), cleared, running)
            });
            let Ok((order, cleared, running)) = r else {
                continue; // this engine is not available here
            };
            assert_eq!(order, vec![1, 2, 0], "{engine:?}");
            assert!(cleared, "{engine:?}: an expired deadline stays armed");
            assert!(
                !running,
                "{engine:?}: the timer task outlived its deadlines"
            );
        }
    }

    #[test]
    fn a_dropped_deadline_never_fires() {
        let r = block_on(Engine::Epoll, async {
            let (probes, mut ds, _) = probes(1);
            ds[0].set(Some(Instant::now() + Duration::from_millis(10)));
            assert_eq!(armed(), 1);
            ds.clear();
            assert_eq!(armed(), 0);
            monoio::time::sleep(Duration::from_millis(40)).await;
            probes[0].fired.get()
        });
        assert_eq!(r.ok(), Some(0));
    }
}
