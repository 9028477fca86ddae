//! What proxy-server and proxy-agent share in their metrics, as upstream's
//! `konnectivity-client/pkg/common/metrics` package: the tunnel segments,
//! the `stream_packets_total` and `stream_errors_total` families, and their
//! label values.
//!
//! Label values follow Go exactly: segments are `from_client`, `to_client`,
//! `from_agent`, `to_agent`; packet types are the protobuf enum names
//! (`DIAL_REQ`, ..., `DRAIN`), plus `Unknown` in `stream_errors_total` for an
//! error without a packet; codes are grpc-go's `codes.Code.String()`
//! (`OK`, `Canceled`, ..., `Unauthenticated`). A status code outside 0–16
//! would read `Code(17)` in Go; konn counts it as `Unknown`, since only
//! broken peers send such codes and the fixed slots have no room for them.

use konn_frames::{GrpcStatus, packet::PacketType};

use super::{CounterId, CounterVec, RegistryBuilder};

/// HELP of `stream_packets_total`.
pub const STREAM_PACKETS_HELP: &str =
    "Count of packets processed, by segment and packet type (example: from_client, DIAL_REQ)";

/// HELP of `stream_errors_total`.
pub const STREAM_ERRORS_HELP: &str = "Count of gRPC stream errors, by segment, grpc Code, packet type. (example: from_agent, Code.Unavailable, DIAL_RSP)";

/// One of the four tunnel segments a packet travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Segment {
    /// From the frontend (kube-apiserver) to the server.
    FromClient = 0,
    /// From the server to the frontend.
    ToClient = 1,
    /// From the agent to the server.
    FromAgent = 2,
    /// From the server to the agent.
    ToAgent = 3,
}

impl Segment {
    /// Every segment, in label-slot order.
    pub const ALL: [Self; 4] = [
        Self::FromClient,
        Self::ToClient,
        Self::FromAgent,
        Self::ToAgent,
    ];

    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::FromClient => "from_client",
            Self::ToClient => "to_client",
            Self::FromAgent => "from_agent",
            Self::ToAgent => "to_agent",
        }
    }
}

/// `segment` label values in slot order.
pub const SEGMENT_VALUES: [&str; 4] = [
    Segment::FromClient.as_str(),
    Segment::ToClient.as_str(),
    Segment::FromAgent.as_str(),
    Segment::ToAgent.as_str(),
];

/// `packet_type` values of `stream_packets_total`, in wire-value order.
pub const PACKET_TYPE_VALUES: [&str; 7] = [
    PacketType::DialReq.name(),
    PacketType::DialRsp.name(),
    PacketType::CloseReq.name(),
    PacketType::CloseRsp.name(),
    PacketType::Data.name(),
    PacketType::DialCls.name(),
    PacketType::Drain.name(),
];

/// `packet_type` values of `stream_errors_total`: the packet types, then
/// `Unknown` for errors without a packet.
pub const PACKET_TYPE_OR_UNKNOWN_VALUES: [&str; 8] = [
    PacketType::DialReq.name(),
    PacketType::DialRsp.name(),
    PacketType::CloseReq.name(),
    PacketType::CloseRsp.name(),
    PacketType::Data.name(),
    PacketType::DialCls.name(),
    PacketType::Drain.name(),
    "Unknown",
];

/// `code` label values: grpc-go's names of codes 0 to 16.
pub const CODE_VALUES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

/// Slot of a status code in [`CODE_VALUES`]; codes above 16 count as
/// `Unknown`.
pub fn code_slot(code: GrpcStatus) -> usize {
    let code = code.0 as usize;
    if code < CODE_VALUES.len() {
        code
    } else {
        GrpcStatus::UNKNOWN.0 as usize
    }
}

/// The two stream families of one binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamFamilies {
    packets: CounterVec,
    errors: CounterVec,
}

impl StreamFamilies {
    /// Registers `stream_packets_total` and `stream_errors_total` under the
    /// given full names (with the binary's prefix).
    pub fn register(
        builder: &mut RegistryBuilder,
        packets_name: &'static str,
        errors_name: &'static str,
    ) -> Self {
        let packets = builder.counter_vec(
            packets_name,
            STREAM_PACKETS_HELP,
            &["segment", "packet_type"],
            &[&SEGMENT_VALUES, &PACKET_TYPE_VALUES],
        );
        let errors = builder.counter_vec(
            errors_name,
            STREAM_ERRORS_HELP,
            &["segment", "code", "packet_type"],
            &[
                &SEGMENT_VALUES,
                &CODE_VALUES,
                &PACKET_TYPE_OR_UNKNOWN_VALUES,
            ],
        );
        Self { packets, errors }
    }

    /// The `stream_packets_total` series for a packet seen on `segment`.
    #[inline]
    pub fn packets(&self, segment: Segment, ty: PacketType) -> CounterId {
        self.packets.series(&[segment as usize, ty as usize])
    }

    /// The `stream_errors_total` series for an error with status `code` on
    /// `segment`, while handling a packet of type `ty` (`None`: no packet,
    /// label `Unknown`).
    #[inline]
    pub fn errors(&self, segment: Segment, code: GrpcStatus, ty: Option<PacketType>) -> CounterId {
        let ty = ty.map_or(PacketType::ALL.len(), |t| t as usize);
        self.errors.series(&[segment as usize, code_slot(code), ty])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_names_match_konn_frames() {
        for (i, name) in CODE_VALUES.iter().enumerate() {
            assert_eq!(GrpcStatus(i as u32).name(), Some(*name));
        }
        assert_eq!(code_slot(GrpcStatus(99)), 2);
        assert_eq!(code_slot(GrpcStatus::UNAUTHENTICATED), 16);
    }

    #[test]
    fn slots_follow_the_enums() {
        for ty in PacketType::ALL {
            assert_eq!(PACKET_TYPE_VALUES[ty as usize], ty.name());
        }
        for seg in Segment::ALL {
            assert_eq!(SEGMENT_VALUES[seg as usize], seg.as_str());
        }
    }
}
