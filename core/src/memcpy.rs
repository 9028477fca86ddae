//! glibc's `memcpy` on AMD Zen 3 and later: keep it off `rep movsb`.
//!
//! glibc before 2.40 copies 2112 bytes and more with `rep movsb` on every
//! CPU that reports FSRM. On AMD's cores that report it (Zen 3 and later)
//! such a copy runs about 30× slower when the destination is 1–31 bytes
//! ahead of the source modulo 4 KiB (glibc bug 30994, fixed in 2.40 by
//! not using `rep movsb` there). konn's copies hit that window by
//! construction: two buffers of one size class share their page offset,
//! and a copy behind a 5-byte TLS record header or a 9-byte HTTP/2 frame
//! header shifts the data by exactly such a distance. Measured on the
//! benchmark host (docs/decisions/0008-glibc-memcpy.md): a 16 KiB copy
//! 7.6–8.0 µs instead of 0.25 (`bench/benches/memcpy.rs`), and S1's CPU
//! per GB 22 % lower with the fix.
//!
//! glibc reads its tunables once, when the process starts, so
//! [`use_vector_copies`] — the first thing `app::start` does — sets
//! `GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=…` and executes the
//! binary again (same PID, arguments and descriptors) when [`decide`] says
//! the host needs it. An operator who sets that tunable keeps their value;
//! setting it to glibc's default on these CPUs (2112) turns this off. The
//! outcome is logged once logging is up ([`outcome`]).
//!
//! [`decide`] is pure (host facts in, new variable out) and unit-tested;
//! only [`use_vector_copies`] reads `/proc` and executes.

use std::sync::OnceLock;

/// The glibc tunable that decides from which size `memcpy` uses `rep movsb`.
pub const TUNABLE: &str = "glibc.cpu.x86_rep_movsb_threshold";

/// The value konn sets: larger than any copy, so `memcpy` keeps its vector
/// loops (and glibc's non-temporal stores for huge copies), as glibc 2.40
/// does on these CPUs.
pub const THRESHOLD: u64 = 1 << 40;

/// The environment variable glibc reads its tunables from.
pub const ENV: &str = "GLIBC_TUNABLES";

/// The first glibc version that avoids `rep movsb` on these CPUs itself.
const FIXED_IN: (u32, u32) = (2, 40);

/// What [`decide`] looks at.
#[derive(Debug, Clone, Copy)]
pub struct Host<'a> {
    /// `vendor_id` of `/proc/cpuinfo`.
    pub vendor: &'a str,
    /// Whether the CPU reports FSRM (`fsrm` in the `flags` line).
    pub fsrm: bool,
    /// glibc's version, `None` when it is unknown (not glibc).
    pub glibc: Option<(u32, u32)>,
    /// The current value of [`ENV`].
    pub tunables: Option<&'a str>,
    /// The process runs in glibc's secure mode (`AT_SECURE`: set-user-ID
    /// or file capabilities), where glibc erases the tunable.
    pub secure: bool,
}

/// Why the process runs with glibc's own choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keep {
    /// Not an AMD CPU with FSRM: `rep movsb` is not slow there.
    NotAffected,
    /// glibc 2.40 or later, which makes the same choice, or not glibc.
    GlibcDecides,
    /// [`TUNABLE`] is already in [`ENV`] (set by the operator, or by konn
    /// before it executed itself again).
    AlreadySet,
    /// Secure mode: glibc would drop the tunable, so executing again could
    /// not end.
    SecureMode,
}

/// Decides whether `memcpy` needs the tunable: `Ok(value)` is the new
/// value of [`ENV`] (the current one with [`TUNABLE`] appended).
///
/// # Errors
///
/// Why glibc's choice is kept.
pub fn decide(host: &Host<'_>) -> Result<String, Keep> {
    if host.vendor != "AuthenticAMD" || !host.fsrm {
        return Err(Keep::NotAffected);
    }
    match host.glibc {
        Some(v) if v < FIXED_IN => {}
        _ => return Err(Keep::GlibcDecides),
    }
    let current = host.tunables.unwrap_or_default();
    if value_in(current).is_some() {
        return Err(Keep::AlreadySet);
    }
    if host.secure {
        return Err(Keep::SecureMode);
    }
    let setting = format!("{TUNABLE}={THRESHOLD}");
    Ok(if current.is_empty() {
        setting
    } else {
        format!("{current}:{setting}")
    })
}

