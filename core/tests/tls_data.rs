//! Data transfer through two in-memory `TlsLayer`s: large and byte-by-byte
//! transfers, end-of-stream semantics and bounded buffering.

mod tls_support;

use bytes::BytesMut;
use konn_core::Error;
use konn_core::io::tls::{DEFAULT_BUFFER_LIMIT, Plaintext, TlsLayer};
use tls_support::{Pki, connected, drain, pump};

/// Deterministic test payload.
fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

/// Sends all of `data` from `tx` to `rx`, moving ciphertext in chunks of
/// `chunk` bytes and reading plaintext as it arrives (the receiver's
/// plaintext buffer is bounded, so it must be drained while feeding).
fn transfer(tx: &mut TlsLayer, rx: &mut TlsLayer, data: &[u8], chunk: usize) -> Vec<u8> {
    let mut received = BytesMut::new();
    let mut rest = data;
    let mut wire = BytesMut::new();
    while !rest.is_empty() || tx.wants_write() {
        let n = tx.write_plaintext(rest).unwrap();
        rest = &rest[n..];
        tx.take_tls(&mut wire);
        let mut off = 0;
        while off < wire.len() {
            let end = (off + chunk).min(wire.len());
            let taken = rx.feed_tls(&wire[off..end]).unwrap();
            off += taken;
            // Drain after every feed, as a driver would.
            match rx.read_plaintext(&mut received).unwrap() {
                Plaintext::Data(_) | Plaintext::Empty => {}
                Plaintext::Eof => panic!("unexpected EOF"),
            }
        }
        wire.clear();
    }
    received.to_vec()
}

#[test]
fn one_mebibyte_each_way() {
    let pki = Pki::new();
    let (mut c, mut s) = connected(&pki);
    let data = payload(1 << 20);
    assert_eq!(transfer(&mut c, &mut s, &data, 64 * 1024), data);
    let data2 = payload((1 << 20) + 17);
    assert_eq!(transfer(&mut s, &mut c, &data2, 4096), data2);
}

#[test]
fn releasing_idle_buffers_keeps_the_connection_whole() {
    let pki = Pki::new();
    let (mut c, mut s) = connected(&pki);
    // Mid-record: the first half of a 16 KiB record is buffered in rustls
    // when the release runs; it must survive, and nothing may look like EOF.
    let data = payload(64 * 1024);
    let mut wire = BytesMut::new();
    c.write_plaintext(&data[..16 * 1024]).unwrap();
    c.take_tls(&mut wire);
    let half = wire.len() / 2;
    assert_eq!(s.feed_tls(&wire[..half]).unwrap(), half);
    s.release_idle();
    c.release_idle();
    assert_eq!(s.feed_tls(&wire[half..]).unwrap(), wire.len() - half);
    let mut got = BytesMut::new();
    assert!(matches!(
        s.read_plaintext(&mut got).unwrap(),
        Plaintext::Data(_)
    ));
    assert_eq!(&got[..], &data[..16 * 1024]);
    // Idle with nothing pending, released twice, then both ways again.
    s.release_idle();
    s.release_idle();
    assert_eq!(
        transfer(&mut c, &mut s, &data[16 * 1024..], 4096),
        &data[16 * 1024..]
    );
    assert_eq!(transfer(&mut s, &mut c, b"pong", 7), b"pong");
}

#[test]
fn byte_by_byte_feeding_delivers_everything() {
    let pki = Pki::new();
    let (mut c, mut s) = connected(&pki);
    let data = payload(40_000);
    assert_eq!(transfer(&mut c, &mut s, &data, 1), data);
    assert_eq!(transfer(&mut s, &mut c, b"pong", 1), b"pong");
}

#[test]
fn byte_by_byte_handshake_completes() {
    let pki = Pki::new();
    let mut c = pki.client_tls().layer().unwrap();
    let mut s = pki.server_tls().layer().unwrap();
    fn trickle(from: &mut TlsLayer, to: &mut TlsLayer) {
        let mut wire = BytesMut::new();
        from.take_tls(&mut wire);
        for b in wire.iter() {
            assert_eq!(to.feed_tls(std::slice::from_ref(b)).unwrap(), 1);
        }
    }
    for _ in 0..10 {
        trickle(&mut c, &mut s);
        trickle(&mut s, &mut c);
    }
    assert!(!c.is_handshaking() && !s.is_handshaking());
    assert_eq!(transfer(&mut c, &mut s, b"hello", 1), b"hello");
}

