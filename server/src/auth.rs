//! Agent token authentication on the agent port (`--agent-namespace`,
//! `--agent-service-account`, `--authentication-audience`).
//!
//! A Connect call arrives as one synchronous event inside the connection's
//! dispatch; a TokenReview takes a round trip to kube-apiserver. So the
//! call is **held**: no response headers, nothing registered with the
//! router — only a small pending entry here ([`Auth::hold`]), at most
//! [`MAX_PENDING`] per worker (beyond that the agent is refused at once).
//! The token goes to the reviewer on the control-plane thread
//! (`konn_core::kube::review`), whose verdict comes back as
//! `ClusterMsg::AuthVerdict` through this worker's mesh inbox. The verdict is
//! handed to the connection ([`Verdicts`]) and the connection is poked; its
//! handler then accepts the call (headers, backend registration, exactly
//! as without authentication) or finishes it with upstream's status.
//!
//! Every hold has a deadline (the reviewer's timeout plus
//! [`DEADLINE_MARGIN`]): if no verdict arrived by then the agent is refused
//! (fail closed). A verdict for a call whose stream or connection went
//! away meanwhile finds nothing and is dropped.
//!
//! Header checks are upstream's `authenticateAgentViaToken`, with its
//! texts: no `authorization` value, more than one, or one without the
//! `Bearer ` prefix refuse the call at once, without a review. Refusals end
//! the call with status Unknown (upstream returns a plain error), and every
//! outcome is counted in `konn_server_agent_auth_total{result,source}`.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::time::Duration;

use bytes::Bytes;
use konn_core::io::notify::Notify;
use konn_core::io::runtime::{Either, race};
use konn_core::io::xcore::{MeshSender, SendError};
use konn_core::kube::review::{Delivery, Outcome, Refusal, Source, TokenReviewer, Verdict};
use konn_protocol::h2::Headers;

use crate::cluster::{ClusterId, ClusterMsg};
use crate::worker::{Msg, Outbox, Worker};

/// Held Connect calls per worker at most.
pub const MAX_PENDING: usize = 1024;

/// A worker gives a held call this much longer than the reviewer's own
/// deadline before it refuses on its own.
pub const DEADLINE_MARGIN: Duration = Duration::from_secs(2);

/// The prefix upstream puts on every review failure.
pub const VALIDATE_PREFIX: &str = "Failed to validate authentication token, err:";

/// How an authentication ended (`result` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthResult {
    /// Accepted.
    Allowed,
    /// No `authorization` metadata.
    MissingToken,
    /// More than one `authorization` value.
    TooManyTokens,
    /// The value does not start with `Bearer `.
    NoBearerPrefix,
    /// kube-apiserver did not authenticate the token, or it is not the
    /// agents' service account.
    Denied,
    /// The TokenReview call failed.
    Unavailable,
    /// No verdict in time.
    Timeout,
    /// Too many calls waiting for a review.
    Busy,
}

impl AuthResult {
    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::MissingToken => "missing_token",
            Self::TooManyTokens => "too_many_tokens",
            Self::NoBearerPrefix => "no_bearer_prefix",
            Self::Denied => "denied",
            Self::Unavailable => "unavailable",
            Self::Timeout => "timeout",
            Self::Busy => "busy",
        }
    }

    /// The result of a review outcome.
    pub fn of(verdict: &Verdict) -> Self {
        match verdict {
            Verdict::Allowed { .. } => Self::Allowed,
            Verdict::Refused { reason, .. } => match reason {
                Refusal::Denied => Self::Denied,
                Refusal::Unavailable => Self::Unavailable,
                Refusal::Timeout => Self::Timeout,
                Refusal::Busy => Self::Busy,
            },
        }
    }
}

/// The `source` label of a result.
pub fn source_label(source: Option<Source>) -> &'static str {
    match source {
        None => "header",
        Some(Source::Api) => "api",
        Some(Source::Cache) => "cache",
        Some(Source::Coalesced) => "coalesced",
        Some(Source::Reviewer) => "reviewer",
    }
}

/// The token of a Connect call's metadata, as upstream checks it:
/// exactly one `authorization` value, starting with `Bearer `.
///
/// # Errors
///
/// Upstream's message and the result to count.
pub fn bearer_token(metadata: &Headers) -> Result<Bytes, (AuthResult, String)> {
    let values: Vec<&Bytes> = metadata.get_all(b"authorization").collect();
    match values.as_slice() {
        [] => Err((
            AuthResult::MissingToken,
            "Authentication context was not found in metadata".to_owned(),
        )),
        [one] => match one.strip_prefix(b"Bearer ") {
            Some(token) => Ok(one.slice(one.len() - token.len()..)),
            None => Err((
                AuthResult::NoBearerPrefix,
                "received token does not have \"Bearer \" prefix".to_owned(),
            )),
        },
        more => Err((
            AuthResult::TooManyTokens,
            format!("too many ({}) tokens are received", more.len()),
        )),
    }
}

/// Verdicts waiting for one agent connection's handler (shared between the
/// connection and its worker's [`Auth`]).
#[derive(Default)]
pub struct Verdicts {
    items: RefCell<Vec<(u32, Outcome)>>,
}

impl Verdicts {
    /// Take everything delivered so far.
    pub fn take(&self) -> Vec<(u32, Outcome)> {
        std::mem::take(&mut *self.items.borrow_mut())
    }
}

/// A held call, as the worker knows it.
struct Held {
    verdicts: Weak<Verdicts>,
    outbox: Weak<Outbox>,
    stream: u32,
    cancel: Rc<Notify>,
}

