//! Fuzz target `h2_conn`: one `konn_protocol::h2::Connection`, client or
//! server role, fed arbitrary frame *sequences* by a scripted peer while
//! the application opens streams, sends headers, data and trailers, resets
//! and releases streams, returns credit, shuts down or aborts, and time
//! passes. Every step is checked against the connection's invariants, the
//! credit ledger and a decoding of everything it writes (see
//! `common/h2peer.rs`); here, in addition: every stream the connection
//! still queues for holds exactly the bytes the application queued and the
//! connection has not written yet.
#![no_main]

#[path = "common/h2peer/mod.rs"]
mod h2peer;

use std::time::Instant;

use arbitrary::Arbitrary;
use bytes::{Bytes, BytesMut};
use h2peer::{App, AppState, Input, Sid};
use konn_frames::Reason;
use konn_protocol::Error;
use konn_protocol::h2::{Config, Connection, Event, Headers};
use libfuzzer_sys::fuzz_target;

/// The application's calls.
#[derive(Arbitrary, Debug)]
enum Call {
    Open {
        end_stream: bool,
    },
    SendHeaders {
        sid: Sid,
        status: u16,
        end_stream: bool,
    },
    SendData {
        sid: Sid,
        len: u16,
        end_stream: bool,
    },
    SendTrailers {
        sid: Sid,
    },
    Reset {
        sid: Sid,
        code: u8,
    },
    /// Return `frac`/255 of the credit owed on a stream.
    Release {
        sid: Sid,
        frac: u8,
    },
    ReleaseStream {
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

struct H2(Connection);

impl App for H2 {
    type Op = Call;

    fn new(cfg: Config, now: Instant) -> Self {
        Self(Connection::new(cfg, now))
    }
    fn conn(&self) -> &Connection {
        &self.0
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
        self.0.abort(Reason::NO_ERROR, "fuzz: end");
    }

    fn events(&mut self, st: &mut AppState) -> Result<(), String> {
        while let Some(e) = self.0.poll_event() {
            match e {
                Event::Headers { id, .. } | Event::Trailers { id, .. } => st.learn(id),
                Event::Data { id, data, .. } => {
                    st.learn(id);
                    st.owe(id, data.len());
                }
                Event::Reset { id, .. } => st.drop_queue(id),
                Event::Writable { .. } | Event::GoAway { .. } => {}
            }
        }
        Ok(())
    }

    fn op(&mut self, op: &Call, st: &mut AppState, _now: Instant) {
        let c = &mut self.0;
        match *op {
            Call::Open { end_stream } => {
                let h = request();
                if let Ok(id) = c.open_stream(h, end_stream) {
                    st.learn(id);
                }
            }
            Call::SendHeaders {
                sid,
                status,
                end_stream,
            } => {
                let _ = c.send_headers(
                    st.id(sid),
                    Headers::response(100 + status % 500),
                    end_stream,
                );
            }
            Call::SendData {
                sid,
                len,
                end_stream,
            } => {
                let id = st.id(sid);
                let data = st.payload(id, usize::from(len));
                if c.send_data(id, data.clone(), end_stream).is_err() {
                    // Not queued after all.
                    let q = st.queued.entry(id).or_default();
                    let keep = q.len() - data.len();
                    q.truncate(keep);
                }
            }
            Call::SendTrailers { sid } => {
                let mut t = Headers::new();
                t.push(Bytes::from_static(b"grpc-status"), Bytes::from_static(b"0"));
                let _ = c.send_trailers(st.id(sid), t);
            }
            Call::Reset { sid, code } => {
                let id = st.id(sid);
                c.reset_stream(id, Reason(u32::from(code % 16)));
                st.drop_queue(id);
            }
            Call::Release { sid, frac } => {
                let id = st.id(sid);
                let n = st.take_owed(id, frac);
                c.release_capacity(id, n);
            }
            Call::ReleaseStream { sid } => c.release_stream(st.id(sid)),
            Call::NotifyWhenDrained { sid, low } => {
                c.notify_when_drained(st.id(sid), usize::from(low))
            }
            Call::Shutdown => c.shutdown(),
            Call::Abort => c.abort(Reason::ENHANCE_YOUR_CALM, "fuzz: abort"),
            Call::ConnectionLost => c.connection_lost(),
        }
    }

    fn check(&self, st: &AppState) -> Result<(), String> {
        let c = &self.0;
        c.check_invariants()?;
        let c_ok = c.error().is_none();
        // A failed connection's windows no longer matter (its input is
        // dropped unaccounted): the ledger holds while it is up.
        let unreleased = c.unreleased_credit();
        if unreleased != st.total_owed() && c_ok {
            return Err(format!(
                "connection says {unreleased} bytes of credit unreleased, the application owes {}",
                st.total_owed()
            ));
        }
        for (&id, q) in &st.queued {
            let queued = c.queued_bytes(id);
            let want = if st.dropped.contains(&id) { 0 } else { q.len() };
            // A failed connection keeps its queues but never writes them.
            if queued != want && !(c.error().is_some() && queued == q.len()) {
                return Err(format!(
                    "stream {id}: connection queues {queued} bytes, application expects {want}"
                ));
            }
        }
        Ok(())
    }
}

fn request() -> Headers {
    let mut h = Headers::request(
        "POST",
        "http",
        Bytes::from_static(b"konn"),
        Bytes::from_static(b"/AgentService/Connect"),
    );
    h.push_static("content-type", "application/grpc");
    h.push_static("te", "trailers");
    h
}

fuzz_target!(|input: Input<Call>| {
    if let Err(e) = h2peer::run::<H2>(&input) {
        panic!("h2_conn: {e}");
    }
});
