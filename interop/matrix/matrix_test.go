package matrix

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// pair is the server and agent implementation of a cell.
type pair struct{ server, agent string }

// pairs, the all-upstream reference first.
var pairs = []pair{{upstream, upstream}, {upstream, konn}, {konn, upstream}, {konn, konn}}

func (p pair) String() string { return "server=" + p.server + ",agent=" + p.agent }

// scenario is one column of the matrix. Scenarios run in this order in a
// cell, on the cell's processes; the destructive ones come last, and the
// load-balancer one starts its own.
type scenario struct {
	name    string
	title   string
	timeout time.Duration
	run     func(ctx context.Context, c *cell) (note string, err error)
}

var scenarios = []scenario{
	{"http", "HTTP request", 30 * time.Second, scHTTP},
	{"bulk", "64 MiB each way", 4 * time.Minute, scBulk},
	{"concurrent", "100 concurrent", 90 * time.Second, scConcurrent},
	{"dial-errors", "closed port, unknown name", 60 * time.Second, scDialErrors},
	{"cancel-dial", "cancel during dial", 60 * time.Second, scCancelDial},
	{"drain", "agent DRAIN", 60 * time.Second, scDrain},
	{"agent-kill", "agent killed mid-stream", 60 * time.Second, scAgentKill},
	{"server-restart", "server restart, agent reconnects", 90 * time.Second, scServerRestart},
	{"lb", "3 servers behind a TCP LB", 90 * time.Second, scLB},
}

// cell is one client kind × server × agent, with its running processes.
type cell struct {
	t      *testing.T // the cell's test: processes it starts live until the cell ends
	sub    *testing.T // the running scenario's test, for its log lines
	e      *env
	kind   clientKind
	pair   pair
	dir    string
	srv    *server
	agent  *agent
	client tunnelClient
	agents int
}

func (c *cell) key() string { return c.kind.name + " · " + c.pair.server + " · " + c.pair.agent }

// matrixRan is set when TestMatrix ran (so that a run of other tests does
// not overwrite the report with an empty table).
var matrixRan bool

func TestMatrix(t *testing.T) {
	matrixRan = true
	cellNo := 0
	for _, kind := range clientKinds {
		t.Run(kind.name, func(t *testing.T) {
			for _, p := range pairs {
				cellNo++
				n := cellNo
				t.Run(p.String(), func(t *testing.T) { runCell(t, n, kind, p) })
			}
		})
	}
}

func runCell(t *testing.T, n int, kind clientKind, p pair) {
	e := theEnv
	start := time.Now()
	c := &cell{t: t, e: e, kind: kind, pair: p, dir: filepath.Join(e.work, fmt.Sprintf("c%02d", n))}
	recordCell(c.key())
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := c.setup(); err != nil {
		for _, sc := range scenarios {
			record(c.key(), sc.name, "", fmt.Errorf("set-up failed: %v", err))
		}
		t.Fatalf("set-up: %v\n%s", err, c.logs())
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), sc.timeout)
			defer cancel()
			began := time.Now()
			c.sub = t
			note, err := sc.run(ctx, c)
			record(c.key(), sc.name, note, err)
			if err != nil {
				t.Errorf("%s: %v\n%s", sc.title, err, c.logs())
				return
			}
			if note != "" {
				t.Logf("note: %s", note)
			}
			t.Logf("%s passed in %v", sc.title, time.Since(began).Round(time.Millisecond))
		})
	}
	t.Logf("cell %s: %v", c.key(), time.Since(start).Round(time.Millisecond))
}

func (c *cell) setup() error {
	var err error
	c.srv, err = newServer(c.e, c.dir, c.pair.server, c.kind.mode, c.kind.tcp, "server-1", 1)
	if err != nil {
		return err
	}
	if err := c.srv.start(c.t, c.e); err != nil {
		return err
	}
	if err := c.newAgent(); err != nil {
		return err
	}
	c.client, err = newClient(c.e, c.kind, c.srv, c.dir)
	return err
}

