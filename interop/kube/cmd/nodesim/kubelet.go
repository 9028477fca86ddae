package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/httpstream/wsstream"
	"k8s.io/apimachinery/pkg/util/proxy"
	translator "k8s.io/apiserver/pkg/util/proxy"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-streaming/pkg/streaming"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	remotecommandserver "k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"
)

// newCRIServer is the container runtime's streaming server, serving the
// fake containers below on addr.
func newCRIServer(addr string, st *state) (streaming.Server, error) {
	cfg := streaming.DefaultConfig
	cfg.Addr = addr
	cfg.BaseURL = &url.URL{Scheme: "http", Host: addr}
	// Idle sessions end after a minute: nothing in the suite idles that
	// long, and a leaked session cannot outlive the suite by much.
	cfg.StreamIdleTimeout = time.Minute
	return streaming.NewServer(cfg, &fakeRuntime{st: st})
}

// fakeRuntime runs the "containers". Exec understands a few commands:
//
//	cat                 copy stdin to stdout
//	sha256sum           SHA-256 of stdin, as sha256sum prints it
//	echo ARGS...        ARGS joined by spaces
//	hostname            the container id (namespace/pod/container)
//	exit N              exit status N
//
// Attach is a container whose main process echoes its stdin. PortForward
// connects to the pod IP's port, as a runtime connects inside the pod's
// network namespace.
type fakeRuntime struct{ st *state }

func (f *fakeRuntime) Exec(ctx context.Context, containerID string, cmd []string, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan remotecommandserver.TerminalSize) error {
	if len(cmd) == 0 {
		return fmt.Errorf("no command")
	}
	switch cmd[0] {
	case "cat":
		if in != nil && out != nil {
			if _, err := io.Copy(out, in); err != nil {
				return err
			}
		}
		return nil
	case "sha256sum":
		h := sha256.New()
		if in != nil {
			if _, err := io.Copy(h, in); err != nil {
				return err
			}
		}
		if out != nil {
			fmt.Fprintf(out, "%s  -\n", hex.EncodeToString(h.Sum(nil)))
		}
		return nil
	case "echo":
		if out != nil {
			fmt.Fprintln(out, strings.Join(cmd[1:], " "))
		}
		return nil
	case "hostname":
		if out != nil {
			fmt.Fprintln(out, containerID)
		}
		return nil
	case "exit":
		code := 1
		if len(cmd) > 1 {
			if n, err := strconv.Atoi(cmd[1]); err == nil {
				code = n
			}
		}
		return utilexec.CodeExitError{Err: fmt.Errorf("exit %d", code), Code: code}
	}
	if errw != nil {
		fmt.Fprintf(errw, "%s: command not found\n", cmd[0])
	}
	return utilexec.CodeExitError{Err: fmt.Errorf("%s: command not found", cmd[0]), Code: 127}
}

func (f *fakeRuntime) Attach(ctx context.Context, containerID string, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan remotecommandserver.TerminalSize) error {
	if errw != nil {
		fmt.Fprintf(errw, "attached to %s\n", containerID)
	}
	if in == nil || out == nil {
		return nil
	}
	_, err := io.Copy(out, in)
	return err
}

func (f *fakeRuntime) PortForward(ctx context.Context, podSandboxID string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	c, err := d.DialContext(dctx, "tcp", net.JoinHostPort(f.st.podIP, strconv.Itoa(int(port))))
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	stop := cancelOnDone(ctx, c)
	defer stop()
	up := make(chan struct{})
	go func() {
		defer close(up)
		io.Copy(c, stream)
		c.(*net.TCPConn).CloseWrite()
	}()
	_, err = io.Copy(stream, c)
	// The pod closed its side: end the stream; unblock the upstream copy.
	stream.Close()
	c.Close()
	<-up
	return err
}

// kubelet serves the kubelet's API paths the way the kubelet's server
// (pkg/kubelet/server) does, with the CRI streaming server behind it.
type kubelet struct {
	st  *state
	cri streaming.Server
}

func newKubelet(st *state, cri streaming.Server) http.Handler {
	k := &kubelet{st: st, cri: cri}
	mux := http.NewServeMux()
	mux.HandleFunc("/containerLogs/", k.containerLogs)
	mux.HandleFunc("/exec/", k.exec)
	mux.HandleFunc("/attach/", k.attach)
	mux.HandleFunc("/portForward/", k.portForward)
	mux.HandleFunc("/metrics", k.metrics)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 2)[0]
		proto := r.Header.Get("Sec-Websocket-Protocol")
		if vs := r.Header.Values("X-Stream-Protocol-Version"); len(vs) > 0 {
			proto = strings.Join(vs, ",")
		}
		st.record(Request{Server: "kubelet", Kind: kind, Path: r.URL.Path, Upgrade: r.Header.Get("Upgrade"), Protocol: proto, User: peerCN(r)})
		mux.ServeHTTP(w, r)
	})
}

type responder struct{}

