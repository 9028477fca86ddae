//! Resumable tunnels (konn extension `konn-resume`), sans-IO.
//!
//! When the TCP connection under an agent tunnel breaks while both
//! processes live, the connections it carried need not die: both sides
//! *park* them for `--resume-window`, the agent reconnects to the same
//! server and presents the tunnel's [`ResumeToken`], and both sides replay
//! what the other did not receive. `docs/design/resume.md` has the wire
//! protocol; this module is the arithmetic that makes it exact:
//!
//! - [`ReplayBuffer`] — the send half of one connection: every DATA
//!   payload sent gets the next byte offset, and stays (large ones as the
//!   refcounted [`Bytes`](bytes::Bytes) already in hand, small ones copied so they do not
//!   pin a pool buffer) until the peer's cumulative ACK passes it. On resume it yields the segments from the peer's receive
//!   offset.
//! - [`Receiver`] — the receive half: delivers each byte exactly once and
//!   in order whatever duplicates, overlaps or reordered segments a replay
//!   brings (out-of-order segments wait in a bounded hold), and decides
//!   when a cumulative ACK is due (every [`ResumeLimits::ack_bytes`] or
//!   [`ResumeLimits::ack_segments`], or [`ResumeLimits::ack_delay`] after
//!   the first unacknowledged byte — unless DATA of the same connection
//!   going the other way carries it once half due, see
//!   [`ConnResume::piggyback_ack`]).
//! - [`ConnResume`] — both halves of one connection and its phase
//!   (`Live → Parked → Syncing → Live`), the unit the router and the
//!   agent's tunnel keep per connectID.
//! - [`ResumeSession`] — one tunnel's connections: ACKs due, parking,
//!   the resume handshake (announcing ACKs, RESUMED), what to replay;
//!   what the agent's tunnel and the router's backend embed.
//! - [`ParkTable`] — the server's parked tunnels: token, the agent's
//!   authenticated identity, deadline; claiming one needs both.
//!
//! Nothing here reads a clock or draws randomness: tokens are made from
//! bytes the driver drew, time arrives as `now`. No input panics; a peer
//! that breaks a rule (acknowledges bytes never sent, sends a segment far
//! beyond the hold bound) gets [`Error::Resume`], and its connection is
//! closed by the caller.

mod conn;
mod park;
mod recv;
mod send;
mod session;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use conn::{ConnResume, Phase};
pub use park::{ClaimError, ParkTable, ResumeToken};
pub use recv::Receiver;
pub use send::{COPY_MAX, ReplayBuffer};
pub use session::{Replay, ResumeSession, SessionState};

use crate::Error;

/// The request metadata a konn agent offers resume with, and the response
/// header a konn server accepts it with (value [`RESUME_VERSION`]).
pub const RESUME_METADATA: &str = "konn-resume";
/// The only version of the extension.
pub const RESUME_VERSION: &str = "v1";
/// The server's response header carrying the tunnel's token (hex), and the
/// agent's request metadata presenting it on reconnect (as
/// `<hex>:<serverid>`, one value per parked tunnel; see
/// [`ResumeToken::presented`]).
pub const RESUME_TOKEN_METADATA: &str = "konn-resume-token";
/// The server's response header (value `1`) saying the token presented
/// resumed a parked tunnel: both sides then announce and replay.
pub const RESUMED_METADATA: &str = "konn-resumed";

/// How a connection's resume state acknowledges and bounds itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResumeLimits {
    /// An ACK is due once this many bytes arrived unacknowledged.
    pub ack_bytes: u64,
    /// An ACK is due once this many segments (DATA payloads) arrived
    /// unacknowledged: each one keeps its pooled buffer referenced in the
    /// sender's replay buffer, so small messages must not pile up there.
    pub ack_segments: u32,
    /// An ACK is due this long after the first unacknowledged byte, unless
    /// DATA of the same connection going the other way carried it first.
    pub ack_delay: Duration,
    /// Out-of-order bytes a receiver holds before it gives up on the
    /// connection (only a replay after a second cut produces any).
    pub hold_limit: usize,
    /// Unacknowledged bytes above which the sender stops reading the
    /// connection's source (a safety net: acknowledgement on receipt keeps
    /// the replay buffer at about one round trip of data, which the tunnel
    /// window already bounds).
    pub replay_limit: u64,
    /// How long a live connection whose close we sent waits for the
    /// peer's acknowledgement of it before it is forgotten (a peer
    /// acknowledges a close at once; one that never does broke the
    /// protocol, and forgetting is safe: should the peer announce it in a
    /// later resume, it is closed as any unknown connection).
    pub close_linger: Duration,
}

impl ResumeLimits {
    /// The limits for a per-connection queue size `queue`
    /// (`--conn-queue-size`): ACK every q/16 (64 KiB by default), every 32
    /// segments or 500 ms (data going the other way carries it once half
    /// due, so request/response traffic acknowledges every 16 exchanges or
    /// every 250 ms inside its DATA writes, with no timer or wake-up of its
    /// own; the delay bounds only how long a connection that went quiet
    /// keeps its last few segments for replay), hold and replay at most 4q
    /// (the flow-control limit), a close unacknowledged for 30 s forgotten.
    pub fn from_queue_size(queue: usize) -> Self {
        let q = queue.max(16 << 10);
        Self {
            ack_bytes: (q / 16) as u64,
            ack_segments: 32,
            ack_delay: Duration::from_millis(500),
            hold_limit: q.saturating_mul(4),
            replay_limit: q.saturating_mul(4) as u64,
            close_linger: Duration::from_secs(30),
        }
    }
}

impl Default for ResumeLimits {
    /// For `--conn-queue-size`'s default, 1 MiB.
    fn default() -> Self {
        Self::from_queue_size(1 << 20)
    }
}

/// `end - start` as `usize`, saturating (offsets differ by at most one
/// segment's or one buffer's length where this is used).
fn span(start: u64, end: u64) -> usize {
    usize::try_from(end.saturating_sub(start)).unwrap_or(usize::MAX)
}

/// The error for a peer that broke the resume protocol.
const fn violation(what: &'static str) -> Error {
    Error::Resume(what)
}
