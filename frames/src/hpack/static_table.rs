//! The HPACK static table (RFC 7541 Appendix A) and the encoder's lookup in it.
//!
//! Indices 1..=61 address [`STATIC`] (index 1 is `STATIC[0]`). The lookup
//! maps a name to the run of indices carrying it with one `match` on the
//! name bytes (the compiler turns it into a length switch plus compares),
//! then scans that short run for the value.

/// Number of static entries; dynamic indices start after it.
pub(super) const LEN: usize = 61;

/// `(name, value)` of static indices 1..=61.
pub(super) const STATIC: [(&[u8], &[u8]); LEN] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// The entry at 1-based `index`, if it is a static index.
pub(super) fn get(index: usize) -> Option<(&'static [u8], &'static [u8])> {
    STATIC.get(index.checked_sub(1)?).copied()
}

/// Looks `name`/`value` up: `(full_match, name_match)` as 1-based indices.
/// `name_match` is the first index with that name; `full_match` is only
/// looked for when `with_value` (sensitive fields never use a full match).
pub(super) fn find(name: &[u8], value: &[u8], with_value: bool) -> (Option<u32>, Option<u32>) {
    let Some((first, last)) = name_range(name) else {
        return (None, None);
    };
    if with_value {
        for index in first..=last {
            if STATIC[index as usize - 1].1 == value {
                return (Some(index), Some(first));
            }
        }
    }
    (None, Some(first))
}

/// First and last 1-based static index whose name is `name`.
fn name_range(name: &[u8]) -> Option<(u32, u32)> {
    let single = |i| Some((i, i));
    match name {
        b":authority" => single(1),
        b":method" => Some((2, 3)),
        b":path" => Some((4, 5)),
        b":scheme" => Some((6, 7)),
        b":status" => Some((8, 14)),
        b"accept-charset" => single(15),
        b"accept-encoding" => single(16),
        b"accept-language" => single(17),
        b"accept-ranges" => single(18),
        b"accept" => single(19),
        b"access-control-allow-origin" => single(20),
        b"age" => single(21),
        b"allow" => single(22),
        b"authorization" => single(23),
        b"cache-control" => single(24),
        b"content-disposition" => single(25),
        b"content-encoding" => single(26),
        b"content-language" => single(27),
        b"content-length" => single(28),
        b"content-location" => single(29),
        b"content-range" => single(30),
        b"content-type" => single(31),
        b"cookie" => single(32),
        b"date" => single(33),
        b"etag" => single(34),
        b"expect" => single(35),
        b"expires" => single(36),
        b"from" => single(37),
        b"host" => single(38),
        b"if-match" => single(39),
        b"if-modified-since" => single(40),
        b"if-none-match" => single(41),
        b"if-range" => single(42),
        b"if-unmodified-since" => single(43),
        b"last-modified" => single(44),
        b"link" => single(45),
        b"location" => single(46),
        b"max-forwards" => single(47),
        b"proxy-authenticate" => single(48),
        b"proxy-authorization" => single(49),
        b"range" => single(50),
        b"referer" => single(51),
        b"refresh" => single(52),
        b"retry-after" => single(53),
        b"server" => single(54),
        b"set-cookie" => single(55),
        b"strict-transport-security" => single(56),
        b"transfer-encoding" => single(57),
        b"user-agent" => single(58),
        b"vary" => single(59),
        b"via" => single(60),
        b"www-authenticate" => single(61),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_agrees_with_the_table() {
        for (i, &(name, value)) in STATIC.iter().enumerate() {
            let index = i as u32 + 1;
            let first = STATIC.iter().position(|e| e.0 == name).unwrap() as u32 + 1;
            assert_eq!(
                find(name, value, true),
                (Some(index), Some(first)),
                "index {index}"
            );
            assert_eq!(find(name, value, false), (None, Some(first)));
            assert_eq!(get(index as usize), Some((name, value)));
        }
        // Every name the lookup knows covers exactly its run of the table.
        for (i, &(name, _)) in STATIC.iter().enumerate() {
            let (first, last) = name_range(name).unwrap();
            assert!((first..=last).contains(&(i as u32 + 1)));
            assert_eq!(STATIC[first as usize - 1].0, name);
            assert_eq!(STATIC[last as usize - 1].0, name);
        }
    }

    #[test]
    fn misses() {
        assert_eq!(find(b"te", b"trailers", true), (None, None));
        assert_eq!(find(b":method", b"PUT", true), (None, Some(2)));
        assert_eq!(find(b":Method", b"GET", true), (None, None));
        assert_eq!(get(0), None);
        assert_eq!(get(62), None);
    }

    #[test]
    fn rfc_anchor_indices() {
        assert_eq!(get(1), Some((&b":authority"[..], &b""[..])));
        assert_eq!(get(8), Some((&b":status"[..], &b"200"[..])));
        assert_eq!(
            get(16),
            Some((&b"accept-encoding"[..], &b"gzip, deflate"[..]))
        );
        assert_eq!(get(24).unwrap().0, b"cache-control");
        assert_eq!(get(55).unwrap().0, b"set-cookie");
        assert_eq!(get(61).unwrap().0, b"www-authenticate");
    }
}
