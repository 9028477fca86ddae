//! Go's spellings of flag values, reimplemented from their documented
//! behaviour so konn's binaries accept exactly what upstream's accept.
//!
//! Upstream parses its flags with Go's `strconv`, `time.ParseDuration` and
//! `encoding/csv` (pflag's string slices). A manifest written for the Go
//! binaries must mean the same thing to konn, including the odd corners
//! (`--port=0x1f90` is a valid int, `--alpn-proto=[]` is a one-element list
//! holding `[]`), and a bad value should be reported with the same words.
//! This module is that layer:
//!
//! - [`parse_bool`]: `strconv.ParseBool` spellings.
//! - [`parse_int`] / [`parse_uint`]: `strconv.ParseInt`/`ParseUint` with base
//!   prefixes and `_` separators (base 0) or plain decimal (base 10).
//! - [`parse_float32`] and [`format_float32`]: `strconv.ParseFloat(s, 32)` and
//!   `FormatFloat(f, 'g', -1, 32)` (decimal, `inf`/`nan`; no hex floats).
//! - [`GoDuration`]: `time.Duration` (signed nanoseconds) with Go's parser and
//!   `String()` rendering (`1h0m0s`, `1.5s`, `300ms`).
//! - [`read_csv_record`] / [`write_csv_record`]: one `encoding/csv` record, as
//!   pflag's `StringSlice` reads and renders it.
//! - [`quote`]: `strconv.Quote`, used in error messages and `(default "…")`.
//!
//! Error texts are Go's, because operators search for them.

use std::fmt;
use std::time::Duration;

// ---------------------------------------------------------------- quoting --

/// `strconv.Quote`: a double-quoted Go string literal.
///
/// Printable characters are kept, `"` and `\` are escaped, control
/// characters use `\n`-style or `\xNN` escapes, other non-printing
/// characters `\uNNNN`. "Printable" follows Go's `unicode.IsPrint` for
/// everything konn can meet in a flag value; the rarer format and private-use
/// code points are approximated (see `is_go_printable`).
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    quote_into(&mut out, s);
    out
}

/// [`quote`], appended to `out`.
pub fn quote_into(out: &mut String, s: &str) {
    // Printable ASCII without `"` or `\` (addresses, ids, most values)
    // needs no escaping.
    if s.bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        out.reserve(s.len() + 2);
        out.push('"');
        out.push_str(s);
        out.push('"');
        return;
    }
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            c if is_go_printable(c) => out.push(c),
            c if (c as u32) < 0x80 => push_hex(out, "\\x", c as u32, 2),
            c if (c as u32) > 0xffff => push_hex(out, "\\U", c as u32, 8),
            c => push_hex(out, "\\u", c as u32, 4),
        }
    }
    out.push('"');
}

fn push_hex(out: &mut String, prefix: &str, v: u32, width: usize) {
    use fmt::Write as _;
    out.push_str(prefix);
    let _ = write!(out, "{v:0width$x}");
}

/// Approximates Go's `unicode.IsPrint`: letters, marks, numbers,
/// punctuation, symbols and the ASCII space. Rust's standard library has no
/// general-category table, so this excludes control characters, the
/// non-ASCII space separators, the common format characters (soft hyphen,
/// zero-width and bidi marks, BOM), private use and non-characters.
fn is_go_printable(c: char) -> bool {
    let u = c as u32;
    if c == ' ' {
        return true;
    }
    if c.is_control() || c.is_whitespace() {
        return false;
    }
    !matches!(u,
        0x00ad
        | 0x0600..=0x0605
        | 0x061c
        | 0x06dd
        | 0x070f
        | 0x180e
        | 0x200b..=0x200f
        | 0x202a..=0x202e
        | 0x2060..=0x206f
        | 0xd800..=0xf8ff
        | 0xfeff
        | 0xfff9..=0xfffb
        | 0xfffe..=0xffff
        | 0xf0000..=0x10ffff)
}

