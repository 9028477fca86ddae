//! The backend directory: which agents are connected, under which keys the
//! proxy strategies find them, and which one a dial goes to.
//!
//! Upstream semantics (backend_manager.go, desthost_backend_manager.go,
//! default_route_backend_manager.go):
//! - `default`: keyed by agent id; a random agent, preferring non-draining
//!   ones; always the *first* connection of that agent.
//! - `destHost`: keyed by every `ipv4`, `ipv6` and `host` identifier; exact
//!   match on the dial address with the port removed (no DNS); the first
//!   non-draining backend of that key, else the first draining one.
//! - `defaultRoute`: agents that sent `default-route=true`, chosen like
//!   `default`.
//! - Strategies are tried in the configured order; the first that finds a
//!   backend wins; "No agent available" when none does.
//!
//! The directory is sans-IO: randomness is passed in (`pick` takes a random
//! number), so selection is deterministic in tests. Each core keeps a replica;
//! entries name the core that owns the backend's tunnel.

use crate::maps::IdMap;
use std::collections::HashMap;

use konn_frames::url;

/// Identity of one backend (one agent tunnel): unique per server process.
pub type BackendId = u64;

/// The proxy strategies of `--proxy-strategies`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// `default`: any agent.
    Default,
    /// `destHost`: the agent that announced the destination host.
    DestHost,
    /// `defaultRoute`: agents announcing `default-route=true`.
    DefaultRoute,
}

impl Strategy {
    /// The flag spelling.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::DestHost => "destHost",
            Self::DefaultRoute => "defaultRoute",
        }
    }

    /// Parse one `--proxy-strategies` entry.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "default" => Some(Self::Default),
            "destHost" => Some(Self::DestHost),
            "defaultRoute" => Some(Self::DefaultRoute),
            _ => None,
        }
    }
}

/// What an agent announced in its `agentidentifiers` metadata (an URL query
/// string; unknown keys are ignored, as upstream does).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identifiers {
    /// `ipv4=` values.
    pub ipv4: Vec<String>,
    /// `ipv6=` values.
    pub ipv6: Vec<String>,
    /// `host=` values.
    pub host: Vec<String>,
    /// `cidr=` values (accepted, unused — as upstream).
    pub cidr: Vec<String>,
    /// `default-route=true`.
    pub default_route: bool,
}

impl Identifiers {
    /// Parse the metadata value (`application/x-www-form-urlencoded`)
    /// as Go's `url.ParseQuery` does (`konn_frames::url`), errors
    /// included. Decoded bytes that are not UTF-8 are replaced.
    ///
    /// # Errors
    ///
    /// Go's text of the problem.
    pub fn parse(query: &str) -> Result<Self, String> {
        let settings = url::parse_query(query).map_err(|e| e.to_string())?;
        let mut ids = Self::default();
        let mut default_route_seen = false;
        for (k, v) in settings {
            let v = String::from_utf8_lossy(&v).into_owned();
            match &*k {
                b"ipv4" => ids.ipv4.push(v),
                b"ipv6" => ids.ipv6.push(v),
                b"host" => ids.host.push(v),
                b"cidr" => ids.cidr.push(v),
                // Only the first value counts, parsed like strconv.ParseBool.
                b"default-route" if !default_route_seen => {
                    default_route_seen = true;
                    ids.default_route =
                        matches!(v.as_str(), "1" | "t" | "T" | "true" | "TRUE" | "True");
                }
                _ => {}
            }
        }
        Ok(ids)
    }
}

/// The host part of a dial address, as upstream's `RemovePortFromHost`: the
/// port is removed and IPv6 brackets are trimmed; nothing is resolved.
pub fn dest_host(address: &str) -> &str {
    if let Some(rest) = address.strip_prefix('[')
        && let Some(end) = rest.find(']')
    {
        return &rest[..end];
    }
    match address.rsplit_once(':') {
        // More than one colon without brackets: a bare IPv6 address.
        Some((host, _)) if !host.contains(':') => host,
        Some(_) => address,
        None => address,
    }
}

