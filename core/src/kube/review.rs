//! Agent token authentication: upstream's TokenReview check, with a cache,
//! coalescing and bounds so an agent reconnect storm cannot become a storm
//! on kube-apiserver.
//!
//! **Upstream's check** (`validateAuthToken`, reproduced by [`judge`]): a
//! `TokenReview{token, audiences: [--authentication-audience]}`; the
//! review's `status.error` refuses (`lookup failed: <error>`), so does
//! `!status.authenticated` (`lookup failed: service account jwt not
//! valid`); the username must be `system:serviceaccount:<ns>:<sa>` with
//! `--agent-namespace` and `--agent-service-account`. A failed API call
//! refuses with `Failed to authenticate request. err:<error>`. The server
//! prefixes every message with `Failed to validate authentication token,
//! err:` and ends the call with status Unknown, as upstream.
//!
//! **What konn adds** (upstream makes one uncached TokenReview per agent
//! connection, #237):
//! - a cache keyed by the SHA-256 of the token (never the token itself): a
//!   success is kept until the earlier of [`ReviewPolicy::positive_ttl`]
//!   and the token's own `exp` claim (read from the JWT payload, not
//!   verified: kube-apiserver verified it); a refusal by kube-apiserver
//!   (not authenticated, wrong identity) is kept for
//!   [`ReviewPolicy::negative_ttl`]. Failed calls are not cached.
//! - coalescing: while a review of a token is in flight, further requests
//!   for the same token wait for its answer instead of making their own.
//! - at most [`ReviewPolicy::max_in_flight`] calls at once; requests beyond
//!   that queue (bounded by [`ReviewPolicy::max_queued`]; beyond that they
//!   are refused at once), and every call also goes through the shared
//!   qps/burst limiter.
//! - a deadline: a request not answered within [`ReviewPolicy::timeout`]
//!   (throttling included) is refused — fail closed.
//!
//! The reviewer is one task on the control-plane thread that owns all this
//! state (no locks). Workers hand it requests with
//! [`TokenReviewer::submit`], which never blocks; each request carries a
//! [`Reply`] that delivers the [`Outcome`] to the requesting worker. When
//! the worker's inbox is full the reply hands the outcome back and the
//! reviewer retries with a bounded backoff until the request's deadline
//! (plus a grace period) has passed — by then the worker has refused the
//! agent on its own deadline.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use base64::Engine as _;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use kube::api::{Api, PostParams};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{CallError, ControlPlane, Limiter, wall_now};

/// Default [`ReviewPolicy::positive_ttl`] (kube-apiserver's webhook token
/// cache keeps successes as long).
pub const DEFAULT_POSITIVE_TTL: Duration = Duration::from_secs(120);
/// Default [`ReviewPolicy::negative_ttl`].
pub const DEFAULT_NEGATIVE_TTL: Duration = Duration::from_secs(10);
/// Default [`ReviewPolicy::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`ReviewPolicy::max_in_flight`].
pub const DEFAULT_MAX_IN_FLIGHT: usize = 8;
/// Default [`ReviewPolicy::max_queued`].
pub const DEFAULT_MAX_QUEUED: usize = 4096;
/// Default [`ReviewPolicy::cache_capacity`].
pub const DEFAULT_CACHE_CAPACITY: usize = 16_384;

/// How long a reply whose inbox stays full is retried after its deadline.
const DELIVERY_GRACE: Duration = Duration::from_secs(5);
/// Longest pause between two delivery attempts.
const DELIVERY_BACKOFF_CAP: Duration = Duration::from_millis(50);

/// The rules and bounds of the reviewer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewPolicy {
    /// `--authentication-audience`.
    pub audience: String,
    /// `--agent-namespace`.
    pub namespace: String,
    /// `--agent-service-account`.
    pub service_account: String,
    /// How long a success is cached at most (the token's expiry may cut it
    /// shorter).
    pub positive_ttl: Duration,
    /// How long kube-apiserver's refusal of a token is cached.
    pub negative_ttl: Duration,
    /// Bound on answering one request (rate-limit wait included).
    pub timeout: Duration,
    /// TokenReview calls in flight at most.
    pub max_in_flight: usize,
    /// Requests waiting (queued or coalesced) at most.
    pub max_queued: usize,
    /// Cached verdicts at most.
    pub cache_capacity: usize,
}