/// `time`'s private `quote`: like [`quote`] but every non-ASCII or control
/// byte becomes `\xNN` (this is what `time.ParseDuration` errors show).
fn time_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if (c as u32) >= 0x80 || c < ' ' {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                push_hex(&mut out, "\\x", u32::from(b), 2);
            }
        } else {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
    }
    out.push('"');
    out
}

// ------------------------------------------------------------------- bool --

/// `strconv.ParseBool`: `1 t T TRUE true True` and `0 f F FALSE false False`.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(num_error("ParseBool", s, NumErrorKind::Syntax)),
    }
}

// --------------------------------------------------------------- integers --

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum NumErrorKind {
    Syntax,
    Range,
}

/// Go's `*strconv.NumError` text: `strconv.ParseInt: parsing "x": invalid syntax`.
fn num_error(func: &str, input: &str, kind: NumErrorKind) -> String {
    let what = match kind {
        NumErrorKind::Syntax => "invalid syntax",
        NumErrorKind::Range => "value out of range",
    };
    format!("strconv.{func}: parsing {}: {what}", quote(input))
}

/// Integer bases [`parse_int`] and [`parse_uint`] accept.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum IntBase {
    /// Go's base 0: `0x`/`0o`/`0b` prefixes, a leading `0` for octal, and `_`
    /// between digits (pflag's `int` flags).
    Auto,
    /// Plain decimal (klog's `-v` and severity flags).
    Decimal,
}

/// Go's `underscoreOK`: underscores only between digits, or between a base
/// prefix and a digit.
fn underscore_ok(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    if matches!(b.first(), Some(b'+' | b'-')) {
        i = 1;
    }
    // '^' start, '0' digit or prefix, '_' underscore, '!' anything else.
    let mut saw = b'^';
    let mut hex = false;
    if b.len() >= i + 2 && b[i] == b'0' && matches!(b[i + 1] | 0x20, b'b' | b'o' | b'x') {
        hex = b[i + 1] | 0x20 == b'x';
        saw = b'0';
        i += 2;
    }
    for &c in &b[i..] {
        if c.is_ascii_digit() || (hex && (c | 0x20).is_ascii_hexdigit()) {
            saw = b'0';
            continue;
        }
        if c == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
            continue;
        }
        if saw == b'_' {
            return false;
        }
        saw = b'!';
    }
    saw != b'_'
}

/// Parses the magnitude (no sign) like Go's `ParseUint`; `Err(kind)` on failure.
fn parse_magnitude(s: &str, base: IntBase, bits: u32) -> Result<u64, NumErrorKind> {
    if s.is_empty() {
        return Err(NumErrorKind::Syntax);
    }
    let full = s;
    let (radix, digits, base0) = match base {
        IntBase::Decimal => (10u32, s, false),
        IntBase::Auto => {
            let b = s.as_bytes();
            if b[0] == b'0' && b.len() >= 3 && matches!(b[1] | 0x20, b'b' | b'o' | b'x') {
                let radix = match b[1] | 0x20 {
                    b'b' => 2,
                    b'o' => 8,
                    _ => 16,
                };
                (radix, &s[2..], true)
            } else if b[0] == b'0' {
                (8, &s[1..], true)
            } else {
                (10, s, true)
            }
        }
    };
    let max: u64 = if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let mut n: u64 = 0;
    let mut underscores = false;
    for c in digits.chars() {
        if c == '_' && base0 {
            underscores = true;
            continue;
        }
        let d = c
            .to_digit(36)
            .filter(|&d| d < radix)
            .ok_or(NumErrorKind::Syntax)?;
        n = n
            .checked_mul(u64::from(radix))
            .and_then(|n| n.checked_add(u64::from(d)))
            .filter(|&n| n <= max)
            .ok_or(NumErrorKind::Range)?;
    }
    if underscores && !underscore_ok(full) {
        return Err(NumErrorKind::Syntax);
    }
    Ok(n)
}

