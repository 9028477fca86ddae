//! The shared half of the stateful HTTP/2 fuzz targets (`h2_conn`,
//! `grpc_conn`): a scripted peer that writes frame *sequences* at one
//! `konn_protocol::h2::Connection` (valid-ish frames built with
//! konn-frames' encoders and HPACK encoder, mixed with raw bytes), a
//! checker that decodes everything the connection writes back, and the
//! driver loop that interleaves peer frames, partial deliveries, timer
//! steps, `poll_transmit` calls of any size and the application's calls
//! (supplied by each target through [`App`]).
//!
//! After every step the driver checks:
//! - the state machine's own invariants (`check_invariants`: windows in
//!   range, queue accounting, the stream table within its limits, no lost
//!   wake-up, nothing but a GOAWAY after an error);
//! - the receive-credit ledger: the credit the connection says is
//!   unreleased equals what the application was handed and did not
//!   release (nothing lost, nothing made up);
//! - what was written: whole, decodable frames no larger than the peer's
//!   SETTINGS_MAX_FRAME_SIZE; header blocks the peer's HPACK decoder
//!   accepts (the compression contexts stay in step); DATA bytes exactly
//!   the bytes the application queued on that stream, in order, never
//!   more; after a connection error at most the one GOAWAY that reports it
//!   (with its code), then nothing at all;
//! - the target's own checks ([`App::check`]).
//!
//! At the end the connection is aborted if it has not failed, and after one
//! flush it must be closed (`is_closed`) with no timer armed.

#![allow(dead_code)] // each target uses part of it

mod output;
mod peer;
mod script;

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use bytes::{BufMut, Bytes, BytesMut};
use konn_frames::h2 as wire;
use konn_protocol::Error;
use konn_protocol::h2::{Config, Connection, Role};

use output::Output;
use peer::Peer;
pub use script::*;

/// The one reading of the real clock; every instant is `epoch() + d`.
pub fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

// ----- the application -------------------------------------------------------

/// What each target adds: the object under test and the application's
/// calls on it.
pub trait App: Sized {
    /// The application calls the script may make.
    type Op: for<'a> Arbitrary<'a> + std::fmt::Debug;

    fn new(cfg: Config, now: Instant) -> Self;
    fn conn(&self) -> &Connection;
    fn handle_input(&mut self, now: Instant, input: &mut BytesMut) -> Result<(), Error>;
    fn poll_transmit(&mut self, now: Instant, out: &mut BytesMut, max: usize) -> usize;
    fn handle_timeout(&mut self, now: Instant);
    /// Abort the connection (end of the script).
    fn abort(&mut self);
    /// Take every pending event, recording ids in `ids` and credit in the
    /// ledger.
    fn events(&mut self, st: &mut AppState) -> Result<(), String>;
    /// Perform one application call.
    fn op(&mut self, op: &Self::Op, st: &mut AppState, now: Instant);
    /// The target's invariants (including the ledger).
    fn check(&self, st: &AppState) -> Result<(), String>;
}

/// What the application knows, shared by the targets.
#[derive(Default)]
pub struct AppState {
    /// Stream ids seen, in order.
    pub ids: Vec<u32>,
    /// Credit handed out per stream and not released.
    pub owed: HashMap<u32, usize>,
    /// Bytes queued per stream and not yet seen on the wire.
    pub queued: HashMap<u32, BytesMut>,
    /// Streams whose queue the connection dropped (reset, refused).
    pub dropped: std::collections::HashSet<u32>,
    seed: u8,
}

impl AppState {
    pub fn learn(&mut self, id: u32) {
        if !self.ids.contains(&id) {
            self.ids.push(id);
        }
    }

    pub fn id(&self, s: Sid) -> u32 {
        match s {
            Sid::Known(i) if !self.ids.is_empty() => self.ids[usize::from(i) % self.ids.len()],
            Sid::Known(_) | Sid::Next | Sid::Zero => 0,
            Sid::Raw(v) => v,
        }
    }

    pub fn owe(&mut self, id: u32, n: usize) {
        *self.owed.entry(id).or_default() += n;
    }

    /// Take `frac`/255 of what is owed on `id` (all of it for 255).
    pub fn take_owed(&mut self, id: u32, frac: u8) -> usize {
        let owed = self.owed.entry(id).or_default();
        let n = *owed * usize::from(frac) / 255;
        *owed -= n;
        n
    }

    pub fn total_owed(&self) -> i64 {
        self.owed.values().map(|&n| n as i64).sum()
    }

