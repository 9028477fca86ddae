//! Header lists of HTTP/2 requests, responses and trailers, and the RFC 9113
//! §8 rules that make a received list well formed.
//!
//! A received [`Headers`] is built from one decoded HPACK block: names and
//! values are copied once into a single arena and exposed as `Bytes` slices of
//! it, so a block costs two allocations however many fields it has. Headers
//! are decoded per stream (HEADERS frames), never per DATA frame.
//!
//! Validation ([`Headers::check_request`], [`Headers::check_response`],
//! [`Headers::check_trailers`]) implements "malformed message" (RFC 9113
//! §8.1.1): a violation is a stream error of type PROTOCOL_ERROR.

use bytes::{Bytes, BytesMut};

/// One header field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// Lower-case name (pseudo-headers start with `:`).
    pub name: Bytes,
    /// Value.
    pub value: Bytes,
    /// Must never be added to an HPACK table (e.g. `authorization`).
    pub sensitive: bool,
}

/// An ordered header list: pseudo-headers first, then regular fields.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers {
    fields: Vec<Field>,
}

/// Why a received header list is malformed (RFC 9113 §8.2–§8.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Malformed {
    /// A field name with upper-case letters or invalid characters.
    BadName,
    /// A field value with NUL, CR, LF or surrounding whitespace.
    BadValue,
    /// A pseudo-header after a regular field.
    PseudoAfterRegular,
    /// A pseudo-header that is unknown or not allowed here.
    BadPseudo,
    /// The same pseudo-header twice.
    DuplicatePseudo,
    /// A required pseudo-header is missing or empty.
    MissingPseudo,
    /// A connection-specific field (`connection`, `te` other than `trailers`, …).
    ConnectionSpecific,
    /// `content-length` is not a number, or disagrees with the DATA received.
    ContentLength,
}

impl core::fmt::Display for Malformed {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::BadName => "invalid header field name",
            Self::BadValue => "invalid header field value",
            Self::PseudoAfterRegular => "pseudo-header field after a regular field",
            Self::BadPseudo => "unknown or misplaced pseudo-header field",
            Self::DuplicatePseudo => "duplicate pseudo-header field",
            Self::MissingPseudo => "missing or empty mandatory pseudo-header field",
            Self::ConnectionSpecific => "connection-specific header field",
            Self::ContentLength => "invalid or mismatched content-length",
        })
    }
}

impl Headers {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// A request head: `:method`, `:scheme`, `:authority`, `:path`.
    pub fn request(
        method: &'static str,
        scheme: &'static str,
        authority: Bytes,
        path: Bytes,
    ) -> Self {
        let mut h = Self {
            fields: Vec::with_capacity(8),
        };
        h.push_static(":method", method);
        h.push_static(":scheme", scheme);
        h.push(Bytes::from_static(b":authority"), authority);
        h.push(Bytes::from_static(b":path"), path);
        h
    }

    /// A response head with `:status`.
    pub fn response(status: u16) -> Self {
        let mut h = Self {
            fields: Vec::with_capacity(4),
        };
        let value = match status {
            200 => Bytes::from_static(b"200"),
            _ => Bytes::from(status.to_string()),
        };
        h.push(Bytes::from_static(b":status"), value);
        h
    }

    /// Append a field.
    pub fn push(&mut self, name: Bytes, value: Bytes) {
        self.fields.push(Field {
            name,
            value,
            sensitive: false,
        });
    }

    /// Append a field from static strings.
    pub fn push_static(&mut self, name: &'static str, value: &'static str) {
        self.push(
            Bytes::from_static(name.as_bytes()),
            Bytes::from_static(value.as_bytes()),
        );
    }

    /// Append a field that must never be indexed by HPACK (credentials).
    pub fn push_sensitive(&mut self, name: Bytes, value: Bytes) {
        self.fields.push(Field {
            name,
            value,
            sensitive: true,
        });
    }