/// `strconv.ParseUint(s, base, bits)`.
pub fn parse_uint(s: &str, base: IntBase, bits: u32) -> Result<u64, String> {
    parse_magnitude(s, base, bits).map_err(|kind| num_error("ParseUint", s, kind))
}

/// `strconv.ParseInt(s, base, bits)`: an optional sign, then the magnitude.
pub fn parse_int(s: &str, base: IntBase, bits: u32) -> Result<i64, String> {
    let err = |kind| num_error("ParseInt", s, kind);
    if s.is_empty() {
        return Err(err(NumErrorKind::Syntax));
    }
    let (neg, body) = match s.as_bytes()[0] {
        b'+' => (false, &s[1..]),
        b'-' => (true, &s[1..]),
        _ => (false, s),
    };
    let mag = parse_magnitude(body, base, 64).map_err(err)?;
    let bits = bits.clamp(1, 64);
    let cutoff = 1u64 << (bits - 1);
    if !neg && mag >= cutoff {
        return Err(err(NumErrorKind::Range));
    }
    if neg && mag > cutoff {
        return Err(err(NumErrorKind::Range));
    }
    if neg {
        // mag <= 2^63, so the wrapping negation is exact.
        Ok(0i64.wrapping_sub_unsigned(mag))
    } else {
        Ok(i64::try_from(mag).unwrap_or(i64::MAX))
    }
}

// ----------------------------------------------------------------- floats --

/// `strconv.ParseFloat(s, 32)` for decimal literals, `inf`/`infinity`/`nan`
/// (any case, signed infinities) and `_` separators. Go also takes
/// hexadecimal floats (`0x1p-2`); konn does not (no upstream flag needs one)
/// and reports them as invalid syntax.
pub fn parse_float32(s: &str) -> Result<f32, String> {
    let err = |kind| num_error("ParseFloat", s, kind);
    let body = s.strip_prefix(['+', '-']).unwrap_or(s);
    let lower = body.to_ascii_lowercase();
    if lower == "inf" || lower == "infinity" {
        return Ok(if s.starts_with('-') {
            f32::NEG_INFINITY
        } else {
            f32::INFINITY
        });
    }
    if s.eq_ignore_ascii_case("nan") {
        return Ok(f32::NAN);
    }
    // Go's grammar: digits, at most one '.', an optional exponent.
    let decimal = body
        .bytes()
        .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'+' | b'-' | b'_'));
    if !decimal || body.contains('_') && !underscore_ok(s) {
        return Err(err(NumErrorKind::Syntax));
    }
    let cleaned: String = s.chars().filter(|&c| c != '_').collect();
    let v: f32 = cleaned.parse().map_err(|_| err(NumErrorKind::Syntax))?;
    if v.is_infinite() {
        return Err(err(NumErrorKind::Range));
    }
    Ok(v)
}

/// `strconv.FormatFloat(f, 'g', -1, 32)`: the shortest digits that read back
/// as `f`, in `%e` form when the decimal exponent is < -4 or >= 6, else in
/// `%f` form.
pub fn format_float32(f: f32) -> String {
    if f.is_nan() {
        return "NaN".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.to_owned();
    }
    // Rust's `{:e}` prints the shortest round-trip digits: "d.ddde±x".
    let e = format!("{f:e}");
    let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let neg = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if digits.bytes().all(|d| d == b'0') {
        return if neg { "-0" } else { "0" }.to_owned();
    }
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    // Go decides between %e and %f with a precision of 6 when formatting
    // the shortest representation.
    if !(-4..6).contains(&exp) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if exp < 0 { '-' } else { '+' });
        out.push_str(&format!("{:02}", exp.unsigned_abs()));
    } else if exp < 0 {
        out.push_str("0.");
        for _ in 0..(-exp - 1) {
            out.push('0');
        }
        out.push_str(&digits);
    } else {
        let int_len = usize::try_from(exp + 1).unwrap_or(0);
        if digits.len() <= int_len {
            out.push_str(&digits);
            for _ in digits.len()..int_len {
                out.push('0');
            }
        } else {
            out.push_str(&digits[..int_len]);
            out.push('.');
            out.push_str(&digits[int_len..]);
        }
    }
    out
}

