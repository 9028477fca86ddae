package matrix

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apiserver/pkg/server/egressselector"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
)

// clientKind is one column group of the matrix: how the proxy is used.
type clientKind struct {
	name string
	mode string // the server's --mode
	tcp  bool   // the server's frontend is TCP + mTLS (else a Unix socket)
	desc string
}

var clientKinds = []clientKind{
	{"kclient", "grpc", false, "konnectivity-client `CreateSingleUseGrpcTunnelWithContext` + `DialContext` over a Unix socket, as kube-apiserver calls it"},
	{"egress-grpc-uds", "grpc", false, "k8s.io/apiserver egress selector from an EgressSelectorConfiguration file: GRPC over a Unix socket"},
	{"egress-connect-uds", "http-connect", false, "k8s.io/apiserver egress selector from an EgressSelectorConfiguration file: HTTPConnect over a Unix socket"},
	{"egress-connect-mtls", "http-connect", true, "k8s.io/apiserver egress selector from an EgressSelectorConfiguration file: HTTPConnect over TCP with mTLS"},
	{"curl", "http-connect", true, "curl through the HTTPS (mTLS) proxy with `--proxytunnel` (HTTP CONNECT)"},
}

// tunnelClient is what the scenarios need from a client.
type tunnelClient interface {
	// get sends GET path to the HTTP destination addr through the proxy.
	get(ctx context.Context, addr, path string) (status int, body []byte, err error)
	// bulk moves n bytes each way through the proxy at the same time and
	// checks them by SHA-256.
	bulk(ctx context.Context, n int64) error
	// startFlow opens a connection through the proxy on which patterned
	// data keeps flowing until it is stopped or the connection ends.
	startFlow(ctx context.Context) (*pump, error)
	// dialFail dials addr, which must fail, and describes the failure as
	// the client sees it (error text, status code). The proxy's address
	// is replaced by "<proxy>" in the description.
	dialFail(ctx context.Context, addr string) (string, error)
	// cancelDial starts a dial to addr, cancels it after `after` the way
	// this client can, and describes the outcome and how long the dial
	// took to return once cancelled.
	cancelDial(ctx context.Context, addr string, after time.Duration) (string, time.Duration, error)
}

func newClient(e *env, kind clientKind, s *server, dir string) (tunnelClient, error) {
	switch kind.name {
	case "kclient":
		return &connClient{e: e, proxy: s.uds, dial: kclientDial(s.uds)}, nil
	case "curl":
		return &curlClient{e: e, proxy: s.frontendAddr(), dir: dir}, nil
	default:
		dial, err := egressDial(kind, s, e, dir)
		if err != nil {
			return nil, err
		}
		return &connClient{e: e, proxy: s.frontendAddr(), dial: dial}, nil
	}
}

type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// kclientDial is kube-apiserver's use of konnectivity-client: one
// single-use tunnel per dial, created with the request's context and a
// tunnel context that outlives it.
func kclientDial(uds string) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		tunnel, err := client.CreateSingleUseGrpcTunnelWithContext(ctx, context.Background(), uds,
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", uds)
			}),
			grpc.WithBlock(),
			grpc.WithReturnConnectionError(),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		return tunnel.DialContext(ctx, network, addr)
	}
}

// egressDial loads an EgressSelectorConfiguration file written for the
// server's frontend and returns the "cluster" dialer kube-apiserver would
// build from it.
func egressDial(kind clientKind, s *server, e *env, dir string) (dialFunc, error) {
	var conn string
	switch kind.name {
	case "egress-grpc-uds":
		conn = fmt.Sprintf("    proxyProtocol: GRPC\n    transport:\n      uds:\n        udsName: %s\n", s.uds)
	case "egress-connect-uds":
		conn = fmt.Sprintf("    proxyProtocol: HTTPConnect\n    transport:\n      uds:\n        udsName: %s\n", s.uds)
	case "egress-connect-mtls":
		conn = fmt.Sprintf("    proxyProtocol: HTTPConnect\n    transport:\n      tcp:\n        url: https://127.0.0.1:%d\n"+
			"        tlsConfig:\n          caBundle: %s\n          clientCert: %s\n          clientKey: %s\n",
			s.port, e.pki.ca, e.pki.frontendCert, e.pki.frontendKey)
	default:
		return nil, fmt.Errorf("no egress configuration for %s", kind.name)
	}
	yaml := "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\negressSelections:\n" +
		"- name: cluster\n  connection:\n" + conn
	path := filepath.Join(dir, kind.name+"-"+s.id+".yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		return nil, err
	}
	cfg, err := egressselector.ReadEgressSelectorConfiguration(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %v", path, err)
	}
	if errs := egressselector.ValidateEgressSelectorConfiguration(cfg); len(errs) > 0 {
		return nil, fmt.Errorf("validating %s: %v", path, errs.ToAggregate())
	}
	sel, err := egressselector.NewEgressSelector(cfg)
	if err != nil {
		return nil, err
	}
	dial, err := sel.Lookup(egressselector.Cluster.AsNetworkContext())
	if err != nil {
		return nil, err
	}
	if dial == nil {
		return nil, errors.New("the egress selector has no dialer for the cluster network")
	}
	return dialFunc(dial), nil
}

