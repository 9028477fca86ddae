//! konn-protocol's error type.
//!
//! [`Error`] is what the HTTP/2 and gRPC state machines report: a broken
//! rule in the peer's frames, the peer's GOAWAY, a keepalive that went
//! unanswered, or a call the application made that the connection cannot
//! honour now (a closed stream, no stream ids left). It carries no IO or
//! TLS causes — those belong to the drivers (`konn_core::Error` wraps this
//! enum as `Error::Protocol`).

use std::fmt;

/// Everything the protocol state machines fail with.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// We found a connection error in the peer's frames and sent GOAWAY
    /// with this code (`what` names the rule that was broken).
    H2Local {
        /// The GOAWAY error code.
        reason: konn_frames::Reason,
        /// The broken rule, e.g. "DATA on an idle stream".
        what: &'static str,
    },
    /// The peer closed the connection with GOAWAY carrying an error code.
    H2Remote {
        /// The peer's error code.
        reason: konn_frames::Reason,
    },
    /// The peer's bytes are not valid HTTP/2 or HPACK.
    Frame(konn_frames::Error),
    /// A keepalive PING was not acknowledged in time.
    KeepaliveTimeout,
    /// The transport under the connection is gone.
    ConnectionClosed,
    /// All client stream ids are used up; open a new connection.
    StreamIdsExhausted,
    /// The connection is shutting down (GOAWAY): no new streams.
    GoingAway,
    /// The peer's SETTINGS_MAX_CONCURRENT_STREAMS is reached.
    TooManyStreams,
    /// The stream is closed for sending, or unknown.
    StreamClosed(u32),
    /// The application used the connection API wrongly (a bug).
    Usage(&'static str),
    /// The resume protocol (`konn-resume`) was broken, by the peer (or a
    /// caller bug): the named rule. The connection it concerns is closed.
    Resume(&'static str),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::H2Local { reason, what } => write!(f, "HTTP/2 connection error {reason}: {what}"),
            Self::H2Remote { reason } => {
                write!(f, "HTTP/2 peer closed the connection with {reason}")
            }
            Self::Frame(e) => write!(f, "HTTP/2: {e}"),
            Self::KeepaliveTimeout => f.write_str("keepalive PING not acknowledged in time"),
            Self::ConnectionClosed => f.write_str("connection closed by the peer"),
            Self::StreamIdsExhausted => f.write_str("HTTP/2 stream ids exhausted"),
            Self::GoingAway => f.write_str("HTTP/2 connection is going away"),
            Self::TooManyStreams => f.write_str("peer's MAX_CONCURRENT_STREAMS reached"),
            Self::StreamClosed(id) => write!(f, "HTTP/2 stream {id} is closed"),
            Self::Usage(what) => write!(f, "HTTP/2 API misuse: {what}"),
            Self::Resume(what) => write!(f, "resume protocol violation: {what}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Frame(e) => Some(e),
            _ => None,
        }
    }
}

impl From<konn_frames::Error> for Error {
    fn from(e: konn_frames::Error) -> Self {
        Self::Frame(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_rule_and_the_code() {
        let e = Error::H2Local {
            reason: konn_frames::Reason::PROTOCOL_ERROR,
            what: "DATA on an idle stream",
        };
        assert_eq!(
            e.to_string(),
            "HTTP/2 connection error PROTOCOL_ERROR: DATA on an idle stream"
        );
        assert_eq!(
            Error::StreamClosed(3).to_string(),
            "HTTP/2 stream 3 is closed"
        );
    }
}
