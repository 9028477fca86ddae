//! Small future helpers the drivers use: [`race`], [`join`] (named
//! futures, see [`race`] for why) and [`yield_now`].

use std::{
    future::{Future, poll_fn},
    pin::Pin,
    task::{Context, Poll},
};

/// Result of [`race`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Either<A, B> {
    /// The first future finished first.
    Left(A),
    /// The second future finished first.
    Right(B),
}

/// Polls `a` then `b` until one finishes; the other is dropped (pass
/// `Pin<&mut F>` to keep it). Biased towards `a`.
///
/// A named future rather than an `async fn`: an `async fn` keeps its
/// arguments twice in its state (as captured and as pinned locals), and the
/// doubling compounds with nesting — a driver's readiness wait, a race of a
/// read, a notification and a timer, was 3 KiB per idle connection.
pub fn race<A: Future, B: Future>(a: A, b: B) -> Race<A, B> {
    Race { a, b }
}

/// The future of [`race`].
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Race<A, B> {
    a: A,
    b: B,
}

impl<A: Future, B: Future> Future for Race<A, B> {
    type Output = Either<A::Output, B::Output>;

    #[allow(unsafe_code)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: structural pinning of both fields: they are never moved
        // out of a pinned `Race` (nothing hands out `&mut A` or `&mut B`,
        // there is no `Drop` impl), and `Race` is `Unpin` only when both
        // are.
        let this = unsafe { self.get_unchecked_mut() };
        // SAFETY: as above; `this.a` stays where it is until dropped.
        if let Poll::Ready(out) = unsafe { Pin::new_unchecked(&mut this.a) }.poll(cx) {
            return Poll::Ready(Either::Left(out));
        }
        // SAFETY: as above.
        if let Poll::Ready(out) = unsafe { Pin::new_unchecked(&mut this.b) }.poll(cx) {
            return Poll::Ready(Either::Right(out));
        }
        Poll::Pending
    }
}

/// Polls `a` and `b` until both finished; returns both outputs. A named
/// future for the reason given at [`race`].
pub fn join<A: Future, B: Future>(a: A, b: B) -> Join<A, B> {
    Join {
        a,
        b,
        ra: None,
        rb: None,
    }
}

/// The future of [`join`].
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Join<A: Future, B: Future> {
    a: A,
    b: B,
    ra: Option<A::Output>,
    rb: Option<B::Output>,
}

impl<A: Future, B: Future> Future for Join<A, B> {
    type Output = (A::Output, B::Output);

    #[allow(unsafe_code)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: structural pinning of `a` and `b` only (see `Race`): they
        // are never moved out; the outputs `ra`/`rb` are not pinned and are
        // moved freely. No `Drop` impl.
        let this = unsafe { self.get_unchecked_mut() };
        if this.ra.is_none()
            // SAFETY: as above.
            && let Poll::Ready(out) = unsafe { Pin::new_unchecked(&mut this.a) }.poll(cx)
        {
            this.ra = Some(out);
        }
        if this.rb.is_none()
            // SAFETY: as above.
            && let Poll::Ready(out) = unsafe { Pin::new_unchecked(&mut this.b) }.poll(cx)
        {
            this.rb = Some(out);
        }
        match (this.ra.take(), this.rb.take()) {
            (Some(x), Some(y)) => Poll::Ready((x, y)),
            (x, y) => {
                this.ra = x;
                this.rb = y;
                Poll::Pending
            }
        }
    }
}

/// Polls `fut` to completion and drops `guard` right after it (or with
/// the future, if it is dropped first). A named future for the reason
/// given at [`race`]: `async move { let _g = guard; fut.await }` keeps
/// `fut` twice in its state — once captured, once as the awaited value —
/// so a task spawned through such a wrapper costs twice its future.
pub fn with_guard<F: Future, G>(fut: F, guard: G) -> Guarded<F, G> {
    Guarded {
        fut,
        guard: Some(guard),
    }
}

/// The future of [`with_guard`].
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Guarded<F, G> {
    fut: F,
    guard: Option<G>,
}

impl<F: Future, G> Future for Guarded<F, G> {
    type Output = F::Output;

    #[allow(unsafe_code)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: structural pinning of `fut` only (see `Race`): it is never
        // moved out of a pinned `Guarded`; `guard` is not pinned and is
        // only dropped in place. No `Drop` impl.
        let this = unsafe { self.get_unchecked_mut() };
        // SAFETY: as above.
        let out = std::task::ready!(unsafe { Pin::new_unchecked(&mut this.fut) }.poll(cx));
        this.guard = None;
        Poll::Ready(out)
    }
}

/// What [`then`] runs after its first future, when there is more to do.
pub type Next = Pin<Box<dyn Future<Output = ()>>>;

/// Polls `fut` to completion, hands its output to `after`, and then polls
/// the future `after` returns, if any. A named future for the reason given
/// at [`with_guard`]: `async move { let out = fut.await; … }` with `fut`
/// made outside keeps it twice, and made inside keeps a slot for each of
/// its arguments beside it; a connection task is this, spawned once per
/// connection.
pub fn then<F: Future, A: FnOnce(F::Output) -> Option<Next>>(fut: F, after: A) -> Then<F, A> {
    Then {
        fut,
        after: Some(after),
        next: None,
    }
}

