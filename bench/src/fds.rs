//! This process's open file descriptors, for the leak checks of the
//! acceptance suites (counts back to baseline after each test).

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_descriptor_is_counted_and_named() {
        let before = open_fds();
        let f = std::fs::File::open("/proc/self/status").unwrap();
        assert_eq!(open_fds(), before + 1);
        assert!(fd_targets().iter().any(|t| t.ends_with("/status")));
        drop(f);
        assert_eq!(open_fds(), before);
    }
}