    /// All fields in order.
    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// Number of fields.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// True when there are no fields.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// The first value of `name` (pseudo or regular).
    pub fn get(&self, name: &[u8]) -> Option<&Bytes> {
        self.fields
            .iter()
            .find(|f| f.name == name)
            .map(|f| &f.value)
    }

    /// All values of `name`, in order.
    pub fn get_all<'a>(&'a self, name: &'a [u8]) -> impl Iterator<Item = &'a Bytes> + 'a {
        self.fields
            .iter()
            .filter(move |f| f.name == name)
            .map(|f| &f.value)
    }

    /// `:status` parsed as a number.
    pub fn status(&self) -> Option<u16> {
        let v = self.get(b":status")?;
        std::str::from_utf8(v).ok()?.parse().ok()
    }

    /// The HPACK size of the list (RFC 9113 §6.5.2: name + value + 32 each).
    pub fn list_size(&self) -> usize {
        self.fields
            .iter()
            .map(|f| f.name.len() + f.value.len() + 32)
            .sum()
    }

    /// Start collecting the list decoded from a block of `block_len`
    /// bytes (see [`HeadersBuilder`]).
    pub(crate) fn builder(block_len: usize) -> HeadersBuilder {
        HeadersBuilder {
            // Decoded fields are rarely more than twice their encoding
            // (Huffman saves about a third; a fresh HPACK context, as a
            // dial's connection has, indexes little).
            arena: BytesMut::with_capacity(block_len.saturating_mul(2).max(64)),
            spans: Vec::with_capacity(8),
        }
    }

    /// Check a received request head (server side). Returns the declared
    /// `content-length`, if any.
    pub fn check_request(&self) -> Result<Option<u64>, Malformed> {
        let mut seen = [false; 5]; // method scheme authority path protocol
        let mut regular = false;
        for f in &self.fields {
            check_value(&f.value)?;
            if let Some(pseudo) = f.name.strip_prefix(b":") {
                if regular {
                    return Err(Malformed::PseudoAfterRegular);
                }
                let i = match pseudo {
                    b"method" => 0,
                    b"scheme" => 1,
                    b"authority" => 2,
                    b"path" => 3,
                    b"protocol" => 4,
                    _ => return Err(Malformed::BadPseudo),
                };
                if seen.get_mut(i).is_none_or(|s| std::mem::replace(s, true)) {
                    return Err(Malformed::DuplicatePseudo);
                }
            } else {
                regular = true;
                check_regular(f)?;
            }
        }
        let connect = self.get(b":method").is_some_and(|m| m == "CONNECT");
        if !seen[0] {
            return Err(Malformed::MissingPseudo);
        }
        if connect && !seen[4] {
            // Plain CONNECT (RFC 9113 §8.5): only :method and :authority.
            if seen[1] || seen[3] || !seen[2] {
                return Err(Malformed::MissingPseudo);
            }
        } else {
            if !seen[1] || !seen[3] {
                return Err(Malformed::MissingPseudo);
            }
            if self.get(b":path").is_some_and(Bytes::is_empty) {
                return Err(Malformed::MissingPseudo);
            }
        }
        self.content_length()
    }

    /// Check a received response head (client side). Returns the declared
    /// `content-length`, if any.
    pub fn check_response(&self) -> Result<Option<u64>, Malformed> {
        let mut status = false;
        let mut regular = false;
        for f in &self.fields {
            check_value(&f.value)?;
            if f.name.first() == Some(&b':') {
                if regular {
                    return Err(Malformed::PseudoAfterRegular);
                }
                if f.name != ":status" {
                    return Err(Malformed::BadPseudo);
                }
                if std::mem::replace(&mut status, true) {
                    return Err(Malformed::DuplicatePseudo);
                }
            } else {
                regular = true;
                check_regular(f)?;
            }
        }
        if !status || self.status().is_none() {
            return Err(Malformed::MissingPseudo);
        }
        self.content_length()
    }

    /// Check a received trailer section: no pseudo-headers.
    pub fn check_trailers(&self) -> Result<(), Malformed> {
        for f in &self.fields {
            check_value(&f.value)?;
            if f.name.first() == Some(&b':') {
                return Err(Malformed::BadPseudo);
            }
            check_regular(f)?;
        }
        Ok(())
    }

    fn content_length(&self) -> Result<Option<u64>, Malformed> {
        let mut len = None;
        for v in self.get_all(b"content-length") {
            let parsed: u64 = std::str::from_utf8(v)
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse().ok())
                .ok_or(Malformed::ContentLength)?;
            if len.is_some_and(|l| l != parsed) {
                return Err(Malformed::ContentLength);
            }
            len = Some(parsed);
        }
        Ok(len)
    }
}

