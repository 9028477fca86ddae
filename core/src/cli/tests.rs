//! Parser tests. Expected texts were checked against pflag v1.0.10 (the
//! version upstream v0.36.0 pins) and cobra v1.10.2.

use super::*;

fn set() -> FlagSet {
    let mut fs = FlagSet::new("prog");
    fs.add_bool("flag", false, "a bool");
    fs.add_bool("on", true, "a bool that defaults to true");
    fs.add_string("host", "127.0.0.1", "a string");
    fs.add_int("port", 8091, "an int");
    fs.add_duration("interval", GoDuration::from_secs(1), "a duration");
    fs.add_string_slice("alpn", &[], "a string slice");
    fs.add_float32("qps", 0.0, "a float");
    fs.add_int("v", 4, "verbosity");
    fs.set_shorthand("v", 'v');
    fs.add_bool("old", true, "deprecated")
        .deprecate("it does nothing now.");
    fs.add_string("secret-knob", "", "hidden").hide();
    fs
}

fn parse_ok(fs: &mut FlagSet, args: &[&str]) -> Parsed {
    fs.parse(args.iter().copied())
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn parse_err(args: &[&str]) -> String {
    set().parse(args.iter().copied()).unwrap_err().to_string()
}

#[test]
fn defaults_without_arguments() {
    let mut fs = set();
    let p = parse_ok(&mut fs, &[]);
    assert_eq!(p, Parsed::default());
    assert!(!fs.get_bool("flag"));
    assert!(fs.get_bool("on"));
    assert_eq!(fs.get_string("host"), "127.0.0.1");
    assert_eq!(fs.get_int("port"), 8091);
    assert_eq!(fs.get_duration("interval"), GoDuration::from_secs(1));
    assert!(fs.get_string_slice("alpn").is_empty());
    assert!(!fs.changed("port"));
}

#[test]
fn equals_and_separate_value() {
    let mut fs = set();
    parse_ok(
        &mut fs,
        &["--port=1", "--host", "example.com", "--interval", "1m30s"],
    );
    assert_eq!(fs.get_int("port"), 1);
    assert_eq!(fs.get_string("host"), "example.com");
    assert_eq!(fs.get_duration("interval").to_string(), "1m30s");
    assert!(fs.changed("port") && fs.changed("host") && !fs.changed("flag"));
}

#[test]
fn separate_value_is_taken_even_if_it_looks_like_a_flag() {
    let mut fs = set();
    parse_ok(&mut fs, &["--host", "--port=2"]);
    assert_eq!(fs.get_string("host"), "--port=2");
    assert_eq!(fs.get_int("port"), 8091);
}

#[test]
fn empty_value_after_equals() {
    let mut fs = set();
    parse_ok(&mut fs, &["--host="]);
    assert_eq!(fs.get_string("host"), "");
    assert_eq!(
        parse_err(&["--port="]),
        r#"invalid argument "" for "--port" flag: strconv.ParseInt: parsing "": invalid syntax"#
    );
}

#[test]
fn bool_spellings_and_forms() {
    for (arg, want) in [
        ("--flag", true),
        ("--flag=true", true),
        ("--flag=1", true),
        ("--flag=t", true),
        ("--flag=T", true),
        ("--flag=TRUE", true),
        ("--flag=True", true),
        ("--flag=false", false),
        ("--flag=0", false),
        ("--flag=f", false),
        ("--flag=F", false),
        ("--flag=FALSE", false),
        ("--flag=False", false),
    ] {
        let mut fs = set();
        parse_ok(&mut fs, &[arg]);
        assert_eq!(fs.get_bool("flag"), want, "{arg}");
    }
    let mut fs = set();
    parse_ok(&mut fs, &["--on=false"]);
    assert!(!fs.get_bool("on"));
    assert_eq!(
        parse_err(&["--flag=yes"]),
        r#"invalid argument "yes" for "--flag" flag: strconv.ParseBool: parsing "yes": invalid syntax"#
    );
}

#[test]
fn bool_does_not_take_the_next_argument() {
    // pflag: `--on false` sets --on=true and leaves "false" positional.
    let mut fs = set();
    let p = parse_ok(&mut fs, &["--on", "false"]);
    assert!(fs.get_bool("on"));
    assert_eq!(p.args, ["false"]);
}

#[test]
fn repeated_flags_last_wins_slices_append() {
    let mut fs = set();
    parse_ok(
        &mut fs,
        &[
            "--port=1",
            "--port=2",
            "--alpn=a,b",
            "--alpn",
            "c",
            "--flag",
            "--flag=false",
        ],
    );
    assert_eq!(fs.get_int("port"), 2);
    assert_eq!(fs.get_string_slice("alpn"), ["a", "b", "c"]);
    assert!(!fs.get_bool("flag"));
}

#[test]
fn string_slice_brackets_like_pflag() {
    let mut fs = set();
    assert_eq!(fs.lookup("alpn").unwrap().default_text(), "[]");
    parse_ok(&mut fs, &["--alpn=[]"]);
    assert_eq!(fs.get_string_slice("alpn"), ["[]"]);
    assert_eq!(fs.lookup("alpn").unwrap().value_text(), "[[]]");

    let mut fs = set();
    parse_ok(&mut fs, &["--alpn=", "--alpn=\"x,y\",z"]);
    assert_eq!(fs.get_string_slice("alpn"), ["x,y", "z"]);
    assert_eq!(fs.lookup("alpn").unwrap().value_text(), "[\"x,y\",z]");

    assert_eq!(
        parse_err(&["--alpn=a\"b"]),
        r#"invalid argument "a\"b" for "--alpn" flag: parse error on line 1, column 2: bare " in non-quoted-field"#
    );
}

#[test]
fn numbers_durations_floats() {
    let mut fs = set();
    parse_ok(&mut fs, &["--port=0x1f90", "--interval=1.5h", "--qps=75"]);
    assert_eq!(fs.get_int("port"), 8080);
    assert_eq!(fs.get_duration("interval").to_string(), "1h30m0s");
    assert!((fs.get_float32("qps") - 75.0).abs() < f32::EPSILON);
    assert_eq!(
        parse_err(&["--interval=1"]),
        r#"invalid argument "1" for "--interval" flag: time: missing unit in duration "1""#
    );
    assert_eq!(
        parse_err(&["--port=99999999999999999999"]),
        r#"invalid argument "99999999999999999999" for "--port" flag: strconv.ParseInt: parsing "99999999999999999999": value out of range"#
    );
    assert_eq!(
        parse_err(&["--qps=x"]),
        r#"invalid argument "x" for "--qps" flag: strconv.ParseFloat: parsing "x": invalid syntax"#
    );
}

#[test]
fn shorthand_forms() {
    for args in [
        &["-v=2"][..],
        &["-v", "2"],
        &["-v2"],
        &["--v=2"],
        &["--v", "2"],
    ] {
        let mut fs = set();
        parse_ok(&mut fs, args);
        assert_eq!(fs.get_int("v"), 2, "{args:?}");
    }
    assert_eq!(
        parse_err(&["-v=x"]),
        r#"invalid argument "x" for "-v, --v" flag: strconv.ParseInt: parsing "x": invalid syntax"#
    );
    assert_eq!(parse_err(&["-v"]), "flag needs an argument: 'v' in -v");
    assert_eq!(parse_err(&["-x"]), "unknown shorthand flag: 'x' in -x");
}

#[test]
fn unknown_and_malformed() {
    assert_eq!(parse_err(&["--foo"]), "unknown flag: --foo");
    assert_eq!(parse_err(&["--foo=1"]), "unknown flag: --foo");
    // Underscores are not folded into dashes (upstream normalises names
    // only when registering klog's flags).
    assert_eq!(parse_err(&["--log_dir=/tmp"]), "unknown flag: --log_dir");
    assert_eq!(parse_err(&["---foo"]), "bad flag syntax: ---foo");
    assert_eq!(parse_err(&["--=x"]), "bad flag syntax: --=x");
    assert_eq!(parse_err(&["--port"]), "flag needs an argument: --port");
}

#[test]
fn first_error_stops_parsing() {
    let mut fs = set();
    let err = fs.parse(["--port=1", "--bad", "--port=2"]).unwrap_err();
    assert_eq!(err, ParseError::UnknownFlag("bad".to_owned()));
    assert_eq!(fs.get_int("port"), 1);
}

#[test]
fn double_dash_and_positionals() {
    let mut fs = set();
    let p = parse_ok(
        &mut fs,
        &["a", "--flag", "-", "", "b", "--", "--port=1", "-v"],
    );
    assert_eq!(p.args, ["a", "-", "", "b", "--port=1", "-v"]);
    assert!(fs.get_bool("flag"));
    assert_eq!(fs.get_int("port"), 8091);
}

#[test]
fn deprecated_flag_is_accepted_with_a_warning() {
    let mut fs = set();
    let p = parse_ok(&mut fs, &["--old=false", "--old"]);
    assert!(fs.get_bool("old"));
    assert_eq!(
        p.warnings,
        [
            "Flag --old has been deprecated, it does nothing now.",
            "Flag --old has been deprecated, it does nothing now."
        ]
    );
}

#[test]
fn hidden_and_deprecated_are_accepted_but_not_listed() {
    let mut fs = set();
    parse_ok(&mut fs, &["--secret-knob=x"]);
    assert_eq!(fs.get_string("secret-knob"), "x");
    let usage = fs.usage(Section::Upstream);
    assert!(!usage.contains("secret-knob"));
    assert!(!usage.contains("--old"));
}

#[test]
fn help_without_a_help_flag() {
    for arg in ["--help", "-h"] {
        let mut fs = set();
        assert!(parse_ok(&mut fs, &[arg]).help);
    }
}

#[test]
fn usage_is_pflag_format() {
    let mut fs = FlagSet::new("prog");
    fs.add_bool("add-dir-header", false, "If true, adds the dir");
    fs.add_string("admin-bind-address", "127.0.0.1", "Bind address.");
    fs.add_int("admin-port", 8095, "Port.");
    fs.add_string_slice("cipher-suites", &[], "Suites.");
    fs.add_bool("delete-existing-uds-file", true, "Delete.");
    fs.add_duration("keepalive-time", GoDuration::from_secs(3600), "Keepalive.");
    fs.add_duration("backend-dial-timeout", GoDuration::ZERO, "Dial.");
    fs.add_float32("kubeconfig-qps", 0.0, "QPS.");
    fs.add_int("v", 4, "number for the log level verbosity");
    fs.set_shorthand("v", 'v');
    fs.add_string("mode", "", "Use `name` here.");
    // Reference: pflag v1.0.10 FlagUsages() for the same definitions.
    let want = concat!(
        "      --add-dir-header                  If true, adds the dir\n",
        "      --admin-bind-address string       Bind address. (default \"127.0.0.1\")\n",
        "      --admin-port int                  Port. (default 8095)\n",
        "      --backend-dial-timeout duration   Dial.\n",
        "      --cipher-suites strings           Suites.\n",
        "      --delete-existing-uds-file        Delete. (default true)\n",
        "      --keepalive-time duration         Keepalive. (default 1h0m0s)\n",
        "      --kubeconfig-qps float32          QPS.\n",
        "      --mode name                       Use name here.\n",
        "  -v, --v int                           number for the log level verbosity (default 4)\n",
    );
    assert_eq!(fs.usage(Section::Upstream), want);
}

#[test]
fn usage_indents_multi_line_text() {
    let mut fs = FlagSet::new("prog");
    fs.add_bool("a", false, "line one\nline two");
    assert_eq!(
        fs.usage(Section::Upstream),
        "      --a   line one\n            line two\n"
    );
}

#[test]
fn command_help_flag_like_cobra() {
    let mut cmd = Command::new("proxy-agent", "About.");
    cmd.flags_mut().add_int("port", 1, "Port.");
    cmd.flags_mut().set_section(Section::Konn);
    cmd.flags_mut().add_bool("pin-cores", false, "Pin.");

    assert_eq!(cmd.parse(["--help"]), Ok(Outcome::Help));
    let mut cmd2 = Command::new("x", "y");
    assert_eq!(cmd2.parse(["-h"]), Ok(Outcome::Help));
    let mut cmd3 = Command::new("x", "y");
    assert!(matches!(cmd3.parse(["--help=false"]), Ok(Outcome::Run(_))));
    // A parse error wins over --help (cobra parses all flags first).
    let mut cmd4 = Command::new("x", "y");
    assert_eq!(
        cmd4.parse(["--help", "--nope"]),
        Err(ParseError::UnknownFlag("nope".to_owned()))
    );

    let help = cmd.help();
    assert!(
        help.starts_with("About.\n\nUsage:\n  proxy-agent [flags]\n\nFlags:\n"),
        "{help}"
    );
    assert!(
        help.contains("  -h, --help       help for proxy-agent\n"),
        "{help}"
    );
    assert!(
        help.contains("      --port int   Port. (default 1)\n"),
        "{help}"
    );
    let konn = help.find("konn flags").expect("konn section");
    assert!(help[konn..].contains("--pin-cores"));
    assert!(!help[..konn].contains("--pin-cores"));
}

#[test]
fn set_like_pflag() {
    let mut fs = set();
    assert_eq!(fs.set("port", "3"), Ok(None));
    assert_eq!(fs.get_int("port"), 3);
    assert!(fs.changed("port"));
    assert_eq!(
        fs.set("nope", "3"),
        Err(ParseError::UnknownFlag("nope".to_owned()))
    );
    assert_eq!(
        fs.set("old", "true"),
        Ok(Some(
            "Flag --old has been deprecated, it does nothing now.".to_owned()
        ))
    );
}

#[test]
#[should_panic(expected = "registered twice")]
fn duplicate_registration_is_a_bug() {
    let mut fs = set();
    fs.add_int("port", 1, "again");
}

#[test]
fn uuid_shape() {
    let a = random_uuid().expect("urandom");
    let b = random_uuid().expect("urandom");
    assert_ne!(a, b);
    assert_eq!(a.len(), 36);
    let parts: Vec<&str> = a.split('-').collect();
    assert_eq!(
        parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
        [8, 4, 4, 4, 12]
    );
    assert!(parts[2].starts_with('4'));
    assert!(matches!(parts[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'));
}

#[test]
fn summary_lists_values() {
    let mut fs = set();
    parse_ok(&mut fs, &["--host=a b", "--alpn=x,y"]);
    let s = fs.summary();
    assert!(
        s.starts_with("--alpn=[x,y] --flag=false --host=\"a b\" --interval=1s"),
        "{s}"
    );
    assert!(!s.contains("secret-knob") && !s.contains("--old"), "{s}");
    parse_ok(&mut fs, &["--old=false"]);
    assert!(fs.summary().contains("--old=false"));
}
