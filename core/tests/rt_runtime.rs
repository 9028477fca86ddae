//! Worker runtime: start, engine, pinning, stop, join, panics, test helpers.

use std::{
    sync::{Arc, mpsc},
    time::Duration,
};

use konn_core::{
    Error,
    io::runtime::{
        Engine, IoEngine, RuntimeConfig, Stopper, Workers, allowed_cpus, available_engines,
        block_on, current_engine, run_on_each_engine, yield_now,
    },
};
use monoio::io::{AsyncReadRentExt, AsyncWriteRentExt};

const WAIT: Duration = Duration::from_secs(20);

fn config(workers: usize, engine: Engine) -> RuntimeConfig {
    RuntimeConfig {
        workers,
        engine: match engine {
            Engine::IoUring => IoEngine::IoUring,
            Engine::Epoll => IoEngine::Epoll,
        },
        ..RuntimeConfig::default()
    }
}

#[test]
fn workers_run_on_the_requested_engine_and_stop() {
    for engine in available_engines() {
        let (tx, rx) = mpsc::channel();
        let workers = Workers::<()>::start(config(2, engine), move |ctx| {
            let tx = tx.clone();
            async move {
                let name = std::thread::current().name().map(str::to_owned);
                tx.send((ctx.index(), ctx.engine(), current_engine(), name))
                    .unwrap();
                ctx.stop_token().stopped().await;
            }
        })
        .unwrap();
        assert_eq!(workers.engine().engine(), engine);
        assert_eq!(workers.len(), 2);
        let mut seen: Vec<_> = (0..2).map(|_| rx.recv_timeout(WAIT).unwrap()).collect();
        seen.sort_by_key(|s| s.0);
        for (index, (worker, ctx_engine, thread_engine, name)) in seen.into_iter().enumerate() {
            assert_eq!(worker, index);
            assert_eq!(ctx_engine, engine);
            assert_eq!(thread_engine, Some(engine));
            assert_eq!(
                name.as_deref(),
                Some(format!("konn-worker-{index}").as_str())
            );
        }
        workers.stop();
        workers.join().unwrap();
    }
}

#[test]
fn auto_picks_io_uring_when_available() {
    let workers = Workers::<()>::start(
        RuntimeConfig {
            workers: 1,
            ..RuntimeConfig::default()
        },
        |ctx| async move { ctx.stop_token().stopped().await },
    )
    .unwrap();
    let expected = available_engines()[0];
    assert_eq!(workers.engine().engine(), expected);
    assert_eq!(workers.engine().requested(), IoEngine::Auto);
    assert_eq!(
        workers.engine().fallback_reason().is_some(),
        expected == Engine::Epoll
    );
    workers.stop();
    workers.join().unwrap();
}

#[test]
fn invalid_config_is_rejected_before_starting() {
    let err = Workers::<()>::start(
        RuntimeConfig {
            workers: 0,
            ..RuntimeConfig::default()
        },
        |_ctx| async {},
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
}

#[test]
fn pinned_workers_each_get_one_allowed_cpu() {
    let allowed = allowed_cpus().unwrap();
    assert!(!allowed.is_empty());
    let (tx, rx) = mpsc::channel();
    let workers = Workers::<()>::start(
        RuntimeConfig {
            workers: 2,
            pin_cores: true,
            engine: IoEngine::Epoll,
            ..RuntimeConfig::default()
        },
        move |ctx| {
            let tx = tx.clone();
            async move {
                tx.send((ctx.index(), allowed_cpus().unwrap())).unwrap();
                ctx.stop_token().stopped().await;
            }
        },
    )
    .unwrap();
    for _ in 0..2 {
        let (index, cpus) = rx.recv_timeout(WAIT).unwrap();
        assert_eq!(cpus, vec![allowed[index % allowed.len()]], "worker {index}");
    }
    workers.stop();
    workers.join().unwrap();
}

#[test]
fn a_panicking_worker_is_reported_by_join() {
    let workers = Workers::<()>::start(config(2, Engine::Epoll), |ctx| async move {
        if ctx.index() == 1 {
            panic!("worker 1 fails on purpose");
        }
        ctx.stop_token().stopped().await;
    })
    .unwrap();
    workers.stop();
    let err = workers.join().unwrap_err();
    assert!(matches!(err, Error::WorkerPanicked { worker: 1 }), "{err}");
}

#[test]
fn workers_that_return_early_are_joined_cleanly() {
    // No stop at all: the futures just finish; the worker must still retire
    // its watcher and maintenance tasks and exit.
    let workers = Workers::<()>::start(config(2, Engine::Epoll), |_ctx| async {}).unwrap();
    workers.join().unwrap();
}

#[test]
fn stop_wakes_every_local_waiter_from_another_thread() {
    run_on_each_engine(|_engine| async {
        let stopper = Stopper::new();
        let token = stopper.token();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let token = token.clone();
                monoio::spawn(async move { token.stopped().await })
            })
            .collect();
        // Let every waiter register before the stop comes in.
        for _ in 0..3 {
            yield_now().await;
        }
        assert!(!token.is_stopped());
        let remote = stopper.clone();
        let thread = std::thread::spawn(move || remote.stop());
        for waiter in waiters {
            monoio::time::timeout(WAIT, waiter)
                .await
                .expect("waiter woken");
        }
        thread.join().unwrap();
        assert!(token.is_stopped());
        // A token made after the stop is stopped at once.
        let late = stopper.token();
        late.stopped().await;
        token.close().await;
        late.close().await;
    });
}

#[test]
fn close_retires_a_token_without_a_stop() {
    run_on_each_engine(|_engine| async {
        let stopper = Stopper::new();
        let token = stopper.token();
        let waiter = {
            let token = token.clone();
            monoio::spawn(async move { token.stopped().await })
        };
        yield_now().await;
        token.close().await;
        monoio::time::timeout(WAIT, waiter)
            .await
            .expect("closed token fires");
        assert!(!stopper.is_stopped(), "close is local to this thread");
        // A stop after close reaches nothing of this thread and is harmless.
        stopper.stop();
    });
}

#[test]
fn block_on_runs_tcp_echo_on_each_engine() {
    let engines = run_on_each_engine(|engine| async move {
        assert_eq!(current_engine(), Some(engine));
        let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = monoio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let (res, buf) = conn.read_exact(vec![0u8; 5]).await;
            res.unwrap();
            let (res, _) = conn.write_all(buf).await;
            res.unwrap();
        });
        let mut client = monoio::net::TcpStream::connect_addr(addr).await.unwrap();
        let (res, _) = client.write_all(b"hello".to_vec()).await;
        res.unwrap();
        let (res, echoed) = client.read_exact(vec![0u8; 5]).await;
        res.unwrap();
        assert_eq!(&echoed, b"hello");
        server.await;
        monoio::time::sleep(Duration::from_millis(1)).await;
    });
    assert!(engines.contains(&Engine::Epoll));
}

#[test]
fn block_on_reports_the_engine_it_ran() {
    let out = block_on(Engine::Epoll, async { current_engine() }).unwrap();
    assert_eq!(out, Some(Engine::Epoll));
    let shared = Arc::new(());
    let clone = Arc::clone(&shared);
    block_on(Engine::Epoll, async move { drop(clone) }).unwrap();
    assert_eq!(Arc::strong_count(&shared), 1, "the future is dropped");
}
