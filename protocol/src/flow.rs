//! Receive-side flow control of one proxied connection ("flow"), sans-IO.
//!
//! Every flow of an agent shares one HTTP/2 stream (the `/AgentService/Connect`
//! tunnel), and the Konnectivity protocol has no per-flow window. The side
//! that *receives* a flow's data over the tunnel (the agent towards its
//! destination, the server towards its frontend) queues it per flow, and a
//! [`FlowRx`] decides, for every payload queued and every byte drained:
//!
//! - **credit:** the tunnel stream's HTTP/2 credit for a payload is returned
//!   at once while the flow's queue is at most [`FlowLimits::limit`]; above
//!   it the credit is *withheld* and returned as the queue drains back under
//!   the limit. The peer can then send at most one stream window more, so
//!   the queue is bounded without closing a flow that is merely slower than
//!   its sender (upstream's blocking channel send has the same effect, on
//!   the whole tunnel);
//! - **PAUSE/RESUME** (only when both peers negotiated konn's extension):
//!   PAUSE once the queue goes above [`FlowLimits::high`], RESUME once it is
//!   back at [`FlowLimits::low`] or below, at most one PAUSE outstanding. The
//!   sender then stops reading that flow's source long before the limit, so
//!   a slow flow never takes the shared window from the others;
//! - **stuck:** a flow whose queue stays non-empty with nothing drained for
//!   [`FlowLimits::stuck_timeout`] is stuck and gets closed by its owner
//!   (who returns the withheld credit with [`FlowRx::close`]). A queue above
//!   [`FlowLimits::cap`] is stuck at once: the cap is a memory-safety net
//!   that a peer honouring HTTP/2 flow control cannot reach with messages
//!   that arrive whole (their credit is withheld in full).
//!
//! Sizes are bytes as the owner counts them (payload bytes, or framed
//! message bytes); credit is whatever the gRPC layer handed out with the
//! message (`GrpcEvent::Message::flow`). Time is passed in.
//!
//! Choosing the marks: after PAUSE the sender may still deliver what it had
//! already queued and sent — its own tunnel send queue (konn pauses sources
//! at `--conn-queue-size`) plus one stream window in flight (plus, for a
//! gRPC frontend at the server, that frontend's stream window). With
//! `--conn-queue-size` = q, [`FlowLimits::from_queue_size`] puts the marks at
//! low = q/8, high = q/2, limit = 4q, cap = 16q: with the default q = 1 MiB
//! and 1 MiB stream windows that in-flight data (≤ 3 MiB) fits between high
//! (512 KiB) and limit (4 MiB), so a paused flow never needs withheld credit.

use std::time::{Duration, Instant};

/// Where a flow's queue pauses, resumes, holds back credit and gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowLimits {
    /// RESUME once the queue is at or below this many bytes.
    pub low: usize,
    /// PAUSE once the queue is above this many bytes.
    pub high: usize,
    /// Withhold the credit of payloads that take the queue above this.
    pub limit: usize,
    /// A queue above this is stuck at once (memory safety; see the module
    /// docs).
    pub cap: usize,
    /// A non-empty queue with nothing drained for this long is stuck.
    pub stuck_timeout: Duration,
}

impl FlowLimits {
    /// The marks for a per-connection queue size `queue` (`--conn-queue-size`,
    /// at least 16 KiB): low = q/8, high = q/2, limit = 4q, cap = 16q.
    pub fn from_queue_size(queue: usize, stuck_timeout: Duration) -> Self {
        let q = queue.max(16 << 10);
        Self {
            low: q / 8,
            high: q / 2,
            limit: q.saturating_mul(4),
            cap: q.saturating_mul(16),
            stuck_timeout,
        }
    }
}

impl Default for FlowLimits {
    /// `--conn-queue-size`'s default (1 MiB) and `--stuck-timeout`'s (120 s).
    fn default() -> Self {
        Self::from_queue_size(1 << 20, Duration::from_secs(120))
    }
}

