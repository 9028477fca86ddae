//! The value types of klog's flags, with klog's and Go `flag`'s parsing.
//!
//! Upstream registers klog's flags through Go's `flag` package and hands
//! them to pflag (`AddGoFlag`), so their syntax and error texts are those of
//! `flag` and klog rather than pflag: a bad `--logtostderr=yes` says
//! `parse error`, `-v` takes plain decimal only, severities take names.

use std::any::Any;

use crate::cli::Value;
use crate::cli::go::{self, IntBase};

/// A Go `flag` boolean (klog's `--logtostderr` & co.): `strconv.ParseBool`
/// spellings, but the error is Go `flag`'s bare `parse error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoFlagBool(pub bool);

impl Value for GoFlagBool {
    fn set(&mut self, raw: &str) -> Result<(), String> {
        self.0 = go::parse_bool(raw).map_err(|_| "parse error".to_owned())?;
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
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A Go `flag` string (`--log-dir`, `--log-file`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GoFlagString(pub String);

impl Value for GoFlagString {
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
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A Go `flag` uint64 (`--log-file-max-size`): base prefixes allowed, the
/// errors are `parse error` and `value out of range`. Listed as `uint`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoFlagUint64(pub u64);

impl Value for GoFlagUint64 {
    fn set(&mut self, raw: &str) -> Result<(), String> {
        self.0 = go::parse_uint(raw, IntBase::Auto, 64).map_err(|e| {
            if e.ends_with("value out of range") {
                "value out of range".to_owned()
            } else {
                "parse error".to_owned()
            }
        })?;
        Ok(())
    }
    fn type_name(&self) -> &'static str {
        "uint64"
    }
    fn render(&self) -> String {
        self.0.to_string()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// klog's `Level` (`-v`/`--v`): a decimal 32-bit integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LevelValue(pub i32);

impl Value for LevelValue {
    fn set(&mut self, raw: &str) -> Result<(), String> {
        let v = go::parse_int(raw, IntBase::Decimal, 32)?;
        self.0 = i32::try_from(v).map_err(|e| e.to_string())?;
        Ok(())
    }
    fn type_name(&self) -> &'static str {
        "Level"
    }
    fn render(&self) -> String {
        self.0.to_string()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A klog severity: `INFO` 0, `WARNING` 1, `ERROR` 2, `FATAL` 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Severity(pub i32);

impl Severity {
    /// `I` lines.
    pub const INFO: Self = Self(0);
    /// `W` lines.
    pub const WARNING: Self = Self(1);
    /// `E` lines.
    pub const ERROR: Self = Self(2);
    /// `F` (konn never logs at this severity; it exists for the flags).
    pub const FATAL: Self = Self(3);

    const NAMES: [&'static str; 4] = ["INFO", "WARNING", "ERROR", "FATAL"];

    /// The line prefix letter.
    pub fn letter(self) -> char {
        match self.0 {
            i32::MIN..=0 => 'I',
            1 => 'W',
            2 => 'E',
            _ => 'F',
        }
    }

    /// The name used in log file names (`INFO`, `WARNING`, …).
    pub fn name(self) -> &'static str {
        let idx = usize::try_from(self.0.clamp(0, 3)).unwrap_or(0);
        Self::NAMES[idx]
    }
}

/// klog's `severity` flag value (`--stderrthreshold`,
/// `--alsologtostderrthreshold`): a name in any case, or a decimal number.
/// Rendered as the number, as klog does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeverityValue(pub Severity);

impl Value for SeverityValue {
    fn set(&mut self, raw: &str) -> Result<(), String> {
        let upper = raw.to_ascii_uppercase();
        if let Some(i) = Severity::NAMES.iter().position(|n| *n == upper) {
            self.0 = Severity(i32::try_from(i).unwrap_or(0));
            return Ok(());
        }
        let v = go::parse_int(raw, IntBase::Decimal, 32)?;
        self.0 = Severity(i32::try_from(v).map_err(|e| e.to_string())?);
        Ok(())
    }
    fn type_name(&self) -> &'static str {
        "severity"
    }
    fn render(&self) -> String {
        self.0.0.to_string()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One `--vmodule` entry: a glob and the verbosity for matching code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModulePattern {
    /// Glob (`*`, `?`, `[...]`), matched against the source file name and
    /// module path (see the `log` module docs).
    pub pattern: String,
    /// Verbosity for code that matches.
    pub level: i32,
}

/// klog's `moduleSpec` (`--vmodule=pattern=N,...`). Entries with level 0
/// are dropped, as klog does.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModuleSpecValue(pub Vec<ModulePattern>);

const VMODULE_SYNTAX: &str = "syntax error: expect comma-separated list of filename=N";

impl Value for ModuleSpecValue {
    fn set(&mut self, raw: &str) -> Result<(), String> {
        let mut out = Vec::new();
        for entry in raw.split(',') {
            if entry.is_empty() {
                continue;
            }
            let parts: Vec<&str> = entry.split('=').collect();
            let [pattern, level] = parts[..] else {
                return Err(VMODULE_SYNTAX.to_owned());
            };
            if pattern.is_empty() || level.is_empty() {
                return Err(VMODULE_SYNTAX.to_owned());
            }
            let level = go::parse_int(level, IntBase::Decimal, 32)
                .ok()
                .and_then(|v| i32::try_from(v).ok())
                .ok_or_else(|| VMODULE_SYNTAX.to_owned())?;
            if level < 0 {
                return Err("negative value for vmodule level".to_owned());
            }
            if level == 0 {
                continue;
            }
            out.push(ModulePattern {
                pattern: pattern.to_owned(),
                level,
            });
        }
        self.0 = out;
        Ok(())
    }
    fn type_name(&self) -> &'static str {
        "moduleSpec"
    }
    fn render(&self) -> String {
        self.0
            .iter()
            .map(|p| format!("{}={}", p.pattern, p.level))
            .collect::<Vec<_>>()
            .join(",")
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// klog's `traceLocation` (`--log-backtrace-at=file.rs:N`). Rendered
/// `:0` when unset — a value klog itself refuses to parse back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TraceLocationValue(pub Option<(String, u32)>);

const TRACE_SYNTAX: &str = "syntax error: expect file.go:234";

impl Value for TraceLocationValue {
    fn set(&mut self, raw: &str) -> Result<(), String> {
        if raw.is_empty() {
            self.0 = None;
            return Ok(());
        }
        let parts: Vec<&str> = raw.split(':').collect();
        let [file, line] = parts[..] else {
            return Err(TRACE_SYNTAX.to_owned());
        };
        if !file.contains('.') {
            return Err(TRACE_SYNTAX.to_owned());
        }
        // Go's strconv.Atoi: decimal, optional sign.
        let line =
            go::parse_int(line, IntBase::Decimal, 64).map_err(|_| TRACE_SYNTAX.to_owned())?;
        if line <= 0 {
            return Err("negative or zero value for level".to_owned());
        }
        let line = u32::try_from(line).map_err(|_| TRACE_SYNTAX.to_owned())?;
        self.0 = Some((file.to_owned(), line));
        Ok(())
    }
    fn type_name(&self) -> &'static str {
        "traceLocation"
    }
    fn render(&self) -> String {
        match &self.0 {
            Some((file, line)) => format!("{file}:{line}"),
            None => ":0".to_owned(),
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected errors were checked against klog v2.140.0 through pflag.
    #[test]
    fn go_flag_errors() {
        let mut b = GoFlagBool(true);
        assert_eq!(b.set("yes"), Err("parse error".to_owned()));
        b.set("F").unwrap();
        assert!(!b.0);
        let mut u = GoFlagUint64(1800);
        assert_eq!(u.set("x"), Err("parse error".to_owned()));
        assert_eq!(u.set("-1"), Err("parse error".to_owned()));
        assert_eq!(
            u.set("18446744073709551616"),
            Err("value out of range".to_owned())
        );
        u.set("0x10").unwrap();
        assert_eq!(u.0, 16);
    }

    #[test]
    fn level() {
        let mut l = LevelValue(4);
        l.set("2").unwrap();
        assert_eq!(l.0, 2);
        l.set("-1").unwrap();
        assert_eq!(l.0, -1);
        assert_eq!(
            l.set("x"),
            Err(r#"strconv.ParseInt: parsing "x": invalid syntax"#.to_owned())
        );
        assert!(l.set("0x2").is_err(), "klog levels are decimal only");
        assert!(
            l.set("2147483648")
                .unwrap_err()
                .ends_with("value out of range")
        );
    }

    #[test]
    fn severity() {
        let mut s = SeverityValue(Severity::ERROR);
        for (raw, want) in [
            ("info", 0),
            ("WARNING", 1),
            ("Error", 2),
            ("fatal", 3),
            ("2", 2),
            ("7", 7),
        ] {
            s.set(raw).unwrap();
            assert_eq!(s.0, Severity(want), "{raw}");
        }
        assert_eq!(s.render(), "7");
        assert_eq!(
            s.set("x"),
            Err(r#"strconv.ParseInt: parsing "x": invalid syntax"#.to_owned())
        );
        assert_eq!(Severity::WARNING.letter(), 'W');
        assert_eq!(Severity(9).name(), "FATAL");
    }

    #[test]
    fn vmodule() {
        let mut m = ModuleSpecValue::default();
        m.set("runtime=5,,tls*=3,zero=0").unwrap();
        assert_eq!(m.render(), "runtime=5,tls*=3");
        for bad in ["a", "a=x", "=1", "a=", "a=1=2"] {
            assert_eq!(m.set(bad), Err(VMODULE_SYNTAX.to_owned()), "{bad}");
        }
        assert_eq!(
            m.set("a=-1"),
            Err("negative value for vmodule level".to_owned())
        );
        m.set("").unwrap();
        assert!(m.0.is_empty());
    }

    #[test]
    fn trace_location() {
        let mut t = TraceLocationValue::default();
        assert_eq!(t.render(), ":0");
        // The rendered default does not parse back (klog behaves the same).
        assert_eq!(t.set(":0"), Err(TRACE_SYNTAX.to_owned()));
        t.set("runtime.rs:42").unwrap();
        assert_eq!(t.render(), "runtime.rs:42");
        assert_eq!(
            t.set("runtime.rs:0"),
            Err("negative or zero value for level".to_owned())
        );
        assert_eq!(t.set("runtime:1"), Err(TRACE_SYNTAX.to_owned()));
        assert_eq!(t.set("a.rs:x"), Err(TRACE_SYNTAX.to_owned()));
        t.set("").unwrap();
        assert_eq!(t.0, None);
    }
}
