//! klog-compatible logging for both binaries: klog's flags, klog's line
//! format, on top of `tracing`.
//!
//! Upstream's binaries log through klog and accept its flags (registered
//! with `_` turned into `-`, so `--log-dir`, not `--log_dir`), with `-v`
//! defaulting to 4. konn accepts the same flags with the same syntax and
//! defaults ([`LogConfig::register`]) and honours them:
//!
//! - `-v`/`--v` and `--vmodule` select `tracing` levels (table below);
//! - `--logtostderr`, `--alsologtostderr`, `--stderrthreshold`,
//!   `--alsologtostderrthreshold`, `--legacy-stderr-threshold-behavior`,
//!   `--log-file` (appended to), `--log-dir`, `--log-file-max-size`,
//!   `--one-output`, `--skip-log-headers` route lines as klog does (see
//!   "Where lines go" below);
//! - `--skip-headers` drops the `I1121 23:40:15.123456 ...]` prefix,
//!   `--add-dir-header` shows the source path instead of its file name;
//! - `--log-backtrace-at=file.rs:N` appends a stack trace to lines logged
//!   from that source line.
//!
//! Lines look like klog's: `I1121 23:40:15.123456   12345
//! runtime.rs:123] message key="value"`, local time, process id.
//!
//! # Verbosity
//!
//! | tracing level | klog line | logged when                  | konn uses it for |
//! |---------------|-----------|------------------------------|------------------|
//! | `ERROR`       | `E`       | always                       | failures |
//! | `WARN`        | `W`       | always                       | degraded operation |
//! | `INFO`        | `I`       | always (klog `V(0)`–`V(1)`)  | start-up, configuration, rare events |
//! | `DEBUG`       | `I`       | `-v` ≥ 2 (`V(2)`–`V(3)`)     | tunnel and agent lifecycle |
//! | `TRACE`       | `I`       | `-v` ≥ 4 (`V(4)`+)           | per-connection events (dial, close) |
//!
//! Upstream's default `-v=4` therefore shows everything konn logs. That is
//! cheap because konn never logs per packet or per read/write (upstream logs
//! every DATA packet at `V(4)`, which is why its operators lower `-v`).
//! [`level_for_verbosity`] is the mapping.
//!
//! `--vmodule=pattern=N,...` overrides `-v` for the code it matches. The
//! match is coarse compared with klog's (Go file names): a pattern is a
//! glob (`*`, `?`, `[a-z]`, `\` escapes) matched against the source file
//! name without `.rs` (`runtime`), the last segment of the module path
//! (`runtime` for `konn_core::io::runtime`, which also covers `mod.rs`
//! files) or the whole module path. The first matching entry wins.
//!
//! # Where lines go
//!
//! - `--logtostderr` (default true): everything to stderr; with
//!   `--legacy-stderr-threshold-behavior=false` only lines at or above
//!   `--stderrthreshold`. No files.
//! - Otherwise to files, and to stderr from `--stderrthreshold` (or, with
//!   `--alsologtostderr`, from `--alsologtostderrthreshold`): `--log-file`
//!   (appended to, restarted at `--log-file-max-size` MB), else one file per
//!   severity in `--log-dir` (klog's names and symlinks; the temporary
//!   directory as fallback). Each line is one `write`, so lines from
//!   different threads never interleave.
//! - Unlike klog, a failed log write does not stop the process: the line is
//!   dropped and the first failure per file is reported on stderr.
//!
//! # Payloads and credentials
//!
//! **Never log payloads or credentials.** No event may carry proxied bytes,
//! bearer tokens (`--service-account-token-path` contents, the
//! `authorization` header), private keys or kubeconfig contents — not even
//! at `TRACE`. Log sizes, ids and addresses instead. Upstream logs packet
//! contents at high verbosity; konn does not, at any verbosity.
//!
//! [`init`] installs the subscriber process-wide; [`subscriber`] builds one
//! for tests and tools.

mod filter;
mod flags;
mod format;
mod output;

use std::cell::{Cell, RefCell};
use std::fmt;
use std::io;

