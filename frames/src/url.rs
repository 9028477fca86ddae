//! Percent-decoding of URL parts with the semantics of Go's `net/url`,
//! for the values konn reads where upstream reads them with it: the
//! agent's `--agent-identifiers` and the server's `agentidentifiers`
//! metadata (`url.ParseQuery`), the health and admin servers' request path
//! (`r.URL.Path`) and query keys (`r.URL.Query()`).
//!
//! - [`query_unescape`] / [`path_unescape`]: `url.QueryUnescape` /
//!   `url.PathUnescape`. `%XX` becomes the byte 0xXX; a `%` not followed by
//!   two hex digits is an error naming it (Go's `EscapeError`); `+` becomes
//!   a space in a query component only. The result is bytes, as Go's
//!   result may be invalid UTF-8; it borrows the input when nothing
//!   changes.
//! - [`query_settings`]: the `&`-separated `key=value` settings of a query
//!   one by one, each decoded or refused as `url.ParseQuery` does.
//! - [`parse_query`]: `url.ParseQuery` in input order, with Go's error
//!   rules: more than [`MAX_QUERY_PARAMS`] settings fail at once; else a
//!   setting with `;` makes the error "invalid semicolon separator in
//!   query" whatever came before, and otherwise the first bad escape is
//!   reported.
//! - [`query_has`]: `r.URL.Query().Has(key)` (Go ignores the error there
//!   and keeps the settings that decoded).

use std::borrow::Cow;

use crate::Error;

/// Most settings `url.ParseQuery` accepts (Go's `urlmaxqueryparams`
/// default).
pub const MAX_QUERY_PARAMS: usize = 10_000;

/// One decoded `key=value` setting of a query.
pub type Setting<'a> = (Cow<'a, [u8]>, Cow<'a, [u8]>);

/// Go's `url.QueryUnescape`: `%XX` → byte, `+` → space.
///
/// # Errors
///
/// [`Error::UrlInvalidEscape`] for the first `%` not followed by two hex
/// digits.
pub fn query_unescape(s: &str) -> Result<Cow<'_, [u8]>, Error> {
    unescape(s, true)
}

/// Go's `url.PathUnescape`: `%XX` → byte; `+` stays.
///
/// # Errors
///
/// [`Error::UrlInvalidEscape`] for the first `%` not followed by two hex
/// digits.
pub fn path_unescape(s: &str) -> Result<Cow<'_, [u8]>, Error> {
    unescape(s, false)
}

/// The settings of `query` as `url.ParseQuery` reads them, in order:
/// split on `&`, empty ones skipped, one containing `;` refused
/// ([`Error::UrlSemicolon`]), key and value split at the first `=` and
/// each [`query_unescape`]d. Does not check [`MAX_QUERY_PARAMS`].
pub fn query_settings(query: &str) -> impl Iterator<Item = Result<Setting<'_>, Error>> {
    query
        .split('&')
        .filter(|setting| !setting.is_empty())
        .map(|setting| {
            if setting.contains(';') {
                return Err(Error::UrlSemicolon);
            }
            let (k, v) = setting.split_once('=').unwrap_or((setting, ""));
            Ok((query_unescape(k)?, query_unescape(v)?))
        })
}

/// Go's `url.ParseQuery`, keeping the settings in input order.
///
/// # Errors
///
/// [`Error::UrlTooManyParams`] beyond [`MAX_QUERY_PARAMS`]; else
/// [`Error::UrlSemicolon`] if any setting has a `;`; else the first
/// [`Error::UrlInvalidEscape`].
pub fn parse_query(query: &str) -> Result<Vec<Setting<'_>>, Error> {
    check_params(query)?;
    let mut settings = Vec::new();
    let mut err = None;
    for setting in query_settings(query) {
        match setting {
            Ok(kv) => settings.push(kv),
            Err(Error::UrlSemicolon) => err = Some(Error::UrlSemicolon),
            Err(e) => {
                err.get_or_insert(e);
            }
        }
    }
    match err {
        Some(e) => Err(e),
        None => Ok(settings),
    }
}

/// Whether `r.URL.Query()` in Go has `key`: a setting with that decoded
/// key decodes (key and value) without error. `?verbose`, `?verbose=0` and
/// `?a&verbose=` all have `verbose`; a query over [`MAX_QUERY_PARAMS`]
/// settings has nothing.
pub fn query_has(query: &str, key: &str) -> bool {
    check_params(query).is_ok()
        && query_settings(query).any(|s| s.is_ok_and(|(k, _)| *k == *key.as_bytes()))
}

fn check_params(query: &str) -> Result<(), Error> {
    if query.matches('&').count() >= MAX_QUERY_PARAMS {
        return Err(Error::UrlTooManyParams);
    }
    Ok(())
}

fn unescape(s: &str, plus_is_space: bool) -> Result<Cow<'_, [u8]>, Error> {
    let b = s.as_bytes();
    // Check every escape first, as Go does, so the error is the first one.
    let mut changes = false;
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        if c == b'%' {
            let digits = b.get(i + 1..i + 3).unwrap_or_default();
            if digits.len() < 2 || !digits.iter().all(u8::is_ascii_hexdigit) {
                return Err(escape_error(b.get(i..).unwrap_or_default()));
            }
            changes = true;
            i += 3;
        } else {
            changes |= plus_is_space && c == b'+';
            i += 1;
        }
    }
    if !changes {
        return Ok(Cow::Borrowed(b));
    }
    let mut out = Vec::with_capacity(b.len());
    let mut bytes = b.iter().copied();
    while let Some(c) = bytes.next() {
        match c {
            b'%' => {
                let hi = bytes.next().map_or(0, hex);
                let lo = bytes.next().map_or(0, hex);
                out.push(hi << 4 | lo);
            }
            b'+' if plus_is_space => out.push(b' '),
            c => out.push(c),
        }
    }
    Ok(Cow::Owned(out))
}

/// Go's `EscapeError`: the `%` and at most the two bytes after it.
fn escape_error(from_percent: &[u8]) -> Error {
    let mut escape = [0u8; 3];
    let len = from_percent.len().min(3);
    for (dst, src) in escape.iter_mut().zip(from_percent) {
        *dst = *src;
    }
    Error::UrlInvalidEscape {
        escape,
        len: len as u8,
    }
}

/// The value of a hex digit (checked before decoding).
fn hex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => 0,
    }
}

#[cfg(test)]
mod tests;