impl ReviewPolicy {
    /// The policy for these flags, with konn's default bounds.
    pub fn new(
        audience: impl Into<String>,
        namespace: impl Into<String>,
        service_account: impl Into<String>,
    ) -> Self {
        Self {
            audience: audience.into(),
            namespace: namespace.into(),
            service_account: service_account.into(),
            positive_ttl: DEFAULT_POSITIVE_TTL,
            negative_ttl: DEFAULT_NEGATIVE_TTL,
            timeout: DEFAULT_TIMEOUT,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_queued: DEFAULT_MAX_QUEUED,
            cache_capacity: DEFAULT_CACHE_CAPACITY,
        }
    }
}

/// Why an agent is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// kube-apiserver did not authenticate the token, or the identity is
    /// not the expected service account.
    Denied,
    /// The TokenReview call failed (kube-apiserver down, TLS, an error
    /// status).
    Unavailable,
    /// No answer within the deadline (throttling included).
    Timeout,
    /// Too many reviews waiting; refused without asking.
    Busy,
}

/// A review's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The token belongs to the expected service account.
    Allowed {
        /// `system:serviceaccount:<ns>:<sa>`.
        username: String,
    },
    /// Refused; `message` is upstream's `validateAuthToken` error text.
    Refused {
        /// The kind of refusal (for counting).
        reason: Refusal,
        /// The error text.
        message: String,
    },
}

impl Verdict {
    fn refused(reason: Refusal, message: impl Into<String>) -> Self {
        Self::Refused {
            reason,
            message: message.into(),
        }
    }

    /// The answer when the reviewer's queue is full.
    pub fn busy() -> Self {
        Self::refused(
            Refusal::Busy,
            "Failed to authenticate request. err:too many agent token reviews waiting (konn's bound); retry later",
        )
    }

    /// The answer when no verdict came in time.
    pub fn timeout(limit: Duration) -> Self {
        Self::refused(
            Refusal::Timeout,
            format!(
                "Failed to authenticate request. err:context deadline exceeded (no TokenReview answer within {limit:?})"
            ),
        )
    }
}

/// Where a verdict came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// A TokenReview call made for this request.
    Api,
    /// The cache.
    Cache,
    /// A call made for another request of the same token.
    Coalesced,
    /// The reviewer itself (queue full, deadline).
    Reviewer,
}

/// What a request gets back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The verdict.
    pub verdict: Verdict,
    /// Where it came from.
    pub source: Source,
}

/// The result of handing an [`Outcome`] to its requester.
pub enum Delivery {
    /// Delivered.
    Delivered,
    /// The requester's inbox is full: try again later with this.
    Full(Outcome),
    /// The requester is gone: drop it.
    Gone,
}

/// Delivers an outcome to the requester (called on the control-plane
/// thread, possibly several times if it answers [`Delivery::Full`]).
pub type Reply = Box<dyn FnMut(Outcome) -> Delivery + Send>;

/// Told about every TokenReview call (for metrics).
pub trait ReviewObserver: Send + Sync + 'static {
    /// A call ended: kube-apiserver's HTTP status, `None` without one.
    fn api_call(&self, code: Option<u16>);
}

/// An observer that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;

impl ReviewObserver for NoObserver {
    fn api_call(&self, _code: Option<u16>) {}
}

/// SHA-256 of a token: the cache key.
pub type TokenHash = [u8; 32];

