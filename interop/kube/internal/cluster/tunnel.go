package cluster

import (
	"bufio"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Transport is one way kube-apiserver reaches the proxy-server: every
// combination its egress selector supports (GRPC over TCP is refused by
// kube-apiserver: "UDS transport must be specified for GRPC").
type Transport struct {
	Name     string // short, for file names and test names
	Label    string // for reports
	Mode     string // proxy-server --mode
	Protocol string // EgressSelectorConfiguration proxyProtocol
	TCP      bool   // frontend on TCP with mTLS (else a Unix socket)
}

// Transports are all of them, in report order.
var Transports = []Transport{
	{Name: "grpc-uds", Label: "GRPC + UDS", Mode: "grpc", Protocol: "GRPC"},
	{Name: "connect-uds", Label: "HTTPConnect + UDS", Mode: "http-connect", Protocol: "HTTPConnect"},
	{Name: "connect-tcp", Label: "HTTPConnect + TCP (mTLS)", Mode: "http-connect", Protocol: "HTTPConnect", TCP: true},
}

// Tunnel is one proxy-server (control plane) and one proxy-agent (node
// network), both konn's or both upstream's.
type Tunnel struct {
	Impl      string
	T         Transport
	Dir       string
	Server    *Proc
	Agent     *Proc
	UDS       string
	FrontPort int
	AgentPort int
	// health ports, on 127.0.0.1 of the server's and the agent's namespace
	ServerHealth, AgentHealth int
	env                       *Env
	cp, node                  *http.Client
}

// TunnelExtra adds flags to a tunnel's processes (e.g. konn's KEP-2025
// --target and --allowed-destination).
type TunnelExtra struct {
	ServerArgs, AgentArgs []string
}

// StartTunnel starts the server and the agent and waits until the agent
// is connected (server /readyz and agent /readyz both ok).
func StartTunnel(c Cleaner, e *Env, dir, impl string, tr Transport, extra ...TunnelExtra) (*Tunnel, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	srvBin, err := e.Bin(impl, "proxy-server")
	if err != nil {
		return nil, err
	}
	agentBin, err := e.Bin(impl, "proxy-agent")
	if err != nil {
		return nil, err
	}
	t := &Tunnel{Impl: impl, T: tr, Dir: dir, env: e,
		cp: e.Topo.CP.HTTPClient(nil, 3*time.Second), node: e.Topo.Node.HTTPClient(nil, 3*time.Second)}
	var admin, agentAdmin int
	for _, p := range []struct {
		ns  *NS
		ip  string
		dst *int
	}{
		{e.Topo.CP, e.Topo.ServerAddr, &t.AgentPort},
		{e.Topo.CP, "127.0.0.1", &t.ServerHealth},
		{e.Topo.CP, "127.0.0.1", &admin},
		{e.Topo.Node, "127.0.0.1", &t.AgentHealth},
		{e.Topo.Node, "127.0.0.1", &agentAdmin},
	} {
		if *p.dst, err = p.ns.FreePort(p.ip); err != nil {
			return nil, err
		}
	}
	pk := e.PKI
	args := []string{"--mode=" + tr.Mode}
	if tr.TCP {
		if t.FrontPort, err = e.Topo.CP.FreePort("127.0.0.1"); err != nil {
			return nil, err
		}
		args = append(args,
			"--server-bind-address=127.0.0.1",
			"--server-port="+strconv.Itoa(t.FrontPort),
			"--server-cert="+pk.KonnServer.Cert, "--server-key="+pk.KonnServer.Key,
			"--server-ca-cert="+pk.CA)
	} else {
		t.UDS = filepath.Join(dir, "konnectivity-server.socket")
		args = append(args, "--uds-name="+t.UDS, "--server-port=0", "--delete-existing-uds-file=true")
	}
	args = append(args,
		"--cluster-cert="+pk.KonnServer.Cert, "--cluster-key="+pk.KonnServer.Key,
		"--cluster-ca-cert="+pk.CA,
		"--agent-bind-address="+e.Topo.ServerAddr,
		"--agent-port="+strconv.Itoa(t.AgentPort),
		"--health-bind-address=127.0.0.1",
		"--health-port="+strconv.Itoa(t.ServerHealth),
		"--admin-bind-address=127.0.0.1",
		"--admin-port="+strconv.Itoa(admin),
		"--server-id=konn-e2e-server",
		"--server-count=1",
		"--keepalive-time=1h",
		"--graceful-shutdown-timeout=5s",
		"--v=2",
	)
	for _, x := range extra {
		args = append(args, x.ServerArgs...)
	}
	if t.Server, err = Start(c, e.Topo.CP, impl+" proxy-server", srvBin, args, filepath.Join(dir, "proxy-server.log")); err != nil {
		return nil, err
	}
	err = PollProc(Deadline, t.Server.Name+" /healthz", t.Server, func() error {
		if err := t.healthOK(t.cp, t.ServerHealth, "/healthz"); err != nil {
			return err
		}
		if t.UDS != "" {
			_, err := os.Stat(t.UDS)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%v\n%s", err, t.Server.Tail(20))
	}

	agentArgs := []string{
		"--proxy-server-host=" + e.Topo.ServerAddr,
		"--proxy-server-port=" + strconv.Itoa(t.AgentPort),
		"--ca-cert=" + pk.CA,
		"--agent-cert=" + pk.KonnAgent.Cert, "--agent-key=" + pk.KonnAgent.Key,
		"--agent-id=konn-e2e-agent",
		"--health-server-host=127.0.0.1",
		"--health-server-port=" + strconv.Itoa(t.AgentHealth),
		"--admin-bind-address=127.0.0.1",
		"--admin-server-port=" + strconv.Itoa(agentAdmin),
		"--sync-interval=1s", "--sync-interval-cap=5s", "--probe-interval=1s",
		"--v=2",
	}
	for _, x := range extra {
		agentArgs = append(agentArgs, x.AgentArgs...)
	}
	if t.Agent, err = Start(c, e.Topo.Node, impl+" proxy-agent", agentBin, agentArgs, filepath.Join(dir, "proxy-agent.log")); err != nil {
		return nil, err
	}
	if err := PollProc(Deadline, t.Agent.Name+" /readyz", t.Agent, func() error { return t.healthOK(t.node, t.AgentHealth, "/readyz") }); err != nil {
		return nil, fmt.Errorf("%v\n%s\n%s", err, t.Agent.Tail(20), t.Server.Tail(20))
	}
	if err := PollProc(Deadline, t.Server.Name+" /readyz", t.Server, func() error { return t.healthOK(t.cp, t.ServerHealth, "/readyz") }); err != nil {
		return nil, fmt.Errorf("%v\n%s", err, t.Server.Tail(20))
	}
	return t, nil
}

func (t *Tunnel) healthOK(hc *http.Client, port int, path string) error {
	code, body, err := get(hc, port, path)
	if err != nil {
		return err
	}
	if code != 200 {
		return fmt.Errorf("status %d: %q", code, body)
	}
	return nil
}

func get(hc *http.Client, port int, path string) (int, string, error) {
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return resp.StatusCode, string(b), err
}

// EgressConfig writes kube-apiserver's EgressSelectorConfiguration for
// this tunnel (cluster traffic through it; control plane and etcd direct)
// and returns its path.
func (t *Tunnel) EgressConfig() (string, error) {
	var transport string
	if t.T.TCP {
		transport = fmt.Sprintf(`      tcp:
        url: https://127.0.0.1:%d
        tlsConfig:
          caBundle: %s
          clientCert: %s
          clientKey: %s
`, t.FrontPort, t.env.PKI.CA, t.env.PKI.KonnClient.Cert, t.env.PKI.KonnClient.Key)
	} else {
		transport = fmt.Sprintf("      uds:\n        udsName: %s\n", t.UDS)
	}
	cfg := fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: %s
    transport:
%s- name: controlplane
  connection:
    proxyProtocol: Direct
- name: etcd
  connection:
    proxyProtocol: Direct
`, t.T.Protocol, transport)
	p := filepath.Join(t.Dir, "egress-selector-configuration.yaml")
	return p, os.WriteFile(p, []byte(cfg), 0o600)
}

// Stats is a snapshot of the tunnel's metrics and file descriptors.
type Stats struct {
	ServerFDs, AgentFDs int
	// dials the agent made to destinations (dial_duration_seconds_count)
	AgentDials float64
	// dials the server saw answered (dial_duration_seconds_count)
	ServerDials float64
	// DATA packets the server sent to / received from the agent
	DataToAgent, DataFromAgent float64
	Established, Pending       float64 // server gauges
	AgentOpen                  float64 // agent open_endpoint_connections
}

const (
	serverPrefix = "konnectivity_network_proxy_server_"
	agentPrefix  = "konnectivity_network_proxy_agent_"
)

// Snapshot reads Stats.
func (t *Tunnel) Snapshot() (Stats, error) {
	var s Stats
	var err error
	if s.ServerFDs, err = t.Server.OpenFDs(); err != nil {
		return s, err
	}
	if s.AgentFDs, err = t.Agent.OpenFDs(); err != nil {
		return s, err
	}
	sm, err := t.scrape(t.cp, t.ServerHealth)
	if err != nil {
		return s, fmt.Errorf("server /metrics: %v", err)
	}
	am, err := t.scrape(t.node, t.AgentHealth)
	if err != nil {
		return s, fmt.Errorf("agent /metrics: %v", err)
	}
	s.ServerDials = sm.sum(serverPrefix+"dial_duration_seconds_count", "")
	s.DataToAgent = sm.sum(serverPrefix+"stream_packets_total", `segment="to_agent"`, `packet_type="DATA"`)
	s.DataFromAgent = sm.sum(serverPrefix+"stream_packets_total", `segment="from_agent"`, `packet_type="DATA"`)
	s.Established = sm.sum(serverPrefix+"established_connections", "")
	s.Pending = sm.sum(serverPrefix+"pending_backend_dials", "")
	s.AgentDials = am.sum(agentPrefix+"dial_duration_seconds_count", "")
	s.AgentOpen = am.sum(agentPrefix+"open_endpoint_connections", "")
	return s, nil
}

// Metric sums the samples of a metric (full name) of the server (or the
// agent) whose labels contain every filter.
func (t *Tunnel) Metric(server bool, name string, filters ...string) (float64, error) {
	hc, port := t.node, t.AgentHealth
	if server {
		hc, port = t.cp, t.ServerHealth
	}
	m, err := t.scrape(hc, port)
	if err != nil {
		return 0, err
	}
	return m.sum(name, filters...), nil
}

// Sub is s - base for the counters.
func (s Stats) Sub(base Stats) Stats {
	return Stats{
		ServerFDs: s.ServerFDs - base.ServerFDs, AgentFDs: s.AgentFDs - base.AgentFDs,
		AgentDials: s.AgentDials - base.AgentDials, ServerDials: s.ServerDials - base.ServerDials,
		DataToAgent: s.DataToAgent - base.DataToAgent, DataFromAgent: s.DataFromAgent - base.DataFromAgent,
		Established: s.Established, Pending: s.Pending, AgentOpen: s.AgentOpen,
	}
}

type samples []string

func (t *Tunnel) scrape(hc *http.Client, port int) (samples, error) {
	code, body, err := get(hc, port, "/metrics")
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("status %d", code)
	}
	var out samples
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); l != "" && l[0] != '#' {
			out = append(out, l)
		}
	}
	return out, sc.Err()
}

// sum adds the samples of name whose labels contain every filter.
func (m samples) sum(name string, filters ...string) float64 {
	var total float64
	for _, l := range m {
		rest, ok := strings.CutPrefix(l, name)
		if !ok || (rest == "" || (rest[0] != ' ' && rest[0] != '{')) {
			continue
		}
		match := true
		for _, f := range filters {
			if f != "" && !strings.Contains(rest, f) {
				match = false
			}
		}
		if !match {
			continue
		}
		f := strings.Fields(rest)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			total += v
		}
	}
	return total
}

// WaitIdle polls until no proxied connection or pending dial is left in
// the server and the agent, and both have no more open file descriptors
// than in base. It returns the last snapshot.
func (t *Tunnel) WaitIdle(base Stats, d time.Duration) (Stats, error) {
	var last Stats
	err := Poll(d, "the tunnel to be idle with file descriptors back to the baseline", func() error {
		s, err := t.Snapshot()
		if err != nil {
			return err
		}
		last = s
		var probs []string
		if s.Established != 0 {
			probs = append(probs, fmt.Sprintf("server established_connections %v", s.Established))
		}
		if s.Pending != 0 {
			probs = append(probs, fmt.Sprintf("server pending_backend_dials %v", s.Pending))
		}
		if s.AgentOpen != 0 {
			probs = append(probs, fmt.Sprintf("agent open_endpoint_connections %v", s.AgentOpen))
		}
		if s.ServerFDs > base.ServerFDs {
			probs = append(probs, fmt.Sprintf("server fds %d > baseline %d", s.ServerFDs, base.ServerFDs))
		}
		if s.AgentFDs > base.AgentFDs {
			probs = append(probs, fmt.Sprintf("agent fds %d > baseline %d", s.AgentFDs, base.AgentFDs))
		}
		if len(probs) > 0 {
			return errors.New(strings.Join(probs, ", "))
		}
		return nil
	})
	return last, err
}

// Stop ends the agent and the server with SIGTERM. Upstream's agent drains
// on the first SIGTERM and exits on the second; a bounded wait then a
// SIGKILL covers both.
func (t *Tunnel) Stop() {
	for _, p := range []*Proc{t.Agent, t.Server} {
		if p == nil || !p.Running() {
			continue
		}
		p.cmd.Process.Signal(sigterm)
		if !p.waitExit(3 * time.Second) {
			p.cmd.Process.Signal(sigterm)
			if !p.waitExit(5 * time.Second) {
				p.Kill()
			}
		}
	}
}

// B64 is standard base64, for caBundle fields.
func B64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
