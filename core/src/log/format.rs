//! The klog line format.
//!
//! ```text
//! I1121 23:40:15.123456   12345 runtime.rs:123] message key="value" n=3
//! ^^^^^ ^^^^^^^^^^^^^^^ ^^^^^^^ ^^^^^^^^^^^^^^  ^^^^^^^ ^^^^^^^^^^^^^^^
//! |     local time      pid     file:line       text    fields (event, then spans)
//! severity, month, day  (width 7)
//! ```
//!
//! Field values: strings and errors are quoted Go-style (`key="a b"`);
//! numbers and booleans are bare; `Debug`/`Display` values are bare when
//! they contain no space, quote or `=`, quoted otherwise.

use std::cell::Cell;
use std::fmt::{self, Write as _};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};

use super::flags::Severity;
use crate::cli::go::quote_into;

/// Broken-down local time with microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub(crate) year: i32,
    pub(crate) month: u32,
    pub(crate) day: u32,
    pub(crate) hour: u32,
    pub(crate) minute: u32,
    pub(crate) second: u32,
    pub(crate) micros: u32,
}

impl Stamp {
    /// The current local time. Logging is one of the few places that reads
    /// the wall clock itself (the engine passes time in); it is never on the
    /// data path. The broken-down time is computed once per second per
    /// thread (`localtime_r` is most of a line's cost otherwise).
    #[allow(clippy::disallowed_methods)]
    pub(crate) fn now() -> Self {
        thread_local! {
            static LAST: Cell<Option<(i64, Stamp)>> = const { Cell::new(None) };
        }
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let secs = i64::try_from(since.as_secs()).unwrap_or(i64::MAX);
        let micros = since.subsec_micros();
        let cached = LAST.try_with(Cell::get).ok().flatten();
        match cached {
            Some((s, stamp)) if s == secs => Self { micros, ..stamp },
            _ => {
                let stamp = Self::local(secs, micros);
                let _ = LAST.try_with(|l| l.set(Some((secs, stamp))));
                stamp
            }
        }
    }

    /// `secs` since the epoch in the process's time zone (`TZ`,
    /// `/etc/localtime`), falling back to UTC.
    pub(crate) fn local(secs: i64, micros: u32) -> Self {
        local_time(secs).map_or_else(
            || Self::utc(secs, micros),
            |(year, month, day, hour, minute, second)| Self {
                year,
                month,
                day,
                hour,
                minute,
                second,
                micros,
            },
        )
    }

    /// `secs` since the epoch in UTC (civil-from-days, proleptic Gregorian).
    pub(crate) fn utc(secs: i64, micros: u32) -> Self {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        let small = |v: i64| u32::try_from(v).unwrap_or(0);
        Self {
            year: i32::try_from(year).unwrap_or(i32::MAX),
            month: small(month),
            day: small(day),
            hour: small(rem / 3600),
            minute: small(rem / 60 % 60),
            second: small(rem % 60),
            micros,
        }
    }
}

/// Appends `since_epoch` as RFC 3339 in UTC with microseconds
/// (`2026-11-25T02:48:33.123456Z`): the audit log's timestamps. By hand,
/// not with `format!`: it was a third of an audit record's cost.
pub fn push_rfc3339_utc(out: &mut String, since_epoch: std::time::Duration) {
    let secs = i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX);
    let s = Stamp::utc(secs, since_epoch.subsec_micros());
    push_padded(out, u64::try_from(s.year).unwrap_or(0), 4, b'0');
    for (sep, v) in [
        ('-', s.month),
        ('-', s.day),
        ('T', s.hour),
        (':', s.minute),
        (':', s.second),
    ] {
        out.push(sep);
        push_padded(out, u64::from(v), 2, b'0');
    }
    out.push('.');
    push_padded(out, u64::from(s.micros), 6, b'0');
    out.push('Z');
}

/// Appends `v` in decimal, zero-padded to at least `width` digits (no
/// `fmt` machinery).
pub fn push_u64(out: &mut String, v: u64, width: usize) {
    push_padded(out, v, width, b'0');
}