/// Rules for a regular (non-pseudo) field.
fn check_regular(f: &Field) -> Result<(), Malformed> {
    if f.name.is_empty() || !f.name.iter().all(|&b| is_name_byte(b)) {
        return Err(Malformed::BadName);
    }
    match &f.name[..] {
        b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding" | b"upgrade" => {
            Err(Malformed::ConnectionSpecific)
        }
        b"te" if f.value != "trailers" => Err(Malformed::ConnectionSpecific),
        _ => Ok(()),
    }
}

/// Lower-case token characters (RFC 9110 §5.6.2, upper case excluded).
fn is_name_byte(b: u8) -> bool {
    matches!(b,
        b'a'..=b'z' | b'0'..=b'9'
        | b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.'
        | b'^' | b'_' | b'`' | b'|' | b'~')
}

/// RFC 9113 §8.2.1: no NUL, CR or LF, no leading or trailing whitespace.
fn check_value(v: &[u8]) -> Result<(), Malformed> {
    if v.iter().any(|&b| b == 0 || b == b'\r' || b == b'\n') {
        return Err(Malformed::BadValue);
    }
    if matches!(v.first(), Some(b' ' | b'\t')) || matches!(v.last(), Some(b' ' | b'\t')) {
        return Err(Malformed::BadValue);
    }
    Ok(())
}

/// Collects the fields of one decoded HPACK block into a [`Headers`] that
/// slices one arena, sized from the block up front so that it does not
/// grow field by field.
pub(crate) struct HeadersBuilder {
    arena: BytesMut,
    spans: Vec<(usize, usize, usize, bool)>,
}

impl HeadersBuilder {
    /// Add one decoded field.
    pub(crate) fn add(&mut self, name: &[u8], value: &[u8], sensitive: bool) {
        let start = self.arena.len();
        self.arena.extend_from_slice(name);
        self.arena.extend_from_slice(value);
        self.spans.push((start, name.len(), value.len(), sensitive));
    }

