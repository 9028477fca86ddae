//! Which proxy-servers the agent holds tunnels to, and when it dials the
//! next one: upstream's `ClientSet` sync policy (reference §6.1), sans-IO.
//!
//! The agent is given one address, normally a load balancer in front of N
//! servers, and keeps dialling through it until it holds tunnels to
//! `server_count` distinct `serverid`s. [`ServerSet`] holds the decisions;
//! the runtime (`crate::run`) performs them:
//!
//! 1. Each round starts with [`ServerSet::round`]: nothing while draining;
//!    nothing when the set is full (unless `--sync-forever`); else dial.
//! 2. A tunnel whose server answered is offered to [`ServerSet::admit`]: a
//!    new `serverid` joins the set and its `servercount` becomes the count
//!    to reach; a `serverid` already held is a duplicate, which the runtime
//!    closes.
//! 3. [`ServerSet::pause`] says how long to sleep before the next round:
//!    after a success, a duplicate or an idle round the jittered sync
//!    interval (and the backoff starts over); after an error the next step
//!    of the backoff (×1.5 per failure, capped, 10 % jitter).
//! 4. A tunnel that ends leaves the set ([`ServerSet::remove`]); the next
//!    round replaces it.
//!
//! The server count ([`ServerSet::server_count`], upstream's
//! `aggregateServerCounter`) comes from [`CountSource`]:
//! - responses: the `servercount` of the last *new* server (a duplicate
//!   never changes it), 1 until a server has answered or when a server said
//!   0;
//! - leases (`--count-server-leases`): the number of valid server Leases,
//!   handed in by the runtime with [`ServerSet::set_lease_count`] whenever
//!   it changes (konn watches the Leases; 1 until the first count, and 0
//!   counts as 1);
//! - max (`--server-count-source=max`): the larger of the two.
//!
//! Times are upstream's `wait.Jitter(d, 0.1)` = `d + r·0.1·d` with `r`
//! uniform in `[0, 1)`, and `wait.Backoff{Duration: interval, Factor: 1.5,
//! Jitter: 0.1, Cap: cap}.Step()`: the returned pause is the current step
//! jittered; the next step is the current one × 1.5, and once that would
//! pass the cap it stays at the cap. Randomness comes from a small
//! splitmix64 generator ([`Rng`]) that the runtime seeds; it only spreads
//! agents apart in time.

use std::collections::HashMap;
use std::time::Duration;

/// The id the runtime gives each tunnel attempt.
pub type TunnelId = u64;

/// Growth of the backoff per consecutive failure (upstream: 1.5).
pub const BACKOFF_FACTOR: f64 = 1.5;

/// Jitter of every pause (upstream: 0.1, i.e. up to +10 %).
pub const JITTER: f64 = 0.1;

/// How long the agent waits for a server's response headers (TCP connect,
/// TLS, the Connect call) before it gives up on that attempt. Upstream has
/// no bound ("TODO: this is a blocking call. Add a timeout?"), so one server
/// stuck in authentication stalls its whole sync loop.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the number of servers to hold comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CountSource {
    /// The servers' `servercount` headers (no lease counting).
    #[default]
    Responses,
    /// The valid server Leases (`--count-server-leases`).
    Leases,
    /// The larger of the two (`--count-server-leases
    /// --server-count-source=max`).
    Max,
}

/// The sync policy's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncConfig {
    /// `--sync-interval`: first backoff step and the steady pause.
    pub interval: Duration,
    /// `--sync-interval-cap`: the longest backoff step (raised to
    /// `interval` if smaller).
    pub interval_cap: Duration,
    /// `--sync-forever`: dial every interval even with a full set, to find
    /// servers added later.
    pub sync_forever: bool,
    /// Bound on one attempt, dial to response headers
    /// ([`DEFAULT_HEADER_TIMEOUT`]).
    pub header_timeout: Duration,
    /// Where the server count comes from.
    pub count_source: CountSource,
}

impl Default for SyncConfig {
    /// Upstream's defaults: 1 s, capped at 10 s, not forever.
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            interval_cap: Duration::from_secs(10),
            sync_forever: false,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            count_source: CountSource::Responses,
        }
    }
}

