//! Input: `handle_input` splits the bytes into frames, dispatches them and
//! handles the connection-level ones (SETTINGS, PING, GOAWAY, WINDOW_UPDATE,
//! RST_STREAM) and frame errors; stream frames go to `streams`.

use std::time::Instant;

use bytes::{Buf, Bytes, BytesMut};
use konn_frames::Reason;
use konn_frames::h2::{self as wire, Frame, SettingId};

use super::{Connection, Control, Drain, Fail, GOAWAY_PING, KEEPALIVE_PING};
use crate::Error;
use crate::h2::flow::BDP_PING;
use crate::h2::stream::{Closed, State};
use crate::h2::{Event, Role};

impl Connection {
    /// Process the complete frames at the start of `input`, consuming them.
    /// A partial frame stays in `input` for the next call. Returns the
    /// connection error once the connection has failed (GOAWAY is queued:
    /// keep transmitting until [`Connection::is_closed`]).
    pub fn handle_input(&mut self, now: Instant, input: &mut BytesMut) -> Result<(), Error> {
        self.saw(now);
        if let Some(e) = self.error {
            return Err(e.to_error());
        }
        if !self.preface_received {
            match wire::decode_preface(input) {
                Ok(None) => return Ok(()),
                Ok(Some(n)) => {
                    input.advance(n);
                    self.preface_received = true;
                }
                Err(e) => {
                    self.fail(Fail::Frame(e), Bytes::new());
                    return Err(Error::Frame(e));
                }
            }
        }
        while self.wants_read() {
            let (frame, n) = match wire::decode(input, self.local.max_frame_size) {
                Ok(None) => break,
                Ok(Some(f)) => f,
                Err(e) => {
                    self.on_frame_error(now, e, input);
                    if self.error.is_some() {
                        break;
                    }
                    continue;
                }
            };
            self.stats.frames_received += 1;
            self.pings.last_recv = now;
            if !self.settings_received && !matches!(frame, Frame::Settings { ack: false, .. }) {
                // RFC 9113 §3.4: the peer's preface ends with SETTINGS.
                self.protocol_error(Reason::PROTOCOL_ERROR, "first frame is not SETTINGS");
                break;
            }
            if let Some(b) = &self.block
                && !matches!(frame, Frame::Continuation { stream_id, .. } if stream_id == b.id)
            {
                self.protocol_error(
                    Reason::PROTOCOL_ERROR,
                    "frame interleaved with a header block",
                );
                break;
            }
            if let Frame::Data {
                stream_id,
                end_stream,
                data,
                pad_len,
            } = frame
            {
                // Zero copy: the payload becomes a slice of the input buffer.
                let offset = data.as_ptr() as usize - input.as_ptr() as usize;
                let len = data.len();
                let flow = frame.flow_controlled_len();
                let _ = pad_len;
                let chunk = input.split_to(n).freeze();
                self.on_data(
                    now,
                    stream_id,
                    end_stream,
                    chunk.slice(offset..offset + len),
                    flow,
                );
            } else {
                self.on_frame(now, frame);
                input.advance(n);
            }
            if self.error.is_some() {
                break;
            }
        }
        match self.error {
            Some(e) => Err(e.to_error()),
            None => Ok(()),
        }
    }

    /// A frame-level error from the decoder. Stream errors reset that stream
    /// and skip the frame; connection errors fail the connection.
    fn on_frame_error(&mut self, now: Instant, e: konn_frames::Error, input: &mut BytesMut) {
        let head = input
            .first_chunk::<{ wire::HEAD_LEN }>()
            .map(wire::Head::parse);
        let (Some((reason, konn_frames::Scope::Stream(id))), Some(head)) = (e.h2(), head) else {
            self.fail(Fail::Frame(e), Bytes::new());
            return;
        };
        let n = head.frame_len();
        let Some(payload) = input.get(wire::HEAD_LEN..n) else {
            self.fail(Fail::Frame(e), Bytes::new());
            return;
        };
        self.stats.frames_received += 1;
        if head.ty == wire::FrameType::HEADERS
            && matches!(e, konn_frames::Error::SelfDependency { .. })
        {
            // The header block must still be decoded to keep HPACK in sync.
            let payload = payload.to_vec();
            match Frame::load_allowing_self_dependency(head, &payload) {
                Ok(Frame::Headers {
                    stream_id,
                    end_stream,
                    end_headers,
                    fragment,
                    ..
                }) => self.on_headers(
                    now,
                    stream_id,
                    end_stream,
                    end_headers,
                    fragment,
                    Some(reason),
                ),
                _ => {
                    self.fail(Fail::Frame(e), Bytes::new());
                    return;
                }
            }
        } else {
            self.stream_error(now, id, reason);
        }
        input.advance(n);
    }

