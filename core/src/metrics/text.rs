//! The pieces of the Prometheus text exposition format (version 0.0.4) that
//! must come out byte for byte as Go's `client_golang` writes them.
//!
//! Upstream serves its metrics with `promhttp.Handler()`, which renders
//! through `prometheus/common/expfmt`. Dashboards and the upstream test
//! suites compare that text literally, so konn reproduces its details:
//!
//! - **Numbers** are Go's `strconv.FormatFloat(v, 'g', -1, 64)`, with `0`,
//!   `1`, `-1`, `NaN`, `+Inf` and `-Inf` spelled out: the shortest digits
//!   that read back to the same `f64`, in plain notation when the decimal
//!   exponent is from -4 to 5 and as `d.ddde±XX` (at least two exponent
//!   digits) otherwise. So `12345678` prints as `1.2345678e+07` and `1e-05`
//!   as `1e-05`. Rust's `{:e}` produces the same shortest digits (both
//!   languages pick the shortest round-trip string closest to the value);
//!   [`write_f64`] only re-lays them out.
//! - **HELP text** escapes `\` and newline; **label values** also escape `"`.
//! - **Content type**: `text/plain; version=0.0.4; charset=utf-8;
//!   escaping=underscores`, where the `escaping` parameter echoes the one a
//!   scraper asked for in `Accept` (see [`negotiate_content_type`]).

use std::fmt::Write as _;

/// The content type of the text format without its `escaping` parameter
/// (`expfmt.FmtText`).
pub const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The `escaping` value `client_golang` uses when the scraper names none
/// (`model.NameEscapingScheme`, underscore escaping).
pub const DEFAULT_ESCAPING: &str = "underscores";

/// Appends `v` as Go's text format writes a sample value or an `le` bound.
pub fn write_f64(out: &mut Vec<u8>, v: f64) {
    if v == 0.0 {
        // Also -0.0: Go compares with `f == 0`.
        out.push(b'0');
    } else if v == 1.0 {
        out.push(b'1');
    } else if v == -1.0 {
        out.extend_from_slice(b"-1");
    } else if v.is_nan() {
        out.extend_from_slice(b"NaN");
    } else if v == f64::INFINITY {
        out.extend_from_slice(b"+Inf");
    } else if v == f64::NEG_INFINITY {
        out.extend_from_slice(b"-Inf");
    } else {
        write_finite(out, v);
    }
}

/// `v` formatted by [`write_f64`], as a `String` (tests, labels).
pub fn format_f64(v: f64) -> String {
    let mut out = Vec::with_capacity(24);
    write_f64(&mut out, v);
    // Only ASCII is ever written.
    String::from_utf8(out).unwrap_or_default()
}

/// Shortest round-trip digits of a finite, non-zero `v`, laid out like Go's
/// `%g` with precision -1.
fn write_finite(out: &mut Vec<u8>, v: f64) {
    let mut sci = StackStr::new();
    // `{:e}` is the shortest representation: `-1.2345e-7`, `5e0`, ...
    let _ = write!(sci, "{v:e}");
    let s = sci.as_bytes();
    let (negative, s) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    let Some(e_pos) = s.iter().position(|&b| b == b'e') else {
        return;
    };
    let (mantissa, exp_part) = s.split_at(e_pos);
    let exp: i32 = std::str::from_utf8(exp_part.get(1..).unwrap_or_default())
        .ok()
        .and_then(|e| e.parse().ok())
        .unwrap_or(0);
    let mut digits = StackStr::new();
    for &b in mantissa.iter().filter(|b| b.is_ascii_digit()) {
        digits.push(b);
    }
    let exp = break_tie_to_even(v.abs(), &mut digits, exp);
    let digits = digits.as_bytes();
    if negative {
        out.push(b'-');
    }
    if !(-4..6).contains(&exp) {
        // d.ddde±XX
        if let Some((first, rest)) = digits.split_first() {
            out.push(*first);
            if !rest.is_empty() {
                out.push(b'.');
                out.extend_from_slice(rest);
            }
        }
        out.push(b'e');
        out.push(if exp < 0 { b'-' } else { b'+' });
        let abs = exp.unsigned_abs();
        if abs < 10 {
            out.push(b'0');
        }
        let mut num = StackStr::new();
        let _ = write!(num, "{abs}");
        out.extend_from_slice(num.as_bytes());
    } else if exp < 0 {
        // 0.000ddd
        out.extend_from_slice(b"0.");
        for _ in 0..(-exp - 1) {
            out.push(b'0');
        }
        out.extend_from_slice(digits);
    } else {
        // ddd[.ddd], padding with zeros when the digits end before the point.
        let int_len = usize::try_from(exp).unwrap_or(0) + 1;
        if digits.len() <= int_len {
            out.extend_from_slice(digits);
            out.extend(std::iter::repeat_n(b'0', int_len - digits.len()));
        } else {
            let (int, frac) = digits.split_at(int_len);
            out.extend_from_slice(int);
            out.push(b'.');
            out.extend_from_slice(frac);
        }
    }
}

