//! Hostile or broken peers against `TlsLayer` (reliability-security.md §1.4
//! and §4.4 row 22): fragmented ClientHello, close_notify and EOF during the
//! handshake, KeyUpdate floods, oversized and garbage records. The layer must
//! never panic, never loop, never buffer without bound, and fail cleanly.

mod tls_support;

use bytes::BytesMut;
use konn_core::Error;
use konn_core::io::tls::TlsLayer;
use rustls::PeerMisbehaved;
use tls_support::{Pki, connected, handshake, pump};

const CLOSE_NOTIFY_RECORD: &[u8] = &[0x15, 0x03, 0x03, 0x00, 0x02, 0x01, 0x00];

/// Splits TLS records into records of `size`-byte fragments (same content
/// type), as a hostile or odd client may. Only valid for plaintext records.
fn refragment(wire: &[u8], size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = wire;
    while rest.len() >= 5 {
        let typ = rest[0];
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        let body = &rest[5..5 + len];
        for piece in body.chunks(size) {
            out.extend_from_slice(&[typ, rest[1], rest[2]]);
            out.extend_from_slice(&(piece.len() as u16).to_be_bytes());
            out.extend_from_slice(piece);
        }
        rest = &rest[5 + len..];
    }
    assert!(rest.is_empty());
    out
}

#[test]
fn client_hello_in_one_byte_records_fed_one_byte_at_a_time() {
    // RUSTSEC-2024-0399: a ClientHello fragmented into 1-byte records (and
    // delivered in 1-byte TCP segments) must not panic, and must work.
    let pki = Pki::new();
    let mut c = pki.client_tls().layer().unwrap();
    let mut s = pki.server_tls().layer().unwrap();
    let mut hello = BytesMut::new();
    c.take_tls(&mut hello);
    assert_eq!(hello[0], 0x16, "first flight is a handshake record");
    let fragmented = refragment(&hello, 1);
    assert_eq!(fragmented.len(), (hello.len() - 5) * 6);
    for b in &fragmented {
        assert_eq!(s.feed_tls(std::slice::from_ref(b)).unwrap(), 1);
    }
    assert!(s.wants_write(), "the server answered the reassembled hello");
    handshake(&mut c, &mut s).unwrap();
    assert!(!s.is_handshaking());
}

#[test]
fn client_hello_in_odd_sized_records_fed_in_one_piece() {
    let pki = Pki::new();
    for size in [2, 3, 7, 100] {
        let mut c = pki.client_tls().layer().unwrap();
        let mut s = pki.server_tls().layer().unwrap();
        let mut hello = BytesMut::new();
        c.take_tls(&mut hello);
        let fragmented = refragment(&hello, size);
        assert_eq!(s.feed_tls(&fragmented).unwrap(), fragmented.len());
        handshake(&mut c, &mut s).unwrap();
    }
}

#[test]
fn close_notify_before_client_hello_then_eof_fails_without_looping() {
    // RUSTSEC-2024-0336: close_notify during the handshake must not make the
    // handshake spin. rustls ignores it there (unauthenticated), so the
    // feed returns and the EOF that follows is a handshake failure.
    let pki = Pki::new();
    let mut s = pki.server_tls().layer().unwrap();
    assert_eq!(
        s.feed_tls(CLOSE_NOTIFY_RECORD).unwrap(),
        CLOSE_NOTIFY_RECORD.len()
    );
    assert!(s.is_handshaking());
    assert!(
        !s.peer_closed(),
        "an unauthenticated close_notify is not a clean close"
    );
    assert!(matches!(s.feed_eof(), Err(Error::TlsHandshakeEof)));
    let mut buf = BytesMut::new();
    assert!(matches!(
        s.read_plaintext(&mut buf),
        Err(Error::TlsHandshakeEof)
    ));
}

#[test]
fn close_notify_after_server_hello_then_eof_fails_without_looping() {
    let pki = Pki::new();
    let mut c = pki.client_tls().layer().unwrap();
    let mut s = pki.server_tls().layer().unwrap();
    pump(&mut c, &mut s).unwrap();
    pump(&mut s, &mut c).unwrap();
    // The client has everything but sends close_notify instead of Finished.
    let mut discard = BytesMut::new();
    c.take_tls(&mut discard);
    // Once the version is negotiated (TLS 1.3) a close_notify alert is
    // fatal: the handshake ends with an error instead of waiting forever.
    let r = s.feed_tls(CLOSE_NOTIFY_RECORD);
    assert!(
        matches!(
            r,
            Err(Error::Tls(rustls::Error::AlertReceived(
                rustls::AlertDescription::CloseNotify
            )))
        ),
        "{r:?}"
    );
    assert!(s.is_handshaking());
    assert!(s.feed_eof().is_err());
}

#[test]
fn client_close_notify_mid_handshake_then_eof_fails_on_the_server() {
    let pki = Pki::new();
    let mut c = pki.client_tls().layer().unwrap();
    let mut s = pki.server_tls().layer().unwrap();
    pump(&mut c, &mut s).unwrap();
    c.send_close_notify();
    let _ = pump(&mut c, &mut s);
    assert!(s.is_handshaking());
    assert!(s.feed_eof().is_err());
}

