//! konn-bench: benchmarks of konn.
//!
//! - `benches/`: criterion micro-benchmarks of the wire codecs
//!   (`cargo bench -p konn-bench`), reported in docs/BENCHMARKS.md.
//! - later: the `konn-bench` side-by-side harness against upstream Go.