// connClient is a client that yields a net.Conn per dial: konnectivity-
// client and the egress selector's dialers.
type connClient struct {
	e     *env
	proxy string
	dial  dialFunc
}

func (c *connClient) dialCtx(ctx context.Context, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	// The egress selector's CONNECT dialers ignore the context once they
	// reach the proxy: bound the wait here as well.
	ch := make(chan result, 1)
	go func() {
		conn, err := c.dial(ctx, "tcp", addr)
		ch <- result{conn, err}
	}()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, fmt.Errorf("dial %s: no answer before the deadline: %w", addr, ctx.Err())
	}
}

func (c *connClient) get(ctx context.Context, addr, path string) (int, []byte, error) {
	conn, err := c.dialCtx(ctx, addr)
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, addr); err != nil {
		return 0, nil, err
	}
	resp, body, err := readHTTPResponse(conn)
	if err != nil {
		return 0, nil, fmt.Errorf("reading the response: %v", err)
	}
	return resp.StatusCode, body, nil
}

func (c *connClient) bulk(ctx context.Context, n int64) error {
	conn, err := c.dialCtx(ctx, c.e.dest.echo)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	return bulkEcho(conn, n)
}

// startFlow writes a patterned stream to the echo destination and checks
// what comes back.
func (c *connClient) startFlow(ctx context.Context) (*pump, error) {
	conn, err := c.dialCtx(ctx, c.e.dest.echo)
	if err != nil {
		return nil, err
	}
	p := newPump(func() { go conn.Close() })
	context.AfterFunc(ctx, p.stop)
	go func() {
		buf := make([]byte, 4096)
		var off int64
		for {
			fillPattern(buf, off)
			if _, err := conn.Write(buf); err != nil {
				return
			}
			off += int64(len(buf))
			select {
			case <-p.stopped:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	go p.read(conn)
	return p, nil
}

func (c *connClient) describe(err error) string {
	return strings.ReplaceAll(err.Error(), c.proxy, "<proxy>")
}

func (c *connClient) dialFail(ctx context.Context, addr string) (string, error) {
	conn, err := c.dialCtx(ctx, addr)
	if err == nil {
		conn.Close()
		return "", fmt.Errorf("the dial to %s succeeded", addr)
	}
	if ctx.Err() != nil {
		return "", err
	}
	return c.describe(err), nil
}

func (c *connClient) cancelDial(ctx context.Context, addr string, after time.Duration) (string, time.Duration, error) {
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var cancelledAt atomic.Int64 // UnixNano of the cancel; 0 before
	timer := time.AfterFunc(after, func() {
		cancelledAt.Store(time.Now().UnixNano())
		cancel()
	})
	sinceCancel := func() time.Duration { return time.Since(time.Unix(0, cancelledAt.Load())) }
	defer timer.Stop()
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		conn, err := c.dial(dctx, "tcp", addr)
		ch <- result{conn, err}
	}()
	select {
	case r := <-ch:
		if r.err == nil {
			r.c.Close()
			return "", 0, fmt.Errorf("the dial to %s succeeded", addr)
		}
		if cancelledAt.Load() == 0 {
			return "", 0, fmt.Errorf("the dial ended before it was cancelled: %v", r.err)
		}
		return c.describe(r.err), sinceCancel(), nil
	case <-ctx.Done():
		return "", 0, fmt.Errorf("the dial had not returned %v after it was cancelled", sinceCancel())
	}
}

// curlClient runs curl through the mTLS CONNECT frontend.
type curlClient struct {
	e     *env
	proxy string // 127.0.0.1:port
	dir   string
	seq   int
	mu    sync.Mutex
}

func (c *curlClient) args(extra ...string) []string {
	return append([]string{
		"--silent", "--show-error",
		"--proxytunnel",
		"--proxy", "https://" + c.proxy,
		"--proxy-cacert", c.e.pki.ca,
		"--proxy-cert", c.e.pki.frontendCert,
		"--proxy-key", c.e.pki.frontendKey,
		"--noproxy", "",
		"--write-out", "%{stderr}status=%{http_code} connect=%{http_connect}\\n",
	}, extra...)
}

// curlResult is one curl run.
type curlResult struct {
	exit    int
	status  int // %{http_code}
	connect int // %{http_connect}: the CONNECT response code
	stderr  string
}

func (r curlResult) String() string {
	return fmt.Sprintf("curl exit %d, CONNECT response %d, HTTP status %d, stderr %q", r.exit, r.connect, r.status, r.stderr)
}

func parseCurl(exit int, stderr string) curlResult {
	r := curlResult{exit: exit}
	var msgs []string
	for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if strings.HasPrefix(line, "status=") {
			for _, f := range strings.Fields(line) {
				k, v, _ := strings.Cut(f, "=")
				n, _ := strconv.Atoi(v)
				switch k {
				case "status":
					r.status = n
				case "connect":
					r.connect = n
				}
			}
		} else if line != "" {
			msgs = append(msgs, line)
		}
	}
	r.stderr = strings.Join(msgs, "\n")
	return r
}

func (c *curlClient) run(ctx context.Context, stdin io.Reader, stdout io.Writer, extra ...string) (curlResult, error) {
	cmd := exec.CommandContext(ctx, "curl", c.args(extra...)...)
	var stderr strings.Builder
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 2 * time.Second
	err := cmd.Run()
	exit := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ctx.Err() != nil {
			return curlResult{}, fmt.Errorf("curl: %v (stderr %q)", err, stderr.String())
		}
		exit = ee.ExitCode()
	}
	return parseCurl(exit, stderr.String()), nil
}

