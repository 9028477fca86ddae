//! Feeds proxy-server the complete upstream flag set written out the way
//! pflag renders each default (`--cipher-suites=[]`, `--keepalive-time=1h0m0s`,
//! `--log-backtrace-at=:0`, ...), as a generated manifest would, and checks
//! that konn ends up exactly where upstream v0.36.0 does. Upstream's results
//! for the same argument lists (run through its own option code):
//!
//! - with `--log-backtrace-at=:0`: parse error
//!   `invalid argument ":0" for "--log-backtrace-at" flag: syntax error: expect file.go:234`;
//! - without it: parsed, one deprecation line for `--warn-on-channel-limit`,
//!   then `Validate` fails because `--server-ca-cert` is empty;
//! - with `--server-ca-cert` set: `Validate` fails on the cipher suite `[]`
//!   (`--cipher-suites=[]` is the one-element list `["[]"]`);
//! - without `--cipher-suites`: valid.

mod upstream_flags;

use konn_core::app::Options as _;
use konn_core::cli::{Outcome, ParseError};
use konn_server::Error;
use konn_server::options::{self, ServerOptions};
use konn_testkit::files::TempFile;
use upstream_flags::RENDERED_DEFAULTS;

const DEPRECATION: &str = "Flag --warn-on-channel-limit has been deprecated, This behavior is now thread safe and always on. This flag will be removed in a future release.";

fn args_without(skip: &[&str]) -> Vec<String> {
    RENDERED_DEFAULTS
        .iter()
        .filter(|a| !skip.iter().any(|s| a.starts_with(s)))
        .map(|a| (*a).to_owned())
        .collect()
}

#[test]
fn the_list_covers_every_upstream_flag() {
    let cmd = options::command_with_env(|_| None);
    let names: Vec<&str> = RENDERED_DEFAULTS
        .iter()
        .map(|a| a[2..].split_once('=').unwrap().0)
        .collect();
    let upstream: Vec<&str> = cmd
        .flags()
        .flags()
        .into_iter()
        .filter(|f| f.section() == konn_core::cli::Section::Upstream && f.name() != "help")
        .map(|f| f.name())
        .collect();
    assert_eq!(names, upstream);
    // And each rendering is konn's own rendering of its default.
    for (arg, flag) in RENDERED_DEFAULTS.iter().zip(
        cmd.flags()
            .flags()
            .into_iter()
            .filter(|f| f.section() == konn_core::cli::Section::Upstream && f.name() != "help"),
    ) {
        if flag.name() != "server-id" {
            assert_eq!(*arg, format!("--{}={}", flag.name(), flag.default_text()));
        }
    }
}

#[test]
fn rendered_backtrace_default_is_refused_like_upstream() {
    let mut cmd = options::command_with_env(|_| None);
    let err = cmd.parse(args_without(&[])).unwrap_err();
    assert_eq!(
        err,
        ParseError::InvalidValue {
            flag: "--log-backtrace-at".to_owned(),
            value: ":0".to_owned(),
            reason: "syntax error: expect file.go:234".to_owned(),
        }
    );
    assert_eq!(
        err.to_string(),
        r#"invalid argument ":0" for "--log-backtrace-at" flag: syntax error: expect file.go:234"#
    );
}

#[test]
fn full_rendered_set_parses_and_validates_like_upstream() {
    let mut cmd = options::command_with_env(|_| None);
    let Ok(Outcome::Run(parsed)) = cmd.parse(args_without(&["--log-backtrace-at="])) else {
        panic!("must parse");
    };
    assert!(parsed.args.is_empty());
    assert_eq!(parsed.warnings, [DEPRECATION]);
    let flags = cmd.flags();
    assert_eq!(flags.get_string_slice("cipher-suites"), ["[]"]);
    assert_eq!(
        flags.get_string("server-id"),
        "c9ea4fa3-e0eb-4c3a-a87e-150e63666e30"
    );
    assert_eq!(
        flags.get_string("lease-label"),
        "k8s-app=konnectivity-server"
    );
    let e = ServerOptions::from_flags(flags).unwrap_err();
    assert!(matches!(e, Error::TcpFrontendNeedsCa), "{e}");

    // Give it the CA: now the `[]` cipher suite is refused, as upstream.
    let ca = TempFile::new("ca");
    let mut args = args_without(&["--log-backtrace-at=", "--server-ca-cert="]);
    args.push(format!("--server-ca-cert={}", ca.path()));
    let mut cmd = options::command_with_env(|_| None);
    cmd.parse(args.clone()).unwrap();
    let e = ServerOptions::from_flags(cmd.flags()).unwrap_err();
    assert!(
        matches!(&e, Error::CipherSuite { name, .. } if name == "[]"),
        "{e}"
    );

    // Without the rendered empty list it is valid.
    args.retain(|a| !a.starts_with("--cipher-suites="));
    let mut cmd = options::command_with_env(|_| None);
    cmd.parse(args).unwrap();
    let o = ServerOptions::from_flags(cmd.flags()).expect("valid");
    assert_eq!(o.server_id, "c9ea4fa3-e0eb-4c3a-a87e-150e63666e30");
    assert_eq!(o.xfr_channel_size, 10);
    assert!(o.unsupported_features().is_empty());
}

#[test]
fn separate_value_form_is_equivalent() {
    // `--flag value` for every non-boolean flag, `--flag=value` for booleans.
    let ca = TempFile::new("ca");
    let mut args = Vec::new();
    let mut cmd = options::command_with_env(|_| None);
    for arg in args_without(&[
        "--log-backtrace-at=",
        "--cipher-suites=",
        "--server-ca-cert=",
    ]) {
        let (name, value) = arg[2..].split_once('=').unwrap();
        let is_bool = cmd.flags().lookup(name).unwrap().type_name() == "bool";
        if is_bool {
            args.push(arg.clone());
        } else {
            args.push(format!("--{name}"));
            args.push(value.to_owned());
        }
    }
    args.push("--server-ca-cert".to_owned());
    args.push(ca.path().to_owned());
    let Ok(Outcome::Run(parsed)) = cmd.parse(args) else {
        panic!("must parse");
    };
    assert!(parsed.args.is_empty(), "{:?}", parsed.args);
    ServerOptions::from_flags(cmd.flags()).expect("valid");
}
