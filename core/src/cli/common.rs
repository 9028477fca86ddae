//! What proxy-server's and proxy-agent's command lines have in common:
//! flags both register alike (`--enable-profiling`,
//! `--enable-contention-profiling`), the checks upstream's `Validate()`
//! functions repeat in both (file flags, cert/key pairs, `--lease-label`,
//! profiling, `--xfr-channel-size`), konn's own duration and count checks,
//! their one error type [`FlagError`], the `--server-id` / `--agent-id`
//! default, the health and admin [`Listener`]s both have, and the
//! [`Unsupported`] notice for flags konn accepts but cannot run yet.
//!
//! Each binary's error enum wraps [`FlagError`] and adds the rules only it
//! has (`--mode`, ports, strategies, …).

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use super::engine::EngineError;
use super::{FlagSet, GoDuration};

/// A flag value that a rule shared by both binaries refuses.
#[derive(Debug)]
pub enum FlagError {
    /// A file flag names a path that does not exist.
    FileMissing {
        /// The flag.
        flag: &'static str,
        /// The path given.
        path: String,
        /// The OS error.
        source: io::Error,
    },
    /// One of a cert/key pair is set, the other is not.
    IncompletePair {
        /// The flag that is set.
        set: &'static str,
        /// Its value.
        value: String,
        /// The flag that is missing.
        missing: &'static str,
    },
    /// `--enable-contention-profiling` without `--enable-profiling`.
    ContentionWithoutProfiling,
    /// `--xfr-channel-size` ≤ 0.
    ChannelSize(i64),
    /// A label selector (`--lease-label`) does not parse.
    InvalidLabels {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// A duration that must be positive is not (konn's check).
    NotPositive {
        /// The flag.
        flag: &'static str,
        /// The value.
        value: GoDuration,
    },
    /// A duration that must not be negative is.
    NegativeDuration {
        /// The flag.
        flag: &'static str,
        /// The value.
        value: GoDuration,
    },
    /// A count that must not be negative is (konn's check).
    NegativeCount {
        /// The flag.
        flag: &'static str,
        /// The value.
        value: i64,
    },
    /// One of konn's engine flags is out of range.
    Engine(EngineError),
}

impl fmt::Display for FlagError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::FileMissing { flag, path, source } => {
                write!(f, "--{flag}={path}: cannot use the file: {source}")
            }
            Self::IncompletePair {
                set,
                value,
                missing,
            } => write!(
                f,
                "--{missing} must be set when --{set} is set (--{set}={value:?})"
            ),
            Self::ContentionWithoutProfiling => {
                f.write_str("--enable-contention-profiling requires --enable-profiling")
            }
            Self::ChannelSize(n) => write!(f, "--xfr-channel-size must be greater than 0, not {n}"),
            Self::InvalidLabels { flag, problem } => write!(f, "--{flag}: {problem}"),
            Self::NotPositive { flag, value } => {
                write!(f, "--{flag} must be greater than 0, not {value}")
            }
            Self::NegativeDuration { flag, value } => {
                write!(f, "--{flag} must not be negative, not {value}")
            }
            Self::NegativeCount { flag, value } => {
                write!(f, "--{flag} must not be negative, not {value}")
            }
            Self::Engine(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for FlagError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::FileMissing { source, .. } => Some(source),
            Self::Engine(e) => Some(e),
            _ => None,
        }
    }
}

impl From<EngineError> for FlagError {
    fn from(e: EngineError) -> Self {
        Self::Engine(e)
    }
}

/// An HTTP listener (health, admin).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// Bind address; empty: all interfaces.
    pub bind_address: String,
    /// Port.
    pub port: u16,
}

/// A feature konn accepts on the command line but cannot run yet; the
/// binary logs each and refuses to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsupported {
    /// The flags that ask for it.
    pub flags: &'static str,
    /// What to tell the operator.
    pub message: &'static str,
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message)
    }
}

/// Registers `--enable-profiling` and `--enable-contention-profiling`
/// with these defaults (upstream's meaning; konn serves no pprof).
pub fn register_profiling(f: &mut FlagSet, enable: bool, contention: bool) {
    f.add_bool(
        "enable-profiling",
        enable,
        "Serve Go pprof on the admin port (upstream; konn has no pprof and logs a warning).",
    );
    f.add_bool(
        "enable-contention-profiling",
        contention,
        "Enable lock contention profiling (upstream; requires --enable-profiling).",
    );
}

/// The default of `--server-id` / `--agent-id`: `env(var)` when set and
/// not empty, else a random UUID (else `konn-<pid>` if the kernel gives no
/// random bytes).
pub fn default_id(env: &dyn Fn(&str) -> Option<String>, var: &str) -> String {
    env(var)
        .filter(|id| !id.is_empty())
        .or_else(super::random_uuid)
        .unwrap_or_else(|| format!("konn-{}", std::process::id()))
}

/// Upstream's `os.Stat` + `os.IsNotExist` check: only a missing file fails
/// (a permission problem shows up when the file is read). An empty path is
/// not checked.
///
/// # Errors
///
/// [`FlagError::FileMissing`].
pub fn check_exists(flag: &'static str, path: &str) -> Result<(), FlagError> {
    if path.is_empty() {
        return Ok(());
    }
    match std::fs::metadata(path) {
        Err(source) if source.kind() == io::ErrorKind::NotFound => Err(FlagError::FileMissing {
            flag,
            path: path.to_owned(),
            source,
        }),
        _ => Ok(()),
    }
}

