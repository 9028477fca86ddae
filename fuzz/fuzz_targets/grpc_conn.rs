//! Fuzz target `grpc_conn`: the gRPC layer (`konn_protocol::grpc::Grpc`)
//! over one HTTP/2 connection, client or server role, fed arbitrary frame
//! sequences (gRPC messages whole, split across DATA frames, oversized,
//! truncated, compressed; requests and responses good and bad) by the
//! scripted peer of `common/h2peer.rs`, while the application starts,
//! accepts, finishes and cancels calls, sends messages, half-closes and
//! returns the credit of the messages it was handed. Checked after every
//! step: the connection's and the gRPC layer's invariants, the credit
//! ledger (the `flow` of every message handed out and not released equals
//! what the connection says is unreleased, less what partial messages
//! hold), and everything written (see `common/h2peer.rs`).
#![no_main]

#[path = "common/h2peer/mod.rs"]
mod h2peer;

use std::time::Instant;

use arbitrary::Arbitrary;
use bytes::{BufMut, Bytes, BytesMut};
use h2peer::{App, AppState, Input, Sid};
use konn_frames::{GrpcStatus, Reason};
use konn_protocol::Error;
use konn_protocol::grpc::{Grpc, GrpcEvent};
use konn_protocol::h2::{Config, Connection, Headers};
use libfuzzer_sys::fuzz_target;

/// The application's calls.
#[derive(Arbitrary, Debug)]
enum Call {
    StartCall,
    Accept {
        sid: Sid,
    },
    SendMessage {
        sid: Sid,
        len: u16,
    },
    SendFramed {
        sid: Sid,
        len: u16,
    },
    /// Return `frac`/255 of the credit owed on a call.
    Release {
        sid: Sid,
        frac: u8,
    },
    CloseSend {
        sid: Sid,
    },
    Finish {
        sid: Sid,
        status: u8,
        message: bool,
    },
    Cancel {
        sid: Sid,
    },
    NotifyWhenDrained {
        sid: Sid,
        low: u16,
    },
    Shutdown,
    Abort,
    ConnectionLost,
}

struct G(Grpc);

impl App for G {
    type Op = Call;

    fn new(cfg: Config, now: Instant) -> Self {
        Self(Grpc::new(Connection::new(cfg, now), 64 << 10))
    }
    fn conn(&self) -> &Connection {
        self.0.conn()
    }
    fn handle_input(&mut self, now: Instant, input: &mut BytesMut) -> Result<(), Error> {
        self.0.handle_input(now, input)
    }
    fn poll_transmit(&mut self, now: Instant, out: &mut BytesMut, max: usize) -> usize {
        self.0.poll_transmit(now, out, max)
    }
    fn handle_timeout(&mut self, now: Instant) {
        self.0.handle_timeout(now)
    }
    fn abort(&mut self) {
        self.0.conn_mut().abort(Reason::NO_ERROR, "fuzz: end");
    }

    fn events(&mut self, st: &mut AppState) -> Result<(), String> {
        while let Some(e) = self.0.poll_event() {
            match e {
                GrpcEvent::Call { id, .. } | GrpcEvent::ResponseHeaders { id, .. } => st.learn(id),
                GrpcEvent::Message {
                    id,
                    msg,
                    framed,
                    flow,
                } => {
                    if let Some(f) = &framed
                        && (f.len() != msg.len() + 5 || f[5..] != msg[..])
                    {
                        return Err(format!("call {id}: framed message is not prefix + message"));
                    }
                    st.owe(id, flow);
                }
                GrpcEvent::HalfClose { .. }
                | GrpcEvent::Finished { .. }
                | GrpcEvent::Writable { .. }
                | GrpcEvent::GoAway { .. } => {}
            }
        }
        Ok(())
    }

    fn op(&mut self, op: &Call, st: &mut AppState, _now: Instant) {
        let g = &mut self.0;
        match *op {
            Call::StartCall => {
                if let Ok(id) = g.start_call(
                    "http",
                    Bytes::from_static(b"konn"),
                    Bytes::from_static(b"/AgentService/Connect"),
                    &Headers::new(),
                ) {
                    st.learn(id);
                }
            }
            Call::Accept { sid } => {
                let _ = g.accept(st.id(sid), &Headers::new());
            }
            Call::SendMessage { sid, len } | Call::SendFramed { sid, len } => {
                let id = st.id(sid);
                let msg = st.bytes(usize::from(len));
                let mut framed = BytesMut::new();
                framed.put_u8(0);
                framed.put_u32(u32::from(len));
                framed.put_slice(&msg);
                let r = if matches!(op, Call::SendMessage { .. }) {
                    g.send_message(id, &msg)
                } else {
                    g.send_framed(id, framed.clone().freeze())
                };
                if r.is_ok() {
                    st.expect(id, &framed);
                }
            }
            Call::Release { sid, frac } => {
                let id = st.id(sid);
                let n = st.take_owed(id, frac);
                g.release(id, n);
            }
            Call::CloseSend { sid } => {
                let _ = g.close_send(st.id(sid));
            }
            Call::Finish {
                sid,
                status,
                message,
            } => {
                let text = if message { "fuzz: finished" } else { "" };
                let _ = g.finish(st.id(sid), GrpcStatus(u32::from(status % 17)), text);
            }
            Call::Cancel { sid } => g.cancel(st.id(sid)),
            Call::NotifyWhenDrained { sid, low } => {
                g.notify_when_drained(st.id(sid), usize::from(low))
            }
            Call::Shutdown => g.conn_mut().shutdown(),
            Call::Abort => g.conn_mut().abort(Reason::ENHANCE_YOUR_CALM, "fuzz: abort"),
            Call::ConnectionLost => g.connection_lost(),
        }
    }

    fn check(&self, st: &AppState) -> Result<(), String> {
        let g = &self.0;
        g.check_invariants()?;
        let c_ok = g.conn().error().is_none();
        // A failed connection's windows no longer matter (its input is
        // dropped unaccounted): the ledger holds while it is up.
        let unreleased = g.unreleased_credit();
        if unreleased != st.total_owed() && c_ok {
            return Err(format!(
                "gRPC layer says {unreleased} bytes of credit unreleased, the application owes {}",
                st.total_owed()
            ));
        }
        for (&id, q) in &st.queued {
            let queued = g.queued_bytes(id);
            if queued > q.len() {
                return Err(format!(
                    "call {id}: connection queues {queued} bytes, application queued {}",
                    q.len()
                ));
            }
        }
        Ok(())
    }
}

fuzz_target!(|input: Input<Call>| {
    if let Err(e) = h2peer::run::<G>(&input) {
        panic!("grpc_conn: {e}");
    }
});
