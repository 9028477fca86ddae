//! Tests of Go's value spellings against Go's own test tables (time,
//! strconv, encoding/csv).

use super::*;

fn d(s: &str) -> i64 {
    GoDuration::parse(s)
        .unwrap_or_else(|e| panic!("{s}: {e}"))
        .as_nanos()
}

// Go's time package test table (format_test.go parseDurationTests).
#[test]
fn duration_parse_go_cases() {
    let cases: &[(&str, i64)] = &[
        ("0", 0),
        ("5s", 5 * SEC as i64),
        ("30s", 30 * SEC as i64),
        ("1478s", 1478 * SEC as i64),
        ("-5s", -5 * SEC as i64),
        ("+5s", 5 * SEC as i64),
        ("-0", 0),
        ("+0", 0),
        ("5.0s", 5 * SEC as i64),
        ("5.6s", 5 * SEC as i64 + 600 * MS as i64),
        ("5.s", 5 * SEC as i64),
        (".5s", 500 * MS as i64),
        ("1.0s", SEC as i64),
        ("1.00s", SEC as i64),
        ("1.004s", SEC as i64 + 4 * MS as i64),
        ("1.0040s", SEC as i64 + 4 * MS as i64),
        ("100.00100s", 100 * SEC as i64 + MS as i64),
        ("10ns", 10),
        ("11us", 11 * US as i64),
        ("12µs", 12 * US as i64),
        ("12μs", 12 * US as i64),
        ("13ms", 13 * MS as i64),
        ("14s", 14 * SEC as i64),
        ("15m", 15 * MIN as i64),
        ("16h", 16 * HOUR as i64),
        ("3h30m", 3 * HOUR as i64 + 30 * MIN as i64),
        (
            "10.5s4m",
            4 * MIN as i64 + 10 * SEC as i64 + 500 * MS as i64,
        ),
        (
            "-2m3.4s",
            -(2 * MIN as i64 + 3 * SEC as i64 + 400 * MS as i64),
        ),
        ("1h2m3s4ms5us6ns", 3_723_004_005_006),
        ("39h9m14.425s", 140_954_425 * MS as i64),
        ("52763797000ns", 52_763_797_000),
        ("0.3333333333333333333h", 20 * MIN as i64),
        ("9007199254740993ns", 9_007_199_254_740_993),
        ("9223372036854775807ns", i64::MAX),
        ("9223372036854775.807us", i64::MAX),
        ("9223372036s854ms775us807ns", i64::MAX),
        ("-9223372036854775808ns", i64::MIN),
        ("-9223372036854775.808us", i64::MIN),
        ("-9223372036s854ms775us808ns", i64::MIN),
        ("-2562047h47m16.854775808s", i64::MIN),
        ("0.100000000000000000000h", 6 * MIN as i64),
        (
            "0.830103483285477580700h",
            49 * MIN as i64 + 48 * SEC as i64 + 372_539_827,
        ),
        // The brief's examples.
        ("1h", HOUR as i64),
        ("1m30s", 90 * SEC as i64),
        ("1.5h", 90 * MIN as i64),
        ("300ms", 300 * MS as i64),
        ("2h45m", 165 * MIN as i64),
    ];
    for &(s, want) in cases {
        assert_eq!(d(s), want, "{s}");
    }
}

