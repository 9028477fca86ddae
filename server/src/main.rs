//! proxy-server: parses upstream's flags, sets up klog-style logging and
//! validates the options. The runtime is not built yet, so after a
//! successful check it says so and exits 1 rather than pretend to work.
//!
//! Exit codes: 0 for `--help`; 1 for bad flags, invalid options, features
//! konn does not support yet, and (for now) every start.

use std::process::ExitCode;

use konn_core::log::{LogConfig, tracing};
use konn_server::options::{self, ServerOptions};

fn main() -> ExitCode {
    let mut cmd = options::command();
    let positional = cmd.parse_or_exit(std::env::args_os().skip(1));
    let flags = cmd.flags();

    let log = LogConfig::from_flags(flags);
    if let Err(err) = konn_core::log::init(&log, options::PROGRAM) {
        eprintln!("Error: {err}");
        return ExitCode::FAILURE;
    }
    if !positional.is_empty() {
        tracing::warn!(
            ?positional,
            "ignoring positional arguments (upstream ignores them too)"
        );
    }
    tracing::info!("flags: {}", flags.summary());

    let opts = match ServerOptions::from_flags(flags) {
        Ok(opts) => opts,
        Err(err) => {
            tracing::error!("failed to validate server options: {err}");
            return ExitCode::FAILURE;
        }
    };
    for warning in &opts.warnings {
        tracing::warn!("{warning}");
    }
    let unsupported = opts.unsupported_features();
    if !unsupported.is_empty() {
        for feature in &unsupported {
            tracing::error!(flags = feature.flags, "{feature}");
        }
        return ExitCode::FAILURE;
    }
    tracing::error!(
        "proxy-server: the options are valid, but the server runtime is not implemented yet in this build of konn"
    );
    ExitCode::FAILURE
}