#[test]
fn repeated_close_notify_during_the_handshake_is_a_protocol_error() {
    let pki = Pki::new();
    let mut s = pki.server_tls().layer().unwrap();
    let mut result = Ok(0);
    for _ in 0..20 {
        result = s.feed_tls(CLOSE_NOTIFY_RECORD);
        if result.is_err() {
            break;
        }
    }
    assert!(
        matches!(
            result,
            Err(Error::Tls(rustls::Error::PeerMisbehaved(
                PeerMisbehaved::TooManyWarningAlertsReceived
            )))
        ),
        "{result:?}"
    );
}

#[test]
fn eof_in_the_middle_of_the_handshake_is_reported() {
    let pki = Pki::new();
    let mut c = pki.client_tls().layer().unwrap();
    let mut s = pki.server_tls().layer().unwrap();
    let mut hello = BytesMut::new();
    c.take_tls(&mut hello);
    s.feed_tls(&hello[..hello.len() / 2]).unwrap();
    assert!(matches!(s.feed_eof(), Err(Error::TlsHandshakeEof)));
    // Client side: EOF right after its hello.
    assert!(matches!(c.feed_eof(), Err(Error::TlsHandshakeEof)));
}

#[test]
fn key_update_flood_is_refused() {
    let pki = Pki::new();
    let (mut c, mut s) = connected(&pki);
    let mut wire = BytesMut::new();
    for _ in 0..200 {
        c.refresh_traffic_keys().unwrap();
        c.take_tls(&mut wire);
    }
    let err = s.feed_tls(&wire).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Tls(rustls::Error::PeerMisbehaved(
                PeerMisbehaved::TooManyKeyUpdateRequests
            ))
        ),
        "{err:?}"
    );
    // What the server queued in answer stays small.
    let mut out = BytesMut::new();
    let answered = s.take_tls(&mut out);
    assert!(
        answered < 64 * 200,
        "{answered} bytes queued in answer to the flood"
    );
}

#[test]
fn key_update_before_handshake_completion_is_refused_locally() {
    let pki = Pki::new();
    let mut c = pki.client_tls().layer().unwrap();
    assert!(matches!(c.refresh_traffic_keys(), Err(Error::Tls(_))));
}

#[test]
fn oversized_record_is_rejected_before_buffering_it() {
    let pki = Pki::new();
    let (_c, mut s) = connected(&pki);
    // An application-data record header claiming 65535 bytes: more than the
    // 16 KiB + 256 TLS 1.3 allows.
    let err = s.feed_tls(&[0x17, 0x03, 0x03, 0xff, 0xff]).unwrap_err();
    assert!(matches!(err, Error::Tls(_)), "{err:?}");
}

#[test]
fn huge_handshake_message_is_rejected_early() {
    let pki = Pki::new();
    let mut s = pki.server_tls().layer().unwrap();
    // A ClientHello claiming 16 MiB, sent as many maximal records.
    let mut first = vec![0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0xff, 0xff, 0xff];
    first.resize(5 + 0x4000, 0);
    let mut fed = 0usize;
    let mut result = s.feed_tls(&first);
    while result.is_ok() && fed < 1 << 20 {
        fed += first.len();
        let mut record = vec![0x16, 0x03, 0x01, 0x40, 0x00];
        record.resize(5 + 0x4000, 0);
        result = s.feed_tls(&record);
    }
    assert!(
        matches!(
            result,
            Err(Error::Tls(rustls::Error::InvalidMessage(
                rustls::InvalidMessage::HandshakePayloadTooLarge
            )))
        ),
        "still accepting after {fed} bytes: {result:?}"
    );
    assert!(
        fed <= 128 * 1024,
        "buffered {fed} bytes of a handshake message"
    );
}

#[test]
fn garbage_never_panics_and_fails_cleanly() {
    let pki = Pki::new();
    let server = pki.server_tls();
    let client = pki.client_tls();
    // An HTTP/1.1 request on the TLS port.
    let mut s = server.layer().unwrap();
    assert!(matches!(
        s.feed_tls(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
        Err(Error::Tls(_))
    ));
    // Deterministic pseudo-random inputs, both sides, whole and byte-wise.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for round in 0..300 {
        let len = (round * 7) % 700 + 1;
        let mut input = Vec::with_capacity(len);
        for _ in 0..len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            input.push(x as u8);
        }
        if round % 3 == 0 {
            // Make it look like a TLS record to get deeper into the parser.
            input[0] = 0x16;
            if len > 2 {
                input[1] = 3;
                input[2] = 1;
            }
        }
        let mut layer: TlsLayer = if round % 2 == 0 {
            server.layer().unwrap()
        } else {
            let mut c = client.layer().unwrap();
            let mut sink = BytesMut::new();
            c.take_tls(&mut sink);
            c
        };
        if round % 4 == 1 {
            for b in &input {
                if layer.feed_tls(std::slice::from_ref(b)).is_err() {
                    break;
                }
            }
        } else {
            let _ = layer.feed_tls(&input);
        }
        let mut out = BytesMut::new();
        layer.take_tls(&mut out);
        let _ = layer.read_plaintext(&mut out);
        let _ = layer.feed_eof();
        assert!(layer.is_handshaking());
    }
}
