//! Stream frames from the peer: header blocks (HEADERS + CONTINUATION:
//! requests, responses and trailers) and DATA with its flow control.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use konn_frames::Reason;
use konn_frames::hpack;

use super::{Connection, Control, Fail, PartialBlock};
use crate::h2::flow::{BDP_PING, RecvWindow, SendWindow};
use crate::h2::headers::Headers;
use crate::h2::stream::{Closed, Stream};
use crate::h2::{Event, Role};

impl Connection {
    pub(super) fn on_headers(
        &mut self,
        now: Instant,
        id: u32,
        end_stream: bool,
        end_headers: bool,
        fragment: &[u8],
        reset: Option<Reason>,
    ) {
        if fragment.is_empty() && !end_headers && !end_stream {
            self.count_empty();
        }
        if end_headers {
            self.on_block(now, id, end_stream, fragment, reset);
            return;
        }
        if fragment.len() > self.cfg.limits.max_header_block {
            self.protocol_error(Reason::ENHANCE_YOUR_CALM, "header block too large");
            return;
        }
        let mut buf = BytesMut::with_capacity(fragment.len() * 2);
        buf.extend_from_slice(fragment);
        self.block = Some(Box::new(PartialBlock {
            id,
            end_stream,
            reset,
            buf,
            continuations: 0,
        }));
    }

    pub(super) fn on_continuation(
        &mut self,
        now: Instant,
        id: u32,
        end_headers: bool,
        fragment: &[u8],
    ) {
        if fragment.is_empty() && !end_headers {
            self.count_empty();
        }
        let limits = &self.cfg.limits;
        let Some(block) = self.block.as_mut().filter(|b| b.id == id) else {
            self.protocol_error(
                Reason::PROTOCOL_ERROR,
                "CONTINUATION without a header block",
            );
            return;
        };
        block.continuations += 1;
        if block.continuations > limits.max_continuation_frames
            || block.buf.len() + fragment.len() > limits.max_header_block
        {
            self.protocol_error(Reason::ENHANCE_YOUR_CALM, "CONTINUATION flood");
            return;
        }
        block.buf.extend_from_slice(fragment);
        if end_headers && let Some(b) = self.block.take() {
            self.on_block(now, b.id, b.end_stream, &b.buf, b.reset);
        }
    }

