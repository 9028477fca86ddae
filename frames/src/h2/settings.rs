//! SETTINGS parameters (RFC 9113 §6.5): identifiers, the validated
//! zero-copy parameter view of a received frame, and the typed [`Settings`].
//!
//! Values are validated when the frame is loaded ([`SettingsParams::new`]),
//! before anything is applied, so a frame with one bad value is rejected as
//! a whole and iterating a [`SettingsParams`] cannot fail. [`Settings`] is
//! the state one side of a connection keeps for the *other* side (or for
//! itself): RFC defaults, [`Settings::apply`] for received parameters and an
//! encoder that writes only what differs from a baseline, so the first
//! SETTINGS frame stays short and later ones carry only changes.

use bytes::BufMut;

use super::encode::encode_settings;
use crate::error::Error;

/// Default SETTINGS_HEADER_TABLE_SIZE (RFC 9113 §6.5.2).
pub const DEFAULT_HEADER_TABLE_SIZE: u32 = 4096;
/// Default SETTINGS_INITIAL_WINDOW_SIZE, also the initial connection window.
pub const DEFAULT_INITIAL_WINDOW_SIZE: u32 = 65_535;
/// Default and smallest allowed SETTINGS_MAX_FRAME_SIZE.
pub const DEFAULT_MAX_FRAME_SIZE: u32 = 16_384;
/// Largest flow-control window (and SETTINGS_INITIAL_WINDOW_SIZE): 2^31 - 1.
pub const MAX_WINDOW_SIZE: u32 = (1 << 31) - 1;

/// Size of one parameter on the wire: 16-bit identifier, 32-bit value.
const PARAM_LEN: usize = 6;

/// A SETTINGS parameter identifier (RFC 9113 §6.5.2, §11.3).
///
/// Open: unknown identifiers are kept and ignored, as the RFC requires.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SettingId(pub u16);

impl SettingId {
    /// Maximum HPACK dynamic table size the sender's decoder allows.
    pub const HEADER_TABLE_SIZE: Self = Self(0x1);
    /// Whether server push is allowed (0 or 1).
    pub const ENABLE_PUSH: Self = Self(0x2);
    /// Maximum number of concurrent streams the sender allows the peer to open.
    pub const MAX_CONCURRENT_STREAMS: Self = Self(0x3);
    /// Initial stream-level flow-control window (≤ 2^31 - 1).
    pub const INITIAL_WINDOW_SIZE: Self = Self(0x4);
    /// Largest frame payload the sender accepts (2^14 ..= 2^24 - 1).
    pub const MAX_FRAME_SIZE: Self = Self(0x5);
    /// Advisory maximum size of a header list the sender accepts.
    pub const MAX_HEADER_LIST_SIZE: Self = Self(0x6);
    /// Extended CONNECT (RFC 8441 §3), 0 or 1.
    pub const ENABLE_CONNECT_PROTOCOL: Self = Self(0x8);
    /// The sender does not use RFC 7540 priorities (RFC 9218 §2.1), 0 or 1.
    pub const NO_RFC7540_PRIORITIES: Self = Self(0x9);

    /// The parameter's RFC name, or `None` for an identifier this crate does
    /// not know.
    pub const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0x1 => "SETTINGS_HEADER_TABLE_SIZE",
            0x2 => "SETTINGS_ENABLE_PUSH",
            0x3 => "SETTINGS_MAX_CONCURRENT_STREAMS",
            0x4 => "SETTINGS_INITIAL_WINDOW_SIZE",
            0x5 => "SETTINGS_MAX_FRAME_SIZE",
            0x6 => "SETTINGS_MAX_HEADER_LIST_SIZE",
            0x8 => "SETTINGS_ENABLE_CONNECT_PROTOCOL",
            0x9 => "SETTINGS_NO_RFC7540_PRIORITIES",
            _ => return None,
        })
    }
}

impl core::fmt::Debug for SettingId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "SettingId({:#x})", self.0),
        }
    }
}