    /// Finish into a header list.
    pub(crate) fn finish(self) -> Headers {
        let arena = self.arena.freeze();
        let fields = self
            .spans
            .into_iter()
            .map(|(start, nl, vl, sensitive)| Field {
                name: arena.slice(start..start + nl),
                value: arena.slice(start + nl..start + nl + vl),
                sensitive,
            })
            .collect();
        Headers { fields }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(fields: &[(&str, &str)]) -> Headers {
        let mut b = Headers::builder(0);
        for (n, v) in fields {
            b.add(n.as_bytes(), v.as_bytes(), false);
        }
        b.finish()
    }

    const GRPC_REQ: &[(&str, &str)] = &[
        (":method", "POST"),
        (":scheme", "https"),
        (":path", "/AgentService/Connect"),
        (":authority", "127.0.0.1:8091"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("agentid", "a1"),
    ];

    #[test]
    fn builder_slices_one_arena() {
        let h = list(GRPC_REQ);
        assert_eq!(h.get(b":path").unwrap(), "/AgentService/Connect");
        assert_eq!(h.get(b"agentid").unwrap(), "a1");
        assert_eq!(h.len(), 7);
    }

    #[test]
    fn grpc_request_is_well_formed() {
        assert_eq!(list(GRPC_REQ).check_request(), Ok(None));
    }

    #[test]
    fn malformed_requests() {
        let cases: &[(&[(&str, &str)], Malformed)] = &[
            (
                &[(":method", "GET"), (":scheme", "http")],
                Malformed::MissingPseudo,
            ),
            (
                &[(":method", "GET"), (":scheme", "http"), (":path", "")],
                Malformed::MissingPseudo,
            ),
            (
                &[
                    (":method", "GET"),
                    ("x", "1"),
                    (":scheme", "http"),
                    (":path", "/"),
                ],
                Malformed::PseudoAfterRegular,
            ),
            (
                &[
                    (":method", "GET"),
                    (":method", "GET"),
                    (":scheme", "http"),
                    (":path", "/"),
                ],
                Malformed::DuplicatePseudo,
            ),
            (
                &[
                    (":method", "GET"),
                    (":scheme", "http"),
                    (":path", "/"),
                    (":status", "200"),
                ],
                Malformed::BadPseudo,
            ),
            (
                &[
                    (":method", "GET"),
                    (":scheme", "http"),
                    (":path", "/"),
                    ("Upper", "x"),
                ],
                Malformed::BadName,
            ),
            (
                &[
                    (":method", "GET"),
                    (":scheme", "http"),
                    (":path", "/"),
                    ("connection", "x"),
                ],
                Malformed::ConnectionSpecific,
            ),
            (
                &[
                    (":method", "GET"),
                    (":scheme", "http"),
                    (":path", "/"),
                    ("te", "gzip"),
                ],
                Malformed::ConnectionSpecific,
            ),
            (
                &[
                    (":method", "GET"),
                    (":scheme", "http"),
                    (":path", "/"),
                    ("x", " lead"),
                ],
                Malformed::BadValue,
            ),
            (
                &[
                    (":method", "GET"),
                    (":scheme", "http"),
                    (":path", "/"),
                    ("content-length", "1x"),
                ],
                Malformed::ContentLength,
            ),
        ];
        for (fields, want) in cases {
            assert_eq!(list(fields).check_request(), Err(*want), "{fields:?}");
        }
    }

    #[test]
    fn content_length_is_returned() {
        let h = list(&[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/"),
            ("content-length", "12"),
        ]);
        assert_eq!(h.check_request(), Ok(Some(12)));
    }

    #[test]
    fn connect_requests() {
        let ok = list(&[(":method", "CONNECT"), (":authority", "a:1")]);
        assert_eq!(ok.check_request(), Ok(None));
        let bad = list(&[
            (":method", "CONNECT"),
            (":authority", "a:1"),
            (":path", "/"),
        ]);
        assert_eq!(bad.check_request(), Err(Malformed::MissingPseudo));
    }

    #[test]
    fn responses_and_trailers() {
        assert_eq!(
            list(&[(":status", "200"), ("content-type", "application/grpc")]).check_response(),
            Ok(None)
        );
        assert_eq!(
            list(&[("content-type", "x")]).check_response(),
            Err(Malformed::MissingPseudo)
        );
        assert_eq!(
            list(&[(":status", "200"), (":path", "/")]).check_response(),
            Err(Malformed::BadPseudo)
        );
        assert_eq!(list(&[("grpc-status", "0")]).check_trailers(), Ok(()));
        assert_eq!(
            list(&[(":status", "200")]).check_trailers(),
            Err(Malformed::BadPseudo)
        );
    }

    #[test]
    fn outgoing_constructors() {
        let h = Headers::request(
            "POST",
            "https",
            Bytes::from_static(b"h:1"),
            Bytes::from_static(b"/p"),
        );
        assert_eq!(h.check_request(), Ok(None));
        assert_eq!(Headers::response(404).status(), Some(404));
        let mut h = Headers::new();
        h.push_sensitive(
            Bytes::from_static(b"authorization"),
            Bytes::from_static(b"Bearer x"),
        );
        assert!(h.fields()[0].sensitive);
        assert_eq!(h.list_size(), 13 + 8 + 32);
    }
}
