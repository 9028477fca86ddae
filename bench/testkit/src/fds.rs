//! This process's open file descriptors, for the leak checks of the
//! suites (counts back to baseline after each test): the count, what each
//! points at, the lock that keeps counting tests apart, and the check.

/// How many descriptors this process has open.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

/// What each open descriptor points at (`3->socket:[1234]`), sorted: the
/// message of a failed leak check.
pub fn fd_targets() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| {
                    let target = std::fs::read_link(e.path()).unwrap_or_default();
                    format!("{}->{}", e.file_name().to_string_lossy(), target.display())
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Serialises the tests of one test binary that count descriptors (counts
/// are per process).
#[allow(clippy::disallowed_types)] // test-only serialisation
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds the descriptor-counting lock (a failed test must not poison the
/// others).
#[allow(clippy::disallowed_types)]
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Waits until the process has at most `limit` descriptors open (sockets
/// of other threads close asynchronously), or panics after
/// [`WAIT`](crate::wait::WAIT) naming every open descriptor.
pub fn assert_fds_back_to(limit: usize, what: &str) {
    let ok = crate::wait::wait_until(crate::wait::WAIT, || open_fds() <= limit);
    assert!(
        ok,
        "{what}: {} descriptors open, expected at most {limit}: {:?}",
        open_fds(),
        fd_targets()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_descriptor_is_counted_and_named() {
        let _serial = serial();
        let before = open_fds();
        let f = std::fs::File::open("/proc/self/status").unwrap();
        assert_eq!(open_fds(), before + 1);
        assert!(fd_targets().iter().any(|t| t.ends_with("/status")));
        drop(f);
        assert_fds_back_to(before, "closed file");
    }
}
