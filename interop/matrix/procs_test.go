package matrix

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	konn     = "konn"
	upstream = "upstream"
)

// proc is one child process. Its output goes to a log file; it is killed
// when the test that started it ends (t.Cleanup), and with the test binary
// (Pdeathsig) if that dies first.
type proc struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	st   *os.ProcessState
}

func startProc(t testing.TB, name, bin string, args []string, log string) (*proc, error) {
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fmt.Fprintf(f, "### %s %s\n", bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %v", name, err)
	}
	p := &proc{name: name, log: log, cmd: cmd, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		p.mu.Lock()
		p.st = cmd.ProcessState
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(p.kill)
	return p, nil
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *proc) signal(sig syscall.Signal) error {
	if !p.running() {
		return fmt.Errorf("%s is not running (%s)", p.name, p.status())
	}
	return p.cmd.Process.Signal(sig)
}

// kill ends the process with SIGKILL and reaps it.
func (p *proc) kill() {
	if p.running() {
		p.cmd.Process.Signal(syscall.SIGKILL)
	}
	select {
	case <-p.done:
	case <-time.After(deadline):
	}
}

// waitExit waits up to d for the process to end.
func (p *proc) waitExit(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

func (p *proc) status() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.st == nil {
		return "running"
	}
	return p.st.String()
}

func (p *proc) exitCode() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.st == nil {
		return -1
	}
	return p.st.ExitCode()
}

// tail is the end of the process's log, for failure messages.
func (p *proc) tail(lines int) string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return fmt.Sprintf("--- %s (%s), last %d lines of %s ---\n%s", p.name, p.status(), len(all), p.log, strings.Join(all, "\n"))
}

// server is one proxy-server process, with the ports it was started on, so
// that it can be restarted on the same ones.
type server struct {
	impl   string
	mode   string // grpc | http-connect
	tcp    bool   // frontend on TCP with mTLS (else a Unix socket)
	id     string
	count  int
	dir    string
	uds    string
	port   int // frontend port when tcp
	agent  int
	health int
	admin  int
	starts int
	extra  []string // more flags (after the common ones)
	p      *proc
}

func newServer(e *env, dir, impl, mode string, tcp bool, id string, count int) (*server, error) {
	s := &server{impl: impl, mode: mode, tcp: tcp, id: id, count: count, dir: dir}
	var err error
	for _, p := range []*int{&s.agent, &s.health, &s.admin} {
		if *p, err = freePort(); err != nil {
			return nil, err
		}
	}
	if tcp {
		if s.port, err = freePort(); err != nil {
			return nil, err
		}
	} else {
		s.uds = filepath.Join(dir, id+".sock")
	}
	return s, nil
}

// frontendAddr is what a client connects to: the socket path or host:port.
func (s *server) frontendAddr() string {
	if s.tcp {
		return fmt.Sprintf("127.0.0.1:%d", s.port)
	}
	return s.uds
}

func (s *server) args(e *env) []string {
	a := []string{"--mode=" + s.mode}
	if s.tcp {
		a = append(a,
			"--server-bind-address=127.0.0.1",
			"--server-port="+strconv.Itoa(s.port),
			"--server-cert="+e.pki.serverCert,
			"--server-key="+e.pki.serverKey,
			"--server-ca-cert="+e.pki.ca)
	} else {
		a = append(a, "--uds-name="+s.uds, "--server-port=0", "--delete-existing-uds-file=true")
	}
	return append(append(a,
		"--cluster-cert="+e.pki.serverCert,
		"--cluster-key="+e.pki.serverKey,
		"--cluster-ca-cert="+e.pki.ca,
		"--agent-bind-address=127.0.0.1",
		"--agent-port="+strconv.Itoa(s.agent),
		"--health-bind-address=127.0.0.1",
		"--health-port="+strconv.Itoa(s.health),
		"--admin-bind-address=127.0.0.1",
		"--admin-port="+strconv.Itoa(s.admin),
		"--server-id="+s.id,
		"--server-count="+strconv.Itoa(s.count),
		// Upstream's default 0 stops the gRPC frontend with GracefulStop,
		// which waits for every open Proxy stream: SIGTERM would never
		// end a server that has a client. A bound makes it exit.
		"--graceful-shutdown-timeout=2s",
		verbosity(s.impl),
	), s.extra...)
}

// verbosity: per-connection events, not per-packet ones (upstream logs
// every packet from V(4) on; konn never logs per packet, and per connection
// at V(4)).
func verbosity(impl string) string {
	if impl == konn {
		return "-v=4"
	}
	return "-v=3"
}

