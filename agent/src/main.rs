//! proxy-agent: parses upstream's flags, sets up klog-style logging and
//! validates the options (the start-up sequence of `konn_core::app`),
//! starts the agent and handles shutdown signals as
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
use konn_core::app;
use konn_core::io::signals::wait_shutdown_signal;
use konn_core::log::tracing;

konn_core::mimalloc_global_allocator!();

fn main() -> ExitCode {
    let opts: AgentOptions = match app::start(options::command(), options::PROGRAM, "agent") {
        Ok(opts) => opts,
        Err(code) => return code,
    };
    let settings = match AgentSettings::from_options(&opts) {
        Ok(s) => s,
        Err(err) => {
            tracing::error!("cannot run the agent: {err}");
            return ExitCode::FAILURE;
        }
    };
    let tls = settings.connect.tls.clone();
    let agent = match run::start(settings) {
        Ok(agent) => agent,
        Err(err) => {
            tracing::error!("failed to start the agent: {err}");
            return ExitCode::FAILURE;
        }
    };
    // Certificate and CA reload (docs/decisions/0004-certificate-reload.md).
    let _watcher = match (tls, opts.engine.tls_reload_interval) {
        (Some(tls), Some(interval)) => {
            let metrics = agent.metrics().clone();
            match tls.watch("tunnel", interval, move |ok| {
                metrics.tls_reload("tunnel", ok)
            }) {
                Ok(w) => w,
                Err(err) => {
                    tracing::error!("cannot start the certificate watcher: {err}");
                    return ExitCode::FAILURE;
                }
            }
        }
        _ => None,
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
