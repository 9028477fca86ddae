//! Logging tests: klog flag registration (checked against upstream's
//! `--help` and parse errors) and lines written through a real subscriber
//! into a `--log-file`.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::cli::{FlagSet, ParseError};

fn flag_set() -> FlagSet {
    let mut fs = FlagSet::new("t");
    LogConfig::register(&mut fs);
    fs
}

#[test]
fn registered_like_upstream() {
    // (name, pflag type, default as pflag renders it) from upstream v0.36.0.
    let want: &[(&str, &str, &str)] = &[
        ("add-dir-header", "bool", "false"),
        ("alsologtostderr", "bool", "false"),
        ("alsologtostderrthreshold", "severity", "0"),
        ("legacy-stderr-threshold-behavior", "bool", "true"),
        ("log-backtrace-at", "traceLocation", ":0"),
        ("log-dir", "string", ""),
        ("log-file", "string", ""),
        ("log-file-max-size", "uint64", "1800"),
        ("logtostderr", "bool", "true"),
        ("one-output", "bool", "false"),
        ("skip-headers", "bool", "false"),
        ("skip-log-headers", "bool", "false"),
        ("stderrthreshold", "severity", "2"),
        ("v", "Level", "4"),
        ("vmodule", "moduleSpec", ""),
    ];
    let fs = flag_set();
    let got: Vec<(&str, &str, &str)> = fs
        .flags()
        .into_iter()
        .map(|f| (f.name(), f.type_name(), f.default_text()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(fs.lookup("v").unwrap().shorthand(), Some('v'));
    assert_eq!(LogConfig::from_flags(&fs), LogConfig::default());
}

#[test]
fn help_lines_match_pflag_rendering() {
    let usage = flag_set().usage(crate::cli::Section::Upstream);
    for want in [
        "      --add-dir-header ",
        "      --alsologtostderrthreshold severity ",
        "      --log-backtrace-at traceLocation ",
        "      --log-file-max-size uint ",
        "  -v, --v Level ",
        "      --vmodule moduleSpec ",
    ] {
        assert!(usage.contains(want), "{want:?} in\n{usage}");
    }
    assert!(usage.contains("(default :0)"));
    assert!(usage.contains("(default 1800)"));
    assert!(usage.contains("(default 4)"));
    assert!(usage.contains("(default 2)"));
    assert!(!usage.contains("(default 0)"), "zero severity is not shown");
}

#[test]
fn klog_flag_errors_match_upstream() {
    // Each expected text is what upstream proxy-agent v0.36.0 prints.
    let cases: &[(&str, &str)] = &[
        (
            "--logtostderr=yes",
            r#"invalid argument "yes" for "--logtostderr" flag: parse error"#,
        ),
        (
            "--log-file-max-size=x",
            r#"invalid argument "x" for "--log-file-max-size" flag: parse error"#,
        ),
        (
            "--log-file-max-size=-1",
            r#"invalid argument "-1" for "--log-file-max-size" flag: parse error"#,
        ),
        (
            "--v=x",
            r#"invalid argument "x" for "-v, --v" flag: strconv.ParseInt: parsing "x": invalid syntax"#,
        ),
        (
            "--stderrthreshold=x",
            r#"invalid argument "x" for "--stderrthreshold" flag: strconv.ParseInt: parsing "x": invalid syntax"#,
        ),
        (
            "--vmodule=a",
            r#"invalid argument "a" for "--vmodule" flag: syntax error: expect comma-separated list of filename=N"#,
        ),
        (
            "--vmodule=a=-1",
            r#"invalid argument "a=-1" for "--vmodule" flag: negative value for vmodule level"#,
        ),
        (
            "--log-backtrace-at=:0",
            r#"invalid argument ":0" for "--log-backtrace-at" flag: syntax error: expect file.go:234"#,
        ),
    ];
    for &(arg, want) in cases {
        let err = flag_set().parse([arg]).unwrap_err();
        assert_eq!(err.to_string(), want, "{arg}");
    }
    assert_eq!(
        flag_set().parse(["--log_dir=/tmp"]).unwrap_err(),
        ParseError::UnknownFlag("log_dir".to_owned())
    );
}

#[test]
fn klog_flags_parse() {
    let mut fs = flag_set();
    fs.parse([
        "-v3",
        "--logtostderr=false",
        "--alsologtostderr",
        "--stderrthreshold=warning",
        "--alsologtostderrthreshold=ERROR",
        "--log-file=/tmp/x.log",
        "--log-file-max-size=0x10",
        "--vmodule=runtime=5",
        "--log-backtrace-at=runtime.rs:7",
        "--skip-headers",
        "--one-output=true",
        "--add-dir-header",
        "--skip-log-headers",
        "--legacy-stderr-threshold-behavior=false",
        "--log-dir=/var/log",
    ])
    .unwrap();
    let c = LogConfig::from_flags(&fs);
    assert_eq!(c.verbosity, 3);
    assert!(!c.log_to_stderr && c.also_log_to_stderr);
    assert_eq!(c.stderr_threshold, Severity::WARNING);
    assert_eq!(c.also_log_to_stderr_threshold, Severity::ERROR);
    assert_eq!(c.log_file, "/tmp/x.log");
    assert_eq!(c.log_dir, "/var/log");
    assert_eq!(c.log_file_max_size_mb, 16);
    assert_eq!(
        c.vmodule,
        [ModulePattern {
            pattern: "runtime".into(),
            level: 5
        }]
    );
    assert_eq!(c.backtrace_at, Some(("runtime.rs".to_owned(), 7)));
    assert!(c.skip_headers && c.one_output && c.add_dir_header && c.skip_log_headers);
    assert!(!c.legacy_stderr_threshold_behavior);
}

// ---- lines through a real subscriber ----

static COUNTER: AtomicUsize = AtomicUsize::new(0);

fn temp_log() -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("konn-log-test-{}-{n}.log", std::process::id()))
}