// newAgent starts a fresh agent of the cell's kind and waits until the
// server has it.
func (c *cell) newAgent() error {
	c.agents++
	a, err := startAgent(c.t, c.e, c.dir, c.pair.agent, fmt.Sprintf("agent-%d", c.agents), c.srv.agent)
	if err != nil {
		return err
	}
	c.agent = a
	if err := a.waitReady(deadline); err != nil {
		return err
	}
	return c.srv.waitReady(deadline)
}

// healthy makes sure the cell's server and agent run and are connected
// (a destructive scenario that failed may have left them otherwise), so
// that one failure does not fail every later scenario.
func (c *cell) healthy() error {
	if !c.srv.p.running() {
		if err := c.srv.start(c.t, c.e); err != nil {
			return fmt.Errorf("restarting the server left behind by an earlier scenario: %v", err)
		}
	}
	if !c.agent.p.running() {
		return c.newAgent()
	}
	if err := c.srv.waitReady(deadline); err != nil {
		return err
	}
	return c.agent.waitReady(deadline)
}

// logs is the tail of every process log of the cell, for failure messages.
func (c *cell) logs() string {
	var b strings.Builder
	if c.srv != nil && c.srv.p != nil {
		b.WriteString(c.srv.p.tail(25) + "\n")
	}
	if c.agent != nil && c.agent.p != nil {
		b.WriteString(c.agent.p.tail(25) + "\n")
	}
	return b.String()
}

// ---------------------------------------------------------------- scenarios

func expectHello(ctx context.Context, cl tunnelClient, d *destinations) error {
	status, body, err := cl.get(ctx, d.http, "/hello")
	if err != nil {
		return fmt.Errorf("GET /hello: %v", err)
	}
	if status != 200 || string(body) != helloBody {
		return fmt.Errorf("GET /hello: status %d, body %q; want 200, %q", status, body, helloBody)
	}
	return nil
}

func scHTTP(ctx context.Context, c *cell) (string, error) {
	return "", expectHello(ctx, c.client, c.e.dest)
}

const bulkSize = 64 << 20

func scBulk(ctx context.Context, c *cell) (string, error) {
	began := time.Now()
	if err := c.client.bulk(ctx, bulkSize); err != nil {
		return "", err
	}
	secs := time.Since(began).Seconds()
	c.sub.Logf("64 MiB each way in %.2fs (%.0f MiB/s each way)", secs, 64/secs)
	return "", nil
}

const concurrent = 100

var barrierSeq struct {
	sync.Mutex
	n int
}

func scConcurrent(ctx context.Context, c *cell) (string, error) {
	barrierSeq.Lock()
	barrierSeq.n++
	id := fmt.Sprintf("b%d", barrierSeq.n)
	barrierSeq.Unlock()
	paths := make([]string, concurrent)
	for i := range paths {
		// The destination answers only when all of them are open at once.
		paths[i] = fmt.Sprintf("/conn/%d?barrier=%s&n=%d", i, id, concurrent)
	}
	var bodies [][]byte
	if cc, ok := c.client.(*curlClient); ok {
		var err error
		if bodies, err = cc.getMany(ctx, c.e.dest.http, paths); err != nil {
			return "", err
		}
	} else {
		bodies = make([][]byte, concurrent)
		errs := make([]error, concurrent)
		var wg sync.WaitGroup
		for i := range paths {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var status int
				status, bodies[i], errs[i] = c.client.get(ctx, c.e.dest.http, paths[i])
				if errs[i] == nil && status != 200 {
					errs[i] = fmt.Errorf("status %d: %.100q", status, bodies[i])
				}
			}()
		}
		wg.Wait()
		failed := 0
		var first error
		for i, err := range errs {
			if err != nil {
				failed++
				if first == nil {
					first = fmt.Errorf("connection %d: %v", i, err)
				}
			}
		}
		if failed > 0 {
			return "", fmt.Errorf("%d of %d connections failed; first: %v", failed, concurrent, first)
		}
	}
	for i, b := range bodies {
		if want := connBody(i); string(b) != want {
			return "", fmt.Errorf("connection %d: body %.80q (%d bytes), want %.80q (%d bytes)", i, b, len(b), want, len(want))
		}
	}
	return "", nil
}

