package matrix

import (
	"bufio"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The destinations in "the node network", shared by every cell.
type destinations struct {
	http       string // HTTP server: /hello, /conn/N, /sha256, /bytes, /sink
	echo       string // TCP echo server
	closed     string // a port nothing listens on
	hang       string // a listener whose accept queue is full: dials hang
	unresolved string // a name no resolver knows

	httpSrv  *http.Server
	echoLn   net.Listener
	hangFD   int
	hangFill []net.Conn

	mu       sync.Mutex
	barriers map[string]*barrier
	sinks    map[string]*pump
	sinkSeq  int
}

func (d *destinations) newSink() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sinkSeq++
	return strconv.Itoa(d.sinkSeq)
}

func (d *destinations) attachSink(id string, p *pump) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sinks[id] = p
}

func (d *destinations) detachSink(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.sinks, id)
}

func (d *destinations) sink(id string) *pump {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.sinks[id]
}

// helloBody is what GET /hello answers.
const helloBody = "hello from the node network\n"

// connBody is what GET /conn/N answers: distinct per N, a few KiB.
func connBody(n int) string {
	return strings.Repeat(fmt.Sprintf("connection %d;", n), 300)
}

func startDestinations() (*destinations, error) {
	d := &destinations{barriers: map[string]*barrier{}, sinks: map[string]*pump{}, hangFD: -1}
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, helloBody)
	})
	mux.HandleFunc("/conn/", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/conn/"))
		if err != nil {
			http.Error(w, "bad id", http.StatusBadRequest)
			return
		}
		// ?barrier=ID&n=K: answer only once K requests of this barrier
		// are open at the same time, so that all K flows are proven to
		// be concurrent through the tunnel.
		if id := r.URL.Query().Get("barrier"); id != "" {
			k, _ := strconv.Atoi(r.URL.Query().Get("n"))
			if !d.barrier(id, k).wait(deadline) {
				http.Error(w, "barrier timed out", http.StatusGatewayTimeout)
				return
			}
		}
		io.WriteString(w, connBody(n))
	})
	// /sha256 answers "<sha256 hex> <length>" of the request body.
	mux.HandleFunc("/sha256", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, &slowReader{r: r.Body, rate: destRate})
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%x %d\n", h.Sum(nil), n)
	})
	// /bytes?n=N sends the first N bytes of the pattern stream.
	mux.HandleFunc("/bytes", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "bad n", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		writePattern(w, n)
	})
	// /sink?id=ID checks an uploaded pattern stream as it arrives and
	// reports to the flow registered under ID.
	mux.HandleFunc("/sink", func(w http.ResponseWriter, r *http.Request) {
		p := d.sink(r.URL.Query().Get("id"))
		if p == nil {
			http.Error(w, "unknown sink", http.StatusNotFound)
			return
		}
		v := &patternChecker{}
		buf := make([]byte, 64<<10)
		for {
			n, err := r.Body.Read(buf)
			if n > 0 {
				if cerr := v.check(buf[:n]); cerr != nil {
					p.fail(cerr)
					http.Error(w, cerr.Error(), http.StatusBadRequest)
					return
				}
				p.add(n)
			}
			if err != nil {
				return
			}
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	d.http = ln.Addr().String()
	d.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: deadline}
	go d.httpSrv.Serve(ln)

	if d.echoLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		d.close()
		return nil, err
	}
	d.echo = d.echoLn.Addr().String()
	go serveEcho(d.echoLn)

	if d.closed, err = closedPort(); err != nil {
		d.close()
		return nil, err
	}
	if err := d.startHang(); err != nil {
		d.close()
		return nil, fmt.Errorf("hanging listener: %v", err)
	}
	d.unresolved = "konn-interop-no-such-host.invalid:80"
	return d, nil
}

func serveEcho(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			io.Copy(c, &slowReader{r: c, rate: destRate})
			if tc, ok := c.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
		}()
	}
}

// The bulk scenario's receivers are slower than the senders: the
// destinations read at destRate and the clients at clientRate, both below
// what every proxy path here can carry. Each proxy must therefore hold the
// sender back (flow control) in both directions, not buffer without bound
// or give up on the connection. (The echo destination sends back at most
// destRate, so the client is the slower receiver on the way back.)
const (
	destRate   = 32 << 20 // bytes per second
	clientRate = 16 << 20
)

