//! Temporary files and directories of the suites, removed when dropped,
//! and a path that certainly does not exist.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A name no other call in this process, nor another process, uses.
fn unique(kind: &str, tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("konn-{kind}-{tag}-{}-{n}", std::process::id()))
}

/// A directory that exists for the test's lifetime.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A new empty directory whose name contains `tag`.
    pub fn new(tag: &str) -> Self {
        let p = unique("test", tag);
        std::fs::create_dir_all(&p).expect("create temp dir");
        Self(p)
    }

    /// The path of `name` inside the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A file that exists for the test's lifetime (for flags that check only
/// that their file exists).
pub struct TempFile(pub PathBuf);

impl TempFile {
    /// A new file whose name contains `tag`.
    pub fn new(tag: &str) -> Self {
        let mut path = unique("options", tag);
        path.set_extension("pem");
        std::fs::write(&path, "not read by validation\n").expect("write temp file");
        Self(path)
    }

    /// The path as a string (as a flag value).
    pub fn path(&self) -> &str {
        self.0.to_str().expect("utf-8 temp path")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A path that certainly does not exist (its directory does not either).
pub fn missing_path() -> String {
    std::env::temp_dir()
        .join(format!("konn-options-missing-{}", std::process::id()))
        .join("nope.pem")
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_things_exist_until_dropped() {
        let d = TempDir::new("files");
        let f = TempFile::new("files");
        let (dir, file) = (d.0.clone(), f.0.clone());
        assert!(dir.is_dir() && file.is_file());
        assert_ne!(TempDir::new("files").0, dir, "names are unique");
        drop((d, f));
        assert!(!dir.exists() && !file.exists());
        assert!(!std::path::Path::new(&missing_path()).exists());
    }
}
