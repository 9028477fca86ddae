//! The agent's `/debug/connections` (admin port, konn only): the open
//! tunnelled connections of every tunnel — each endpoint (dialled
//! destination) with its server, destination, age, bytes each way and
//! flow-control state — so an operator on a node can see what the control
//! plane holds open there, and which connection is paused or stuck.
//!
//! Endpoints live on their tunnel's worker (`Rc` state), so the admin
//! port's worker reads its own live and the others' from a
//! [`Board`]: after a request every worker publishes its listing at most
//! every [`REFRESH`](konn_core::http1::board::REFRESH) for a minute
//! (`run::worker`). The answer says whether it is `complete`.
//!
//! ```json
//! {"connections":[{"worker":0,"server":"server-1","connection_id":3,
//!  "destination":"10.0.3.7:10250","state":"flowing","age_seconds":12.031,
//!  "bytes_to_destination":512,"bytes_from_destination":40960,
//!  "flow":{"queued":0,"withheld":0,"pause_sent":false,
//!  "paused_by_server":false,"stalled_seconds":null}}],"complete":true}
//! ```
//!
//! Filters: `?server=SERVER_ID`, `?destination=HOST:PORT`. Reverse
//! connections (KEP-2025) are not listed (`konn_reverse_*` metrics).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use konn_core::http1::board::Board;
use konn_core::http1::response::json_string;
use konn_protocol::agent::tunnel::EndpointFlow;

/// One endpoint (or dial in flight) as `/debug/connections` lists it.
#[derive(Debug, Clone)]
pub struct EndpointInfo {
    /// The worker holding its tunnel.
    pub worker: usize,
    /// The tunnel's server (`serverid`).
    pub server: Option<Arc<str>>,
    /// The agent's connectID.
    pub connection_id: i64,
    /// The dial's address, as the server sent it.
    pub destination: Arc<str>,
    /// When the dial arrived.
    pub started: Instant,
    /// Payload bytes written to the destination so far.
    pub bytes_to_destination: u64,
    /// Payload bytes read from the destination so far.
    pub bytes_from_destination: u64,
    /// Its flow-control state (`None`: still dialling).
    pub flow: Option<EndpointFlow>,
    /// When this was taken (ages are computed against it).
    pub at: Instant,
}

/// The workers' listings.
pub type EndpointBoard = Board<EndpointInfo>;

/// The filters of a request's query.
#[derive(Debug, Default, PartialEq, Eq)]
struct Filter {
    server: Option<String>,
    destination: Option<String>,
}

impl Filter {
    fn parse(query: Option<&str>) -> Self {
        let mut f = Self::default();
        if let Some(q) = query
            && let Ok(pairs) = konn_frames::url::parse_query(q)
        {
            for (k, v) in pairs {
                let v = String::from_utf8_lossy(&v).into_owned();
                match &*k {
                    b"server" => f.server = Some(v),
                    b"destination" => f.destination = Some(v),
                    _ => {}
                }
            }
        }
        f
    }

    fn keeps(&self, e: &EndpointInfo) -> bool {
        self.server
            .as_deref()
            .is_none_or(|s| e.server.as_deref() == Some(s))
            && self
                .destination
                .as_deref()
                .is_none_or(|d| &*e.destination == d)
    }
}

/// The answer to `/debug/connections?query` at `now`: `mine` (the asking
/// worker's, read live) and the other workers' latest listings, filtered,
/// oldest first.
pub fn connections_json(
    mut mine: Vec<EndpointInfo>,
    board: &EndpointBoard,
    asking: usize,
    query: Option<&str>,
    now: Instant,
) -> Vec<u8> {
    let filter = Filter::parse(query);
    let others = board.collect(asking, now);
    for list in &others.lists {
        mine.extend(list.iter().cloned());
    }
    mine.retain(|e| filter.keeps(e));
    mine.sort_by_key(|e| (e.started, e.worker, e.connection_id));
    render(&mine, now, others.missing == 0)
}