// -------------------------------------------------------------- durations --

/// A Go `time.Duration`: signed nanoseconds.
///
/// Kept signed because Go's parser accepts negative values (`-1s`) and
/// upstream's `Validate` decides what to do with them; options convert to
/// [`std::time::Duration`] with [`GoDuration::to_std`] after validation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GoDuration(pub i64);

const NS: u64 = 1;
const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
const MIN: u64 = 60 * SEC;
const HOUR: u64 = 60 * MIN;

impl GoDuration {
    /// Zero.
    pub const ZERO: Self = Self(0);

    /// Whole seconds.
    pub const fn from_secs(secs: i64) -> Self {
        Self(secs.saturating_mul(SEC as i64))
    }

    /// Milliseconds.
    pub const fn from_millis(ms: i64) -> Self {
        Self(ms.saturating_mul(MS as i64))
    }

    /// Nanoseconds.
    pub const fn as_nanos(self) -> i64 {
        self.0
    }

    /// Is it negative?
    pub const fn is_negative(self) -> bool {
        self.0 < 0
    }

    /// The value as a [`Duration`], or `None` when it is negative.
    pub fn to_std(self) -> Option<Duration> {
        u64::try_from(self.0).ok().map(Duration::from_nanos)
    }

    /// Converts a [`Duration`], saturating at Go's maximum (about 292 years).
    pub fn from_std(d: Duration) -> Self {
        Self(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    }

    /// `time.ParseDuration`: a possibly signed sequence of decimal numbers,
    /// each with an optional fraction and a unit (`ns`, `us`/`µs`/`μs`, `ms`,
    /// `s`, `m`, `h`), e.g. `300ms`, `-1.5h`, `2h45m`. A bare `0` is zero.
    ///
    /// # Errors
    ///
    /// Go's messages: `time: invalid duration "x"`, `time: missing unit in
    /// duration "1"`, `time: unknown unit "d" in duration "1d"`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let invalid = || format!("time: invalid duration {}", time_quote(s));
        let mut rest = s;
        let mut neg = false;
        if let Some(c) = rest.chars().next()
            && (c == '-' || c == '+')
        {
            neg = c == '-';
            rest = &rest[1..];
        }
        if rest == "0" {
            return Ok(Self::ZERO);
        }
        if rest.is_empty() {
            return Err(invalid());
        }
        let limit: u64 = 1 << 63;
        let mut total: u64 = 0;
        while !rest.is_empty() {
            let b = rest.as_bytes();
            if !(b[0] == b'.' || b[0].is_ascii_digit()) {
                return Err(invalid());
            }
            // Integer part.
            let int_len = b.iter().take_while(|c| c.is_ascii_digit()).count();
            let mut v: u64 = 0;
            for &c in &b[..int_len] {
                if v > limit / 10 {
                    return Err(invalid());
                }
                v = v * 10 + u64::from(c - b'0');
                if v > limit {
                    return Err(invalid());
                }
            }
            rest = &rest[int_len..];
            // Fraction: keeps accumulating digits until they would overflow,
            // then only skips them (precision beyond 19 digits is noise).
            let mut frac: u64 = 0;
            let mut scale: f64 = 1.0;
            let mut has_frac = false;
            if let Some(after) = rest.strip_prefix('.') {
                let frac_len = after.bytes().take_while(u8::is_ascii_digit).count();
                has_frac = frac_len > 0;
                let mut overflow = false;
                for c in after[..frac_len].bytes() {
                    if overflow {
                        continue;
                    }
                    if frac > (limit - 1) / 10 {
                        overflow = true;
                        continue;
                    }
                    let y = frac * 10 + u64::from(c - b'0');
                    if y > limit {
                        overflow = true;
                        continue;
                    }
                    frac = y;
                    scale *= 10.0;
                }
                rest = &after[frac_len..];
            }
            if int_len == 0 && !has_frac {
                return Err(invalid());
            }
            // Unit: everything up to the next digit or '.'.
            let unit_len = rest
                .bytes()
                .take_while(|&c| c != b'.' && !c.is_ascii_digit())
                .count();
            if unit_len == 0 {
                return Err(format!("time: missing unit in duration {}", time_quote(s)));
            }
            let unit_str = &rest[..unit_len];
            rest = &rest[unit_len..];
            let unit = match unit_str {
                "ns" => NS,
                "us" | "\u{b5}s" | "\u{3bc}s" => US,
                "ms" => MS,
                "s" => SEC,
                "m" => MIN,
                "h" => HOUR,
                _ => {
                    return Err(format!(
                        "time: unknown unit {} in duration {}",
                        time_quote(unit_str),
                        time_quote(s)
                    ));
                }
            };
            if v > limit / unit {
                return Err(invalid());
            }
            v *= unit;
            if frac > 0 {
                // f64 is exact enough here: the fraction of one hour in ns
                // is at most 3.6e12, well inside f64's 53-bit mantissa.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let extra = (frac as f64 * (unit as f64 / scale)) as u64;
                v += extra;
                if v > limit {
                    return Err(invalid());
                }
            }
            total += v;
            if total > limit {
                return Err(invalid());
            }
        }
        if neg {
            // total <= 2^63, so this is exact (and -2^63 is i64::MIN).
            return Ok(Self(0i64.wrapping_sub_unsigned(total)));
        }
        i64::try_from(total).map(Self).map_err(|_| invalid())
    }
}