/// The SHA-256 of `token`.
pub fn token_hash(token: &[u8]) -> TokenHash {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, token);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// A short printable form of a hash for logs (first 8 bytes, hex).
pub fn short_hash(h: &TokenHash) -> String {
    h.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The `exp` claim of a JWT, in seconds since the epoch; `None` when the
/// token is not a JWT or has no numeric `exp`. Not verified.
pub fn jwt_expiry(token: &[u8]) -> Option<u64> {
    let mut parts = token.split(|b| *b == b'.');
    let (_header, payload, _sig) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || payload.len() > 64 * 1024 {
        return None;
    }
    let trimmed: &[u8] = match payload.iter().position(|b| *b == b'=') {
        Some(i) => payload.get(..i)?,
        None => payload,
    };
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(trimmed)
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&json).ok()?;
    let exp = v.get("exp")?;
    exp.as_u64()
        .or_else(|| exp.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
}

/// Go's `%q` of a string, for the texts upstream builds with it.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Upstream's verdict on a TokenReview status (`validateAuthToken`).
pub fn judge(policy: &ReviewPolicy, status: Option<&TokenReviewStatus>) -> Verdict {
    let denied = |m: String| Verdict::refused(Refusal::Denied, m);
    let Some(status) = status else {
        return denied("lookup failed: service account jwt not valid".to_owned());
    };
    if let Some(err) = status.error.as_deref().filter(|e| !e.is_empty()) {
        return denied(format!("lookup failed: {err}"));
    }
    if status.authenticated != Some(true) {
        return denied("lookup failed: service account jwt not valid".to_owned());
    }
    let username = status
        .user
        .as_ref()
        .and_then(|u| u.username.clone())
        .unwrap_or_default();
    let parts: Vec<&str> = username.split(':').collect();
    let [system, sa_kind, ns, sa] = parts.as_slice() else {
        return denied("lookup failed: unexpected username format".to_owned());
    };
    if *system != "system" || *sa_kind != "serviceaccount" {
        return denied("lookup failed: username returned is not a service account".to_owned());
    }
    if *ns != policy.namespace {
        return denied(format!(
            "lookup failed: incoming request from {} namespace. Expected {}",
            go_quote(ns),
            go_quote(&policy.namespace)
        ));
    }
    if *sa != policy.service_account {
        return denied(format!(
            "lookup failed: incoming request from {} service account. Expected {}",
            go_quote(sa),
            go_quote(&policy.service_account)
        ));
    }
    Verdict::Allowed { username }
}

/// The verdict cache (time passed in, for tests).
#[derive(Debug)]
pub struct Cache {
    entries: HashMap<TokenHash, (Instant, Verdict)>,
    capacity: usize,
}

impl Cache {
    /// An empty cache of at most `capacity` verdicts.
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: HashMap::new(),
            capacity,
        }
    }

    /// The cached verdict for `hash`, if still fresh at `now`.
    pub fn get(&mut self, hash: &TokenHash, now: Instant) -> Option<Verdict> {
        match self.entries.get(hash) {
            Some((until, v)) if *until > now => Some(v.clone()),
            Some(_) => {
                self.entries.remove(hash);
                None
            }
            None => None,
        }
    }

    /// Keep `verdict` until `until` (dropped when the cache is full of
    /// fresh entries).
    pub fn put(&mut self, hash: TokenHash, verdict: Verdict, until: Instant, now: Instant) {
        if until <= now || self.capacity == 0 {
            return;
        }
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&hash) {
            self.entries.retain(|_, (u, _)| *u > now);
            if self.entries.len() >= self.capacity {
                return;
            }
        }
        self.entries.insert(hash, (until, verdict));
    }

    /// Entries held (fresh or not yet purged).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// How long `verdict` for `token` may be cached, from now.
pub fn cache_for(policy: &ReviewPolicy, verdict: &Verdict, token: &[u8]) -> Option<Duration> {
    match verdict {
        Verdict::Allowed { .. } => {
            let ttl = policy.positive_ttl;
            match jwt_expiry(token) {
                Some(exp) => {
                    let now = wall_now().duration_since(UNIX_EPOCH).ok()?.as_secs_f64();
                    let left = exp as f64 - now;
                    (left > 0.0).then(|| ttl.min(Duration::from_secs_f64(left)))
                }
                None => Some(ttl),
            }
        }
        Verdict::Refused {
            reason: Refusal::Denied,
            ..
        } => Some(policy.negative_ttl),
        Verdict::Refused { .. } => None,
    }
}

/// One request handed to the reviewer.
struct Request {
    token: Vec<u8>,
    reply: Reply,
}

