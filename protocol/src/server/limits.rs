//! Dial admission limits and the overload flag (sans-IO; docs/design/limits.md).
//!
//! One [`Limits`] per cluster is shared by that cluster's routers on every
//! core (`Arc`). A dial is admitted once, when the router has picked its
//! agent ([`Limits::admit`]); nothing here runs per packet. Four key
//! classes — the agent (`agentid`), the destination host, the frontend
//! identity and the cluster itself — each have an optional limit on
//! concurrent connections and an optional dial rate:
//!
//! - **Concurrency** is a counter per key, incremented at admission and
//!   decremented when the [`Permit`] is dropped (the router holds it in
//!   the pending dial, then for as long as its frontend lives). Counters are
//!   atomics shared across cores, so the limit is global and exact for one
//!   key; keys are hashed into [`SLOTS`] slots per class, so two keys that
//!   share a slot share a limit (conservative: never more than the limit
//!   per key, occasionally less).
//! - **Rate** is GCRA (a token bucket as one atomic "theoretical arrival
//!   time" per slot, updated with a compare-and-swap): `rate` dials per
//!   second with a burst of `burst`, global across cores, on the caller's
//!   clock (`now` is passed in).
//! - **Overload**: the IO layer reports memory use with
//!   [`Limits::observe_memory`]; above the watermark new dials are refused
//!   until use falls below the low mark (hysteresis). Established
//!   connections are never touched.
//! - **Retuning**: every setting is an atomic, so a reload of the
//!   cluster's configuration changes them in place
//!   ([`Limits::reconfigure`]) without touching a connection or losing a
//!   count. A `Limits` with nothing on admits every dial uncounted (one
//!   relaxed load), so a cluster may carry one from the start.
//!
//! Checks run in a fixed order (overload, then concurrency of agent,
//! destination, frontend, cluster, then their rates); the first refusal
//! wins and is reported as a typed [`Refusal`]. A refused dial releases
//! the concurrency it took; rate tokens an earlier class spent for it are
//! not returned.

use std::fmt;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

/// Slots per key class (a power of two).
pub const SLOTS: usize = 1024;

/// Why a dial was refused before it reached an agent (or, for
/// [`Refusal::DestinationNotAllowed`], by the agent). `as_str` is stable:
/// metrics labels and audit records use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The agent has `--max-agent-connections` connections.
    AgentConns,
    /// The agent is over `--max-agent-dial-rate`.
    AgentRate,
    /// The destination host has `--max-destination-connections`.
    DestConns,
    /// The destination host is over `--max-destination-dial-rate`.
    DestRate,
    /// The frontend identity has `--max-frontend-connections`.
    FrontendConns,
    /// The frontend identity is over `--max-frontend-dial-rate`.
    FrontendRate,
    /// The cluster has `--max-cluster-connections`.
    ClusterConns,
    /// The cluster is over `--max-cluster-dial-rate`.
    ClusterRate,
    /// Memory use is above `--overload-memory-watermark`.
    Overload,
    /// The agent's `--allowed-destination-cidrs` does not include the
    /// destination.
    DestinationNotAllowed,
}