/// A worker's authentication state (see the module docs).
pub struct Auth {
    reviewer: TokenReviewer,
    mesh: MeshSender<Msg>,
    worker: usize,
    cluster: ClusterId,
    deadline: Duration,
    held: RefCell<HashMap<u64, Held>>,
    next: Cell<u64>,
}

impl Auth {
    /// The authentication of cluster `cluster` on worker `worker`;
    /// `review_timeout` is the reviewer's own deadline.
    pub fn new(
        reviewer: TokenReviewer,
        mesh: MeshSender<Msg>,
        worker: usize,
        cluster: ClusterId,
        review_timeout: Duration,
    ) -> Self {
        Self {
            reviewer,
            mesh,
            worker,
            cluster,
            deadline: review_timeout + DEADLINE_MARGIN,
            held: RefCell::new(HashMap::new()),
            next: Cell::new(1),
        }
    }

    /// Calls held now.
    pub fn pending(&self) -> usize {
        self.held.borrow().len()
    }

    /// Hold stream `stream` of a connection while `token` is reviewed; the
    /// verdict will appear in `verdicts` and `outbox` will be poked. Returns
    /// the hold's id (to [`Auth::forget`] it).
    ///
    /// # Errors
    ///
    /// Too many calls are held, or the reviewer is full: the verdict to
    /// answer at once.
    pub fn hold(
        &self,
        worker: &Rc<Worker>,
        token: &[u8],
        stream: u32,
        verdicts: &Rc<Verdicts>,
        outbox: &Rc<Outbox>,
    ) -> Result<u64, Verdict> {
        if self.pending() >= MAX_PENDING {
            return Err(Verdict::busy());
        }
        let id = self.next.get();
        self.next.set(id + 1);
        let (mesh, to, cluster) = (self.mesh.clone(), self.worker, self.cluster);
        let reply = Box::new(move |outcome: Outcome| {
            let msg = Msg::Cluster {
                cluster,
                msg: ClusterMsg::AuthVerdict { id, outcome },
            };
            match mesh.send(to, msg) {
                Ok(()) => Delivery::Delivered,
                Err(SendError::Full(Msg::Cluster {
                    msg: ClusterMsg::AuthVerdict { outcome, .. },
                    ..
                })) => Delivery::Full(outcome),
                Err(_) => Delivery::Gone,
            }
        });
        if self.reviewer.submit(token, reply).is_err() {
            return Err(Verdict::busy());
        }
        let cancel = Rc::new(Notify::new());
        self.held.borrow_mut().insert(
            id,
            Held {
                verdicts: Rc::downgrade(verdicts),
                outbox: Rc::downgrade(outbox),
                stream,
                cancel: cancel.clone(),
            },
        );
        // The worker's own deadline: fail closed if no verdict comes.
        let (w, limit, cluster) = (Rc::downgrade(worker), self.deadline, self.cluster);
        worker.spawn(async move {
            let sleep = monoio::time::sleep(limit);
            if let Either::Left(()) = race(sleep, cancel.notified()).await
                && let Some(w) = w.upgrade()
                && let Some(c) = w.clusters.borrow().get(&cluster).cloned()
                && let Some(auth) = &c.auth
            {
                auth.resolve(
                    id,
                    Outcome {
                        verdict: Verdict::timeout(limit),
                        source: Source::Reviewer,
                    },
                );
            }
        });
        Ok(id)
    }

    /// A verdict for hold `id` (from the reviewer, or the deadline).
    pub fn resolve(&self, id: u64, outcome: Outcome) {
        let Some(h) = self.held.borrow_mut().remove(&id) else {
            return; // decided already, or the call went away
        };
        h.cancel.notify();
        let (Some(verdicts), Some(outbox)) = (h.verdicts.upgrade(), h.outbox.upgrade()) else {
            tracing::debug!("token review verdict for a connection that is gone");
            return;
        };
        verdicts.items.borrow_mut().push((h.stream, outcome));
        outbox.poke();
    }

    /// The held call went away (stream or connection ended): drop its
    /// hold; a verdict arriving later is ignored.
    pub fn forget(&self, id: u64) {
        if let Some(h) = self.held.borrow_mut().remove(&id) {
            h.cancel.notify();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(values: &[&'static str]) -> Headers {
        let mut h = Headers::new();
        h.push_static("agentid", "a");
        for v in values {
            h.push_static("authorization", v);
        }
        h
    }

    #[test]
    fn header_checks_follow_upstream() {
        assert_eq!(bearer_token(&md(&["Bearer abc"])).unwrap(), "abc");
        assert_eq!(bearer_token(&md(&["Bearer "])).unwrap(), "");
        let err = |v: &[&'static str]| bearer_token(&md(v)).unwrap_err();
        assert_eq!(
            err(&[]),
            (
                AuthResult::MissingToken,
                "Authentication context was not found in metadata".to_owned()
            )
        );
        assert_eq!(
            err(&["Bearer a", "Bearer b"]),
            (
                AuthResult::TooManyTokens,
                "too many (2) tokens are received".to_owned()
            )
        );
        assert_eq!(
            err(&["bearer abc"]).1,
            "received token does not have \"Bearer \" prefix"
        );
        assert_eq!(err(&["abc"]).0, AuthResult::NoBearerPrefix);
        assert_eq!(AuthResult::of(&Verdict::busy()), AuthResult::Busy);
        assert_eq!(source_label(Some(Source::Coalesced)), "coalesced");
    }
}