/// Runs `f` under a subscriber that writes to a fresh log file only, and
/// returns the file's lines.
fn capture(mut config: LogConfig, f: impl FnOnce()) -> Vec<String> {
    let path = temp_log();
    config.log_to_stderr = false;
    config.stderr_threshold = Severity(9);
    config.skip_log_headers = true;
    config.log_file = path.to_string_lossy().into_owned();
    let sub = subscriber(&config, "proxy-test").expect("subscriber");
    tracing::subscriber::with_default(sub, f);
    let text = std::fs::read_to_string(&path).expect("log file");
    let _ = std::fs::remove_file(&path);
    text.lines().map(str::to_owned).collect()
}

/// Drops the header up to `] `, checking its shape.
fn body(line: &str) -> &str {
    let (head, rest) = line.split_once("] ").expect("header");
    let b = head.as_bytes();
    assert!(matches!(b[0], b'I' | b'W' | b'E'), "{line}");
    assert!(b[1..5].iter().all(u8::is_ascii_digit), "{line}");
    assert_eq!(b[5], b' ', "{line}");
    assert_eq!(&head[8..9], ":", "{line}");
    assert_eq!(&head[14..15], ".", "{line}");
    let pid = head[21..29].trim();
    assert_eq!(pid, std::process::id().to_string(), "{line}");
    assert!(head[30..].starts_with("tests.rs:"), "{line}");
    rest
}