// expectations for the dial-error scenario, per client kind: exactly what
// the upstream pairing produces (the reference cell checks them too).
func dialErrorWant(kind clientKind, addr, agentText string) string {
	switch kind.name {
	case "kclient", "egress-grpc-uds":
		return agentText
	case "curl":
		return "curl exit 56, CONNECT response 502"
	default:
		return fmt.Sprintf("proxy error from <proxy> while dialing %s, code 502: 502 Bad Gateway", addr)
	}
}

// goDialError is the error text of a Go dial to addr from this process:
// what the upstream agent, also Go, reports on this machine (the name
// error names the DNS server that answered, so it cannot be a constant).
func goDialError(addr string) string {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err == nil {
		c.Close()
		return "(dial succeeded)"
	}
	return err.Error()
}

func scDialErrors(ctx context.Context, c *cell) (string, error) {
	d := c.e.dest
	var notes []string
	for _, addr := range []string{d.closed, d.unresolved} {
		got, err := c.client.dialFail(ctx, addr)
		if err != nil {
			return "", fmt.Errorf("dial %s: %v", addr, err)
		}
		goText := goDialError(addr)
		want := dialErrorWant(c.kind, addr, goText)
		if got == want {
			continue
		}
		// konn resolves names with getaddrinfo, which does not say which
		// DNS server answered: its text lacks Go's " on <server>" part.
		if c.pair.agent == konn && addr == d.unresolved {
			host, _, _ := net.SplitHostPort(addr)
			alt := dialErrorWant(c.kind, addr, "dial tcp: lookup "+host+": no such host")
			if got == alt && alt != want {
				c.sub.Logf("name error: konn %q, upstream %q", got, want)
				notes = append(notes, `the konn agent's error for the unknown name lacks Go's " on <DNS server>" (see the differences below)`)
				continue
			}
		}
		return "", fmt.Errorf("dial %s: got %q, want %q (as upstream)", addr, got, want)
	}
	// The proxy still works after the failures.
	if err := expectHello(ctx, c.client, d); err != nil {
		return "", fmt.Errorf("after the failed dials: %v", err)
	}
	return strings.Join(notes, "; "), nil
}

func scCancelDial(ctx context.Context, c *cell) (string, error) {
	d := c.e.dest
	got, took, err := c.client.cancelDial(ctx, d.hang, 300*time.Millisecond)
	if err != nil {
		return "", err
	}
	var want string
	var bound time.Duration
	switch c.kind.name {
	case "kclient", "egress-grpc-uds":
		// DialContext honours the context: DIAL_CLS goes to the server.
		want, bound = "dial timeout, context", 2*time.Second
	case "curl":
		want, bound = "curl interrupted while its CONNECT was pending", 3*time.Second
	default:
		// kube-apiserver's CONNECT dialer ignores the context once it
		// has sent CONNECT: the dial ends with the agent's 5 s dial
		// timeout, which the server maps to 504.
		want = fmt.Sprintf("proxy error from <proxy> while dialing %s, code 504: 504 Gateway Timeout", d.hang)
		bound = 15 * time.Second
	}
	if got != want {
		return "", fmt.Errorf("cancelled dial: got %q, want %q", got, want)
	}
	if took > bound {
		return "", fmt.Errorf("the cancelled dial returned only %v after the cancel (bound %v)", took, bound)
	}
	// The server forgets the dial (upstream: at the DIAL_CLS, or when the
	// agent's dial times out for CONNECT clients).
	if err := waitFor(15*time.Second, "pending_backend_dials to return to 0", c.srv.p, func() error {
		v, err := c.srv.metric("konnectivity_network_proxy_server_pending_backend_dials")
		if err != nil {
			return err
		}
		if v != 0 {
			return fmt.Errorf("pending_backend_dials = %v", v)
		}
		return nil
	}); err != nil {
		return "", err
	}
	if err := expectHello(ctx, c.client, d); err != nil {
		return "", fmt.Errorf("after the cancelled dial: %v", err)
	}
	return "", nil
}

const agentDials = "konnectivity_network_proxy_agent_dial_duration_seconds_count"