impl Refusal {
    /// The stable name (metric label, audit reason).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::AgentConns => "limit_agent_conns",
            Self::AgentRate => "limit_agent_rate",
            Self::DestConns => "limit_dest_conns",
            Self::DestRate => "limit_dest_rate",
            Self::FrontendConns => "limit_frontend_conns",
            Self::FrontendRate => "limit_frontend_rate",
            Self::ClusterConns => "limit_cluster_conns",
            Self::ClusterRate => "limit_cluster_rate",
            Self::Overload => "overload",
            Self::DestinationNotAllowed => "destination_not_allowed",
        }
    }

    /// Every reason, for metrics set-up.
    pub const ALL: [Self; 10] = [
        Self::AgentConns,
        Self::AgentRate,
        Self::DestConns,
        Self::DestRate,
        Self::FrontendConns,
        Self::FrontendRate,
        Self::ClusterConns,
        Self::ClusterRate,
        Self::Overload,
        Self::DestinationNotAllowed,
    ];

    /// The DIAL_RSP error text of a refusal (the CONNECT 503 body too).
    pub fn message(self) -> String {
        format!("{REFUSED_PREFIX}{}", self.as_str())
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The end of the DIAL_RSP error a konn agent answers a dial outside its
/// `--allowed-destination-cidrs` with (after upstream's `dial tcp
/// <address>: `); the server audits such a dial as refused with
/// [`Refusal::DestinationNotAllowed`].
pub const NOT_ALLOWED: &str = "konn: destination not allowed by --allowed-destination-cidrs";

/// The start of every refusal's error text.
pub const REFUSED_PREFIX: &str = "konn: dial refused: ";

/// One class's limits; 0 switches a part off.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Limit {
    /// Concurrent connections (pending dials included).
    pub max_conns: u32,
    /// New dials per second.
    pub rate: f64,
    /// Dials an idle key may start at once (at least 1 when `rate` is on).
    pub burst: u32,
}

impl Limit {
    /// The flags' form: `max_conns` connections, `rate` dials per second
    /// with a burst of `rate` (0: off).
    pub fn new(max_conns: u32, rate: u32) -> Self {
        Self {
            max_conns,
            rate: f64::from(rate),
            burst: rate,
        }
    }

    fn on(&self) -> bool {
        self.max_conns > 0 || self.rate > 0.0
    }
}

/// What to limit (all off by default).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LimitsConfig {
    /// Per agent (`agentid`).
    pub agent: Limit,
    /// Per destination host (the dial address without its port).
    pub dest: Limit,
    /// Per frontend identity (the IO layer's name for the client; one
    /// identity for unauthenticated frontends).
    pub frontend: Limit,
    /// Per cluster (all of its dials).
    pub cluster: Limit,
    /// Memory watermark in bytes (0: no overload manager).
    pub overload_high: usize,
    /// Use below which an overloaded server admits dials again.
    pub overload_low: usize,
}

impl LimitsConfig {
    /// Whether anything is switched on.
    pub fn enabled(&self) -> bool {
        self.agent.on()
            || self.dest.on()
            || self.frontend.on()
            || self.cluster.on()
            || self.overload_high > 0
    }

    /// Set the overload manager's marks from a watermark given as a
    /// `fraction` of a memory `budget` (bytes): refused above it, admitted
    /// again below 90 % of it; 0 switches it off.
    pub fn set_watermark(&mut self, budget: usize, fraction: f64) {
        let high = (budget as f64 * fraction) as usize;
        self.overload_high = high;
        self.overload_low = high / 10 * 9;
    }
}

/// One slot of a class: its concurrency counter, GCRA state and refusals.
#[derive(Default)]
struct Slot {
    conns: AtomicU32,
    /// Theoretical arrival time, nanoseconds since the epoch.
    tat: AtomicU64,
    refused: AtomicU64,
}

/// One key class: its limit (atomics, so a reload can retune it in place:
/// [`Limits::reconfigure`]) and its slots.
struct Class {
    /// Slots once allocated.
    size: usize,
    max_conns: AtomicU32,
    /// The configured rate (`f64` bits), for [`Limits::config`].
    rate: AtomicU64,
    burst: AtomicU32,
    /// GCRA emission interval in nanoseconds (0: no rate).
    interval: AtomicU64,
    /// How far ahead of `now` the theoretical arrival time may run.
    tolerance: AtomicU64,
    /// Allocated the first time the class is on (or, for the agent class,
    /// whenever anything is: its counts are shown per agent), then kept:
    /// a class switched off still counts, so switching it on again finds
    /// its counters true.
    slots: OnceLock<Box<[Slot]>>,
}

