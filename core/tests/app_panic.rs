//! `app::abort_on_panic`: a panic on any thread ends the whole process, in
//! debug builds too (the binaries install it first thing).

use std::os::unix::process::ExitStatusExt as _;
use std::process::Command;

const CHILD: &str = "KONN_TEST_PANIC_CHILD";

#[test]
fn a_panic_on_any_thread_ends_the_process() {
    if std::env::var_os(CHILD).is_some() {
        // The child: without the hook, the panicking thread ends alone,
        // `join` returns its error and the process exits 0.
        konn_core::app::abort_on_panic();
        let worker = std::thread::spawn(|| panic!("worker down"));
        let _ = worker.join();
        std::process::exit(0);
    }
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "a_panic_on_any_thread_ends_the_process",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .output()
        .expect("run the child");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "status {:?}, stderr:\n{stderr}",
        out.status
    );
    assert!(
        stderr.contains("worker down"),
        "the panic message is printed first:\n{stderr}"
    );
}
