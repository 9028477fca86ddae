//! proxy-agent: parses upstream's flags, sets up klog-style logging,
//! validates the options, starts the agent and handles shutdown signals as
//! upstream does: the first SIGTERM/SIGINT drains (DRAIN to every server,
//! no new server connections, tunnels keep serving), the second exits.
//!
//! Signals are blocked before any thread starts and taken with `sigwait`
//! on this thread, so no worker is ever interrupted.
//!
//! Exit codes: 0 for `--help` and after the second signal; 1 for bad
//! flags, invalid options, features konn does not support, settings that
//! cannot work (no CA, unreadable certificates) and start-up failures
//! (a port in use, no io engine).

use std::process::ExitCode;

use konn_agent::options::{self, AgentOptions};
use konn_agent::run;
use konn_agent::settings::AgentSettings;
use konn_core::io::signals::{block_shutdown_signals, wait_shutdown_signal};
use konn_core::log::{LogConfig, tracing};

konn_core::mimalloc_global_allocator!();

fn main() -> ExitCode {
    // First, so every thread started later (logging, workers) inherits it.
    if let Err(err) = block_shutdown_signals() {
        eprintln!("Error: cannot block SIGTERM/SIGINT: {err}");
        return ExitCode::FAILURE;
    }
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

    let opts = match AgentOptions::from_flags(flags) {
        Ok(opts) => opts,
        Err(err) => {
            tracing::error!("failed to validate agent options: {err}");
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
    let settings = match AgentSettings::from_options(&opts) {
        Ok(s) => s,
        Err(err) => {
            tracing::error!("cannot run the agent: {err}");
            return ExitCode::FAILURE;
        }
    };
    let agent = match run::start(settings) {
        Ok(agent) => agent,
        Err(err) => {
            tracing::error!("failed to start the agent: {err}");
            return ExitCode::FAILURE;
        }
    };

    match wait_shutdown_signal() {
        Ok(signal) => {
            tracing::info!(?signal, "received first signal; draining");
            agent.drain();
            match wait_shutdown_signal() {
                Ok(signal) => tracing::info!(?signal, "received second signal; shutting down"),
                Err(err) => tracing::error!("waiting for signals failed: {err}; shutting down"),
            }
        }
        Err(err) => tracing::error!("waiting for signals failed: {err}; shutting down"),
    }
    if let Err(err) = agent.stop() {
        tracing::error!("agent stopped with an error: {err}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
