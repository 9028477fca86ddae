//! Go TLS flag values (`--tls-min-version`, `--cipher-suites`) mapped to rustls.
//!
//! Upstream takes Go names: `VersionTLS10`..`VersionTLS13`, and the names of
//! Go's `tls.CipherSuites()` (plus its insecure list). rustls implements a
//! subset of those, so every Go name falls into one of three classes:
//! - implemented by rustls: mapped to the rustls suite;
//! - a real Go suite rustls deliberately leaves out (CBC mode, RSA key
//!   exchange, 3DES, RC4): an [`Error::UnsupportedCipherSuite`] that says so,
//!   rather than silently dropping it;
//! - anything else: [`Error::UnknownCipherSuite`].
//!
//! Versions: rustls has no TLS 1.0/1.1. Upstream only warns when the minimum
//! is below 1.2, so `VersionTLS10`/`VersionTLS11` are accepted, raised to 1.2
//! and reported as a [`TlsWarning`] for the caller to log.

use std::fmt;

use rustls::crypto::CryptoProvider;
use rustls::{CipherSuite, SupportedCipherSuite, SupportedProtocolVersion};

use crate::error::Error;

/// Lowest TLS version a server accepts (from `--tls-min-version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMinVersion {
    /// TLS 1.2 and 1.3 (upstream's default).
    #[default]
    Tls12,
    /// TLS 1.3 only.
    Tls13,
}

impl TlsMinVersion {
    /// Parses an upstream `--tls-min-version` value. Empty means the default
    /// (TLS 1.2). `VersionTLS10`/`VersionTLS11` give TLS 1.2 plus a warning.
    pub fn from_go_name(value: &str) -> Result<(Self, Option<TlsWarning>), Error> {
        match value.trim() {
            "" | "VersionTLS12" => Ok((Self::Tls12, None)),
            "VersionTLS13" => Ok((Self::Tls13, None)),
            v @ ("VersionTLS10" | "VersionTLS11") => Ok((
                Self::Tls12,
                Some(TlsWarning::MinVersionRaised {
                    requested: v.to_owned(),
                }),
            )),
            other => Err(Error::UnknownTlsVersion(other.to_owned())),
        }
    }

    /// The Go name of this minimum (`VersionTLS12`, `VersionTLS13`).
    pub fn go_name(self) -> &'static str {
        match self {
            Self::Tls12 => "VersionTLS12",
            Self::Tls13 => "VersionTLS13",
        }
    }

    /// The rustls protocol versions this minimum enables.
    pub fn versions(self) -> &'static [&'static SupportedProtocolVersion] {
        static TLS12_UP: [&SupportedProtocolVersion; 2] =
            [&rustls::version::TLS13, &rustls::version::TLS12];
        static TLS13_ONLY: [&SupportedProtocolVersion; 1] = [&rustls::version::TLS13];
        match self {
            Self::Tls12 => &TLS12_UP,
            Self::Tls13 => &TLS13_ONLY,
        }
    }
}

/// Something in the TLS flags that konn accepted but changed; the binaries
/// log these at start-up.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsWarning {
    /// `--tls-min-version` asked for TLS 1.0 or 1.1, which rustls does not
    /// implement; TLS 1.2 is the minimum instead.
    MinVersionRaised {
        /// The value given.
        requested: String,
    },
}

impl fmt::Display for TlsWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MinVersionRaised { requested } => write!(
                f,
                "--tls-min-version={requested} is insecure and not supported; using VersionTLS12"
            ),
        }
    }
}