/// When `set` (flag, value) is non-empty its file must exist and `other`
/// must be set too.
///
/// # Errors
///
/// [`FlagError::FileMissing`] or [`FlagError::IncompletePair`].
pub fn check_pair(set: (&'static str, &str), other: (&'static str, &str)) -> Result<(), FlagError> {
    if set.1.is_empty() {
        return Ok(());
    }
    check_exists(set.0, set.1)?;
    if other.1.is_empty() {
        return Err(FlagError::IncompletePair {
            set: set.0,
            value: set.1.to_owned(),
            missing: other.0,
        });
    }
    Ok(())
}

/// `--enable-contention-profiling` needs `--enable-profiling`.
///
/// # Errors
///
/// [`FlagError::ContentionWithoutProfiling`].
pub fn check_profiling(enable_profiling: bool, contention: bool) -> Result<(), FlagError> {
    if contention && !enable_profiling {
        return Err(FlagError::ContentionWithoutProfiling);
    }
    Ok(())
}

/// `--xfr-channel-size` must be greater than 0.
///
/// # Errors
///
/// [`FlagError::ChannelSize`].
pub fn channel_size(n: i64) -> Result<usize, FlagError> {
    match usize::try_from(n) {
        Ok(size) if size > 0 => Ok(size),
        _ => Err(FlagError::ChannelSize(n)),
    }
}

/// Upstream's `ParseLabels`: `k=v[,k=v...]`, each pair exactly one `=`,
/// keys and values trimmed; empty input is an error.
///
/// # Errors
///
/// [`FlagError::InvalidLabels`] saying what is wrong.
pub fn parse_labels(flag: &'static str, s: &str) -> Result<BTreeMap<String, String>, FlagError> {
    if s.is_empty() {
        return Err(FlagError::InvalidLabels {
            flag,
            problem: "must not be empty".to_owned(),
        });
    }
    let mut out = BTreeMap::new();
    for pair in s.split(',') {
        let parts: Vec<&str> = pair.split('=').collect();
        let [k, v] = parts[..] else {
            return Err(FlagError::InvalidLabels {
                flag,
                problem: format!("invalid label {pair:?}: want key=value"),
            });
        };
        out.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    Ok(out)
}

/// A duration that must be greater than 0.
///
/// # Errors
///
/// [`FlagError::NotPositive`].
pub fn positive(flag: &'static str, d: GoDuration) -> Result<Duration, FlagError> {
    match d.to_std() {
        Some(v) if !v.is_zero() => Ok(v),
        _ => Err(FlagError::NotPositive { flag, value: d }),
    }
}

/// A duration that must not be negative.
///
/// # Errors
///
/// [`FlagError::NegativeDuration`].
pub fn non_negative(flag: &'static str, d: GoDuration) -> Result<Duration, FlagError> {
    d.to_std()
        .ok_or(FlagError::NegativeDuration { flag, value: d })
}

/// A count that must not be negative.
///
/// # Errors
///
/// [`FlagError::NegativeCount`].
pub fn count(flag: &'static str, value: i64) -> Result<usize, FlagError> {
    usize::try_from(value).map_err(|_| FlagError::NegativeCount { flag, value })
}

/// A path flag: empty means not set.
pub fn non_empty_path(s: &str) -> Option<PathBuf> {
    (!s.is_empty()).then(|| PathBuf::from(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_parse_like_upstream() {
        let l = parse_labels("lease-label", " a = 1 ,b=2").unwrap();
        assert_eq!(l.get("a").map(String::as_str), Some("1"));
        assert_eq!(l.get("b").map(String::as_str), Some("2"));
        for bad in ["", "a", "a=1=2", "a=1,"] {
            let e = parse_labels("lease-label", bad).unwrap_err();
            assert!(matches!(e, FlagError::InvalidLabels { .. }), "{bad}: {e}");
        }
    }

    #[test]
    fn missing_files_and_pairs() {
        assert!(check_exists("f", "").is_ok());
        let missing = "/nonexistent/konn/validate.pem";
        let e = check_exists("f", missing).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("--f=/nonexistent/konn/validate.pem: cannot use the file"),
            "{e}"
        );
        assert!(check_pair(("key", ""), ("cert", "")).is_ok());
        let e = check_pair(("key", "/"), ("cert", "")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--cert must be set when --key is set (--key=\"/\")"
        );
    }

    #[test]
    fn numbers_and_durations() {
        assert_eq!(channel_size(1).unwrap(), 1);
        assert!(matches!(channel_size(0), Err(FlagError::ChannelSize(0))));
        assert!(matches!(channel_size(-1), Err(FlagError::ChannelSize(-1))));
        assert_eq!(count("n", 0).unwrap(), 0);
        assert!(count("n", -1).is_err());
        assert!(positive("d", GoDuration::ZERO).is_err());
        assert!(positive("d", GoDuration::from_secs(-1)).is_err());
        assert_eq!(
            positive("d", GoDuration::from_secs(2)).unwrap(),
            Duration::from_secs(2)
        );
        assert_eq!(non_negative("d", GoDuration::ZERO).unwrap(), Duration::ZERO);
        let e = non_negative("d", GoDuration::from_secs(-1)).unwrap_err();
        assert_eq!(e.to_string(), "--d must not be negative, not -1s");
        assert!(check_profiling(false, true).is_err());
        assert!(check_profiling(true, true).is_ok());
    }

    #[test]
    fn ids_come_from_the_environment_else_a_uuid() {
        let env = |k: &str| (k == "ID").then(|| "from-env".to_owned());
        assert_eq!(default_id(&env, "ID"), "from-env");
        let empty = |_: &str| Some(String::new());
        assert_eq!(default_id(&empty, "ID").len(), 36);
    }
}
