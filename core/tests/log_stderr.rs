//! Lines for stderr below WARNING are gathered for a few milliseconds
//! (`log::output`): none is lost, and the order of lines is kept — at exit
//! (`log::flush`), before a warning, before a panic's message, and while
//! the process just keeps running (the flusher thread). Each case runs in a
//! child process (this test binary again), because stderr and the global
//! subscriber are the process's.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use konn_core::log::{self, LogConfig, tracing};

const CHILD: &str = "KONN_TEST_LOG_CHILD";

/// Runs this binary's test `name` as a child in `mode`.
fn child(name: &str, mode: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("test binary"));
    c.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, mode)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

fn init() {
    log::init(&LogConfig::default(), "log-test").expect("logging");
}

/// The positions of `words` in `text`, which must all be there in order.
fn assert_in_order(text: &str, words: &[&str]) {
    let mut from = 0;
    for w in words {
        match text[from..].find(w) {
            Some(i) => from += i + w.len(),
            None => panic!("{w:?} missing or out of order in:\n{text}"),
        }
    }
}

#[test]
fn gathered_lines_keep_their_order_with_warnings_and_at_exit() {
    if std::env::var(CHILD).as_deref() == Ok("order") {
        init();
        tracing::info!("line-one");
        tracing::info!("line-two");
        tracing::warn!("line-three");
        tracing::info!("line-four");
        tracing::error!("line-five");
        tracing::info!("line-six");
        log::flush();
        std::process::exit(0);
    }
    let out = child(
        "gathered_lines_keep_their_order_with_warnings_and_at_exit",
        "order",
    )
    .output()
    .expect("run the child");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_in_order(
        &stderr,
        &[
            "line-one",
            "line-two",
            "line-three",
            "line-four",
            "line-five",
            "line-six",
        ],
    );
}

#[test]
fn gathered_lines_come_before_a_panic_message() {
    if std::env::var(CHILD).as_deref() == Ok("panic") {
        init();
        konn_core::app::abort_on_panic();
        tracing::info!("before-the-panic");
        panic!("the-panic");
    }
    let out = child("gathered_lines_come_before_a_panic_message", "panic")
        .output()
        .expect("run the child");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_in_order(&stderr, &["before-the-panic", "the-panic"]);
}

#[test]
fn a_gathered_line_is_written_while_the_process_runs_on() {
    if std::env::var(CHILD).as_deref() == Ok("idle") {
        init();
        tracing::info!("written-by-the-flusher");
        // No flush, no exit: only the flusher thread can write the line.
        // The parent kills this process once it has seen it.
        std::thread::sleep(Duration::from_secs(60));
        std::process::exit(0);
    }
    let mut c = child(
        "a_gathered_line_is_written_while_the_process_runs_on",
        "idle",
    )
    .spawn()
    .expect("run the child");
    let stderr = BufReader::new(c.stderr.take().expect("stderr"));
    let mut seen = false;
    for line in stderr.lines() {
        if line
            .expect("read stderr")
            .contains("written-by-the-flusher")
        {
            seen = true;
            break;
        }
    }
    let _ = c.kill();
    let _ = c.wait();
    assert!(seen, "the line was not written before the child ended");
}

/// The blocked-signal mask (`SigBlk`) of this process's thread `name`.
fn blocked_signals(name: &str) -> Option<u64> {
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).ok()?;
        let mask = status.lines().find_map(|l| l.strip_prefix("SigBlk:"))?;
        return u64::from_str_radix(mask.trim(), 16).ok();
    }
    None
}

#[test]
fn the_flusher_thread_blocks_every_signal() {
    // It starts with the first log line, before the server blocks SIGHUP
    // (with --clusters-config it reloads on it): a SIGHUP landing on the
    // flusher would end the process.
    if std::env::var(CHILD).as_deref() == Ok("signals") {
        init();
        tracing::info!("starts-the-flusher");
        let bit = |sig: i32| 1u64 << (sig - 1);
        let wanted =
            bit(libc::SIGHUP) | bit(libc::SIGINT) | bit(libc::SIGTERM) | bit(libc::SIGUSR1);
        let deadline = konn_core::io::clock::now() + Duration::from_secs(20);
        loop {
            let mask = blocked_signals("log-flush");
            if mask.is_some_and(|m| m & wanted == wanted) {
                break;
            }
            assert!(
                konn_core::io::clock::now() < deadline,
                "the flusher's blocked signals: {mask:x?}"
            );
            std::thread::yield_now();
        }
        log::flush();
        std::process::exit(0);
    }
    let out = child("the_flusher_thread_blocks_every_signal", "signals")
        .output()
        .expect("run the child");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
