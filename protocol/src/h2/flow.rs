//! HTTP/2 flow-control windows (RFC 9113 §5.2, §6.9) and konn's
//! WINDOW_UPDATE policy, plus the BDP estimator that grows receive windows.
//!
//! ## Receive side
//! A [`RecvWindow`] tracks how many bytes the peer may still send
//! (`available`) and how many bytes the application has *released*
//! (consumed and passed on) but we have not yet announced. Credit goes back to
//! the peer only when the application releases data, never when it merely
//! arrives: the window therefore bounds how much of one peer's data konn
//! buffers. Announcements are batched: a WINDOW_UPDATE goes out once the
//! unannounced credit reaches a quarter of the target window (grpc-go uses the
//! same ratio), so a 4 MiB window costs one WINDOW_UPDATE per MiB.
//!
//! ## Send side
//! A [`SendWindow`] is the peer's credit for us. It is signed because a
//! SETTINGS_INITIAL_WINDOW_SIZE decrease can push a stream window below zero
//! (RFC 9113 §6.9.2); it may never exceed 2^31−1 (§6.9.1).
//!
//! ## BDP estimation
//! grpc-go starts at 64 KiB windows and grows them by measuring the
//! bandwidth-delay product with PINGs. [`Bdp`] does the same for konn's
//! receive windows when they are configured small: the first DATA after an
//! idle period starts a sample and sends a PING; bytes received until the ACK
//! form the sample; when a sample fills two thirds of the window and the
//! measured bandwidth is the best seen, the window doubles (up to a limit).

use std::time::{Duration, Instant};

/// Largest legal window (RFC 9113 §6.9.1).
pub(crate) const MAX_WINDOW: i64 = (1 << 31) - 1;

/// The window every stream and the connection start with before SETTINGS.
pub(crate) const DEFAULT_WINDOW: u32 = 65_535;

/// Our receive window towards the peer for one stream or the connection.
#[derive(Debug, Clone)]
pub(crate) struct RecvWindow {
    /// Bytes the peer may still send.
    available: i64,
    /// Released by the application, not yet announced.
    unannounced: i64,
    /// The window we keep open.
    target: i64,
}

impl RecvWindow {
    /// A window whose peer already believes it has `initial` bytes of credit
    /// and which we want to keep at `target` (the difference is announced by
    /// the first [`RecvWindow::release`] or by [`RecvWindow::take_growth`]).
    pub(crate) fn new(initial: u32, target: u32) -> Self {
        Self {
            available: i64::from(initial),
            unannounced: i64::from(target) - i64::from(initial),
            target: i64::from(target),
        }
    }

    /// The peer sent `n` flow-controlled bytes. `Err` if that exceeds the
    /// credit it had (a FLOW_CONTROL_ERROR).
    pub(crate) fn consume(&mut self, n: u32) -> Result<(), ()> {
        let n = i64::from(n);
        if n > self.available {
            return Err(());
        }
        self.available -= n;
        Ok(())
    }

    /// The application passed on `n` bytes. Returns the increment to announce
    /// in a WINDOW_UPDATE when enough credit has accumulated.
    pub(crate) fn release(&mut self, n: u32) -> Option<u32> {
        self.unannounced += i64::from(n);
        if self.unannounced > 0 && self.unannounced >= self.target / 4 {
            self.take_growth()
        } else {
            None
        }
    }

    /// Announce all pending credit now (used right after the preface and when
    /// the window grows). Returns the increment, if any.
    pub(crate) fn take_growth(&mut self) -> Option<u32> {
        if self.unannounced <= 0 {
            return None;
        }
        // Never promise more than the protocol allows in one window.
        let room = MAX_WINDOW - self.available;
        let inc = self.unannounced.min(room);
        if inc <= 0 {
            return None;
        }
        self.unannounced -= inc;
        self.available += inc;
        u32::try_from(inc).ok()
    }

    /// Raise the target window (BDP growth). The extra credit is announced by
    /// the next [`RecvWindow::take_growth`].
    pub(crate) fn grow_to(&mut self, target: u32) {
        let target = i64::from(target);
        if target > self.target {
            self.unannounced += target - self.target;
            self.target = target;
        }
    }

    /// The window size we keep open.
    pub(crate) fn target(&self) -> u32 {
        u32::try_from(self.target).unwrap_or(u32::MAX)
    }

    /// Bytes the peer may still send (invariant checks).
    pub(crate) fn available(&self) -> i64 {
        self.available
    }

    /// Credit the peer used that the application has not released yet:
    /// what the window is short of its target once everything released is
    /// announced (invariant checks).
    pub(crate) fn unreleased(&self) -> i64 {
        self.target - self.available - self.unannounced
    }
}

/// The peer's credit for our sending on one stream or the connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendWindow(i64);

impl SendWindow {
    /// A window starting at `initial`.
    pub(crate) fn new(initial: u32) -> Self {
        Self(i64::from(initial))
    }

    /// Bytes we may send now (0 when the window is empty or negative).
    pub(crate) fn available(self) -> usize {
        usize::try_from(self.0.max(0)).unwrap_or(usize::MAX)
    }

    /// We sent `n` bytes.
    pub(crate) fn spend(&mut self, n: usize) {
        self.0 -= i64::try_from(n).unwrap_or(i64::MAX);
    }

    /// The window as a signed number (invariant checks).
    pub(crate) fn value(self) -> i64 {
        self.0
    }

