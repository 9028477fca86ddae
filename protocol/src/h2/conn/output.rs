//! Output: `poll_transmit` writes the client preface, queued control
//! frames and the ready streams' HEADERS and DATA within the peer's flow
//! control windows. `poll_transmit_vectored` does the same but hands large
//! DATA payloads out as references to the application's buffers instead
//! of copying them (a TLS layer copies them into its records anyway).

use std::time::Instant;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use konn_frames::Reason;
use konn_frames::h2::{self as wire, SettingId, Settings};
use konn_frames::hpack;

use super::{Connection, Control};
use crate::h2::headers::Headers;
use crate::h2::stream::{Closed, SendItem, State};
use crate::h2::{Event, Role};

/// DATA payloads at least this long are referenced by
/// [`Connection::poll_transmit_vectored`], not copied: below it the copy
/// costs less than one more slice for the layer underneath.
pub const VECTORED_MIN: usize = 4096;

/// At most this many payloads are referenced per vectored transmit (later
/// ones are copied), so a driver can keep the slices on its stack.
pub const MAX_VECTORED: usize = 32;

/// Room an empty output buffer (a new connection's, or one released while
/// idle) gets before its first frame: a dial's flights — SETTINGS, their
/// ACK, response headers, a small DATA frame — fit, instead of growing
/// the buffer frame by frame.
const FIRST_OUTPUT: usize = 2048;

/// Payloads a vectored transmit kept out of its buffer: `(at, payload)`
/// means `payload` follows the buffer's first `at` bytes (and the earlier
/// entries' payloads), in order.
pub type Payloads = Vec<(usize, Bytes)>;

impl Connection {
    /// Write pending frames into `out` until it holds at least `max` bytes
    /// or nothing is left. Returns the number of bytes written.
    pub fn poll_transmit(&mut self, now: Instant, out: &mut BytesMut, max: usize) -> usize {
        self.transmit(now, out, None, max)
    }

    /// [`Connection::poll_transmit`], but DATA payloads of at least
    /// [`VECTORED_MIN`] bytes (up to [`MAX_VECTORED`] of them) are appended
    /// to `payloads` instead of copied into `out`: the output is `out`
    /// with each `(at, payload)` inserted at `at` (see [`Payloads`]).
    /// Returns the number of bytes of output, payloads included.
    pub fn poll_transmit_vectored(
        &mut self,
        now: Instant,
        out: &mut BytesMut,
        payloads: &mut Payloads,
        max: usize,
    ) -> usize {
        self.transmit(now, out, Some(payloads), max)
    }

    fn transmit(
        &mut self,
        now: Instant,
        out: &mut BytesMut,
        mut payloads: Option<&mut Payloads>,
        max: usize,
    ) -> usize {
        self.saw(now);
        // Output so far: what `out` gained plus the referenced payloads.
        let start = out.len();
        let mut referenced = 0;
        let preface_due = !self.preface_sent && (self.preface_received || !self.control.is_empty());
        if out.capacity() == 0
            && (preface_due || !self.control.is_empty() || !self.ready.is_empty())
        {
            out.reserve(FIRST_OUTPUT);
        }
        // A server sends its preface once the client's has come (or it has
        // something else to send first, such as a GOAWAY): clients send
        // theirs at once, so the SETTINGS, the ACK of the client's and the
        // first response go out in one write instead of two (one fewer
        // send and wake-up per konnectivity-client dial, which opens a
        // connection per dial). A peer whose preface was not HTTP/2 gets
        // nothing (that failure queues no GOAWAY).
        if preface_due {
            self.write_preface(out);
        }
        while let Some(c) = self.control.pop_front() {
            self.write_control(c, out);
            if out.len() - start >= max {
                return out.len() - start;
            }
        }
        if self.error.is_some() {
            return out.len() - start;
        }
        let mut rounds = self.ready.len();
        while rounds > 0 && out.len() - start + referenced < max {
            rounds -= 1;
            let Some(id) = self.ready.pop_front() else {
                break;
            };
            let progressed =
                self.write_stream(now, id, out, payloads.as_deref_mut(), &mut referenced);
            let Some(s) = self.streams.get_mut(&id) else {
                continue;
            };
            if s.queue.is_empty() {
                s.in_ready = false;
            } else if progressed {
                self.ready.push_back(id);
                rounds += 1;
            } else {
                // Blocked by the stream window: WINDOW_UPDATE re-queues it.
                s.in_ready = false;
            }
            if self.conn_send.available() == 0 && self.ready.iter().all(|i| self.next_is_data(*i)) {
                break;
            }
        }
        out.len() - start + referenced
    }

