//! client-go's client-side rate limit (`flowcontrol.NewTokenBucketRateLimiter`,
//! `--kubeconfig-qps` / `--kubeconfig-burst`): a bucket of `burst` tokens
//! refilled at `qps` per second; a call takes one token and waits for it if
//! the bucket is empty. As `rate.Limiter.Wait`, a call that would have to
//! wait past its deadline does not wait at all and takes no token.
//!
//! Defaults as client-go's `rest.Config`: QPS 0 means 5, burst 0 means 10;
//! a negative QPS means no limit. One limiter is shared by every call of a
//! process (TokenReview and Leases), as client-go shares one per clientset.

use std::fmt;
use std::time::{Duration, Instant};

/// client-go's `DefaultQPS`.
pub const DEFAULT_QPS: f32 = 5.0;
/// client-go's `DefaultBurst`.
pub const DEFAULT_BURST: i64 = 10;

/// The token bucket (time passed in, for tests).
#[derive(Debug, Clone)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket; `None` when `qps` asks for no limit.
    pub fn new(qps: f32, burst: i64) -> Option<Self> {
        let qps = if qps == 0.0 { DEFAULT_QPS } else { qps };
        if qps < 0.0 || !qps.is_finite() {
            return None;
        }
        let burst = if burst <= 0 { DEFAULT_BURST } else { burst };
        let burst = burst as f64;
        Some(Self {
            qps: f64::from(qps),
            burst,
            tokens: burst,
            last: None,
        })
    }

    /// (QPS, burst) in effect.
    pub fn rate(&self) -> (f64, f64) {
        (self.qps, self.burst)
    }

    fn refill(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let dt = now.saturating_duration_since(last).as_secs_f64();
            self.tokens = (self.tokens + dt * self.qps).min(self.burst);
        }
        self.last = Some(now.max(self.last.unwrap_or(now)));
    }

    /// Take a token at `now`: how long to wait before the call may go, or
    /// `None` (nothing taken) if that is longer than `max_wait`.
    pub fn reserve(&mut self, now: Instant, max_wait: Duration) -> Option<Duration> {
        self.refill(now);
        let after = self.tokens - 1.0;
        let wait = if after >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-after / self.qps)
        };
        if wait > max_wait {
            return None;
        }
        self.tokens = after;
        Some(wait)
    }
}

/// The shared, thread-safe limiter (see the module docs).
pub struct Limiter {
    bucket: Option<tokio::sync::Mutex<TokenBucket>>,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("limited", &self.bucket.is_some())
            .finish()
    }
}

/// The wait would pass the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WouldExceedDeadline;

impl Limiter {
    /// A limiter with client-go's semantics for `qps` and `burst`.
    pub fn new(qps: f32, burst: i64) -> Self {
        Self {
            bucket: TokenBucket::new(qps, burst).map(tokio::sync::Mutex::new),
        }
    }

    /// Wait for a token, at most until `deadline`.
    ///
    /// # Errors
    ///
    /// The wait would pass `deadline` (nothing was taken).
    pub async fn acquire(&self, deadline: tokio::time::Instant) -> Result<(), WouldExceedDeadline> {
        let Some(bucket) = &self.bucket else {
            return Ok(());
        };
        let now = tokio::time::Instant::now();
        let max_wait = deadline.saturating_duration_since(now);
        let wait = bucket
            .lock()
            .await
            .reserve(now.into_std(), max_wait)
            .ok_or(WouldExceedDeadline)?;
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // a base instant for pure arithmetic
    fn burst_then_qps_and_deadlines_take_nothing() {
        let base = Instant::now();
        let mut b = TokenBucket::new(0.0, 0).unwrap();
        assert_eq!(b.rate(), (5.0, 10.0), "client-go's defaults");
        let long = Duration::from_secs(60);
        for _ in 0..10 {
            assert_eq!(b.reserve(base, long), Some(Duration::ZERO));
        }
        // The 11th waits 1/5 s, the 12th 2/5 s.
        assert_eq!(b.reserve(base, long), Some(Duration::from_millis(200)));
        assert_eq!(b.reserve(base, long), Some(Duration::from_millis(400)));
        // Too long for the deadline: refused, and nothing was taken.
        assert_eq!(b.reserve(base, Duration::from_millis(500)), None);
        assert_eq!(
            b.reserve(base, Duration::from_millis(600)),
            Some(Duration::from_millis(600))
        );
        // A second later 5 more tokens exist and 3 were owed: 2 are left.
        assert_eq!(b.reserve(at(base, 1000), long), Some(Duration::ZERO));
        assert_eq!(b.reserve(at(base, 1000), long), Some(Duration::ZERO));
        assert_eq!(
            b.reserve(at(base, 1000), long),
            Some(Duration::from_millis(200))
        );
        // Refill never exceeds the burst.
        let mut c = TokenBucket::new(100.0, 2).unwrap();
        assert_eq!(c.reserve(base, long), Some(Duration::ZERO));
        assert_eq!(c.reserve(at(base, 60_000), long), Some(Duration::ZERO));
        assert_eq!(c.reserve(at(base, 60_000), long), Some(Duration::ZERO));
        assert_eq!(
            c.reserve(at(base, 60_000), long),
            Some(Duration::from_millis(10))
        );
    }

    #[test]
    fn negative_qps_is_unlimited() {
        assert!(TokenBucket::new(-1.0, 0).is_none());
        assert!(format!("{:?}", Limiter::new(-1.0, 0)).contains("false"));
    }
}
