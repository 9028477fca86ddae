//! Fuzzes `connect::parse_request` and `connect::parse_authority`.
//!
//! A request that parses is serialized again (CRLF line ends, `name: value`
//! fields) and must parse back to the same parts, consuming exactly the
//! serialized length. The byte before the end of the head must still be
//! "incomplete", never an error. Any UTF-8 input is also tried as a CONNECT
//! target; an accepted one must rebuild to itself.
#![no_main]

use konn_frames::connect::{Limits, Request, parse_authority, parse_request};
use libfuzzer_sys::fuzz_target;

type Parts<'a> = (&'a str, &'a str, u8, Vec<(&'a str, &'a [u8])>);

fn parts<'a>(r: &Request<'a>) -> Parts<'a> {
    let headers = r.headers().map(|h| (h.name, h.value)).collect();
    (r.method, r.target, r.version_minor, headers)
}

fn serialize(p: &Parts<'_>) -> Vec<u8> {
    let mut v = format!("{} {} HTTP/1.{}\r\n", p.0, p.1, p.2).into_bytes();
    for (name, value) in &p.3 {
        v.extend_from_slice(name.as_bytes());
        v.extend_from_slice(b": ");
        v.extend_from_slice(value);
        v.extend_from_slice(b"\r\n");
    }
    v.extend_from_slice(b"\r\n");
    v
}

fn check_authority(target: &str) {
    if let Ok((host, port)) = parse_authority(target) {
        assert_ne!(port, 0);
        let rebuilt = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        // Leading zeros in the port are accepted, so compare numerically.
        let (t_host, _) = target.rsplit_once(':').unwrap();
        let (r_host, _) = rebuilt.rsplit_once(':').unwrap();
        assert_eq!(t_host, r_host);
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = core::str::from_utf8(data) {
        check_authority(s);
    }
    let limits = Limits::DEFAULT;
    let Ok(Some((request, consumed))) = parse_request(data, &limits) else {
        return;
    };
    assert!(consumed <= data.len() && consumed <= limits.max_head_len as usize);
    assert_eq!(request.headers().count(), request.header_count());
    assert!(matches!(
        parse_request(&data[..consumed - 1], &limits),
        Ok(None)
    ));
    check_authority(request.target);

    let original = parts(&request);
    let serialized = serialize(&original);
    // Re-serializing can lengthen the head (LF → CRLF, "a:b" → "a: b").
    let unbounded = Limits {
        max_head_len: u32::MAX,
        max_headers: u32::MAX,
    };
    let (again, n) = parse_request(&serialized, &unbounded).unwrap().unwrap();
    assert_eq!(n, serialized.len());
    assert_eq!(parts(&again), original);
});
