//! Pure statistics of the harness: latency histograms (hdrhistogram,
//! nanoseconds, 3 significant digits), the open-loop coordinated-omission
//! rule, and the arithmetic of repetitions (median, min–max, ratios paired
//! by repetition).

use hdrhistogram::Histogram;

/// Highest latency a histogram holds: 60 s in nanoseconds (larger values
/// are clamped to it).
pub const MAX_NS: u64 = 60_000_000_000;

/// A latency histogram in nanoseconds, 1 ns – 60 s, 3 significant digits.
#[derive(Clone, Debug)]
pub struct Lat(Histogram<u64>);

impl Default for Lat {
    fn default() -> Self {
        Self::new()
    }
}

impl Lat {
    /// An empty histogram.
    pub fn new() -> Self {
        // Valid bounds (low 1, high ≥ 2·low, 3 significant digits): cannot fail.
        Self(Histogram::new_with_bounds(1, MAX_NS, 3).expect("valid histogram bounds"))
    }

    /// Record one latency (clamped into 1 ns – 60 s).
    pub fn record_ns(&mut self, ns: u64) {
        self.0.saturating_record(ns.clamp(1, MAX_NS));
    }

    /// Record one latency.
    pub fn record(&mut self, d: std::time::Duration) {
        self.record_ns(u64::try_from(d.as_nanos()).unwrap_or(MAX_NS));
    }

    /// Add every value of `other` (histograms of several connections, or
    /// several repetitions).
    pub fn merge(&mut self, other: &Self) {
        // Same bounds on both sides; values beyond are clamped on record.
        let _ = self.0.add(&other.0);
    }

    /// Number of recorded values.
    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// The value at quantile `q` (0..=1) in microseconds; 0 when empty.
    pub fn quantile_us(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.value_at_quantile(q) as f64 / 1000.0
    }

    /// Largest value in microseconds.
    pub fn max_us(&self) -> f64 {
        self.0.max() as f64 / 1000.0
    }

    /// The standard summary: `(name, µs)` for p50, p90, p99, p99.9, max.
    pub fn summary(&self) -> [(&'static str, f64); 5] {
        [
            ("p50 µs", self.quantile_us(0.50)),
            ("p90 µs", self.quantile_us(0.90)),
            ("p99 µs", self.quantile_us(0.99)),
            ("p99.9 µs", self.quantile_us(0.999)),
            ("max µs", self.max_us()),
        ]
    }
}

/// Where an open-loop request's latency starts (all times in ns from one
/// origin). `intended` is the request's slot in the schedule, `sent` when
/// it actually went out, `prev_done` when the connection's previous
/// response arrived.
///
/// - If the connection was still busy at the intended time (the previous
///   response came late), the system delayed this request: count from the
///   intended time, as wrk2 does (coordinated-omission correction).
/// - If it was free, any gap between `intended` and `sent` is the load
///   generator's own timer (1 ms resolution), not the system's: count from
///   the actual send.
pub fn open_loop_start(intended: u64, sent: u64, prev_done: u64) -> u64 {
    if prev_done > intended { intended } else { sent }
}

/// Median of `v` (mean of the two middle values for an even count); `NaN`
/// when empty.
pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// `(median, min, max)` of `v`, ignoring `NaN`s; all `NaN` when empty.
pub fn spread(v: &[f64]) -> (f64, f64, f64) {
    let s: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
    if s.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let min = s.iter().copied().fold(f64::INFINITY, f64::min);
    let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (median(&s), min, max)
}

/// Ratios `a[i] / b[i]` of values measured in the same repetition (pairs
/// with a missing, zero or non-finite side are skipped).
pub fn paired_ratios(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.is_finite() && y.is_finite() && **y != 0.0)
        .map(|(x, y)| x / y)
        .collect()
}

/// Differences `a[i] - b[i]` of values of the same repetition (for
/// added latency: tunnel minus direct).
pub fn paired_diffs(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .map(|(x, y)| x - y)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_histograms_hold_both_sets() {
        let mut a = Lat::new();
        let mut b = Lat::new();
        for i in 1..=900u64 {
            a.record_ns(i * 1000);
        }
        for _ in 0..100 {
            b.record_ns(50_000_000);
        }
        a.merge(&b);
        assert_eq!(a.count(), 1000);
        let p50 = a.quantile_us(0.5);
        assert!((499.0..=502.0).contains(&p50), "{p50}");
        // The top 10 % are the slow ones.
        assert!((a.quantile_us(0.95) - 50_000.0).abs() < 50.0);
        assert!((a.max_us() - 50_000.0).abs() < 50.0);
    }

    #[test]
    fn out_of_range_values_are_clamped_not_lost() {
        let mut a = Lat::new();
        a.record_ns(0);
        a.record_ns(u64::MAX);
        a.record(std::time::Duration::from_secs(3600));
        assert_eq!(a.count(), 3);
        assert!(a.max_us() >= 59_000_000.0);
        assert_eq!(Lat::new().quantile_us(0.99), 0.0);
    }

    #[test]
    fn open_loop_counts_from_intent_only_when_the_system_was_late() {
        // Free at the slot, our timer fired 700 µs late: count from the send.
        assert_eq!(open_loop_start(1_000, 1_700, 900), 1_700);
        // Previous answer came at 5 000, after the slot: count from the slot.
        assert_eq!(open_loop_start(1_000, 5_000, 5_000), 1_000);
    }

    #[test]
    fn median_spread_and_pairs() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert_eq!(spread(&[5.0, f64::NAN, 1.0, 3.0]), (3.0, 1.0, 5.0));
        assert_eq!(
            paired_ratios(&[10.0, 9.0, 8.0], &[2.0, 0.0, 4.0]),
            vec![5.0, 2.0]
        );
        assert_eq!(paired_diffs(&[10.0, 9.0], &[2.5, f64::NAN]), vec![7.5]);
        // Pairing is by repetition, not by sorted order.
        assert_eq!(paired_ratios(&[1.0, 4.0], &[4.0, 1.0]), vec![0.25, 4.0]);
    }
}