#[test]
fn data_written_before_the_handshake_is_sent_after_it() {
    let pki = Pki::new();
    let mut c = pki.client_tls().layer().unwrap();
    let mut s = pki.server_tls().layer().unwrap();
    assert_eq!(c.write_plaintext(b"early").unwrap(), 5);
    tls_support::handshake(&mut c, &mut s).unwrap();
    let (got, end) = drain(&mut s).unwrap();
    assert_eq!(&got[..], b"early");
    assert_eq!(end, Plaintext::Empty);
}

#[test]
fn close_notify_is_a_clean_eof_after_all_data() {
    let pki = Pki::new();
    let (mut c, mut s) = connected(&pki);
    c.write_plaintext(b"last words").unwrap();
    c.send_close_notify();
    c.send_close_notify(); // idempotent
    pump(&mut c, &mut s).unwrap();
    assert!(s.peer_closed());
    let mut buf = BytesMut::new();
    assert_eq!(s.read_plaintext(&mut buf).unwrap(), Plaintext::Data(10));
    assert_eq!(&buf[..], b"last words");
    assert_eq!(s.read_plaintext(&mut buf).unwrap(), Plaintext::Eof);
    // TCP EOF after close_notify changes nothing.
    s.feed_eof().unwrap();
    assert_eq!(s.read_plaintext(&mut buf).unwrap(), Plaintext::Eof);
    // Bytes after close_notify are swallowed, not an error or a stall.
    assert_eq!(s.feed_tls(b"\x17\x03\x03\x00\x05junk!").unwrap(), 10);
    // Writing after our own close_notify is refused.
    assert!(matches!(
        c.write_plaintext(b"x"),
        Err(Error::TlsWriteAfterClose)
    ));
    // The other direction still works until the server closes too.
    s.write_plaintext(b"bye").unwrap();
    s.send_close_notify();
    pump(&mut s, &mut c).unwrap();
    let (got, end) = drain(&mut c).unwrap();
    assert_eq!((&got[..], end), (&b"bye"[..], Plaintext::Eof));
}

#[test]
fn eof_without_close_notify_is_truncation() {
    let pki = Pki::new();
    let (mut c, mut s) = connected(&pki);
    c.write_plaintext(b"partial").unwrap();
    pump(&mut c, &mut s).unwrap();
    s.feed_eof().unwrap();
    let mut buf = BytesMut::new();
    // Authenticated data before the EOF is still delivered...
    assert_eq!(s.read_plaintext(&mut buf).unwrap(), Plaintext::Data(7));
    // ...then the truncation is reported, every time.
    assert!(matches!(
        s.read_plaintext(&mut buf),
        Err(Error::TlsTruncated)
    ));
    assert!(matches!(
        s.read_plaintext(&mut buf),
        Err(Error::TlsTruncated)
    ));
    assert!(!s.wants_read());
}

#[test]
fn eof_while_the_plaintext_buffer_is_full_is_still_truncation() {
    let pki = Pki::new();
    let (mut c, mut s) = connected(&pki);
    let data = payload(200_000);
    let mut wire = BytesMut::new();
    let mut rest = &data[..];
    while !rest.is_empty() {
        let n = c.write_plaintext(rest).unwrap();
        rest = &rest[n..];
        c.take_tls(&mut wire);
    }
    // Feed until back-pressure, then the transport ends.
    let fed = s.feed_tls(&wire).unwrap();
    assert!(fed < wire.len());
    s.feed_eof().unwrap();
    let mut got = BytesMut::new();
    let end = loop {
        match s.read_plaintext(&mut got) {
            Ok(Plaintext::Data(_)) => continue,
            other => break other,
        }
    };
    assert!(matches!(end, Err(Error::TlsTruncated)), "{end:?}");
    assert_eq!(&got[..], &data[..got.len()]);
}

#[test]
fn truncated_record_then_eof_is_truncation() {
    let pki = Pki::new();
    let (mut c, mut s) = connected(&pki);
    c.write_plaintext(&payload(1000)).unwrap();
    let mut wire = BytesMut::new();
    c.take_tls(&mut wire);
    // Deliver all but the last byte of the record: nothing is readable.
    s.feed_tls(&wire[..wire.len() - 1]).unwrap();
    let mut buf = BytesMut::new();
    assert_eq!(s.read_plaintext(&mut buf).unwrap(), Plaintext::Empty);
    s.feed_eof().unwrap();
    assert!(matches!(
        s.read_plaintext(&mut buf),
        Err(Error::TlsTruncated)
    ));
}

