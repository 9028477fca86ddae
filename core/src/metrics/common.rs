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

/// konn's metrics of the reverse direction (KEP-2025, node network →
/// control plane), registered by both binaries under the same names, each
/// counting its own side: `konn_reverse_dials_total{result}`,
/// `konn_reverse_refusals_total{reason}`, `konn_reverse_connections` and
/// `konn_reverse_bytes_total{direction}`. Not upstream's (upstream has no
/// reverse direction), hence the `konn_` prefix.
#[derive(Debug, Clone, Copy)]
pub struct ReverseFamilies {
    dials: CounterVec,
    refusals: CounterVec,
    connections: super::GaugeVec,
    bytes: CounterVec,
}

/// The outcome of a reverse dial (`result` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReverseResult {
    /// The destination answered: the connection is open.
    Ok = 0,
    /// Refused or failed (the reason is counted on the side that knows it).
    Refused = 1,
}

/// Which way reverse-direction bytes went (`direction` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReverseDirection {
    /// From the node network to the control plane.
    ToControlPlane = 0,
    /// From the control plane to the node network.
    ToNode = 1,
}

const REVERSE_RESULTS: [&str; 2] = ["ok", "refused"];
const REVERSE_DIRECTIONS: [&str; 2] = ["to_control_plane", "to_node"];

impl ReverseFamilies {
    /// Registers the families; `reasons` are the refusal labels this side
    /// can count.
    pub fn register(builder: &mut RegistryBuilder, reasons: &[&str]) -> Self {
        Self {
            dials: builder.counter_vec(
                "konn_reverse_dials_total",
                "Reverse-direction (node network to control plane) dials, by result.",
                &["result"],
                &[&REVERSE_RESULTS],
            ),
            refusals: builder.counter_vec(
                "konn_reverse_refusals_total",
                "Reverse-direction dials refused or failed, by reason (the peer only ever sees one generic error).",
                &["reason"],
                &[reasons],
            ),
            connections: builder.gauge(
                "konn_reverse_connections",
                "Open reverse-direction connections.",
            ),
            bytes: builder.counter_vec(
                "konn_reverse_bytes_total",
                "Bytes carried by reverse-direction connections, by direction.",
                &["direction"],
                &[&REVERSE_DIRECTIONS],
            ),
        }
    }

    /// `konn_reverse_dials_total{result}`.
    pub fn dials(&self, result: ReverseResult) -> CounterId {
        self.dials.series(&[result as usize])
    }

    /// `konn_reverse_refusals_total{reason}`: `reason` indexes the labels
    /// given to [`ReverseFamilies::register`].
    pub fn refusals(&self, reason: usize) -> CounterId {
        self.refusals.series(&[reason])
    }

    /// `konn_reverse_connections`.
    pub fn connections(&self) -> super::GaugeId {
        self.connections.series(&[])
    }

    /// `konn_reverse_bytes_total{direction}`.
    pub fn bytes(&self, direction: ReverseDirection) -> CounterId {
        self.bytes.series(&[direction as usize])
    }
}

/// The resumable-tunnel families (`konn-resume`, docs/design/resume.md),
/// with the same names on proxy-server and proxy-agent:
/// `konn_resumes_total{result}` counts every parked tunnel's outcome
/// once, `konn_resume_parked_tunnels` and
/// `konn_resume_parked_connections` are what waits now. Updated per
/// tunnel event, never per packet.
#[derive(Debug, Clone, Copy)]
pub struct ResumeFamilies {
    resumes: CounterVec,
    parked_tunnels: super::GaugeVec,
    parked_connections: super::GaugeVec,
}

/// How a parked tunnel ended (`result` of `konn_resumes_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeResult {
    /// The agent reconnected and presented its token: resumed.
    Resumed = 0,
    /// The window ended first: its connections closed.
    Expired = 1,
    /// The resume was refused (agent: the server answered without
    /// `konn-resumed`, e.g. it restarted; server: a token for another
    /// agent or identity) and its connections closed.
    Refused = 2,
    /// Closed before its window ended to make room (the server's table of
    /// parked tunnels was full, or the process stops).
    Evicted = 3,
}

const RESUME_RESULTS: [&str; 4] = ["resumed", "expired", "refused", "evicted"];

impl ResumeFamilies {
    /// Registers the families.
    pub fn register(builder: &mut RegistryBuilder) -> Self {
        Self {
            resumes: builder.counter_vec(
                "konn_resumes_total",
                "Tunnels parked after their connection broke (konn-resume), by how their parking ended: resumed, expired (--resume-window passed), refused, evicted.",
                &["result"],
                &[&RESUME_RESULTS],
            ),
            parked_tunnels: builder.gauge(
                "konn_resume_parked_tunnels",
                "Broken tunnels waiting for the agent to resume them.",
            ),
            parked_connections: builder.gauge(
                "konn_resume_parked_connections",
                "Proxied connections of parked tunnels, kept open for a resume.",
            ),
        }
    }

    /// `konn_resumes_total{result}`.
    pub fn resumes(&self, result: ResumeResult) -> CounterId {
        self.resumes.series(&[result as usize])
    }

    /// `konn_resume_parked_tunnels`.
    pub fn parked_tunnels(&self) -> super::GaugeId {
        self.parked_tunnels.series(&[])
    }

