//! Abuse limits of the HTTP/2 connection and the token bucket behind the
//! rate-based ones.
//!
//! Every limit answers one attack from reliability-security.md §1.3:
//!
//! | limit | attack |
//! |---|---|
//! | `max_pending_control` | SETTINGS / PING floods (CVE-2019-9512/9515): reading stops while this many control replies wait to be written |
//! | `max_empty_frames` | empty DATA/HEADERS/CONTINUATION floods (CVE-2019-9518) |
//! | `remote_resets` | Rapid Reset (CVE-2023-44487) |
//! | `local_resets` | MadeYouReset (CVE-2025-8671): resets the peer provokes us to send |
//! | `max_continuation_frames`, `max_header_block` | CONTINUATION flood (CVE-2023-45288) |
//!
//! Exceeding a limit ends the connection with GOAWAY `ENHANCE_YOUR_CALM`.

use std::time::{Duration, Instant};

/// Limits of one connection. The defaults follow hyperium/h2 and grpc-go
/// where those have public values, and are documented in docs/design/h2.md.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Control frames (SETTINGS ACK, PING ACK, RST_STREAM, WINDOW_UPDATE)
    /// waiting to be written before the connection stops reading. grpc-go: 100.
    pub max_pending_control: usize,
    /// Consecutive empty frames without END_STREAM/END_HEADERS. h2: 100.
    pub max_empty_frames: u32,
    /// Peer resets of streams we were still working on: burst and refill per second.
    pub remote_resets: (u32, u32),
    /// Stream errors we send because of the peer's frames: burst and refill per second.
    pub local_resets: (u32, u32),
    /// CONTINUATION frames in one header block.
    pub max_continuation_frames: u32,
    /// Bytes of one encoded header block (HEADERS plus CONTINUATIONs).
    pub max_header_block: usize,
    /// Recently closed stream ids remembered for late frames.
    pub closed_streams_remembered: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_pending_control: 100,
            max_empty_frames: 100,
            remote_resets: (200, 50),
            local_resets: (1024, 100),
            max_continuation_frames: 16,
            max_header_block: 128 * 1024,
            closed_streams_remembered: 64,
        }
    }
}

/// A token bucket: `capacity` tokens, refilled at `per_sec` tokens/second.
#[derive(Clone, Debug)]
pub(crate) struct TokenBucket {
    capacity: u64,
    per_sec: u64,
    /// Tokens scaled by 1e9 (token-nanoseconds) to refill with integers.
    nanos: u64,
    last: Option<Instant>,
}

impl TokenBucket {
    pub(crate) fn new((capacity, per_sec): (u32, u32)) -> Self {
        Self {
            capacity: u64::from(capacity),
            per_sec: u64::from(per_sec),
            nanos: u64::from(capacity) * 1_000_000_000,
            last: None,
        }
    }

    /// Take one token at `now`; false when the bucket is empty.
    pub(crate) fn take(&mut self, now: Instant) -> bool {
        if let Some(last) = self.last {
            let elapsed = now
                .saturating_duration_since(last)
                .min(Duration::from_secs(3600));
            let refill = u64::try_from(elapsed.as_nanos())
                .unwrap_or(u64::MAX)
                .saturating_mul(self.per_sec);
            self.nanos = self
                .nanos
                .saturating_add(refill)
                .min(self.capacity * 1_000_000_000);
        }
        self.last = Some(now);
        if self.nanos >= 1_000_000_000 {
            self.nanos -= 1_000_000_000;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_burst_then_refills() {
        let t0 = crate::test_epoch();
        let mut b = TokenBucket::new((3, 10));
        assert!(b.take(t0) && b.take(t0) && b.take(t0));
        assert!(!b.take(t0), "burst exhausted");
        assert!(
            b.take(t0 + Duration::from_millis(100)),
            "one token per 100 ms"
        );
        assert!(!b.take(t0 + Duration::from_millis(100)));
        // A long pause refills only up to capacity.
        let later = t0 + Duration::from_secs(60);
        assert!(b.take(later) && b.take(later) && b.take(later));
        assert!(!b.take(later));
    }
}