impl Class {
    fn new(size: usize) -> Self {
        Self {
            size,
            max_conns: AtomicU32::new(0),
            rate: AtomicU64::new(0),
            burst: AtomicU32::new(0),
            interval: AtomicU64::new(0),
            tolerance: AtomicU64::new(0),
            slots: OnceLock::new(),
        }
    }

    /// Apply `limit` (allocating the slots if it is on or `always`). A
    /// changed rate starts every key's bucket full.
    fn set(&self, limit: Limit, always: bool) {
        if limit.on() || always {
            self.slots
                .get_or_init(|| (0..self.size).map(|_| Slot::default()).collect());
        }
        let interval = if limit.rate > 0.0 {
            // Saturating float → int conversion: tiny rates get one dial
            // per ~584 years.
            ((1e9 / limit.rate) as u64).max(1)
        } else {
            0
        };
        let burst = u64::from(limit.burst.max(1));
        let tolerance = interval.saturating_mul(burst);
        let old = (
            self.interval.load(Ordering::Relaxed),
            self.tolerance.load(Ordering::Relaxed),
        );
        if old != (interval, tolerance) {
            for s in self.slots() {
                s.tat.store(0, Ordering::Relaxed);
            }
        }
        self.interval.store(interval, Ordering::Relaxed);
        self.tolerance.store(tolerance, Ordering::Relaxed);
        self.rate.store(limit.rate.to_bits(), Ordering::Relaxed);
        self.burst.store(limit.burst, Ordering::Relaxed);
        self.max_conns.store(limit.max_conns, Ordering::Relaxed);
    }

    fn limit(&self) -> Limit {
        Limit {
            max_conns: self.max_conns.load(Ordering::Relaxed),
            rate: f64::from_bits(self.rate.load(Ordering::Relaxed)),
            burst: self.burst.load(Ordering::Relaxed),
        }
    }

    /// The slots (empty until the class was first on).
    fn slots(&self) -> &[Slot] {
        self.slots.get().map_or(&[], |s| s)
    }

    fn slot(&self, i: usize) -> Option<&Slot> {
        self.slots().get(i)
    }

    /// Take one concurrency unit of `slot`; false when at the limit.
    fn acquire(&self, slot: usize) -> bool {
        let Some(s) = self.slot(slot) else {
            return true;
        };
        let max = self.max_conns.load(Ordering::Relaxed);
        if max == 0 {
            s.conns.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        s.conns
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    fn release(&self, slot: usize) {
        if let Some(s) = self.slot(slot) {
            // Never below zero, whatever the order of events.
            let _ = s
                .conns
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        }
    }

    /// GCRA: one dial at `t` nanoseconds; false when over the rate.
    fn take_token(&self, slot: usize, t: u64) -> bool {
        let interval = self.interval.load(Ordering::Relaxed);
        let Some(s) = self.slot(slot).filter(|_| interval > 0) else {
            return true;
        };
        let tolerance = self.tolerance.load(Ordering::Relaxed);
        s.tat
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
                let next = old.max(t).saturating_add(interval);
                (next - t <= tolerance).then_some(next)
            })
            .is_ok()
    }

    fn refused(&self, slot: usize) {
        if let Some(s) = self.slot(slot) {
            s.refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The shared admission state of one cluster. See the module docs.
pub struct Limits {
    epoch: Instant,
    /// Anything on (else every dial is admitted uncounted).
    enabled: AtomicBool,
    agent: Class,
    dest: Class,
    frontend: Class,
    cluster: Class,
    overload_high: AtomicUsize,
    overload_low: AtomicUsize,
    overloaded: AtomicBool,
}

impl fmt::Debug for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limits")
            .field("cfg", &self.config())
            .field("overloaded", &self.overloaded())
            .finish_non_exhaustive()
    }
}

/// Which classes (agent, destination, frontend, cluster) a dial holds a
/// concurrency unit of, and in which slot.
type Held = [Option<usize>; 4];

/// One admitted dial's hold on the concurrency counters; dropping it
/// releases them.
#[derive(Debug, Default)]
pub struct Permit {
    limits: Option<Arc<Limits>>,
    held: Held,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(l) = self.limits.take() {
            l.release(self.held);
        }
    }
}

