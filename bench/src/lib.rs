//! konn-bench: benchmarks of konn.
//!
//! - `benches/`: criterion micro-benchmarks of the wire codecs and of one
//!   gRPC stream (`cargo bench -p konn-bench`), reported in
//!   docs/BENCHMARKS.md.
//! - [`harness`]: the side-by-side harness behind `konn-bench compare`.
//! - `src/bin/konn-demo.rs`: the README's demo.
//!
//! The tools the demo, the harness and the test suites share (PKI, child
//! processes, destinations, frontend clients, the load balancer) are in
//! `konn-testkit` (`bench/testkit/`).

pub mod harness;
