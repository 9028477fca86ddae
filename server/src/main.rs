//! proxy-server: parses upstream's flags, sets up klog-style logging and
//! validates the options (the start-up sequence of `konn_core::app`),
//! binds every listener and serves until SIGTERM or SIGINT.
//!
//! With `--clusters-config`, SIGHUP (and any change of the file) reloads
//! the clusters (docs/MULTI-CLUSTER.md); without it SIGHUP ends the process
//! as upstream's does.
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
    let code = serve_until_stopped();
    // INFO lines are gathered for a few milliseconds before they are
    // written: write the last of them.
    konn_core::log::flush();
    code
}

fn serve_until_stopped() -> ExitCode {
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
    let multi = settings.multi_cluster();
    if multi {
        // Before any worker exists, so none is ever interrupted by it.
        signals::block_reload_signal().context("blocking SIGHUP")?;
    }
    let tls = [
        ("agent", settings.agent_tls.clone()),
        ("frontend", settings.frontend_tls.clone()),
    ];
    let mut server = serve::start(settings).context("starting the server")?;
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
    if multi {
        for (name, addr, path) in server.cluster_frontends() {
            match (addr, path) {
                (Some(a), _) => tracing::info!(cluster = %name, "frontend listening on {a}"),
                (_, Some(p)) => {
                    tracing::info!(cluster = %name, "frontend listening on unix socket {}", p.display())
                }
                _ => {}
            }
        }
        server.watch(None).context("watching --clusters-config")?;
        if let Some(poker) = server.reload_poker() {
            std::thread::Builder::new()
                .name("sighup".into())
                .spawn(
                    move || {
                        while signals::wait_reload_signal().is_ok() && poker.send(false).is_ok() {}
                    },
                )
                .context("starting the SIGHUP thread")?;
        }
    }
    match server.frontend_path() {
        Some(path) if !multi => {
            tracing::info!("frontend listening on unix socket {}", path.display())
        }
        _ => {
            if let Some(addr) = server.frontend_addr().filter(|_| !multi) {
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
