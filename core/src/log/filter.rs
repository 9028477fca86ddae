//! Which events are logged: klog's `-v` and `--vmodule` mapped onto
//! `tracing` levels (the table is in the module docs of `log`).
//!
//! The decision depends only on a callsite's static metadata, so it is made
//! once per callsite (tracing caches it as the callsite's interest); a
//! disabled `debug!` costs one relaxed atomic load.

use tracing::Level;
use tracing::level_filters::LevelFilter;
use tracing::metadata::Metadata;

use super::flags::ModulePattern;

/// The most detailed tracing level enabled at klog verbosity `v`.
pub fn level_for_verbosity(v: i32) -> LevelFilter {
    match v {
        i32::MIN..=1 => LevelFilter::INFO,
        2..=3 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

/// The verbosity filter of one logger.
#[derive(Debug, Clone)]
pub(crate) struct Filter {
    verbosity: i32,
    vmodule: Vec<ModulePattern>,
}

impl Filter {
    pub(crate) fn new(verbosity: i32, vmodule: Vec<ModulePattern>) -> Self {
        Self { verbosity, vmodule }
    }

    /// The most detailed level any callsite may log at.
    pub(crate) fn max_level(&self) -> LevelFilter {
        self.vmodule
            .iter()
            .map(|p| level_for_verbosity(p.level))
            .fold(level_for_verbosity(self.verbosity), LevelFilter::max)
    }

    /// Is this callsite logged?
    pub(crate) fn enabled(&self, meta: &Metadata<'_>) -> bool {
        let v = self
            .vmodule
            .iter()
            .find(|p| matches_callsite(&p.pattern, meta.file(), meta.module_path()))
            .map_or(self.verbosity, |p| p.level);
        *meta.level() <= level_for_verbosity(v) || *meta.level() <= Level::INFO
    }
}

/// Does a `--vmodule` pattern match the code at `file` in `module`?
pub(crate) fn matches_callsite(pattern: &str, file: Option<&str>, module: Option<&str>) -> bool {
    let stem = file.map(|f| {
        let base = f.rsplit(['/', '\\']).next().unwrap_or(f);
        base.strip_suffix(".rs").unwrap_or(base)
    });
    let last_segment = module.map(|m| m.rsplit("::").next().unwrap_or(m));
    [stem, last_segment, module]
        .into_iter()
        .flatten()
        .any(|name| glob_match(pattern.as_bytes(), name.as_bytes()))
}

/// Go's `filepath.Match` on names without separators: `*` any run, `?` one
/// character, `[...]`/`[^...]` classes with ranges, `\` escapes. A
/// malformed pattern matches nothing.
pub(crate) fn glob_match(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|i| glob_match(rest, &name[i..])),
        Some((b'?', rest)) => !name.is_empty() && glob_match(rest, &name[1..]),
        Some((b'[', rest)) => {
            let Some((&c, name_rest)) = name.split_first() else {
                return false;
            };
            match class_match(rest, c) {
                Some((true, after)) => glob_match(after, name_rest),
                _ => false,
            }
        }
        Some((b'\\', rest)) => match (rest.split_first(), name.split_first()) {
            (Some((p, prest)), Some((n, nrest))) => p == n && glob_match(prest, nrest),
            _ => false,
        },
        Some((p, rest)) => name.first() == Some(p) && glob_match(rest, &name[1..]),
    }
}

/// Matches `c` against a class whose `[` was consumed; returns whether it
/// matched and the pattern after `]`, or `None` if the class is malformed.
fn class_match(mut p: &[u8], c: u8) -> Option<(bool, &[u8])> {
    let negated = p.first() == Some(&b'^');
    if negated {
        p = &p[1..];
    }
    let mut matched = false;
    let mut first = true;
    loop {
        let (&lo, rest) = p.split_first()?;
        if lo == b']' && !first {
            return Some((matched != negated, rest));
        }
        first = false;
        let (lo, rest) = if lo == b'\\' {
            let (&e, r) = rest.split_first()?;
            (e, r)
        } else {
            (lo, rest)
        };
        p = rest;
        let mut hi = lo;
        if p.first() == Some(&b'-') && p.get(1).is_some_and(|&x| x != b']') {
            let (&h, r) = p[1..].split_first()?;
            let (h, r) = if h == b'\\' {
                let (&e, r2) = r.split_first()?;
                (e, r2)
            } else {
                (h, r)
            };
            hi = h;
            p = r;
        }
        if lo <= c && c <= hi {
            matched = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosity_mapping() {
        assert_eq!(level_for_verbosity(-1), LevelFilter::INFO);
        assert_eq!(level_for_verbosity(0), LevelFilter::INFO);
        assert_eq!(level_for_verbosity(1), LevelFilter::INFO);
        assert_eq!(level_for_verbosity(2), LevelFilter::DEBUG);
        assert_eq!(level_for_verbosity(3), LevelFilter::DEBUG);
        assert_eq!(level_for_verbosity(4), LevelFilter::TRACE);
        assert_eq!(level_for_verbosity(10), LevelFilter::TRACE);
    }

    #[test]
    fn globs() {
        let m = |p: &str, n: &str| glob_match(p.as_bytes(), n.as_bytes());
        assert!(m("runtime", "runtime"));
        assert!(!m("runtime", "runtimes"));
        assert!(m("run*", "runtime"));
        assert!(m("*time", "runtime"));
        assert!(m("*", ""));
        assert!(m("r?ntime", "runtime"));
        assert!(m("[a-s]untime", "runtime"));
        assert!(!m("[^r]untime", "runtime"));
        assert!(m("[^x]untime", "runtime"));
        assert!(m("\\*", "*"));
        assert!(!m("[a-", "a"), "malformed class matches nothing");
        assert!(m("[]a]", "]"));
    }

    #[test]
    fn callsite_matching() {
        let f = Some("core/src/io/runtime.rs");
        let modp = Some("konn_core::io::runtime");
        assert!(matches_callsite("runtime", f, modp));
        assert!(matches_callsite("konn_core::io::*", f, modp));
        assert!(matches_callsite(
            "io*",
            Some("core/src/io/mod.rs"),
            Some("konn_core::io")
        ));
        assert!(!matches_callsite("tls", f, modp));
        assert!(!matches_callsite("x", None, None));
    }

    #[test]
    fn max_level_covers_vmodule() {
        let f = Filter::new(
            0,
            vec![ModulePattern {
                pattern: "x".into(),
                level: 5,
            }],
        );
        assert_eq!(f.max_level(), LevelFilter::TRACE);
        let f = Filter::new(2, vec![]);
        assert_eq!(f.max_level(), LevelFilter::DEBUG);
    }
}