/// The handle workers submit requests with (cheap to clone, any thread).
#[derive(Clone)]
pub struct TokenReviewer {
    tx: mpsc::Sender<Request>,
}

impl fmt::Debug for TokenReviewer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenReviewer").finish_non_exhaustive()
    }
}

impl TokenReviewer {
    /// Start the reviewer on `control`'s thread.
    pub fn start(
        control: &ControlPlane,
        policy: ReviewPolicy,
        observer: Arc<dyn ReviewObserver>,
    ) -> Self {
        let client = control.client();
        Self::start_with(
            control,
            policy,
            observer,
            move |review, deadline, limiter| {
                let api: Api<TokenReview> = Api::all(client.clone());
                Box::pin(async move {
                    super::call(&limiter, deadline, async move {
                        api.create(&PostParams::default(), &review).await
                    })
                    .await
                })
            },
        )
    }

    /// Start a reviewer whose calls are made by `call` (tests use a fake).
    pub fn start_with<F>(
        control: &ControlPlane,
        policy: ReviewPolicy,
        observer: Arc<dyn ReviewObserver>,
        call: F,
    ) -> Self
    where
        F: Fn(TokenReview, Instant, Arc<Limiter>) -> CallFuture + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(policy.max_queued.max(1));
        let task = Reviewer::new(policy, observer, control.limiter(), Box::new(call));
        control.spawn(task.run(rx));
        Self { tx }
    }

    /// Hand a token to the reviewer; `reply` will get exactly one outcome.
    /// Never blocks.
    ///
    /// # Errors
    ///
    /// The reviewer's queue is full or it stopped: `reply` comes back
    /// unused; refuse the agent at once.
    pub fn submit(&self, token: &[u8], reply: Reply) -> Result<(), Reply> {
        self.tx
            .try_send(Request {
                token: token.to_vec(),
                reply,
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(r) | mpsc::error::TrySendError::Closed(r) => {
                    r.reply
                }
            })
    }
}

/// A TokenReview call in progress.
pub type CallFuture =
    std::pin::Pin<Box<dyn Future<Output = Result<TokenReview, CallError>> + Send>>;

type CallFn = Box<dyn Fn(TokenReview, Instant, Arc<Limiter>) -> CallFuture + Send>;

struct Waiter {
    reply: Reply,
    deadline: Instant,
    source: Source,
}

/// A token being reviewed or waiting for a free call slot.
struct Pending {
    token: Vec<u8>,
    waiters: Vec<Waiter>,
    started: bool,
}

/// The reviewer task's state (see the module docs).
struct Reviewer {
    policy: ReviewPolicy,
    observer: Arc<dyn ReviewObserver>,
    limiter: Arc<Limiter>,
    call: CallFn,
    cache: Cache,
    pending: HashMap<TokenHash, Pending>,
    /// Tokens waiting for a call slot, oldest first.
    queue: VecDeque<TokenHash>,
    running: usize,
    waiting: usize,
}

impl Reviewer {
    fn new(
        policy: ReviewPolicy,
        observer: Arc<dyn ReviewObserver>,
        limiter: Arc<Limiter>,
        call: CallFn,
    ) -> Self {
        Self {
            cache: Cache::new(policy.cache_capacity),
            policy,
            observer,
            limiter,
            call,
            pending: HashMap::new(),
            queue: VecDeque::new(),
            running: 0,
            waiting: 0,
        }
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Request>) {
        let (done_tx, mut done_rx) =
            mpsc::unbounded_channel::<(TokenHash, Result<TokenReview, CallError>)>();
        loop {
            tokio::select! {
                req = rx.recv() => match req {
                    Some(r) => self.on_request(r),
                    None => return,
                },
                Some((hash, result)) = done_rx.recv() => self.on_done(hash, result),
            }
            self.start_calls(&done_tx);
        }
    }