use tracing::span;
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};
use tracing_subscriber::registry::{LookupSpan, Registry};

pub use filter::level_for_verbosity;
pub use flags::{
    GoFlagBool, GoFlagString, GoFlagUint64, LevelValue, ModulePattern, ModuleSpecValue, Severity,
    SeverityValue, TraceLocationValue,
};
pub use format::{GoDuration, push_i64, push_rfc3339_utc, push_u64};
/// The `tracing` crate konn logs through, re-exported so crates without
/// their own `tracing` dependency (the binaries, for now) log with the very
/// version the subscriber was built for: `konn_core::log::tracing::info!`.
pub use tracing;

use crate::cli::FlagSet;
use filter::Filter;
use format::{FieldWriter, Stamp};
use output::{Identity, Output, Routing};

/// Upstream's default verbosity (`local.Set("v", "4")` in both `main.go`).
pub const DEFAULT_VERBOSITY: i32 = 4;

/// The klog flags' values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// `-v`/`--v`.
    pub verbosity: i32,
    /// `--vmodule`.
    pub vmodule: Vec<ModulePattern>,
    /// `--logtostderr`.
    pub log_to_stderr: bool,
    /// `--alsologtostderr`.
    pub also_log_to_stderr: bool,
    /// `--legacy-stderr-threshold-behavior`.
    pub legacy_stderr_threshold_behavior: bool,
    /// `--stderrthreshold`.
    pub stderr_threshold: Severity,
    /// `--alsologtostderrthreshold`.
    pub also_log_to_stderr_threshold: Severity,
    /// `--log-dir`.
    pub log_dir: String,
    /// `--log-file`.
    pub log_file: String,
    /// `--log-file-max-size`, in MB (0: unlimited).
    pub log_file_max_size_mb: u64,
    /// `--one-output`.
    pub one_output: bool,
    /// `--skip-headers`.
    pub skip_headers: bool,
    /// `--skip-log-headers`.
    pub skip_log_headers: bool,
    /// `--add-dir-header`.
    pub add_dir_header: bool,
    /// `--log-backtrace-at`.
    pub backtrace_at: Option<(String, u32)>,
}

impl Default for LogConfig {
    /// Upstream's defaults.
    fn default() -> Self {
        Self {
            verbosity: DEFAULT_VERBOSITY,
            vmodule: Vec::new(),
            log_to_stderr: true,
            also_log_to_stderr: false,
            legacy_stderr_threshold_behavior: true,
            stderr_threshold: Severity::ERROR,
            also_log_to_stderr_threshold: Severity::INFO,
            log_dir: String::new(),
            log_file: String::new(),
            log_file_max_size_mb: 1800,
            one_output: false,
            skip_headers: false,
            skip_log_headers: false,
            add_dir_header: false,
            backtrace_at: None,
        }
    }
}