/// PAUSE or RESUME, to send to the flow's sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// Stop reading this flow's source.
    Pause,
    /// Read it again.
    Resume,
}

/// What the owner must do after a change to the queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct Step {
    /// Credit to return to the tunnel's peer now.
    pub release: usize,
    /// A signal to send to the flow's sender.
    pub signal: Option<Signal>,
}

/// The receive-side state of one flow. See the module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowRx {
    queued: usize,
    withheld: usize,
    paused: bool,
    /// While the queue is non-empty: when it last drained (or filled up
    /// from empty).
    since: Option<Instant>,
}

impl FlowRx {
    /// A flow with nothing queued.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes queued.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Credit held back.
    pub fn withheld(&self) -> usize {
        self.withheld
    }

    /// Whether a PAUSE is outstanding.
    pub fn paused(&self) -> bool {
        self.paused
    }

    /// Since when nothing drained from a non-empty queue (`None`: empty).
    pub fn stalled_since(&self) -> Option<Instant> {
        self.since
    }

    /// Whether the owner must report drained bytes promptly: a RESUME or
    /// withheld credit waits for them. Otherwise reports may be batched.
    pub fn waits_for_drain(&self) -> bool {
        self.paused || self.withheld > 0
    }

    /// The tunnel stream this flow's data came on is gone but the flow
    /// lives on (a resumable tunnel parked): credit withheld on the dead
    /// stream is moot, and so is the PAUSE sent on it (the peer forgets
    /// it; a queue still above high pauses again on the next payload).
    /// The queue itself stays.
    pub fn stream_gone(&mut self) {
        self.withheld = 0;
        self.paused = false;
    }

    /// A payload of `len` bytes was queued; it came with `credit` bytes of
    /// stream credit. `may_pause`: the peer negotiated PAUSE/RESUME.
    pub fn push(
        &mut self,
        len: usize,
        credit: usize,
        lim: &FlowLimits,
        may_pause: bool,
        now: Instant,
    ) -> Step {
        self.grow(len, now);
        let release = if self.queued > lim.limit {
            self.withheld = self.withheld.saturating_add(credit);
            0
        } else {
            credit
        };
        Step {
            release,
            signal: self.maybe_pause(lim, may_pause),
        }
    }

    /// `n` queued bytes left for the receiver at `at`.
    pub fn drain(&mut self, n: usize, lim: &FlowLimits, at: Instant) -> Step {
        let n = n.min(self.queued);
        self.queued -= n;
        if self.queued == 0 {
            self.since = None;
        } else if n > 0 {
            self.since = Some(at);
        }
        let mut step = Step::default();
        if self.withheld > 0 && self.queued < lim.limit {
            // An empty queue withholds nothing, even after one payload
            // larger than the limit.
            let r = if self.queued == 0 {
                self.withheld
            } else {
                self.withheld.min(lim.limit - self.queued)
            };
            self.withheld -= r;
            step.release = r;
        }
        if self.paused && self.queued <= lim.low {
            self.paused = false;
            step.signal = Some(Signal::Resume);
        }
        step
    }

    /// The owner measured the queue at `level` bytes (at `at`): less than
    /// counted means drained, more means grown (without credit).
    pub fn set_level(
        &mut self,
        level: usize,
        lim: &FlowLimits,
        may_pause: bool,
        at: Instant,
    ) -> Step {
        if level < self.queued {
            self.drain(self.queued - level, lim, at)
        } else {
            self.grow(level - self.queued, at);
            Step {
                release: 0,
                signal: self.maybe_pause(lim, may_pause),
            }
        }
    }

    /// Whether the flow is stuck at `now`: nothing drained from a non-empty
    /// queue for the stuck timeout, or the queue above the cap.
    pub fn is_stuck(&self, lim: &FlowLimits, now: Instant) -> bool {
        self.queued > lim.cap
            || self
                .since
                .is_some_and(|s| now.saturating_duration_since(s) >= lim.stuck_timeout)
    }