    /// WINDOW_UPDATE from the peer. `Err` when the window would exceed 2^31−1.
    pub(crate) fn increase(&mut self, inc: u32) -> Result<(), ()> {
        let next = self.0 + i64::from(inc);
        if next > MAX_WINDOW {
            return Err(());
        }
        self.0 = next;
        Ok(())
    }

    /// SETTINGS_INITIAL_WINDOW_SIZE changed by `delta`. `Err` on overflow.
    pub(crate) fn adjust(&mut self, delta: i64) -> Result<(), ()> {
        let next = self.0 + delta;
        if next > MAX_WINDOW {
            return Err(());
        }
        self.0 = next;
        Ok(())
    }
}

/// PING payload konn uses for BDP samples.
pub(crate) const BDP_PING: [u8; 8] = *b"konn-bdp";

/// Bandwidth-delay-product estimator (receive side).
#[derive(Debug, Clone)]
pub(crate) struct Bdp {
    limit: u32,
    sample: u64,
    sent_at: Option<Instant>,
    /// Best bandwidth seen, in bytes per second.
    best_bw: f64,
    /// Smoothed RTT.
    rtt: Option<Duration>,
}

impl Bdp {
    /// An estimator that grows windows up to `limit`.
    pub(crate) fn new(limit: u32) -> Self {
        Self {
            limit,
            sample: 0,
            sent_at: None,
            best_bw: 0.0,
            rtt: None,
        }
    }

    /// `n` bytes of DATA arrived. Returns true when a BDP PING must be sent
    /// now (a new sample starts).
    pub(crate) fn on_data(&mut self, now: Instant, n: usize) -> bool {
        let n = n as u64;
        if self.sent_at.is_none() {
            self.sent_at = Some(now);
            self.sample = n;
            true
        } else {
            self.sample += n;
            false
        }
    }

    /// The BDP PING was acknowledged. Returns the new window size when the
    /// current `window` should grow.
    pub(crate) fn on_ack(&mut self, now: Instant, window: u32) -> Option<u32> {
        let sent = self.sent_at.take()?;
        let rtt = now
            .saturating_duration_since(sent)
            .max(Duration::from_micros(1));
        self.rtt = Some(match self.rtt {
            // Smooth like grpc-go (α = 0.9 towards the old value).
            Some(old) => old.mul_f64(0.9) + rtt.mul_f64(0.1),
            None => rtt,
        });
        if window >= self.limit {
            return None;
        }
        let sample = self.sample;
        let bw = sample as f64 / self.rtt.unwrap_or(rtt).as_secs_f64();
        if (sample as f64) < f64::from(window) * 2.0 / 3.0 || bw < self.best_bw {
            self.best_bw = self.best_bw.max(bw);
            return None;
        }
        self.best_bw = bw;
        let grown = (sample.saturating_mul(2)).min(u64::from(self.limit));
        let grown = u32::try_from(grown).unwrap_or(self.limit);
        (grown > window).then_some(grown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recv_window_bounds_and_batches_updates() {
        let mut w = RecvWindow::new(DEFAULT_WINDOW, DEFAULT_WINDOW);
        assert!(w.consume(65_535).is_ok());
        assert!(
            w.consume(1).is_err(),
            "more than the credit is a FLOW_CONTROL_ERROR"
        );
        // Released below a quarter: nothing announced yet.
        assert_eq!(w.release(10_000), None);
        // Crossing a quarter announces everything pending.
        assert_eq!(w.release(10_000), Some(20_000));
        assert_eq!(w.available, 20_000);
    }

    #[test]
    fn recv_window_initial_growth_is_announced() {
        let mut w = RecvWindow::new(DEFAULT_WINDOW, 4 << 20);
        assert_eq!(w.take_growth(), Some((4 << 20) - 65_535));
        assert_eq!(w.available, 4 << 20);
        assert_eq!(w.take_growth(), None);
    }

    #[test]
    fn recv_window_never_exceeds_protocol_maximum() {
        let mut w = RecvWindow::new(DEFAULT_WINDOW, u32::MAX);
        let inc = w.take_growth().unwrap();
        assert_eq!(i64::from(inc) + 65_535, MAX_WINDOW);
    }

    #[test]
    fn send_window_overflow_and_negative() {
        let mut w = SendWindow::new(10);
        assert!(w.increase((MAX_WINDOW - 10) as u32).is_ok());
        assert!(w.increase(1).is_err());
        let mut w = SendWindow::new(100);
        w.spend(60);
        w.adjust(-65_525).unwrap();
        assert_eq!(
            w.available(),
            0,
            "a negative window (40 - 65525) allows nothing"
        );
        w.increase(65_535).unwrap();
        assert_eq!(w.available(), 50);
    }

    #[test]
    fn bdp_grows_when_samples_fill_the_window() {
        let t0 = crate::test_epoch();
        let mut b = Bdp::new(16 << 20);
        assert!(b.on_data(t0, 50_000));
        assert!(!b.on_data(t0, 10_000));
        let grown = b.on_ack(t0 + Duration::from_millis(1), 65_535);
        assert_eq!(grown, Some(120_000));
        // A small sample does not grow the window.
        assert!(b.on_data(t0, 100));
        assert_eq!(b.on_ack(t0 + Duration::from_millis(2), 120_000), None);
    }

    #[test]
    fn bdp_respects_limit() {
        let t0 = crate::test_epoch();
        let mut b = Bdp::new(100_000);
        b.on_data(t0, 90_000);
        assert_eq!(
            b.on_ack(t0 + Duration::from_millis(1), 65_535),
            Some(100_000)
        );
        b.on_data(t0, 90_000);
        assert_eq!(b.on_ack(t0 + Duration::from_millis(1), 100_000), None);
    }
}
