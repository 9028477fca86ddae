//! HTTP/2 conformance: runs the real h2spec (summerwind/h2spec v2.2.1, all
//! 146 server cases including the strict one) against konn's bare-HTTP/2
//! test server (`h2_support::server`) under every io engine, plaintext with
//! prior knowledge and TLS with ALPN `h2`.
//!
//! A failed case fails the test unless it is in [`EXCLUDED`], the list of
//! cases whose RFC 7540 expectation RFC 9113 changed, each with its reason
//! (docs/design/h2.md keeps the same list). The list is empty today: konn
//! passes every case. An excluded case that passes is reported too, so the
//! list cannot go stale.
//!
//! h2spec is found in `PATH` or `~/go/bin` (`scripts/test` installs it).
//! Without it the test fails and says so, unless `KONN_SKIP_H2SPEC=1`.

mod h2_support;
mod tls_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use h2_support::server::{ServerOpts, TestServer};
use konn_core::io::tls::ServerTlsOptions;
use tls_support::{Pki, TempDir};

/// Cases konn may fail, with why (RFC 7540 → RFC 9113 changes only).
const EXCLUDED: &[(&str, &str)] = &[];

/// Cases h2spec v2.2.1 runs with `--strict`.
const EXPECTED_CASES: usize = 146;

/// Longest a whole h2spec run may take (a passing run takes well under a
/// second; each failing case can wait for h2spec's 2 s timeout).
const RUN_DEADLINE: Duration = Duration::from_secs(180);

/// One h2spec case and its outcome.
#[derive(Debug)]
struct Case {
    /// `http2/5.1/12`-style id (section package plus position).
    id: String,
    /// Its description.
    desc: String,
    outcome: Outcome,
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Passed,
    Skipped,
    Failed(String),
}

fn find_h2spec() -> Option<PathBuf> {
    let in_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("h2spec"));
    let go_bin = std::env::var_os("GOBIN")
        .map(|g| PathBuf::from(g).join("h2spec"))
        .into_iter()
        .chain(std::env::var_os("GOPATH").map(|g| PathBuf::from(g).join("bin/h2spec")))
        .chain(std::env::var_os("HOME").map(|h| PathBuf::from(h).join("go/bin/h2spec")));
    in_path.chain(go_bin).find(|p| p.is_file())
}

/// The h2spec binary, or `None` when the run should be skipped.
///
/// # Panics
/// When h2spec is missing and skipping was not asked for.
fn h2spec_or_skip() -> Option<PathBuf> {
    if let Some(p) = find_h2spec() {
        return Some(p);
    }
    if std::env::var("KONN_SKIP_H2SPEC").as_deref() == Ok("1") {
        eprintln!("note: h2spec not found; skipped because KONN_SKIP_H2SPEC=1");
        return None;
    }
    panic!(
        "h2spec not found in PATH or ~/go/bin: run scripts/test (it installs h2spec with \
         `go install github.com/summerwind/h2spec/cmd/h2spec@v2.2.1+incompatible`), \
         or set KONN_SKIP_H2SPEC=1 to skip this test"
    );
}