/// The future of [`then`].
#[must_use = "futures do nothing unless polled"]
pub struct Then<F, A> {
    fut: F,
    /// `None` once `fut` is done (it is not polled again).
    after: Option<A>,
    next: Option<Next>,
}

impl<F: Future, A: FnOnce(F::Output) -> Option<Next>> Future for Then<F, A> {
    type Output = ();

    #[allow(unsafe_code)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // SAFETY: structural pinning of `fut` only (see `Race`): it is never
        // moved out of a pinned `Then`; `after` is moved out by value and
        // `next` is pinned by its own box. No `Drop` impl.
        let this = unsafe { self.get_unchecked_mut() };
        if this.after.is_some() {
            // SAFETY: as above.
            let out = std::task::ready!(unsafe { Pin::new_unchecked(&mut this.fut) }.poll(cx));
            let after = this.after.take().expect("checked above");
            this.next = after(out);
        }
        match this.next.as_mut() {
            Some(next) => next.as_mut().poll(cx),
            None => Poll::Ready(()),
        }
    }
}

/// Lets the worker's other runnable tasks run first: the task goes to the
/// back of the run queue, behind every task queued before it.
///
/// monoio puts a task that wakes itself while it is being polled at the
/// *front* of its queue (`Schedule::yield_now`), so a self-wake would run
/// it again at once and nothing else; the wake comes instead from a small
/// task spawned behind the others (one allocation per yield: callers yield
/// per batch, never per packet). Needs a monoio runtime on this thread.
pub async fn yield_now() {
    let mut yielded = false;
    poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            let waker = cx.waker().clone();
            monoio::spawn(async move { waker.wake() });
            Poll::Pending
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::io::runtime::{Engine, block_on};

    #[test]
    fn yield_now_lets_the_tasks_queued_before_it_run() {
        use std::{cell::Cell, rc::Rc};
        let order = block_on(Engine::Epoll, async {
            let ran = Rc::new(Cell::new(0));
            let others: Vec<_> = (0..3)
                .map(|_| {
                    let ran = ran.clone();
                    monoio::spawn(async move { ran.set(ran.get() + 1) })
                })
                .collect();
            yield_now().await;
            let after_one_yield = ran.get();
            for t in others {
                t.await;
            }
            after_one_yield
        })
        .unwrap();
        assert_eq!(order, 3, "every task queued before the yield ran first");
    }

    #[test]
    fn race_is_biased_to_the_left() {
        let out = block_on(Engine::Epoll, race(async { 1 }, async { 2 })).unwrap();
        assert_eq!(out, Either::Left(1));
        let out = block_on(
            Engine::Epoll,
            race(std::future::pending::<()>(), async { 2 }),
        )
        .unwrap();
        assert_eq!(out, Either::Right(2));
    }

    #[test]
    fn guard_drops_when_the_future_is_done() {
        use std::{cell::Cell, rc::Rc};
        struct Flag(Rc<Cell<bool>>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.set(true);
            }
        }
        let dropped = Rc::new(Cell::new(false));
        let seen = dropped.clone();
        let out = block_on(Engine::Epoll, async move {
            let fut = async {
                monoio::time::sleep(Duration::from_millis(1)).await;
                assert!(!seen.get(), "guard kept while the future runs");
                5
            };
            with_guard(fut, Flag(seen.clone())).await
        })
        .unwrap();
        assert_eq!(out, 5);
        assert!(dropped.get());
        // Not twice the future: only the guard's slot on top.
        let fut = async {
            let big = [0u8; 4096];
            monoio::time::sleep(Duration::from_millis(1)).await;
            big.len()
        };
        let guarded = size_of_val(&with_guard(fut, ()));
        assert!(guarded < 2 * 4096, "{guarded}");
    }

    #[test]
    fn then_hands_on_the_output_and_runs_what_follows() {
        use std::{cell::Cell, rc::Rc};
        let ran = Rc::new(Cell::new(0));
        let r = ran.clone();
        block_on(
            Engine::Epoll,
            then(
                async {
                    monoio::time::sleep(Duration::from_millis(1)).await;
                    3
                },
                move |out| -> Option<Next> {
                    r.set(out);
                    Some(Box::pin(async move {
                        monoio::time::sleep(Duration::from_millis(1)).await;
                        r.set(r.get() * 10);
                    }))
                },
            ),
        )
        .unwrap();
        assert_eq!(ran.get(), 30);
        // Nothing follows: done at once after the first future.
        block_on(Engine::Epoll, then(async { 1 }, |_| None)).unwrap();
        // The first future is kept once (an `async` block awaiting one made
        // outside it keeps it twice).
        let fut = async {
            let big = [0u8; 4096];
            monoio::time::sleep(Duration::from_millis(1)).await;
            big.len()
        };
        let size = size_of_val(&then(fut, |_| None));
        assert!(size < 2 * 4096, "{size}");
    }

    #[test]
    fn join_waits_for_both_and_keeps_their_outputs() {
        let out = block_on(Engine::Epoll, async {
            join(
                async {
                    monoio::time::sleep(Duration::from_millis(5)).await;
                    "slow"
                },
                async { 7 },
            )
            .await
        })
        .unwrap();
        assert_eq!(out, ("slow", 7));
    }
}