    fn on_request(&mut self, req: Request) {
        let now = Instant::now();
        let hash = token_hash(&req.token);
        if let Some(verdict) = self.cache.get(&hash, now) {
            tracing::trace!(token = %short_hash(&hash), "token review answered from the cache");
            deliver(
                req.reply,
                Outcome {
                    verdict,
                    source: Source::Cache,
                },
                now + self.policy.timeout,
            );
            return;
        }
        if self.waiting >= self.policy.max_queued {
            deliver(
                req.reply,
                Outcome {
                    verdict: Verdict::busy(),
                    source: Source::Reviewer,
                },
                now + self.policy.timeout,
            );
            return;
        }
        self.waiting += 1;
        let deadline = now + self.policy.timeout;
        match self.pending.get_mut(&hash) {
            Some(p) => p.waiters.push(Waiter {
                reply: req.reply,
                deadline,
                source: Source::Coalesced,
            }),
            None => {
                tracing::debug!(token = %short_hash(&hash), "reviewing an agent token");
                self.pending.insert(
                    hash,
                    Pending {
                        token: req.token,
                        waiters: vec![Waiter {
                            reply: req.reply,
                            deadline,
                            source: Source::Api,
                        }],
                        started: false,
                    },
                );
                self.queue.push_back(hash);
            }
        }
    }

    fn start_calls(
        &mut self,
        done: &mpsc::UnboundedSender<(TokenHash, Result<TokenReview, CallError>)>,
    ) {
        while self.running < self.policy.max_in_flight.max(1) {
            let Some(hash) = self.queue.pop_front() else {
                return;
            };
            let Some(p) = self.pending.get_mut(&hash) else {
                continue;
            };
            let deadline = p
                .waiters
                .iter()
                .map(|w| w.deadline)
                .min()
                .unwrap_or_else(|| Instant::now() + self.policy.timeout);
            p.started = true;
            self.running += 1;
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: String::from_utf8_lossy(&p.token).into_owned(),
                    audiences: Some(vec![self.policy.audience.clone()]),
                },
                ..TokenReview::default()
            };
            let fut = (self.call)(review, deadline, self.limiter.clone());
            let done = done.clone();
            tokio::spawn(async move {
                let r = fut.await;
                let _ = done.send((hash, r));
            });
        }
    }

    fn on_done(&mut self, hash: TokenHash, result: Result<TokenReview, CallError>) {
        self.running = self.running.saturating_sub(1);
        let Some(p) = self.pending.remove(&hash) else {
            return;
        };
        debug_assert!(p.started);
        let now = Instant::now();
        let verdict = match &result {
            Ok(review) => {
                self.observer.api_call(Some(201));
                judge(&self.policy, review.status.as_ref())
            }
            Err(e) => {
                self.observer.api_call(e.code());
                match e {
                    CallError::Timeout(d) => Verdict::timeout(*d),
                    CallError::Throttled => Verdict::refused(
                        Refusal::Timeout,
                        format!("Failed to authenticate request. err:{e}"),
                    ),
                    e => Verdict::refused(
                        Refusal::Unavailable,
                        format!("Failed to authenticate request. err:{e}"),
                    ),
                }
            }
        };
        tracing::debug!(token = %short_hash(&hash), allowed = matches!(verdict, Verdict::Allowed { .. }), "token review done");
        if let Some(ttl) = cache_for(&self.policy, &verdict, &p.token) {
            self.cache.put(hash, verdict.clone(), now + ttl, now);
        }
        self.waiting = self.waiting.saturating_sub(p.waiters.len());
        for w in p.waiters {
            deliver(
                w.reply,
                Outcome {
                    verdict: verdict.clone(),
                    source: w.source,
                },
                w.deadline,
            );
        }
    }
}

