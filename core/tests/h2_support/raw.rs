//! The raw-frame HTTP/2 client of the attack tests lives in konn-testkit
//! (`konn_testkit::h2raw`), shared with the server's listener tests.

// Not every test binary that includes `h2_support` uses it.
#[allow(unused_imports)]
pub use konn_testkit::h2raw::*;