impl LogConfig {
    /// Adds klog's flags to `flags` with upstream's names, types and
    /// defaults (`-v` also as a one-letter flag, as pflag does for Go
    /// flags with one-letter names).
    pub fn register(flags: &mut FlagSet) {
        let d = Self::default();
        flags.add(
            "log-dir",
            "Write log files into this directory (ignored while --logtostderr=true; falls back to \
             the temporary directory).",
            GoFlagString(d.log_dir),
        );
        flags.add(
            "log-file",
            "Append all log lines to this file (ignored while --logtostderr=true).",
            GoFlagString(d.log_file),
        );
        flags.add(
            "log-file-max-size",
            "Restart the --log-file file when it reaches this many megabytes; 0 means no limit \
             (ignored while --logtostderr=true).",
            GoFlagUint64(d.log_file_max_size_mb),
        );
        flags.add(
            "logtostderr",
            "Send log lines to stderr only, never to files.",
            GoFlagBool(d.log_to_stderr),
        );
        flags.add(
            "alsologtostderr",
            "With --logtostderr=false, copy log lines to stderr too (see \
             --alsologtostderrthreshold).",
            GoFlagBool(d.also_log_to_stderr),
        );
        flags.add(
            "legacy-stderr-threshold-behavior",
            "While true, --stderrthreshold has no effect when --logtostderr=true; set it to false \
             to filter stderr by --stderrthreshold there too.",
            GoFlagBool(d.legacy_stderr_threshold_behavior),
        );
        flags.add(
            "v",
            "Log verbosity: 0-1 info, 2-3 adds debug, 4 and above adds trace. konn logs nothing \
             per packet, so the default is cheap.",
            LevelValue(d.verbosity),
        );
        flags.set_shorthand("v", 'v');
        flags.add(
            "add-dir-header",
            "Show the source file's path, not only its name, in line headers.",
            GoFlagBool(d.add_dir_header),
        );
        flags.add(
            "skip-headers",
            "Leave out the severity, time, pid and file:line prefix of log lines.",
            GoFlagBool(d.skip_headers),
        );
        flags.add(
            "one-output",
            "Write each line only to its own severity's log file, not also to the files of lower \
             severities (ignored while --logtostderr=true).",
            GoFlagBool(d.one_output),
        );
        flags.add(
            "skip-log-headers",
            "Do not start new log files with the descriptive header (ignored while \
             --logtostderr=true).",
            GoFlagBool(d.skip_log_headers),
        );
        flags.add(
            "stderrthreshold",
            "Severity (INFO, WARNING, ERROR, FATAL or 0-3) from which lines also go to stderr \
             while logging to files; with --logtostderr=true only when \
             --legacy-stderr-threshold-behavior=false.",
            SeverityValue(d.stderr_threshold),
        );
        flags.add(
            "alsologtostderrthreshold",
            "Severity from which lines are copied to stderr when --alsologtostderr=true.",
            SeverityValue(d.also_log_to_stderr_threshold),
        );
        flags.add(
            "vmodule",
            "Per-code verbosity overrides, pattern=N[,pattern=N...]; each glob is matched against \
             the source file name without .rs and against the module path.",
            ModuleSpecValue(d.vmodule),
        );
        flags.add(
            "log-backtrace-at",
            "Append a stack trace to lines logged at source line file:N (for example \
             runtime.rs:120).",
            TraceLocationValue(d.backtrace_at),
        );
    }

    /// Reads the flags added by [`register`](Self::register).
    pub fn from_flags(flags: &FlagSet) -> Self {
        let b = |name: &str| flags.value::<GoFlagBool>(name).0;
        let s = |name: &str| flags.value::<GoFlagString>(name).0.clone();
        Self {
            verbosity: flags.value::<LevelValue>("v").0,
            vmodule: flags.value::<ModuleSpecValue>("vmodule").0.clone(),
            log_to_stderr: b("logtostderr"),
            also_log_to_stderr: b("alsologtostderr"),
            legacy_stderr_threshold_behavior: b("legacy-stderr-threshold-behavior"),
            stderr_threshold: flags.value::<SeverityValue>("stderrthreshold").0,
            also_log_to_stderr_threshold: flags
                .value::<SeverityValue>("alsologtostderrthreshold")
                .0,
            log_dir: s("log-dir"),
            log_file: s("log-file"),
            log_file_max_size_mb: flags.value::<GoFlagUint64>("log-file-max-size").0,
            one_output: b("one-output"),
            skip_headers: b("skip-headers"),
            skip_log_headers: b("skip-log-headers"),
            add_dir_header: b("add-dir-header"),
            backtrace_at: flags
                .value::<TraceLocationValue>("log-backtrace-at")
                .0
                .clone(),
        }
    }
}

/// Logging could not be set up.
#[derive(Debug)]
pub enum LogError {
    /// A log file could not be created or opened.
    Open {
        /// `--log-file` or `--log-dir`, as given.
        what: String,
        /// The OS error.
        source: io::Error,
    },
    /// A global subscriber was installed already.
    AlreadyInitialized,
}

impl fmt::Display for LogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Open { what, source } => {
                write!(f, "log: cannot create log file ({what}): {source}")
            }
            Self::AlreadyInitialized => f.write_str("log: logging was initialised twice"),
        }
    }
}

