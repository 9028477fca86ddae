//! Blocking socket reads that survive the process being frozen.
//!
//! A blocking `read` on a socket with a receive timeout (`SO_RCVTIMEO`,
//! which most tests set so that no wait is unbounded) fails with `EINTR`
//! when the process is stopped and resumed — `SIGSTOP`/`SIGCONT` or a
//! cgroup freezer, as CI machines do — even though no signal handler
//! ran (signal(7), "Interruption of system calls"). std's `read_exact`
//! retries that; a plain `read` hands it to the caller, where a test
//! would read it as the peer's failure. [`ReadRetry::read_retry`] is a
//! `read` that retries it.

use std::io::{self, Read};

/// [`Read::read`], retried while it is interrupted.
pub trait ReadRetry: Read {
    /// Reads as [`Read::read`] does, retrying [`io::ErrorKind::Interrupted`].
    fn read_retry(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                other => return other,
            }
        }
    }
}

impl<R: Read + ?Sized> ReadRetry for R {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails twice with `EINTR`, then reads.
    struct Flaky(u8);

    impl Read for Flaky {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.0 < 2 {
                self.0 += 1;
                return Err(io::ErrorKind::Interrupted.into());
            }
            buf[0] = 7;
            Ok(1)
        }
    }

    #[test]
    fn an_interrupted_read_is_retried_and_other_errors_are_not() {
        let mut b = [0u8; 1];
        assert_eq!(Flaky(0).read_retry(&mut b).unwrap(), 1);
        assert_eq!(b[0], 7);
        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::ErrorKind::ConnectionReset.into())
            }
        }
        let err = Broken.read_retry(&mut b).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
    }
}