/// Runs h2spec against `port` and returns every case from its JUnit report
/// with its text output (for failure messages).
fn run_h2spec(bin: &Path, port: u16, tls: bool, report: &Path) -> (Vec<Case>, String) {
    let mut cmd = Command::new(bin);
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-S", "-j"])
        .arg(report)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if tls {
        cmd.args(["-t", "-k"]);
    }
    let mut child = cmd.spawn().expect("start h2spec");
    let deadline = konn_core::io::clock::now() + RUN_DEADLINE;
    loop {
        if child.try_wait().expect("wait for h2spec").is_some() {
            break;
        }
        if konn_core::io::clock::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("h2spec did not finish within {RUN_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("h2spec output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let xml = std::fs::read_to_string(report)
        .unwrap_or_else(|e| panic!("no JUnit report from h2spec ({e}); output:\n{text}"));
    (parse_junit(&xml), text)
}

/// Reads h2spec's JUnit report: `<testcase package=".." classname="..">`
/// elements in run order, with a `<failure>`, `<error>` or `<skipped>`
/// child when they did not pass. A case's number is its position within
/// its package, as in h2spec's own output.
fn parse_junit(xml: &str) -> Vec<Case> {
    let mut cases: Vec<Case> = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find("<testcase ") {
        rest = &rest[start..];
        let open_end = rest.find('>').expect("testcase tag ends");
        let tag = &rest[..open_end];
        let (body, next) = if tag.ends_with('/') {
            ("", &rest[open_end + 1..])
        } else {
            let close = rest.find("</testcase>").expect("testcase closes");
            (&rest[open_end + 1..close], &rest[close..])
        };
        let package = attr(tag, "package");
        let n = cases
            .iter()
            .filter(|c| c.id.rsplit_once('/').is_some_and(|(p, _)| p == package))
            .count()
            + 1;
        let outcome = if body.contains("<failure") || body.contains("<error") {
            let why = ["<failure>", "</failure>", "<error>", "</error>"]
                .iter()
                .fold(body.trim().to_owned(), |s, tag| s.replace(tag, ""));
            Outcome::Failed(unescape(why.trim()))
        } else if body.contains("<skipped") {
            Outcome::Skipped
        } else {
            Outcome::Passed
        };
        cases.push(Case {
            id: format!("{package}/{n}"),
            desc: attr(tag, "classname"),
            outcome,
        });
        rest = next;
    }
    cases
}

fn attr(tag: &str, name: &str) -> String {
    let key = format!(" {name}=\"");
    let Some(i) = tag.find(&key) else {
        return String::new();
    };
    let v = &tag[i + key.len()..];
    unescape(&v[..v.find('"').unwrap_or(v.len())])
}

fn unescape(s: &str) -> String {
    s.replace("&#34;", "\"")
        .replace("&#39;", "'")
        .replace("&#xA;", "\n")
        .replace("&#x9;", "\t")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&amp;", "&")
}

/// Checks one run: every case passed or is excluded, nothing skipped, the
/// expected number of cases ran, and no exclusion is stale.
fn check(label: &str, cases: &[Case], text: &str) {
    let failed: Vec<&Case> = cases
        .iter()
        .filter(|c| matches!(c.outcome, Outcome::Failed(_)))
        .collect();
    let unexpected: Vec<String> = failed
        .iter()
        .filter(|c| !EXCLUDED.iter().any(|(id, _)| *id == c.id))
        .map(|c| match &c.outcome {
            Outcome::Failed(why) => format!("  {} {}\n    {}", c.id, c.desc, why),
            _ => unreachable!(),
        })
        .collect();
    assert!(
        unexpected.is_empty(),
        "{label}: h2spec cases failed:\n{}\n\nh2spec output:\n{text}",
        unexpected.join("\n")
    );
    let stale: Vec<&str> = EXCLUDED
        .iter()
        .filter(|(id, _)| {
            cases
                .iter()
                .any(|c| c.id == *id && c.outcome == Outcome::Passed)
        })
        .map(|(id, _)| *id)
        .collect();
    assert!(
        stale.is_empty(),
        "{label}: excluded cases now pass; drop them from EXCLUDED and docs/design/h2.md: {stale:?}"
    );
    let skipped: Vec<&str> = cases
        .iter()
        .filter(|c| c.outcome == Outcome::Skipped)
        .map(|c| c.id.as_str())
        .collect();
    assert!(skipped.is_empty(), "{label}: skipped cases {skipped:?}");
    assert_eq!(
        cases.len(),
        EXPECTED_CASES,
        "{label}: h2spec v2.2.1 --strict runs {EXPECTED_CASES} cases; a different count means \
         another h2spec version (update the pin in scripts/test and this test together)\n{text}"
    );
    let summary = format!("{EXPECTED_CASES} tests, ");
    assert!(
        text.contains(&summary),
        "{label}: h2spec's summary disagrees with its JUnit report:\n{text}"
    );
    eprintln!(
        "{label}: h2spec {} cases, {} passed, {} excluded",
        cases.len(),
        cases.len() - failed.len(),
        failed.len()
    );
}

fn run_under_every_engine(tls: bool) {
    let Some(bin) = h2spec_or_skip() else {
        return;
    };
    let dir = TempDir::new();
    let pki = tls.then(Pki::new);
    for engine in h2_support::engines() {
        let mut opts = ServerOpts::http();
        opts.tls = pki.as_ref().map(|p| {
            ServerTlsOptions::new(
                p.server.cert_source("server"),
                p.server.key_source("server"),
            )
            .build()
            .expect("server TLS")
        });
        let server = TestServer::start(engine, opts);
        let report = dir.path().join(format!("h2spec-{engine}-{tls}.xml"));
        let (cases, text) = run_h2spec(&bin, server.addr().port(), tls, &report);
        let label = format!("{engine}, {}", if tls { "TLS" } else { "plaintext" });
        check(&label, &cases, &text);
        // h2spec closes every connection it opens; the server must have
        // closed its side of each and ended every handler.
        server.wait_idle(Duration::from_secs(5));
        assert!(
            server
                .counters
                .conns_total
                .load(std::sync::atomic::Ordering::SeqCst)
                >= EXPECTED_CASES,
            "{label}: one connection per case"
        );
        server.stop();
    }
}

#[test]
fn h2spec_plaintext_prior_knowledge() {
    run_under_every_engine(false);
}

#[test]
fn h2spec_tls_alpn_h2() {
    run_under_every_engine(true);
}

#[test]
fn junit_parser_reads_cases_and_outcomes() {
    // The parser is what turns an h2spec failure into a test failure: check
    // it on a report with each outcome (h2spec's own element layout).
    let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites>
  <testsuite name="5.1. Stream States" package="http2/5.1" id="5.1" tests="3" skipped="1" failures="1" errors="0">
    <testcase package="http2/5.1" classname="idle: Sends a DATA frame" time="0.0002"></testcase>
    <testcase package="http2/5.1" classname="closed: Sends a &#34;HEADERS&#34; frame" time="2.0001">
      <failure>Expect:&#xA;GOAWAY Frame (Error Code: STREAM_CLOSED)&#xA;Actual:&#xA;RST_STREAM Frame</failure>
    </testcase>
    <testcase package="http2/5.1" classname="skipped one" time="0.0000">
      <skipped></skipped>
    </testcase>
  </testsuite>
  <testsuite name="6.3. PRIORITY" package="http2/6.3" id="6.3" tests="1" skipped="0" failures="0" errors="1">
    <testcase package="http2/6.3" classname="x" time="0.1"><error>dial tcp: refused</error></testcase>
  </testsuite>
</testsuites>"#;
    let cases = parse_junit(xml);
    let ids: Vec<&str> = cases.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        ids,
        ["http2/5.1/1", "http2/5.1/2", "http2/5.1/3", "http2/6.3/1"]
    );
    assert_eq!(cases[0].outcome, Outcome::Passed);
    assert_eq!(cases[1].desc, "closed: Sends a \"HEADERS\" frame");
    assert!(
        matches!(&cases[1].outcome, Outcome::Failed(why) if why.contains("STREAM_CLOSED)\nActual"))
    );
    assert_eq!(cases[2].outcome, Outcome::Skipped);
    assert!(matches!(&cases[3].outcome, Outcome::Failed(why) if why.contains("refused")));
}
