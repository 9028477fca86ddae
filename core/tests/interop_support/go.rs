//! The Go side of the interop tests: building `interop/cmd/grpcpeer` once per
//! test process and running it as a child with a bounded lifetime.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The Go module with the peer program (`<repo>/interop`).
fn module_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("core/ has a parent")
        .join("interop")
}

/// The `go` command: the first `go` on `PATH`, else `/usr/local/go/bin/go`.
fn find_go() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("go"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let fallback = PathBuf::from("/usr/local/go/bin/go");
        fallback.is_file().then_some(fallback)
    })
}

/// Builds the peer (once per process) into the target directory and
/// returns its path.
///
/// # Panics
///
/// If Go is not installed or the build fails, with the reason.
pub fn grpcpeer() -> &'static Path {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BUILT.get_or_init(build) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

fn build() -> Result<PathBuf, String> {
    let go = find_go().ok_or(
        "the interop tests need the Go toolchain (go 1.26 or newer), but no `go` was found \
         on PATH or at /usr/local/go/bin/go; install Go to run them",
    )?;
    let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("interop")
        .join("grpcpeer");
    let output = Command::new(&go)
        .current_dir(module_dir())
        .args(["build", "-buildvcs=false", "-o"])
        .arg(&out)
        .arg("./cmd/grpcpeer")
        // Use the toolchain that is installed (never download another one)
        // and never rewrite go.mod / go.sum.
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=readonly")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {}: {e}", go.display()))?;
    if !output.status.success() {
        return Err(format!(
            "`go build ./cmd/grpcpeer` in {} failed ({}):\n{}",
            module_dir().display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(out)
}

/// A running grpcpeer, killed on drop if it is still running. Its stdout
/// and stderr go to files (no pipe can fill up and stall it).
pub struct GoPeer {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
    status: Option<ExitStatus>,
}

impl GoPeer {
    /// Starts `grpcpeer args…`, logging to `<dir>/<name>.{stdout,stderr}`.
    pub fn spawn(dir: &Path, name: &str, args: &[String]) -> Self {
        let stdout = dir.join(format!("{name}.stdout"));
        let stderr = dir.join(format!("{name}.stderr"));
        let child = Command::new(grpcpeer())
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("start grpcpeer");
        Self {
            child,
            stdout,
            stderr,
            status: None,
        }
    }

    /// What the peer printed so far.
    pub fn output(&self) -> String {
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        format!(
            "--- grpcpeer stdout ---\n{}--- grpcpeer stderr ---\n{}",
            read(&self.stdout),
            read(&self.stderr)
        )
    }

    /// The exit status, if the peer has exited.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
        }
        self.status
    }

    /// Waits (without blocking the runtime) up to `limit` for the peer to
    /// exit; kills it and panics with its output if it does not.
    pub async fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = konn_core::io::clock::now() + limit;
        loop {
            if let Some(s) = self.try_status() {
                return s;
            }
            if konn_core::io::clock::now() >= deadline {
                self.kill();
                panic!(
                    "grpcpeer still running after {limit:?}; killed it\n{}",
                    self.output()
                );
            }
            monoio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Resolves once the peer has exited (polls; for racing against other
    /// waits).
    pub async fn exited(&mut self) -> ExitStatus {
        loop {
            if let Some(s) = self.try_status() {
                return s;
            }
            monoio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits up to `limit` for the peer to exit and asserts it succeeded;
    /// returns its stdout.
    pub async fn expect_success(&mut self, limit: Duration) -> String {
        let status = self.wait(limit).await;
        assert!(
            status.success(),
            "grpcpeer failed: {status}\n{}",
            self.output()
        );
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// Waits up to `limit` for the peer to exit and asserts it failed with
    /// exit status 1 (a detected mismatch, not a crash or a timeout);
    /// returns its stderr.
    pub async fn expect_failure(&mut self, limit: Duration) -> String {
        let status = self.wait(limit).await;
        assert_eq!(
            status.code(),
            Some(1),
            "grpcpeer should have reported a failure: {status}\n{}",
            self.output()
        );
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn kill(&mut self) {
        if self.try_status().is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
    }
}

impl Drop for GoPeer {
    fn drop(&mut self) {
        self.kill();
    }
}