impl fmt::Display for GoDuration {
    /// Go's `Duration.String()`: `0s`, `1ns`, `1.5µs`, `300ms`, `1.5s`,
    /// `1m30s`, `1h0m0s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let neg = self.0 < 0;
        let u = self.0.unsigned_abs();
        let mut out = String::new();
        if neg {
            out.push('-');
        }
        if u == 0 {
            out.push_str("0s");
        } else if u < SEC {
            let (prec, unit) = if u < US {
                (0, "ns")
            } else if u < MS {
                (3, "\u{b5}s")
            } else {
                (6, "ms")
            };
            push_with_fraction(&mut out, u, prec);
            out.push_str(unit);
        } else {
            let secs = u / SEC;
            let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
            if h > 0 {
                out.push_str(&format!("{h}h"));
            }
            if h > 0 || m > 0 {
                out.push_str(&format!("{m}m"));
            }
            push_with_fraction(&mut out, s * SEC + u % SEC, 9);
            out.push('s');
        }
        f.pad(&out)
    }
}

/// Writes `v / 10^prec` with the fraction's trailing zeros (and a bare '.')
/// left out.
fn push_with_fraction(out: &mut String, v: u64, prec: u32) {
    let div = 10u64.pow(prec);
    out.push_str(&(v / div).to_string());
    let frac = v % div;
    if frac != 0 {
        let digits = format!("{frac:0width$}", width = prec as usize);
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
}

// -------------------------------------------------------------------- CSV --

/// One line of input as Go's `csv.Reader.readLine` sees it.
struct Lines<'a> {
    rest: &'a str,
    line_no: usize,
}

impl<'a> Lines<'a> {
    /// The next line including its `\n` (`\r\n` normalised to `\n`; a final
    /// `\r` without newline dropped), or `None` at the end of the input.
    fn next_line(&mut self) -> Option<String> {
        self.line_no += 1;
        if self.rest.is_empty() {
            return None;
        }
        let (line, rest) = match self.rest.find('\n') {
            Some(i) => self.rest.split_at(i + 1),
            None => (self.rest, ""),
        };
        self.rest = rest;
        let mut line = line.to_owned();
        if !line.ends_with('\n') && line.ends_with('\r') {
            line.pop();
        }
        if line.ends_with("\r\n") {
            line.truncate(line.len() - 2);
            line.push('\n');
        }
        Some(line)
    }
}