func scDrain(ctx context.Context, c *cell) (string, error) {
	if err := c.healthy(); err != nil {
		return "", err
	}
	a := c.agent
	// Whatever happens, the draining agent does not outlive the scenario:
	// the later ones expect the cell's one agent only.
	defer a.p.kill()
	f, err := c.client.startFlow(ctx)
	if err != nil {
		return "", err
	}
	defer f.stop()
	if err := f.advance(64<<10, deadline); err != nil {
		return "", fmt.Errorf("connection through the first agent: %v", err)
	}
	// A second agent joins.
	if err := c.newAgent(); err != nil {
		return "", fmt.Errorf("second agent: %v", err)
	}
	b := c.agent
	if err := waitFor(deadline, "the server to count 2 agents", c.srv.p, func() error {
		v, err := c.srv.metric("konnectivity_network_proxy_server_ready_backend_connections")
		if err != nil {
			return err
		}
		if v != 2 {
			return fmt.Errorf("ready_backend_connections = %v", v)
		}
		return nil
	}); err != nil {
		return "", err
	}
	// First SIGTERM: the first agent sends DRAIN and keeps serving.
	if err := a.p.signal(syscall.SIGTERM); err != nil {
		return "", err
	}
	time.Sleep(time.Second) // the DRAIN packet reaches the server
	if !a.p.running() {
		return "", fmt.Errorf("the agent exited at the first SIGTERM (%s)", a.p.status())
	}
	if err := f.advance(64<<10, deadline); err != nil {
		return "", fmt.Errorf("the connection through the draining agent: %v", err)
	}
	// The histogram has no labels: upstream exports it after the first
	// dial only, so absent counts as 0.
	beforeA, errA := a.counter(agentDials)
	beforeB, errB := b.counter(agentDials)
	if err := errors.Join(errA, errB); err != nil {
		return "", err
	}
	const n = 10
	for i := 0; i < n; i++ {
		if err := expectHello(ctx, c.client, c.e.dest); err != nil {
			return "", fmt.Errorf("new connection %d after DRAIN: %v", i, err)
		}
	}
	afterA, errA := a.counter(agentDials)
	afterB, errB := b.counter(agentDials)
	if err := errors.Join(errA, errB); err != nil {
		return "", err
	}
	if afterA != beforeA || afterB-beforeB != n {
		return "", fmt.Errorf("after DRAIN, %d new dials went %v to the draining agent and %v to the other; want 0 and %d",
			n, afterA-beforeA, afterB-beforeB, n)
	}
	// Second SIGTERM: exit.
	if err := a.p.signal(syscall.SIGTERM); err != nil {
		return "", err
	}
	if !a.p.waitExit(15 * time.Second) {
		return "", errors.New("the draining agent did not exit within 15 s of the second SIGTERM")
	}
	if code := a.p.exitCode(); code != 0 {
		return "", fmt.Errorf("the draining agent exited with %s, want status 0", a.p.status())
	}
	return "", nil
}

func scAgentKill(ctx context.Context, c *cell) (string, error) {
	if err := c.healthy(); err != nil {
		return "", err
	}
	p, err := c.client.startFlow(ctx)
	if err != nil {
		return "", err
	}
	defer p.stop()
	if err := p.advance(256<<10, deadline); err != nil {
		return "", fmt.Errorf("before the kill: %v", err)
	}
	if err := c.agent.p.signal(syscall.SIGKILL); err != nil {
		return "", err
	}
	if err := p.ended(15 * time.Second); err != nil {
		return "", fmt.Errorf("client connection after the agent died: %v", err)
	}
	if err := waitFor(15*time.Second, "server /readyz to report no agent", c.srv.p, func() error {
		code, body, err := httpGet(c.srv.health, "/readyz")
		if err != nil {
			return err
		}
		if code != 500 || !strings.Contains(body, "no connection to any proxy agent") {
			return fmt.Errorf("status %d: %q", code, body)
		}
		return nil
	}); err != nil {
		return "", err
	}
	if err := c.newAgent(); err != nil {
		return "", fmt.Errorf("replacement agent: %v", err)
	}
	if err := expectHello(ctx, c.client, c.e.dest); err != nil {
		return "", fmt.Errorf("through the replacement agent: %v", err)
	}
	return "", nil
}