/// One backend as every core sees it.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The backend.
    pub id: BackendId,
    /// The agent's id (`agentid` metadata).
    pub agent_id: String,
    /// The agent's identifiers.
    pub identifiers: Identifiers,
    /// The worker that owns the tunnel.
    pub core: usize,
    /// The agent announced DRAIN.
    pub draining: bool,
    /// The agent negotiated konn's flow-control extension (PAUSE/RESUME).
    pub flow_control: bool,
}

/// Keys of one strategy → backends in connection order.
///
/// The lists live in a vector (insertion order, for the random start
/// index), so a random pick walks it without hashing a key; the map finds
/// a key's slot for additions, removals and the host lookup.
#[derive(Debug, Default)]
struct Storage {
    slot: HashMap<String, usize>,
    /// (key, its backends), each key once.
    lists: Vec<(String, Vec<BackendId>)>,
}

impl Storage {
    fn add(&mut self, key: &str, id: BackendId) {
        match self.slot.get(key).and_then(|&i| self.lists.get_mut(i)) {
            Some((_, v)) => {
                if !v.contains(&id) {
                    v.push(id);
                }
            }
            None => {
                self.slot.insert(key.to_owned(), self.lists.len());
                self.lists.push((key.to_owned(), vec![id]));
            }
        }
    }

    fn remove(&mut self, key: &str, id: BackendId) {
        let Some(&i) = self.slot.get(key) else {
            return;
        };
        let Some((_, v)) = self.lists.get_mut(i) else {
            return;
        };
        v.retain(|b| *b != id);
        if v.is_empty() {
            self.slot.remove(key);
            self.lists.swap_remove(i);
            // The last key moved into the freed slot.
            if let Some((moved, _)) = self.lists.get(i)
                && let Some(s) = self.slot.get_mut(moved)
            {
                *s = i;
            }
        }
    }

    fn get(&self, key: &str) -> Option<&[BackendId]> {
        let &i = self.slot.get(key)?;
        self.lists.get(i).map(|(_, v)| v.as_slice())
    }

    fn len(&self) -> usize {
        self.lists.len()
    }
}

/// The directory of connected backends (one replica per core).
#[derive(Debug)]
pub struct Directory {
    strategies: Vec<Strategy>,
    entries: IdMap<BackendId, Entry>,
    default: Storage,
    dest_host: Storage,
    default_route: Storage,
}

impl Directory {
    /// An empty directory using `strategies` in order.
    pub fn new(strategies: Vec<Strategy>) -> Self {
        Self {
            strategies,
            entries: IdMap::default(),
            default: Storage::default(),
            dest_host: Storage::default(),
            default_route: Storage::default(),
        }
    }

    /// The configured strategies.
    pub fn strategies(&self) -> &[Strategy] {
        &self.strategies
    }

    /// Register a backend.
    pub fn add(&mut self, e: Entry) {
        self.default.add(&e.agent_id, e.id);
        for k in e
            .identifiers
            .ipv4
            .iter()
            .chain(&e.identifiers.ipv6)
            .chain(&e.identifiers.host)
        {
            self.dest_host.add(k, e.id);
        }
        if e.identifiers.default_route {
            self.default_route.add(&e.agent_id, e.id);
        }
        self.entries.insert(e.id, e);
    }

    /// Forget a backend.
    pub fn remove(&mut self, id: BackendId) -> Option<Entry> {
        let e = self.entries.remove(&id)?;
        self.default.remove(&e.agent_id, id);
        for k in e
            .identifiers
            .ipv4
            .iter()
            .chain(&e.identifiers.ipv6)
            .chain(&e.identifiers.host)
        {
            self.dest_host.remove(k, id);
        }
        if e.identifiers.default_route {
            self.default_route.remove(&e.agent_id, id);
        }
        Some(e)
    }

