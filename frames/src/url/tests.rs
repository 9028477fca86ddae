//! `net/url` behaviour: the cases of Go's own unescape and ParseQuery
//! tests (Go 1.26), the error texts Go prints, and properties over
//! arbitrary input (round trips, no panics, the three entry points agree).

use proptest::prelude::*;

use super::*;

fn q(s: &str) -> Result<Vec<u8>, String> {
    query_unescape(s)
        .map(Cow::into_owned)
        .map_err(|e| e.to_string())
}

fn settings(query: &str) -> Result<Vec<(String, String)>, String> {
    parse_query(query)
        .map(|v| {
            v.into_iter()
                .map(|(k, v)| {
                    (
                        String::from_utf8_lossy(&k).into_owned(),
                        String::from_utf8_lossy(&v).into_owned(),
                    )
                })
                .collect()
        })
        .map_err(|e| e.to_string())
}

#[test]
fn unescape_like_go() {
    for (input, out) in [
        ("", ""),
        ("abc", "abc"),
        ("1%41", "1A"),
        ("1%41%42%43", "1ABC"),
        ("%4a", "J"),
        ("%6F", "o"),
        ("a+b", "a b"),
        ("a%20b", "a b"),
    ] {
        assert_eq!(q(input), Ok(out.as_bytes().to_vec()), "{input:?}");
    }
    for (input, bad) in [
        ("%", "%"),
        ("%a", "%a"),
        ("%1", "%1"),
        ("123%45%6", "%6"),
        ("%zzzzz", "%zz"),
    ] {
        assert_eq!(
            q(input),
            Err(format!("invalid URL escape {bad:?}")),
            "{input:?}"
        );
    }
    assert_eq!(&*path_unescape("a+b%2B").unwrap(), b"a+b+");
    assert!(matches!(
        query_unescape("plain"),
        Ok(Cow::Borrowed(b"plain"))
    ));
    assert!(matches!(path_unescape("a+b"), Ok(Cow::Borrowed(b"a+b"))));
    // Decoded bytes need not be UTF-8, as in Go.
    assert_eq!(q("%ff%00"), Ok(vec![0xff, 0]));
}

#[test]
fn parse_query_like_go() {
    let ok = |query: &str, want: &[(&str, &str)]| {
        let want: Vec<(String, String)> = want
            .iter()
            .map(|&(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert_eq!(settings(query), Ok(want), "{query:?}");
    };
    ok("a=1", &[("a", "1")]);
    ok("a=1&b=2", &[("a", "1"), ("b", "2")]);
    ok(
        "a=1&a=2&a=banana",
        &[("a", "1"), ("a", "2"), ("a", "banana")],
    );
    ok("ascii=%3Ckey%3A+0x90%3E", &[("ascii", "<key: 0x90>")]);
    ok("a=%3B", &[("a", ";")]);
    ok("a%3Bb=1", &[("a;b", "1")]);
    ok("&&a&", &[("a", "")]);
    ok("", &[]);
    let semicolon = Err("invalid semicolon separator in query".to_owned());
    for query in [
        "a=1;b=2",
        "a;b=1",
        "a=1&a=2;a=banana",
        "a;b&c=1",
        "a=1&b=2;a=3&c=4",
        ";",
        "a=1&;",
        ";a=1&b=2",
        // The semicolon error wins over an earlier bad escape.
        "a=%zz&b;c",
    ] {
        assert_eq!(settings(query), semicolon, "{query:?}");
    }
    // Otherwise the first bad escape is reported.
    assert_eq!(
        settings("a=%zz&b=%g1"),
        Err("invalid URL escape \"%zz\"".to_owned())
    );
}

#[test]
fn parameter_limit() {
    let max = vec!["a=1"; MAX_QUERY_PARAMS].join("&");
    assert_eq!(parse_query(&max).unwrap().len(), MAX_QUERY_PARAMS);
    assert!(query_has(&max, "a"));
    let over = format!("{max}&b");
    assert_eq!(parse_query(&over), Err(Error::UrlTooManyParams));
    assert_eq!(
        Error::UrlTooManyParams.to_string(),
        "number of URL query parameters exceeded limit"
    );
    assert!(!query_has(&over, "a"), "Go's Query() is empty then");
}

#[test]
fn query_has_like_go_values() {
    assert!(query_has("verbose", "verbose"));
    assert!(query_has("verbose=false", "verbose"));
    assert!(query_has("a=1&verbose=", "verbose"));
    assert!(query_has("verb%6Fse", "verbose"));
    assert!(query_has("a+b=1", "a b"));
    assert!(
        query_has("x;y&verbose", "verbose"),
        "other settings still count"
    );
    assert!(!query_has("verbose;x", "verbose"));
    assert!(
        !query_has("verbose=%zz", "verbose"),
        "a bad value drops the pair"
    );
    assert!(!query_has("", "verbose"));
    assert!(!query_has("verbosity", "verbose"));
}

/// A query component escaper (like Go's `QueryEscape`, escaping more).
fn escape(bytes: &[u8]) -> String {
    let mut out = String::new();
    for &b in bytes {
        match b {
            b' ' => out.push('+'),
            b if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) => out.push(char::from(b)),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

proptest! {
    #[test]
    fn escape_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let escaped = escape(&bytes);
        prop_assert_eq!(&*query_unescape(&escaped).unwrap(), &bytes[..]);
        let path = escaped.replace('+', "%20");
        prop_assert_eq!(&*path_unescape(&path).unwrap(), &bytes[..]);
    }

    #[test]
    fn any_input_decodes_or_names_its_escape(s in "[%+a-fA-F0-9gz;&=]{0,24}") {
        let well_formed = {
            let b = s.as_bytes();
            let mut i = 0;
            let mut ok = true;
            while i < b.len() {
                if b[i] == b'%' {
                    let hexes = b.get(i + 1..i + 3).is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit));
                    if !hexes { ok = false; break; }
                    i += 3;
                } else {
                    i += 1;
                }
            }
            ok
        };
        match query_unescape(&s) {
            Ok(out) => {
                prop_assert!(well_formed);
                prop_assert!(out.len() <= s.len());
            }
            Err(Error::UrlInvalidEscape { escape, len }) => {
                prop_assert!(!well_formed);
                prop_assert_eq!(escape[0], b'%');
                prop_assert!((1..=3).contains(&len));
            }
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
        // Without '+', path and query decoding agree.
        if !s.contains('+') {
            prop_assert_eq!(query_unescape(&s).ok(), path_unescape(&s).ok());
        }
    }

    #[test]
    fn query_has_agrees_with_parse_query(s in "[a-c%2+;&=]{0,24}", key in "[a-c ]{1,2}") {
        let has = query_has(&s, &key);
        let found = query_settings(&s).any(|r| r.is_ok_and(|(k, _)| *k == *key.as_bytes()));
        prop_assert_eq!(has, found);
        if let Ok(all) = parse_query(&s) {
            prop_assert_eq!(has, all.iter().any(|(k, _)| **k == *key.as_bytes()));
            prop_assert!(all.len() <= s.matches('&').count() + 1);
        }
    }
}