/// How a Go cipher suite name maps to rustls.
enum GoSuite {
    /// rustls implements it.
    Rustls(CipherSuite),
    /// Go implements it, rustls does not; the text says why.
    Missing(&'static str),
}

const CBC: &str = "CBC-mode suites are not implemented (rustls only offers AEAD suites)";
const RSA_KX: &str = "RSA key exchange is not implemented (no forward secrecy)";
const DES3: &str = "3DES is not implemented (64-bit block cipher)";
const RC4: &str = "RC4 is not implemented (broken stream cipher)";

/// Go's cipher suite names (`tls.CipherSuites()` and
/// `tls.InsecureCipherSuites()`, plus the two legacy ChaCha20 aliases).
fn go_suite(name: &str) -> Option<GoSuite> {
    use GoSuite::{Missing, Rustls};
    Some(match name {
        // TLS 1.3.
        "TLS_AES_128_GCM_SHA256" => Rustls(CipherSuite::TLS13_AES_128_GCM_SHA256),
        "TLS_AES_256_GCM_SHA384" => Rustls(CipherSuite::TLS13_AES_256_GCM_SHA384),
        "TLS_CHACHA20_POLY1305_SHA256" => Rustls(CipherSuite::TLS13_CHACHA20_POLY1305_SHA256),
        // TLS 1.2 ECDHE + AEAD.
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" => {
            Rustls(CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256)
        }
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384" => {
            Rustls(CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384)
        }
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" => {
            Rustls(CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)
        }
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" => {
            Rustls(CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384)
        }
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"
        | "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305" => {
            Rustls(CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256)
        }
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256" | "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305" => {
            Rustls(CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256)
        }
        // Go suites rustls leaves out.
        "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA"
        | "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA"
        | "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"
        | "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA"
        | "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256"
        | "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256" => Missing(CBC),
        "TLS_RSA_WITH_AES_128_CBC_SHA"
        | "TLS_RSA_WITH_AES_256_CBC_SHA"
        | "TLS_RSA_WITH_AES_128_CBC_SHA256"
        | "TLS_RSA_WITH_AES_128_GCM_SHA256"
        | "TLS_RSA_WITH_AES_256_GCM_SHA384" => Missing(RSA_KX),
        "TLS_RSA_WITH_3DES_EDE_CBC_SHA" | "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA" => Missing(DES3),
        "TLS_RSA_WITH_RC4_128_SHA"
        | "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA"
        | "TLS_ECDHE_RSA_WITH_RC4_128_SHA" => Missing(RC4),
        _ => return None,
    })
}

/// Maps `--cipher-suites` (Go names) to the suites of `provider`.
///
/// - Empty: all of the provider's suites (rustls defaults).
/// - TLS 1.2 suites: exactly the ones named (Go semantics). Naming only
///   TLS 1.3 suites therefore leaves TLS 1.2 without suites, as in Go.
/// - TLS 1.3 suites: the ones named, or all of them when none is named. Go
///   ignores TLS 1.3 names (its 1.3 suites are not configurable); restricting
///   them when named is a konn extension and only ever narrows the set.
///
/// Order follows the provider's preference, not the flag's (Go also uses its
/// own order since 1.17). Duplicates are harmless.
pub fn cipher_suites_from_go_names<S: AsRef<str>>(
    names: &[S],
    provider: &CryptoProvider,
) -> Result<Vec<SupportedCipherSuite>, Error> {
    let mut wanted = Vec::with_capacity(names.len());
    for name in names {
        let name = name.as_ref().trim();
        let suite = match go_suite(name) {
            Some(GoSuite::Rustls(suite)) => suite,
            Some(GoSuite::Missing(reason)) => {
                return Err(Error::UnsupportedCipherSuite {
                    name: name.to_owned(),
                    reason,
                });
            }
            None => return Err(Error::UnknownCipherSuite(name.to_owned())),
        };
        // Fail closed: a name that maps to nothing would otherwise widen
        // or silently change the selection.
        if !provider.cipher_suites.iter().any(|s| s.suite() == suite) {
            return Err(Error::TlsConfig(format!(
                "cipher suite {name} is not offered by the crypto provider"
            )));
        }
        wanted.push(suite);
    }
    if wanted.is_empty() {
        return Ok(provider.cipher_suites.clone());
    }
    let is_tls13 = |s: &SupportedCipherSuite| matches!(s, SupportedCipherSuite::Tls13(_));
    let any_tls13_named = provider
        .cipher_suites
        .iter()
        .any(|s| is_tls13(s) && wanted.contains(&s.suite()));
    let selected = provider
        .cipher_suites
        .iter()
        .filter(|s| wanted.contains(&s.suite()) || (is_tls13(s) && !any_tls13_named))
        .copied()
        .collect();
    Ok(selected)
}