// slowReader reads at most rate bytes per second from r.
type slowReader struct {
	r     io.Reader
	rate  float64
	start time.Time
	n     int64
}

func (s *slowReader) Read(p []byte) (int, error) {
	if len(p) > 32<<10 {
		p = p[:32<<10]
	}
	if s.start.IsZero() {
		s.start = time.Now()
	}
	n, err := s.r.Read(p)
	s.pace(n)
	return n, err
}

// pace sleeps until n more bytes are due at the rate.
func (s *slowReader) pace(n int) {
	s.n += int64(n)
	due := time.Duration(float64(s.n) / s.rate * float64(time.Second))
	if wait := due - time.Since(s.start); wait > 0 {
		time.Sleep(wait)
	}
}

// slowWriter accepts at most rate bytes per second for w.
type slowWriter struct {
	w io.Writer
	s slowReader
}

func (s *slowWriter) Write(p []byte) (int, error) {
	if s.s.start.IsZero() {
		s.s.start = time.Now()
	}
	n, err := s.w.Write(p)
	s.s.pace(n)
	return n, err
}

// closedPort returns 127.0.0.1:P where nothing listens: a port taken from
// the kernel and released.
func closedPort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr, nil
}

// startHang opens a listener with a backlog of 0 that never accepts, and
// fills its accept queue: the kernel then drops further SYNs, so a dial
// to it hangs until the dialler gives up.
func (d *destinations) startHang() error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d.hangFD = fd
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return err
	}
	if err := syscall.Listen(fd, 0); err != nil {
		return err
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		return err
	}
	d.hang = fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	for i := 0; i < 8; i++ {
		c, err := net.DialTimeout("tcp", d.hang, 300*time.Millisecond)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return nil // the queue is full: dials hang
			}
			return err
		}
		d.hangFill = append(d.hangFill, c)
	}
	return fmt.Errorf("the accept queue of %s never filled", d.hang)
}

func (d *destinations) close() {
	if d.httpSrv != nil {
		d.httpSrv.Close()
	}
	if d.echoLn != nil {
		d.echoLn.Close()
	}
	for _, c := range d.hangFill {
		c.Close()
	}
	if d.hangFD >= 0 {
		syscall.Close(d.hangFD)
	}
}

type barrier struct {
	mu    sync.Mutex
	n     int
	want  int
	ready chan struct{}
}

func (d *destinations) barrier(id string, want int) *barrier {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.barriers[id]
	if !ok {
		b = &barrier{want: want, ready: make(chan struct{})}
		d.barriers[id] = b
	}
	return b
}

func (b *barrier) wait(timeout time.Duration) bool {
	b.mu.Lock()
	b.n++
	if b.n == b.want {
		close(b.ready)
	}
	b.mu.Unlock()
	select {
	case <-b.ready:
		return true
	case <-time.After(timeout):
		return false
	}
}

// Ports. Upstream refuses ports above 49151 ("ephemeral") for every
// listener, so the kernel's `:0` choice (32768-60999 on Linux) cannot be
// passed on as it is. Ports are picked at random below the ephemeral range,
// checked free with a listener, and never handed out twice in a run.
var (
	portsMu   sync.Mutex
	portsUsed = map[int]bool{}
)

func freePort() (int, error) {
	lo, hi := 20000, ephemeralLow()
	if hi > 49152 {
		hi = 49152
	}
	if hi-lo < 1000 {
		lo = hi - 1000
	}
	portsMu.Lock()
	defer portsMu.Unlock()
	for i := 0; i < 200; i++ {
		p := lo + rand.IntN(hi-lo)
		if portsUsed[p] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		ln.Close()
		portsUsed[p] = true
		return p, nil
	}
	return 0, errors.New("no free port found below the ephemeral range")
}

// ephemeralLow is the start of the kernel's ephemeral port range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 21000 {
				return n
			}
		}
	}
	return 32768
}

// readHTTPResponse reads one response and its whole body from r.
func readHTTPResponse(r io.Reader) (*http.Response, []byte, error) {
	resp, err := http.ReadResponse(bufio.NewReader(r), nil)
	if err != nil {
		return nil, nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body, err
}
