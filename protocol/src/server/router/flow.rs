//! Per-frontend flow control in the router: each frontend's queue
//! ([`FlowRx`]), the tunnel credit it withholds, PAUSE/RESUME to and from
//! the agent (docs/design/tunnel.md, "Flow control").

use super::*;

impl Router {
    /// Perform a flow-control step for frontend `fid`'s queue: withheld
    /// credit that may go back, PAUSE/RESUME to its agent. Returns the
    /// credit to release now if `direct` (the caller releases it), else
    /// queues it as [`Action::ReleaseBackend`].
    pub(super) fn flow_step(&mut self, fid: FrontendId, step: Step, direct: bool) -> usize {
        let Some(f) = self.frontends.get(&fid) else {
            return step.release;
        };
        let backend = f.rx_backend;
        if let Some(signal) = step.signal {
            let conns: Vec<(BackendId, i64)> = f
                .established
                .iter()
                .copied()
                .filter(|(b, _)| self.backends.get(b).is_some_and(|b| b.flow_control))
                .collect();
            for (b, connect_id) in conns {
                let packet = match signal {
                    Signal::Pause => Packet::Pause { connect_id },
                    Signal::Resume => Packet::Resume { connect_id },
                };
                self.send_backend(b, Payload::Packet(packet));
            }
        }
        if direct || step.release == 0 {
            return step.release;
        }
        if let Some(backend) = backend {
            self.release_backend(backend, step.release);
        }
        0
    }

    /// Frontend `fid`'s queue measured by the IO layer at `now`: `level`
    /// bytes (a gRPC frontend's stream send queue; a CONNECT socket's write
    /// queue). A lower level than before is progress: withheld credit may
    /// go back and a RESUME may be due.
    pub fn frontend_level(&mut self, now: Instant, fid: FrontendId, level: usize) {
        let lim = self.cfg.flow;
        let Some(f) = self.frontends.get_mut(&fid) else {
            return;
        };
        // Nothing to account: no connection established (yet, or any
        // more) and nothing of one still queued.
        if level == f.rx.queued()
            || (f.established.is_empty() && f.rx.queued() == 0 && f.rx.withheld() == 0)
        {
            return;
        }
        let may_pause = f
            .rx_backend
            .and_then(|b| self.backends.get(&b))
            .is_some_and(|b| b.flow_control);
        let step = f.rx.set_level(level, &lim, may_pause, now);
        let _ = self.flow_step(fid, step, false);
    }

    /// Credit of a message frontend `fid` sent that the IO layer passed on:
    /// returns what to return now; while the agent paused the frontend it
    /// is held until RESUME ([`Action::ResumeFrontend`]).
    #[must_use]
    pub fn frontend_credit(&mut self, fid: FrontendId, credit: usize) -> usize {
        match self.frontends.get_mut(&fid) {
            Some(f) if f.paused => {
                f.held += credit;
                0
            }
            _ => credit,
        }
    }

    /// Whether the agent paused frontend `fid` (PAUSE).
    pub fn frontend_paused(&self, fid: FrontendId) -> bool {
        self.frontends.get(&fid).is_some_and(|f| f.paused)
    }

    /// Bytes queued towards frontend `fid`, as the router counts them.
    pub fn frontend_queued(&self, fid: FrontendId) -> Option<usize> {
        self.frontends.get(&fid).map(|f| f.rx.queued())
    }

    /// A frontend is forgotten: the tunnel credit its queue held back goes
    /// back to its agent.
    pub(super) fn release_rx(&mut self, f: &mut Frontend) {
        let withheld = f.rx.close();
        if withheld > 0
            && let Some(backend) = f.rx_backend
            && self.backends.contains_key(&backend)
        {
            self.release_backend(backend, withheld);
        }
    }
}