    /// When the flow becomes stuck if nothing drains (`None`: empty queue,
    /// or a timeout beyond the clock's range).
    pub fn deadline(&self, lim: &FlowLimits) -> Option<Instant> {
        self.since.and_then(|s| s.checked_add(lim.stuck_timeout))
    }

    /// The flow is gone: forget its queue; returns the credit it withheld,
    /// which the owner must return now.
    pub fn close(&mut self) -> usize {
        let withheld = self.withheld;
        *self = Self::default();
        withheld
    }

    /// The flow's own invariant: it has a stuck clock exactly while its
    /// queue is non-empty. For invariant checks.
    #[doc(hidden)]
    pub fn check(&self) -> Result<(), String> {
        if self.since.is_some() != (self.queued > 0) {
            return Err(format!(
                "queue of {} bytes with stuck clock {:?}",
                self.queued, self.since
            ));
        }
        Ok(())
    }

    fn grow(&mut self, n: usize, now: Instant) {
        if n == 0 {
            return;
        }
        if self.queued == 0 {
            self.since = Some(now);
        }
        self.queued = self.queued.saturating_add(n);
    }

    fn maybe_pause(&mut self, lim: &FlowLimits, may_pause: bool) -> Option<Signal> {
        if may_pause && !self.paused && self.queued > lim.high {
            self.paused = true;
            Some(Signal::Pause)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_epoch;

    fn lim() -> FlowLimits {
        FlowLimits {
            low: 100,
            high: 400,
            limit: 1000,
            cap: 5000,
            stuck_timeout: Duration::from_secs(10),
        }
    }

    fn at(s: u64) -> Instant {
        test_epoch() + Duration::from_secs(s)
    }

    #[test]
    fn defaults_follow_the_queue_size() {
        let l = FlowLimits::default();
        assert_eq!(
            (l.low, l.high, l.limit, l.cap),
            (128 << 10, 512 << 10, 4 << 20, 16 << 20)
        );
        assert!(l.low < l.high && l.high < l.limit && l.limit < l.cap);
        // In-flight data after PAUSE with default windows (1 MiB send queue,
        // 1 MiB tunnel window, 1 MiB frontend window) fits under the limit.
        assert!(l.high + (3 << 20) <= l.limit);
        let tiny = FlowLimits::from_queue_size(1, Duration::ZERO);
        assert!(tiny.low > 0 && tiny.low < tiny.high);
    }

    #[test]
    fn an_empty_queue_withholds_nothing_even_after_a_payload_over_the_limit() {
        let (l, mut f) = (lim(), FlowRx::new());
        let s = f.push(1500, 1520, &l, false, at(0));
        assert_eq!(s.release, 0, "over the limit: withheld");
        let s = f.drain(1000, &l, at(1));
        assert_eq!(s.release, 500, "up to the limit while 500 remain queued");
        let s = f.drain(500, &l, at(2));
        assert_eq!(s.release, 1020, "empty: the rest");
        assert_eq!(f.withheld(), 0);
    }

    #[test]
    fn pause_above_high_resume_at_low_once_each() {
        let (l, mut f) = (lim(), FlowRx::new());
        let s = f.push(400, 410, &l, true, at(0));
        assert_eq!(
            s,
            Step {
                release: 410,
                signal: None
            },
            "at high: no PAUSE yet"
        );
        let s = f.push(1, 11, &l, true, at(0));
        assert_eq!(s.signal, Some(Signal::Pause));
        assert_eq!(s.release, 11, "under the limit the credit still goes back");
        assert!(f.paused() && f.waits_for_drain());
        for _ in 0..3 {
            assert_eq!(f.push(100, 110, &l, true, at(1)).signal, None, "one PAUSE");
        }
        assert_eq!(f.drain(300, &l, at(2)).signal, None, "401 left");
        assert_eq!(f.drain(300, &l, at(2)).signal, None, "101 left");
        assert_eq!(f.drain(1, &l, at(2)).signal, Some(Signal::Resume));
        assert_eq!(f.drain(50, &l, at(2)).signal, None, "one RESUME");
        assert!(!f.paused());
    }

    #[test]
    fn without_the_extension_credit_is_withheld_and_returned_as_it_drains() {
        let (l, mut f) = (lim(), FlowRx::new());
        assert_eq!(f.push(1000, 1000, &l, false, at(0)).release, 1000);
        for _ in 0..3 {
            let s = f.push(100, 110, &l, false, at(0));
            assert_eq!(s, Step::default(), "over the limit: withheld, no PAUSE");
        }
        assert_eq!((f.queued(), f.withheld()), (1300, 330));
        assert!(f.waits_for_drain());
        assert_eq!(f.drain(300, &l, at(1)).release, 0, "still at the limit");
        assert_eq!(f.drain(100, &l, at(1)).release, 100);
        assert_eq!(f.drain(900, &l, at(1)).release, 230);
        assert_eq!((f.queued(), f.withheld()), (0, 0));
        assert!(!f.paused(), "never paused");
    }

    #[test]
    fn stuck_only_without_progress() {
        let (l, mut f) = (lim(), FlowRx::new());
        assert!(!f.is_stuck(&l, at(100)), "empty is never stuck");
        assert_eq!(f.deadline(&l), None);
        let _ = f.push(10, 10, &l, true, at(0));
        assert_eq!(f.deadline(&l), Some(at(10)));
        assert!(!f.is_stuck(&l, at(9)));
        let _ = f.drain(1, &l, at(9));
        assert!(!f.is_stuck(&l, at(18)), "progress restarts the clock");
        let _ = f.push(10, 10, &l, true, at(12));
        assert!(
            !f.is_stuck(&l, at(18)),
            "filling up is not progress, nor stalling"
        );
        assert!(f.is_stuck(&l, at(19)));
        let _ = f.drain(100, &l, at(19));
        assert!(!f.is_stuck(&l, at(1000)), "drained empty");
    }

    #[test]
    fn over_the_cap_is_stuck_at_once() {
        let (l, mut f) = (lim(), FlowRx::new());
        let _ = f.set_level(5001, &l, false, at(0));
        assert!(f.is_stuck(&l, at(0)));
    }

    #[test]
    fn close_returns_withheld_credit() {
        let (l, mut f) = (lim(), FlowRx::new());
        let _ = f.push(2000, 2000, &l, true, at(0));
        assert_eq!(f.withheld(), 2000);
        assert_eq!(f.close(), 2000);
        assert_eq!(f, FlowRx::new());
    }

    #[test]
    fn levels_measured_by_the_owner() {
        let (l, mut f) = (lim(), FlowRx::new());
        let s = f.set_level(500, &l, true, at(0));
        assert_eq!(s.signal, Some(Signal::Pause), "growth can pause");
        assert_eq!(f.set_level(500, &l, true, at(5)), Step::default());
        assert_eq!(f.deadline(&l), Some(at(10)), "same level: no progress");
        assert_eq!(
            f.set_level(50, &l, true, at(6)).signal,
            Some(Signal::Resume)
        );
        assert_eq!(f.deadline(&l), Some(at(16)));
        let _ = f.set_level(0, &l, true, at(7));
        assert_eq!(f.deadline(&l), None);
    }

    #[test]
    fn disabled_stuck_timeout_has_no_deadline() {
        let l = FlowLimits {
            stuck_timeout: Duration::MAX,
            ..lim()
        };
        let mut f = FlowRx::new();
        let _ = f.push(1, 1, &l, true, at(0));
        assert_eq!(f.deadline(&l), None);
        assert!(!f.is_stuck(&l, at(1 << 30)));
    }
}