    /// A complete header block on stream `id`.
    fn on_block(
        &mut self,
        now: Instant,
        id: u32,
        end_stream: bool,
        block: &[u8],
        reset: Option<Reason>,
    ) {
        // Decode first, whatever happens to the stream: HPACK state is
        // connection-wide and must stay in sync with the peer.
        let mut builder = Headers::builder(block.len());
        let decoded = self
            .decoder
            .decode(block, &mut |f: hpack::HeaderField<'_>| {
                builder.add(f.name, f.value, f.never_indexed)
            });
        let headers = match decoded {
            Ok(()) => builder.finish(),
            Err(konn_frames::Error::HeaderListTooLarge { .. }) => {
                self.stream_error_on_block(now, id, Reason::PROTOCOL_ERROR);
                return;
            }
            Err(e) => {
                self.fail(Fail::Frame(e), Bytes::new());
                return;
            }
        };
        if let Some(reason) = reset {
            self.stream_error_on_block(now, id, reason);
            return;
        }
        match self.cfg.role {
            Role::Server => self.on_request_block(now, id, end_stream, headers),
            Role::Client => self.on_response_block(now, id, end_stream, headers),
        }
    }

    /// A header block that must reset its stream: opens it first if it is a
    /// new stream so the reset refers to a known id.
    fn stream_error_on_block(&mut self, now: Instant, id: u32, reason: Reason) {
        if self.cfg.role == Role::Server && id % 2 == 1 && id > self.last_remote_id {
            self.last_remote_id = id;
        }
        self.stream_error(now, id, reason);
    }

    fn on_request_block(&mut self, now: Instant, id: u32, end_stream: bool, headers: Headers) {
        if id.is_multiple_of(2) {
            self.protocol_error(Reason::PROTOCOL_ERROR, "client opened an even stream id");
            return;
        }
        if id > self.last_remote_id {
            // A new stream.
            self.last_remote_id = id;
            if self.goaway_sent.is_some_and(|last| id > last) {
                return; // refused by our GOAWAY; ignored (RFC 9113 §6.8)
            }
            if self.remote_active >= self.cfg.max_concurrent_streams as usize {
                self.stream_error(now, id, Reason::REFUSED_STREAM);
                return;
            }
            let Ok(content_length) = headers.check_request() else {
                self.stream_error(now, id, Reason::PROTOCOL_ERROR);
                return;
            };
            let mut s = Stream::new(
                true,
                RecvWindow::new(
                    self.local.initial_window_size,
                    self.local.initial_window_size,
                ),
                SendWindow::new(self.remote.initial_window_size),
            );
            s.headers_received = true;
            s.content_length = content_length;
            if end_stream {
                if content_length.is_some_and(|cl| cl != 0) {
                    self.stream_error(now, id, Reason::PROTOCOL_ERROR);
                    return;
                }
                s.close_remote();
            }
            self.streams.insert(id, s);
            self.idle_since = None;
            self.remote_active += 1;
            self.events.push_back(Event::Headers {
                id,
                headers,
                end_stream,
            });
            return;
        }
        self.on_later_block(now, id, end_stream, headers);
    }

    fn on_response_block(&mut self, now: Instant, id: u32, end_stream: bool, headers: Headers) {
        if id.is_multiple_of(2) {
            self.protocol_error(Reason::PROTOCOL_ERROR, "server opened a stream");
            return;
        }
        if id >= self.next_local_id {
            self.protocol_error(Reason::PROTOCOL_ERROR, "HEADERS on an idle stream");
            return;
        }
        let Some(s) = self.streams.get_mut(&id) else {
            self.on_closed_stream_frame(now, id, true);
            return;
        };
        if !s.headers_received {
            let Ok(content_length) = headers.check_response() else {
                self.stream_error(now, id, Reason::PROTOCOL_ERROR);
                return;
            };
            if headers.status().is_some_and(|st| (100..200).contains(&st)) {
                // Informational response: the final one follows.
                if end_stream {
                    self.stream_error(now, id, Reason::PROTOCOL_ERROR);
                }
                return;
            }
            s.headers_received = true;
            s.content_length = content_length;
            if end_stream {
                s.close_remote();
            }
            self.events.push_back(Event::Headers {
                id,
                headers,
                end_stream,
            });
            self.settle(id, false, Closed::Ended);
            return;
        }
        self.on_later_block(now, id, end_stream, headers);
    }

    /// A header block on a stream that already had its headers: trailers.
    fn on_later_block(&mut self, now: Instant, id: u32, end_stream: bool, headers: Headers) {
        let Some(s) = self.streams.get_mut(&id) else {
            self.on_closed_stream_frame(now, id, true);
            return;
        };
        if !s.recv_open() {
            self.stream_error(now, id, Reason::STREAM_CLOSED);
            return;
        }
        // RFC 9113 §8.1: a second header block must end the stream and may
        // not carry pseudo-headers.
        if !end_stream || headers.check_trailers().is_err() {
            self.stream_error(now, id, Reason::PROTOCOL_ERROR);
            return;
        }
        if s.content_length.is_some_and(|cl| cl != s.data_received) {
            self.stream_error(now, id, Reason::PROTOCOL_ERROR);
            return;
        }
        s.close_remote();
        self.events.push_back(Event::Trailers { id, headers });
        self.settle(id, false, Closed::Ended);
    }

    pub(super) fn on_data(
        &mut self,
        now: Instant,
        id: u32,
        end_stream: bool,
        data: Bytes,
        flow: u32,
    ) {
        if self.conn_recv.consume(flow).is_err() {
            self.protocol_error(Reason::FLOW_CONTROL_ERROR, "connection window exceeded");
            return;
        }
        if data.is_empty() && !end_stream {
            self.count_empty();
            if self.error.is_some() {
                return;
            }
        } else {
            self.empty_frames = 0;
        }
        if self.is_idle(id) {
            self.protocol_error(Reason::PROTOCOL_ERROR, "DATA on an idle stream");
            return;
        }
        let padding = flow - u32::try_from(data.len()).unwrap_or(flow);
        let Some(s) = self.streams.get_mut(&id) else {
            // Closed: keep the connection window honest, then STREAM_CLOSED
            // unless this is a late frame after our own RST_STREAM.
            self.release_conn(flow);
            self.on_closed_stream_frame(now, id, false);
            return;
        };
        if !s.recv_open() || !s.headers_received {
            let closed = !s.recv_open();
            self.release_conn(flow);
            let reason = if closed {
                Reason::STREAM_CLOSED
            } else {
                Reason::PROTOCOL_ERROR
            };
            self.stream_error(now, id, reason);
            return;
        }
        if s.recv.consume(flow).is_err() {
            self.release_conn(flow);
            self.stream_error(now, id, Reason::FLOW_CONTROL_ERROR);
            return;
        }
        s.data_received += data.len() as u64;
        if s.content_length
            .is_some_and(|cl| s.data_received > cl || (end_stream && s.data_received != cl))
        {
            self.release_conn(flow);
            self.stream_error(now, id, Reason::PROTOCOL_ERROR);
            return;
        }
        if end_stream {
            s.close_remote();
        }
        if padding > 0 {
            // The application never sees padding: return its credit now.
            self.release_capacity(id, padding as usize);
        }
        if let Some(bdp) = &mut self.bdp
            && bdp.on_data(now, flow as usize)
        {
            self.push_control(Control::Ping {
                ack: false,
                payload: BDP_PING,
            });
        }
        self.events.push_back(Event::Data {
            id,
            data,
            end_stream,
        });
        if end_stream {
            self.settle(id, false, Closed::Ended);
        }
    }
}