    fn on_frame(&mut self, now: Instant, frame: Frame<'_>) {
        match frame {
            Frame::Data { .. } => unreachable_data(),
            Frame::Headers {
                stream_id,
                end_stream,
                end_headers,
                fragment,
                ..
            } => self.on_headers(now, stream_id, end_stream, end_headers, fragment, None),
            Frame::Continuation {
                stream_id,
                end_headers,
                fragment,
            } => self.on_continuation(now, stream_id, end_headers, fragment),
            Frame::Priority { .. } => {} // deprecated (RFC 9113 §5.3.2); validated by the decoder
            Frame::RstStream { stream_id, reason } => self.on_rst(now, stream_id, reason),
            Frame::Settings { ack, params } => {
                if ack {
                    return;
                }
                for (id, value) in params.iter() {
                    if let Err(e) = self.apply_setting(id, value) {
                        self.fail(Fail::Frame(e), Bytes::new());
                        return;
                    }
                }
                self.settings_received = true;
                self.push_control(Control::SettingsAck);
            }
            Frame::PushPromise { .. } => {
                // We always advertise ENABLE_PUSH=0, and a client may never push.
                self.protocol_error(Reason::PROTOCOL_ERROR, "PUSH_PROMISE received");
            }
            Frame::Ping { ack, payload } => self.on_ping(now, ack, payload),
            Frame::GoAway {
                last_stream_id,
                reason,
                debug_data,
            } => self.on_goaway(last_stream_id, reason, debug_data),
            Frame::WindowUpdate {
                stream_id,
                increment,
            } => self.on_window_update(now, stream_id, increment),
            // Unknown frame types are ignored (RFC 9113 §5.5), but they
            // count as empty-frame noise when they carry nothing.
            Frame::Unknown { payload, .. } => {
                if payload.is_empty() {
                    self.count_empty();
                }
            }
        }
    }

    fn apply_setting(&mut self, id: SettingId, value: u32) -> Result<(), konn_frames::Error> {
        if id == SettingId::ENABLE_PUSH && value == 1 && self.cfg.role == Role::Client {
            // A server must not send ENABLE_PUSH=1 (RFC 9113 §6.5.2).
            return Err(konn_frames::Error::InvalidSetting { id: id.0, value });
        }
        let old_window = self.remote.initial_window_size;
        self.remote.apply(id, value)?;
        match id {
            SettingId::INITIAL_WINDOW_SIZE => {
                let delta = i64::from(self.remote.initial_window_size) - i64::from(old_window);
                let mut overflow = false;
                let mut opened = Vec::new();
                for (&sid, s) in &mut self.streams {
                    overflow |= s.send.adjust(delta).is_err();
                    if delta > 0 && !s.queue.is_empty() {
                        opened.push(sid);
                    }
                }
                if overflow {
                    // RFC 9113 §6.9.2: a window above 2^31-1 is a connection error.
                    return Err(konn_frames::Error::InvalidSetting { id: id.0, value });
                }
                for sid in opened {
                    self.mark_ready(sid);
                }
            }
            SettingId::HEADER_TABLE_SIZE => {
                self.encoder
                    .set_max_table_size(value.min(self.cfg.max_encoder_table_size));
            }
            _ => {}
        }
        Ok(())
    }

    fn on_ping(&mut self, now: Instant, ack: bool, payload: [u8; 8]) {
        if ack {
            match payload {
                BDP_PING => self.on_bdp_ack(now),
                KEEPALIVE_PING => self.pings.ka_deadline = None,
                GOAWAY_PING if self.drain == Drain::AwaitingPing => self.final_goaway(),
                _ => {}
            }
            return;
        }
        self.stats.pings_received += 1;
        self.push_control(Control::Ping { ack: true, payload });
        let Some(policy) = self.cfg.ping_policy else {
            return;
        };
        let last = self.pings.last_peer_ping.replace(now);
        if std::mem::take(&mut self.pings.reset_strikes) {
            self.pings.strikes = 0;
            return;
        }
        let min_time = if self.remote_active == 0 && !policy.permit_without_stream {
            // grpc-go: without streams a ping is only fine after 2 hours.
            std::time::Duration::from_secs(2 * 3600)
        } else {
            policy.min_time
        };
        if last.is_some_and(|l| now.saturating_duration_since(l) < min_time) {
            self.pings.strikes += 1;
        }
        if self.pings.strikes > policy.max_strikes {
            self.fail(
                Fail::Local {
                    reason: Reason::ENHANCE_YOUR_CALM,
                    what: "too_many_pings",
                },
                Bytes::from_static(b"too_many_pings"),
            );
        }
    }

