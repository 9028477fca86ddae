//! Flag value types: pflag's built-in ones (bool, string, int, float32,
//! duration, string slice) and two konn conveniences (a fixed choice of
//! strings and a byte size).
//!
//! Every type implements [`Value`], the equivalent of pflag's `Value`
//! interface: `set` parses one occurrence on the command line, `render` is
//! pflag's `String()` (used for `(default …)` in `--help`), `type_name` is
//! pflag's `Type()`.

use std::any::Any;
use std::fmt;

use super::go::{self, GoDuration, IntBase};

/// One flag's value: parsing, rendering and type name, as pflag's `Value`.
pub trait Value: fmt::Debug + Send + 'static {
    /// Parses one occurrence of the flag and stores it. The error is the
    /// cause shown after `invalid argument "x" for "--flag" flag: `.
    fn set(&mut self, raw: &str) -> Result<(), String>;

    /// pflag's `Type()`: `bool`, `string`, `int`, `duration`, …
    fn type_name(&self) -> &'static str;

    /// pflag's `String()`: how the current value is shown.
    fn render(&self) -> String;

    /// A boolean flag: `--flag` alone means `--flag=true`, and the next
    /// argument is never taken as its value.
    fn is_bool(&self) -> bool {
        false
    }

    /// Whether `default` (a [`render`](Self::render)ed default) is this
    /// type's zero value, in which case `--help` prints no `(default …)`.
    /// pflag's rule for types it does not know.
    fn default_is_zero(&self, default: &str) -> bool {
        matches!(default, "false" | "<nil>" | "" | "0")
    }

    /// For typed access after parsing.
    fn as_any(&self) -> &dyn Any;
}

/// `bool`: Go's `strconv.ParseBool` spellings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoolValue(pub bool);

