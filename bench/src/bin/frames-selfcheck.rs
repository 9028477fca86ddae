//! `frames-selfcheck`: walks Konnectivity traffic through every konn-frames
//! codec, checks that it comes back unchanged, and measures the codec stack.
//!
//! This is what `scripts/demo` runs until the tunnel binaries exist: it shows
//! the bytes a kube-apiserver dial produces on the wire, layer by layer.
#![allow(clippy::disallowed_methods)] // a measuring tool: it reads the clock

use std::time::Instant;

use anyhow::{Context, bail, ensure};
use bytes::{Bytes, BytesMut};
use konn_frames::connect;
use konn_frames::grpc::{self, Deframer};
use konn_frames::h2::{self, Frame};
use konn_frames::hpack;
use konn_frames::packet::{ByteStr, MAX_DATA_PAYLOAD, Packet};

fn main() -> anyhow::Result<()> {
    println!("konn frames self-check\n");
    headers_layer()?;
    let dial = Packet::DialReq {
        protocol: ByteStr::from_static("tcp"),
        address: ByteStr::from_static("10.0.0.5:10250"),
        random: 0x1234_5678_9abc,
    };
    show_packet("DIAL_REQ", &dial)?;
    let data = Packet::Data {
        connect_id: 7,
        error: ByteStr::new(),
        data: Bytes::from_static(b"GET /containerLogs/default/web/app HTTP/1.1\r\n\r\n"),
    };
    show_packet("DATA", &data)?;
    connect_layer()?;
    throughput()?;
    println!("\nall codec round trips OK");
    Ok(())
}

/// The request headers grpc-go sends when an agent opens its tunnel.
fn headers_layer() -> anyhow::Result<()> {
    let fields = [
        (":method", "POST"),
        (":scheme", "https"),
        (":path", "/AgentService/Connect"),
        (":authority", "127.0.0.1:8091"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("agentid", "6f1e2b4c-9d1a-4c1e-8a5b-3f2d1c0b9a87"),
        ("agentidentifiers", "host=node1&ipv4=10.0.0.5"),
    ];
    let mut enc = hpack::Encoder::new();
    let mut dec = hpack::Decoder::new(hpack::DEFAULT_TABLE_SIZE);
    for round in ["first", "second"] {
        let mut block = BytesMut::new();
        enc.encode(
            fields
                .iter()
                .map(|(n, v)| hpack::Field::new(n.as_bytes(), v.as_bytes())),
            &mut block,
        );
        let mut got = Vec::new();
        dec.decode(&block, &mut |f| {
            got.push((f.name.to_vec(), f.value.to_vec()));
        })?;
        ensure!(got.len() == fields.len(), "HPACK lost fields");
        let raw: usize = fields.iter().map(|(n, v)| n.len() + v.len() + 4).sum();
        println!(
            "HPACK {round} /AgentService/Connect request: {} header bytes -> {} bytes on the wire",
            raw,
            block.len()
        );
    }
    Ok(())
}

/// Packet -> gRPC message -> HTTP/2 DATA frame, then back through the decoders.
fn show_packet(name: &str, p: &Packet) -> anyhow::Result<()> {
    let mut msg = BytesMut::new();
    p.encode_grpc(&mut msg);
    let mut wire = BytesMut::new();
    h2::encode_data(1, &msg, false, &mut wire);
    println!(
        "\n{name}: {} bytes protobuf, {} with gRPC prefix, {} as an HTTP/2 frame",
        p.encoded_len(),
        msg.len(),
        wire.len()
    );
    println!("  {}", hex(&wire));

    let wire = wire.freeze();
    let (frame, used) = h2::decode(&wire, 16_384)?.context("incomplete frame")?;
    ensure!(used == wire.len(), "frame length");
    let Frame::Data { data, .. } = frame else {
        bail!("not a DATA frame")
    };
    let start = data.as_ptr() as usize - wire.as_ptr() as usize;
    let mut chunk = wire.slice(start..start + data.len());
    let mut deframer = Deframer::new(grpc::DEFAULT_MAX_RECV_MESSAGE_SIZE);
    let body = deframer.next(&mut chunk)?.context("no message")?;
    let back = Packet::decode(&body)?;
    ensure!(&back == p, "packet changed in the round trip");
    if let Packet::Data { data, .. } = &back {
        let inside = wire.as_ptr_range().contains(&data.as_ptr());
        println!("  decoded back unchanged; payload is a slice of the receive buffer: {inside}");
        ensure!(inside, "DATA payload was copied");
    } else {
        println!("  decoded back unchanged");
    }
    Ok(())
}

/// What kube-apiserver's HTTP CONNECT dialer sends, parsed.
fn connect_layer() -> anyhow::Result<()> {
    let req = b"CONNECT 10.0.0.5:10250 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n\x16\x03\x01";
    let (r, used) =
        connect::parse_request(req, &connect::Limits::default())?.context("incomplete")?;
    let (host, port) = connect::parse_authority(r.target)?;
    println!(
        "\nHTTP CONNECT: method {} target {host}:{port}; {} bytes of head, {} tunnel bytes left untouched",
        r.method,
        used,
        req.len() - used
    );
    println!(
        "  reply: {:?}",
        String::from_utf8_lossy(connect::ESTABLISHED)
    );
    Ok(())
}

/// Encode and decode 1 GiB of full-size DATA packets through all layers.
fn throughput() -> anyhow::Result<()> {
    let payload = Bytes::from(vec![0xa5u8; MAX_DATA_PAYLOAD]);
    let total: usize = 1 << 30;
    let rounds = total / MAX_DATA_PAYLOAD;
    let mut wire = BytesMut::with_capacity(64 * 1024);
    let mut deframer = Deframer::new(grpc::DEFAULT_MAX_RECV_MESSAGE_SIZE);
    let start = Instant::now();
    let mut seen = 0usize;
    for i in 0..rounds {
        let p = Packet::Data {
            connect_id: i as i64 + 1,
            error: ByteStr::new(),
            data: payload.clone(),
        };
        wire.clear();
        h2::encode_data_head(
            1,
            (p.encoded_len() + grpc::PREFIX_LEN) as u32,
            false,
            &mut wire,
        );
        p.encode_grpc(&mut wire);
        let frozen = wire.split().freeze();
        let (frame, _) = h2::decode(&frozen, 16_384)?.context("frame")?;
        let Frame::Data { data, .. } = frame else {
            bail!("not DATA")
        };
        let mut chunk = frozen.slice(h2::HEAD_LEN..h2::HEAD_LEN + data.len());
        let body = deframer.next(&mut chunk)?.context("message")?;
        if let Packet::Data { data, .. } = Packet::decode(&body)? {
            seen += data.len();
        }
    }
    let secs = start.elapsed().as_secs_f64();
    ensure!(seen == rounds * MAX_DATA_PAYLOAD, "lost bytes");
    println!(
        "\ncodec stack, one core, hot cache: {:.0} MB/s of DATA payload ({rounds} packets of {MAX_DATA_PAYLOAD} B, each one HTTP/2 frame, one payload copy on encode)",
        seen as f64 / secs / 1e6
    );
    Ok(())
}

fn hex(b: &[u8]) -> String {
    let shown: Vec<String> = b.iter().take(48).map(|x| format!("{x:02x}")).collect();
    let more = if b.len() > 48 { " …" } else { "" };
    format!("{}{more}", shown.join(" "))
}