fn csv_error(start_line: usize, line: usize, column: usize, what: &str) -> String {
    if start_line == line {
        format!("parse error on line {line}, column {column}: {what}")
    } else {
        format!("record on line {start_line}; parse error on line {line}, column {column}: {what}")
    }
}

const BARE_QUOTE: &str = "bare \" in non-quoted-field";
const QUOTE: &str = "extraneous or missing \" in quoted-field";

/// Reads the first record of `input` as Go's `csv.NewReader(..).Read()`
/// does with default settings (comma separator, strict quotes, no trimming):
/// empty lines are skipped, quoted fields may span lines and use `""` for a
/// quote, anything after the first record is ignored.
///
/// pflag's `StringSlice.Set` calls this for every non-empty value, so
/// `--alpn-proto=a,"b,c"` is `[a, b,c]`, `--alpn-proto=[]` is the single
/// element `[]`, and input made only of newlines is the error `EOF`.
pub fn read_csv_record(input: &str) -> Result<Vec<String>, String> {
    let mut lines = Lines {
        rest: input,
        line_no: 0,
    };
    // Skip empty lines.
    let mut line = loop {
        match lines.next_line() {
            None => return Err("EOF".to_owned()),
            Some(l) if l == "\n" => continue,
            Some(l) => break l,
        }
    };
    let start_line = lines.line_no;
    let mut cur_line = start_line;
    let mut fields = Vec::new();
    let mut col = 1usize;
    loop {
        if !line.starts_with('"') {
            // Unquoted field: up to the next comma or the end of the line.
            let (field, more) = match line.find(',') {
                Some(i) => (&line[..i], true),
                None => (line.strip_suffix('\n').unwrap_or(&line), false),
            };
            if let Some(j) = field.find('"') {
                return Err(csv_error(start_line, lines.line_no, col + j, BARE_QUOTE));
            }
            fields.push(field.to_owned());
            if !more {
                return Ok(fields);
            }
            let consumed = field.len() + 1;
            col += consumed;
            line = line[consumed..].to_owned();
            continue;
        }
        // Quoted field.
        let mut field = String::new();
        line = line[1..].to_owned();
        col += 1;
        loop {
            if let Some(i) = line.find('"') {
                field.push_str(&line[..i]);
                line = line[i + 1..].to_owned();
                col += i + 1;
                if line.starts_with('"') {
                    field.push('"');
                    line = line[1..].to_owned();
                    col += 1;
                } else if line.starts_with(',') {
                    line = line[1..].to_owned();
                    col += 1;
                    fields.push(field);
                    break;
                } else if line.is_empty() || line == "\n" {
                    fields.push(field);
                    return Ok(fields);
                } else {
                    return Err(csv_error(start_line, lines.line_no, col - 1, QUOTE));
                }
            } else if !line.is_empty() {
                // The field continues on the next line.
                field.push_str(&line);
                col += line.len();
                line = lines.next_line().unwrap_or_default();
                if !line.is_empty() {
                    cur_line += 1;
                    col = 1;
                }
            } else {
                return Err(csv_error(start_line, cur_line, col, QUOTE));
            }
        }
    }
}

/// Renders fields as one `encoding/csv` record without the line end (what
/// pflag's `StringSlice.String()` puts between `[` and `]`). A field is
/// quoted when it is `\.`, contains a comma, quote, CR or LF, or starts with
/// a space.
pub fn write_csv_record<S: AsRef<str>>(fields: &[S]) -> String {
    let mut out = String::new();
    for (i, field) in fields.iter().enumerate() {
        let field = field.as_ref();
        if i > 0 {
            out.push(',');
        }
        let needs_quotes = !field.is_empty()
            && (field == "\\."
                || field.contains([',', '"', '\r', '\n'])
                || field.chars().next().is_some_and(char::is_whitespace));
        if needs_quotes {
            out.push('"');
            out.push_str(&field.replace('"', "\"\""));
            out.push('"');
        } else {
            out.push_str(field);
        }
    }
    out
}

#[cfg(test)]
mod tests;
