//! proxy-server's state machines: the per-core [`router`] and the backend
//! [`backends`] directory with the proxy strategies.

pub mod backends;
pub mod limits;
pub mod router;