/// Checks a parameter value against the range its identifier allows.
///
/// Errors are [`Error::InvalidSetting`]; [`Error::h2`] maps an oversized
/// INITIAL_WINDOW_SIZE to FLOW_CONTROL_ERROR and the rest to PROTOCOL_ERROR.
/// Unknown identifiers accept any value.
pub fn check_setting(id: SettingId, value: u32) -> Result<(), Error> {
    let ok = match id {
        SettingId::ENABLE_PUSH
        | SettingId::ENABLE_CONNECT_PROTOCOL
        | SettingId::NO_RFC7540_PRIORITIES => value <= 1,
        SettingId::INITIAL_WINDOW_SIZE => value <= MAX_WINDOW_SIZE,
        SettingId::MAX_FRAME_SIZE => {
            (DEFAULT_MAX_FRAME_SIZE..=super::MAX_FRAME_LEN).contains(&value)
        }
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidSetting { id: id.0, value })
    }
}

/// The parameters of a received SETTINGS frame: a validated, zero-copy view
/// of its payload.
///
/// Construction ([`SettingsParams::new`]) checks the length and every value,
/// so [`iter`](Self::iter) yields `(SettingId, value)` pairs without errors,
/// in wire order (the order in which RFC 9113 §6.5.3 says to apply them).
/// Equality compares the raw bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SettingsParams<'a> {
    bytes: &'a [u8],
}

impl<'a> SettingsParams<'a> {
    /// No parameters (e.g. the payload of a SETTINGS ACK).
    pub const EMPTY: SettingsParams<'static> = SettingsParams { bytes: &[] };

    /// Validates a SETTINGS payload: a multiple of 6 bytes
    /// ([`Error::BadFrameSize`] otherwise) whose known parameters have
    /// allowed values ([`check_setting`]).
    pub fn new(bytes: &'a [u8]) -> Result<Self, Error> {
        if !bytes.len().is_multiple_of(PARAM_LEN) {
            return Err(Error::BadFrameSize {
                ty: super::FrameType::SETTINGS.0,
                len: super::frame::len_u32(bytes.len()),
                stream_id: 0,
            });
        }
        let params = Self { bytes };
        params
            .iter()
            .try_for_each(|(id, value)| check_setting(id, value))?;
        Ok(params)
    }

    /// Iterates over `(identifier, value)` pairs in wire order.
    pub fn iter(&self) -> SettingsIter<'a> {
        SettingsIter {
            chunks: self.bytes.chunks_exact(PARAM_LEN),
        }
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.bytes.len() / PARAM_LEN
    }

    /// Whether there are no parameters.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The raw payload bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

impl core::fmt::Debug for SettingsParams<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<'a> IntoIterator for SettingsParams<'a> {
    type Item = (SettingId, u32);
    type IntoIter = SettingsIter<'a>;

    fn into_iter(self) -> SettingsIter<'a> {
        self.iter()
    }
}

/// Iterator over the `(identifier, value)` pairs of a [`SettingsParams`].
#[derive(Clone, Debug)]
pub struct SettingsIter<'a> {
    chunks: core::slice::ChunksExact<'a, u8>,
}

impl Iterator for SettingsIter<'_> {
    type Item = (SettingId, u32);

    #[inline]
    fn next(&mut self) -> Option<(SettingId, u32)> {
        let &[i0, i1, v0, v1, v2, v3] = self.chunks.next()? else {
            // chunks_exact only yields PARAM_LEN-byte chunks.
            return None;
        };
        Some((
            SettingId(u16::from_be_bytes([i0, i1])),
            u32::from_be_bytes([v0, v1, v2, v3]),
        ))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.chunks.size_hint()
    }
}

impl ExactSizeIterator for SettingsIter<'_> {}