    /// `konn_resume_parked_connections`.
    pub fn parked_connections(&self) -> super::GaugeId {
        self.parked_connections.series(&[])
    }
}

/// Most agents the per-agent connection families keep series for; the
/// others are counted under `agent_id="other"`.
pub const AGENT_SERIES_LIMIT: usize = 10_000;

/// Upper bounds of `konn_connection_duration_seconds`: 10 ms to 4 h.
pub const CONNECTION_DURATION_BUCKETS: [f64; 10] = [
    0.01, 0.1, 1.0, 10.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0,
];

/// The byte and duration accounting of tunnelled connections (issue 17),
/// with the same names on proxy-server and proxy-agent:
/// `konn_connection_bytes_total{agent_id,direction}` (`to_destination`,
/// `from_destination`), `konn_connection_duration_seconds{agent_id}`,
/// `konn_connections_ended_total{result,reason}` and, opted in with a cap,
/// `konn_destination_bytes_total{destination,direction}`. Counted once per
/// connection, when it ends (never per packet); the live counts of open
/// connections are on `/debug/connections`.
#[derive(Debug, Clone, Copy)]
pub struct ConnFamilies {
    bytes: super::DynamicCounterVec,
    duration: super::DynamicHistogramVec,
    ended: super::DynamicCounterVec,
    destination_bytes: super::DynamicCounterVec,
}

/// One connection's end, as [`ConnFamilies::record`] counts it.
#[derive(Debug, Clone, Copy)]
pub struct ConnEnd<'a> {
    /// The agent it went through.
    pub agent_id: &'a str,
    /// `closed`, `refused`, `failed`, `cancelled`.
    pub result: &'a str,
    /// Why, in a word (`""` for an ordinary close).
    pub reason: &'a str,
    /// Payload bytes towards the destination.
    pub to_destination: u64,
    /// Payload bytes from the destination.
    pub from_destination: u64,
    /// How long it lived.
    pub duration: std::time::Duration,
    /// Its destination (counted only with a per-destination limit).
    pub destination: &'a str,
}

const OTHER: &str = "other";

impl ConnFamilies {
    /// Registers the families (per-destination series off until
    /// [`ConnFamilies::record`] is given a limit).
    pub fn register(b: &mut RegistryBuilder) -> Self {
        let destination_bytes = b.dynamic_counter_vec_limit(
            "konn_destination_bytes_total",
            "Payload bytes of tunnelled connections by destination (host:port) and direction (to_destination, from_destination), counted when a connection ends; only with --metrics-per-destination-limit, destinations beyond the limit under destination=\"other\".",
            &["destination", "direction"],
            0,
        );
        Self {
            bytes: b.dynamic_counter_vec_limit(
                "konn_connection_bytes_total",
                "Payload bytes of tunnelled connections by agent and direction (to_destination, from_destination), counted when a connection ends.",
                &["agent_id", "direction"],
                2 * AGENT_SERIES_LIMIT,
            ),
            duration: b.dynamic_histogram_vec_limit(
                "konn_connection_duration_seconds",
                "Lifetime of tunnelled connections (from the dial to the close), by agent.",
                &CONNECTION_DURATION_BUCKETS,
                &["agent_id"],
                AGENT_SERIES_LIMIT,
            ),
            ended: b.dynamic_counter_vec(
                "konn_connections_ended_total",
                "Tunnelled connections and dials that ended, by result (closed, refused, failed, cancelled) and reason (empty for an ordinary close).",
                &["result", "reason"],
            ),
            destination_bytes,
        }
    }

    /// Count one connection's end; `destination_limit`: destinations with
    /// their own `konn_destination_bytes_total` series (0: none; the
    /// others go under `destination="other"`).
    pub fn record(&self, r: &super::Registry, e: &ConnEnd<'_>, destination_limit: usize) {
        let per_destination = destination_limit > 0;
        if per_destination {
            // Two directions per destination (the overflow pair beyond).
            r.set_dynamic_counter_limit(self.destination_bytes, 2 * destination_limit);
        }
        let dirs = [
            ("to_destination", e.to_destination),
            ("from_destination", e.from_destination),
        ];
        r.dynamic_counter_add(self.ended, &[e.result, e.reason], 1);
        if !e.agent_id.is_empty() {
            for (dir, n) in dirs {
                r.dynamic_counter_add_or(self.bytes, &[e.agent_id, dir], Some(&[OTHER, dir]), n);
            }
            r.dynamic_histogram_observe_or(
                self.duration,
                &[e.agent_id],
                Some(&[OTHER]),
                e.duration.as_secs_f64(),
            );
        }
        for (dir, n) in dirs {
            if per_destination && n > 0 {
                r.dynamic_counter_add_or(
                    self.destination_bytes,
                    &[e.destination, dir],
                    Some(&[OTHER, dir]),
                    n,
                );
            }
        }
    }

    /// An agent left: its series go (counters restart if it comes back).
    pub fn forget_agent(&self, r: &super::Registry, agent_id: &str) {
        r.dynamic_counter_remove(self.bytes, 0, agent_id);
        r.dynamic_histogram_remove(self.duration, 0, agent_id);
    }
}