/// Appends `v` in decimal (no `fmt` machinery).
pub fn push_i64(out: &mut String, v: i64) {
    push_int(out, i128::from(v));
}

/// `localtime_r`: (year, month 1-12, day, hour, minute, second).
#[allow(unsafe_code)]
fn local_time(secs: i64) -> Option<(i32, u32, u32, u32, u32, u32)> {
    let t: libc::time_t = secs;
    // SAFETY: `libc::tm` is plain data (integers and, on glibc, a
    // `tm_zone` pointer that may be null); all-zero is a valid value and
    // `localtime_r` overwrites it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers refer to live locals for the duration of the
    // call; `localtime_r` is the re-entrant variant and keeps no pointer.
    let res = unsafe { libc::localtime_r(&raw const t, &raw mut tm) };
    if res.is_null() {
        return None;
    }
    let u = |v: libc::c_int| u32::try_from(v).ok();
    Some((
        tm.tm_year.checked_add(1900)?,
        u(tm.tm_mon)? + 1,
        u(tm.tm_mday)?,
        u(tm.tm_hour)?,
        u(tm.tm_min)?,
        u(tm.tm_sec)?.min(59),
    ))
}

/// Writes klog's header: `I1121 23:40:15.123456   12345 file.rs:123] `.
/// (By hand, not with `write!`: a line's header was a third of its cost;
/// the time is one `push_str` of digits formed in place, not nine padded
/// numbers.)
pub(crate) fn write_header(
    out: &mut String,
    severity: Severity,
    stamp: &Stamp,
    pid: u32,
    file: &str,
    line: u32,
) {
    let [m0, m1] = two_digits(stamp.month);
    let [d0, d1] = two_digits(stamp.day);
    let [h0, h1] = two_digits(stamp.hour);
    let [n0, n1] = two_digits(stamp.minute);
    let [s0, s1] = two_digits(stamp.second);
    let mut micros = [b'0'; 6];
    let mut v = stamp.micros.min(999_999);
    for d in micros.iter_mut().rev() {
        *d = b'0' + (v % 10) as u8;
        v /= 10;
    }
    let [u0, u1, u2, u3, u4, u5] = micros;
    let letter = u8::try_from(severity.letter()).unwrap_or(b'I');
    let head = [
        letter, m0, m1, d0, d1, b' ', h0, h1, b':', n0, n1, b':', s0, s1, b'.', u0, u1, u2, u3, u4,
        u5, b' ',
    ];
    out.push_str(std::str::from_utf8(&head).unwrap_or_default());
    push_padded(out, u64::from(pid), 7, b' ');
    out.push(' ');
    out.push_str(file);
    out.push(':');
    push_padded(out, u64::from(line), 1, b' ');
    out.push_str("] ");
}

/// The last two decimal digits of `v`, as ASCII.
fn two_digits(v: u32) -> [u8; 2] {
    [b'0' + (v / 10 % 10) as u8, b'0' + (v % 10) as u8]
}

/// A duration as Go's `time.Duration.String` writes it (`0s`, `870ns`,
/// `112.44µs`, `3.182266ms`, `1.5s`, `1m30s`, `1h0m0s`): klog lines show
/// durations that way. Formatted by hand into a stack buffer (`Duration`'s
/// `Debug` goes through `fmt`'s decimal machinery, a fifth of a dial's log
/// line), and nanoseconds beyond `u64` saturate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoDuration(pub std::time::Duration);

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut b = Backwards::default();
        let mut u = u64::try_from(self.0.as_nanos()).unwrap_or(u64::MAX);
        if u == 0 {
            return f.write_str("0s");
        }
        b.push(b's');
        if u < 1_000_000_000 {
            // Below a second: the largest unit that keeps a whole part.
            let prec = if u < 1_000 {
                b.push(b'n');
                0
            } else if u < 1_000_000 {
                b.push_str("µ");
                3
            } else {
                b.push(b'm');
                6
            };
            u = b.fraction(u, prec);
            b.integer(u);
        } else {
            u = b.fraction(u, 9);
            b.integer(u % 60);
            u /= 60;
            if u > 0 {
                b.push(b'm');
                b.integer(u % 60);
                u /= 60;
                if u > 0 {
                    b.push(b'h');
                    b.integer(u);
                }
            }
        }
        f.write_str(b.as_str())
    }
}

