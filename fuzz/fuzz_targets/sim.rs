//! Fuzz target `sim`: the router ↔ tunnel simulation
//! (`konn_protocol::sim`, the harness of `server/tests/sim.rs`) driven by a
//! scenario decoded from the input — gRPC and HTTP CONNECT dials to
//! destinations that echo, hang or refuse, data both ways, destinations
//! and frontends that stop and resume reading, CLOSE_REQ, DIAL_CLS, stray
//! DATA, destinations closing, frontends going away, PAUSE/RESUME out of
//! turn from either side, DRAIN, the tunnel dying and the agent
//! reconnecting, and time steps — with or without konn's flow-control
//! extension. The harness's table-and-credit invariants are checked after
//! every step (`Sim::check`), and after the wind-down everything must be
//! back at baseline (`Sim::clean`). Any broken invariant panics.
#![no_main]

use std::sync::OnceLock;
use std::time::Instant;

use arbitrary::Arbitrary;
use konn_protocol::sim::{self, DestKind, Op};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Kind {
    Echo,
    Hang,
    Refuse,
}

/// A scenario step (`sim::Op`, sizes bounded to keep runs short).
#[derive(Arbitrary, Debug)]
enum Step {
    Dial(Kind, u16),
    Connect(Kind, u16),
    Stall(u8),
    Unstall(u8),
    Deaf(u8),
    Hear(u8),
    Close(u8),
    DialCls(u8),
    StrayData(u8),
    Gone(u8),
    DestEof(u8),
    AgentSignal(u8, bool),
    ServerSignal(u8, bool),
    Drain,
    TunnelGone,
    /// Milliseconds, up to ~4 s.
    Wait(u16),
}

#[derive(Arbitrary, Debug)]
struct Scenario {
    flow_control: bool,
    steps: Vec<Step>,
}

fn kind(k: Kind) -> DestKind {
    match k {
        Kind::Echo => DestKind::Echo,
        Kind::Hang => DestKind::Hang,
        Kind::Refuse => DestKind::Refuse,
    }
}

impl Step {
    fn op(&self) -> Op {
        // Up to 64 × 16 KiB = 1 MiB per frontend.
        let bytes = |n: u16| usize::from(n) * 16;
        let i = usize::from;
        match *self {
            Self::Dial(k, n) => Op::Dial(kind(k), bytes(n)),
            Self::Connect(k, n) => Op::Connect(kind(k), bytes(n)),
            Self::Stall(f) => Op::Stall(i(f)),
            Self::Unstall(f) => Op::Unstall(i(f)),
            Self::Deaf(f) => Op::Deaf(i(f)),
            Self::Hear(f) => Op::Hear(i(f)),
            Self::Close(f) => Op::Close(i(f)),
            Self::DialCls(f) => Op::DialCls(i(f)),
            Self::StrayData(f) => Op::StrayData(i(f)),
            Self::Gone(f) => Op::Gone(i(f)),
            Self::DestEof(f) => Op::DestEof(i(f)),
            Self::AgentSignal(f, p) => Op::AgentSignal(i(f), p),
            Self::ServerSignal(f, p) => Op::ServerSignal(i(f), p),
            Self::Drain => Op::Drain,
            Self::TunnelGone => Op::TunnelGone,
            Self::Wait(ms) => Op::Wait(u64::from(ms % 4096)),
        }
    }
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fuzz_target!(|s: Scenario| {
    // Bound the work of one input (each step may run seconds of
    // simulated time).
    let ops: Vec<Op> = s.steps.iter().take(64).map(Step::op).collect();
    if let Err(e) = sim::run(epoch(), s.flow_control, &ops) {
        panic!("sim: {e}\nscenario: {ops:?}");
    }
});
