package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// PKI is one throw-away CA that signs every certificate of the cluster:
// kube-apiserver's, kubectl's, the kubelet's, the node network's servers',
// and the konnectivity server's, agent's and client's.
type PKI struct {
	Dir    string
	CA     string // PEM file
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64

	APIServer        Pair // kube-apiserver serving
	Admin            Pair // kubectl (system:masters)
	KubeletClient    Pair // kube-apiserver → kubelet
	FrontProxyClient Pair // kube-apiserver → aggregated API servers
	Kubelet          Pair // fake kubelet serving (IP SAN: the node's InternalIP)
	Pods             Pair // webhook and aggregated API serving (service DNS names)
	KonnServer       Pair // proxy-server agent port and TCP frontend
	KonnAgent        Pair // proxy-agent client
	KonnClient       Pair // kube-apiserver's client certificate for HTTPConnect+TCP
	SAKey, SAPub     string
}

// Pair is a certificate and its key, PEM files.
type Pair struct{ Cert, Key string }

// Service DNS names the node network's servers answer to.
const (
	Namespace      = "konn-e2e"
	WebhookService = "konn-webhook"
	APIExtService  = "konn-apiext"
)

// NewPKI writes everything into dir. serverAddrs are the addresses the
// proxy-server is reached at (the agent's and kube-apiserver's side).
func NewPKI(dir string, topo *Topology) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &PKI{Dir: dir, CA: filepath.Join(dir, "ca.crt"), serial: 1}
	var err error
	if p.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "konn kube e2e CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(48 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &p.caKey.PublicKey, p.caKey)
	if err != nil {
		return nil, err
	}
	if p.caCert, err = x509.ParseCertificate(der); err != nil {
		return nil, err
	}
	if err := writePEM(p.CA, "CERTIFICATE", der); err != nil {
		return nil, err
	}

	ips := func(s ...string) []net.IP {
		var out []net.IP
		for _, a := range s {
			out = append(out, net.ParseIP(a))
		}
		return out
	}
	svc := func(name string) []string {
		return []string{name + "." + Namespace + ".svc", name + "." + Namespace + ".svc.cluster.local"}
	}
	steps := []struct {
		pair   *Pair
		file   string
		cn     string
		orgs   []string
		dns    []string
		ips    []net.IP
		server bool
	}{
		{&p.APIServer, "apiserver", "kube-apiserver", nil,
			[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
			ips("127.0.0.1", "10.96.0.1", topo.ServerAddr, topo.NodeIP), true},
		{&p.Admin, "admin", "konn-e2e-admin", []string{"system:masters"}, nil, nil, false},
		{&p.KubeletClient, "kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil, false},
		{&p.FrontProxyClient, "front-proxy-client", "front-proxy-client", nil, nil, nil, false},
		{&p.Kubelet, "kubelet", "system:node:konn-node", []string{"system:nodes"}, []string{"konn-node"}, ips(topo.NodeIP), true},
		{&p.Pods, "pods", "konn-e2e-pods", nil, append(svc(WebhookService), svc(APIExtService)...), ips(topo.PodIP), true},
		{&p.KonnServer, "konnectivity-server", "konnectivity-server", nil, []string{"localhost"}, ips("127.0.0.1", topo.ServerAddr), true},
		{&p.KonnAgent, "konnectivity-agent", "konnectivity-agent", nil, nil, nil, false},
		{&p.KonnClient, "konnectivity-client", "system:konnectivity-client", nil, nil, nil, false},
	}
	for _, s := range steps {
		if *s.pair, err = p.leaf(s.file, s.cn, s.orgs, s.dns, s.ips, s.server); err != nil {
			return nil, fmt.Errorf("%s certificate: %v", s.file, err)
		}
	}

	// The service-account token signing key (ES256).
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	p.SAKey, p.SAPub = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := writePEM(p.SAKey, "PRIVATE KEY", keyDER); err != nil {
		return nil, err
	}
	if err := writePEM(p.SAPub, "PUBLIC KEY", pubDER); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *PKI) leaf(file, cn string, orgs, dns []string, ips []net.IP, server bool) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	p.serial++
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(48 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	if server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		return Pair{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	pr := Pair{Cert: filepath.Join(p.Dir, file+".crt"), Key: filepath.Join(p.Dir, file+".key")}
	if err := writePEM(pr.Cert, "CERTIFICATE", der); err != nil {
		return Pair{}, err
	}
	return pr, writePEM(pr.Key, "PRIVATE KEY", keyDER)
}

// CAPEM is the CA certificate's PEM text.
func (p *PKI) CAPEM() ([]byte, error) { return os.ReadFile(p.CA) }

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}
