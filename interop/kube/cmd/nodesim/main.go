// Command nodesim is "the node network" of the Kubernetes end-to-end suite:
// everything kube-apiserver dials through the konnectivity tunnel, in one
// process, run inside the node network namespace.
//
//   - a kubelet (HTTPS on the node's InternalIP, client certificates
//     required) with the kubelet's real paths: /containerLogs (streaming
//     with follow), /exec, /attach and /portForward proxied to a CRI
//     streaming server (k8s.io/cri-streaming, the package container
//     runtimes use) exactly as the kubelet does, including its translation
//     of WebSocket v5.channel.k8s.io and port-forward tunnelling
//     (ExtendWebSocketsToKubelet), /metrics, /healthz;
//   - the pod's servers on the pod IP: an HTTP server behind a Service
//     (service proxy), a validating admission webhook (HTTPS), an
//     aggregated API server for konn.test/v1alpha1 (HTTPS) and a TCP echo
//     server (port-forward target).
//
// The test talks to it over a Unix socket (--control), which crosses
// network namespaces: it appends log lines, ends log streams and reads
// what the kubelet saw. Every HTTP server answers with keep-alive off, so
// no idle connection stays open through the tunnel after a request.
//
// When everything listens, the chosen ports go to --ready-file as JSON.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Ports is what --ready-file receives.
type Ports struct {
	Kubelet int `json:"kubelet"`
	HTTP    int `json:"http"`
	Webhook int `json:"webhook"`
	APIExt  int `json:"apiext"`
	Echo    int `json:"echo"`
}

func main() {
	nodeIP := flag.String("node-ip", "", "the node's InternalIP: the kubelet listens here")
	podIP := flag.String("pod-ip", "", "the pod IP: the pod's servers listen here")
	pkiDir := flag.String("pki", "", "directory with ca.crt, kubelet.{crt,key} and pods.{crt,key}")
	control := flag.String("control", "", "Unix socket for the test's control requests")
	readyFile := flag.String("ready-file", "", "write the listening ports here (JSON) when ready")
	flag.Parse()
	if *nodeIP == "" || *podIP == "" || *pkiDir == "" || *control == "" || *readyFile == "" {
		log.Fatal("nodesim: --node-ip, --pod-ip, --pki, --control and --ready-file are required")
	}
	log.SetFlags(log.Ltime | log.Lmicroseconds)

	caPEM, err := os.ReadFile(filepath.Join(*pkiDir, "ca.crt"))
	if err != nil {
		log.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		log.Fatal("nodesim: no CA certificate in ca.crt")
	}
	load := func(name string) tls.Certificate {
		c, err := tls.LoadX509KeyPair(filepath.Join(*pkiDir, name+".crt"), filepath.Join(*pkiDir, name+".key"))
		if err != nil {
			log.Fatal(err)
		}
		return c
	}

	st := newState(*podIP)
	var ports Ports

	// The CRI streaming server: loopback of the node namespace, as a
	// container runtime's.
	criLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	cri, err := newCRIServer(criLn.Addr().String(), st)
	if err != nil {
		log.Fatal(err)
	}
	go serve(criLn, cri, nil)

	kubeletTLS := &tls.Config{
		Certificates: []tls.Certificate{load("kubelet")},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		MinVersion:   tls.VersionTLS12,
	}
	ports.Kubelet = listenServe(*nodeIP, newKubelet(st, cri), kubeletTLS)

	podTLS := func(clientAuth tls.ClientAuthType) *tls.Config {
		return &tls.Config{Certificates: []tls.Certificate{load("pods")}, ClientAuth: clientAuth, ClientCAs: pool, MinVersion: tls.VersionTLS12}
	}
	ports.HTTP = listenServe(*podIP, st.count("http", httpBackend(*podIP)), nil)
	ports.Webhook = listenServe(*podIP, st.count("webhook", webhook()), podTLS(tls.NoClientCert))
	// kube-apiserver's aggregator presents its front-proxy client
	// certificate (--proxy-client-cert-file); verify it when given.
	ports.APIExt = listenServe(*podIP, st.count("apiext", apiext(*podIP)), podTLS(tls.VerifyClientCertIfGiven))
	ports.Echo = echoServer(*podIP, st)

	os.Remove(*control)
	ctlLn, err := net.Listen("unix", *control)
	if err != nil {
		log.Fatal(err)
	}
	go serve(ctlLn, st.controlHandler(), nil)

	b, _ := json.Marshal(ports)
	tmp := *readyFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		log.Fatal(err)
	}
	if err := os.Rename(tmp, *readyFile); err != nil {
		log.Fatal(err)
	}
	log.Printf("nodesim: ready: kubelet %s:%d, pod %s (http %d, webhook %d, apiext %d, echo %d)",
		*nodeIP, ports.Kubelet, *podIP, ports.HTTP, ports.Webhook, ports.APIExt, ports.Echo)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	log.Print("nodesim: exiting")
}

func listenServe(ip string, h http.Handler, tc *tls.Config) int {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		log.Fatal(err)
	}
	go serve(ln, h, tc)
	return ln.Addr().(*net.TCPAddr).Port
}

func serve(ln net.Listener, h http.Handler, tc *tls.Config) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second, TLSConfig: tc,
		ErrorLog: log.New(os.Stderr, "http: ", log.Ltime|log.Lmicroseconds)}
	srv.SetKeepAlivesEnabled(false)
	var err error
	if tc != nil {
		err = srv.ServeTLS(ln, "", "")
	} else {
		err = srv.Serve(ln)
	}
	if err != nil && err != http.ErrServerClosed {
		log.Fatal(err)
	}
}