    /// Mark a backend draining.
    pub fn set_draining(&mut self, id: BackendId) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.draining = true;
        }
    }

    /// Record whether a backend negotiated konn's flow-control extension.
    pub fn set_flow_control(&mut self, id: BackendId, on: bool) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.flow_control = on;
        }
    }

    /// A backend by id.
    pub fn get(&self, id: BackendId) -> Option<&Entry> {
        self.entries.get(&id)
    }

    /// All backends.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    /// Number of distinct keys of a strategy (upstream's `ready_backends`).
    pub fn ready_backends(&self, s: Strategy) -> usize {
        match s {
            Strategy::Default => self.default.len(),
            Strategy::DestHost => self.dest_host.len(),
            Strategy::DefaultRoute => self.default_route.len(),
        }
    }

    /// Ready as upstream's readiness: the first strategy has a backend.
    pub fn is_ready(&self) -> bool {
        self.strategies
            .first()
            .is_some_and(|s| self.ready_backends(*s) > 0)
    }

    /// Choose the backend for a dial to `address`; `random` seeds the start
    /// index of the random strategies, which prefer agents whose tunnel is on
    /// core `local` (so the flow needs no migration) among the non-draining
    /// ones.
    pub fn pick(&self, address: &str, random: u64, local: usize) -> Option<&Entry> {
        for s in &self.strategies {
            let found = match s {
                Strategy::Default => self.pick_random(&self.default, random, local),
                Strategy::DefaultRoute => self.pick_random(&self.default_route, random, local),
                Strategy::DestHost => self.pick_dest_host(dest_host(address)),
            };
            if let Some(id) = found {
                return self.entries.get(&id);
            }
        }
        None
    }

    /// Random key, first backend of it: local and non-draining first, then
    /// any non-draining, then draining.
    fn pick_random(&self, st: &Storage, random: u64, local: usize) -> Option<BackendId> {
        let n = st.len();
        if n == 0 {
            return None;
        }
        let start = (random % n as u64) as usize;
        let (mut remote, mut draining) = (None, None);
        for i in 0..n {
            let Some((_, list)) = st.lists.get((start + i) % n) else {
                continue;
            };
            let id = *list.first()?;
            let Some(e) = self.entries.get(&id) else {
                continue;
            };
            if e.draining {
                draining.get_or_insert(id);
            } else if e.core == local {
                return Some(id);
            } else {
                remote.get_or_insert(id);
            }
        }
        remote.or(draining)
    }

    fn pick_dest_host(&self, host: &str) -> Option<BackendId> {
        if host.is_empty() {
            return None;
        }
        let list = self.dest_host.get(host)?;
        list.iter()
            .copied()
            .find(|id| !self.entries.get(id).is_some_and(|e| e.draining))
            .or_else(|| list.first().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: BackendId, agent: &str, ids: &str) -> Entry {
        Entry {
            id,
            agent_id: agent.to_owned(),
            identifiers: Identifiers::parse(ids).unwrap(),
            core: 0,
            draining: false,
            flow_control: false,
        }
    }

    #[test]
    fn identifiers_parse_like_url_parse_query() {
        let ids = Identifiers::parse(
            "host=localhost&host=node1.mydomain.com&cidr=127.0.0.1/16&ipv4=1.2.3.4&ipv4=5.6.7.8&ipv6=%3A%3A1&default-route=true&zone=x",
        )
        .unwrap();
        assert_eq!(ids.host, ["localhost", "node1.mydomain.com"]);
        assert_eq!(ids.ipv4, ["1.2.3.4", "5.6.7.8"]);
        assert_eq!(ids.ipv6, ["::1"]);
        assert_eq!(ids.cidr, ["127.0.0.1/16"]);
        assert!(ids.default_route);
        assert_eq!(Identifiers::parse("").unwrap(), Identifiers::default());
        // Go's texts: upstream sends them to the agent after "fail to parse
        // url encoded string: ".
        assert_eq!(
            Identifiers::parse("host=%zz").unwrap_err(),
            "invalid URL escape \"%zz\""
        );
        assert_eq!(
            Identifiers::parse("host=%zz&a;b").unwrap_err(),
            "invalid semicolon separator in query"
        );
        assert!(
            !Identifiers::parse("default-route=false&default-route=true")
                .unwrap()
                .default_route
        );
    }

    #[test]
    fn a_removed_key_leaves_the_others_findable() {
        // The last key moves into a removed key's slot: its lookups and
        // picks must follow it.
        for strategy in [Strategy::DestHost, Strategy::Default] {
            let mut d = Directory::new(vec![strategy]);
            d.add(entry(1, "a", "host=n1"));
            d.add(entry(2, "b", "host=n2"));
            d.add(entry(3, "c", "host=n3"));
            d.remove(1);
            assert_eq!(d.ready_backends(strategy), 2);
            if strategy == Strategy::DestHost {
                assert_eq!(d.pick("n3:10250", 0, 0).unwrap().id, 3);
                assert_eq!(d.pick("n2:10250", 0, 0).unwrap().id, 2);
                assert!(d.pick("n1:10250", 0, 0).is_none());
                d.add(entry(4, "d", "host=n3"));
                d.remove(3);
                assert_eq!(d.pick("n3:10250", 0, 0).unwrap().id, 4);
            } else {
                let mut seen: Vec<_> = (0..4).map(|r| d.pick("x:1", r, 0).unwrap().id).collect();
                seen.sort_unstable();
                seen.dedup();
                assert_eq!(seen, [2, 3], "random picks reach every remaining agent");
            }
        }
    }

    #[test]
    fn dest_host_removes_the_port() {
        assert_eq!(dest_host("10.0.0.5:10250"), "10.0.0.5");
        assert_eq!(dest_host("[fd00::1]:443"), "fd00::1");
        assert_eq!(dest_host("node1"), "node1");
        assert_eq!(dest_host("fd00::1"), "fd00::1");
    }

    #[test]
    fn default_prefers_non_draining_and_first_connection() {
        let mut d = Directory::new(vec![Strategy::Default]);
        assert!(d.pick("a:1", 0, 0).is_none());
        assert!(!d.is_ready());
        d.add(entry(1, "a", ""));
        d.add(entry(2, "a", "")); // a second connection of agent a
        d.add(entry(3, "b", ""));
        assert!(d.is_ready());
        assert_eq!(d.ready_backends(Strategy::Default), 2);
        for r in 0..10 {
            let id = d.pick("x:1", r, 0).unwrap().id;
            assert!(id == 1 || id == 3, "never the second connection of a");
        }
        d.set_draining(1);
        for r in 0..10 {
            assert_eq!(d.pick("x:1", r, 0).unwrap().id, 3);
        }
        d.set_draining(3);
        assert!(
            d.pick("x:1", 0, 0).is_some(),
            "all draining: one is used anyway"
        );
        d.remove(1);
        d.remove(3);
        assert_eq!(d.pick("x:1", 0, 0).unwrap().id, 2);
        d.remove(2);
        assert!(!d.is_ready());
    }

    #[test]
    fn random_strategies_prefer_local_tunnels() {
        let mut d = Directory::new(vec![Strategy::Default]);
        let mut remote = entry(1, "a", "");
        remote.core = 1;
        d.add(remote);
        d.add(entry(2, "b", ""));
        for r in 0..10 {
            assert_eq!(d.pick("x:1", r, 0).unwrap().id, 2);
            assert_eq!(d.pick("x:1", r, 1).unwrap().id, 1);
        }
        d.set_draining(2);
        assert_eq!(
            d.pick("x:1", 0, 0).unwrap().id,
            1,
            "a remote agent beats a draining local one"
        );
    }

    #[test]
    fn dest_host_then_default() {
        let mut d = Directory::new(vec![Strategy::DestHost, Strategy::Default]);
        d.add(entry(1, "a", "ipv4=10.0.0.5&host=node1"));
        d.add(entry(2, "b", "ipv4=10.0.0.6"));
        assert_eq!(d.pick("10.0.0.6:10250", 0, 0).unwrap().id, 2);
        assert_eq!(d.pick("node1:22", 0, 0).unwrap().id, 1);
        // No exact match: fall back to default.
        assert!(d.pick("10.9.9.9:1", 0, 0).is_some());
        let only_dest = Directory::new(vec![Strategy::DestHost]);
        assert!(only_dest.pick("10.0.0.6:1", 0, 0).is_none());
    }

    #[test]
    fn default_route_only_lists_volunteers() {
        let mut d = Directory::new(vec![Strategy::DefaultRoute]);
        d.add(entry(1, "a", "ipv4=1.1.1.1"));
        assert!(d.pick("x:1", 0, 0).is_none());
        d.add(entry(2, "b", "default-route=true"));
        assert_eq!(d.pick("x:1", 7, 0).unwrap().id, 2);
        assert_eq!(d.ready_backends(Strategy::DefaultRoute), 1);
    }
}
