//! `konn-resume` in the router ↔ tunnel simulation (`konn_protocol::sim`):
//! the tunnel's connection is cut with packets in flight lost, both sides
//! park, the agent reconnects, and every echo must come back byte-exact
//! (the harness checks each byte against its pattern, in order, and its
//! table-and-credit invariants after every step); past the window
//! everything closes and returns to baseline. docs/design/resume.md.

use std::time::{Duration, Instant};

use konn_protocol::server::router::FrontendId;
use konn_protocol::sim::{DestKind, Op, Sim};
use proptest::prelude::*;

/// The simulated clock's origin: the only reading of the real clock.
fn epoch() -> Instant {
    #[allow(clippy::disallowed_methods)]
    Instant::now()
}

const WINDOW: Duration = Duration::from_secs(3);

/// gRPC and CONNECT frontends echoing `n` bytes each, in flight.
fn transfers(sim: &mut Sim, n: usize) -> Vec<FrontendId> {
    let mut fids: Vec<FrontendId> = (0..4).map(|_| sim.dial(DestKind::Echo, n)).collect();
    fids.extend((0..2).map(|_| sim.connect(DestKind::Echo, n)));
    sim.run_for(Duration::from_millis(20));
    sim.check().unwrap();
    fids
}

#[test]
fn a_cut_below_the_window_loses_nothing() {
    for flow_control in [true, false] {
        for lost_after in [0, 3] {
            let mut sim = Sim::with_resume(epoch(), flow_control, WINDOW);
            let n = 2 << 20;
            let fids = transfers(&mut sim, n);
            sim.apply(&Op::Cut(lost_after));
            assert!(sim.parked());
            sim.run_for(Duration::from_secs(1));
            sim.check().unwrap();
            assert!(
                fids.iter()
                    .all(|&f| sim.frontend(f).unwrap().close_rsp.is_none())
            );
            sim.apply(&Op::Reconnect);
            sim.run_until(Duration::from_secs(20), |s| {
                fids.iter().all(|&f| s.echoed_all(f, n))
            })
            .unwrap();
            sim.check().unwrap();
            sim.wind_down(&[]).unwrap();
        }
    }
}

#[test]
fn two_cuts_in_a_row_lose_nothing() {
    let mut sim = Sim::with_resume(epoch(), true, WINDOW);
    let n = 1 << 20;
    let fids = transfers(&mut sim, n);
    sim.apply(&Op::Cut(1));
    sim.apply(&Op::Reconnect);
    // Cut again in the middle of the replay.
    sim.run_for(Duration::from_millis(1));
    sim.apply(&Op::Cut(2));
    sim.run_for(Duration::from_millis(500));
    sim.apply(&Op::Reconnect);
    sim.run_until(Duration::from_secs(20), |s| {
        fids.iter().all(|&f| s.echoed_all(f, n))
    })
    .unwrap();
    sim.wind_down(&[]).unwrap();
}

#[test]
fn a_cut_past_the_window_closes_everything_cleanly() {
    let mut sim = Sim::with_resume(epoch(), true, WINDOW);
    let fids = transfers(&mut sim, 2 << 20);
    sim.apply(&Op::Cut(0));
    sim.run_for(WINDOW + Duration::from_millis(10));
    sim.check().unwrap();
    for &f in &fids {
        let fe = sim.frontend(f).unwrap();
        assert!(
            fe.close_rsp.is_some() || fe.gone,
            "frontend {f} closed: {fe:?}"
        );
    }
    assert_eq!(sim.tunnel().endpoints(), 0);
    // The agent's late reconnect finds nothing to resume: a new tunnel.
    sim.apply(&Op::Reconnect);
    sim.wind_down(&[]).unwrap();
}

fn op() -> impl Strategy<Value = Op> {
    let kind = prop_oneof![3 => Just(DestKind::Echo), 1 => Just(DestKind::Hang)];
    prop_oneof![
        3 => (kind.clone(), 0usize..(600 << 10)).prop_map(|(k, n)| Op::Dial(k, n)),
        1 => (kind, 0usize..(600 << 10)).prop_map(|(k, n)| Op::Connect(k, n)),
        1 => (0usize..8).prop_map(Op::Stall),
        1 => (0usize..8).prop_map(Op::Unstall),
        1 => (0usize..8).prop_map(Op::Deaf),
        1 => (0usize..8).prop_map(Op::Hear),
        1 => (0usize..8).prop_map(Op::Close),
        1 => (0usize..8).prop_map(Op::Gone),
        1 => (0usize..8).prop_map(Op::DestEof),
        2 => (0usize..6).prop_map(Op::Cut),
        2 => Just(Op::Reconnect),
        3 => (1u64..400).prop_map(Op::Wait),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Any mix of transfers, stalls, closes, EOFs and frontends going away
    /// with cuts (random packets in flight lost) and reconnects, some past
    /// the window: every echo stays byte-exact and in order, the
    /// invariants hold after every step, and everything ends at baseline.
    #[test]
    fn cuts_and_reconnects_end_clean(
        flow_control: bool,
        short_window: bool,
        ops in prop::collection::vec(op(), 1..24),
    ) {
        let window = if short_window { Duration::from_millis(300) } else { WINDOW };
        let r = konn_protocol::sim::run_resumable(epoch(), flow_control, window, &ops);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}
