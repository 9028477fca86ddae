//! [`ByteStr`]: a UTF-8 string that shares a [`Bytes`] buffer.
//!
//! Decoded packets keep their string fields (dial address, error text) as
//! slices of the receive buffer, like their DATA payloads, so decoding never
//! allocates. Cloning is a reference-count increment.
//!
//! The crate forbids `unsafe`, so there is no unchecked `&[u8]` → `&str`
//! conversion: [`ByteStr::as_str`] re-runs the standard library's UTF-8 check
//! (which has an ASCII fast path) on every call. Packet strings are short, so
//! this costs little; callers that read a string often can keep the `&str`.
//! The UTF-8 invariant is a logical one, established by every constructor, not
//! a memory-safety one.

use core::fmt;
use core::ops::Deref;
use core::str::Utf8Error;

use bytes::Bytes;

/// An immutable UTF-8 string backed by [`Bytes`]: cheap to clone and to slice
/// out of a received buffer.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ByteStr(Bytes);

impl ByteStr {
    /// The empty string (no allocation).
    pub const fn new() -> Self {
        Self(Bytes::new())
    }

    /// A string pointing at static data (no allocation).
    pub const fn from_static(s: &'static str) -> Self {
        Self(Bytes::from_static(s.as_bytes()))
    }

    /// Wraps `bytes` after checking it is UTF-8.
    pub fn from_utf8(bytes: Bytes) -> Result<Self, Utf8Error> {
        core::str::from_utf8(&bytes)?;
        Ok(Self(bytes))
    }

    /// Wraps bytes the caller has already checked to be UTF-8.
    pub(crate) fn from_checked(bytes: Bytes) -> Self {
        debug_assert!(core::str::from_utf8(&bytes).is_ok());
        Self(bytes)
    }

    /// The string.
    pub fn as_str(&self) -> &str {
        // Every constructor checked the bytes, so this cannot fail; the
        // fallback only keeps the crate free of both `unsafe` and panics.
        core::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// The underlying bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The underlying [`Bytes`] (no copy).
    pub fn into_bytes(self) -> Bytes {
        self.0
    }
}

impl Deref for ByteStr {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for ByteStr {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<[u8]> for ByteStr {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl From<String> for ByteStr {
    /// Takes over the string's buffer (no copy).
    fn from(s: String) -> Self {
        Self(Bytes::from(s))
    }
}

impl From<&'static str> for ByteStr {
    fn from(s: &'static str) -> Self {
        Self::from_static(s)
    }
}

impl TryFrom<Bytes> for ByteStr {
    type Error = Utf8Error;

    fn try_from(bytes: Bytes) -> Result<Self, Utf8Error> {
        Self::from_utf8(bytes)
    }
}

impl From<ByteStr> for Bytes {
    fn from(s: ByteStr) -> Self {
        s.0
    }
}

impl PartialEq<str> for ByteStr {
    fn eq(&self, other: &str) -> bool {
        self.0 == other.as_bytes()
    }
}

impl PartialEq<&str> for ByteStr {
    fn eq(&self, other: &&str) -> bool {
        self.0 == other.as_bytes()
    }
}

impl fmt::Debug for ByteStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for ByteStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_check_utf8() {
        assert_eq!(ByteStr::from_static("tcp").as_str(), "tcp");
        assert_eq!(ByteStr::from(String::from("10.0.0.1:443")), "10.0.0.1:443");
        assert_eq!(
            ByteStr::from_utf8(Bytes::from_static("ünï".as_bytes())).unwrap(),
            "ünï"
        );
        assert!(ByteStr::from_utf8(Bytes::from_static(b"\xff")).is_err());
        assert!(ByteStr::try_from(Bytes::from_static(b"a\xc3")).is_err());
        assert_eq!(ByteStr::default(), ByteStr::new());
        assert!(ByteStr::new().is_empty());
    }

    #[test]
    fn behaves_like_str() {
        let s = ByteStr::from_static("dial \"x\"");
        assert_eq!(s.len(), 8);
        assert!(s.starts_with("dial"));
        assert_eq!(format!("{s}"), "dial \"x\"");
        assert_eq!(format!("{s:?}"), r#""dial \"x\"""#);
        assert_eq!(s.as_bytes(), b"dial \"x\"");
        assert_eq!(Bytes::from(s.clone()), Bytes::from_static(b"dial \"x\""));
        assert_eq!(s.clone().into_bytes().len(), 8);
    }

    #[test]
    fn from_string_reuses_the_buffer() {
        let s = String::from("no copy");
        let ptr = s.as_ptr();
        assert_eq!(ByteStr::from(s).as_bytes().as_ptr(), ptr);
    }
}
