//! Fuzz target `packet`: `Packet::decode` on arbitrary bytes must never
//! panic; whatever it accepts must re-encode to exactly `encoded_len()` bytes
//! (in both the plain and the gRPC-framed form) and decode again to the same
//! packet. That includes konn's flow-control extension (`PAUSE`/`RESUME`,
//! type and oneof member 100/101; seeds `seed-pause`, `seed-resume`), whose
//! two-byte member key is the only multi-byte key the encoder writes.
#![no_main]
use bytes::Bytes;
use konn_frames::packet::{Packet, PacketType};
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
    assert_eq!(again.ty(), packet.ty());
    assert_eq!(
        PacketType::try_from(i32::from(packet.ty())),
        Ok(packet.ty()),
        "every decoded type maps back"
    );

    let mut framed = Vec::new();
    packet.encode_grpc(&mut framed);
    assert_eq!(framed.len(), 5 + encoded.len());
    assert_eq!(framed[5..], encoded[..]);
});
