//! A tiny HTTP/2 server on konn's engine, for running h2spec (or curl,
//! nghttp, h2load) by hand against the HTTP/2 layer without gRPC.
//!
//! Every request gets `200 OK` with a short text body once the request has
//! ended; request bodies are read and their flow-control credit returned.
//! Plaintext HTTP/2 with prior knowledge, or TLS with ALPN `h2`.
//!
//! ```text
//! cargo run -p konn-core --example h2_test_server -- [--port 8080] \
//!     [--io-engine auto|io-uring|epoll] [--tls-cert server.crt --tls-key server.key]
//! h2spec -p 8080 -h 127.0.0.1
//! ```
//!
//! It prints `listening on ADDR` and runs until killed. The server itself
//! is the one the integration tests use (`tests/h2_support/server.rs`).

#[path = "../tests/h2_support/server.rs"]
mod server;

use std::net::SocketAddr;
use std::process::ExitCode;

use konn_core::io::runtime::{IoEngine, resolve};
use konn_core::io::tls::{PemSource, ServerTlsOptions};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("h2_test_server: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let mut port = 0u16;
    let mut engine = IoEngine::Auto;
    let (mut cert, mut key) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--port" => port = value()?.parse().map_err(|e| format!("--port: {e}"))?,
            "--io-engine" => engine = value()?.parse().map_err(|e| format!("{e}"))?,
            "--tls-cert" => cert = Some(value()?),
            "--tls-key" => key = Some(value()?),
            "-h" | "--help" => {
                println!(
                    "usage: h2_test_server [--port N] [--io-engine auto|io-uring|epoll] \
                     [--tls-cert FILE --tls-key FILE]"
                );
                return Ok(());
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let engine = resolve(engine).map_err(|e| e.to_string())?.engine();
    let mut opts = server::ServerOpts::http();
    opts.addr = SocketAddr::from(([127, 0, 0, 1], port));
    opts.tls = match (cert, key) {
        (Some(c), Some(k)) => Some(
            ServerTlsOptions::new(PemSource::file(c), PemSource::file(k))
                .build()
                .map_err(|e| e.to_string())?,
        ),
        (None, None) => None,
        _ => return Err("--tls-cert and --tls-key go together".into()),
    };
    let tls = if opts.tls.is_some() {
        "TLS"
    } else {
        "plaintext"
    };
    let srv = server::TestServer::start(engine, opts);
    println!("listening on {} ({tls}, {engine})", srv.addr());
    loop {
        std::thread::park();
    }
}