/// FNV-1a: a stable, fast hash for slot selection (no randomness needed:
/// a collision only makes two keys share a limit).
fn slot(key: &str) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h as usize) & (SLOTS - 1)
}

impl Limits {
    /// Limits per `cfg`, their rates on a clock that starts at `epoch`.
    pub fn new(cfg: LimitsConfig, epoch: Instant) -> Self {
        let l = Self {
            epoch,
            enabled: AtomicBool::new(false),
            agent: Class::new(SLOTS),
            dest: Class::new(SLOTS),
            frontend: Class::new(SLOTS),
            cluster: Class::new(1),
            overload_high: AtomicUsize::new(0),
            overload_low: AtomicUsize::new(0),
            overloaded: AtomicBool::new(false),
        };
        l.reconfigure(cfg);
        l
    }

    /// Retune in place (a reload of the cluster's settings): connections
    /// keep their permits and the counters stay true for every class that
    /// was on before; a class switched on counts the dials admitted from
    /// now on; a changed rate starts with full buckets. Admissions racing
    /// with it see the old or the new value of each setting.
    pub fn reconfigure(&self, cfg: LimitsConfig) {
        let on = cfg.enabled();
        self.agent.set(cfg.agent, on);
        self.dest.set(cfg.dest, false);
        self.frontend.set(cfg.frontend, false);
        self.cluster.set(cfg.cluster, false);
        self.overload_high
            .store(cfg.overload_high, Ordering::Relaxed);
        self.overload_low.store(cfg.overload_low, Ordering::Relaxed);
        if cfg.overload_high == 0 {
            self.overloaded.store(false, Ordering::Relaxed);
        }
        self.enabled.store(on, Ordering::Release);
    }

    /// The settings now.
    pub fn config(&self) -> LimitsConfig {
        LimitsConfig {
            agent: self.agent.limit(),
            dest: self.dest.limit(),
            frontend: self.frontend.limit(),
            cluster: self.cluster.limit(),
            overload_high: self.overload_high.load(Ordering::Relaxed),
            overload_low: self.overload_low.load(Ordering::Relaxed),
        }
    }

    /// Whether anything is on (a `Limits` with nothing on admits every
    /// dial uncounted).
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    /// Admit a dial to `agent` for `dest_host` from `frontend` at `now`,
    /// or say why not.
    pub fn admit(
        self: &Arc<Self>,
        now: Instant,
        agent: &str,
        dest_host: &str,
        frontend: &str,
    ) -> Result<Permit, Refusal> {
        if !self.enabled() {
            return Ok(Permit::default());
        }
        let slots = [slot(agent), slot(dest_host), slot(frontend), 0];
        if self.overloaded() {
            self.agent.refused(slots[0]);
            return Err(Refusal::Overload);
        }
        let classes = self.classes();
        const CONNS: [Refusal; 4] = [
            Refusal::AgentConns,
            Refusal::DestConns,
            Refusal::FrontendConns,
            Refusal::ClusterConns,
        ];
        const RATES: [Refusal; 4] = [
            Refusal::AgentRate,
            Refusal::DestRate,
            Refusal::FrontendRate,
            Refusal::ClusterRate,
        ];
        let mut permit = Permit {
            limits: Some(self.clone()),
            held: [None; 4],
        };
        for (i, (class, &s)) in classes.iter().zip(&slots).enumerate() {
            if class.slots().is_empty() {
                continue;
            }
            if !class.acquire(s) {
                self.agent.refused(slots[0]);
                return Err(CONNS.get(i).copied().unwrap_or(Refusal::ClusterConns));
            }
            if let Some(h) = permit.held.get_mut(i) {
                *h = Some(s);
            }
        }
        let t =
            u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        for (i, (class, &s)) in classes.iter().zip(&slots).enumerate() {
            if !class.take_token(s, t) {
                self.agent.refused(slots[0]);
                return Err(RATES.get(i).copied().unwrap_or(Refusal::ClusterRate));
            }
        }
        Ok(permit)
    }