// state is what the servers share with the control socket.
type state struct {
	podIP string

	mu       sync.Mutex
	logs     map[string]*logBuf
	requests []Request
	counts   map[string]int
}

// Request is one request the kubelet (or a pod server) received, as the
// control socket reports it.
type Request struct {
	Server   string `json:"server"`
	Kind     string `json:"kind"` // containerLogs, exec, attach, portForward, metrics, ...
	Path     string `json:"path"`
	Upgrade  string `json:"upgrade,omitempty"`  // Upgrade header (SPDY/3.1, websocket)
	Protocol string `json:"protocol,omitempty"` // sub-protocols asked for
	User     string `json:"user,omitempty"`     // client certificate CN
}

func newState(podIP string) *state {
	return &state{podIP: podIP, logs: map[string]*logBuf{}, counts: map[string]int{}}
}

func (s *state) record(r Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.requests) < 100000 {
		s.requests = append(s.requests, r)
	}
	s.counts[r.Server+" "+r.Kind]++
}

func (s *state) count(server string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 2)[0]
		s.record(Request{Server: server, Kind: kind, Path: r.URL.Path, User: peerCN(r)})
		h.ServeHTTP(w, r)
	})
}

func peerCN(r *http.Request) string {
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		return r.TLS.PeerCertificates[0].Subject.CommonName
	}
	return ""
}

// logBuf is one container's log: lines so far, and a channel closed (and
// replaced) whenever a line is added or the log ends.
type logBuf struct {
	lines   []string
	changed chan struct{}
	ended   bool
}

func (s *state) logFor(key string) *logBuf {
	b, ok := s.logs[key]
	if !ok {
		b = &logBuf{lines: []string{"log line 0: written before anyone followed"}, changed: make(chan struct{})}
		s.logs[key] = b
	}
	return b
}

// logSince returns the lines from index i on, whether the log ended, and
// a channel that closes at the next change.
func (s *state) logSince(key string, i int) ([]string, bool, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.logFor(key)
	var out []string
	if i < len(b.lines) {
		out = append(out, b.lines[i:]...)
	}
	return out, b.ended, b.changed
}

func (s *state) logAppend(key, line string, end bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.logFor(key)
	if end {
		b.ended = true
	} else {
		b.lines = append(b.lines, line)
	}
	close(b.changed)
	b.changed = make(chan struct{})
}

// controlHandler serves the test over the Unix socket:
//
//	POST /log?key=ns/pod/container   body: one line to append
//	POST /log-end?key=ns/pod/container
//	POST /log-reset?key=ns/pod/container
//	GET  /requests                   JSON list of Request
func (s *state) controlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /log", func(w http.ResponseWriter, r *http.Request) {
		line, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		s.logAppend(r.URL.Query().Get("key"), strings.TrimRight(string(line), "\n"), false)
	})
	mux.HandleFunc("POST /log-end", func(w http.ResponseWriter, r *http.Request) {
		s.logAppend(r.URL.Query().Get("key"), "", true)
	})
	mux.HandleFunc("POST /log-reset", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		key := r.URL.Query().Get("key")
		if b, ok := s.logs[key]; ok {
			close(b.changed)
		}
		delete(s.logs, key)
	})
	mux.HandleFunc("GET /requests", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		b, err := json.Marshal(s.requests)
		s.mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
	})
	return mux
}

// echoServer echoes every connection back until the client closes.
func echoServer(ip string, st *state) int {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				log.Fatal(err)
			}
			st.record(Request{Server: "echo", Kind: "connection"})
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// httpBackend is the Service's backend.
func httpBackend(podIP string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "hello from the node network: pod %s answered %s %s\n", podIP, r.Method, r.URL.Path)
	})
	mux.HandleFunc("/bytes/", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/bytes/"))
		if err != nil || n < 0 || n > 64<<20 {
			http.Error(w, "bad size", 400)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(n))
		writePattern(w, n)
	})
	return mux
}

// writePattern writes n bytes of a fixed pattern (byte i = i*7 mod 251).
func writePattern(w io.Writer, n int) {
	buf := make([]byte, 32<<10)
	for off := 0; off < n; {
		k := min(len(buf), n-off)
		for i := 0; i < k; i++ {
			buf[i] = byte(((off + i) * 7) % 251)
		}
		if _, err := w.Write(buf[:k]); err != nil {
			return
		}
		off += k
	}
}

// parseKubeletPath splits /<kind>/<ns>/<pod>[/<uid>]/<container> (the
// container is absent for portForward).
func parseKubeletPath(p string, withContainer bool) (ns, pod, uid, container string, ok bool) {
	parts := strings.Split(strings.Trim(p, "/"), "/")
	if len(parts) < 2 {
		return
	}
	parts = parts[1:]
	switch {
	case withContainer && len(parts) == 3:
		return parts[0], parts[1], "", parts[2], true
	case withContainer && len(parts) == 4:
		return parts[0], parts[1], parts[2], parts[3], true
	case !withContainer && len(parts) == 2:
		return parts[0], parts[1], "", "", true
	case !withContainer && len(parts) == 3:
		return parts[0], parts[1], parts[2], "", true
	}
	return
}

// cancelOnDone closes c when ctx ends.
func cancelOnDone(ctx context.Context, c io.Closer) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			c.Close()
		case <-done:
		}
	}()
	return func() { close(done) }
}
