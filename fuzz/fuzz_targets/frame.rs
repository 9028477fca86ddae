//! Fuzz target `frame`: HTTP/2 frame decoding and re-encoding.
//!
//! The first input byte picks SETTINGS_MAX_FRAME_SIZE (even: 16384, odd: a
//! small limit so FrameTooLarge is reachable with short inputs); the rest is
//! decoded frame after frame. Every decoded frame must re-encode to the
//! same number of bytes, decode back to an equal frame, and need its last
//! byte (a strict prefix is "incomplete", never an error or another frame).
//! Errors must carry an HTTP/2 code. Settings frames are also applied to a
//! `Settings`, and the input is run through the preface check.
#![no_main]
use konn_frames::h2::{self, Frame, Settings};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = h2::decode_preface(data);
    let Some((&first, mut rest)) = data.split_first() else {
        return;
    };
    let max = if first & 1 == 0 {
        h2::DEFAULT_MAX_FRAME_SIZE
    } else {
        u32::from(first) * 8
    };
    let mut settings = Settings::default();
    let mut out = Vec::new();
    loop {
        match h2::decode(rest, max) {
            Ok(Some((frame, used))) => {
                out.clear();
                frame.encode(&mut out);
                assert_eq!(out.len(), used, "{frame:?}");
                assert_eq!(frame.encoded_len(), used);
                let again = h2::decode(&out, max).expect("re-encoded frame must decode");
                assert_eq!(again, Some((frame, used)));
                assert_eq!(h2::decode(&out[..used - 1], max), Ok(None));
                if let Frame::Settings { params, .. } = frame {
                    let _ = settings.apply_all(params);
                }
                rest = &rest[used..];
            }
            Ok(None) => break,
            Err(e) => {
                assert!(e.h2().is_some(), "{e:?}");
                // Stream errors leave the frame skippable; carry on past it.
                let Ok(Some(head)) = h2::decode_head(rest, max) else {
                    break;
                };
                match e.h2() {
                    Some((_, konn_frames::Scope::Stream(_))) if head.frame_len() <= rest.len() => {
                        let _ = Frame::load_allowing_self_dependency(
                            head,
                            &rest[h2::HEAD_LEN..head.frame_len()],
                        );
                        rest = &rest[head.frame_len()..];
                    }
                    _ => break,
                }
            }
        }
    }
});
