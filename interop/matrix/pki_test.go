package matrix

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
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

// pki is a throw-away CA with a serving certificate for both server ports
// (localhost, 127.0.0.1, ::1) and client certificates for agents and for
// frontends (kube-apiserver's side), written as PEM files.
type pki struct {
	ca                        string
	serverCert, serverKey     string
	agentCert, agentKey       string
	frontendCert, frontendKey string
}

func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "konn interop CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	p := &pki{ca: filepath.Join(dir, "ca.crt")}
	if err := writePEM(p.ca, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}

	leaf := func(serial int64, cn string, server bool, name string) (string, string, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return "", "", err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		if server {
			tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
			tmpl.DNSNames = []string{"localhost"}
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return "", "", err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return "", "", err
		}
		certPath, keyPath := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
		if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
			return "", "", err
		}
		if err := writePEM(keyPath, "PRIVATE KEY", keyDER); err != nil {
			return "", "", err
		}
		// Both sides must accept the files: load them as Go would.
		_, err = tls.LoadX509KeyPair(certPath, keyPath)
		return certPath, keyPath, err
	}
	if p.serverCert, p.serverKey, err = leaf(2, "konn-interop-server", true, "server"); err != nil {
		return nil, fmt.Errorf("server certificate: %v", err)
	}
	if p.agentCert, p.agentKey, err = leaf(3, "konn-interop-agent", false, "agent"); err != nil {
		return nil, fmt.Errorf("agent certificate: %v", err)
	}
	if p.frontendCert, p.frontendKey, err = leaf(4, "kube-apiserver", false, "frontend"); err != nil {
		return nil, fmt.Errorf("frontend certificate: %v", err)
	}
	return p, nil
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}