/// Hand `outcome` over; while the requester's inbox is full, retry with a
/// growing pause (capped) until `deadline` plus a grace period.
fn deliver(mut reply: Reply, outcome: Outcome, deadline: Instant) {
    match reply(outcome) {
        Delivery::Delivered | Delivery::Gone => {}
        Delivery::Full(outcome) => {
            tokio::spawn(async move {
                let give_up = deadline + DELIVERY_GRACE;
                let mut pause = Duration::from_millis(1);
                let mut outcome = outcome;
                loop {
                    tokio::time::sleep(pause).await;
                    match reply(outcome) {
                        Delivery::Delivered | Delivery::Gone => return,
                        Delivery::Full(o) => outcome = o,
                    }
                    if Instant::now() >= give_up {
                        tracing::warn!(
                            "dropping a token review verdict: the worker's inbox stayed full past the deadline"
                        );
                        return;
                    }
                    pause = (pause * 2).min(DELIVERY_BACKOFF_CAP);
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::UserInfo;

    fn policy() -> ReviewPolicy {
        ReviewPolicy::new(
            "system:konnectivity-server",
            "kube-system",
            "konnectivity-agent",
        )
    }

    fn status(auth: bool, user: &str, error: Option<&str>) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(auth),
            error: error.map(str::to_owned),
            user: Some(UserInfo {
                username: Some(user.to_owned()),
                ..UserInfo::default()
            }),
            ..TokenReviewStatus::default()
        }
    }

    fn msg(v: Verdict) -> String {
        match v {
            Verdict::Allowed { username } => format!("allowed {username}"),
            Verdict::Refused { message, reason } => {
                assert_eq!(reason, Refusal::Denied);
                message
            }
        }
    }

    #[test]
    fn judge_follows_upstream_texts() {
        let p = policy();
        let ok = "system:serviceaccount:kube-system:konnectivity-agent";
        assert_eq!(
            msg(judge(&p, Some(&status(true, ok, None)))),
            format!("allowed {ok}")
        );
        assert_eq!(
            msg(judge(
                &p,
                Some(&status(
                    false,
                    "",
                    Some("[invalid bearer token, token audiences [\"x\"] is invalid]")
                ))
            )),
            "lookup failed: [invalid bearer token, token audiences [\"x\"] is invalid]"
        );
        assert_eq!(
            msg(judge(&p, Some(&status(false, "", None)))),
            "lookup failed: service account jwt not valid"
        );
        assert_eq!(
            msg(judge(&p, None)),
            "lookup failed: service account jwt not valid"
        );
        assert_eq!(
            msg(judge(&p, Some(&status(true, "alice", None)))),
            "lookup failed: unexpected username format"
        );
        assert_eq!(
            msg(judge(&p, Some(&status(true, "system:node:n1:x", None)))),
            "lookup failed: username returned is not a service account"
        );
        assert_eq!(
            msg(judge(
                &p,
                Some(&status(
                    true,
                    "system:serviceaccount:default:konnectivity-agent",
                    None
                ))
            )),
            "lookup failed: incoming request from \"default\" namespace. Expected \"kube-system\""
        );
        assert_eq!(
            msg(judge(
                &p,
                Some(&status(
                    true,
                    "system:serviceaccount:kube-system:other",
                    None
                ))
            )),
            "lookup failed: incoming request from \"other\" service account. Expected \"konnectivity-agent\""
        );
        assert_eq!(go_quote("a\"b\\\n\u{1}"), "\"a\\\"b\\\\\\n\\x01\"");
    }

    fn jwt(payload: &str) -> Vec<u8> {
        let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.sig",
            e.encode("{\"alg\":\"RS256\"}"),
            e.encode(payload)
        )
        .into_bytes()
    }

    #[test]
    fn expiry_is_read_from_the_payload() {
        assert_eq!(
            jwt_expiry(&jwt("{\"exp\":1700000000,\"sub\":\"x\"}")),
            Some(1_700_000_000)
        );
        assert_eq!(jwt_expiry(&jwt("{\"exp\":1.7e9}")), Some(1_700_000_000));
        assert_eq!(jwt_expiry(&jwt("{\"sub\":\"x\"}")), None);
        assert_eq!(jwt_expiry(&jwt("{\"exp\":\"soon\"}")), None);
        assert_eq!(jwt_expiry(&jwt("not json")), None);
        assert_eq!(jwt_expiry(b"opaque-static-token"), None);
        assert_eq!(jwt_expiry(b"a.b.c.d"), None);
        assert_eq!(jwt_expiry(b"a.!!!.c"), None);
    }

    #[test]
    fn cache_lifetimes() {
        let p = policy();
        let ok = Verdict::Allowed {
            username: "u".to_owned(),
        };
        // An opaque token: the TTL.
        assert_eq!(cache_for(&p, &ok, b"opaque"), Some(DEFAULT_POSITIVE_TTL));
        // A JWT expiring in ~30 s: its expiry.
        let now = wall_now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        let soon = jwt(&format!("{{\"exp\":{}}}", now + 30));
        let d = cache_for(&p, &ok, &soon).unwrap();
        assert!(
            d <= Duration::from_secs(30) && d > Duration::from_secs(25),
            "{d:?}"
        );
        // Already expired: not cached.
        assert_eq!(
            cache_for(&p, &ok, &jwt(&format!("{{\"exp\":{}}}", now - 5))),
            None
        );
        // A late expiry: the TTL.
        let late = jwt(&format!("{{\"exp\":{}}}", now + 86_400));
        assert_eq!(cache_for(&p, &ok, &late), Some(DEFAULT_POSITIVE_TTL));
        // Refusals by kube-apiserver: the negative TTL; failures: never.
        let denied = judge(&p, None);
        assert_eq!(cache_for(&p, &denied, b"x"), Some(DEFAULT_NEGATIVE_TTL));
        assert_eq!(cache_for(&p, &Verdict::busy(), b"x"), None);
        assert_eq!(
            cache_for(&p, &Verdict::timeout(Duration::from_secs(1)), b"x"),
            None
        );
    }

    #[test]
    fn cache_expires_and_stays_bounded() {
        let t0 = Instant::now();
        let mut c = Cache::new(2);
        let v = Verdict::busy();
        let s = Duration::from_secs(1);
        c.put([1; 32], v.clone(), t0 + s, t0);
        c.put([2; 32], v.clone(), t0 + 2 * s, t0);
        // Full of fresh entries: a third is not kept.
        c.put([3; 32], v.clone(), t0 + 2 * s, t0);
        assert_eq!(c.len(), 2);
        assert!(c.get(&[3; 32], t0).is_none());
        assert!(c.get(&[1; 32], t0).is_some());
        // Once one expired there is room.
        c.put([3; 32], v.clone(), t0 + 3 * s, t0 + s);
        assert!(c.get(&[1; 32], t0 + s).is_none());
        assert!(c.get(&[3; 32], t0 + s).is_some());
        // Already expired: never stored.
        c.put([4; 32], v, t0, t0);
        assert!(c.get(&[4; 32], t0).is_none());
        assert!(!c.is_empty());
        assert_eq!(short_hash(&token_hash(b"abc")), "ba7816bf8f01cfea");
    }

    /// A fake kube-apiserver: "good*" tokens belong to the agents' service
    /// account, "bad*" are not authenticated, "slow*" never answer. Counts
    /// calls and the most in flight at once.
    #[derive(Default)]
    struct Fake {
        calls: std::sync::atomic::AtomicUsize,
        now: std::sync::atomic::AtomicUsize,
        peak: std::sync::atomic::AtomicUsize,
    }

    fn fake_call(fake: Arc<Fake>) -> CallFn {
        use std::sync::atomic::Ordering::SeqCst;
        Box::new(move |review: TokenReview, deadline, limiter| {
            let fake = fake.clone();
            Box::pin(async move {
                fake.calls.fetch_add(1, SeqCst);
                let n = fake.now.fetch_add(1, SeqCst) + 1;
                fake.peak.fetch_max(n, SeqCst);
                let token = review.spec.token.clone();
                let r = crate::kube::call(&limiter, deadline, async move {
                    let wait = if token.starts_with("slow") {
                        3_600_000
                    } else {
                        30
                    };
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                    let ok = token.starts_with("good");
                    Ok::<_, kube::Error>(TokenReview {
                        status: Some(status(
                            ok,
                            if ok {
                                "system:serviceaccount:kube-system:konnectivity-agent"
                            } else {
                                ""
                            },
                            None,
                        )),
                        ..TokenReview::default()
                    })
                })
                .await;
                fake.now.fetch_sub(1, SeqCst);
                r
            })
        })
    }

    type Got = mpsc::UnboundedReceiver<(usize, Outcome)>;

    fn reply(tx: &mpsc::UnboundedSender<(usize, Outcome)>, i: usize, full_first: bool) -> Reply {
        let tx = tx.clone();
        let mut full = full_first;
        Box::new(move |o| {
            if std::mem::take(&mut full) {
                return Delivery::Full(o);
            }
            let _ = tx.send((i, o));
            Delivery::Delivered
        })
    }

    async fn collect(rx: &mut Got, n: usize) -> Vec<(usize, Outcome)> {
        let mut out = Vec::new();
        while out.len() < n {
            let got = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
            out.push(got.expect("an outcome within 5 s").expect("channel open"));
        }
        out.sort_by_key(|(i, _)| *i);
        out
    }

    #[test]
    fn reviewer_caches_coalesces_bounds_and_fails_closed() {
        use std::sync::atomic::Ordering::SeqCst;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let fake = Arc::new(Fake::default());
            let mut p = policy();
            p.max_in_flight = 2;
            p.max_queued = 8;
            p.timeout = Duration::from_millis(300);
            let reviewer = Reviewer::new(
                p,
                Arc::new(NoObserver),
                Arc::new(Limiter::new(-1.0, 0)),
                fake_call(fake.clone()),
            );
            let (req_tx, req_rx) = mpsc::channel(64);
            tokio::spawn(reviewer.run(req_rx));
            let (tx, mut rx) = mpsc::unbounded_channel();
            let submit = |token: &str, i: usize, full_first: bool| {
                req_tx
                    .try_send(Request {
                        token: token.as_bytes().to_vec(),
                        reply: reply(&tx, i, full_first),
                    })
                    .map_err(|_| ())
                    .unwrap();
            };
            // Six requests for one token: one call, five coalesced; a full
            // inbox is retried.
            for i in 0..6 {
                submit("good-1", i, i == 3);
            }
            let got = collect(&mut rx, 6).await;
            assert_eq!(fake.calls.load(SeqCst), 1);
            assert_eq!(
                got.iter().filter(|(_, o)| o.source == Source::Api).count(),
                1
            );
            assert_eq!(
                got.iter()
                    .filter(|(_, o)| o.source == Source::Coalesced)
                    .count(),
                5
            );
            assert!(
                got.iter()
                    .all(|(_, o)| matches!(o.verdict, Verdict::Allowed { .. }))
            );
            // Again: from the cache, no call.
            submit("good-1", 10, false);
            let got = collect(&mut rx, 1).await;
            assert_eq!(got[0].1.source, Source::Cache);
            assert_eq!(fake.calls.load(SeqCst), 1);
            // A refusal is cached too.
            submit("bad-1", 20, false);
            let got = collect(&mut rx, 1).await;
            assert!(matches!(
                got[0].1.verdict,
                Verdict::Refused {
                    reason: Refusal::Denied,
                    ..
                }
            ));
            submit("bad-1", 21, false);
            assert_eq!(collect(&mut rx, 1).await[0].1.source, Source::Cache);
            assert_eq!(fake.calls.load(SeqCst), 2);
            // Five distinct tokens: never more than two calls at once.
            for i in 0..5 {
                submit(&format!("good-x{i}"), 30 + i, false);
            }
            collect(&mut rx, 5).await;
            assert_eq!(fake.calls.load(SeqCst), 7);
            assert_eq!(fake.peak.load(SeqCst), 2);
            // No answer: refused at the deadline, not cached. Beyond the
            // queue bound: busy at once.
            for i in 0..10 {
                submit(&format!("slow-{i}"), 40 + i, false);
            }
            let got = collect(&mut rx, 10).await;
            let busy = got
                .iter()
                .filter(|(_, o)| {
                    matches!(
                        o.verdict,
                        Verdict::Refused {
                            reason: Refusal::Busy,
                            ..
                        }
                    )
                })
                .count();
            let late = got
                .iter()
                .filter(|(_, o)| {
                    matches!(
                        o.verdict,
                        Verdict::Refused {
                            reason: Refusal::Timeout,
                            ..
                        }
                    )
                })
                .count();
            assert_eq!((busy, late), (2, 8), "{got:?}");
            assert_eq!(fake.peak.load(SeqCst), 2);
        });
    }
}
