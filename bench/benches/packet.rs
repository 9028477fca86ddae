//! Placeholder until the codec lands.
fn main() {}
