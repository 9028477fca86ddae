//! Resume tokens and the server's table of parked tunnels.

use std::fmt;
use std::time::Instant;

/// A tunnel's resume token: 16 bytes the server's driver drew from its
/// random source when the tunnel was accepted. Carried as 32 lowercase
/// hex digits in the `konn-resume-token` header and metadata. `Debug`
/// never shows it (tokens are never logged).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ResumeToken([u8; 16]);

impl ResumeToken {
    /// A token from random bytes the caller drew.
    pub const fn from_random(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The hex form (32 lowercase digits).
    pub fn to_hex(&self) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(32);
        for b in self.0 {
            for nibble in [b >> 4, b & 15] {
                if let Some(&c) = HEX.get(usize::from(nibble)) {
                    s.push(char::from(c));
                }
            }
        }
        s
    }

    /// The token's bytes (the server's driver reads back what it put in
    /// them, e.g. the index of the core that issued it).
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The agent's metadata value presenting this token to the server
    /// `server_id`: `<hex>:<serverid>`, so a server picks its own tokens
    /// out of those of every parked tunnel.
    pub fn presented(&self, server_id: &str) -> String {
        format!("{}:{server_id}", self.to_hex())
    }

    /// Reads a [`presented`](Self::presented) value: the token, if it is
    /// addressed to `server_id`.
    pub fn parse_presented(value: &[u8], server_id: &str) -> Option<Self> {
        let (hex, rest) = value.split_at_checked(32)?;
        match rest.split_first() {
            Some((b':', id)) if id == server_id.as_bytes() => Self::parse(hex),
            _ => None,
        }
    }

    /// Parses the hex form; `None` unless exactly 32 hex digits.
    pub fn parse(s: &[u8]) -> Option<Self> {
        if s.len() != 32 {
            return None;
        }
        let mut out = [0u8; 16];
        for (o, pair) in out.iter_mut().zip(s.chunks_exact(2)) {
            let digit = |c: u8| char::from(c).to_digit(16);
            let (hi, lo) = match pair {
                [hi, lo] => (digit(*hi)?, digit(*lo)?),
                _ => return None,
            };
            *o = u8::try_from(hi << 4 | lo).ok()?;
        }
        Some(Self(out))
    }

    /// Compares in time independent of where the tokens differ.
    fn ct_eq(&self, other: &Self) -> bool {
        self.0
            .iter()
            .zip(other.0.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

impl fmt::Debug for ResumeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResumeToken(..)")
    }
}

/// Why a token did not resume a tunnel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimError {
    /// No parked tunnel has this token (never issued here, already
    /// resumed, expired and closed, or a restarted server).
    Unknown,
    /// The token is right but the agent is not the one that parked it
    /// (different agent ID or authenticated identity); the tunnel stays
    /// parked for its owner.
    WrongIdentity,
}

/// One parked tunnel.
#[derive(Debug)]
struct Parked<K> {
    token: ResumeToken,
    /// The agent's ID and its authenticated identity (certificate subject
    /// or service account), as the driver spells them.
    identity: (String, String),
    deadline: Instant,
    key: K,
}

/// The tunnels parked on one server core, waiting for their agent: at
/// most `max` of them (the oldest is dropped first), each until its
/// deadline. `K` is the caller's key for the parked backend.
#[derive(Debug)]
pub struct ParkTable<K> {
    parked: Vec<Parked<K>>,
    max: usize,
}

impl<K> ParkTable<K> {
    /// An empty table holding at most `max` tunnels.
    pub fn new(max: usize) -> Self {
        Self {
            parked: Vec::new(),
            max,
        }
    }

    /// Parks a tunnel until `deadline`. If the table is full, the tunnel
    /// parked the longest is evicted and returned (its connections close).
    pub fn park(
        &mut self,
        token: ResumeToken,
        agent_id: &str,
        identity: &str,
        deadline: Instant,
        key: K,
    ) -> Option<K> {
        let evicted = if self.parked.len() >= self.max.max(1) {
            (!self.parked.is_empty()).then(|| self.parked.remove(0).key)
        } else {
            None
        };
        self.parked.push(Parked {
            token,
            identity: (agent_id.to_owned(), identity.to_owned()),
            deadline,
            key,
        });
        evicted
    }

    /// A reconnecting agent presents `token`: the parked tunnel it names,
    /// if the agent ID and identity are those it was parked with and its
    /// deadline has not passed. Every entry is compared (in constant time
    /// per token), so timing reveals nothing about other tokens.
    pub fn claim(
        &mut self,
        token: &ResumeToken,
        agent_id: &str,
        identity: &str,
        now: Instant,
    ) -> Result<K, ClaimError> {
        let mut found = None;
        for (i, p) in self.parked.iter().enumerate() {
            if p.token.ct_eq(token) && p.deadline > now {
                found = Some(i);
            }
        }
        let i = found.ok_or(ClaimError::Unknown)?;
        let same = self
            .parked
            .get(i)
            .is_some_and(|p| p.identity.0 == agent_id && p.identity.1 == identity);
        if !same {
            return Err(ClaimError::WrongIdentity);
        }
        Ok(self.parked.swap_remove(i).key)
    }

    /// Removes and returns the tunnels whose window ended (their
    /// connections close as when resume is off).
    pub fn expire(&mut self, now: Instant) -> Vec<K> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.parked.len() {
            if self.parked.get(i).is_some_and(|p| p.deadline <= now) {
                out.push(self.parked.swap_remove(i).key);
            } else {
                i += 1;
            }
        }
        out
    }

    /// Removes the tunnel parked under `key` (closed before its window
    /// ended, e.g. to free memory); whether it was there.
    pub fn remove(&mut self, key: &K) -> bool
    where
        K: PartialEq,
    {
        let before = self.parked.len();
        self.parked.retain(|p| p.key != *key);
        self.parked.len() != before
    }

    /// Removes every parked tunnel (shutdown).
    pub fn drain(&mut self) -> impl Iterator<Item = K> + '_ {
        self.parked.drain(..).map(|p| p.key)
    }

    /// The earliest deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.parked.iter().map(|p| p.deadline).min()
    }

    /// Tunnels parked.
    pub fn len(&self) -> usize {
        self.parked.len()
    }

    /// Whether none is parked.
    pub fn is_empty(&self) -> bool {
        self.parked.is_empty()
    }
}