/// Applies Go's tie rule to Rust's shortest digits.
///
/// Both languages print the shortest digit string that reads back as `v`,
/// and when two such strings are equally short they pick the one closer to
/// `v`. They differ only when `v` lies exactly halfway between two
/// candidates: Rust rounds the last digit up, Go (Ryu) to even. A halfway
/// value's exact decimal expansion ends right after the candidates' last
/// digit with a 5, which the checks below detect with exact formatting.
fn break_tie_to_even(v: f64, digits: &mut StackStr, exp: i32) -> i32 {
    let n = digits.len;
    let Some(&last) = digits.as_bytes().last() else {
        return exp;
    };
    if (last - b'0').is_multiple_of(2) {
        // Already even: Go's choice whenever there is a tie.
        return exp;
    }
    // Cheap filter: the digit after the candidates must be 5, then 0.
    let mut probe = StackStr::new();
    if write!(probe, "{:.*e}", n + 1, v).is_err() {
        return exp;
    }
    let probe_digits: Vec<u8> = probe
        .as_bytes()
        .iter()
        .take_while(|&&b| b != b'e')
        .filter(|b| b.is_ascii_digit())
        .copied()
        .collect();
    if probe_digits.get(n) != Some(&b'5') || probe_digits.get(n + 1) != Some(&b'0') {
        return exp;
    }
    // The exact expansion (a double has at most 767 significant digits).
    let exact = format!("{v:.800e}");
    let (mantissa, exact_exp) = exact.split_once('e').unwrap_or((&exact, "0"));
    let exact_digits: Vec<u8> = mantissa.bytes().filter(u8::is_ascii_digit).collect();
    let is_tie =
        exact_digits.get(n) == Some(&b'5') && exact_digits.iter().skip(n + 1).all(|&b| b == b'0');
    if !is_tie {
        return exp;
    }
    // The two candidates are the truncation `low` and `low + 1`; Rust gave
    // the odd one, so the even one is the other.
    let low = exact_digits.get(..n).unwrap_or_default();
    let low_exp: i32 = exact_exp.parse().unwrap_or(exp);
    let Some(&low_last) = low.last() else {
        return exp;
    };
    if !(low_last - b'0').is_multiple_of(2) || low == digits.as_bytes() {
        return exp;
    }
    // Take `low` only if it reads back as `v`.
    let candidate = format!(
        "{}.{}e{low_exp}",
        char::from(low.first().copied().unwrap_or(b'0')),
        std::str::from_utf8(low.get(1..).unwrap_or_default()).unwrap_or("0")
    );
    if candidate.parse::<f64>() != Ok(v) {
        return exp;
    }
    digits.len = 0;
    for &b in low {
        digits.push(b);
    }
    low_exp
}

/// Appends HELP text with `\` and newline escaped.
pub fn write_escaped_help(out: &mut Vec<u8>, help: &str) {
    for &b in help.as_bytes() {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            _ => out.push(b),
        }
    }
}

/// Appends a label value with `\`, newline and `"` escaped.
pub fn write_escaped_label_value(out: &mut Vec<u8>, value: &str) {
    for &b in value.as_bytes() {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'"' => out.extend_from_slice(b"\\\""),
            _ => out.push(b),
        }
    }
}

/// Whether `name` is a metric name of the classic scheme,
/// `[a-zA-Z_:][a-zA-Z0-9_:]*` (the only names konn registers, so names are
/// never quoted).
pub fn is_valid_metric_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

/// Whether `name` is a label name of the classic scheme,
/// `[a-zA-Z_][a-zA-Z0-9_]*`, and not reserved (`__` prefix).
pub fn is_valid_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.starts_with("__")
}

/// The `Content-Type` of a scrape answer for the scraper's `Accept` header.
///
/// konn only writes the text format, so this follows the text branch of
/// `expfmt.Negotiate`: the clauses are taken by falling `q` (stable for
/// ties), an `escaping` parameter with a known value (`allow-utf-8`,
/// `underscores`, `dots`, `values`) is remembered, and the first
/// `text/plain` clause with `version=0.0.4` or no version ends the search.
/// Every name konn exports is a classic name, so the escaping choice does
/// not change the body. A scraper that prefers protobuf (which Go would
/// serve) gets text too; Prometheus reads the `Content-Type`.
pub fn negotiate_content_type(accept: Option<&[u8]>) -> String {
    let mut escaping: &str = DEFAULT_ESCAPING;
    let accept = accept
        .and_then(|a| std::str::from_utf8(a).ok())
        .unwrap_or("");
    let mut clauses: Vec<Clause<'_>> = accept.split(',').filter_map(Clause::parse).collect();
    clauses.sort_by(|a, b| b.q.total_cmp(&a.q));
    for clause in &clauses {
        if let Some(e) = clause.escaping {
            escaping = e;
        }
        if clause.media == "text/plain" && matches!(clause.version, None | Some("0.0.4")) {
            break;
        }
    }
    format!("{TEXT_FORMAT}; escaping={escaping}")
}

/// One clause of an `Accept` header, as much of it as negotiation needs.
#[derive(Debug)]
struct Clause<'a> {
    media: &'a str,
    q: f64,
    version: Option<&'a str>,
    escaping: Option<&'a str>,
}