/// The value `tunables` (a `GLIBC_TUNABLES` string, `name=value` pairs
/// joined by `:`) gives [`TUNABLE`], if it sets it.
fn value_in(tunables: &str) -> Option<&str> {
    tunables
        .split(':')
        .find_map(|t| t.strip_prefix(TUNABLE)?.strip_prefix('='))
}

/// The CPU vendor and whether it reports FSRM, from `/proc/cpuinfo`'s
/// text (its first processor is enough).
pub fn parse_cpuinfo(text: &str) -> (&str, bool) {
    let mut vendor = "";
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        match key.trim() {
            "vendor_id" => vendor = value.trim(),
            "flags" => return (vendor, value.split_whitespace().any(|f| f == "fsrm")),
            _ => {}
        }
    }
    (vendor, false)
}

/// glibc's `major.minor` from its version string ("2.36").
pub fn parse_glibc_version(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts
        .next()?
        .trim_end_matches(|c: char| !c.is_ascii_digit());
    Some((major, minor.parse().ok()?))
}

/// What happened at start-up, for [`outcome`].
static OUTCOME: OnceLock<String> = OnceLock::new();

/// A line for the log about the choice made at start-up (`None` before
/// [`use_vector_copies`] ran, or where it does nothing).
pub fn outcome() -> Option<&'static str> {
    OUTCOME.get().map(String::as_str)
}

/// [`decide`] for this process: its CPU, glibc and environment.
///
/// # Errors
///
/// Why glibc's choice is kept; always [`Keep::NotAffected`] off x86-64
/// Linux with glibc.
pub fn decide_here() -> Result<String, Keep> {
    #[cfg(all(target_os = "linux", target_arch = "x86_64", target_env = "gnu"))]
    {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let (vendor, fsrm) = parse_cpuinfo(&cpuinfo);
        let tunables = std::env::var(ENV).ok();
        decide(&Host {
            vendor,
            fsrm,
            glibc: parse_glibc_version(&sys::glibc_version()),
            tunables: tunables.as_deref(),
            secure: sys::secure_mode(),
        })
    }
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64", target_env = "gnu")))]
    Err(Keep::NotAffected)
}

/// Executes the binary again with [`TUNABLE`] set when [`decide_here`]
/// says so; returns when it does not (or when executing failed, which
/// [`outcome`] then reports). Call it first in `main`, before any thread
/// starts.
pub fn use_vector_copies() {
    let text = match decide_here() {
        Ok(value) => {
            use std::os::unix::process::CommandExt;
            let mut args = std::env::args_os();
            let arg0 = args.next().unwrap_or_default();
            // Only returns when the execution failed.
            let err = std::process::Command::new("/proc/self/exe")
                .arg0(arg0)
                .args(args)
                .env(ENV, value)
                .exec();
            format!(
                "memcpy: could not execute again with {ENV} set ({err}); copies of 2 KiB and \
                 more stay slow on this CPU (glibc bug 30994)"
            )
        }
        Err(Keep::AlreadySet)
            if std::env::var(ENV)
                .is_ok_and(|t| value_in(&t) == Some(THRESHOLD.to_string().as_str())) =>
        {
            format!(
                "memcpy: {TUNABLE}={THRESHOLD} (AMD CPU with FSRM and glibc before 2.40: bug 30994)"
            )
        }
        Err(Keep::AlreadySet) => format!("memcpy: {TUNABLE} set by {ENV}, kept"),
        Err(Keep::SecureMode) => format!(
            "memcpy: secure mode, {TUNABLE} cannot be set; copies of 2 KiB and more stay slow \
             on this CPU (glibc bug 30994)"
        ),
        Err(Keep::NotAffected | Keep::GlibcDecides) => return,
    };
    let _ = OUTCOME.set(text);
}