/// Go's preference among the suites rustls implements, on hardware with
/// AES-GCM support (crypto/tls `defaultCipherSuitesTLS13` and
/// `cipherSuitesPreferenceOrder`): AES-128-GCM first, then AES-256-GCM,
/// then ChaCha20-Poly1305, ECDSA before RSA in TLS 1.2. Smaller is
/// preferred; suites Go does not list come last.
pub fn go_preference(suite: CipherSuite) -> u8 {
    match suite {
        CipherSuite::TLS13_AES_128_GCM_SHA256 => 0,
        CipherSuite::TLS13_AES_256_GCM_SHA384 => 1,
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => 2,
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 => 10,
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => 11,
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 => 12,
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => 13,
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256 => 14,
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => 15,
        _ => u8::MAX,
    }
}

/// `provider` with its suites in Go's preference order ([`go_preference`]).
pub fn in_go_order(mut provider: CryptoProvider) -> CryptoProvider {
    provider
        .cipher_suites
        .sort_by_key(|s| go_preference(s.suite()));
    provider
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> CryptoProvider {
        rustls::crypto::aws_lc_rs::default_provider()
    }

    fn suites(names: &[&str]) -> Vec<CipherSuite> {
        cipher_suites_from_go_names(names, &provider())
            .unwrap()
            .iter()
            .map(|s| s.suite())
            .collect()
    }

    #[test]
    fn empty_list_is_the_provider_default() {
        let all: Vec<_> = provider().cipher_suites.iter().map(|s| s.suite()).collect();
        assert_eq!(suites(&[]), all);
        assert_eq!(
            all.len(),
            9,
            "aws-lc-rs offers 3 TLS 1.3 + 6 TLS 1.2 suites"
        );
    }

    #[test]
    fn every_supported_go_name_maps_to_its_suite() {
        let cases = [
            (
                "TLS_AES_128_GCM_SHA256",
                CipherSuite::TLS13_AES_128_GCM_SHA256,
            ),
            (
                "TLS_AES_256_GCM_SHA384",
                CipherSuite::TLS13_AES_256_GCM_SHA384,
            ),
            (
                "TLS_CHACHA20_POLY1305_SHA256",
                CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
            ),
            (
                "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
                CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            ),
            (
                "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
                CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            ),
            (
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            ),
            (
                "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
                CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
            ),
            (
                "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
                CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            ),
            (
                "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
                CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
            ),
            (
                "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
                CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
            ),
            (
                "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
                CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            ),
        ];
        for (name, suite) in cases {
            let got = suites(&[name]);
            assert!(got.contains(&suite), "{name} -> {got:?}");
        }
    }

    #[test]
    fn naming_tls12_suites_restricts_tls12_and_keeps_all_tls13() {
        let got = suites(&[
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            " TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        ]);
        assert_eq!(
            got,
            vec![
                CipherSuite::TLS13_AES_256_GCM_SHA384,
                CipherSuite::TLS13_AES_128_GCM_SHA256,
                CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
                CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
                CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            ]
        );
    }

    #[test]
    fn naming_a_tls13_suite_restricts_tls13_and_leaves_tls12_without_suites() {
        let got = suites(&["TLS_AES_128_GCM_SHA256"]);
        assert_eq!(got, vec![CipherSuite::TLS13_AES_128_GCM_SHA256]);
    }

    #[test]
    fn suites_follow_gos_preference() {
        let names: Vec<_> = in_go_order(provider())
            .cipher_suites
            .iter()
            .map(|s| s.suite())
            .collect();
        assert_eq!(
            names[..3],
            [
                CipherSuite::TLS13_AES_128_GCM_SHA256,
                CipherSuite::TLS13_AES_256_GCM_SHA384,
                CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
            ]
        );
        assert_eq!(
            names[3],
            CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        );
        assert_eq!(names.len(), provider().cipher_suites.len());
    }

    #[test]
    fn go_suites_rustls_lacks_are_named_with_the_reason() {
        for (name, reason) in [
            ("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", CBC),
            ("TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256", CBC),
            ("TLS_RSA_WITH_AES_128_GCM_SHA256", RSA_KX),
            ("TLS_RSA_WITH_AES_256_CBC_SHA", RSA_KX),
            ("TLS_RSA_WITH_3DES_EDE_CBC_SHA", DES3),
            ("TLS_ECDHE_RSA_WITH_RC4_128_SHA", RC4),
        ] {
            match cipher_suites_from_go_names(&["TLS_AES_128_GCM_SHA256", name], &provider()) {
                Err(Error::UnsupportedCipherSuite { name: n, reason: r }) => {
                    assert_eq!(n, name);
                    assert_eq!(r, reason);
                }
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    #[test]
    fn unknown_names_are_rejected() {
        for name in [
            "TLS_FOO",
            "tls_aes_128_gcm_sha256",
            "TLS_FALLBACK_SCSV",
            "",
            "TLS13_AES_128_GCM_SHA256",
        ] {
            match cipher_suites_from_go_names(&[name], &provider()) {
                Err(Error::UnknownCipherSuite(n)) => assert_eq!(n, name.trim()),
                other => panic!("{name:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_provider_without_the_named_suite_is_a_config_error() {
        let mut p = provider();
        p.cipher_suites
            .retain(|s| s.suite() != CipherSuite::TLS13_AES_128_GCM_SHA256);
        for names in [
            &["TLS_AES_128_GCM_SHA256"][..],
            &[
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                "TLS_AES_128_GCM_SHA256",
            ][..],
        ] {
            match cipher_suites_from_go_names(names, &p) {
                Err(Error::TlsConfig(why)) => {
                    assert!(why.contains("TLS_AES_128_GCM_SHA256"), "{why}")
                }
                other => panic!("{names:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn min_version_mapping() {
        assert_eq!(
            TlsMinVersion::from_go_name("").unwrap(),
            (TlsMinVersion::Tls12, None)
        );
        assert_eq!(
            TlsMinVersion::from_go_name("VersionTLS12").unwrap(),
            (TlsMinVersion::Tls12, None)
        );
        assert_eq!(
            TlsMinVersion::from_go_name("VersionTLS13").unwrap(),
            (TlsMinVersion::Tls13, None)
        );
        for old in ["VersionTLS10", "VersionTLS11"] {
            let (v, w) = TlsMinVersion::from_go_name(old).unwrap();
            assert_eq!(v, TlsMinVersion::Tls12);
            let w = w.expect("a warning");
            assert_eq!(
                w,
                TlsWarning::MinVersionRaised {
                    requested: old.to_owned()
                }
            );
            assert!(w.to_string().contains(old));
        }
        for bad in [
            "TLS12",
            "VersionTLS14",
            "versiontls12",
            "1.2",
            "VersionSSL30",
        ] {
            assert!(
                matches!(TlsMinVersion::from_go_name(bad), Err(Error::UnknownTlsVersion(v)) if v == bad),
                "{bad}"
            );
        }
    }

    #[test]
    fn min_version_versions() {
        assert_eq!(TlsMinVersion::Tls12.versions().len(), 2);
        let v13 = TlsMinVersion::Tls13.versions();
        assert_eq!(v13.len(), 1);
        assert_eq!(v13[0].version, rustls::ProtocolVersion::TLSv1_3);
    }
}
