//! The start-up sequence both binaries share, up to validated options.
//! Before it, on hosts where glibc's `memcpy` is slow, the binary executes
//! itself again with the tunable that fixes it ([`crate::memcpy`]); then:
//!
//! 0. make any panic end the process after its message is printed, in
//!    every build ([`abort_on_panic`]);
//! 1. block SIGTERM and SIGINT, first, so every thread started later
//!    (logging, workers) inherits the mask and only the main thread takes
//!    them (`io::signals`);
//! 2. parse the command line (`--help` prints and exits 0, a bad flag
//!    prints pflag's error and exits 1);
//! 3. set up klog-style logging from the klog flags, warn about positional
//!    arguments (upstream ignores them too), log the flags;
//! 4. validate the options ([`Options::from_flags`]), log their warnings,
//!    and refuse features konn cannot run yet ([`Options::unsupported_features`]).
//!
//! Each binary's `main` then builds its settings, starts, and handles the
//! signals its upstream way (the agent drains on the first and exits on the
//! second; the server shuts down gracefully on the first and exits on the
//! second).

use std::fmt;
use std::process::ExitCode;

use crate::cli::common::{FlagError, Unsupported};
use crate::cli::engine::EngineFlags;
use crate::cli::{Command, FlagSet};
use crate::io::signals::block_shutdown_signals;
use crate::log::{self, LogConfig};

/// A binary's validated options, as the start-up sequence needs them.
pub trait Options: Sized {
    /// Why the flags are refused.
    type Error: fmt::Display + From<FlagError>;

    /// Validates the parsed command line; `engine` holds konn's engine
    /// flags, already read and range-checked.
    ///
    /// # Errors
    ///
    /// The first invalid value.
    fn validate(flags: &FlagSet, engine: EngineFlags) -> Result<Self, Self::Error>;

    /// Things accepted with a caveat; each is logged as a warning.
    fn warnings(&self) -> &[String];

    /// Features the flags ask for that konn cannot run yet; the start is
    /// refused when this is not empty.
    fn unsupported_features(&self) -> Vec<Unsupported>;

    /// Reads and validates every flag of the parsed command line: konn's
    /// engine flags, then [`validate`](Self::validate).
    ///
    /// # Errors
    ///
    /// The first invalid value.
    fn from_flags(flags: &FlagSet) -> Result<Self, Self::Error> {
        let engine = EngineFlags::from_flags(flags).map_err(FlagError::from)?;
        Self::validate(flags, engine)
    }
}

/// Steps 1–4 of the module docs for `cmd`, whose binary is `program` and
/// whose options are `O` (`role` names them in the validation error line:
/// "failed to validate {role} options").
///
/// # Errors
///
/// The exit code when the binary must not go on (the reason has been
/// printed or logged).
pub fn start<O: Options>(mut cmd: Command, program: &str, role: &str) -> Result<O, ExitCode> {
    crate::memcpy::use_vector_copies();
    abort_on_panic();
    if let Err(err) = block_shutdown_signals() {
        eprintln!("Error: cannot block SIGTERM/SIGINT: {err}");
        return Err(ExitCode::FAILURE);
    }
    let positional = cmd.parse_or_exit(std::env::args_os().skip(1));
    let flags = cmd.flags();

    if let Err(err) = log::init(&LogConfig::from_flags(flags), program) {
        eprintln!("Error: {err}");
        return Err(ExitCode::FAILURE);
    }
    if !positional.is_empty() {
        tracing::warn!(
            ?positional,
            "ignoring positional arguments (upstream ignores them too)"
        );
    }
    tracing::info!("flags: {}", flags.summary());
    if let Some(line) = crate::memcpy::outcome() {
        tracing::info!("{line}");
    }

    let opts = O::from_flags(flags).map_err(|err| {
        tracing::error!("failed to validate {role} options: {err}");
        ExitCode::FAILURE
    })?;
    for warning in opts.warnings() {
        tracing::warn!("{warning}");
    }
    let unsupported = opts.unsupported_features();
    if !unsupported.is_empty() {
        for feature in &unsupported {
            tracing::error!(flags = feature.flags, "{feature}");
        }
        return Err(ExitCode::FAILURE);
    }
    Ok(opts)
}

/// Makes a panic on any thread end the process (after the default hook
/// printed its message and location), as the release profile's
/// `panic = "abort"` does, in debug builds too. Without it a panicking
/// worker thread of a debug build ended alone: the process lived on with
/// that core's listeners and connections dead, serving nothing on them and
/// telling no one — a hang to every test and supervisor, where an exit is
/// seen at once and restarted.
pub fn abort_on_panic() {
    let print = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        log::flush();
        print(info);
        std::process::abort();
    }));
}
