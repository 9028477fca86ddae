//! proxy-agent: parses upstream's flags, sets up klog-style logging and
//! validates the options (the start-up sequence of `konn_core::app`),
//! starts the agent and handles shutdown signals as
//! upstream does: the first SIGTERM/SIGINT drains (DRAIN to every server,
//! no new server connections, tunnels keep serving), the second exits.
//! With konn's `--drain-timeout` the agent also exits by itself once no
//! destination connection is open or the timeout has passed.
//!
//! Signals are blocked before any thread starts and taken with `sigwait`
//! on this thread, so no worker is ever interrupted.
//!
//! Exit codes: 0 for `--help`, after the second signal and after a drain; 1 for bad
//! flags, invalid options, features konn does not support, settings that
//! cannot work (no CA, unreadable certificates) and start-up failures
//! (a port in use, no io engine).

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use konn_agent::options::{self, AgentOptions};
use konn_agent::run;
use konn_agent::settings::AgentSettings;
use konn_core::app;
use konn_core::io::signals::wait_shutdown_signal;
use konn_core::log::tracing;

konn_core::mimalloc_global_allocator!();

fn main() -> ExitCode {
    let code = serve_until_stopped();
    // INFO lines are gathered for a few milliseconds before they are
    // written: write the last of them.
    konn_core::log::flush();
    code
}

fn serve_until_stopped() -> ExitCode {
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
            match opts.drain_timeout {
                Some(timeout) => drain(&agent, timeout),
                None => match wait_shutdown_signal() {
                    Ok(signal) => tracing::info!(?signal, "received second signal; shutting down"),
                    Err(err) => tracing::error!("waiting for signals failed: {err}; shutting down"),
                },
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

/// `--drain-timeout`: the agent has sent DRAIN; keep serving until no
/// connection is open (after a short grace for dials already on their way)
/// or `timeout` has passed, or a second signal arrives, whichever is first.
fn drain(agent: &run::AgentHandle, timeout: Duration) {
    /// Dials the servers sent before they saw DRAIN still arrive meanwhile.
    const GRACE: Duration = Duration::from_secs(1);
    /// How often the open connections are counted.
    const POLL: Duration = Duration::from_millis(100);
    let second = Arc::new(AtomicBool::new(false));
    let flag = second.clone();
    // Ends with the process; it only waits for a signal.
    let spawned = std::thread::Builder::new()
        .name("second-signal".into())
        .spawn(move || {
            if wait_shutdown_signal().is_ok() {
                flag.store(true, Ordering::Release);
            }
        });
    if let Err(err) = spawned {
        tracing::error!("cannot wait for a second signal: {err}");
    }
    let started = konn_core::io::clock::now();
    tracing::info!(timeout = %konn_core::log::GoDuration(timeout), open = agent.metrics().open_endpoints(), "draining: serving open connections until they end");
    loop {
        let elapsed = started.elapsed();
        if second.load(Ordering::Acquire) {
            tracing::info!("received second signal; shutting down");
            return;
        }
        let open = agent.metrics().open_endpoints();
        if open <= 0.0 && elapsed >= GRACE {
            tracing::info!(after = %konn_core::log::GoDuration(elapsed), "drained: no connection open; shutting down");
            return;
        }
        if elapsed >= timeout {
            tracing::warn!(
                open,
                "--drain-timeout passed with connections open; shutting down"
            );
            return;
        }
        std::thread::sleep(POLL.min(timeout - elapsed));
    }
}