#[test]
fn klog_line_format_and_fields() {
    let lines = capture(LogConfig::default(), || {
        tracing::info!(
            agent = "a b",
            port = 8091_u64,
            ok = true,
            delta = -3_i64,
            "agent connected"
        );
        tracing::warn!(addr = %"10.0.0.1:443", "dial slow");
        let err = io::Error::other("boom");
        tracing::error!(error = &err as &dyn std::error::Error, "dial failed");
        tracing::info!(dbg = ?"quoted", list = ?[1, 2], "debug values");
    });
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert!(lines[0].starts_with('I'));
    assert_eq!(
        body(&lines[0]),
        r#"agent connected agent="a b" port=8091 ok=true delta=-3"#
    );
    assert!(lines[1].starts_with('W'));
    assert_eq!(body(&lines[1]), "dial slow addr=10.0.0.1:443");
    assert!(lines[2].starts_with('E'));
    assert_eq!(body(&lines[2]), r#"dial failed error="boom""#);
    assert_eq!(
        body(&lines[3]),
        r#"debug values dbg="quoted" list="[1, 2]""#
    );
}

#[test]
fn integers_and_quoting_at_their_edges() {
    let lines = capture(LogConfig::default(), || {
        tracing::info!(
            zero = 0_u64,
            max = u64::MAX,
            min = i64::MIN,
            big = -170_141_183_460_469_231_731_687_303_715_884_105_728_i128,
            huge = u128::MAX,
            "ints"
        );
        tracing::info!(
            esc = "a\"b\\c\n",
            uni = "grüße",
            empty = "",
            dbg_uni = ?"ü x",
            "quoting"
        );
        // A line reuses the thread's buffers: nothing of the first stays.
        tracing::info!("short");
    });
    assert_eq!(
        body(&lines[0]),
        "ints zero=0 max=18446744073709551615 min=-9223372036854775808 \
         big=-170141183460469231731687303715884105728 \
         huge=340282366920938463463374607431768211455"
    );
    assert_eq!(
        body(&lines[1]),
        r#"quoting esc="a\"b\\c\n" uni="grüße" empty="" dbg_uni="ü x""#
    );
    assert_eq!(body(&lines[2]), "short");
}

#[test]
fn span_fields_follow_event_fields() {
    let lines = capture(LogConfig::default(), || {
        let outer = tracing::info_span!("tunnel", agent_id = "a1");
        let _o = outer.enter();
        let inner = tracing::info_span!("conn", conn_id = tracing::field::Empty);
        inner.record("conn_id", 7_u64);
        let _i = inner.enter();
        tracing::info!(bytes = 10_u64, "closed");
    });
    assert_eq!(
        body(&lines[0]),
        r#"closed bytes=10 agent_id="a1" conn_id=7"#
    );
}

#[test]
fn thread_fields_come_between_event_and_span_fields() {
    let lines = capture(LogConfig::default(), || {
        tracing::info!("before");
        let outer = ThreadFields::set("index=3");
        tracing::info!(n = 1_u64, "worker line");
        {
            let _inner = ThreadFields::set("index=4");
            let span = tracing::info_span!("conn", conn_id = 7_u64);
            let _s = span.enter();
            tracing::info!(n = 2_u64, "in a span");
        }
        tracing::info!("restored");
        drop(outer);
        tracing::info!("after");
    });
    let bodies: Vec<&str> = lines.iter().map(|l| body(l)).collect();
    assert_eq!(
        bodies,
        [
            "before",
            "worker line n=1 index=3",
            "in a span n=2 index=4 conn_id=7",
            "restored index=3",
            "after",
        ]
    );
}

#[test]
fn an_explicit_parent_is_shown_outside_it_too() {
    let lines = capture(LogConfig::default(), || {
        let span = tracing::info_span!("tunnel", agent_id = "a1");
        tracing::info!(parent: &span, "from outside");
        {
            let _e = span.enter();
            tracing::info!("inside");
        }
        tracing::info!("outside");
    });
    let bodies: Vec<&str> = lines.iter().map(|l| body(l)).collect();
    assert_eq!(
        bodies,
        [
            r#"from outside agent_id="a1""#,
            r#"inside agent_id="a1""#,
            "outside"
        ]
    );
}

#[test]
fn verbosity_selects_levels() {
    let emit = || {
        tracing::error!("e");
        tracing::warn!("w");
        tracing::info!("i");
        tracing::debug!("d");
        tracing::trace!("t");
    };
    let bodies = |v: i32| -> Vec<String> {
        let config = LogConfig {
            verbosity: v,
            ..LogConfig::default()
        };
        capture(config, emit)
            .iter()
            .map(|l| body(l).to_owned())
            .collect()
    };
    assert_eq!(bodies(0), ["e", "w", "i"]);
    assert_eq!(bodies(1), ["e", "w", "i"]);
    assert_eq!(bodies(2), ["e", "w", "i", "d"]);
    assert_eq!(bodies(3), ["e", "w", "i", "d"]);
    assert_eq!(
        bodies(4),
        ["e", "w", "i", "d", "t"],
        "upstream's default -v=4"
    );
    assert_eq!(bodies(-1), ["e", "w", "i"]);
}

#[test]
fn vmodule_overrides_verbosity_for_matching_code() {
    let config = LogConfig {
        verbosity: 0,
        vmodule: vec![ModulePattern {
            pattern: "tes*".into(),
            level: 4,
        }],
        ..LogConfig::default()
    };
    let lines = capture(config, || tracing::trace!("t"));
    assert_eq!(lines.len(), 1);
    let config = LogConfig {
        verbosity: 4,
        vmodule: vec![ModulePattern {
            pattern: "tests".into(),
            level: 1,
        }],
        ..LogConfig::default()
    };
    let lines = capture(config, || {
        tracing::debug!("d");
        tracing::info!("i");
    });
    assert_eq!(lines.len(), 1, "{lines:?}");
}

#[test]
fn skip_and_dir_headers() {
    let config = LogConfig {
        skip_headers: true,
        ..LogConfig::default()
    };
    let lines = capture(config, || tracing::info!(k = 1_u64, "plain"));
    assert_eq!(lines, ["plain k=1"]);
    let config = LogConfig {
        add_dir_header: true,
        ..LogConfig::default()
    };
    let lines = capture(config, || tracing::info!("x"));
    assert!(lines[0].contains(" core/src/log/tests.rs:"), "{lines:?}");
}

#[test]
fn backtrace_at_matching_line() {
    let line = line!() + 5;
    let config = LogConfig {
        backtrace_at: Some(("tests.rs".to_owned(), line)),
        ..LogConfig::default()
    };
    let lines = capture(config, || tracing::info!("here"));
    assert!(body(&lines[0]) == "here");
    assert!(lines.len() > 1, "a stack trace follows: {lines:?}");
}

#[test]
fn bad_log_file_is_reported() {
    let config = LogConfig {
        log_to_stderr: false,
        log_file: "/nonexistent-dir/konn.log".to_owned(),
        ..LogConfig::default()
    };
    let err = subscriber(&config, "x").err().expect("must fail");
    assert!(
        err.to_string()
            .starts_with("log: cannot create log file (--log-file=/nonexistent-dir/konn.log): "),
        "{err}"
    );
}
