//! A tiny authoritative DNS server over UDP for resolver tests: each query
//! is answered by a closure (so answers can change between queries, as in
//! DNS rebinding), with TTL 0 so nothing is cached. Enough of RFC 1035 for
//! glibc's stub resolver: one question per query, A, AAAA and CNAME
//! records, NXDOMAIN for unknown names.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// One resource record of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// An IPv4 address of the question's name (or of the last CNAME
    /// target before it).
    A(Ipv4Addr),
    /// An IPv6 address, likewise.
    Aaaa(Ipv6Addr),
    /// The name is an alias of this one; records after it belong to it.
    Cname(String),
}

/// Query type A.
pub const TYPE_A: u16 = 1;
/// Query type AAAA.
pub const TYPE_AAAA: u16 = 28;
const TYPE_CNAME: u16 = 5;

/// Answers a query for `name` (lower case, no trailing dot) of type
/// `qtype`: `None` is NXDOMAIN, an empty list "no records of that type".
pub type Answer = dyn Fn(&str, u16) -> Option<Vec<Record>> + Send + Sync;

/// A running server; stops on drop.
pub struct DnsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    queries: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl DnsServer {
    /// Serves queries arriving on `socket` (already bound: the caller
    /// chooses where, e.g. 127.0.0.1:53 inside a network namespace).
    pub fn start(socket: UdpSocket, answer: Box<Answer>) -> io::Result<Self> {
        let addr = socket.local_addr()?;
        socket.set_read_timeout(Some(Duration::from_millis(50)))?;
        let stop = Arc::new(AtomicBool::new(false));
        let queries = Arc::new(AtomicUsize::new(0));
        let (s, q) = (stop.clone(), queries.clone());
        let thread = std::thread::Builder::new()
            .name("test-dns".into())
            .spawn(move || serve(&socket, &*answer, &s, &q))?;
        Ok(Self {
            addr,
            stop,
            queries,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queries answered so far.
    pub fn queries(&self) -> usize {
        self.queries.load(Ordering::Relaxed)
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(socket: &UdpSocket, answer: &Answer, stop: &AtomicBool, queries: &AtomicUsize) {
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, from)) = socket.recv_from(&mut buf) else {
            continue;
        };
        if let Some(reply) = respond(&buf[..n], answer) {
            queries.fetch_add(1, Ordering::Relaxed);
            let _ = socket.send_to(&reply, from);
        }
    }
}

/// The reply to one query message, or `None` for what is not a query.
pub fn respond(query: &[u8], answer: &Answer) -> Option<Vec<u8>> {
    if query.len() < 12 || query[2] & 0x80 != 0 || u16::from_be_bytes([query[4], query[5]]) != 1 {
        return None;
    }
    // The question: labels up to the root, then type and class.
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*query.get(i)?);
        i += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(query.get(i..i + len)?).to_ascii_lowercase());
        i += len;
    }
    let qtype = u16::from_be_bytes([*query.get(i)?, *query.get(i + 1)?]);
    let question_end = i + 4;
    let question = query.get(12..question_end)?;
    let name = labels.join(".");
    let records = answer(&name, qtype);
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(&query[..2]);
    // QR, the query's opcode and RD; RA; rcode NOERROR or NXDOMAIN.
    out.push(0x80 | (query[2] & 0x79));
    out.push(0x80 | if records.is_none() { 3 } else { 0 });
    let records = records.unwrap_or_default();
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&(records.len() as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(question);
    // Each record's owner: the question's name (a pointer to offset 12),
    // then each CNAME's target in turn.
    let mut owner: Option<String> = None;
    for r in &records {
        match &owner {
            None => out.extend_from_slice(&[0xC0, 12]),
            Some(n) => encode_name(&mut out, n),
        }
        let (ty, rdata) = match r {
            Record::A(ip) => (TYPE_A, ip.octets().to_vec()),
            Record::Aaaa(ip) => (TYPE_AAAA, ip.octets().to_vec()),
            Record::Cname(target) => {
                let mut d = Vec::new();
                encode_name(&mut d, target);
                (TYPE_CNAME, d)
            }
        };
        out.extend_from_slice(&ty.to_be_bytes());
        out.extend_from_slice(&1u16.to_be_bytes()); // IN
        out.extend_from_slice(&0u32.to_be_bytes()); // TTL 0: never cached
        out.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        out.extend_from_slice(&rdata);
        if let Record::Cname(target) = r {
            owner = Some(target.clone());
        }
    }
    Some(out)
}

fn encode_name(out: &mut Vec<u8>, name: &str) {
    for label in name
        .trim_end_matches('.')
        .split('.')
        .filter(|l| !l.is_empty())
    {
        out.push(label.len().min(63) as u8);
        out.extend_from_slice(&label.as_bytes()[..label.len().min(63)]);
    }
    out.push(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        encode_name(&mut q, name);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&1u16.to_be_bytes());
        q
    }

    #[test]
    fn answers_a_cname_chain_and_nxdomain() {
        let answer: Box<Answer> = Box::new(|name, qtype| match (name, qtype) {
            ("alias.test", TYPE_A) => Some(vec![
                Record::Cname("localhost".into()),
                Record::A(Ipv4Addr::LOCALHOST),
            ]),
            ("alias.test", _) => Some(Vec::new()),
            _ => None,
        });
        let r = respond(&query("Alias.Test", TYPE_A), &*answer).unwrap();
        assert_eq!(&r[..2], &[0x12, 0x34]);
        assert_eq!(r[3] & 0x0f, 0, "NOERROR");
        assert_eq!(u16::from_be_bytes([r[6], r[7]]), 2, "two answers");
        assert!(r.ends_with(&[0, 1, 0, 1, 0, 0, 0, 0, 0, 4, 127, 0, 0, 1]));
        let r = respond(&query("alias.test", TYPE_AAAA), &*answer).unwrap();
        assert_eq!((r[3] & 0x0f, r[7]), (0, 0), "no AAAA records");
        let r = respond(&query("other.test", TYPE_A), &*answer).unwrap();
        assert_eq!(r[3] & 0x0f, 3, "NXDOMAIN");
        assert!(respond(&[0; 5], &*answer).is_none());
    }
}
