//! A real Kubernetes control plane for the token and lease suites: etcd and
//! kube-apiserver (v1.36, built by `scripts/kube-build` into
//! `target/kube/`), kubectl, a throw-away PKI, a service-account signing key
//! and an admin kubeconfig. Only what TokenReview, TokenRequest and Leases
//! need: no controller-manager, no scheduler, no network isolation.
//!
//! [`KubeBins::find`] looks in `$KONN_KUBE_BIN_DIR`, `$CARGO_TARGET_DIR/kube`
//! and the workspace's `target/kube`. [`require_or_skip`] turns "not found"
//! into a loud skip, or into a failure when `KONN_KUBE_REQUIRED=1` (CI).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::ports::free_port;
use crate::procs::Proc;

/// The static token of a user who is not a service account.
pub const ALICE_TOKEN: &str = "konn-alice-static-token";
/// The static token of a user whose name has four parts but is not a
/// service account.
pub const NODE_TOKEN: &str = "konn-node-static-token";

/// The control-plane binaries.
#[derive(Debug, Clone)]
pub struct KubeBins {
    /// Their directory.
    pub dir: PathBuf,
}

impl KubeBins {
    /// Where `scripts/kube-build` put them, if it did.
    pub fn find() -> Option<Self> {
        let mut dirs = Vec::new();
        if let Some(d) = std::env::var_os("KONN_KUBE_BIN_DIR") {
            dirs.push(PathBuf::from(d));
        }
        if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
            dirs.push(PathBuf::from(t).join("kube"));
        }
        dirs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/kube"));
        dirs.into_iter()
            .find(|d| {
                ["etcd", "kube-apiserver", "kubectl"]
                    .iter()
                    .all(|b| d.join(b).is_file())
            })
            .map(|dir| Self { dir })
    }

    fn bin(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// The binaries, or `None` after a loud skip message; panics instead when
/// `KONN_KUBE_REQUIRED=1` (scripts/test in CI makes them mandatory).
pub fn require_or_skip(suite: &str) -> Option<KubeBins> {
    if let Some(b) = KubeBins::find() {
        return Some(b);
    }
    let msg = format!(
        "{suite}: SKIPPED — no etcd/kube-apiserver/kubectl under target/kube (run scripts/kube-build, or set KONN_KUBE_BIN_DIR)"
    );
    assert!(
        std::env::var("KONN_KUBE_REQUIRED").as_deref() != Ok("1"),
        "{msg}; KONN_KUBE_REQUIRED=1 makes this a failure"
    );
    eprintln!("\n!!!!!!!! {msg} !!!!!!!!\n");
    None
}

/// A running etcd + kube-apiserver.
pub struct Cluster {
    bins: KubeBins,
    dir: PathBuf,
    /// The CA of every certificate here (kube-apiserver's serving one too).
    pub ca: PathBuf,
    /// An admin kubeconfig (`system:masters`).
    pub kubeconfig: PathBuf,
    /// kube-apiserver's address.
    pub addr: SocketAddr,
    sa_key: KeyPair,
    issuer: String,
    etcd: Option<Proc>,
    apiserver: Option<Proc>,
    apiserver_args: Vec<String>,
}

fn write(p: &Path, body: &str) -> PathBuf {
    std::fs::write(p, body).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    p.to_owned()
}

impl Cluster {
    /// Start etcd and kube-apiserver under `dir` and wait until
    /// kube-apiserver is ready (at most a minute).
    ///
    /// # Panics
    ///
    /// When something cannot start (the logs are in `dir`).
    pub fn start(bins: KubeBins, dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("cluster dir");
        // PKI.
        let ca_key = KeyPair::generate().expect("key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.distinguished_name
            .push(DnType::CommonName, "konn kube CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_pem = ca.self_signed(&ca_key).expect("ca").pem();
        let issuer = Issuer::new(ca, ca_key);
        let leaf = |cn: &str, org: Option<&str>, server: bool| {
            let key = KeyPair::generate().expect("key");
            let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
            p.distinguished_name.push(DnType::CommonName, cn);
            if let Some(o) = org {
                p.distinguished_name.push(DnType::OrganizationName, o);
            }
            p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            if server {
                p.subject_alt_names = vec![
                    SanType::DnsName("localhost".try_into().expect("dns")),
                    SanType::DnsName("kubernetes.default.svc".try_into().expect("dns")),
                    SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()),
                ];
                p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            } else {
                p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            }
            let cert = p.signed_by(&key, &issuer).expect("sign");
            (cert.pem(), key.serialize_pem())
        };
        let ca = write(&dir.join("ca.crt"), &ca_pem);
        let (sc, sk) = leaf("kube-apiserver", None, true);
        let (ac, ak) = leaf("konn-admin", Some("system:masters"), false);
        let serving = (
            write(&dir.join("apiserver.crt"), &sc),
            write(&dir.join("apiserver.key"), &sk),
        );
        let admin = (
            write(&dir.join("admin.crt"), &ac),
            write(&dir.join("admin.key"), &ak),
        );
        let sa_key = KeyPair::generate().expect("sa key");
        let sa_priv = write(&dir.join("sa.key"), &sa_key.serialize_pem());
        let sa_pub = write(&dir.join("sa.pub"), &sa_key.public_key_pem());
        let tokens = write(
            &dir.join("tokens.csv"),
            &format!(
                "{ALICE_TOKEN},alice,uid-alice,\"people\"\n{NODE_TOKEN},system:node:konn-node:x,uid-node,\"system:nodes\"\n"
            ),
        );
        // etcd.
        let (cport, pport) = (free_port(), free_port());
        let cu = format!("http://127.0.0.1:{cport}");
        let pu = format!("http://127.0.0.1:{pport}");
        let etcd_args: Vec<String> = vec![
            "--name=konn".into(),
            format!("--data-dir={}", dir.join("etcd-data").display()),
            format!("--listen-client-urls={cu}"),
            format!("--advertise-client-urls={cu}"),
            format!("--listen-peer-urls={pu}"),
            format!("--initial-advertise-peer-urls={pu}"),
            format!("--initial-cluster=konn={pu}"),
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ];
        let etcd =
            Proc::spawn(&bins.bin("etcd"), &etcd_args, &dir.join("etcd.log")).expect("etcd starts");
        let port = free_port();
        let issuer_url = "https://kubernetes.default.svc.cluster.local".to_owned();
        let apiserver_args: Vec<String> = vec![
            format!("--etcd-servers={cu}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--tls-cert-file={}", serving.0.display()),
            format!("--tls-private-key-file={}", serving.1.display()),
            format!("--client-ca-file={}", ca.display()),
            format!("--service-account-issuer={issuer_url}"),
            format!("--service-account-key-file={}", sa_pub.display()),
            format!("--service-account-signing-key-file={}", sa_priv.display()),
            // Static tokens (non-SA users) are reviewed only for these
            // audiences.
            format!("--api-audiences={issuer_url},system:konnectivity-server"),
            format!("--token-auth-file={}", tokens.display()),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--authorization-mode=RBAC".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ];
        let apiserver = Proc::spawn(
            &bins.bin("kube-apiserver"),
            &apiserver_args,
            &dir.join("kube-apiserver.log"),
        )
        .expect("kube-apiserver starts");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let kubeconfig = write(
            &dir.join("admin.kubeconfig"),
            &format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: konn\n  cluster:\n    server: https://{addr}\n    certificate-authority: {}\n\
                 users:\n- name: admin\n  user:\n    client-certificate: {}\n    client-key: {}\n\
                 contexts:\n- name: konn\n  context:\n    cluster: konn\n    user: admin\ncurrent-context: konn\n",
                ca.display(),
                admin.0.display(),
                admin.1.display()
            ),
        );
        let c = Self {
            bins,
            dir: dir.to_owned(),
            ca,
            kubeconfig,
            addr,
            sa_key,
            issuer: issuer_url,
            etcd: Some(etcd),
            apiserver: Some(apiserver),
            apiserver_args,
        };
        c.wait_ready(Duration::from_secs(90));
        c
    }

    /// Poll `/readyz` until it answers `ok`.
    ///
    /// # Panics
    ///
    /// Not ready in time.
    pub fn wait_ready(&self, limit: Duration) {
        let polls = limit.as_millis() / 250;
        for _ in 0..polls {
            if self
                .try_kubectl(&["get", "--raw", "/readyz"])
                .is_ok_and(|o| o.trim() == "ok")
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!(
            "kube-apiserver not ready within {limit:?}; log tail:\n{}",
            self.apiserver
                .as_ref()
                .map(|p| p.log_tail(30))
                .unwrap_or_default()
        );
    }

    /// Run kubectl with the admin kubeconfig.
    ///
    /// # Errors
    ///
    /// Its stderr when it fails.
    pub fn try_kubectl(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(self.bins.bin("kubectl"))
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!(
                "--cache-dir={}",
                self.dir.join("kubectl-cache").display()
            ))
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// [`Cluster::try_kubectl`] that must succeed.
    ///
    /// # Panics
    ///
    /// kubectl failed.
    pub fn kubectl(&self, args: &[&str]) -> String {
        self.try_kubectl(args)
            .unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"))
    }

    /// Create service account `ns/name` (and `ns`) if missing.
    pub fn service_account(&self, ns: &str, name: &str) {
        let _ = self.try_kubectl(&["create", "namespace", ns]);
        let _ = self.try_kubectl(&["-n", ns, "create", "serviceaccount", name]);
    }

    /// A TokenRequest token (`kubectl create token`).
    pub fn token(&self, ns: &str, sa: &str, audience: &str) -> String {
        self.kubectl(&["-n", ns, "create", "token", sa, "--audience", audience])
            .trim()
            .to_owned()
    }

    /// A service-account token signed with the cluster's key whose `exp`
    /// lies an hour in the past (TokenRequest refuses lifetimes under ten
    /// minutes, so an expired one has to be made by hand).
    pub fn expired_token(&self, ns: &str, sa: &str, audience: &str) -> String {
        let uid = self.kubectl(&["-n", ns, "get", "sa", sa, "-o", "jsonpath={.metadata.uid}"]);
        let now = std::time::UNIX_EPOCH
            .elapsed()
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let kid = b64.encode(aws_lc_rs::digest::digest(
            &aws_lc_rs::digest::SHA256,
            &rcgen::PublicKeyData::subject_public_key_info(&self.sa_key),
        ));
        let header = serde_json::json!({"alg": "ES256", "kid": kid, "typ": "JWT"});
        let claims = serde_json::json!({
            "aud": [audience],
            "exp": now - 3600,
            "iat": now - 7200,
            "nbf": now - 7200,
            "iss": self.issuer,
            "sub": format!("system:serviceaccount:{ns}:{sa}"),
            "kubernetes.io": {"namespace": ns, "serviceaccount": {"name": sa, "uid": uid}},
        });
        let signing_input = format!(
            "{}.{}",
            b64.encode(header.to_string()),
            b64.encode(claims.to_string())
        );
        let key = aws_lc_rs::signature::EcdsaKeyPair::from_pkcs8(
            &aws_lc_rs::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &self.sa_key.serialize_der(),
        )
        .expect("the service-account key");
        let sig = key
            .sign(
                &aws_lc_rs::rand::SystemRandom::new(),
                signing_input.as_bytes(),
            )
            .expect("sign");
        format!("{signing_input}.{}", b64.encode(sig.as_ref()))
    }

    /// Stop kube-apiserver (etcd keeps running).
    pub fn stop_apiserver(&mut self) {
        if let Some(mut p) = self.apiserver.take() {
            p.kill();
        }
    }

    /// Start kube-apiserver again and wait until it is ready.
    pub fn start_apiserver(&mut self) {
        let p = Proc::spawn(
            &self.bins.bin("kube-apiserver"),
            &self.apiserver_args,
            &self.dir.join("kube-apiserver.log"),
        )
        .expect("kube-apiserver restarts");
        self.apiserver = Some(p);
        self.wait_ready(Duration::from_secs(90));
    }

    /// The directory of the cluster's files and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// kube-apiserver's count of TokenReview creations so far (its own
    /// `apiserver_request_total` metric).
    pub fn token_reviews(&self) -> u64 {
        let m = self.kubectl(&["get", "--raw", "/metrics"]);
        m.lines()
            .filter(|l| {
                l.starts_with("apiserver_request_total{")
                    && l.contains("resource=\"tokenreviews\"")
                    && l.contains("verb=\"POST\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_apiserver();
        if let Some(mut e) = self.etcd.take() {
            e.kill();
        }
    }
}
