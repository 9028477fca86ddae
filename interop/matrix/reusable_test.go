package matrix

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The reusable-tunnel check: konnectivity-client v0.37's CreateGRPCTunnel
// keeps one HTTP/2 connection and opens one Proxy stream per dial, many at
// once. With four agents, each announcing its own IPv4 address, the
// destHost strategy and an echo server on each address, every connection
// dials all four agents; a konn server runs with --workers=2, so the
// agents' tunnels sit on both workers and a connection's dials go to both
// (docs/design/cross-core.md). The client lives in its own module
// (interop/reusable) so that this module keeps building upstream's v0.36
// binaries with upstream's own dependency versions.
const (
	reusableTunnels = 4
	reusableDials   = 50
	reusableAgents  = 4
)

var reusableResults = struct {
	sync.Mutex
	m map[string]outcome
}{m: map[string]outcome{}}

func TestReusableTunnel(t *testing.T) {
	e := theEnv
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(e.work, "reusable")
	cmd := exec.Command(goCommand(), "build", "-o", bin, ".")
	cmd.Dir = filepath.Join(root, "reusable")
	cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the reusable-tunnel client: %v\n%s", err, out)
	}
	for _, p := range pairs {
		t.Run(p.String(), func(t *testing.T) {
			note, err := runReusable(t, e, bin, p)
			reusableResults.Lock()
			reusableResults.m[p.server+" · "+p.agent] = outcome{ran: true, err: err, note: note}
			reusableResults.Unlock()
			if err != nil {
				t.Error(err)
			} else {
				t.Log(note)
			}
		})
	}
}

func runReusable(t *testing.T, e *env, bin string, p pair) (string, error) {
	dir := filepath.Join(e.work, "reusable-"+p.server+"-"+p.agent)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	srv, err := newServer(e, dir, p.server, "grpc", false, "server-1", 1)
	if err != nil {
		return "", err
	}
	srv.extra = []string{"--proxy-strategies=destHost"}
	if p.server == konn {
		srv.extra = append(srv.extra, "--workers=2")
	}
	if err := srv.start(t, e); err != nil {
		return "", err
	}
	var targets []string
	var agents []*agent
	for i := 0; i < reusableAgents; i++ {
		ip := fmt.Sprintf("127.0.1.%d", 20+i)
		ln, err := net.Listen("tcp", ip+":0")
		if err != nil {
			return "", err
		}
		t.Cleanup(func() { ln.Close() })
		go serveEcho(ln)
		targets = append(targets, ln.Addr().String())
		a, err := startAgent(t, e, dir, p.agent, fmt.Sprintf("agent-%d", i), srv.agent, "--agent-identifiers=ipv4="+ip)
		if err != nil {
			return "", err
		}
		agents = append(agents, a)
	}
	for _, a := range agents {
		if err := a.waitReady(deadline); err != nil {
			return "", err
		}
	}
	err = waitFor(deadline, "every agent's tunnel at the server", srv.p, func() error {
		v, err := srv.metric(`konnectivity_network_proxy_server_grpc_connections`)
		if err != nil {
			return err
		}
		if v != reusableAgents {
			return fmt.Errorf("%v Connect streams, want %d", v, reusableAgents)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := exec.CommandContext(ctx, bin,
		"-uds", srv.uds,
		"-targets", strings.Join(targets, ","),
		"-tunnels", fmt.Sprint(reusableTunnels),
		"-dials", fmt.Sprint(reusableDials),
		"-timeout", "90s")
	out, err := run.CombinedOutput()
	summary := firstLine(strings.TrimSpace(string(out)))
	if err != nil {
		var logs strings.Builder
		logs.WriteString(srv.p.tail(20))
		return "", fmt.Errorf("%s (%v)\n%s\n%s", summary, err, out, logs.String())
	}
	return summary, nil
}

// reusableTable is the report's section for TestReusableTunnel.
func reusableTable() string {
	reusableResults.Lock()
	defer reusableResults.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "Reusable tunnel (konnectivity-client v0.37 `CreateGRPCTunnel`: %d connections × %d concurrent dials, "+
		"each to one of %d agents by `destHost`; konn server with `--workers=2`):\n\n", reusableTunnels, reusableDials, reusableAgents)
	b.WriteString("| server · agent | result |\n|---|---|\n")
	for _, p := range pairs {
		key := p.server + " · " + p.agent
		o, ok := reusableResults.m[key]
		switch {
		case !ok || !o.ran:
			fmt.Fprintf(&b, "| %s | not run |\n", key)
		case o.err != nil:
			fmt.Fprintf(&b, "| %s | **FAIL**: %s |\n", key, firstLine(o.err.Error()))
		default:
			fmt.Fprintf(&b, "| %s | pass (%s) |\n", key, o.note)
		}
	}
	return b.String()
}