impl<'a> Clause<'a> {
    fn parse(clause: &'a str) -> Option<Self> {
        let mut parts = clause.split(';');
        let media = parts.next()?.trim_matches(' ');
        if !media.contains('/') {
            return None;
        }
        let mut parsed = Self {
            media,
            q: 1.0,
            version: None,
            escaping: None,
        };
        for param in parts {
            let Some((key, value)) = param.split_once('=') else {
                continue;
            };
            let (key, value) = (key.trim_matches(' '), value.trim_matches(' '));
            match key {
                "q" => parsed.q = value.parse().unwrap_or(0.0),
                "version" => parsed.version = Some(value),
                "escaping" => {
                    if matches!(value, "allow-utf-8" | "underscores" | "dots" | "values") {
                        parsed.escaping = Some(value);
                    }
                }
                _ => {}
            }
        }
        Some(parsed)
    }
}

/// A small fixed-capacity string for formatting numbers without allocating.
struct StackStr {
    buf: [u8; 40],
    len: usize,
}

impl StackStr {
    fn new() -> Self {
        Self {
            buf: [0; 40],
            len: 0,
        }
    }

    fn push(&mut self, b: u8) {
        if let Some(slot) = self.buf.get_mut(self.len) {
            *slot = b;
            self.len += 1;
        }
    }

    fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or_default()
    }
}

impl std::fmt::Write for StackStr {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let slot = self.buf.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_like_go() {
        // Expected strings from Go's strconv.FormatFloat(v, 'g', -1, 64).
        let cases: &[(f64, &str)] = &[
            (0.0, "0"),
            (-0.0, "0"),
            (1.0, "1"),
            (-1.0, "-1"),
            (2.0, "2"),
            (123456.0, "123456"),
            (1_000_000.0, "1e+06"),
            (12_345_678.0, "1.2345678e+07"),
            (1e21, "1e+21"),
            (0.0001, "0.0001"),
            (0.000123, "0.000123"),
            (0.00001, "1e-05"),
            (0.000001, "1e-06"),
            (0.005, "0.005"),
            (12.5, "12.5"),
            (32.706_000_5, "32.7060005"),
            (-2.5e-300, "-2.5e-300"),
            (f64::MAX, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (18_446_744_073_709_551_615.0, "1.8446744073709552e+19"),
            (1_795_307_613.11, "1.79530761311e+09"),
            (100.0, "100"),
            (99_999.5, "99999.5"),
            (999_999.0, "999999"),
            // Exactly halfway between two 16-digit candidates: Go rounds
            // to even where Rust's `{:e}` rounds up.
            (685_843_179_473_154.0 + 0.25, "6.858431794731542e+14"),
            (685_843_179_473_154.0 + 0.75, "6.858431794731548e+14"),
        ];
        for &(v, want) in cases {
            assert_eq!(format_f64(v), want, "{v:?}");
        }
        assert_eq!(format_f64(f64::NAN), "NaN");
        assert_eq!(format_f64(f64::INFINITY), "+Inf");
        assert_eq!(format_f64(f64::NEG_INFINITY), "-Inf");
    }

    #[test]
    fn escaping() {
        let mut out = Vec::new();
        write_escaped_help(&mut out, "a\\b\n\"c\"");
        assert_eq!(out, b"a\\\\b\\n\"c\"");
        out.clear();
        write_escaped_label_value(&mut out, "a\\b\n\"c\"");
        assert_eq!(out, b"a\\\\b\\n\\\"c\\\"");
    }

    #[test]
    fn names() {
        assert!(is_valid_metric_name("konnectivity_network_proxy_server_x"));
        assert!(is_valid_metric_name(":a_b:c9"));
        assert!(!is_valid_metric_name("9a"));
        assert!(!is_valid_metric_name(""));
        assert!(!is_valid_metric_name("a-b"));
        assert!(is_valid_label_name("packet_type"));
        assert!(!is_valid_label_name("__name"));
        assert!(!is_valid_label_name("a:b"));
        assert!(!is_valid_label_name(""));
    }

    #[test]
    fn content_type_negotiation() {
        let plain = "text/plain; version=0.0.4; charset=utf-8; escaping=underscores";
        assert_eq!(negotiate_content_type(None), plain);
        assert_eq!(negotiate_content_type(Some(b"*/*")), plain);
        assert_eq!(negotiate_content_type(Some(b"\xff")), plain);
        // Prometheus 3's default Accept header.
        let prom3 = b"application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,\
application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,\
text/plain;version=0.0.4;q=0.2,*/*;q=0.1";
        assert_eq!(
            negotiate_content_type(Some(prom3)),
            "text/plain; version=0.0.4; charset=utf-8; escaping=allow-utf-8"
        );
        // An unknown escaping value is ignored.
        assert_eq!(
            negotiate_content_type(Some(b"text/plain;version=0.0.4;escaping=bogus")),
            plain
        );
        assert_eq!(
            negotiate_content_type(Some(b"text/plain;escaping=dots")),
            "text/plain; version=0.0.4; charset=utf-8; escaping=dots"
        );
    }
}
