package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Etcd is one etcd member on the control plane's loopback.
type Etcd struct {
	Proc *Proc
	Port int
}

// StartEtcd starts etcd in the control plane namespace and waits for /health.
func StartEtcd(c Cleaner, e *Env, dir string) (*Etcd, error) {
	bin, err := e.Bin("kube", "etcd")
	if err != nil {
		return nil, err
	}
	client, err := e.Topo.CP.FreePort("127.0.0.1")
	if err != nil {
		return nil, err
	}
	peer, err := e.Topo.CP.FreePort("127.0.0.1")
	if err != nil {
		return nil, err
	}
	cu := fmt.Sprintf("http://127.0.0.1:%d", client)
	pu := fmt.Sprintf("http://127.0.0.1:%d", peer)
	args := []string{
		"--name=konn-e2e", "--data-dir=" + filepath.Join(dir, "etcd-data"),
		"--listen-client-urls=" + cu, "--advertise-client-urls=" + cu,
		"--listen-peer-urls=" + pu, "--initial-advertise-peer-urls=" + pu,
		"--initial-cluster=konn-e2e=" + pu,
		// A throw-away store: durability buys nothing here.
		"--unsafe-no-fsync", "--log-level=warn",
	}
	p, err := Start(c, e.Topo.CP, "etcd", bin, args, filepath.Join(dir, "etcd.log"))
	if err != nil {
		return nil, err
	}
	hc := e.Topo.CP.HTTPClient(nil, 2*time.Second)
	err = PollProc(Deadline, "etcd /health", p, func() error {
		resp, err := hc.Get(cu + "/health")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"health":"true"`)) {
			return fmt.Errorf("status %d: %s", resp.StatusCode, b)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%v\n%s", err, p.Tail(20))
	}
	return &Etcd{Proc: p, Port: client}, nil
}

// APIServer is one kube-apiserver and the kubectl configuration for it.
type APIServer struct {
	Proc       *Proc
	Port       int
	Dir        string
	Kubeconfig string
	env        *Env
	client     *http.Client
}

// APIServerOptions vary between runs.
type APIServerOptions struct {
	// EtcdPrefix keeps runs apart in one etcd.
	EtcdPrefix string
	// EgressConfig is the EgressSelectorConfiguration file ("" = none).
	EgressConfig string
	// Port is the secure port (0: a free one).
	Port int
}

// StartAPIServer starts kube-apiserver in the control plane namespace and
// waits until /readyz answers ok.
func StartAPIServer(c Cleaner, e *Env, dir string, etcd *Etcd, o APIServerOptions) (*APIServer, error) {
	bin, err := e.Bin("kube", "kube-apiserver")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	port := o.Port
	if port == 0 {
		if port, err = e.Topo.CP.FreePort("127.0.0.1"); err != nil {
			return nil, err
		}
	}
	pk := e.PKI
	advertise := e.Topo.ServerAddr
	if !e.Topo.Isolated {
		// The endpoint reconciler refuses loopback.
		advertise = e.Topo.NodeIP
	}
	args := []string{
		"--etcd-servers=http://127.0.0.1:" + strconv.Itoa(etcd.Port),
		"--etcd-prefix=" + o.EtcdPrefix,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--advertise-address=" + advertise,
		"--tls-cert-file=" + pk.APIServer.Cert, "--tls-private-key-file=" + pk.APIServer.Key,
		"--client-ca-file=" + pk.CA,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + pk.SAPub,
		"--service-account-signing-key-file=" + pk.SAKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=Node,RBAC",
		"--kubelet-client-certificate=" + pk.KubeletClient.Cert, "--kubelet-client-key=" + pk.KubeletClient.Key,
		"--kubelet-certificate-authority=" + pk.CA,
		"--kubelet-preferred-address-types=InternalIP",
		// Webhooks and APIServices with a service reference are dialled at
		// the endpoint's address, not the ClusterIP: there is no kube-proxy
		// in the node network to translate ClusterIPs.
		"--enable-aggregator-routing=true",
		"--proxy-client-cert-file=" + pk.FrontProxyClient.Cert, "--proxy-client-key-file=" + pk.FrontProxyClient.Key,
		"--requestheader-client-ca-file=" + pk.CA,
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--profiling=false",
		"--v=1",
	}
	if o.EgressConfig != "" {
		args = append(args, "--egress-selector-config-file="+o.EgressConfig)
	}
	p, err := Start(c, e.Topo.CP, "kube-apiserver", bin, args, filepath.Join(dir, "kube-apiserver.log"))
	if err != nil {
		return nil, err
	}
	a := &APIServer{Proc: p, Port: port, Dir: dir, env: e}
	if err := a.writeKubeconfig(); err != nil {
		return nil, err
	}
	tc, err := a.tlsConfig()
	if err != nil {
		return nil, err
	}
	a.client = e.Topo.CP.HTTPClient(tc, 5*time.Second)
	err = PollProc(90*time.Second, "kube-apiserver /readyz", p, func() error {
		code, body, err := a.Get("/readyz")
		if err != nil {
			return err
		}
		if code != 200 {
			return fmt.Errorf("status %d: %s", code, lastLines(body, 3))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%v\n%s", err, p.Tail(30))
	}
	return a, nil
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, " | ")
}

func (a *APIServer) tlsConfig() (*tls.Config, error) {
	ca, err := os.ReadFile(a.env.PKI.CA)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(a.env.PKI.Admin.Cert, a.env.PKI.Admin.Key)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}, nil
}

// Get is an admin GET on the API server (status, body).
func (a *APIServer) Get(path string) (int, string, error) {
	resp, err := a.client.Get(fmt.Sprintf("https://127.0.0.1:%d%s", a.Port, path))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	return resp.StatusCode, string(b), err
}

func (a *APIServer) writeKubeconfig() error {
	kc, err := a.kubeconfig(fmt.Sprintf("https://127.0.0.1:%d", a.Port), "")
	if err != nil {
		return err
	}
	a.Kubeconfig = filepath.Join(a.Dir, "kubeconfig")
	return os.WriteFile(a.Kubeconfig, []byte(kc), 0o600)
}

// NodeKubeconfig writes a kubeconfig for server (as seen from the node
// network, e.g. a KEP-2025 listener of the proxy-agent), verifying the
// serving certificate for serverName, and returns its path.
func (a *APIServer) NodeKubeconfig(server, serverName string) (string, error) {
	kc, err := a.kubeconfig(server, serverName)
	if err != nil {
		return "", err
	}
	path := filepath.Join(a.Dir, "kubeconfig-node")
	return path, os.WriteFile(path, []byte(kc), 0o600)
}

// KubectlIn runs kubectl in ns with kubeconfig within d and returns stdout.
func (a *APIServer) KubectlIn(ns *NS, kubeconfig string, d time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	full := append([]string{"--kubeconfig=" + kubeconfig, "--cache-dir=" + filepath.Join(a.Dir, "kubectl-cache-"+ns.Name)}, args...)
	bin := filepath.Join(a.env.KubeBin, "kubectl")
	cmd := exec.CommandContext(ctx, bin, full...)
	if !ns.isHost() {
		cmd = exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns.Name, bin}, full...)...)
	}
	cmd.Env = append(os.Environ(), "HOME="+a.Dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), &KubectlError{Args: args, Err: err, Stderr: errb.String()}
	}
	return out.String(), nil
}

func (a *APIServer) kubeconfig(server, serverName string) (string, error) {
	ca, err := os.ReadFile(a.env.PKI.CA)
	if err != nil {
		return "", err
	}
	cert, err := os.ReadFile(a.env.PKI.Admin.Cert)
	if err != nil {
		return "", err
	}
	key, err := os.ReadFile(a.env.PKI.Admin.Key)
	if err != nil {
		return "", err
	}
	b64 := base64.StdEncoding.EncodeToString
	tlsName := ""
	if serverName != "" {
		tlsName = "\n    tls-server-name: " + serverName
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: konn-e2e
  cluster:
    server: %s%s
    certificate-authority-data: %s
users:
- name: admin
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: konn-e2e
  context: {cluster: konn-e2e, user: admin, namespace: %s}
current-context: konn-e2e
`, server, tlsName, b64(ca), b64(cert), b64(key), Namespace), nil
}

// KubectlCmd is a kubectl command in the control plane namespace, for
// this API server (its own discovery cache: every run's API server has
// a different set of groups behind the same address).
func (a *APIServer) KubectlCmd(ctx context.Context, args ...string) *exec.Cmd {
	bin := filepath.Join(a.env.KubeBin, "kubectl")
	full := append([]string{"--kubeconfig=" + a.Kubeconfig, "--cache-dir=" + filepath.Join(a.Dir, "kubectl-cache")}, args...)
	var cmd *exec.Cmd
	if a.env.Topo.CP.isHost() {
		cmd = exec.CommandContext(ctx, bin, full...)
	} else {
		cmd = exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", a.env.Topo.CP.Name, bin}, full...)...)
	}
	cmd.Env = append(os.Environ(), "HOME="+a.Dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// KubectlError is a kubectl run that failed.
type KubectlError struct {
	Args   []string
	Err    error
	Stderr string
}

func (k *KubectlError) Error() string {
	return fmt.Sprintf("kubectl %s: %v: %s", strings.Join(k.Args, " "), k.Err, strings.TrimSpace(k.Stderr))
}

// Kubectl runs kubectl with stdin (may be nil) within d and returns stdout.
func (a *APIServer) Kubectl(d time.Duration, stdin []byte, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := a.KubectlCmd(ctx, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%v (deadline %v)", err, d)
		}
		return out.String(), &KubectlError{Args: args, Err: err, Stderr: errb.String()}
	}
	return out.String(), nil
}

// Apply is `kubectl apply -f -` with the given YAML.
func (a *APIServer) Apply(yaml string) error {
	_, err := a.Kubectl(Deadline, []byte(yaml), "apply", "-f", "-")
	return err
}

// Stop ends the API server (SIGTERM; it drains for a few seconds).
func (a *APIServer) Stop() error {
	return a.Proc.Stop(60 * time.Second)
}

// IsKubectlError reports whether err is a failed kubectl run.
func IsKubectlError(err error) bool {
	var k *KubectlError
	return errors.As(err, &k)
}

// EgressDials are kube-apiserver's own egress dialer metrics
// (apiserver_egress_dialer_*) for one protocol and transport label pair
// ("grpc"/"http_connect", "uds"/"tcp").
type EgressDials struct {
	Started, Succeeded, Failed float64
	// Elsewhere counts dials started with any other protocol/transport.
	Elsewhere float64
}

// Egress reads EgressDials from kube-apiserver's /metrics.
func (a *APIServer) Egress(protocol, transport string) (EgressDials, error) {
	code, body, err := a.Get("/metrics")
	if err != nil {
		return EgressDials{}, err
	}
	if code != 200 {
		return EgressDials{}, fmt.Errorf("kube-apiserver /metrics: status %d", code)
	}
	var m samples
	for _, l := range strings.Split(body, "\n") {
		if l != "" && l[0] != '#' {
			m = append(m, l)
		}
	}
	p, t := `protocol="`+protocol+`"`, `transport="`+transport+`"`
	const prefix = "apiserver_egress_dialer_"
	d := EgressDials{
		Started:   m.sum(prefix+"dial_start_total", p, t),
		Succeeded: m.sum(prefix+"dial_duration_seconds_count", p, t),
		Failed:    m.sum(prefix+"dial_failure_count", p, t),
	}
	d.Elsewhere = m.sum(prefix+"dial_start_total") - d.Started
	return d, nil
}