func scServerRestart(ctx context.Context, c *cell) (string, error) {
	if err := c.healthy(); err != nil {
		return "", err
	}
	p, err := c.client.startFlow(ctx)
	if err != nil {
		return "", err
	}
	defer p.stop()
	if err := p.advance(256<<10, deadline); err != nil {
		return "", fmt.Errorf("before the restart: %v", err)
	}
	if err := c.srv.p.signal(syscall.SIGTERM); err != nil {
		return "", err
	}
	if !c.srv.p.waitExit(15 * time.Second) {
		return "", errors.New("the server did not exit within 15 s of SIGTERM")
	}
	if code := c.srv.p.exitCode(); code != 0 {
		return "", fmt.Errorf("the server exited with %s after SIGTERM, want status 0", c.srv.p.status())
	}
	if err := p.ended(15 * time.Second); err != nil {
		return "", fmt.Errorf("client connection after the server stopped: %v", err)
	}
	began := time.Now()
	if err := c.srv.start(c.t, c.e); err != nil {
		return "", fmt.Errorf("restarting the server: %v", err)
	}
	if err := c.srv.waitReady(30 * time.Second); err != nil {
		return "", fmt.Errorf("the agent did not reconnect: %v", err)
	}
	if !c.agent.p.running() {
		return "", fmt.Errorf("the agent exited (%s)", c.agent.p.status())
	}
	c.sub.Logf("agent reconnected %v after the server restarted", time.Since(began).Round(time.Millisecond))
	if err := expectHello(ctx, c.client, c.e.dest); err != nil {
		return "", fmt.Errorf("after the restart: %v", err)
	}
	return "", nil
}

func scLB(ctx context.Context, c *cell) (string, error) {
	dir := filepath.Join(c.dir, "lb")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	// The scenario's processes end with it (not with the cell).
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()
	tb := &scopedTB{TB: c.t, cleanups: &cleanups}
	var servers []*server
	var backends []string
	for i := 1; i <= 3; i++ {
		s, err := newServer(c.e, dir, c.pair.server, c.kind.mode, c.kind.tcp, fmt.Sprintf("lb-server-%d", i), 3)
		if err != nil {
			return "", err
		}
		if err := s.start(tb, c.e); err != nil {
			return "", err
		}
		servers = append(servers, s)
		backends = append(backends, fmt.Sprintf("127.0.0.1:%d", s.agent))
	}
	lb, err := startLB(backends)
	if err != nil {
		return "", err
	}
	cleanups = append(cleanups, lb.close)
	a, err := startAgent(tb, c.e, dir, c.pair.agent, "lb-agent", lb.port)
	if err != nil {
		return "", err
	}
	for _, s := range servers {
		if err := s.waitReady(30 * time.Second); err != nil {
			return "", fmt.Errorf("agent behind the balancer: %v\n%s\n%s", err, s.p.tail(15), a.p.tail(25))
		}
	}
	if err := waitFor(deadline, "the agent to hold 3 server connections", a.p, func() error {
		v, err := a.metric("konnectivity_network_proxy_agent_open_server_connections")
		if err != nil {
			return err
		}
		if v != 3 {
			return fmt.Errorf("open_server_connections = %v", v)
		}
		return nil
	}); err != nil {
		return "", err
	}
	for _, s := range servers {
		cl, err := newClient(c.e, c.kind, s, dir)
		if err != nil {
			return "", err
		}
		if err := expectHello(ctx, cl, c.e.dest); err != nil {
			return "", fmt.Errorf("through %s: %v\n%s", s.id, err, s.p.tail(15))
		}
	}
	c.sub.Logf("the balancer spread the agent's connections %v", lb.counts())
	return "", nil
}

// scopedTB is a testing.TB whose Cleanup functions run when the scenario
// returns rather than when the test ends.
type scopedTB struct {
	testing.TB
	cleanups *[]func()
}

func (s *scopedTB) Cleanup(f func()) { *s.cleanups = append(*s.cleanups, f) }