// start starts the process and waits until its health port answers.
func (s *server) start(t testing.TB, e *env) error {
	bin, err := e.binary(s.impl, "proxy-server")
	if err != nil {
		return err
	}
	s.starts++
	log := filepath.Join(s.dir, fmt.Sprintf("%s-%s.%d.log", s.id, s.impl, s.starts))
	if s.p, err = startProc(t, s.impl+" proxy-server "+s.id, bin, s.args(e), log); err != nil {
		return err
	}
	return waitFor(deadline, fmt.Sprintf("%s /healthz", s.p.name), s.p, func() error {
		code, body, err := httpGet(s.health, "/healthz")
		if err != nil {
			return err
		}
		if code != 200 {
			return fmt.Errorf("status %d: %q", code, body)
		}
		if s.tcp {
			return nil
		}
		if _, err := os.Stat(s.uds); err != nil {
			return err
		}
		return nil
	})
}

// waitReady waits until /readyz says an agent is connected.
func (s *server) waitReady(d time.Duration) error {
	return waitFor(d, s.p.name+" /readyz (an agent connected)", s.p, func() error {
		code, body, err := httpGet(s.health, "/readyz")
		if err != nil {
			return err
		}
		if code != 200 || body != "ok" {
			return fmt.Errorf("status %d: %q", code, body)
		}
		return nil
	})
}

func (s *server) metric(name string) (float64, error) { return scrape(s.health, name) }

// agent is one proxy-agent process.
type agent struct {
	impl   string
	id     string
	dir    string
	target int // port of the server's agent listener (or the load balancer)
	health int
	admin  int
	p      *proc
}

func startAgent(t testing.TB, e *env, dir, impl, id string, target int, extra ...string) (*agent, error) {
	a := &agent{impl: impl, id: id, dir: dir, target: target}
	var err error
	if a.health, err = freePort(); err != nil {
		return nil, err
	}
	if a.admin, err = freePort(); err != nil {
		return nil, err
	}
	bin, err := e.binary(impl, "proxy-agent")
	if err != nil {
		return nil, err
	}
	args := []string{
		"--proxy-server-host=127.0.0.1",
		"--proxy-server-port=" + strconv.Itoa(target),
		"--ca-cert=" + e.pki.ca,
		"--agent-cert=" + e.pki.agentCert,
		"--agent-key=" + e.pki.agentKey,
		"--agent-id=" + id,
		"--health-server-host=127.0.0.1",
		"--health-server-port=" + strconv.Itoa(a.health),
		"--admin-bind-address=127.0.0.1",
		"--admin-server-port=" + strconv.Itoa(a.admin),
		"--sync-interval=100ms",
		"--sync-interval-cap=1s",
		"--probe-interval=200ms",
		verbosity(impl),
	}
	args = append(args, extra...)
	log := filepath.Join(dir, fmt.Sprintf("%s-%s.log", id, impl))
	if a.p, err = startProc(t, impl+" proxy-agent "+id, bin, args, log); err != nil {
		return nil, err
	}
	return a, nil
}

// waitReady waits until the agent reports a server connection.
func (a *agent) waitReady(d time.Duration) error {
	return waitFor(d, a.p.name+" /readyz", a.p, func() error {
		code, body, err := httpGet(a.health, "/readyz")
		if err != nil {
			return err
		}
		if code != 200 {
			return fmt.Errorf("status %d: %q", code, body)
		}
		return nil
	})
}

func (a *agent) metric(name string) (float64, error) { return scrape(a.health, name) }

// counter is like metric, but a family not exported yet counts as 0.
func (a *agent) counter(name string) (float64, error) {
	v, err := scrape(a.health, name)
	if errors.Is(err, errNoMetric) {
		return 0, nil
	}
	return v, err
}

// waitFor polls check every 25 ms until it succeeds, the process dies, or
// d passes.
func waitFor(d time.Duration, what string, p *proc, check func() error) error {
	end := time.Now().Add(d)
	var last error
	for time.Now().Before(end) {
		if p != nil && !p.running() {
			return fmt.Errorf("waiting for %s: the process ended (%s)", what, p.status())
		}
		if last = check(); last == nil {
			return nil
		}
		time.Sleep(25 * time.Millisecond)
	}
	return fmt.Errorf("waiting for %s: not within %v: %v", what, d, last)
}

var errNoMetric = errors.New("metric not in /metrics")

var probeClient = &http.Client{Timeout: 2 * time.Second}

// httpGet fetches http://127.0.0.1:port/path.
func httpGet(port int, path string) (int, string, error) {
	resp, err := probeClient.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return resp.StatusCode, string(b), err
}

// scrape reads one unlabelled sample (or the sum of a family's samples
// with labels) from /metrics on the health port.
func scrape(port int, name string) (float64, error) {
	code, body, err := httpGet(port, "/metrics")
	if err != nil {
		return 0, err
	}
	if code != 200 {
		return 0, fmt.Errorf("/metrics: status %d", code)
	}
	found := false
	var sum float64
	sc := bufio.NewScanner(bytes.NewReader([]byte(body)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if !strings.HasPrefix(rest, " ") && !strings.HasPrefix(rest, "{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %v", line, err)
		}
		sum += v
		found = true
	}
	if !found {
		return 0, fmt.Errorf("%w: %s", errNoMetric, name)
	}
	return sum, nil
}