    fn classes(&self) -> [&Class; 4] {
        [&self.agent, &self.dest, &self.frontend, &self.cluster]
    }

    fn release(&self, held: Held) {
        for (class, s) in self.classes().into_iter().zip(held) {
            if let Some(s) = s {
                class.release(s);
            }
        }
    }

    /// Report memory use in bytes; returns whether the server is
    /// overloaded now (above the watermark, or not yet below the low mark).
    pub fn observe_memory(&self, used: usize) -> bool {
        let high = self.overload_high.load(Ordering::Relaxed);
        if high == 0 {
            return false;
        }
        let was = self.overloaded();
        let now = if was {
            used >= self.overload_low.load(Ordering::Relaxed)
        } else {
            used > high
        };
        if now != was {
            self.overloaded.store(now, Ordering::Relaxed);
        }
        now
    }

    /// The memory watermark in bytes (0: no overload manager).
    pub fn overload_high(&self) -> usize {
        self.overload_high.load(Ordering::Relaxed)
    }

    /// Whether new dials are refused for memory.
    pub fn overloaded(&self) -> bool {
        self.overloaded.load(Ordering::Relaxed)
    }

    /// Connections (and pending dials) counted for `agent`, and its dials
    /// refused (by any limit or the overload manager), for
    /// `/debug/backends` (shared with any agent hashed to the same slot).
    pub fn agent_load(&self, agent: &str) -> (u32, u64) {
        self.agent.slot(slot(agent)).map_or((0, 0), |s| {
            (
                s.conns.load(Ordering::Relaxed),
                s.refused.load(Ordering::Relaxed),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limits(cfg: LimitsConfig) -> (Arc<Limits>, Instant) {
        let epoch = crate::test_epoch();
        (Arc::new(Limits::new(cfg, epoch)), epoch)
    }

    #[test]
    fn off_by_default_admits_everything_uncounted() {
        let cfg = LimitsConfig::default();
        assert!(!cfg.enabled());
        let (l, t) = limits(cfg);
        assert!(!l.enabled());
        let permits: Vec<_> = (0..10_000)
            .map(|_| l.admit(t, "a", "h", "f").unwrap())
            .collect();
        assert_eq!(l.agent_load("a"), (0, 0));
        drop(permits);
        // The agent class counts whenever anything is on.
        let mut cfg = LimitsConfig::default();
        cfg.dest.max_conns = 1_000_000;
        let (l, t) = limits(cfg);
        let permits: Vec<_> = (0..10_000)
            .map(|_| l.admit(t, "a", "h", "f").unwrap())
            .collect();
        assert_eq!(l.agent_load("a"), (10_000, 0), "counted, not limited");
        drop(permits);
        assert_eq!(l.agent_load("a"), (0, 0));
    }

    #[test]
    fn reconfigure_retunes_in_place_and_keeps_the_counts() {
        let mut cfg = LimitsConfig::default();
        cfg.agent.max_conns = 1;
        let (l, t) = limits(cfg);
        let p1 = l.admit(t, "a", "h", "f").unwrap();
        assert_eq!(l.admit(t, "a", "h", "f").unwrap_err(), Refusal::AgentConns);
        // Raised: one more fits, the held one still counts.
        cfg.agent.max_conns = 2;
        l.reconfigure(cfg);
        assert_eq!(l.config(), cfg);
        let p2 = l.admit(t, "a", "h", "f").unwrap();
        assert_eq!(l.admit(t, "a", "h", "f").unwrap_err(), Refusal::AgentConns);
        assert_eq!(l.agent_load("a"), (2, 2));
        // A class switched on counts what it admits from now on.
        cfg.dest.max_conns = 1;
        cfg.agent.max_conns = 0;
        l.reconfigure(cfg);
        let p3 = l.admit(t, "a", "h", "f").unwrap();
        assert_eq!(l.admit(t, "a", "h", "f").unwrap_err(), Refusal::DestConns);
        drop((p1, p2));
        assert_eq!(l.admit(t, "a", "h", "f").unwrap_err(), Refusal::DestConns);
        drop(p3);
        assert_eq!(l.agent_load("a").0, 0);
        let p4 = l.admit(t, "a", "h", "f").unwrap();
        // All off: nothing refused or counted; on again, counts still true.
        l.reconfigure(LimitsConfig::default());
        assert!(!l.enabled());
        let more: Vec<_> = (0..5).map(|_| l.admit(t, "a", "h", "f").unwrap()).collect();
        l.reconfigure(cfg);
        assert_eq!(l.admit(t, "a", "h", "f").unwrap_err(), Refusal::DestConns);
        drop((p4, more));
        assert!(l.admit(t, "a", "h", "f").is_ok());
    }

    #[test]
    fn reconfigure_rates_and_the_watermark() {
        let mut cfg = LimitsConfig::default();
        cfg.cluster.rate = 1.0;
        cfg.cluster.burst = 1;
        let (l, t) = limits(cfg);
        assert!(l.admit(t, "a", "h", "f").is_ok());
        assert_eq!(l.admit(t, "a", "h", "f").unwrap_err(), Refusal::ClusterRate);
        // A new rate starts with a full bucket.
        cfg.cluster.rate = 10.0;
        cfg.cluster.burst = 2;
        l.reconfigure(cfg);
        assert!(l.admit(t, "a", "h", "f").is_ok());
        assert!(l.admit(t, "a", "h", "f").is_ok());
        assert_eq!(l.admit(t, "a", "h", "f").unwrap_err(), Refusal::ClusterRate);
        // The overload manager switched off lets dials in at once.
        cfg.overload_high = 100;
        cfg.overload_low = 90;
        l.reconfigure(cfg);
        assert!(l.observe_memory(101));
        cfg.overload_high = 0;
        cfg.overload_low = 0;
        l.reconfigure(cfg);
        assert!(!l.overloaded());
        assert!(!l.observe_memory(usize::MAX));
    }

    #[test]
    fn agent_concurrency_refuses_only_that_agent_and_recovers_on_drop() {
        let mut cfg = LimitsConfig::default();
        cfg.agent.max_conns = 2;
        let (l, t) = limits(cfg);
        let p1 = l.admit(t, "a", "h1", "f").unwrap();
        let _p2 = l.admit(t, "a", "h2", "f").unwrap();
        assert_eq!(l.admit(t, "a", "h3", "f").unwrap_err(), Refusal::AgentConns);
        assert_eq!(l.agent_load("a"), (2, 1));
        // Another agent is not affected.
        let _q = l.admit(t, "b", "h1", "f").unwrap();
        drop(p1);
        assert_eq!(l.agent_load("a"), (1, 1));
        assert!(l.admit(t, "a", "h3", "f").is_ok());
        // The refused admission held nothing.
        assert_eq!(l.agent_load("a"), (1, 1));
    }

    #[test]
    fn a_refusal_by_a_later_class_releases_the_earlier_ones() {
        let mut cfg = LimitsConfig::default();
        cfg.agent.max_conns = 10;
        cfg.dest.max_conns = 1;
        let (l, t) = limits(cfg);
        let _p = l.admit(t, "a", "h", "f").unwrap();
        assert_eq!(l.admit(t, "a", "h", "f").unwrap_err(), Refusal::DestConns);
        assert_eq!(l.agent_load("a").0, 1);
        assert!(l.admit(t, "a", "other", "f").is_ok());
    }

    #[test]
    fn frontend_and_cluster_concurrency() {
        let mut cfg = LimitsConfig::default();
        cfg.frontend.max_conns = 1;
        cfg.cluster.max_conns = 2;
        let (l, t) = limits(cfg);
        let _a = l.admit(t, "a", "h", "f1").unwrap();
        assert_eq!(
            l.admit(t, "a", "h", "f1").unwrap_err(),
            Refusal::FrontendConns
        );
        let _b = l.admit(t, "a", "h", "f2").unwrap();
        assert_eq!(
            l.admit(t, "a", "h", "f3").unwrap_err(),
            Refusal::ClusterConns
        );
    }

    #[test]
    fn rate_allows_the_burst_then_one_per_interval() {
        let mut cfg = LimitsConfig::default();
        cfg.dest.rate = 10.0;
        cfg.dest.burst = 3;
        let (l, t) = limits(cfg);
        for _ in 0..3 {
            assert!(l.admit(t, "a", "h", "f").is_ok());
        }
        assert_eq!(l.admit(t, "a", "h", "f").unwrap_err(), Refusal::DestRate);
        // Another destination has its own bucket.
        assert!(l.admit(t, "a", "other", "f").is_ok());
        // 100 ms later one more token.
        let t2 = t + Duration::from_millis(100);
        assert!(l.admit(t2, "a", "h", "f").is_ok());
        assert_eq!(l.admit(t2, "a", "h", "f").unwrap_err(), Refusal::DestRate);
        // A long idle period refills to the burst, not beyond.
        let t3 = t2 + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(l.admit(t3, "a", "h", "f").is_ok());
        }
        assert!(l.admit(t3, "a", "h", "f").is_err());
    }

    #[test]
    fn agent_and_cluster_rates() {
        let mut cfg = LimitsConfig::default();
        cfg.agent.rate = 1.0;
        cfg.agent.burst = 1;
        cfg.cluster.rate = 1.0;
        cfg.cluster.burst = 2;
        let (l, t) = limits(cfg);
        assert!(l.admit(t, "a", "h", "f").is_ok());
        assert_eq!(l.admit(t, "a", "h", "f").unwrap_err(), Refusal::AgentRate);
        assert!(l.admit(t, "b", "h", "f").is_ok());
        assert_eq!(l.admit(t, "c", "h", "f").unwrap_err(), Refusal::ClusterRate);
        assert_eq!(l.agent_load("a").1, 1);
    }

    #[test]
    fn overload_has_hysteresis_and_refuses_first() {
        let cfg = LimitsConfig {
            overload_high: 1000,
            overload_low: 800,
            ..LimitsConfig::default()
        };
        assert!(cfg.enabled());
        let (l, t) = limits(cfg);
        assert!(!l.observe_memory(1000));
        assert!(l.admit(t, "a", "h", "f").is_ok());
        assert!(l.observe_memory(1001));
        assert_eq!(l.admit(t, "a", "h", "f").unwrap_err(), Refusal::Overload);
        assert!(l.observe_memory(900), "still above the low mark");
        assert!(!l.observe_memory(799));
        assert!(l.admit(t, "a", "h", "f").is_ok());
        // Off: never overloaded.
        let (off, _) = limits(LimitsConfig::default());
        assert!(!off.observe_memory(usize::MAX));
    }

    #[test]
    fn concurrent_admissions_across_threads_never_exceed_the_limit() {
        let mut cfg = LimitsConfig::default();
        cfg.agent.max_conns = 50;
        let (l, t) = limits(cfg);
        let held: Vec<Vec<Permit>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let l = l.clone();
                    s.spawn(move || {
                        (0..100)
                            .filter_map(|_| l.admit(t, "a", "h", "f").ok())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(held.iter().map(Vec::len).sum::<usize>(), 50);
        drop(held);
        assert_eq!(l.agent_load("a").0, 0);
    }

    #[test]
    fn reasons_are_stable() {
        let names: Vec<_> = Refusal::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names[0], "limit_agent_conns");
        assert_eq!(names[3], "limit_dest_rate");
        assert_eq!(names[8], "overload");
        assert_eq!(names[9], "destination_not_allowed");
        assert_eq!(Refusal::Overload.message(), "konn: dial refused: overload");
    }
}
