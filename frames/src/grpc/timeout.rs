//! The `grpc-timeout` request header: 1 to 8 ASCII digits followed by a unit
//! (`H` hours, `M` minutes, `S` seconds, `m` milliseconds, `u`
//! microseconds, `n` nanoseconds).
//!
//! Parsing is strict about the syntax (no sign, no spaces, at most 8
//! digits) but, like grpc-go, accepts a value of 0, which grpc-go itself
//! sends (`0n`) for a deadline that has already passed. Encoding follows
//! grpc-go: the finest unit whose value fits in 8 digits, rounding *up* so
//! the peer never sees a shorter deadline than ours.

use core::time::Duration;

use bytes::BufMut;

use crate::Error;

/// The largest value `grpc-timeout` can carry (8 digits).
pub const MAX_TIMEOUT_VALUE: u64 = 99_999_999;

/// Units from finest to coarsest, with their length in nanoseconds.
const UNITS: [(u8, u64); 6] = [
    (b'n', 1),
    (b'u', 1_000),
    (b'm', 1_000_000),
    (b'S', 1_000_000_000),
    (b'M', 60 * 1_000_000_000),
    (b'H', 3600 * 1_000_000_000),
];

/// Parses a `grpc-timeout` value.
///
/// # Errors
/// [`GrpcInvalidTimeout`](Error::GrpcInvalidTimeout) unless the value is 1
/// to 8 ASCII digits followed by one of `H M S m u n`.
pub fn parse_timeout(value: &[u8]) -> Result<Duration, Error> {
    let Some((&unit, digits)) = value.split_last() else {
        return Err(Error::GrpcInvalidTimeout);
    };
    if digits.is_empty() || digits.len() > 8 {
        return Err(Error::GrpcInvalidTimeout);
    }
    let mut n: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(Error::GrpcInvalidTimeout);
        }
        // At most 8 digits: n stays below 10^8, no overflow possible.
        n = n * 10 + u64::from(d - b'0');
    }
    // 99_999_999 hours is about 3.6e11 seconds: all products fit in u64.
    Ok(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return Err(Error::GrpcInvalidTimeout),
    })
}

/// Writes `timeout` as a `grpc-timeout` value, choosing like grpc-go the
/// finest unit in which the value (rounded up) fits in 8 digits.
///
/// A zero duration is written `0n`; a duration above 99 999 999 hours is
/// clamped to `99999999H`.
pub fn encode_timeout(timeout: Duration, dst: &mut impl BufMut) {
    let nanos = timeout.as_nanos();
    for (unit, unit_nanos) in UNITS {
        let value = nanos.div_ceil(u128::from(unit_nanos));
        if value <= u128::from(MAX_TIMEOUT_VALUE) {
            // value ≤ MAX_TIMEOUT_VALUE, so it fits in u64.
            super::put_decimal(u64::try_from(value).unwrap_or(MAX_TIMEOUT_VALUE), dst);
            dst.put_u8(unit);
            return;
        }
    }
    super::put_decimal(MAX_TIMEOUT_VALUE, dst);
    dst.put_u8(b'H');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn enc(d: Duration) -> String {
        let mut v = Vec::new();
        encode_timeout(d, &mut v);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn parses_every_unit() {
        let cases: [(&[u8], Duration); 8] = [
            (b"1H", Duration::from_secs(3600)),
            (b"2M", Duration::from_secs(120)),
            (b"30S", Duration::from_secs(30)),
            (b"100m", Duration::from_millis(100)),
            (b"7u", Duration::from_micros(7)),
            (b"99999999n", Duration::from_nanos(99_999_999)),
            (b"0n", Duration::ZERO),
            (b"00000001S", Duration::from_secs(1)),
        ];
        for (s, d) in cases {
            assert_eq!(parse_timeout(s), Ok(d), "{}", String::from_utf8_lossy(s));
        }
        assert_eq!(
            parse_timeout(b"99999999H"),
            Ok(Duration::from_secs(99_999_999 * 3600))
        );
    }

    #[test]
    fn rejects_malformed() {
        let bad: [&[u8]; 12] = [
            b"",
            b"S",
            b"1",
            b"123456789S",
            b"1s",
            b"1h",
            b"-1S",
            b"+1S",
            b" 1S",
            b"1 S",
            b"1.5S",
            b"1SS",
        ];
        for s in bad {
            assert_eq!(
                parse_timeout(s),
                Err(Error::GrpcInvalidTimeout),
                "{}",
                String::from_utf8_lossy(s)
            );
        }
    }

    #[test]
    fn encodes_like_grpc_go() {
        assert_eq!(enc(Duration::ZERO), "0n");
        assert_eq!(enc(Duration::from_nanos(1)), "1n");
        assert_eq!(enc(Duration::from_nanos(99_999_999)), "99999999n");
        // 100 ms no longer fits in nanoseconds: 100000u.
        assert_eq!(enc(Duration::from_millis(100)), "100000u");
        // Rounded up, never down.
        assert_eq!(enc(Duration::from_nanos(100_000_001)), "100001u");
        assert_eq!(enc(Duration::from_secs(30)), "30000000u");
        assert_eq!(enc(Duration::from_secs(100)), "100000m");
        assert_eq!(enc(Duration::from_secs(100_000)), "100000S");
        assert_eq!(enc(Duration::from_secs(100_000_000)), "1666667M");
        assert_eq!(enc(Duration::from_secs(6_000_000_000)), "1666667H");
        assert_eq!(enc(Duration::MAX), "99999999H");
    }

    proptest! {
        #[test]
        fn encode_then_parse_is_within_one_unit(secs in 0u64..400_000_000_000, nanos in 0u32..1_000_000_000) {
            let d = Duration::new(secs, nanos);
            let mut v = Vec::new();
            encode_timeout(d, &mut v);
            let back = parse_timeout(&v).unwrap();
            let unit = UNITS.iter().find(|u| u.0 == *v.last().unwrap()).unwrap().1;
            let max = Duration::from_secs(MAX_TIMEOUT_VALUE * 3600);
            if d <= max {
                prop_assert!(back >= d, "rounded down: {d:?} -> {back:?}");
                prop_assert!(back - d < Duration::from_nanos(unit), "{d:?} -> {back:?}");
            } else {
                prop_assert_eq!(back, max);
            }
        }

        #[test]
        fn parse_then_encode_keeps_the_duration(n in 0u64..=MAX_TIMEOUT_VALUE, u in 0usize..6) {
            let (unit, _) = UNITS[u];
            let text = format!("{n}{}", unit as char);
            let d = parse_timeout(text.as_bytes()).unwrap();
            let mut v = Vec::new();
            encode_timeout(d, &mut v);
            prop_assert_eq!(parse_timeout(&v).unwrap(), d);
        }
    }
}
