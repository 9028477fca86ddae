//! What the kernel charges to move bytes through one loopback socket, by
//! the size of each `write` and `read`: the floor under every hop a tunnel
//! adds (destination → agent and agent → server over TCP, server →
//! kube-apiserver over a Unix socket), and the reason the agent's
//! destination sockets read and write several packets per system call
//! (`konn_core::io::sock`, docs/BENCHMARKS.md "Bytes per system call").
//!
//! One thread, both ends: every iteration writes `size` bytes (in one call
//! when the socket has room) and reads them back in calls of at most
//! `size` bytes, so the time per byte is the send and the receive path of
//! one hop together, without wake-ups or a second core.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

const SIZES: [usize; 3] = [16 * 1024, 64 * 1024, 256 * 1024];

/// Sends `data` with calls of at most its length and reads it back with
/// calls of at most `buf.len()`; non-blocking, so a socket buffer smaller
/// than `data` cannot stall the one thread that runs both ends.
fn hop<W: Write, R: Read>(tx: &mut W, rx: &mut R, data: &[u8], buf: &mut [u8]) {
    let (mut sent, mut got) = (0, 0);
    while got < data.len() {
        if sent < data.len() {
            match tx.write(&data[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("loopback write: {e}"),
            }
        }
        match rx.read(buf) {
            Ok(0) => panic!("loopback peer closed"),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("loopback read: {e}"),
        }
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("loopback_hop");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let mut tcp_tx = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (mut tcp_rx, _) = listener.accept().expect("accept");
    let (mut unix_tx, mut unix_rx) = UnixStream::pair().expect("socketpair");
    for nb in [
        tcp_tx.set_nonblocking(true),
        tcp_rx.set_nonblocking(true),
        unix_tx.set_nonblocking(true),
        unix_rx.set_nonblocking(true),
    ] {
        nb.expect("non-blocking socket");
    }
    for size in SIZES {
        let data = vec![7u8; size];
        let mut buf = vec![0u8; size];
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("tcp", size), &size, |b, _| {
            b.iter(|| hop(&mut tcp_tx, &mut tcp_rx, &data, &mut buf));
        });
        group.bench_with_input(BenchmarkId::new("unix", size), &size, |b, _| {
            b.iter(|| hop(&mut unix_tx, &mut unix_rx, &data, &mut buf));
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
