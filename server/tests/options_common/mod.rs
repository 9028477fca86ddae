//! Helpers shared by the options tests: temporary files and parsing.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A file that exists for the test's lifetime.
pub struct TempFile(pub PathBuf);

impl TempFile {
    pub fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("konn-options-{tag}-{}-{n}.pem", std::process::id()));
        std::fs::write(&path, "not read by validation\n").expect("write temp file");
        Self(path)
    }

    pub fn path(&self) -> &str {
        self.0.to_str().expect("utf-8 temp path")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A path that certainly does not exist.
pub fn missing_path() -> String {
    std::env::temp_dir()
        .join(format!("konn-options-missing-{}", std::process::id()))
        .join("nope.pem")
        .to_string_lossy()
        .into_owned()
}