func (c *curlClient) get(ctx context.Context, addr, path string) (int, []byte, error) {
	var out strings.Builder
	r, err := c.run(ctx, nil, &out, "--max-time", "30", "http://"+addr+path)
	if err != nil {
		return 0, nil, err
	}
	if r.exit != 0 {
		return 0, nil, fmt.Errorf("%v", r)
	}
	return r.status, []byte(out.String()), nil
}

// getMany runs one curl with --parallel for all paths (curl's own way of
// holding many connections at once); the bodies come back in order.
func (c *curlClient) getMany(ctx context.Context, addr string, paths []string) ([][]byte, error) {
	c.mu.Lock()
	c.seq++
	dir := filepath.Join(c.dir, fmt.Sprintf("curl-many-%d", c.seq))
	c.mu.Unlock()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	args := []string{"--parallel", "--parallel-immediate", "--parallel-max", strconv.Itoa(len(paths)), "--max-time", "60"}
	for i, p := range paths {
		args = append(args, "--output", filepath.Join(dir, strconv.Itoa(i)), "http://"+addr+p)
	}
	r, err := c.run(ctx, nil, io.Discard, args...)
	if err != nil {
		return nil, err
	}
	if r.exit != 0 {
		return nil, fmt.Errorf("%v", r)
	}
	out := make([][]byte, len(paths))
	for i := range paths {
		if out[i], err = os.ReadFile(filepath.Join(dir, strconv.Itoa(i))); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// bulk runs two curls at once: one uploads n bytes (chunked, from a
// pipe) to /sha256, which answers with the digest of what arrived; the
// other downloads n patterned bytes from /bytes. (curl cannot be a
// full-duplex echo: it blocks reading its stdin and meanwhile does not
// read the response.)
func (c *curlClient) bulk(ctx context.Context, n int64) error {
	url := "http://" + c.e.dest.http
	up := make(chan error, 1)
	go func() {
		pr, pw := io.Pipe()
		sent := sha256.New()
		go func() {
			pw.CloseWithError(writePattern(io.MultiWriter(pw, sent), n))
		}()
		var out strings.Builder
		r, err := c.run(ctx, pr, &out, "--upload-file", "-", "--request", "POST", "--header", "Expect:", url+"/sha256")
		pr.Close()
		if err == nil && (r.exit != 0 || r.status != 200) {
			err = fmt.Errorf("upload: %v", r)
		}
		if err == nil {
			want := fmt.Sprintf("%x %d", sent.Sum(nil), n)
			if got := strings.TrimSpace(out.String()); got != want {
				err = fmt.Errorf("upload: the destination received %q, want %q (sha256, length)", got, want)
			}
		}
		up <- err
	}()
	got := sha256.New()
	r, err := c.run(ctx, nil, &slowWriter{w: got, s: slowReader{rate: clientRate}}, fmt.Sprintf("%s/bytes?n=%d", url, n))
	if err == nil && (r.exit != 0 || r.status != 200) {
		err = fmt.Errorf("download: %v", r)
	}
	if err == nil {
		want := sha256.New()
		writePattern(want, n)
		if a, b := want.Sum(nil), got.Sum(nil); string(a) != string(b) {
			err = fmt.Errorf("download: sha256 %x, want %x", b, a)
		}
	}
	return errors.Join(err, <-up)
}

// startFlow runs curl uploading a patterned stream (chunked, from a pipe)
// to /sink, where the destination checks it. The data flows towards the
// agent, as in the other clients' flows (the upstream agent sends DRAIN
// only when a packet from the server arrives on its tunnel).
func (c *curlClient) startFlow(ctx context.Context) (*pump, error) {
	id := c.e.dest.newSink()
	cmd := exec.Command("curl", c.args("--upload-file", "-", "--request", "POST", "--header", "Expect:",
		"http://"+c.e.dest.http+"/sink?id="+id)...)
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdin = r
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := newPump(func() {
		w.Close()
		if cmd.Process != nil {
			cmd.Process.Signal(syscall.SIGKILL)
		}
	})
	c.e.dest.attachSink(id, p)
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
		c.e.dest.detachSink(id)
		return nil, err
	}
	go func() {
		cmd.Wait()
		w.Close()
		c.e.dest.detachSink(id)
		p.finish()
	}()
	context.AfterFunc(ctx, p.stop)
	go func() {
		buf := make([]byte, 4096)
		var off int64
		for {
			fillPattern(buf, off)
			if _, err := w.Write(buf); err != nil {
				return
			}
			off += int64(len(buf))
			select {
			case <-p.stopped:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	return p, nil
}

func (c *curlClient) dialFail(ctx context.Context, addr string) (string, error) {
	r, err := c.run(ctx, nil, io.Discard, "--max-time", "30", "http://"+addr+"/")
	if err != nil {
		return "", err
	}
	if r.exit == 0 {
		return "", fmt.Errorf("curl to %s succeeded: %v", addr, r)
	}
	return fmt.Sprintf("curl exit %d, CONNECT response %d", r.exit, r.connect), nil
}

// cancelDial interrupts curl while its CONNECT waits (the way a caller
// gives up on a CONNECT proxy: it closes the connection).
func (c *curlClient) cancelDial(ctx context.Context, addr string, after time.Duration) (string, time.Duration, error) {
	cmd := exec.CommandContext(ctx, "curl", c.args("--max-time", "30", "http://"+addr+"/")...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 2 * time.Second
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return "", 0, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return "", 0, fmt.Errorf("curl ended before it was cancelled: %v, %v", err, parseCurl(cmd.ProcessState.ExitCode(), stderr.String()))
	case <-time.After(after):
	}
	cancelled := time.Now()
	cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-done:
	case <-ctx.Done():
		return "", 0, fmt.Errorf("curl did not exit after SIGINT")
	}
	if st := cmd.ProcessState; st.Success() {
		return "", 0, fmt.Errorf("curl to %s succeeded", addr)
	}
	return "curl interrupted while its CONNECT was pending", time.Since(cancelled), nil
}

// bulkEcho sends n patterned bytes through conn while reading the echo,
// and checks the SHA-256 of what came back.
func bulkEcho(conn net.Conn, n int64) error {
	sent := sha256.New()
	werr := make(chan error, 1)
	go func() {
		werr <- writePattern(io.MultiWriter(conn, sent), n)
	}()
	got := sha256.New()
	r := &slowReader{r: bufio.NewReaderSize(conn, 64<<10), rate: clientRate}
	m, err := io.CopyN(got, r, n)
	if err != nil {
		return fmt.Errorf("read %d of %d echoed bytes: %v", m, n, err)
	}
	if err := <-werr; err != nil {
		return err
	}
	if a, b := sent.Sum(nil), got.Sum(nil); string(a) != string(b) {
		return fmt.Errorf("checksum mismatch: sent sha256 %x, echoed %x", a, b)
	}
	return nil
}

// writePattern writes the first n bytes of the pattern stream to w, in
// 32 KiB writes as io.Copy makes them (kube-apiserver's proxying copies
// with io.Copy).
func writePattern(w io.Writer, n int64) error {
	buf := make([]byte, 32<<10)
	var off int64
	for off < n {
		m := min(int64(len(buf)), n-off)
		fillPattern(buf[:m], off)
		if _, err := w.Write(buf[:m]); err != nil {
			return fmt.Errorf("writing at byte %d: %v", off, err)
		}
		off += m
	}
	return nil
}

// fillPattern writes the bytes at stream offset off: a position-dependent
// pattern, so that a lost, duplicated or reordered chunk changes the hash.
func fillPattern(b []byte, off int64) {
	for i := range b {
		x := uint64(off + int64(i))
		b[i] = byte(x ^ x>>8 ^ (x>>16)*7)
	}
}

// pump follows a patterned stream while it flows: how many bytes arrived
// intact, and whether it ended.
type pump struct {
	mu       sync.Mutex
	received int64
	err      error         // corruption seen; or why the stream ended
	progress chan struct{} // signalled on every arrival
	done     chan struct{} // closed when the client's connection ended
	doneOnce sync.Once
	stopped  chan struct{}
	stopOnce sync.Once
	closer   func()
}

func newPump(closer func()) *pump {
	return &pump{progress: make(chan struct{}, 1), done: make(chan struct{}), stopped: make(chan struct{}), closer: closer}
}

// stop ends the flow from the client side.
func (p *pump) stop() {
	p.stopOnce.Do(func() {
		close(p.stopped)
		p.closer()
	})
}

// add records n more intact bytes.
func (p *pump) add(n int) {
	p.mu.Lock()
	p.received += int64(n)
	p.mu.Unlock()
	select {
	case p.progress <- struct{}{}:
	default:
	}
}

// fail records corrupt data.
func (p *pump) fail(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.mu.Unlock()
}

// finish records that the client's connection ended.
func (p *pump) finish() { p.doneOnce.Do(func() { close(p.done) }) }

func (p *pump) failure() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// read follows the stream arriving on r until it ends.
func (p *pump) read(r io.Reader) {
	defer p.finish()
	v := &patternChecker{}
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if cerr := v.check(buf[:n]); cerr != nil {
				p.fail(cerr)
				return
			}
			p.add(n)
		}
		if err != nil {
			return
		}
	}
}

// patternChecker compares consecutive pieces with the pattern stream.
type patternChecker struct {
	off  int64
	want []byte
}

func (v *patternChecker) check(b []byte) error {
	if len(v.want) < len(b) {
		v.want = make([]byte, len(b))
	}
	fillPattern(v.want[:len(b)], v.off)
	if !bytes.Equal(b, v.want[:len(b)]) {
		return fmt.Errorf("corrupt data at byte %d", v.off)
	}
	v.off += int64(len(b))
	return nil
}

func (p *pump) count() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.received
}

// advance waits until n more bytes arrived than when it was called.
func (p *pump) advance(n int64, d time.Duration) error {
	target := p.count() + n
	end := time.After(d)
	for p.count() < target {
		if err := p.failure(); err != nil {
			return err
		}
		select {
		case <-p.progress:
		case <-p.done:
			if err := p.failure(); err != nil {
				return err
			}
			return fmt.Errorf("the connection ended after %d bytes", p.count())
		case <-end:
			return fmt.Errorf("fewer than %d more bytes arrived within %v (at %d)", n, d, p.count())
		}
	}
	return p.failure()
}

// ended waits until the client's connection ends, and checks that every
// byte that arrived was intact.
func (p *pump) ended(d time.Duration) error {
	select {
	case <-p.done:
		return p.failure()
	case <-time.After(d):
		return fmt.Errorf("the connection was still open %v later (%d bytes arrived)", d, p.count())
	}
}
