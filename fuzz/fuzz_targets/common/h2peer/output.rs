//! Decodes and checks everything the connection writes.

use bytes::Bytes;
use konn_frames::Reason;
use konn_frames::h2::{self as wire, Frame};
use konn_frames::hpack;
use konn_protocol::Error;
use konn_protocol::h2::{Connection, Role};

/// Decodes and checks everything the connection writes.
pub(super) struct Output {
    /// Client role: the preface is still to come.
    preface_due: bool,
    /// Something was written: the connection's own SETTINGS (and window
    /// growth) may lead only the first output that has frames (a server
    /// writes them once the client's preface has come, or before a GOAWAY).
    wrote_any: bool,
    hpack: hpack::Decoder,
    hpack_max: u32,
    /// A header block is open on this stream (CONTINUATION must follow).
    open_block: Option<u32>,
    /// The GOAWAY that reports our connection error has been written.
    final_goaway: bool,
    /// The header block being collected.
    pending: Vec<u8>,
}

impl Output {
    pub(super) fn new(role: Role) -> Self {
        let limits = hpack::DecoderLimits {
            max_header_list_size: u32::MAX,
            max_string_len: u32::MAX,
            max_fields: u32::MAX,
            max_size_updates: 8,
        };
        Self {
            preface_due: role == Role::Client,
            wrote_any: false,
            hpack: hpack::Decoder::with_limits(4096, limits),
            hpack_max: 4096,
            open_block: None,
            final_goaway: false,
            pending: Vec::new(),
        }
    }

    /// Checks one `poll_transmit`'s output; `failed` is the connection's
    /// error before the call. Returns the DATA written per stream.
    pub(super) fn check(
        &mut self,
        conn: &Connection,
        failed: Option<Error>,
        mut out: &[u8],
        data: &mut Vec<(u32, Bytes)>,
    ) -> Result<(), String> {
        if self.preface_due {
            if !out.starts_with(wire::PREFACE) {
                return Err("client output does not start with the preface".into());
            }
            out = &out[wire::PREFACE.len()..];
            self.preface_due = false;
        }
        let limit = conn.remote_settings().max_frame_size;
        let table = conn.remote_settings().header_table_size;
        if table > self.hpack_max {
            self.hpack_max = table;
            self.hpack.set_max_table_size(table);
        }
        let mut first = !self.wrote_any && !out.is_empty();
        self.wrote_any |= !out.is_empty();
        while !out.is_empty() {
            let (frame, n) = match wire::decode(out, wire::MAX_FRAME_LEN) {
                Ok(Some(f)) => f,
                Ok(None) => return Err(format!("partial frame written: {out:?}")),
                Err(e) => return Err(format!("undecodable frame written: {e} in {out:?}")),
            };
            let head = frame.head();
            if head.len > limit {
                return Err(format!(
                    "wrote a {}-byte frame, peer allows {limit}",
                    head.len
                ));
            }
            if let Some(id) = self.open_block
                && !matches!(frame, Frame::Continuation { stream_id, .. } if stream_id == id)
            {
                return Err(format!("{frame:?} inside a header block of stream {id}"));
            }
            if let Some(e) = &failed {
                let initial = first
                    && matches!(
                        frame,
                        Frame::Settings { ack: false, .. }
                            | Frame::WindowUpdate { stream_id: 0, .. }
                    );
                if !initial {
                    let want = match e {
                        Error::H2Local { reason, .. } => Some(*reason),
                        Error::Frame(f) => Some(f.h2().map_or(Reason::PROTOCOL_ERROR, |(r, _)| r)),
                        _ => None,
                    };
                    match frame {
                        Frame::GoAway { reason, .. }
                            if !self.final_goaway && Some(reason) == want =>
                        {
                            self.final_goaway = true;
                        }
                        _ => {
                            return Err(format!(
                                "after connection error {e:?} (GOAWAY written: {}) wrote {frame:?}",
                                self.final_goaway
                            ));
                        }
                    }
                }
            }
            first = first && matches!(frame, Frame::Settings { .. } | Frame::WindowUpdate { .. });
            match frame {
                Frame::Headers {
                    stream_id,
                    end_headers,
                    fragment,
                    ..
                } => {
                    self.block(stream_id, end_headers, fragment)?;
                }
                Frame::Continuation {
                    stream_id,
                    end_headers,
                    fragment,
                } => {
                    if self.open_block != Some(stream_id) {
                        return Err(format!("stray CONTINUATION on {stream_id}"));
                    }
                    self.block(stream_id, end_headers, fragment)?;
                }
                Frame::Data {
                    stream_id,
                    data: d,
                    pad_len,
                    ..
                } => {
                    if pad_len.is_some() {
                        return Err("konn pads DATA".into());
                    }
                    data.push((stream_id, Bytes::copy_from_slice(d)));
                }
                Frame::PushPromise { .. } => return Err("konn pushed".into()),
                _ => {}
            }
            out = &out[n..];
        }
        Ok(())
    }

    fn block(&mut self, id: u32, end: bool, fragment: &[u8]) -> Result<(), String> {
        // Each of konn's header blocks is written in one go; decode the
        // pieces as they come (the decoder needs whole blocks: collect).
        self.pending.extend_from_slice(fragment);
        if !end {
            self.open_block = Some(id);
            return Ok(());
        }
        self.open_block = None;
        let block = std::mem::take(&mut self.pending);
        self.hpack
            .decode(&block, &mut |_f: hpack::HeaderField<'_>| {})
            .map_err(|e| format!("our header block on {id} does not decode: {e}"))
    }
}