#[test]
fn duration_parse_go_errors() {
    let cases: &[(&str, &str)] = &[
        ("", r#"time: invalid duration """#),
        ("3", r#"time: missing unit in duration "3""#),
        ("-", r#"time: invalid duration "-""#),
        ("s", r#"time: invalid duration "s""#),
        (".", r#"time: invalid duration ".""#),
        ("-.", r#"time: invalid duration "-.""#),
        (".s", r#"time: invalid duration ".s""#),
        ("+.s", r#"time: invalid duration "+.s""#),
        ("1d", r#"time: unknown unit "d" in duration "1d""#),
        (
            "\u{85}\u{85}",
            r#"time: invalid duration "\xc2\x85\xc2\x85""#,
        ),
        ("\u{fffd}", r#"time: invalid duration "\xef\xbf\xbd""#),
        (
            "9223372036854775810ns",
            r#"time: invalid duration "9223372036854775810ns""#,
        ),
        (
            "9223372036854775808ns",
            r#"time: invalid duration "9223372036854775808ns""#,
        ),
        (
            "-9223372036854775809ns",
            r#"time: invalid duration "-9223372036854775809ns""#,
        ),
        (
            "9223372036854776us",
            r#"time: invalid duration "9223372036854776us""#,
        ),
        ("3000000h", r#"time: invalid duration "3000000h""#),
        (
            "9223372036854775.808us",
            r#"time: invalid duration "9223372036854775.808us""#,
        ),
        (
            "9223372036854ms775us808ns",
            r#"time: invalid duration "9223372036854ms775us808ns""#,
        ),
        (
            "1µ",
            r#"time: unknown unit "\xc2\xb5" in duration "1\xc2\xb5""#,
        ),
        ("1s ", r#"time: unknown unit "s " in duration "1s ""#),
    ];
    for &(s, want) in cases {
        assert_eq!(GoDuration::parse(s), Err(want.to_owned()), "{s:?}");
    }
}

#[test]
fn duration_string_go_cases() {
    let cases: &[(&str, i64)] = &[
        ("0s", 0),
        ("1ns", 1),
        ("1.1µs", 1100),
        ("2.2ms", 2_200_000),
        ("3.3s", 3_300_000_000),
        ("4m5s", 245 * SEC as i64),
        ("4m5.001s", 245_001 * MS as i64),
        ("5h6m7.001s", 18_367_001 * MS as i64),
        ("8m0.000000001s", 8 * MIN as i64 + 1),
        ("2562047h47m16.854775807s", i64::MAX),
        ("-2562047h47m16.854775808s", i64::MIN),
        ("1h0m0s", HOUR as i64),
        ("1s", SEC as i64),
        ("10s", 10 * SEC as i64),
        ("300ms", 300 * MS as i64),
        ("1m30s", 90 * SEC as i64),
        ("-1.5s", -1500 * MS as i64),
    ];
    for &(want, ns) in cases {
        assert_eq!(GoDuration(ns).to_string(), want);
        // What Go prints, Go parses back.
        assert_eq!(d(want), ns, "{want}");
    }
}

#[test]
fn duration_std_conversion() {
    assert_eq!(
        GoDuration::from_secs(2).to_std(),
        Some(Duration::from_secs(2))
    );
    assert_eq!(GoDuration(-1).to_std(), None);
    assert_eq!(GoDuration::from_std(Duration::MAX), GoDuration(i64::MAX));
    assert_eq!(GoDuration::from_millis(1500).to_string(), "1.5s");
}

#[test]
fn bool_spellings() {
    for t in ["1", "t", "T", "true", "TRUE", "True"] {
        assert_eq!(parse_bool(t), Ok(true), "{t}");
    }
    for f in ["0", "f", "F", "false", "FALSE", "False"] {
        assert_eq!(parse_bool(f), Ok(false), "{f}");
    }
    for bad in ["", "yes", "tRUE", "2", " true"] {
        assert_eq!(
            parse_bool(bad),
            Err(format!(
                "strconv.ParseBool: parsing {}: invalid syntax",
                quote(bad)
            ))
        );
    }
}

#[test]
fn int_base_auto() {
    let ok: &[(&str, i64)] = &[
        ("0", 0),
        ("8090", 8090),
        ("+8090", 8090),
        ("-1", -1),
        ("0x1f90", 8080),
        ("0X1F90", 8080),
        ("017", 15),
        ("0o17", 15),
        ("0b101", 5),
        ("1_0", 10),
        ("0x_1f", 31),
        ("9223372036854775807", i64::MAX),
        ("-9223372036854775808", i64::MIN),
    ];
    for &(s, want) in ok {
        assert_eq!(parse_int(s, IntBase::Auto, 64), Ok(want), "{s}");
    }
    let syntax = [
        "", "x", "1.5", "08", "1__0", "_1", "1_", "0x", "- 1", "1e3", "+-1",
    ];
    for s in syntax {
        assert_eq!(
            parse_int(s, IntBase::Auto, 64),
            Err(format!(
                "strconv.ParseInt: parsing {}: invalid syntax",
                quote(s)
            )),
            "{s}"
        );
    }
    for s in [
        "9223372036854775808",
        "99999999999999999999",
        "-9223372036854775809",
    ] {
        assert_eq!(
            parse_int(s, IntBase::Auto, 64),
            Err(format!(
                "strconv.ParseInt: parsing {}: value out of range",
                quote(s)
            )),
            "{s}"
        );
    }
}

#[test]
fn int_base_decimal_32() {
    assert_eq!(parse_int("4", IntBase::Decimal, 32), Ok(4));
    assert_eq!(parse_int("-3", IntBase::Decimal, 32), Ok(-3));
    assert_eq!(
        parse_int("2147483647", IntBase::Decimal, 32),
        Ok(2_147_483_647)
    );
    assert!(
        parse_int("2147483648", IntBase::Decimal, 32)
            .unwrap_err()
            .ends_with("value out of range")
    );
    assert!(
        parse_int("0x10", IntBase::Decimal, 32)
            .unwrap_err()
            .ends_with("invalid syntax")
    );
    assert!(
        parse_int("1_0", IntBase::Decimal, 32)
            .unwrap_err()
            .ends_with("invalid syntax")
    );
    // Leading zeros are plain decimal in base 10.
    assert_eq!(parse_int("010", IntBase::Decimal, 32), Ok(10));
}

#[test]
fn uint_parse() {
    assert_eq!(parse_uint("1800", IntBase::Auto, 64), Ok(1800));
    assert_eq!(parse_uint("0x10", IntBase::Auto, 64), Ok(16));
    assert_eq!(
        parse_uint("18446744073709551615", IntBase::Auto, 64),
        Ok(u64::MAX)
    );
    assert_eq!(
        parse_uint("-1", IntBase::Auto, 64),
        Err(r#"strconv.ParseUint: parsing "-1": invalid syntax"#.to_owned())
    );
    assert_eq!(
        parse_uint("18446744073709551616", IntBase::Auto, 64),
        Err(r#"strconv.ParseUint: parsing "18446744073709551616": value out of range"#.to_owned())
    );
}

#[test]
fn float32_parse_and_format() {
    assert_eq!(parse_float32("0"), Ok(0.0));
    assert_eq!(parse_float32("75"), Ok(75.0));
    assert_eq!(parse_float32("2.5"), Ok(2.5));
    assert_eq!(parse_float32(".5"), Ok(0.5));
    assert_eq!(parse_float32("1e3"), Ok(1000.0));
    assert_eq!(parse_float32("1_000"), Ok(1000.0));
    assert_eq!(parse_float32("-Inf"), Ok(f32::NEG_INFINITY));
    assert_eq!(parse_float32("+infinity"), Ok(f32::INFINITY));
    assert!(parse_float32("NaN").is_ok_and(f32::is_nan));
    assert_eq!(
        parse_float32("x"),
        Err(r#"strconv.ParseFloat: parsing "x": invalid syntax"#.to_owned())
    );
    assert_eq!(
        parse_float32("1e40"),
        Err(r#"strconv.ParseFloat: parsing "1e40": value out of range"#.to_owned())
    );
    assert!(parse_float32("").is_err());
    assert!(parse_float32("1__0").is_err());
    for (f, want) in [
        (0.0f32, "0"),
        (75.0, "75"),
        (0.5, "0.5"),
        (2.5, "2.5"),
        (0.1, "0.1"),
        (1e-5, "1e-05"),
        (123_456_790.0, "1.2345679e+08"),
        (1e20, "1e+20"),
        (1e6, "1e+06"),
        (123_456.0, "123456"),
        (1_234_567.0, "1.234567e+06"),
        (-3.25, "-3.25"),
        (f32::INFINITY, "+Inf"),
    ] {
        assert_eq!(format_float32(f), want, "{f}");
    }
}

#[test]
fn quoting() {
    assert_eq!(quote("a b"), r#""a b""#);
    assert_eq!(quote("a\"b\\c"), r#""a\"b\\c""#);
    assert_eq!(quote("\n\t\x01\x7f"), r#""\n\t\x01\x7f""#);
    assert_eq!(quote("µs é"), "\"µs é\"");
    assert_eq!(quote("\u{a0}\u{200b}"), r#""\u00a0\u200b""#);
    assert_eq!(quote("\u{f0000}"), r#""\U000f0000""#);
}

fn csv(s: &str) -> Result<Vec<String>, String> {
    read_csv_record(s)
}

#[test]
fn csv_read_matches_go() {
    let v = |xs: &[&str]| Ok(xs.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
    assert_eq!(csv("a"), v(&["a"]));
    assert_eq!(csv("a,b"), v(&["a", "b"]));
    assert_eq!(csv("[]"), v(&["[]"]));
    assert_eq!(csv(","), v(&["", ""]));
    assert_eq!(csv("\"\""), v(&[""]));
    assert_eq!(csv(" a,b "), v(&[" a", "b "]));
    assert_eq!(csv("\"x,y\",z"), v(&["x,y", "z"]));
    assert_eq!(csv("\"a\"\"b\",c"), v(&["a\"b", "c"]));
    assert_eq!(csv("a\nb,c"), v(&["a"]));
    assert_eq!(csv("\n\na,b"), v(&["a", "b"]));
    assert_eq!(csv("a\r\n"), v(&["a"]));
    assert_eq!(csv("a\r"), v(&["a"]));
    assert_eq!(csv("\"a\nb\",c"), v(&["a\nb", "c"]));
    assert_eq!(csv("\"a\r\nb\""), v(&["a\nb"]));
    assert_eq!(csv("\n"), Err("EOF".to_owned()));
    assert_eq!(
        csv("a\"b"),
        Err("parse error on line 1, column 2: bare \" in non-quoted-field".to_owned())
    );
    assert_eq!(
        csv("x,a\"b"),
        Err("parse error on line 1, column 4: bare \" in non-quoted-field".to_owned())
    );
    assert_eq!(
        csv("\"ab\"c"),
        Err("parse error on line 1, column 4: extraneous or missing \" in quoted-field".to_owned())
    );
    assert_eq!(
        csv("\"ab"),
        Err("parse error on line 1, column 4: extraneous or missing \" in quoted-field".to_owned())
    );
    assert_eq!(
            csv("\"a\nb\"c"),
            Err("record on line 1; parse error on line 2, column 2: extraneous or missing \" in quoted-field".to_owned())
        );
}

#[test]
fn csv_write_matches_go() {
    assert_eq!(write_csv_record::<&str>(&[]), "");
    assert_eq!(write_csv_record(&["a", "b"]), "a,b");
    assert_eq!(write_csv_record(&[""]), "");
    assert_eq!(write_csv_record(&["", ""]), ",");
    assert_eq!(write_csv_record(&["[]"]), "[]");
    assert_eq!(write_csv_record(&["x,y", "z"]), "\"x,y\",z");
    assert_eq!(write_csv_record(&["a\"b"]), "\"a\"\"b\"");
    assert_eq!(write_csv_record(&[" a"]), "\" a\"");
    assert_eq!(write_csv_record(&["\\."]), "\"\\.\"");
    // What is written reads back.
    for fields in [vec!["x,y", "z"], vec!["a\"b", " c"], vec!["h2", "http/1.1"]] {
        let line = write_csv_record(&fields);
        assert_eq!(read_csv_record(&line).unwrap(), fields);
    }
}

#[test]
fn underscore_rules() {
    assert!(underscore_ok("1_000"));
    assert!(underscore_ok("0x_ff"));
    assert!(underscore_ok("-1_0"));
    assert!(!underscore_ok("_1"));
    assert!(!underscore_ok("1_"));
    assert!(!underscore_ok("1__0"));
    assert!(!underscore_ok("1_.5"));
}
