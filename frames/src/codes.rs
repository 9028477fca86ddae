//! Wire status codes as *open* newtypes: HTTP/2 error codes ([`Reason`],
//! RFC 9113 §7) and gRPC status codes ([`GrpcStatus`]).
//!
//! Both are `u32` on the wire and peers may send values this crate does not
//! know; the newtypes keep them instead of failing. Known values have
//! associated constants and a name; unknown ones display as their number.

/// Defines an open `u32` newtype with named constants, `name()` and `Display`.
macro_rules! open_code {
    (
        $(#[$meta:meta])*
        $ty:ident { $( $(#[$cmeta:meta])* $name:ident = $val:expr, $text:literal; )* }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $ty(pub u32);

        impl $ty {
            $( $(#[$cmeta])* pub const $name: Self = Self($val); )*

            /// The code's name as used on the wire and in logs, or `None`
            /// for a value this crate does not know.
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $( $val => Some($text), )*
                    _ => None,
                }
            }
        }

        impl core::fmt::Debug for $ty {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                match self.name() {
                    Some(name) => f.write_str(name),
                    None => write!(f, "{}({:#x})", stringify!($ty), self.0),
                }
            }
        }

        impl core::fmt::Display for $ty {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                core::fmt::Debug::fmt(self, f)
            }
        }

        impl From<u32> for $ty {
            fn from(v: u32) -> Self {
                Self(v)
            }
        }

        impl From<$ty> for u32 {
            fn from(v: $ty) -> Self {
                v.0
            }
        }
    };
}

open_code! {
    /// HTTP/2 error code carried by RST_STREAM and GOAWAY (RFC 9113 §7).
    Reason {
        /// Graceful shutdown or no error.
        NO_ERROR = 0x0, "NO_ERROR";
        /// Protocol error detected.
        PROTOCOL_ERROR = 0x1, "PROTOCOL_ERROR";
        /// Implementation fault.
        INTERNAL_ERROR = 0x2, "INTERNAL_ERROR";
        /// Flow-control limits exceeded.
        FLOW_CONTROL_ERROR = 0x3, "FLOW_CONTROL_ERROR";
        /// SETTINGS not acknowledged in time.
        SETTINGS_TIMEOUT = 0x4, "SETTINGS_TIMEOUT";
        /// Frame received for a closed stream.
        STREAM_CLOSED = 0x5, "STREAM_CLOSED";
        /// Frame size incorrect.
        FRAME_SIZE_ERROR = 0x6, "FRAME_SIZE_ERROR";
        /// Stream not processed.
        REFUSED_STREAM = 0x7, "REFUSED_STREAM";
        /// Stream cancelled.
        CANCEL = 0x8, "CANCEL";
        /// Compression state not updated.
        COMPRESSION_ERROR = 0x9, "COMPRESSION_ERROR";
        /// TCP connection error for the CONNECT method.
        CONNECT_ERROR = 0xa, "CONNECT_ERROR";
        /// Processing capacity exceeded (the peer is abusive).
        ENHANCE_YOUR_CALM = 0xb, "ENHANCE_YOUR_CALM";
        /// Negotiated TLS parameters not acceptable.
        INADEQUATE_SECURITY = 0xc, "INADEQUATE_SECURITY";
        /// Use HTTP/1.1 for the request.
        HTTP_1_1_REQUIRED = 0xd, "HTTP_1_1_REQUIRED";
    }
}

open_code! {
    /// gRPC status code (the `grpc-status` trailer). Names are the ones grpc-go's
    /// `codes.Code.String()` returns, which upstream uses as metric label values.
    GrpcStatus {
        /// Success.
        OK = 0, "OK";
        /// The operation was cancelled, typically by the caller.
        CANCELLED = 1, "Canceled";
        /// Unknown error.
        UNKNOWN = 2, "Unknown";
        /// The client specified an invalid argument.
        INVALID_ARGUMENT = 3, "InvalidArgument";
        /// The deadline expired before the operation could complete.
        DEADLINE_EXCEEDED = 4, "DeadlineExceeded";
        /// A requested entity was not found.
        NOT_FOUND = 5, "NotFound";
        /// The entity that a client attempted to create already exists.
        ALREADY_EXISTS = 6, "AlreadyExists";
        /// The caller does not have permission.
        PERMISSION_DENIED = 7, "PermissionDenied";
        /// A resource has been exhausted (also: message larger than allowed).
        RESOURCE_EXHAUSTED = 8, "ResourceExhausted";
        /// The system is not in a state required for the operation.
        FAILED_PRECONDITION = 9, "FailedPrecondition";
        /// The operation was aborted.
        ABORTED = 10, "Aborted";
        /// The operation was attempted past the valid range.
        OUT_OF_RANGE = 11, "OutOfRange";
        /// The operation is not implemented or supported.
        UNIMPLEMENTED = 12, "Unimplemented";
        /// An internal invariant was broken (also: malformed message).
        INTERNAL = 13, "Internal";
        /// The service is currently unavailable.
        UNAVAILABLE = 14, "Unavailable";
        /// Unrecoverable data loss or corruption.
        DATA_LOSS = 15, "DataLoss";
        /// The request lacks valid authentication credentials.
        UNAUTHENTICATED = 16, "Unauthenticated";
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_and_unknown_codes_display() {
        assert_eq!(Reason::ENHANCE_YOUR_CALM.to_string(), "ENHANCE_YOUR_CALM");
        assert_eq!(Reason(0xff).to_string(), "Reason(0xff)");
        assert_eq!(Reason::from(0x9), Reason::COMPRESSION_ERROR);
        assert_eq!(GrpcStatus::UNAVAILABLE.name(), Some("Unavailable"));
        assert_eq!(GrpcStatus(17).name(), None);
        assert_eq!(u32::from(GrpcStatus::INTERNAL), 13);
    }
}