    /// `len` distinct-looking bytes.
    pub fn bytes(&mut self, len: usize) -> Bytes {
        self.seed = self.seed.wrapping_add(1);
        let seed = self.seed;
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// `len` distinct-looking bytes to queue on `id`, recorded.
    pub fn payload(&mut self, id: u32, len: usize) -> Bytes {
        let b = self.bytes(len);
        self.expect(id, &b);
        b
    }

    /// `bytes` will go out as DATA on `id`.
    pub fn expect(&mut self, id: u32, bytes: &[u8]) {
        self.queued.entry(id).or_default().extend_from_slice(bytes);
    }

    /// The connection dropped `id`'s queue.
    pub fn drop_queue(&mut self, id: u32) {
        self.queued.remove(&id);
        self.dropped.insert(id);
    }

    fn wrote(&mut self, id: u32, data: &[u8]) -> Result<(), String> {
        let q = self.queued.entry(id).or_default();
        if !q.starts_with(data) {
            return Err(format!(
                "stream {id}: wrote {} bytes that are not the next {} queued",
                data.len(),
                q.len()
            ));
        }
        let _ = q.split_to(data.len());
        Ok(())
    }
}

// ----- the driver ------------------------------------------------------------

/// Runs one script; `Err` is an invariant broken (the target panics with it).
pub fn run<A: App>(input: &Input<A::Op>) -> Result<(), String> {
    let role = if input.client {
        Role::Client
    } else {
        Role::Server
    };
    let mut now = epoch();
    let mut app = A::new(input.cfg.config(role), now);
    let mut peer = Peer::new(role);
    let mut output = Output::new(role);
    let mut st = AppState::default();
    let mut inbuf = BytesMut::new();
    if input.preface {
        if role == Role::Server {
            peer.out.put_slice(wire::PREFACE);
        }
        wire::encode_settings(&[], &mut peer.out);
    }
    for (step, op) in input.ops.iter().enumerate() {
        match op {
            Op::Frame(f) => {
                peer.frame(f, &st.ids);
                feed(&mut app, &mut peer, &mut inbuf, now, 0)?;
            }
            Op::Split(f, n) => {
                peer.frame(f, &st.ids);
                feed(&mut app, &mut peer, &mut inbuf, now, *n)?;
            }
            Op::Raw(b) => peer.out.put_slice(b),
            Op::Feed(n) => feed(&mut app, &mut peer, &mut inbuf, now, *n)?,
            Op::Transmit(max) => transmit(&mut app, &mut output, &mut st, now, *max)?,
            Op::Advance(ms) => {
                now += Duration::from_millis(u64::from(*ms));
                if app.conn().poll_timeout().is_some_and(|t| t <= now) {
                    app.handle_timeout(now);
                }
            }
            Op::Timeout => app.handle_timeout(now),
            Op::App(a) => app.op(a, &mut st, now),
        }
        app.events(&mut st)
            .map_err(|e| format!("step {step}: {e}"))?;
        app.check(&st)
            .map_err(|e| format!("step {step} ({op:?}): {e}"))?;
    }
    // The end: whatever state it is in, an aborted connection flushes its
    // GOAWAY and is closed.
    if app.conn().error().is_none() {
        app.abort();
        app.events(&mut st)?;
    }
    transmit(&mut app, &mut output, &mut st, now, 0)?;
    app.check(&st)?;
    if !app.conn().is_closed() {
        return Err("failed connection not closed after a flush".into());
    }
    if app.conn().poll_timeout().is_some() {
        return Err("failed connection still has a timer".into());
    }
    Ok(())
}

/// Delivers up to `n` of the peer's pending bytes (0: all) and has the
/// connection handle them.
fn feed<A: App>(
    app: &mut A,
    peer: &mut Peer,
    inbuf: &mut BytesMut,
    now: Instant,
    n: u16,
) -> Result<(), String> {
    let n = match usize::from(n) {
        0 => peer.out.len(),
        n => n.min(peer.out.len()),
    };
    inbuf.put_slice(&peer.out.split_to(n));
    let before = app.conn().error();
    let r = app.handle_input(now, inbuf);
    if before.is_some() && r.is_ok() {
        return Err("handle_input succeeded after a connection error".into());
    }
    if r.is_err() != app.conn().error().is_some() {
        return Err(format!(
            "handle_input returned {r:?}, error() is {:?}",
            app.conn().error()
        ));
    }
    Ok(())
}

fn transmit<A: App>(
    app: &mut A,
    output: &mut Output,
    st: &mut AppState,
    now: Instant,
    max: u16,
) -> Result<(), String> {
    let max = if max == 0 {
        usize::MAX
    } else {
        usize::from(max)
    };
    let failed = app.conn().error();
    let mut out = BytesMut::new();
    let n = app.poll_transmit(now, &mut out, max);
    if n != out.len() {
        return Err(format!("poll_transmit said {n}, wrote {}", out.len()));
    }
    let mut data = Vec::new();
    output.check(app.conn(), failed, &out, &mut data)?;
    for (id, d) in data {
        st.wrote(id, &d)?;
    }
    Ok(())
}