func (responder) Error(w http.ResponseWriter, req *http.Request, err error) {
	log.Printf("kubelet: %s %s: %v", req.Method, req.URL.Path, err)
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

func (k *kubelet) containerLogs(w http.ResponseWriter, r *http.Request) {
	ns, pod, _, container, ok := parseKubeletPath(r.URL.Path, true)
	if !ok {
		http.Error(w, "bad path", http.StatusBadRequest)
		return
	}
	key := ns + "/" + pod + "/" + container
	follow := r.URL.Query().Get("follow") == "true"
	fl, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/plain")
	bw := bufio.NewWriter(w)
	// A followed log ends when the test says so, when the client goes, or
	// after ten minutes at most.
	limit := time.NewTimer(10 * time.Minute)
	defer limit.Stop()
	for next := 0; ; {
		lines, ended, changed := k.st.logSince(key, next)
		for _, l := range lines {
			bw.WriteString(l)
			bw.WriteByte('\n')
		}
		next += len(lines)
		if err := bw.Flush(); err != nil {
			return
		}
		if fl != nil {
			fl.Flush()
		}
		if !follow || ended {
			return
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		case <-limit.C:
			return
		}
	}
}

func containerID(ns, pod, container string) string { return ns + "/" + pod + "/" + container }

func (k *kubelet) exec(w http.ResponseWriter, r *http.Request) {
	ns, pod, _, container, ok := parseKubeletPath(r.URL.Path, true)
	if !ok {
		http.Error(w, "bad path", http.StatusBadRequest)
		return
	}
	opts, err := remotecommandserver.NewOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := k.cri.GetExec(&runtimeapi.ExecRequest{
		ContainerId: containerID(ns, pod, container),
		Cmd:         r.URL.Query()["command"],
		Tty:         opts.TTY, Stdin: opts.Stdin, Stdout: opts.Stdout, Stderr: opts.Stderr,
	})
	if err != nil {
		streaming.WriteError(err, w)
		return
	}
	k.proxyStream(w, r, resp.Url, opts)
}

func (k *kubelet) attach(w http.ResponseWriter, r *http.Request) {
	ns, pod, _, container, ok := parseKubeletPath(r.URL.Path, true)
	if !ok {
		http.Error(w, "bad path", http.StatusBadRequest)
		return
	}
	opts, err := remotecommandserver.NewOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := k.cri.GetAttach(&runtimeapi.AttachRequest{
		ContainerId: containerID(ns, pod, container),
		Tty:         opts.TTY, Stdin: opts.Stdin, Stdout: opts.Stdout, Stderr: opts.Stderr,
	})
	if err != nil {
		streaming.WriteError(err, w)
		return
	}
	k.proxyStream(w, r, resp.Url, opts)
}

// proxyStream is the kubelet's getExec/getAttach tail: proxy the upgrade to
// the runtime; a WebSocket request for v5.channel.k8s.io (which
// kube-apiserver forwards when the node declares ExtendWebSocketsToKubelet)
// is translated to SPDY here, as the kubelet does.
func (k *kubelet) proxyStream(w http.ResponseWriter, r *http.Request, rawURL string, opts *remotecommandserver.Options) {
	u, err := url.Parse(rawURL)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	var h http.Handler = proxy.NewUpgradeAwareHandler(u, nil, false, true, responder{})
	if wsstream.IsWebSocketRequestWithStreamCloseProtocol(r) {
		h = translator.NewStreamTranslatorHandler(u, nil, 0, translator.Options{
			Stdin: opts.Stdin, Stdout: opts.Stdout, Stderr: opts.Stderr, Tty: opts.TTY,
		})
	}
	h.ServeHTTP(w, r)
}

func (k *kubelet) portForward(w http.ResponseWriter, r *http.Request) {
	ns, pod, _, _, ok := parseKubeletPath(r.URL.Path, false)
	if !ok {
		http.Error(w, "bad path", http.StatusBadRequest)
		return
	}
	tunnel := wsstream.IsWebSocketRequestWithTunnelingProtocol(r)
	if !tunnel {
		if _, err := portforward.NewV4Options(r); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	resp, err := k.cri.GetPortForward(&runtimeapi.PortForwardRequest{PodSandboxId: ns + "/" + pod})
	if err != nil {
		streaming.WriteError(err, w)
		return
	}
	u, err := url.Parse(resp.Url)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	var h http.Handler = proxy.NewUpgradeAwareHandler(u, nil, false, true, responder{})
	if tunnel {
		h = translator.NewTunnelingHandler(h)
	}
	h.ServeHTTP(w, r)
}

func (k *kubelet) metrics(w http.ResponseWriter, _ *http.Request) {
	k.st.mu.Lock()
	counts := make(map[string]int, len(k.st.counts))
	for key, v := range k.st.counts {
		counts[key] = v
	}
	k.st.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	fmt.Fprintln(w, "# HELP konn_e2e_kubelet_up The fake kubelet of konn's Kubernetes end-to-end suite answers.")
	fmt.Fprintln(w, "# TYPE konn_e2e_kubelet_up gauge")
	fmt.Fprintln(w, "konn_e2e_kubelet_up 1")
	fmt.Fprintln(w, "# HELP konn_e2e_requests_total Requests the node network's servers received.")
	fmt.Fprintln(w, "# TYPE konn_e2e_requests_total counter")
	for key, v := range counts {
		server, kind, _ := strings.Cut(key, " ")
		fmt.Fprintf(w, "konn_e2e_requests_total{server=%q,kind=%q} %d\n", server, kind, v)
	}
}