impl std::error::Error for LogError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Open { source, .. } => Some(source),
            Self::AlreadyInitialized => None,
        }
    }
}

/// The program name klog uses: the base name of `argv[0]`, else `fallback`.
fn program_name(fallback: &str) -> String {
    std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| fallback.to_owned())
}

/// Builds a subscriber for `config` without installing it. `program` names
/// log files when argv\[0\] is unavailable.
///
/// # Errors
///
/// [`LogError::Open`] when the log file (file mode) cannot be opened.
pub fn subscriber(
    config: &LogConfig,
    program: &str,
) -> Result<impl Subscriber + Send + Sync + 'static, LogError> {
    Ok(Registry::default().with(KlogLayer::new(config, program)?))
}

/// Installs the klog-style subscriber for the whole process.
///
/// # Errors
///
/// [`LogError::Open`] when a log file cannot be opened,
/// [`LogError::AlreadyInitialized`] on a second call.
pub fn init(config: &LogConfig, program: &str) -> Result<(), LogError> {
    let sub = subscriber(config, program)?;
    tracing::subscriber::set_global_default(sub).map_err(|_| LogError::AlreadyInitialized)
}

/// Writes the log lines still waiting to be written to stderr (INFO lines
/// are gathered for a few milliseconds: `output`'s module docs). Call it
/// before the process exits.
pub fn flush() {
    output::flush();
}

thread_local! {
    /// Spans this thread is inside (entered through a [`KlogLayer`] and not
    /// yet left). While none is, a line needs no span lookup.
    static ENTERED: Cell<u32> = const { Cell::new(0) };
    /// The fields every line of this thread carries ([`ThreadFields`]).
    static THREAD_FIELDS: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Fields that every line logged on this thread carries after its own and
/// before its spans' (a worker's `index=0`), in klog's `key=value` form,
/// until the guard is dropped (the previous ones come back then).
///
/// A worker's identity is a property of its thread, so it is kept here
/// rather than in a span the thread stays inside: with no span entered, a
/// line skips the span registry's lookups (a sixth of a line's cost).
#[must_use = "the fields are removed when the guard is dropped"]
pub struct ThreadFields {
    previous: String,
}

impl ThreadFields {
    /// Sets this thread's fields to `fields` (`index=0`).
    pub fn set(fields: impl Into<String>) -> Self {
        let previous = THREAD_FIELDS
            .try_with(|t| t.replace(fields.into()))
            .unwrap_or_default();
        Self { previous }
    }
}

impl Drop for ThreadFields {
    fn drop(&mut self) {
        let previous = std::mem::take(&mut self.previous);
        let _ = THREAD_FIELDS.try_with(|t| t.replace(previous));
    }
}

impl fmt::Debug for ThreadFields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadFields").finish_non_exhaustive()
    }
}

/// The `tracing` layer that filters, formats and writes klog lines.
#[derive(Debug)]
struct KlogLayer {
    filter: Filter,
    output: Output,
    pid: u32,
    skip_headers: bool,
    add_dir_header: bool,
    backtrace_at: Option<(String, u32)>,
}

/// A span's fields, formatted once when the span is created.
struct SpanFields(String);

impl KlogLayer {
    fn new(config: &LogConfig, program: &str) -> Result<Self, LogError> {
        let identity = Identity {
            program: program_name(program),
            host: output::short_hostname(),
            user: output::user_name(),
            pid: std::process::id(),
        };
        let routing = Routing {
            to_stderr: config.log_to_stderr,
            also_to_stderr: config.also_log_to_stderr,
            legacy_stderr_threshold: config.legacy_stderr_threshold_behavior,
            stderr_threshold: config.stderr_threshold,
            also_to_stderr_threshold: config.also_log_to_stderr_threshold,
            one_output: config.one_output,
            skip_log_headers: config.skip_log_headers,
        };
        let output = Output::new(
            routing,
            identity,
            &config.log_file,
            &config.log_dir,
            config.log_file_max_size_mb,
        )
        .map_err(|source| LogError::Open {
            what: if config.log_file.is_empty() {
                format!("--log-dir={}", config.log_dir)
            } else {
                format!("--log-file={}", config.log_file)
            },
            source,
        })?;
        Ok(Self {
            filter: Filter::new(config.verbosity, config.vmodule.clone()),
            output,
            pid: std::process::id(),
            skip_headers: config.skip_headers,
            add_dir_header: config.add_dir_header,
            backtrace_at: config.backtrace_at.clone(),
        })
    }

