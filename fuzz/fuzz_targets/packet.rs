//! Fuzz target `packet`: `Packet::decode` on arbitrary bytes must never
//! panic; whatever it accepts must re-encode to exactly `encoded_len()` bytes
//! (in both the plain and the gRPC-framed form) and decode again to the same
//! packet.
#![no_main]
use bytes::Bytes;
use konn_frames::packet::Packet;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(packet) = Packet::decode(&Bytes::copy_from_slice(data)) else {
        return;
    };
    let mut encoded = Vec::new();
    packet.encode(&mut encoded);
    assert_eq!(encoded.len(), packet.encoded_len());
    let again = Packet::decode(&Bytes::from(encoded.clone())).expect("re-encoding decodes");
    assert_eq!(again, packet);

    let mut framed = Vec::new();
    packet.encode_grpc(&mut framed);
    assert_eq!(framed.len(), 5 + encoded.len());
    assert_eq!(framed[5..], encoded[..]);
});
