//! Invariants of [`Connection`], checked by the stateful fuzz targets
//! (`fuzz/fuzz_targets/h2_conn.rs`, `grpc_conn.rs`) after every step.
//!
//! A child module of `conn` so it can read the connection's private state
//! without widening it. Cheap (one pass over the stream table), never
//! panics, and changes nothing: a broken invariant comes back as a message
//! naming it. The rules, and where they come from:
//!
//! - flow control (RFC 9113 §6.9): the connection's send window is in
//!   `0 ..= 2^31-1`, a stream's in `-(2^31-1) ..= 2^31-1` (a SETTINGS
//!   decrease may push it below zero, §6.9.2); what the peer may still send
//!   us is in `0 ..= 2^31-1` on the connection and on every stream;
//! - a stream's `queued` is the sum of the data in its send queue, and a
//!   stream closed on the wire has nothing queued;
//! - the stream table: peer-initiated streams have the peer's parity and
//!   ids up to the highest seen, never more than our
//!   MAX_CONCURRENT_STREAMS of them; ours have our parity and ids below the
//!   next one; `remote_active` / `local_active` count exactly those; only
//!   peer-initiated streams are held by the application, and only they stay
//!   in the table once closed;
//! - the ready list holds each stream at most once, exactly the streams
//!   flagged `in_ready`, and every stream that could write now (something
//!   queued that is not DATA, or DATA with credit on the stream and the
//!   connection) is in it (no lost wake-up);
//! - bounded memory: the ring of closed ids, a header block being
//!   assembled (bytes and CONTINUATION frames);
//! - after a connection error only the GOAWAY that reports it may still be
//!   waiting to be written.

use super::{Connection, Control, MAX_STREAM_ID};
use crate::h2::Role;
use crate::h2::flow::MAX_WINDOW;
use crate::h2::stream::{SendItem, State};

impl Connection {
    /// Checks the connection's internal invariants (see
    /// `protocol/src/h2/invariants.rs`); `Err` names the first one broken.
    /// For fuzz targets and tests.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let send = self.conn_send.value();
        if !(0..=MAX_WINDOW).contains(&send) {
            return Err(format!("connection send window {send}"));
        }
        let recv = self.conn_recv.available();
        if !(0..=MAX_WINDOW).contains(&recv) {
            return Err(format!("connection receive window {recv}"));
        }
        let (remote_parity, local_parity) = match self.cfg.role {
            Role::Server => (1, 0),
            Role::Client => (0, 1),
        };
        if self.next_local_id % 2 != local_parity || self.next_local_id > MAX_STREAM_ID + 2 {
            return Err(format!("next local stream id {}", self.next_local_id));
        }
        let (mut remote, mut local) = (0, 0);
        for (&id, s) in &self.streams {
            let send = s.send.value();
            if !(-MAX_WINDOW..=MAX_WINDOW).contains(&send) {
                return Err(format!("stream {id}: send window {send}"));
            }
            let recv = s.recv.available();
            if !(0..=MAX_WINDOW).contains(&recv) {
                return Err(format!("stream {id}: receive window {recv}"));
            }
            let data: usize = s
                .queue
                .iter()
                .map(|i| match i {
                    SendItem::Data { data, .. } => data.len(),
                    SendItem::Headers { .. } | SendItem::Trailers(_) => 0,
                })
                .sum();
            if data != s.queued {
                return Err(format!(
                    "stream {id}: queued {} but {data} bytes in the queue",
                    s.queued
                ));
            }
            if s.state == State::Closed && !s.queue.is_empty() {
                return Err(format!("stream {id}: closed with sends queued"));
            }
            if s.remote_initiated {
                remote += 1;
                if id % 2 != remote_parity || id == 0 || id > self.last_remote_id {
                    return Err(format!(
                        "peer stream {id} (last seen {})",
                        self.last_remote_id
                    ));
                }
                if s.state == State::Closed && !s.app_held {
                    return Err(format!("peer stream {id}: finished but kept"));
                }
            } else {
                local += 1;
                if id % 2 != local_parity || id >= self.next_local_id || s.app_held {
                    return Err(format!("our stream {id} (next {})", self.next_local_id));
                }
                if s.state == State::Closed {
                    return Err(format!("our stream {id}: closed but kept"));
                }
            }
            let in_list = self.ready.iter().filter(|&&r| r == id).count();
            if in_list > 1 || (in_list == 1) != s.in_ready {
                return Err(format!(
                    "stream {id}: {in_list} times in the ready list, in_ready {}",
                    s.in_ready
                ));
            }
            let writable = s.queue.front().is_some_and(|i| match i {
                SendItem::Data { data, .. } if !data.is_empty() => {
                    s.send.available() > 0 && self.conn_send.available() > 0
                }
                _ => true,
            });
            if writable && !s.in_ready && self.error.is_none() {
                return Err(format!("stream {id}: could write but is not ready"));
            }
        }
        if (remote, local) != (self.remote_active, self.local_active) {
            return Err(format!(
                "counted {remote} peer and {local} local streams, table has {} and {}",
                self.remote_active, self.local_active
            ));
        }
        if self.remote_active > self.cfg.max_concurrent_streams as usize {
            return Err(format!(
                "{} peer streams, limit {}",
                self.remote_active, self.cfg.max_concurrent_streams
            ));
        }
        if self.closed.len() > self.cfg.limits.closed_streams_remembered {
            return Err(format!("{} closed ids remembered", self.closed.len()));
        }
        // (A block over a limit fails the connection and stays behind.)
        if let Some(b) = &self.block
            && self.error.is_none()
            && (b.buf.len() > self.cfg.limits.max_header_block
                || b.continuations > self.cfg.limits.max_continuation_frames)
        {
            return Err(format!(
                "header block of {} bytes in {} CONTINUATIONs",
                b.buf.len(),
                b.continuations
            ));
        }
        if self.error.is_some()
            && (self.control.len() > 1
                || self
                    .control
                    .front()
                    .is_some_and(|c| !matches!(c, Control::GoAway { .. })))
        {
            return Err(format!(
                "failed connection still has {:?} to send",
                self.control
            ));
        }
        Ok(())
    }

    /// Whether stream `id` is in the table (open, or closed but still held
    /// by the application). For invariant checks.
    #[doc(hidden)]
    pub fn has_stream(&self, id: u32) -> bool {
        self.streams.contains_key(&id)
    }

    /// Connection-level receive credit the peer used that the application
    /// has not released yet (`release_capacity`): DATA handed out in events
    /// and not passed on. Padding and data of streams that were reset are
    /// released by the connection itself. For fuzz targets and tests.
    #[doc(hidden)]
    pub fn unreleased_credit(&self) -> i64 {
        self.conn_recv.unreleased()
    }
}