    fn severity(meta: &Metadata<'_>) -> Severity {
        match *meta.level() {
            tracing::Level::ERROR => Severity::ERROR,
            tracing::Level::WARN => Severity::WARNING,
            _ => Severity::INFO,
        }
    }

    fn wants_backtrace(&self, meta: &Metadata<'_>) -> bool {
        let Some((file, line)) = &self.backtrace_at else {
            return false;
        };
        meta.line() == Some(*line) && format::display_file(meta.file(), false) == file
    }
}

impl<S> Layer<S> for KlogLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if self.filter.enabled(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _ctx: Context<'_, S>) -> bool {
        self.filter.enabled(meta)
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(self.filter.max_level())
    }

    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let mut w = FieldWriter::default();
        attrs.record(&mut w);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(w.fields));
        }
    }

    fn on_enter(&self, _id: &span::Id, _ctx: Context<'_, S>) {
        let _ = ENTERED.try_with(|e| e.set(e.get().saturating_add(1)));
    }

    fn on_exit(&self, _id: &span::Id, _ctx: Context<'_, S>) {
        let _ = ENTERED.try_with(|e| e.set(e.get().saturating_sub(1)));
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        let mut w = FieldWriter::default();
        values.record(&mut w);
        let mut ext = span.extensions_mut();
        match ext.get_mut::<SpanFields>() {
            Some(SpanFields(existing)) => {
                if !existing.is_empty() && !w.fields.is_empty() {
                    existing.push(' ');
                }
                existing.push_str(&w.fields);
            }
            None => ext.insert(SpanFields(w.fields)),
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        FieldWriter::with(|w| self.write_event(w, event, &ctx));
    }
}

impl KlogLayer {
    /// Formats and writes one event with the thread's reused buffers.
    fn write_event<S>(&self, w: &mut FieldWriter, event: &Event<'_>, ctx: &Context<'_, S>)
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let meta = event.metadata();
        let severity = Self::severity(meta);
        event.record(w);
        let mut line = std::mem::take(&mut w.line);
        if !self.skip_headers {
            format::write_header(
                &mut line,
                severity,
                &Stamp::now(),
                self.pid,
                format::display_file(meta.file(), self.add_dir_header),
                meta.line().unwrap_or(1),
            );
        }
        line.push_str(&w.message);
        let mut push_fields = |fields: &str| {
            if fields.is_empty() {
                return;
            }
            if !line.is_empty() && !line.ends_with(' ') {
                line.push(' ');
            }
            line.push_str(fields);
        };
        push_fields(&w.fields);
        let _ = THREAD_FIELDS.try_with(|t| {
            if let Ok(t) = t.try_borrow() {
                push_fields(&t);
            }
        });
        // A contextual event's spans are the ones this thread is inside;
        // with none entered there is nothing to look up.
        let in_span = ENTERED.try_with(Cell::get).map_or(true, |n| n > 0);
        if (in_span || !event.is_contextual())
            && let Some(scope) = ctx.event_scope(event)
        {
            for span in scope.from_root() {
                if let Some(SpanFields(fields)) = span.extensions().get::<SpanFields>() {
                    push_fields(fields);
                }
            }
        }
        if !line.ends_with('\n') {
            line.push('\n');
        }
        if self.wants_backtrace(meta) {
            line.push_str(&std::backtrace::Backtrace::force_capture().to_string());
            if !line.ends_with('\n') {
                line.push('\n');
            }
        }
        self.output.write(severity, line.as_bytes());
        w.line = line;
    }
}

#[cfg(test)]
mod tests;