/// A small, fast, non-cryptographic random source (splitmix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform value in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        // The top 53 bits fill an f64's mantissa exactly.
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `d + r·JITTER·d` (upstream's `wait.Jitter(d, 0.1)`), `r` in `[0, 1)`.
pub fn jitter(d: Duration, r: f64) -> Duration {
    d.saturating_add(d.mul_f64(r.clamp(0.0, 1.0) * JITTER))
}

/// Upstream's `wait.Backoff` with factor [`BACKOFF_FACTOR`] and jitter
/// [`JITTER`] (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    current: Duration,
}

impl Backoff {
    /// Steps from `base` up to `cap` (raised to `base` if smaller).
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap: cap.max(base),
            current: base,
        }
    }

    /// Start over at the base.
    pub fn reset(&mut self) {
        self.current = self.base;
    }

    /// The current step without jitter.
    pub fn current(&self) -> Duration {
        self.current
    }

    /// The pause for this failure (`r` in `[0, 1)` for the jitter); the
    /// next failure waits longer.
    pub fn step(&mut self, r: f64) -> Duration {
        let now = self.current;
        let next = now.mul_f64(BACKOFF_FACTOR);
        self.current = next.min(self.cap);
        jitter(now, r)
    }
}

/// What a sync round should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// The agent is draining: no new server connections.
    Draining,
    /// The set holds `server_count` servers already.
    Full {
        /// The count reached.
        server_count: usize,
    },
    /// Dial the server address once more.
    Connect {
        /// The count being aimed at.
        server_count: usize,
    },
}

/// The answer to [`ServerSet::admit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// A new server: the tunnel joined the set.
    New,
    /// The set already holds a tunnel to this server: close the new one.
    Duplicate,
}

/// How a round ended, for [`ServerSet::pause`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A new server joined, or there was nothing to do.
    Ok,
    /// The server answering was one the set already holds.
    Duplicate,
    /// Dialling, TLS, the Connect call or its headers failed, or timed out.
    Failed,
}

/// The servers the agent holds tunnels to (upstream's `ClientSet`).
#[derive(Debug, Clone)]
pub struct ServerSet {
    cfg: SyncConfig,
    by_server: HashMap<String, TunnelId>,
    by_tunnel: HashMap<TunnelId, String>,
    last_server_count: usize,
    lease_count: Option<usize>,
    draining: bool,
    backoff: Backoff,
    rng: Rng,
}

impl ServerSet {
    /// An empty set; `rng` jitters the pauses.
    pub fn new(cfg: SyncConfig, rng: Rng) -> Self {
        Self {
            cfg,
            by_server: HashMap::new(),
            by_tunnel: HashMap::new(),
            last_server_count: 0,
            lease_count: None,
            draining: false,
            backoff: Backoff::new(cfg.interval, cfg.interval_cap),
            rng,
        }
    }

    /// The settings.
    pub fn config(&self) -> &SyncConfig {
        &self.cfg
    }

    /// How many servers to hold (see the module docs for the sources).
    pub fn server_count(&self) -> usize {
        let responses = self.last_server_count.max(1);
        let leases = self.lease_count.unwrap_or(1).max(1);
        match self.cfg.count_source {
            CountSource::Responses => responses,
            CountSource::Leases => leases,
            CountSource::Max => leases.max(responses),
        }
    }

    /// The number of valid server Leases changed; returns whether the
    /// server count changed with it (then the runtime should run a round
    /// now rather than after its pause).
    pub fn set_lease_count(&mut self, leases: usize) -> bool {
        let before = self.server_count();
        self.lease_count = Some(leases);
        self.server_count() != before
    }

    /// Servers held.
    pub fn len(&self) -> usize {
        self.by_server.len()
    }

    /// Whether no server is held.
    pub fn is_empty(&self) -> bool {
        self.by_server.is_empty()
    }

    /// The `serverid`s held, in no particular order.
    pub fn servers(&self) -> impl Iterator<Item = &str> {
        self.by_server.keys().map(String::as_str)
    }

    /// The tunnel held for `server_id`.
    pub fn tunnel_of(&self, server_id: &str) -> Option<TunnelId> {
        self.by_server.get(server_id).copied()
    }

    /// Stop connecting for good (first shutdown signal).
    pub fn set_draining(&mut self) {
        self.draining = true;
    }

    /// Whether the agent is draining.
    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// What this round should do (see the module docs).
    pub fn round(&self) -> Round {
        if self.draining {
            return Round::Draining;
        }
        let server_count = self.server_count();
        if !self.cfg.sync_forever && self.len() >= server_count {
            Round::Full { server_count }
        } else {
            Round::Connect { server_count }
        }
    }

