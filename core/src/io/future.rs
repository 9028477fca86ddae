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

/// Lets the other tasks of this worker run once: wakes itself and returns
/// `Pending` a single time (monoio queues a woken task at the back).
pub async fn yield_now() {
    let mut yielded = false;
    poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
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