fn render(all: &[EndpointInfo], now: Instant, complete: bool) -> Vec<u8> {
    let mut out = String::from("{\"connections\":[");
    for (i, e) in all.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{{\"worker\":{},\"server\":", e.worker);
        match &e.server {
            Some(s) => json_string(&mut out, s),
            None => out.push_str("null"),
        }
        let _ = write!(
            out,
            ",\"connection_id\":{},\"destination\":",
            e.connection_id
        );
        json_string(&mut out, &e.destination);
        let state = match &e.flow {
            None => "dialing",
            Some(f) if f.stuck => "stuck",
            Some(f) if f.pause_sent || f.read_paused => "paused",
            Some(_) => "flowing",
        };
        let age = e.at.saturating_duration_since(e.started) + now.saturating_duration_since(e.at);
        let _ = write!(
            out,
            ",\"state\":\"{state}\",\"age_seconds\":{:.3},\"bytes_to_destination\":{},\
             \"bytes_from_destination\":{},\"flow\":",
            age.as_secs_f64(),
            e.bytes_to_destination,
            e.bytes_from_destination,
        );
        match &e.flow {
            None => out.push_str("null"),
            Some(f) => {
                let _ = write!(
                    out,
                    "{{\"queued\":{},\"withheld\":{},\"pause_sent\":{},\"paused_by_server\":{},\
                     \"stalled_seconds\":",
                    f.queued, f.withheld, f.pause_sent, f.read_paused
                );
                match f.stalled_since {
                    Some(s) => {
                        let _ = write!(
                            out,
                            "{:.3}",
                            e.at.saturating_duration_since(s).as_secs_f64()
                        );
                    }
                    None => out.push_str("null"),
                }
                out.push('}');
            }
        }
        out.push('}');
    }
    let _ = writeln!(out, "],\"complete\":{complete}}}");
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn info(worker: usize, id: i64, server: &str, dest: &str, t: Instant) -> EndpointInfo {
        EndpointInfo {
            worker,
            server: Some(Arc::from(server)),
            connection_id: id,
            destination: Arc::from(dest),
            started: t,
            bytes_to_destination: 5,
            bytes_from_destination: 7,
            flow: Some(EndpointFlow {
                queued: 100,
                withheld: 0,
                pause_sent: true,
                read_paused: false,
                stalled_since: Some(t),
                stuck: false,
            }),
            at: t + Duration::from_secs(2),
        }
    }

    #[test]
    fn lists_filters_and_says_whether_complete() {
        let t = konn_core::io::clock::now();
        let board = EndpointBoard::new(2, t);
        let mut dialing = info(0, 2, "s1", "10.0.0.2:22", t + Duration::from_secs(1));
        dialing.flow = None;
        dialing.at = t + Duration::from_secs(2);
        let mine = vec![dialing, info(0, 1, "s1", "10.0.0.1:10250", t)];
        let now = t + Duration::from_secs(2);
        let json = |q: Option<&str>, board: &EndpointBoard| {
            let v = connections_json(mine.clone(), board, 0, q, now);
            String::from_utf8(v).unwrap()
        };
        let all = json(None, &board);
        assert_eq!(
            all,
            "{\"connections\":[{\"worker\":0,\"server\":\"s1\",\"connection_id\":1,\
             \"destination\":\"10.0.0.1:10250\",\"state\":\"paused\",\"age_seconds\":2.000,\
             \"bytes_to_destination\":5,\"bytes_from_destination\":7,\"flow\":{\"queued\":100,\
             \"withheld\":0,\"pause_sent\":true,\"paused_by_server\":false,\
             \"stalled_seconds\":2.000}},{\"worker\":0,\"server\":\"s1\",\"connection_id\":2,\
             \"destination\":\"10.0.0.2:22\",\"state\":\"dialing\",\"age_seconds\":1.000,\
             \"bytes_to_destination\":5,\"bytes_from_destination\":7,\"flow\":null}],\
             \"complete\":false}\n"
        );
        // Worker 1 publishes: complete, and its endpoint filtered by server.
        board.publish(1, vec![info(1, 1, "s2", "10.0.0.1:10250", t)], now);
        let both = json(None, &board);
        assert!(both.ends_with("\"complete\":true}\n"), "{both}");
        assert_eq!(both.matches("\"connection_id\"").count(), 3);
        let s2 = json(Some("server=s2"), &board);
        assert_eq!(s2.matches("\"worker\":1").count(), 1, "{s2}");
        assert_eq!(s2.matches("\"connection_id\"").count(), 1, "{s2}");
        let dest = json(Some("destination=10.0.0.1%3A10250"), &board);
        assert_eq!(dest.matches("\"connection_id\":1").count(), 2, "{dest}");
        assert!(json(Some("server=nobody"), &board).starts_with("{\"connections\":[]"));
    }
}
