//! A raw `/AgentService/Connect` call with any metadata, for the
//! authentication tests and the reconnect storm: it reports whether the
//! server answered with response headers (accepted) or finished the call
//! first (refused, with the status and message), then hangs up. Works
//! against konn's and upstream's servers alike (it is only the wire).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use konn_core::io::driver::{ConnHandle, DriverConfig, Handler};
use konn_core::io::resolve::dial_tcp;
use konn_core::io::runtime::{Either, Engine, block_on, race};
use konn_core::io::tls::ClientTls;
use konn_frames::GrpcStatus;
use konn_protocol::grpc::{Grpc, GrpcEvent};
use konn_protocol::h2::{Config, Connection, Headers, Role};

/// What the server did with the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeResult {
    /// Response headers: the agent was accepted.
    Accepted {
        /// `serverid`.
        server_id: String,
    },
    /// The call finished before any response header.
    Refused {
        /// The gRPC status.
        status: GrpcStatus,
        /// `grpc-message`.
        message: String,
    },
    /// No answer (dial, TLS, timeout).
    Failed(String),
}

#[derive(Default)]
struct Probe {
    result: Rc<RefCell<Option<ProbeResult>>>,
    done: Rc<konn_core::io::notify::Notify>,
}

impl Handler<Grpc> for Probe {
    fn on_event(&mut self, _g: &mut Grpc, ev: GrpcEvent) {
        let r = match ev {
            GrpcEvent::ResponseHeaders { metadata, .. } => ProbeResult::Accepted {
                server_id: metadata
                    .get(b"serverid")
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_default(),
            },
            GrpcEvent::Finished {
                status, message, ..
            } => ProbeResult::Refused { status, message },
            _ => return,
        };
        let mut slot = self.result.borrow_mut();
        if slot.is_none() {
            *slot = Some(r);
            self.done.notify();
        }
    }
}

/// Make one Connect call to `addr` with `metadata` (name, value pairs, in
/// order; repeat a name for several values) and wait at most `timeout`.
pub fn connect_call(
    addr: &str,
    tls: Option<&ClientTls>,
    metadata: &[(&str, &[u8])],
    timeout: Duration,
) -> ProbeResult {
    let run = async {
        let stream = match dial_tcp(addr, timeout).await {
            Ok(s) => s,
            Err(e) => return ProbeResult::Failed(format!("dial: {e:?}")),
        };
        let layer = match tls.map(ClientTls::layer).transpose() {
            Ok(l) => l,
            Err(e) => return ProbeResult::Failed(format!("tls: {e}")),
        };
        let probe = Probe::default();
        let (result, done) = (probe.result.clone(), probe.done.clone());
        let grpc = Grpc::new(
            Connection::new(Config::new(Role::Client), konn_core::io::clock::now()),
            konn_frames::grpc::DEFAULT_MAX_RECV_MESSAGE_SIZE,
        );
        let handle = ConnHandle::new(grpc, layer, probe, DriverConfig::default());
        let mut md = Headers::new();
        for (k, v) in metadata {
            md.push(
                Bytes::copy_from_slice(k.as_bytes()),
                Bytes::copy_from_slice(v),
            );
        }
        let started = handle.with(|g, _| {
            g.start_call(
                "https",
                Bytes::copy_from_slice(addr.as_bytes()),
                Bytes::from_static(b"/AgentService/Connect"),
                &md,
            )
        });
        match started {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return ProbeResult::Failed(format!("call: {e}")),
            Err(e) => return ProbeResult::Failed(format!("call: {e}")),
        }
        let h2 = handle.clone();
        let run = monoio::spawn(async move { h2.run(stream).await });
        let waited = race(done.notified(), monoio::time::sleep(timeout)).await;
        handle.abort();
        let _ = run.await;
        match (waited, result.borrow_mut().take()) {
            (_, Some(r)) => r,
            (Either::Right(()), None) => {
                ProbeResult::Failed(format!("no answer within {timeout:?}"))
            }
            (Either::Left(()), None) => ProbeResult::Failed("no result".to_owned()),
        }
    };
    block_on(Engine::Epoll, run).unwrap_or_else(|e| ProbeResult::Failed(e.to_string()))
}
