//! proxy-server: parses upstream's flags, sets up klog-style logging and
//! validates the options (the start-up sequence of `konn_core::app`),
//! binds every listener and serves until SIGTERM or SIGINT.
//!
//! Shutdown follows upstream: the first signal stops accepting, sends
//! GOAWAY and waits up to `--graceful-shutdown-timeout` for the frontends
//! to finish (0 = stop at once); a second signal exits 1 immediately.
//!
//! Exit codes: 0 for `--help` and after a shutdown; 1 for bad flags,
//! invalid options, unreadable certificates, listeners that cannot bind,
//! features konn does not support, and a second signal.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use konn_core::app;
use konn_core::io::signals;
use konn_core::log::tracing;
use konn_server::options::{self, ServerOptions};
use konn_server::serve;
use konn_server::settings::ServerSettings;

konn_core::mimalloc_global_allocator!();

fn main() -> ExitCode {
    let opts: ServerOptions = match app::start(options::command(), options::PROGRAM, "server") {
        Ok(opts) => opts,
        Err(code) => return code,
    };
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(opts: &ServerOptions) -> anyhow::Result<()> {
    let settings = ServerSettings::from_options(opts)?;
    let graceful = settings.graceful_shutdown_timeout;
    let tls = [
        ("agent", settings.agent_tls.clone()),
        ("frontend", settings.frontend_tls.clone()),
    ];
    let server = serve::start(settings).context("starting the server")?;
    // Certificate and CA reload (docs/decisions/0004-certificate-reload.md);
    // the watchers stop when dropped at the end of `run`.
    let mut _watchers = Vec::new();
    if let Some(interval) = opts.engine.tls_reload_interval {
        for (listener, tls) in tls {
            let Some(tls) = tls else { continue };
            let metrics = server.metrics().clone();
            _watchers.push(
                tls.watch(listener, interval, move |ok| {
                    metrics.tls_reload(listener, ok)
                })
                .context("starting the certificate watcher")?,
            );
        }
    }
    match server.frontend_path() {
        Some(path) => tracing::info!("frontend listening on unix socket {}", path.display()),
        None => {
            if let Some(addr) = server.frontend_addr() {
                tracing::info!("frontend listening on {addr}");
            }
        }
    }
    tracing::info!("agent server listening on {}", server.agent_addr());
    if let Some(addr) = server.health_addr() {
        tracing::info!("health server listening on {addr}");
    }
    if let Some(addr) = server.admin_addr() {
        tracing::info!("admin server listening on {addr}");
    }

    let signal = signals::wait_shutdown_signal().context("waiting for signals")?;
    tracing::info!(?signal, "Shutting down server.");
    // A second signal exits at once, as upstream's handler does.
    std::thread::Builder::new()
        .name("second-signal".into())
        .spawn(|| {
            if signals::wait_shutdown_signal().is_ok() {
                tracing::warn!("second signal: exiting now");
                std::process::exit(1);
            }
        })
        .context("starting the signal thread")?;
    if graceful == Duration::ZERO {
        server.stop()?;
    } else {
        tracing::info!(timeout = ?graceful, "Initiating graceful shutdown.");
        server.shutdown(graceful)?;
    }
    tracing::info!("server stopped");
    Ok(())
}