    /// Tunnel `tunnel` reached server `server_id`, which reported
    /// `server_count` servers.
    pub fn admit(&mut self, tunnel: TunnelId, server_id: &str, server_count: usize) -> Admission {
        if self.by_server.contains_key(server_id) {
            return Admission::Duplicate;
        }
        self.by_server.insert(server_id.to_owned(), tunnel);
        self.by_tunnel.insert(tunnel, server_id.to_owned());
        // Only a new, unique server updates the count (upstream).
        self.last_server_count = server_count;
        Admission::New
    }

    /// Tunnel `tunnel` ended; returns its server if it was in the set.
    pub fn remove(&mut self, tunnel: TunnelId) -> Option<String> {
        let server = self.by_tunnel.remove(&tunnel)?;
        self.by_server.remove(&server);
        Some(server)
    }

    /// The pause before the next round after `outcome`.
    pub fn pause(&mut self, outcome: Outcome) -> Duration {
        let r = self.rng.next_f64();
        match outcome {
            Outcome::Ok | Outcome::Duplicate => {
                self.backoff.reset();
                jitter(self.cfg.interval, r)
            }
            Outcome::Failed => self.backoff.step(r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn set(forever: bool) -> ServerSet {
        ServerSet::new(
            SyncConfig {
                sync_forever: forever,
                ..SyncConfig::default()
            },
            Rng::new(7),
        )
    }

    #[test]
    fn count_defaults_to_one_and_follows_new_servers_only() {
        let mut s = set(false);
        assert_eq!(s.server_count(), 1);
        assert_eq!(s.round(), Round::Connect { server_count: 1 });
        assert_eq!(s.admit(1, "a", 3), Admission::New);
        assert_eq!(s.server_count(), 3);
        assert_eq!(s.round(), Round::Connect { server_count: 3 });
        // A duplicate's count is ignored.
        assert_eq!(s.admit(2, "a", 5), Admission::Duplicate);
        assert_eq!(s.server_count(), 3);
        assert_eq!(s.len(), 1);
        assert_eq!(s.tunnel_of("a"), Some(1));
        assert_eq!(s.admit(3, "b", 3), Admission::New);
        assert_eq!(s.admit(4, "c", 3), Admission::New);
        assert_eq!(s.round(), Round::Full { server_count: 3 });
        // A server reporting 0 falls back to 1.
        assert_eq!(s.admit(5, "d", 0), Admission::New);
        assert_eq!(s.server_count(), 1);
        let mut ids: Vec<_> = s.servers().collect();
        ids.sort_unstable();
        assert_eq!(ids, ["a", "b", "c", "d"]);
    }

    #[test]
    fn lease_counts_follow_upstream_sources() {
        let cfg = |count_source| SyncConfig {
            count_source,
            ..SyncConfig::default()
        };
        // Leases only: the responses' count is ignored.
        let mut s = ServerSet::new(cfg(CountSource::Leases), Rng::new(1));
        assert_eq!(s.server_count(), 1, "1 until the first count");
        assert_eq!(s.admit(1, "a", 5), Admission::New);
        assert_eq!(s.server_count(), 1);
        assert!(s.set_lease_count(3));
        assert_eq!(s.round(), Round::Connect { server_count: 3 });
        assert!(!s.set_lease_count(3), "no change");
        assert!(s.set_lease_count(0));
        assert_eq!(s.server_count(), 1, "0 counts as 1");
        // Max: the larger of the two.
        let mut m = ServerSet::new(cfg(CountSource::Max), Rng::new(1));
        m.set_lease_count(2);
        assert_eq!(m.server_count(), 2);
        m.admit(1, "a", 4);
        assert_eq!(m.server_count(), 4);
        assert!(m.set_lease_count(6));
        assert_eq!(m.server_count(), 6);
        assert!(m.set_lease_count(3));
        assert_eq!(m.server_count(), 4);
        // Without lease counting a lease count changes nothing.
        let mut r = ServerSet::new(SyncConfig::default(), Rng::new(1));
        assert!(!r.set_lease_count(9));
        assert_eq!(r.server_count(), 1);
    }

    #[test]
    fn an_ended_tunnel_leaves_the_set_and_is_replaced() {
        let mut s = set(false);
        s.admit(1, "a", 2);
        s.admit(2, "b", 2);
        assert_eq!(s.round(), Round::Full { server_count: 2 });
        assert_eq!(s.remove(99), None, "unknown tunnels are ignored");
        assert_eq!(s.remove(2), Some("b".to_owned()));
        assert_eq!(s.remove(2), None);
        assert_eq!(s.round(), Round::Connect { server_count: 2 });
        // The server can come back on another tunnel.
        assert_eq!(s.admit(3, "b", 2), Admission::New);
        assert_eq!(s.tunnel_of("b"), Some(3));
        assert!(!s.is_empty());
    }

    #[test]
    fn a_duplicate_tunnel_is_not_tracked() {
        let mut s = set(true);
        s.admit(1, "a", 1);
        assert_eq!(s.admit(2, "a", 1), Admission::Duplicate);
        assert_eq!(s.remove(2), None, "closing the duplicate changes nothing");
        assert_eq!(s.tunnel_of("a"), Some(1));
    }

    #[test]
    fn sync_forever_keeps_connecting_and_draining_stops_it() {
        let mut s = set(true);
        s.admit(1, "a", 1);
        assert_eq!(s.round(), Round::Connect { server_count: 1 });
        s.set_draining();
        assert!(s.is_draining());
        assert_eq!(s.round(), Round::Draining);
        let mut t = set(false);
        t.set_draining();
        assert_eq!(t.round(), Round::Draining, "even with an empty set");
    }

    #[test]
    fn jitter_adds_up_to_ten_percent() {
        assert_eq!(jitter(S, 0.0), S);
        assert_eq!(jitter(S, 0.5), Duration::from_millis(1050));
        assert!(jitter(S, 0.999_999) < Duration::from_millis(1100));
        assert_eq!(jitter(S, 7.0), Duration::from_millis(1100), "r is clamped");
        assert_eq!(jitter(Duration::ZERO, 0.5), Duration::ZERO);
    }

    #[test]
    fn backoff_grows_by_half_up_to_the_cap() {
        let mut b = Backoff::new(S, Duration::from_secs(4));
        let steps: Vec<u128> = (0..7).map(|_| b.step(0.0).as_millis()).collect();
        assert_eq!(steps, [1000, 1500, 2250, 3375, 4000, 4000, 4000]);
        b.reset();
        assert_eq!(b.current(), S);
        // With jitter each pause is within +10 % of its step.
        let p = b.step(0.5);
        assert_eq!(p, Duration::from_millis(1050));
        // A cap below the base is raised to it.
        let mut flat = Backoff::new(Duration::from_secs(2), S);
        assert_eq!(flat.step(0.0), Duration::from_secs(2));
        assert_eq!(flat.step(0.0), Duration::from_secs(2));
    }

    #[test]
    fn pauses_follow_upstream_sync() {
        let mut s = ServerSet::new(
            SyncConfig {
                interval: S,
                interval_cap: Duration::from_secs(10),
                ..SyncConfig::default()
            },
            Rng::new(1),
        );
        let within = |d: Duration, base_ms: u64| {
            let base = Duration::from_millis(base_ms);
            assert!(d >= base && d < base.mul_f64(1.1), "{d:?} vs {base:?}");
        };
        within(s.pause(Outcome::Failed), 1000);
        within(s.pause(Outcome::Failed), 1500);
        within(s.pause(Outcome::Failed), 2250);
        // A duplicate resets the backoff and waits one interval.
        within(s.pause(Outcome::Duplicate), 1000);
        within(s.pause(Outcome::Failed), 1000);
        within(s.pause(Outcome::Failed), 1500);
        within(s.pause(Outcome::Ok), 1000);
        within(s.pause(Outcome::Failed), 1000);
        for _ in 0..20 {
            s.pause(Outcome::Failed);
        }
        within(s.pause(Outcome::Failed), 10_000);
    }

    #[test]
    fn rng_is_uniform_enough_and_in_range() {
        let mut r = Rng::new(42);
        let mut sum = 0.0;
        for _ in 0..10_000 {
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
            sum += x;
        }
        let mean = sum / 10_000.0;
        assert!((0.45..0.55).contains(&mean), "{mean}");
        let (mut a, mut b) = (Rng::new(1), Rng::new(2));
        assert_ne!(a.next_u64(), b.next_u64(), "seeded differently");
    }
}
