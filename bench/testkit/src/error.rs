//! The crate's error type.

use std::path::PathBuf;

/// What went wrong in a tool of this crate.
#[derive(Debug)]
pub enum Error {
    /// Certificate generation failed.
    Generate(rcgen::Error),
    /// A file could not be written.
    Write(PathBuf, std::io::Error),
    /// Connecting or the HTTP/2 connection failed.
    Io(konn_core::Error),
    /// The server answered the dial with an error (`DIAL_RSP.error`).
    DialFailed(String),
    /// The call ended (gRPC status message) or the server closed it.
    Closed(String),
    /// The server sent something out of order.
    Protocol(String),
    /// No answer within the deadline.
    Timeout(&'static str),
    /// A socket operation of a plain client (HTTP CONNECT) failed.
    Socket(String),
    /// An HTTP CONNECT proxy answered with another status than 200: the
    /// status and the whole answer (head and body, up to the close).
    Refused {
        /// The HTTP status code.
        status: u16,
        /// The raw answer.
        response: String,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Generate(e) => write!(f, "generating certificates: {e}"),
            Self::Write(p, e) => write!(f, "writing {}: {e}", p.display()),
            Self::Io(e) => write!(f, "connection: {e}"),
            Self::DialFailed(e) => write!(f, "dial failed: {e}"),
            Self::Closed(e) => write!(f, "tunnel closed: {e}"),
            Self::Protocol(e) => write!(f, "protocol error: {e}"),
            Self::Timeout(what) => write!(f, "timed out waiting for {what}"),
            Self::Socket(e) => write!(f, "connection: {e}"),
            Self::Refused { status, response } => {
                write!(f, "proxy answered {status}: {response:?}")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Generate(e) => Some(e),
            Self::Write(_, e) => Some(e),
            Self::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<rcgen::Error> for Error {
    fn from(e: rcgen::Error) -> Self {
        Self::Generate(e)
    }
}

impl From<konn_core::Error> for Error {
    fn from(e: konn_core::Error) -> Self {
        Self::Io(e)
    }
}

impl From<konn_protocol::Error> for Error {
    fn from(e: konn_protocol::Error) -> Self {
        Self::Io(e.into())
    }
}