/// A small text built from its end (Go's duration formatting writes
/// that way). 32 bytes hold the longest duration (`5124095h34m33.709551615s`).
struct Backwards {
    buf: [u8; 32],
    start: usize,
}

impl Default for Backwards {
    fn default() -> Self {
        Self {
            buf: [0; 32],
            start: 32,
        }
    }
}

impl Backwards {
    fn push(&mut self, b: u8) {
        if let Some(i) = self.start.checked_sub(1)
            && let Some(slot) = self.buf.get_mut(i)
        {
            *slot = b;
            self.start = i;
        }
    }

    fn push_str(&mut self, s: &str) {
        for &b in s.as_bytes().iter().rev() {
            self.push(b);
        }
    }

    /// The `prec` lowest decimal digits of `v` as a fraction without its
    /// trailing zeros (nothing, not even the point, when they are all
    /// zero); returns `v` without them.
    fn fraction(&mut self, mut v: u64, prec: u32) -> u64 {
        let mut print = false;
        for _ in 0..prec {
            let digit = (v % 10) as u8;
            print |= digit != 0;
            if print {
                self.push(b'0' + digit);
            }
            v /= 10;
        }
        if print {
            self.push(b'.');
        }
        v
    }

    fn integer(&mut self, mut v: u64) {
        loop {
            self.push(b'0' + (v % 10) as u8);
            v /= 10;
            if v == 0 {
                break;
            }
        }
    }

    fn as_str(&self) -> &str {
        // Only whole UTF-8 sequences are pushed, and never past the start.
        self.buf
            .get(self.start..)
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or("?")
    }
}

/// Appends `v` in decimal, left-padded with `pad` to `width` characters
/// (at most 24; an ASCII `pad`). One `push_str` of digits formed in a
/// stack buffer: pushing them one `char` at a time was most of an audit
/// record's cost.
#[allow(unsafe_code)]
fn push_padded(out: &mut String, v: u64, width: usize, pad: u8) {
    let mut buf = [if pad.is_ascii() { pad } else { b' ' }; 24];
    let mut n = v;
    let mut i = buf.len();
    // Bounded: u64 has at most 20 digits.
    while i > 0 {
        i -= 1;
        if let Some(d) = buf.get_mut(i) {
            *d = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let start = i.min(buf.len().saturating_sub(width));
    let text = buf.get(start..).unwrap_or_default();
    // SAFETY: `text` holds ASCII digits and an ASCII pad (checked above),
    // so it is valid UTF-8. (`from_utf8` validated it again for as much as
    // the whole formatting cost.)
    out.push_str(unsafe { std::str::from_utf8_unchecked(text) });
}

/// Appends a signed integer in decimal.
fn push_int(out: &mut String, v: i128) {
    if v < 0 {
        out.push('-');
    }
    let m = v.unsigned_abs();
    match u64::try_from(m) {
        Ok(m) => push_padded(out, m, 1, b' '),
        Err(_) => {
            let _ = write!(out, "{m}");
        }
    }
}

/// The file name klog shows: the base name, or the whole path with
/// `--add-dir-header`. Events without a location show `???:1` as in klog.
pub(crate) fn display_file(file: Option<&str>, add_dir: bool) -> &str {
    match file {
        None => "???",
        Some(f) if add_dir => f,
        Some(f) => f.rsplit(['/', '\\']).next().unwrap_or(f),
    }
}

/// Collects an event's or span's fields in klog's `key=value` style. The
/// `message` field is kept apart so it can go first. Events reuse one per
/// thread (see [`FieldWriter::with`]), so a line costs no allocation.
#[derive(Default)]
pub(crate) struct FieldWriter {
    pub(crate) message: String,
    pub(crate) fields: String,
    /// A `Debug` value being formatted.
    scratch: String,
    /// The finished line.
    pub(crate) line: String,
}

impl FieldWriter {
    /// Runs `f` with this thread's writer, emptied (a fresh one when the
    /// thread's is in use further up the stack, e.g. a `Debug` impl that
    /// logs).
    pub(crate) fn with<R>(f: impl FnOnce(&mut Self) -> R) -> R {
        thread_local! {
            static WRITER: std::cell::RefCell<FieldWriter> =
                std::cell::RefCell::new(FieldWriter::default());
        }
        // Free: not in use further up, and not torn down (thread exit).
        let free = WRITER
            .try_with(|w| w.try_borrow_mut().is_ok())
            .unwrap_or(false);
        if free {
            WRITER.with(|w| {
                let mut w = w.borrow_mut();
                w.clear();
                f(&mut w)
            })
        } else {
            f(&mut Self::default())
        }
    }

    fn clear(&mut self) {
        // Keep the buffers, but not a huge one from a rare long line.
        for s in [
            &mut self.message,
            &mut self.fields,
            &mut self.scratch,
            &mut self.line,
        ] {
            s.clear();
            if s.capacity() > 16 * 1024 {
                *s = String::new();
            }
        }
    }

    fn push_key(&mut self, field: &Field) {
        if !self.fields.is_empty() {
            self.fields.push(' ');
        }
        self.fields.push_str(field.name());
        self.fields.push('=');
    }

    fn push_text(&mut self, field: &Field, text: &str, always_quote: bool) {
        if field.name() == "message" {
            self.message.push_str(text);
            return;
        }
        self.push_key(field);
        let already_quoted = text.len() >= 2 && text.starts_with('"') && text.ends_with('"');
        if !always_quote && (already_quoted || is_bare(text)) {
            self.fields.push_str(text);
        } else {
            quote_into(&mut self.fields, text);
        }
    }

    fn push_bare(&mut self, field: &Field, value: impl fmt::Display) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value}");
            return;
        }
        self.push_key(field);
        let _ = write!(self.fields, "{value}");
    }

    fn push_integer(&mut self, field: &Field, value: i128) {
        if field.name() == "message" {
            push_int(&mut self.message, value);
            return;
        }
        self.push_key(field);
        push_int(&mut self.fields, value);
    }
}

