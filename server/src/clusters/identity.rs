//! Which client certificates a cluster accepts beyond its CA
//! (`allowedClients` in `--clusters-config`): rules on the end-entity
//! certificate's subject alternative names and subject, checked by the
//! listener's TLS verifier after the chain verified
//! (`konn_core::io::tls::ClientIdentityCheck`). One rule matching is
//! enough; a certificate that matches none fails the handshake.

use konn_core::io::tls::{CertificateDer, ClientIdentityCheck};
use x509_parser::extensions::GeneralName;

/// One rule: the certificate must carry this value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubjectRule {
    /// A subject common name (CN), exactly.
    CommonName(String),
    /// A subject organizational unit (OU), exactly.
    OrganizationalUnit(String),
    /// A DNS subject alternative name (ASCII case-insensitive).
    DnsName(String),
    /// A URI subject alternative name (e.g. a SPIFFE id), exactly.
    Uri(String),
}

/// A cluster's rules (at least one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectRules(pub Vec<SubjectRule>);

impl SubjectRules {
    /// Whether a DER certificate matches one of the rules.
    ///
    /// # Errors
    ///
    /// Why not: the certificate does not parse, or no rule matches.
    pub fn matches(&self, der: &[u8]) -> Result<(), String> {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| format!("certificate does not parse: {e}"))?;
        let subject = cert.subject();
        let sans: Vec<GeneralName<'_>> = cert
            .subject_alternative_name()
            .ok()
            .flatten()
            .map(|ext| ext.value.general_names.clone())
            .unwrap_or_default();
        let matched = self.0.iter().any(|rule| match rule {
            SubjectRule::CommonName(want) => subject
                .iter_common_name()
                .any(|a| a.as_str().is_ok_and(|v| v == want)),
            SubjectRule::OrganizationalUnit(want) => subject
                .iter_organizational_unit()
                .any(|a| a.as_str().is_ok_and(|v| v == want)),
            SubjectRule::DnsName(want) => sans
                .iter()
                .any(|n| matches!(n, GeneralName::DNSName(v) if v.eq_ignore_ascii_case(want))),
            SubjectRule::Uri(want) => sans
                .iter()
                .any(|n| matches!(n, GeneralName::URI(v) if v == want)),
        });
        if matched {
            Ok(())
        } else {
            Err(format!("subject {subject} matches no allowedClients rule"))
        }
    }
}

impl ClientIdentityCheck for SubjectRules {
    fn check(&self, end_entity: &CertificateDer<'_>) -> Result<(), String> {
        self.matches(end_entity.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};

    fn cert(cn: &str, ou: &str, dns: &str, uri: &str) -> Vec<u8> {
        let mut p = CertificateParams::new(vec![dns.to_owned()]).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.distinguished_name
            .push(DnType::OrganizationalUnitName, ou);
        p.subject_alt_names
            .push(SanType::URI(uri.try_into().unwrap()));
        let key = KeyPair::generate().unwrap();
        p.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn any_rule_matching_admits() {
        let der = cert("agent", "cluster-a", "agent.a.example", "spiffe://a/agent");
        let ok = |r: SubjectRule| SubjectRules(vec![r]).matches(&der);
        assert!(ok(SubjectRule::CommonName("agent".into())).is_ok());
        assert!(ok(SubjectRule::OrganizationalUnit("cluster-a".into())).is_ok());
        assert!(ok(SubjectRule::DnsName("AGENT.a.example".into())).is_ok());
        assert!(ok(SubjectRule::Uri("spiffe://a/agent".into())).is_ok());
        for wrong in [
            SubjectRule::CommonName("agent2".into()),
            SubjectRule::OrganizationalUnit("cluster-b".into()),
            SubjectRule::DnsName("agent.b.example".into()),
            SubjectRule::Uri("spiffe://b/agent".into()),
        ] {
            assert!(ok(wrong.clone()).is_err(), "{wrong:?}");
        }
        let two = SubjectRules(vec![
            SubjectRule::OrganizationalUnit("cluster-b".into()),
            SubjectRule::Uri("spiffe://a/agent".into()),
        ]);
        assert!(two.matches(&der).is_ok());
        assert!(
            SubjectRules(vec![SubjectRule::CommonName("x".into())])
                .matches(b"not a certificate")
                .is_err()
        );
    }
}