/// The SETTINGS of one side of a connection, starting at the RFC defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Settings {
    /// SETTINGS_HEADER_TABLE_SIZE (default 4096).
    pub header_table_size: u32,
    /// SETTINGS_ENABLE_PUSH (default `true`). gRPC clients send `false`.
    pub enable_push: bool,
    /// SETTINGS_MAX_CONCURRENT_STREAMS (default `None`: unlimited).
    pub max_concurrent_streams: Option<u32>,
    /// SETTINGS_INITIAL_WINDOW_SIZE (default 65535, at most 2^31 - 1).
    pub initial_window_size: u32,
    /// SETTINGS_MAX_FRAME_SIZE (default 16384, 16384 ..= 2^24 - 1).
    pub max_frame_size: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE (default `None`: unlimited).
    pub max_header_list_size: Option<u32>,
    /// SETTINGS_ENABLE_CONNECT_PROTOCOL (RFC 8441, default `false`).
    pub enable_connect_protocol: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            header_table_size: DEFAULT_HEADER_TABLE_SIZE,
            enable_push: true,
            max_concurrent_streams: None,
            initial_window_size: DEFAULT_INITIAL_WINDOW_SIZE,
            max_frame_size: DEFAULT_MAX_FRAME_SIZE,
            max_header_list_size: None,
            enable_connect_protocol: false,
        }
    }
}

impl Settings {
    /// Applies one received parameter. Validates the value
    /// ([`check_setting`]) and rejects turning ENABLE_CONNECT_PROTOCOL off
    /// once it was on (RFC 8441 §3) with [`Error::InvalidSetting`].
    /// Unknown identifiers are ignored.
    ///
    /// Role-specific rules (a server must not send ENABLE_PUSH = 1) and the
    /// window adjustment an INITIAL_WINDOW_SIZE change causes are the
    /// connection's job: compare the field before and after.
    pub fn apply(&mut self, id: SettingId, value: u32) -> Result<(), Error> {
        check_setting(id, value)?;
        match id {
            SettingId::HEADER_TABLE_SIZE => self.header_table_size = value,
            SettingId::ENABLE_PUSH => self.enable_push = value == 1,
            SettingId::MAX_CONCURRENT_STREAMS => self.max_concurrent_streams = Some(value),
            SettingId::INITIAL_WINDOW_SIZE => self.initial_window_size = value,
            SettingId::MAX_FRAME_SIZE => self.max_frame_size = value,
            SettingId::MAX_HEADER_LIST_SIZE => self.max_header_list_size = Some(value),
            SettingId::ENABLE_CONNECT_PROTOCOL => {
                if self.enable_connect_protocol && value == 0 {
                    return Err(Error::InvalidSetting { id: id.0, value });
                }
                self.enable_connect_protocol = value == 1;
            }
            _ => {}
        }
        Ok(())
    }

    /// Applies every parameter of a received frame, in order.
    pub fn apply_all(&mut self, params: SettingsParams<'_>) -> Result<(), Error> {
        params
            .iter()
            .try_for_each(|(id, value)| self.apply(id, value))
    }

    /// The parameters whose value in `self` differs from `base`, in
    /// identifier order, without allocating. An unlimited (`None`) limit
    /// that differs is written as `u32::MAX`, the closest a SETTINGS frame
    /// can say.
    pub fn changes(&self, base: &Self) -> impl ExactSizeIterator<Item = (SettingId, u32)> + use<> {
        let (params, n) = self.changes_array(base);
        params.into_iter().take(n)
    }

    /// [`Settings::changes`] as a fixed array and its used length.
    fn changes_array(&self, base: &Self) -> ([(SettingId, u32); 7], usize) {
        let fields = [
            (
                self.header_table_size != base.header_table_size,
                SettingId::HEADER_TABLE_SIZE,
                self.header_table_size,
            ),
            (
                self.enable_push != base.enable_push,
                SettingId::ENABLE_PUSH,
                self.enable_push.into(),
            ),
            (
                self.max_concurrent_streams != base.max_concurrent_streams,
                SettingId::MAX_CONCURRENT_STREAMS,
                self.max_concurrent_streams.unwrap_or(u32::MAX),
            ),
            (
                self.initial_window_size != base.initial_window_size,
                SettingId::INITIAL_WINDOW_SIZE,
                self.initial_window_size,
            ),
            (
                self.max_frame_size != base.max_frame_size,
                SettingId::MAX_FRAME_SIZE,
                self.max_frame_size,
            ),
            (
                self.max_header_list_size != base.max_header_list_size,
                SettingId::MAX_HEADER_LIST_SIZE,
                self.max_header_list_size.unwrap_or(u32::MAX),
            ),
            (
                self.enable_connect_protocol != base.enable_connect_protocol,
                SettingId::ENABLE_CONNECT_PROTOCOL,
                self.enable_connect_protocol.into(),
            ),
        ];
        let mut out = [(SettingId(0), 0); 7];
        let mut n = 0;
        for (changed, id, value) in fields {
            if changed && let Some(slot) = out.get_mut(n) {
                *slot = (id, value);
                n += 1;
            }
        }
        (out, n)
    }