#[test]
fn tampered_record_is_a_fatal_error() {
    let pki = Pki::new();
    let (mut c, mut s) = connected(&pki);
    c.write_plaintext(b"integrity").unwrap();
    let mut wire = BytesMut::new();
    c.take_tls(&mut wire);
    let last = wire.len() - 1;
    wire[last] ^= 1;
    let err = s.feed_tls(&wire).unwrap_err();
    assert!(
        matches!(err, Error::Tls(rustls::Error::DecryptError)),
        "{err:?}"
    );
    // The layer stays failed, and has an alert for the peer.
    assert!(matches!(
        s.feed_tls(b"\x17"),
        Err(Error::Tls(rustls::Error::DecryptError))
    ));
    assert!(matches!(s.write_plaintext(b"x"), Err(Error::Tls(_))));
    assert!(s.wants_write());
    let mut buf = BytesMut::new();
    assert!(matches!(s.read_plaintext(&mut buf), Err(Error::Tls(_))));
}

/// Writes 4 KiB chunks from a connected client whose peer never reads;
/// returns (accepted plaintext, ciphertext pending).
fn fill_until_refused(pki: &Pki, limit: usize) -> (usize, usize, TlsLayer) {
    let mut co = pki.client_options("127.0.0.1");
    co.limits.buffer_limit = limit;
    let mut c = co.build().unwrap().layer().unwrap();
    let mut s = pki.server_tls().layer().unwrap();
    tls_support::handshake(&mut c, &mut s).unwrap();
    let chunk = payload(4096);
    let mut accepted = 0usize;
    let mut zero_writes = 0;
    for _ in 0..1000 {
        let n = c.write_plaintext(&chunk).unwrap();
        accepted += n;
        if n == 0 {
            zero_writes += 1;
        }
    }
    assert!(zero_writes > 900, "writes kept being accepted");
    let mut wire = BytesMut::new();
    let pending = c.take_tls(&mut wire);
    (accepted, pending, c)
}

#[test]
fn writes_stop_at_the_buffer_limit_when_the_peer_never_reads() {
    let pki = Pki::new();
    for limit in [DEFAULT_BUFFER_LIMIT, 20_000, 256 * 1024] {
        let (accepted, pending, mut c) = fill_until_refused(&pki, limit);
        // Bounded by the configured limit (records add a little overhead).
        assert!(accepted <= limit, "accepted {accepted} > limit {limit}");
        assert!(
            accepted + 4096 + 1024 >= limit,
            "accepted only {accepted} of {limit}"
        );
        assert!(
            pending <= limit + 1024,
            "{pending} bytes of ciphertext pending"
        );
        // After the ciphertext has been taken, writing resumes.
        assert!(c.write_plaintext(&payload(10)).unwrap() > 0);
    }
}

#[test]
fn a_receiver_that_does_not_read_plaintext_stops_taking_ciphertext() {
    let pki = Pki::new();
    let (mut c, mut s) = connected(&pki);
    let data = payload(1 << 20);
    let mut wire = BytesMut::new();
    let mut rest = &data[..];
    while !rest.is_empty() {
        let n = c.write_plaintext(rest).unwrap();
        rest = &rest[n..];
        c.take_tls(&mut wire);
    }
    // Feed everything without ever reading plaintext.
    let mut fed = 0;
    loop {
        let n = s.feed_tls(&wire[fed..]).unwrap();
        if n == 0 {
            break;
        }
        fed += n;
    }
    assert!(
        fed < 64 * 1024,
        "took {fed} bytes of ciphertext with nobody reading"
    );
    assert!(!s.wants_read());
    // Reading unblocks it: the whole megabyte eventually arrives.
    let mut got = BytesMut::new();
    let mut max_batch = 0;
    while fed < wire.len() {
        let before = got.len();
        s.read_plaintext(&mut got).unwrap();
        max_batch = max_batch.max(got.len() - before);
        fed += s.feed_tls(&wire[fed..]).unwrap();
    }
    drain_into(&mut s, &mut got);
    assert_eq!(&got[..], &data[..]);
    assert!(
        max_batch <= 48 * 1024,
        "one read_plaintext returned {max_batch} bytes"
    );
}

fn drain_into(layer: &mut TlsLayer, dst: &mut BytesMut) {
    while let Plaintext::Data(_) = layer.read_plaintext(dst).unwrap() {}
}

#[test]
fn key_updates_interleaved_with_data_are_transparent() {
    let pki = Pki::new();
    let (mut c, mut s) = connected(&pki);
    for i in 0..5u8 {
        c.refresh_traffic_keys().unwrap();
        assert_eq!(transfer(&mut c, &mut s, &[i; 100], 7), vec![i; 100]);
        // The server answers each update; the client must take the answer.
        pump(&mut s, &mut c).unwrap();
        assert_eq!(transfer(&mut s, &mut c, &[i; 10], 3), vec![i; 10]);
    }
}
