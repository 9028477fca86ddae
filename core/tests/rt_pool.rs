//! Buffer pool: zero allocation once warm, reuse across threads, budget
//! waits, monoio reads into pooled buffers under every engine.

use std::time::Duration;

use bytes::{BufMut, Bytes};
use konn_core::io::{
    pool::{BUF_CAPACITY, BufPool, MemoryBudget, PoolConfig},
    runtime::{run_on_each_engine, yield_now},
};
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};

use konn_testkit::alloc::{CountingAlloc, allocations, assert_counting};

/// Counts each thread's allocations (konn-testkit's).
#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn small_pool(budget_buffers: usize) -> (MemoryBudget, BufPool) {
    let budget = MemoryBudget::new(budget_buffers * BUF_CAPACITY);
    let pool = BufPool::new(
        &budget,
        &PoolConfig {
            credit_chunk: 4,
            ..PoolConfig::default()
        },
    );
    (budget, pool)
}

/// One packet's life: fill a buffer, freeze it, slice the payload, share
/// it, drop everything.
fn cycle(pool: &BufPool, round: u64) -> u64 {
    let mut buf = pool.try_acquire().expect("budget");
    buf.put_slice(&[0, 0, 4, 0, 0, 0, 0, 0, 1]);
    buf.put_u64(round);
    let frame: Bytes = buf.freeze();
    let payload = frame.slice(9..);
    let shared = payload.clone();
    drop(frame);
    let value = u64::from_be_bytes(shared[..8].try_into().unwrap());
    drop(payload);
    drop(shared);
    value
}

#[test]
fn the_counter_sees_allocations() {
    assert_counting();
    let (_budget, pool) = small_pool(4);
    let before = allocations();
    let buf = pool.try_acquire().unwrap();
    assert!(allocations() - before >= 1, "a miss allocates");
    drop(buf);
}

#[test]
fn steady_state_does_not_allocate() {
    let (_budget, pool) = small_pool(64);
    // Warm up: grows the pool's bookkeeping to its high-water mark.
    let warm: Vec<_> = (0..8).map(|_| pool.try_acquire().unwrap()).collect();
    drop(warm);
    pool.reclaim();
    for round in 0..16 {
        cycle(&pool, round);
    }
    let misses_before = pool.stats().misses;

    let before = allocations();
    let mut sum = 0;
    for round in 0..10_000 {
        sum += cycle(&pool, round);
    }
    let after = allocations();

    assert_eq!(sum, (0..10_000).sum::<u64>());
    assert_eq!(after - before, 0, "allocations in steady state");
    assert_eq!(pool.stats().misses, misses_before, "no new buffers");
}

#[test]
fn interleaved_buffers_do_not_allocate_once_warm() {
    // Two flows alternate and hold their buffer across the other's cycle.
    let (_budget, pool) = small_pool(64);
    let mut held = pool.try_acquire().unwrap();
    for _ in 0..32 {
        let next = pool.try_acquire().unwrap();
        drop(std::mem::replace(&mut held, next).freeze());
    }
    let before = allocations();
    for _ in 0..1_000 {
        let next = pool.try_acquire().unwrap();
        drop(std::mem::replace(&mut held, next).freeze());
    }
    assert_eq!(allocations() - before, 0);
    assert!(pool.stats().allocated <= 3, "{:?}", pool.stats());
}

#[test]
fn bytes_dropped_on_another_thread_come_home() {
    let (_budget, pool) = small_pool(8);
    let mut buf = pool.try_acquire().unwrap();
    buf.put_slice(b"cross-thread");
    let frozen = buf.freeze();
    let remote = frozen.clone();
    drop(frozen);
    std::thread::spawn(move || {
        assert_eq!(&remote[..], b"cross-thread");
        drop(remote);
    })
    .join()
    .unwrap();
    assert_eq!(pool.reclaim(), 1);
    let misses = pool.stats().misses;
    let _again = pool.try_acquire().unwrap();
    assert_eq!(pool.stats().misses, misses, "reused, not reallocated");
}

#[test]
fn async_acquire_waits_for_a_release() {
    run_on_each_engine(|_engine| async {
        let (_budget, pool) = small_pool(1);
        let held = pool.try_acquire().unwrap();
        assert!(pool.try_acquire().is_err());
        let waiter = {
            let pool = pool.clone();
            monoio::spawn(async move { pool.acquire().await.map(|b| b.capacity()) })
        };
        yield_now().await;
        drop(held);
        let capacity = monoio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("acquire completes once the buffer is back");
        assert_eq!(capacity.unwrap(), BUF_CAPACITY);
        assert!(pool.stats().exhausted >= 1);
    });
}

#[test]
fn async_acquire_gives_up_at_its_deadline() {
    run_on_each_engine(|_engine| async {
        let budget = MemoryBudget::new(BUF_CAPACITY);
        let pool = BufPool::new(
            &budget,
            &PoolConfig {
                credit_chunk: 1,
                acquire_timeout: Duration::from_millis(50),
                ..PoolConfig::default()
            },
        );
        let _held = pool.try_acquire().unwrap();
        let waited = monoio::time::Instant::now();
        let outcome = monoio::time::timeout(Duration::from_secs(10), pool.acquire())
            .await
            .expect("the pool's own deadline ends the wait");
        assert!(matches!(
            outcome,
            Err(konn_core::Error::BufferWaitTimeout(d)) if d == Duration::from_millis(50)
        ));
        assert!(waited.elapsed() >= Duration::from_millis(50));
        assert_eq!(
            pool.stats().exhausted,
            1,
            "a wait counts once, not per re-check"
        );
    });
}

#[test]
fn monoio_reads_fill_pooled_buffers_on_each_engine() {
    run_on_each_engine(|_engine| async {
        let (_budget, pool) = small_pool(8);
        let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let writer = monoio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let payload: Vec<u8> = (0..BUF_CAPACITY + 100).map(|i| i as u8).collect();
            let (res, _) = conn.write_all(payload).await;
            res.unwrap();
        });
        let mut conn = monoio::net::TcpStream::connect_addr(addr).await.unwrap();
        let mut received = Vec::new();
        let mut frames: Vec<Bytes> = Vec::new();
        while received.len() < BUF_CAPACITY + 100 {
            let buf = pool.try_acquire().unwrap();
            let (res, buf) = conn.read(buf).await;
            let n = res.unwrap();
            assert!(n > 0 && n <= BUF_CAPACITY);
            assert_eq!(buf.len(), n);
            let frame = buf.freeze();
            received.extend_from_slice(&frame);
            frames.push(frame);
        }
        writer.await;
        assert!(received.iter().enumerate().all(|(i, &b)| b == i as u8));
        let lent = frames.len();
        drop(frames);
        assert_eq!(pool.reclaim(), lent);
    });
}