impl Value for BoolValue {
    fn set(&mut self, raw: &str) -> Result<(), String> {
        self.0 = go::parse_bool(raw)?;
        Ok(())
    }
    fn type_name(&self) -> &'static str {
        "bool"
    }
    fn render(&self) -> String {
        self.0.to_string()
    }
    fn is_bool(&self) -> bool {
        true
    }
    fn default_is_zero(&self, default: &str) -> bool {
        default == "false" || default.is_empty()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `string`: taken verbatim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StringValue(pub String);

impl Value for StringValue {
    fn set(&mut self, raw: &str) -> Result<(), String> {
        raw.clone_into(&mut self.0);
        Ok(())
    }
    fn type_name(&self) -> &'static str {
        "string"
    }
    fn render(&self) -> String {
        self.0.clone()
    }
    fn default_is_zero(&self, default: &str) -> bool {
        default.is_empty()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `int`: a Go `int` (64 bits), parsed with base prefixes and `_`
/// separators (`8090`, `0x1f90`, `0o17`, `017`, `1_000`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntValue(pub i64);

impl Value for IntValue {
    fn set(&mut self, raw: &str) -> Result<(), String> {
        self.0 = go::parse_int(raw, IntBase::Auto, 64)?;
        Ok(())
    }
    fn type_name(&self) -> &'static str {
        "int"
    }
    fn render(&self) -> String {
        self.0.to_string()
    }
    fn default_is_zero(&self, default: &str) -> bool {
        default == "0"
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `float32`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Float32Value(pub f32);

impl Value for Float32Value {
    fn set(&mut self, raw: &str) -> Result<(), String> {
        self.0 = go::parse_float32(raw)?;
        Ok(())
    }
    fn type_name(&self) -> &'static str {
        "float32"
    }
    fn render(&self) -> String {
        go::format_float32(self.0)
    }
    fn default_is_zero(&self, default: &str) -> bool {
        default == "0"
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `duration`: Go's `time.ParseDuration` syntax, rendered as Go prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationValue(pub GoDuration);

impl Value for DurationValue {
    fn set(&mut self, raw: &str) -> Result<(), String> {
        self.0 = GoDuration::parse(raw)?;
        Ok(())
    }
    fn type_name(&self) -> &'static str {
        "duration"
    }
    fn render(&self) -> String {
        self.0.to_string()
    }
    fn default_is_zero(&self, default: &str) -> bool {
        default == "0" || default == "0s"
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `stringSlice`, exactly as pflag: each occurrence is one CSV record
/// (`a,b`, `"x,y",z`); the first occurrence replaces the default, later
/// ones append; an empty value is an empty list. Rendered as `[a,b]`, so
/// the empty default shows as `[]` — and feeding `--flag=[]` back gives
/// the one-element list `["[]"]`, as it does upstream.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StringSliceValue {
    /// The current list.
    pub values: Vec<String>,
    changed: bool,
}

impl StringSliceValue {
    /// A list with this default.
    pub fn new<S: Into<String>>(default: impl IntoIterator<Item = S>) -> Self {
        Self {
            values: default.into_iter().map(Into::into).collect(),
            changed: false,
        }
    }
}

impl Value for StringSliceValue {
    fn set(&mut self, raw: &str) -> Result<(), String> {
        let parsed = if raw.is_empty() {
            Vec::new()
        } else {
            go::read_csv_record(raw)?
        };
        if self.changed {
            self.values.extend(parsed);
        } else {
            self.values = parsed;
        }
        self.changed = true;
        Ok(())
    }
    fn type_name(&self) -> &'static str {
        "stringSlice"
    }
    fn render(&self) -> String {
        format!("[{}]", go::write_csv_record(&self.values))
    }
    fn default_is_zero(&self, default: &str) -> bool {
        default == "[]"
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// konn: one of a fixed set of strings (`--io-engine=auto|io-uring|epoll`).
/// Shown as a `string` in `--help`; a value outside the set is rejected
/// while parsing, naming the accepted ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChoiceValue {
    /// The current value; always one of `choices`.
    pub value: String,
    choices: &'static [&'static str],
}

impl ChoiceValue {
    /// `default` must be one of `choices`.
    pub fn new(default: &str, choices: &'static [&'static str]) -> Self {
        debug_assert!(choices.contains(&default));
        Self {
            value: default.to_owned(),
            choices,
        }
    }
}

impl Value for ChoiceValue {
    fn set(&mut self, raw: &str) -> Result<(), String> {
        if !self.choices.contains(&raw) {
            return Err(format!("must be one of: {}", self.choices.join(", ")));
        }
        raw.clone_into(&mut self.value);
        Ok(())
    }
    fn type_name(&self) -> &'static str {
        "string"
    }
    fn render(&self) -> String {
        self.value.clone()
    }
    fn default_is_zero(&self, default: &str) -> bool {
        default.is_empty()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// konn: a size in bytes. A plain integer, or a number with a Kubernetes
/// quantity suffix: `Ki`, `Mi`, `Gi`, `Ti` (powers of 1024) or `k`, `M`,
/// `G`, `T` (powers of 1000); e.g. `512Mi`, `65535`, `1Gi`.
/// Rendered with the largest binary suffix that divides it exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSizeValue(pub u64);

impl ByteSizeValue {
    /// Parses the flag syntax.
    pub fn parse(raw: &str) -> Result<u64, String> {
        let split = raw.find(|c: char| !c.is_ascii_digit()).unwrap_or(raw.len());
        let (num, suffix) = raw.split_at(split);
        let syntax = || {
            format!(
                "invalid size {}: want a number of bytes with an optional Ki, Mi, Gi, Ti, k, M, G or T suffix",
                go::quote(raw)
            )
        };
        if num.is_empty() {
            return Err(syntax());
        }
        let n: u64 = num
            .parse()
            .map_err(|_| format!("size {} is too large", go::quote(raw)))?;
        let mult: u64 = match suffix {
            "" => 1,
            "Ki" => 1 << 10,
            "Mi" => 1 << 20,
            "Gi" => 1 << 30,
            "Ti" => 1 << 40,
            "k" => 1_000,
            "M" => 1_000_000,
            "G" => 1_000_000_000,
            "T" => 1_000_000_000_000,
            _ => return Err(syntax()),
        };
        n.checked_mul(mult)
            .ok_or_else(|| format!("size {} is too large", go::quote(raw)))
    }

    /// Renders `bytes` as the flag syntax (`512Mi`, `1000`).
    pub fn format(bytes: u64) -> String {
        for (shift, suffix) in [(40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki")] {
            let unit = 1u64 << shift;
            if bytes != 0 && bytes.is_multiple_of(unit) {
                return format!("{}{suffix}", bytes / unit);
            }
        }
        bytes.to_string()
    }
}

impl Value for ByteSizeValue {
    fn set(&mut self, raw: &str) -> Result<(), String> {
        self.0 = Self::parse(raw)?;
        Ok(())
    }
    fn type_name(&self) -> &'static str {
        "size"
    }
    fn render(&self) -> String {
        Self::format(self.0)
    }
    fn default_is_zero(&self, default: &str) -> bool {
        default == "0"
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_slice_like_pflag() {
        let mut v = StringSliceValue::new(["x"]);
        assert_eq!(v.render(), "[x]");
        v.set("a,b").unwrap();
        assert_eq!(v.values, ["a", "b"]);
        // Later occurrences append.
        v.set("c").unwrap();
        assert_eq!(v.values, ["a", "b", "c"]);
        v.set("").unwrap();
        assert_eq!(v.values, ["a", "b", "c"]);
        assert_eq!(v.render(), "[a,b,c]");

        let mut v = StringSliceValue::default();
        assert_eq!(v.render(), "[]");
        v.set("[]").unwrap();
        assert_eq!(v.values, ["[]"]);
        assert_eq!(v.render(), "[[]]");

        let mut v = StringSliceValue::new(["x"]);
        v.set("").unwrap();
        assert!(
            v.values.is_empty(),
            "an empty first value clears the default"
        );

        let mut v = StringSliceValue::default();
        assert_eq!(
            v.set("a\"b"),
            Err("parse error on line 1, column 2: bare \" in non-quoted-field".to_owned())
        );
    }

    #[test]
    fn bool_and_numbers() {
        let mut b = BoolValue(false);
        b.set("T").unwrap();
        assert!(b.0);
        assert!(b.set("yes").is_err());
        assert!(b.is_bool());

        let mut i = IntValue(0);
        i.set("0x1f90").unwrap();
        assert_eq!(i.0, 8080);
        assert_eq!(
            i.set(""),
            Err(r#"strconv.ParseInt: parsing "": invalid syntax"#.to_owned())
        );

        let mut d = DurationValue(GoDuration::ZERO);
        d.set("1m30s").unwrap();
        assert_eq!(d.render(), "1m30s");
        assert_eq!(
            d.set("1"),
            Err(r#"time: missing unit in duration "1""#.to_owned())
        );

        let mut f = Float32Value(0.0);
        f.set("75").unwrap();
        assert_eq!(f.render(), "75");
    }

    #[test]
    fn choice_rejects_unknown() {
        let mut c = ChoiceValue::new("auto", &["auto", "io-uring", "epoll"]);
        c.set("epoll").unwrap();
        assert_eq!(c.render(), "epoll");
        assert_eq!(
            c.set("kqueue"),
            Err("must be one of: auto, io-uring, epoll".to_owned())
        );
        assert_eq!(c.value, "epoll", "a rejected value changes nothing");
    }

    #[test]
    fn byte_sizes() {
        for (raw, want) in [
            ("0", 0),
            ("65535", 65_535),
            ("16Ki", 16 << 10),
            ("512Mi", 512 << 20),
            ("1Gi", 1 << 30),
            ("2Ti", 2 << 40),
            ("4k", 4000),
            ("3M", 3_000_000),
            ("1G", 1_000_000_000),
            ("1T", 1_000_000_000_000),
        ] {
            assert_eq!(ByteSizeValue::parse(raw), Ok(want), "{raw}");
        }
        for bad in ["", "Mi", "1.5Mi", "-1", "1KB", "1 Mi", "1mi"] {
            assert!(ByteSizeValue::parse(bad).is_err(), "{bad}");
        }
        assert!(ByteSizeValue::parse("99999999999999999999").is_err());
        assert!(ByteSizeValue::parse("17000000Ti").is_err());
        assert_eq!(ByteSizeValue::format(512 << 20), "512Mi");
        assert_eq!(ByteSizeValue::format(1 << 20), "1Mi");
        assert_eq!(ByteSizeValue::format(1536), "1536");
        assert_eq!(ByteSizeValue::format(3 << 10), "3Ki");
        assert_eq!(ByteSizeValue::format(0), "0");
        assert_eq!(ByteSizeValue::format(65_535), "65535");
    }
}