    /// Writes a SETTINGS frame carrying the parameters that differ from
    /// `base` (possibly none: an empty SETTINGS frame is valid and is what a
    /// connection sends first when it keeps every default).
    ///
    /// Use `base = &Settings::default()` for the first frame of a
    /// connection, and the previously sent settings for later ones.
    pub fn encode_changes<B: BufMut + ?Sized>(&self, base: &Self, dst: &mut B) {
        let (params, n) = self.changes_array(base);
        encode_settings(params.get(..n).unwrap_or(&[]), dst);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::codes::Reason;
    use crate::error::Scope;
    use crate::h2::{Frame, decode};

    #[test]
    fn defaults_follow_rfc_9113() {
        let s = Settings::default();
        assert_eq!(s.header_table_size, 4096);
        assert!(s.enable_push);
        assert_eq!(s.max_concurrent_streams, None);
        assert_eq!(s.initial_window_size, 65_535);
        assert_eq!(s.max_frame_size, 16_384);
        assert_eq!(s.max_header_list_size, None);
        assert!(!s.enable_connect_protocol);
        assert_eq!(s.changes(&Settings::default()).len(), 0);
    }

    #[test]
    fn apply_sets_fields_and_ignores_unknown_ids() {
        let mut s = Settings::default();
        let params = [
            (1, 0),
            (2, 0),
            (3, 100),
            (4, 1 << 20),
            (5, (1 << 24) - 1),
            (6, 8192),
            (8, 1),
        ];
        for (id, value) in params {
            s.apply(SettingId(id), value).unwrap();
        }
        s.apply(SettingId(0x77), u32::MAX).unwrap();
        let want = Settings {
            header_table_size: 0,
            enable_push: false,
            max_concurrent_streams: Some(100),
            initial_window_size: 1 << 20,
            max_frame_size: (1 << 24) - 1,
            max_header_list_size: Some(8192),
            enable_connect_protocol: true,
        };
        assert_eq!(s, want);
    }

    #[test]
    fn apply_rejects_bad_values_without_changing_anything() {
        let mut s = Settings::default();
        let cases = [
            (SettingId::ENABLE_PUSH, 2, Reason::PROTOCOL_ERROR),
            (
                SettingId::INITIAL_WINDOW_SIZE,
                1 << 31,
                Reason::FLOW_CONTROL_ERROR,
            ),
            (SettingId::MAX_FRAME_SIZE, 16_383, Reason::PROTOCOL_ERROR),
            (SettingId::MAX_FRAME_SIZE, 1 << 24, Reason::PROTOCOL_ERROR),
        ];
        for (id, value, reason) in cases {
            let err = s.apply(id, value).unwrap_err();
            assert_eq!(err, Error::InvalidSetting { id: id.0, value });
            assert_eq!(err.h2(), Some((reason, Scope::Connection)));
        }
        assert_eq!(s, Settings::default());
    }

    #[test]
    fn connect_protocol_cannot_be_withdrawn() {
        let mut s = Settings::default();
        s.apply(SettingId::ENABLE_CONNECT_PROTOCOL, 0).unwrap();
        s.apply(SettingId::ENABLE_CONNECT_PROTOCOL, 1).unwrap();
        s.apply(SettingId::ENABLE_CONNECT_PROTOCOL, 1).unwrap();
        let err = s.apply(SettingId::ENABLE_CONNECT_PROTOCOL, 0).unwrap_err();
        assert_eq!(err, Error::InvalidSetting { id: 8, value: 0 });
        assert_eq!(err.h2(), Some((Reason::PROTOCOL_ERROR, Scope::Connection)));
        assert!(s.enable_connect_protocol);
    }

    #[test]
    fn encode_writes_only_changes() {
        let base = Settings::default();
        let mut out = Vec::new();
        base.encode_changes(&base, &mut out);
        assert_eq!(out, [0, 0, 0, 4, 0, 0, 0, 0, 0]);

        // What a gRPC client typically sends first.
        let grpc = Settings {
            enable_push: false,
            initial_window_size: 4 << 20,
            max_header_list_size: Some(16 << 20),
            ..base
        };
        out.clear();
        grpc.encode_changes(&base, &mut out);
        #[rustfmt::skip]
        let want = [
            0, 0, 18, 4, 0, 0, 0, 0, 0,
            0, 2, 0, 0, 0, 0,
            0, 4, 0, 0x40, 0, 0,
            0, 6, 0x01, 0, 0, 0,
        ];
        assert_eq!(out, want);

        // Back to "unlimited" is spelled u32::MAX.
        let limited = Settings {
            max_concurrent_streams: Some(10),
            ..base
        };
        let changes: Vec<_> = base.changes(&limited).collect();
        assert_eq!(changes, [(SettingId::MAX_CONCURRENT_STREAMS, u32::MAX)]);
    }

    #[test]
    fn params_view() {
        assert!(SettingsParams::EMPTY.is_empty());
        let bytes = [0, 3, 0, 0, 0, 100, 0xff, 0xff, 0, 0, 0, 1];
        let params = SettingsParams::new(&bytes).unwrap();
        assert_eq!(
            (params.len(), params.is_empty(), params.as_bytes()),
            (2, false, &bytes[..])
        );
        let pairs: Vec<_> = params.into_iter().collect();
        assert_eq!(
            pairs,
            [
                (SettingId::MAX_CONCURRENT_STREAMS, 100),
                (SettingId(0xffff), 1)
            ]
        );
        assert_eq!(
            format!("{params:?}"),
            "{SETTINGS_MAX_CONCURRENT_STREAMS: 100, SettingId(0xffff): 1}"
        );
        assert_eq!(
            SettingsParams::new(&bytes[..11]),
            Err(Error::BadFrameSize {
                ty: 4,
                len: 11,
                stream_id: 0
            })
        );
    }

    fn settings() -> impl Strategy<Value = Settings> {
        (
            (
                any::<u32>(),
                any::<bool>(),
                proptest::option::of(any::<u32>()),
            ),
            (
                0..=MAX_WINDOW_SIZE,
                DEFAULT_MAX_FRAME_SIZE..=super::super::MAX_FRAME_LEN,
            ),
            (proptest::option::of(any::<u32>()), any::<bool>()),
        )
            .prop_map(|((h, p, c), (w, f), (l, e))| Settings {
                header_table_size: h,
                enable_push: p,
                max_concurrent_streams: c,
                initial_window_size: w,
                max_frame_size: f,
                max_header_list_size: l,
                enable_connect_protocol: e,
            })
    }

    proptest! {
        #[test]
        fn changes_applied_to_base_give_the_settings(new in settings(), base in settings()) {
            // Extended CONNECT cannot be switched off again.
            let new = Settings {
                enable_connect_protocol: new.enable_connect_protocol || base.enable_connect_protocol,
                ..new
            };
            let mut out = Vec::new();
            new.encode_changes(&base, &mut out);
            let (frame, used) = decode(&out, 16_384).unwrap().unwrap();
            prop_assert_eq!(used, out.len());
            let Frame::Settings { ack: false, params } = frame else {
                return Err(TestCaseError::fail(format!("{frame:?}")));
            };
            prop_assert_eq!(params.len(), new.changes(&base).len());
            let mut applied = base;
            applied.apply_all(params).unwrap();
            // A limit lifted to `None` (unlimited) arrives as `u32::MAX`.
            let lifted = |new: Option<u32>, base: Option<u32>| {
                if new.is_none() && base.is_some() { Some(u32::MAX) } else { new }
            };
            let want = Settings {
                max_concurrent_streams: lifted(new.max_concurrent_streams, base.max_concurrent_streams),
                max_header_list_size: lifted(new.max_header_list_size, base.max_header_list_size),
                ..new
            };
            prop_assert_eq!(applied, want);
        }
    }
}