    fn on_bdp_ack(&mut self, now: Instant) {
        let window = self.local.initial_window_size;
        let Some(grown) = self.bdp.as_mut().and_then(|b| b.on_ack(now, window)) else {
            return;
        };
        let delta = grown - window;
        self.local.initial_window_size = grown;
        self.push_control(Control::InitialWindow(grown));
        for s in self.streams.values_mut() {
            s.recv.grow_to(grown);
        }
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            if let Some(inc) = self.streams.get_mut(&id).and_then(|s| s.recv.take_growth()) {
                self.push_control(Control::WindowUpdate { id, inc });
            }
        }
        self.conn_recv
            .grow_to(self.conn_recv.target().saturating_add(delta));
        if let Some(inc) = self.conn_recv.take_growth() {
            self.push_control(Control::WindowUpdate { id: 0, inc });
        }
    }

    fn on_goaway(&mut self, last_stream_id: u32, reason: Reason, debug: &[u8]) {
        self.goaway_recv = Some(last_stream_id);
        let refused: Vec<u32> = self
            .streams
            .iter()
            .filter(|(id, s)| !s.remote_initiated && **id > last_stream_id)
            .map(|(id, _)| *id)
            .collect();
        for id in refused {
            self.close_stream(id, Closed::Other);
            self.events.push_back(Event::Reset {
                id,
                reason: Reason::REFUSED_STREAM,
                remote: true,
            });
        }
        self.events.push_back(Event::GoAway {
            last_stream_id,
            reason,
            debug: Bytes::copy_from_slice(debug),
        });
        if reason != Reason::NO_ERROR {
            // The peer is closing the connection because of an error.
            self.fail(Fail::Remote(reason), Bytes::new());
        } else if self.drain == Drain::None {
            self.drain = Drain::Final;
        }
    }

    fn on_window_update(&mut self, now: Instant, id: u32, inc: u32) {
        if id == 0 {
            if self.conn_send.increase(inc).is_err() {
                self.protocol_error(Reason::FLOW_CONTROL_ERROR, "connection window above 2^31-1");
                return;
            }
            let waiting: Vec<u32> = self
                .streams
                .iter()
                .filter(|(_, s)| !s.queue.is_empty() && !s.in_ready)
                .map(|(id, _)| *id)
                .collect();
            for id in waiting {
                self.mark_ready(id);
            }
            return;
        }
        if self.is_idle(id) {
            self.protocol_error(Reason::PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream");
            return;
        }
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if s.state == State::Closed {
            return;
        }
        if s.send.increase(inc).is_err() {
            self.stream_error(now, id, Reason::FLOW_CONTROL_ERROR);
            return;
        }
        if !s.queue.is_empty() {
            self.mark_ready(id);
        }
    }

    fn on_rst(&mut self, now: Instant, id: u32, reason: Reason) {
        if self.is_idle(id) {
            self.protocol_error(Reason::PROTOCOL_ERROR, "RST_STREAM on an idle stream");
            return;
        }
        let Some(s) = self.streams.get(&id) else {
            return;
        };
        if s.state == State::Closed {
            return;
        }
        self.stats.remote_resets += 1;
        if s.remote_initiated && !self.remote_resets.take(now) {
            self.protocol_error(Reason::ENHANCE_YOUR_CALM, "too many stream resets");
            return;
        }
        self.close_stream(id, Closed::Other);
        self.events.push_back(Event::Reset {
            id,
            reason,
            remote: true,
        });
    }

    /// A HEADERS or DATA frame on a stream that is no longer in the table.
    pub(super) fn on_closed_stream_frame(&mut self, now: Instant, id: u32, headers: bool) {
        match self.closed.get(id) {
            Some(Closed::ResetByUs) => {} // in flight when we reset it: ignore
            Some(Closed::Other) => self.stream_error(now, id, Reason::STREAM_CLOSED),
            // Both sides sent END_STREAM: the peer cannot have had this in
            // flight, so it is a connection error (RFC 9113 §5.1 "closed").
            Some(Closed::Ended) => {
                self.protocol_error(Reason::STREAM_CLOSED, "frame after END_STREAM")
            }
            // Below the highest id but not remembered. New HEADERS there
            // reuse an id (RFC 9113 §5.1.1: PROTOCOL_ERROR); anything else
            // is on an implicitly closed stream (§5.1: STREAM_CLOSED).
            None if headers => self.protocol_error(
                Reason::PROTOCOL_ERROR,
                "stream id not greater than the last",
            ),
            None => self.protocol_error(Reason::STREAM_CLOSED, "frame on a closed stream"),
        }
    }

    pub(super) fn release_conn(&mut self, n: u32) {
        if let Some(inc) = self.conn_recv.release(n) {
            self.push_control(Control::WindowUpdate { id: 0, inc });
        }
    }

    /// A stream id that was never opened (RFC 9113 §5.1 "idle").
    pub(super) fn is_idle(&self, id: u32) -> bool {
        let remote_parity = match self.cfg.role {
            Role::Server => 1,
            Role::Client => 0,
        };
        if id % 2 == remote_parity {
            id > self.last_remote_id
        } else {
            id >= self.next_local_id
        }
    }

    pub(super) fn count_empty(&mut self) {
        self.empty_frames += 1;
        if self.empty_frames > self.cfg.limits.max_empty_frames {
            self.protocol_error(Reason::ENHANCE_YOUR_CALM, "too many empty frames");
        }
    }
}

#[cold]
fn unreachable_data() {
    debug_assert!(false, "DATA frames are handled by on_data");
}