    fn write_preface(&mut self, out: &mut BytesMut) {
        self.preface_sent = true;
        if self.cfg.role == Role::Client {
            out.put_slice(wire::PREFACE);
        }
        self.local.encode_changes(&Settings::default(), out);
        if let Some(inc) = self.conn_recv.take_growth() {
            wire::encode_window_update(0, inc, out);
        }
    }

    fn write_control(&mut self, c: Control, out: &mut BytesMut) {
        match c {
            Control::SettingsAck => wire::encode_settings_ack(out),
            Control::InitialWindow(w) => {
                wire::encode_settings(&[(SettingId::INITIAL_WINDOW_SIZE, w)], out)
            }
            Control::Ping { ack, payload } => {
                wire::encode_ping(ack, payload, out);
            }
            Control::Rst { id, reason } => wire::encode_rst_stream(id, reason, out),
            Control::WindowUpdate { id, inc } => wire::encode_window_update(id, inc, out),
            Control::GoAway {
                last,
                reason,
                debug,
            } => wire::encode_goaway(last, reason, &debug, out),
        }
    }

    fn next_is_data(&self, id: u32) -> bool {
        self.streams
            .get(&id)
            .and_then(|s| s.queue.front())
            .is_some_and(|i| matches!(i, SendItem::Data { data, .. } if !data.is_empty()))
    }

    /// Write at most one frame (or header block) of stream `id`; a DATA
    /// payload goes to `payloads` (and its length to `referenced`) when
    /// given, long enough and there is room. Returns whether anything was
    /// written.
    fn write_stream(
        &mut self,
        _now: Instant,
        id: u32,
        out: &mut BytesMut,
        payloads: Option<&mut Payloads>,
        referenced: &mut usize,
    ) -> bool {
        let max_frame = self.remote.max_frame_size as usize;
        let conn_avail = self.conn_send.available();
        let Some(s) = self.streams.get_mut(&id) else {
            return false;
        };
        let Some(item) = s.queue.front_mut() else {
            return false;
        };
        let ended;
        match item {
            SendItem::Headers {
                headers,
                end_stream,
            } => {
                let end = *end_stream;
                self.scratch.clear();
                encode_block(&mut self.encoder, headers, &mut self.scratch);
                wire::encode_headers(id, &self.scratch, end, max_frame as u32, out);
                s.queue.pop_front();
                ended = end;
                self.pings.reset_strikes = true;
            }
            SendItem::Trailers(headers) => {
                self.scratch.clear();
                encode_block(&mut self.encoder, headers, &mut self.scratch);
                wire::encode_headers(id, &self.scratch, true, max_frame as u32, out);
                s.queue.pop_front();
                ended = true;
                self.pings.reset_strikes = true;
            }
            SendItem::Data { data, end_stream } => {
                if data.is_empty() {
                    wire::encode_data_head(id, 0, *end_stream, out);
                    ended = *end_stream;
                    s.queue.pop_front();
                } else {
                    let n = data
                        .len()
                        .min(max_frame)
                        .min(s.send.available())
                        .min(conn_avail);
                    if n == 0 {
                        return false;
                    }
                    let last = n == data.len();
                    let end = last && *end_stream;
                    wire::encode_data_head(id, n as u32, end, out);
                    match payloads {
                        Some(p) if n >= VECTORED_MIN && p.len() < MAX_VECTORED => {
                            p.push((out.len(), data.split_to(n)));
                            *referenced += n;
                        }
                        _ => {
                            out.put_slice(data.get(..n).unwrap_or_default());
                            data.advance(n);
                        }
                    }
                    s.send.spend(n);
                    s.queued -= n;
                    self.conn_send.spend(n);
                    if last {
                        s.queue.pop_front();
                    }
                    ended = end;
                    self.pings.reset_strikes = true;
                }
            }
        }
        if let Some(low) = s.drain_notify
            && s.queued <= low
        {
            s.drain_notify = None;
            self.events.push_back(Event::Writable { id });
        }
        if ended {
            s.close_local();
            if s.state == State::HalfClosedLocal && s.remote_initiated && !s.app_held {
                // Released by the application: the peer's side is not
                // needed any more.
                self.push_control(Control::Rst {
                    id,
                    reason: Reason::NO_ERROR,
                });
                self.close_stream(id, Closed::ResetByUs);
            } else {
                self.settle(id, false, Closed::Ended);
            }
        }
        true
    }
}

fn encode_block(encoder: &mut hpack::Encoder, headers: &Headers, dst: &mut BytesMut) {
    encoder.encode(
        headers.fields().iter().map(|f| hpack::Field {
            name: &f.name,
            value: &f.value,
            sensitive: f.sensitive,
        }),
        dst,
    );
}