#[cfg(all(target_os = "linux", target_arch = "x86_64", target_env = "gnu"))]
#[allow(unsafe_code)]
mod sys {
    /// glibc's version string ("2.36").
    pub(super) fn glibc_version() -> String {
        // SAFETY: gnu_get_libc_version takes no arguments and returns a
        // pointer to a static NUL-terminated string owned by glibc.
        let ptr = unsafe { libc::gnu_get_libc_version() };
        if ptr.is_null() {
            return String::new();
        }
        // SAFETY: non-null, NUL-terminated and static (see above).
        unsafe { std::ffi::CStr::from_ptr(ptr) }
            .to_string_lossy()
            .into_owned()
    }

    /// Whether the kernel started the process in secure mode.
    pub(super) fn secure_mode() -> bool {
        // SAFETY: getauxval only reads the process's auxiliary vector.
        unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zen(tunables: Option<&str>) -> Host<'_> {
        Host {
            vendor: "AuthenticAMD",
            fsrm: true,
            glibc: Some((2, 36)),
            tunables,
            secure: false,
        }
    }

    #[test]
    fn an_amd_cpu_with_fsrm_and_an_old_glibc_gets_the_tunable() {
        assert_eq!(decide(&zen(None)), Ok(format!("{TUNABLE}={THRESHOLD}")));
        // The operator's other tunables are kept, in front.
        assert_eq!(
            decide(&zen(Some("glibc.malloc.arena_max=2"))),
            Ok(format!("glibc.malloc.arena_max=2:{TUNABLE}={THRESHOLD}"))
        );
        assert_eq!(decide(&zen(Some(""))), Ok(format!("{TUNABLE}={THRESHOLD}")));
    }

    #[test]
    fn other_hosts_keep_glibcs_choice() {
        // The Zen host with one fact changed.
        let but = |change: fn(&mut Host<'static>)| {
            let mut host = zen(None);
            change(&mut host);
            host
        };
        let cases = [
            (but(|h| h.vendor = "GenuineIntel"), Keep::NotAffected),
            (but(|h| h.fsrm = false), Keep::NotAffected),
            (but(|h| h.glibc = Some((2, 40))), Keep::GlibcDecides),
            (but(|h| h.glibc = Some((3, 0))), Keep::GlibcDecides),
            (but(|h| h.glibc = None), Keep::GlibcDecides),
            (but(|h| h.secure = true), Keep::SecureMode),
        ];
        for (host, keep) in cases {
            assert_eq!(decide(&host), Err(keep), "{host:?}");
        }
    }

    #[test]
    fn a_set_tunable_is_kept_so_the_second_start_does_not_execute_again() {
        let ours = decide(&zen(None)).unwrap();
        assert_eq!(decide(&zen(Some(&ours))), Err(Keep::AlreadySet));
        let operator = format!("glibc.malloc.arena_max=2:{TUNABLE}=2048");
        assert_eq!(decide(&zen(Some(&operator))), Err(Keep::AlreadySet));
        // A tunable whose name only starts like it is another one.
        let other = format!("{TUNABLE}_x=1");
        assert!(decide(&zen(Some(&other))).is_ok());
    }

    #[test]
    fn cpuinfo_and_glibc_versions_parse() {
        let text = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n\
                    flags\t\t: fpu erms fsrm avx2\n\nprocessor\t: 1\nvendor_id\t: Other\n";
        assert_eq!(parse_cpuinfo(text), ("AuthenticAMD", true));
        let no_fsrm = "vendor_id : AuthenticAMD\nflags : fpu erms fsrmx\n";
        assert_eq!(parse_cpuinfo(no_fsrm), ("AuthenticAMD", false));
        assert_eq!(parse_cpuinfo(""), ("", false));
        assert_eq!(parse_glibc_version("2.36"), Some((2, 36)));
        assert_eq!(parse_glibc_version("2.41.9000"), Some((2, 41)));
        assert_eq!(parse_glibc_version("2.39rc"), Some((2, 39)));
        assert_eq!(parse_glibc_version("x"), None);
    }
}
