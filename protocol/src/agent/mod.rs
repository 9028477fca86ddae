//! proxy-agent's state machines: one agent [`tunnel`] (its connection
//! table, dials and flow control) and the server set it keeps tunnels to
//! ([`sync`]).

pub mod sync;
pub mod tunnel;