/// A value that needs no quotes: non-empty, no whitespace, quote, `=` or
/// control character.
fn is_bare(text: &str) -> bool {
    if text.is_ascii() {
        return !text.is_empty()
            && text
                .bytes()
                .all(|b| b > b' ' && b != 0x7f && b != b'"' && b != b'=');
    }
    !text.is_empty()
        && !text
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '=')
}

impl Visit for FieldWriter {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let mut text = std::mem::take(&mut self.scratch);
        text.clear();
        let _ = write!(text, "{value:?}");
        self.push_text(field, &text, false);
        self.scratch = text;
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.push_text(field, value, true);
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let mut text = std::mem::take(&mut self.scratch);
        text.clear();
        let _ = write!(text, "{value}");
        self.push_text(field, &text, true);
        self.scratch = text;
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.push_integer(field, i128::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.push_integer(field, i128::from(value));
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        self.push_integer(field, value);
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        self.push_bare(field, value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push_bare(field, value);
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.push_bare(field, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_in_utc() {
        let rfc3339 = |d| {
            let mut s = String::new();
            push_rfc3339_utc(&mut s, d);
            s
        };
        let d = std::time::Duration::new(1_795_000_000, 123_456_789);
        assert_eq!(rfc3339(d), "2026-11-18T11:06:40.123456Z");
        assert_eq!(
            rfc3339(std::time::Duration::ZERO),
            "1970-01-01T00:00:00.000000Z"
        );
        // Years of four digits and more are written as they are.
        assert_eq!(
            rfc3339(std::time::Duration::from_secs(253_402_300_800)),
            "10000-01-01T00:00:00.000000Z"
        );
    }

    #[test]
    fn decimal_integers() {
        let mut s = String::new();
        for v in [0, 7, 10, 1234, i64::MAX, i64::MIN, -5] {
            push_i64(&mut s, v);
            s.push(' ');
        }
        push_u64(&mut s, u64::MAX, 1);
        s.push(' ');
        push_u64(&mut s, 42, 6);
        assert_eq!(
            s,
            format!(
                "0 7 10 1234 {} {} -5 {} 000042",
                i64::MAX,
                i64::MIN,
                u64::MAX
            )
        );
    }

    #[test]
    fn header_like_klog() {
        let stamp = Stamp {
            year: 2026,
            month: 11,
            day: 22,
            hour: 0,
            minute: 33,
            second: 54,
            micros: 272_321,
        };
        let mut s = String::new();
        write_header(&mut s, Severity::ERROR, &stamp, 944, "main.go", 31);
        // A line printed by upstream proxy-agent v0.36.0.
        assert_eq!(s, "E1122 00:33:54.272321     944 main.go:31] ");
        let mut s = String::new();
        write_header(
            &mut s,
            Severity::INFO,
            &Stamp { micros: 5, ..stamp },
            4_194_304,
            "a.rs",
            1,
        );
        assert_eq!(s, "I1122 00:33:54.000005 4194304 a.rs:1] ");
    }

    #[test]
    fn durations_like_go() {
        use std::time::Duration;
        let go = |d: Duration| GoDuration(d).to_string();
        // Go's own `time.Duration.String` cases, and a few of klog's lines.
        for (d, want) in [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(1), "1ns"),
            (Duration::from_nanos(999), "999ns"),
            (Duration::from_nanos(1_100), "1.1µs"),
            (Duration::from_nanos(112_440), "112.44µs"),
            (Duration::from_micros(2_200), "2.2ms"),
            (Duration::from_nanos(3_182_266), "3.182266ms"),
            (Duration::from_nanos(70_238_271), "70.238271ms"),
            (Duration::from_millis(3_300), "3.3s"),
            (Duration::from_secs(4 * 60 + 5), "4m5s"),
            (Duration::from_millis(245_001), "4m5.001s"),
            (Duration::from_millis(18_367_001), "5h6m7.001s"),
            (Duration::new(8 * 60, 1), "8m0.000000001s"),
            (Duration::from_secs(3_600), "1h0m0s"),
            (Duration::from_secs(60), "1m0s"),
            (
                Duration::from_nanos(i64::MAX as u64),
                "2562047h47m16.854775807s",
            ),
            (Duration::from_nanos(u64::MAX), "5124095h34m33.709551615s"),
            (Duration::MAX, "5124095h34m33.709551615s"),
        ] {
            assert_eq!(go(d), want, "{d:?}");
        }
    }

    #[test]
    fn utc_conversion() {
        let s = Stamp::utc(0, 0);
        assert_eq!(
            (s.year, s.month, s.day, s.hour, s.minute, s.second),
            (1970, 1, 1, 0, 0, 0)
        );
        // 2026-11-21 23:40:15 UTC
        let s = Stamp::utc(1_795_304_415, 123_456);
        assert_eq!(
            (s.year, s.month, s.day, s.hour, s.minute, s.second, s.micros),
            (2026, 11, 21, 23, 40, 15, 123_456)
        );
        // Leap day.
        let s = Stamp::utc(951_782_400, 0);
        assert_eq!((s.year, s.month, s.day), (2000, 2, 29));
    }

    #[test]
    fn local_time_is_sane() {
        let s = Stamp::now();
        assert!(s.year >= 2024);
        assert!((1..=12).contains(&s.month) && (1..=31).contains(&s.day));
        assert!(s.hour < 24 && s.minute < 60 && s.second < 60 && s.micros < 1_000_000);
    }

    #[test]
    fn file_display() {
        assert_eq!(
            display_file(Some("core/src/io/runtime.rs"), false),
            "runtime.rs"
        );
        assert_eq!(
            display_file(Some("core/src/io/runtime.rs"), true),
            "core/src/io/runtime.rs"
        );
        assert_eq!(display_file(None, false), "???");
    }

    #[test]
    fn bare_values() {
        assert!(is_bare("10.0.0.1:443"));
        assert!(!is_bare(""));
        assert!(!is_bare("a b"));
        assert!(!is_bare("a=b"));
        assert!(!is_bare("a\"b"));
        assert!(!is_bare("a\nb"));
    }
}
