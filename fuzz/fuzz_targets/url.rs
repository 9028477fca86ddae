//! Fuzzes `url::{query_unescape, path_unescape, parse_query, query_has}`.
//!
//! Unescaping either decodes or names a `%` escape; a decoded component,
//! escaped again, decodes back to the same bytes. `parse_query` succeeds
//! exactly when every setting decodes, never yields more settings than the
//! query has, and agrees with `query_has` on every key it found.
#![no_main]

use konn_frames::Error;
use konn_frames::url::{
    MAX_QUERY_PARAMS, parse_query, path_unescape, query_has, query_settings, query_unescape,
};
use libfuzzer_sys::fuzz_target;

fn escape(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("%{b:02x}")).collect()
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    for decoded in [query_unescape(s), path_unescape(s)] {
        match decoded {
            Ok(bytes) => {
                assert!(bytes.len() <= s.len());
                assert_eq!(&*query_unescape(&escape(&bytes)).unwrap(), &*bytes);
            }
            Err(Error::UrlInvalidEscape { escape, len }) => {
                assert_eq!(escape[0], b'%');
                assert!((1..=3).contains(&len));
            }
            Err(e) => panic!("unescape: unexpected error {e}"),
        }
    }
    let all_ok = query_settings(s).all(|r| r.is_ok());
    match parse_query(s) {
        Ok(settings) => {
            assert!(all_ok);
            assert!(settings.len() <= s.matches('&').count() + 1);
            for (k, _) in &settings {
                if let Ok(key) = std::str::from_utf8(k) {
                    assert!(query_has(s, key));
                }
            }
        }
        Err(Error::UrlTooManyParams) => assert!(s.matches('&').count() >= MAX_QUERY_PARAMS),
        Err(_) => assert!(!all_ok),
    }
});
