//! What the driver runs: a sans-IO [`Session`] (an HTTP/2 connection, or a
//! gRPC session over one) and the application's [`Handler`] of its events.

use std::time::Instant;

use bytes::BytesMut;
use konn_protocol::grpc::Grpc;
use konn_protocol::h2::{Connection, Payloads};

use crate::Error;

/// A sans-IO connection the driver can run.
pub trait Session {
    /// What the session reports to its [`Handler`].
    type Event;
    /// Feed received plaintext.
    fn handle_input(&mut self, now: Instant, input: &mut BytesMut) -> Result<(), Error>;
    /// Produce output.
    fn poll_transmit(&mut self, now: Instant, out: &mut BytesMut, max: usize) -> usize;
    /// Produce output, large DATA payloads by reference (see
    /// `konn_protocol::h2::Connection::poll_transmit_vectored`).
    fn poll_transmit_vectored(
        &mut self,
        now: Instant,
        out: &mut BytesMut,
        payloads: &mut Payloads,
        max: usize,
    ) -> usize;
    /// Run timers.
    fn handle_timeout(&mut self, now: Instant);
    /// The next event.
    fn poll_event(&mut self) -> Option<Self::Event>;
    /// The socket is gone.
    fn connection_lost(&mut self);
    /// The HTTP/2 connection underneath.
    fn h2(&self) -> &Connection;
    /// The HTTP/2 connection underneath, mutably.
    fn h2_mut(&mut self) -> &mut Connection;
    /// Events are waiting for [`Session::poll_event`].
    fn has_events(&self) -> bool;
    /// The connection has been idle a while: give back memory held for
    /// bursts (empty queues' capacity, scratch buffers).
    fn release_idle(&mut self);
    /// An inert value left behind when the real session is moved out of a
    /// detached connection.
    fn placeholder() -> Self
    where
        Self: Sized;
}

impl Session for Grpc {
    type Event = konn_protocol::grpc::GrpcEvent;
    fn handle_input(&mut self, now: Instant, input: &mut BytesMut) -> Result<(), Error> {
        Self::handle_input(self, now, input).map_err(Error::from)
    }
    fn poll_transmit(&mut self, now: Instant, out: &mut BytesMut, max: usize) -> usize {
        Self::poll_transmit(self, now, out, max)
    }
    fn poll_transmit_vectored(
        &mut self,
        now: Instant,
        out: &mut BytesMut,
        payloads: &mut Payloads,
        max: usize,
    ) -> usize {
        Self::poll_transmit_vectored(self, now, out, payloads, max)
    }
    fn handle_timeout(&mut self, now: Instant) {
        Self::handle_timeout(self, now);
    }
    fn poll_event(&mut self) -> Option<Self::Event> {
        Self::poll_event(self)
    }
    fn connection_lost(&mut self) {
        Self::connection_lost(self);
    }
    fn h2(&self) -> &Connection {
        self.conn()
    }
    fn h2_mut(&mut self) -> &mut Connection {
        self.conn_mut()
    }
    fn has_events(&self) -> bool {
        Self::has_events(self)
    }
    fn release_idle(&mut self) {
        Self::release_idle(self);
    }
    fn placeholder() -> Self {
        Self::new(<Connection as Session>::placeholder(), 0)
    }
}

impl Session for Connection {
    type Event = konn_protocol::h2::Event;
    fn handle_input(&mut self, now: Instant, input: &mut BytesMut) -> Result<(), Error> {
        Self::handle_input(self, now, input).map_err(Error::from)
    }
    fn poll_transmit(&mut self, now: Instant, out: &mut BytesMut, max: usize) -> usize {
        Self::poll_transmit(self, now, out, max)
    }
    fn poll_transmit_vectored(
        &mut self,
        now: Instant,
        out: &mut BytesMut,
        payloads: &mut Payloads,
        max: usize,
    ) -> usize {
        Self::poll_transmit_vectored(self, now, out, payloads, max)
    }
    fn handle_timeout(&mut self, now: Instant) {
        Self::handle_timeout(self, now);
    }
    fn poll_event(&mut self) -> Option<Self::Event> {
        Self::poll_event(self)
    }
    fn connection_lost(&mut self) {
        Self::connection_lost(self);
    }
    fn h2(&self) -> &Connection {
        self
    }
    fn h2_mut(&mut self) -> &mut Connection {
        self
    }
    fn has_events(&self) -> bool {
        Self::has_events(self)
    }
    fn release_idle(&mut self) {
        Self::release_idle(self);
    }
    fn placeholder() -> Self {
        Self::new(
            konn_protocol::h2::Config::new(konn_protocol::h2::Role::Server),
            crate::io::clock::now(),
        )
    }
}

/// The application side of a connection running session `S`.
pub trait Handler<S: Session> {
    /// One event. May issue commands on the session directly.
    fn on_event(&mut self, session: &mut S, event: S::Event);

    /// Called after every batch of events and every `ConnHandle::with`:
    /// the place to flush work other connections queued for this one while
    /// it was busy.
    fn after_dispatch(&mut self, _session: &mut S) {}

    /// The connection is finished (for gRPC: all calls have had their
    /// `Finished` event). Called once.
    fn on_close(&mut self, _session: &mut S, _error: Option<&Error>) {}

    /// The connection has been idle a while (its writer gave its buffers
    /// back): give back what the handler holds for bursts.
    fn release_idle(&mut self) {}
}
