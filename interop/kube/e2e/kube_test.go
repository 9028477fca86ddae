package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"konn.local/interop/kube/internal/cluster"
)

// runCtx is one run: one transport, one implementation, its tunnel and
// its kube-apiserver.
type runCtx struct {
	s    *suite
	api  *cluster.APIServer
	tun  *cluster.Tunnel
	tr   cluster.Transport
	impl string
}

type caseFn func(t *testing.T, r *runCtx) (note string, err error)

type kcase struct {
	name string
	doc  string
	fn   caseFn
}

// Sizes; KONN_KUBE_QUICK=1 divides them by 16 (for working on the suite).
var (
	execBytes  = scaled(16 << 20)
	smallBytes = scaled(4 << 20)
	pfBytes    = scaled(64 << 20)
	pfParallel = 20
	pfEach     = scaled(1 << 20)
)

func scaled(n int) int {
	if os.Getenv("KONN_KUBE_QUICK") == "1" {
		return n / 16
	}
	return n
}

func mib(n int) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

var cases = []kcase{
	{"logs -f", "`kubectl logs -f`: a line written before, then 5 lines appended one at a time by the kubelet; each must reach kubectl's stdout before the next is written, and the stream ends when the log does",
		logsFollow},
	{"exec -i", fmt.Sprintf("`kubectl exec -i -- cat` with %s on stdin, SHA-256 of stdout compared; kubectl speaks WebSocket v5.channel.k8s.io, kube-apiserver translates to SPDY towards the kubelet (checked on the kubelet)", mib(execBytes)),
		execCase(cluster.PodName, nil, execBytes, "SPDY/3.1")},
	{"exec -i (SPDY)", fmt.Sprintf("as `exec -i` with `KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false`: SPDY from kubectl to the kubelet, %s", mib(smallBytes)),
		execCase(cluster.PodName, []string{"KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false"}, smallBytes, "SPDY/3.1")},
	{"exec -i (WebSocket to kubelet)", fmt.Sprintf("as `exec -i` on a pod whose Node declares `ExtendWebSocketsToKubelet`: the WebSocket v5.channel.k8s.io upgrade itself crosses the tunnel to the kubelet, %s", mib(smallBytes)),
		execCase(cluster.PodNameWS, nil, smallBytes, "websocket")},
	{"exec exit status", "`kubectl exec -- exit 3` exits with status 3 (the status travels back through the tunnel)",
		execExit},
	{"attach -i", fmt.Sprintf("`kubectl attach -i` to a container echoing its stdin, %s, SHA-256 compared (SPDY towards the kubelet)", mib(smallBytes)),
		attach(cluster.PodName, "SPDY/3.1")},
	{"attach -i (WebSocket to kubelet)", fmt.Sprintf("as `attach -i` on the pod of the `ExtendWebSocketsToKubelet` Node: the WebSocket v5.channel.k8s.io upgrade crosses the tunnel, %s", mib(smallBytes)),
		attach(cluster.PodNameWS, "websocket")},
	{"port-forward", fmt.Sprintf("`kubectl port-forward` to the pod's echo port: one connection with %s each way at once, then %d parallel connections with %s each way; SHA-256 of what came back compared (kubectl tunnels over WebSocket, kube-apiserver speaks SPDY to the kubelet)", mib(pfBytes), pfParallel, mib(pfEach)),
		portForward(cluster.PodName, nil, pfBytes, pfParallel, pfEach, "SPDY/3.1")},
	{"port-forward (SPDY)", fmt.Sprintf("as `port-forward` with `KUBECTL_PORT_FORWARD_WEBSOCKETS=false` (SPDY end to end): %s on one connection, 4 parallel with %s", mib(smallBytes), mib(pfEach)),
		portForward(cluster.PodName, []string{"KUBECTL_PORT_FORWARD_WEBSOCKETS=false"}, smallBytes, 4, pfEach, "SPDY/3.1")},
	{"port-forward (WebSocket to kubelet)", fmt.Sprintf("as `port-forward` to the pod on the `ExtendWebSocketsToKubelet` Node: the WebSocket tunnel crosses to the kubelet; %s on one connection, 4 parallel with %s", mib(smallBytes), mib(pfEach)),
		portForward(cluster.PodNameWS, nil, smallBytes, 4, pfEach, "websocket")},
	{"node proxy", "`kubectl get --raw /api/v1/nodes/konn-node/proxy/metrics` and `.../proxy/healthz`: the kubelet's answers, and the kubelet saw kube-apiserver's client certificate",
		nodeProxy},
	{"service proxy", "`kubectl get --raw /api/v1/namespaces/konn-e2e/services/http:web:80/proxy/hello`, and a 4 MiB body through `.../proxy/bytes/4194304` compared byte for byte",
		serviceProxy},
	{"admission webhook", "a ConfigMap labelled `konn.test/webhook=allow` is created; one labelled `deny` is refused with the webhook's own message",
		admissionWebhook},
	{"aggregated API", "`kubectl get widgets.konn.test -o json` and `kubectl get widget tunnelled`: served by the aggregated API server (APIService `v1alpha1.konn.test`) in the node network",
		aggregatedAPI},
}

// Rows of the report besides the cases.
const (
	rowSetup  = "setup"
	rowLeaks  = "no leaks"
	rowEgress = "kube-apiserver egress metrics"
)

var ranKube bool

func TestKube(t *testing.T) {
	ranKube = true
	impls := []string{cluster.Upstream, cluster.Konn}
	if v := os.Getenv("KONN_KUBE_IMPLS"); v != "" {
		impls = strings.Split(v, ",")
	}
	for _, tr := range cluster.Transports {
		for _, impl := range impls {
			t.Run(tr.Name+"/"+impl, func(t *testing.T) { runOne(t, tr, impl) })
		}
	}
}

func column(tr cluster.Transport, impl string) string { return tr.Label + " · " + impl }

func runOne(t *testing.T, tr cluster.Transport, impl string) {
	s := theSuite
	col := column(tr, impl)
	recordColumn(col)
	dir := filepath.Join(s.env.Work, tr.Name+"-"+impl)
	fail := func(row string, err error) {
		record(col, row, 0, "", err)
		t.Fatal(err)
	}
	t0 := time.Now()
	tun, err := cluster.StartTunnel(t, s.env, dir, impl, tr)
	if err != nil {
		fail(rowSetup, err)
	}
	defer tun.Stop()
	base, err := tun.Snapshot()
	if err != nil {
		fail(rowSetup, err)
	}
	egress, err := tun.EgressConfig()
	if err != nil {
		fail(rowSetup, err)
	}
	api, err := cluster.StartAPIServer(t, s.env, dir, s.etcd, cluster.APIServerOptions{
		EtcdPrefix: "/registry-" + tr.Name + "-" + impl, EgressConfig: egress})
	if err != nil {
		fail(rowSetup, err)
	}
	defer api.Stop()
	if err := cluster.Setup(api, s.env, s.node); err != nil {
		fail(rowSetup, fmt.Errorf("%v\n%s", err, api.Proc.Tail(20)))
	}
	record(col, rowSetup, time.Since(t0), fmt.Sprintf("proxy-server, proxy-agent and kube-apiserver started, objects created, APIService Available through the tunnel; baseline: server %d fds, agent %d fds", base.ServerFDs, base.AgentFDs), nil)

	r := &runCtx{s: s, api: api, tun: tun, tr: tr, impl: impl}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			before, err := tun.Snapshot()
			if err != nil {
				record(col, c.name, 0, "", err)
				t.Fatal(err)
			}
			start := time.Now()
			note, err := c.fn(t, r)
			d := time.Since(start)
			after, serr := tun.Snapshot()
			if err == nil && serr != nil {
				err = serr
			}
			delta := after.Sub(before)
			if err == nil && delta.AgentDials < 1 {
				err = errors.New("the proxy-agent made no dial: the traffic did not cross the tunnel")
			}
			tunnelNote := fmt.Sprintf("tunnel: %v agent dials, %v DATA packets server→agent, %v agent→server", delta.AgentDials, delta.DataToAgent, delta.DataFromAgent)
			if note != "" {
				note += "; " + tunnelNote
			} else {
				note = tunnelNote
			}
			record(col, c.name, d, note, err)
			t.Logf("%s (%.1f s): %s", c.name, d.Seconds(), note)
			if err != nil {
				t.Errorf("%v\n%s\n%s\n%s", err, tun.Server.Tail(10), tun.Agent.Tail(10), api.Proc.Tail(10))
			}
		})
	}

	// kube-apiserver's own account: every dial went out through this
	// transport, and none failed.
	egressLabels := map[string][2]string{"grpc-uds": {"grpc", "uds"}, "connect-uds": {"http_connect", "uds"}, "connect-tcp": {"http_connect", "tcp"}}[tr.Name]
	ed, err := api.Egress(egressLabels[0], egressLabels[1])
	if err == nil {
		switch {
		case ed.Started < 1 || ed.Succeeded < 1:
			err = fmt.Errorf("kube-apiserver counted no %s/%s egress dial (started %v, succeeded %v)", egressLabels[0], egressLabels[1], ed.Started, ed.Succeeded)
		case ed.Failed != 0:
			err = fmt.Errorf("kube-apiserver counted %v failed %s/%s egress dials", ed.Failed, egressLabels[0], egressLabels[1])
		case ed.Elsewhere != 0:
			err = fmt.Errorf("kube-apiserver started %v egress dials with another protocol or transport", ed.Elsewhere)
		}
	}
	egressNote := fmt.Sprintf("apiserver_egress_dialer: %v dials started, %v succeeded, %v failed with protocol=%q transport=%q; none with any other",
		ed.Started, ed.Succeeded, ed.Failed, egressLabels[0], egressLabels[1])
	record(col, rowEgress, 0, egressNote, err)
	t.Logf("%s: %s", rowEgress, egressNote)
	if err != nil {
		t.Error(err)
	}

	// Nothing may stay behind in the proxies: stop what makes
	// kube-apiserver dial by itself, then every connection must close and
	// both processes must be back to their file descriptor baseline.
	start := time.Now()
	if err := cluster.Teardown(api); err != nil {
		t.Error(err)
	}
	final, err := tun.WaitIdle(base, 60*time.Second)
	note := fmt.Sprintf("established %v, pending %v, agent open %v; fds server %d (baseline %d), agent %d (baseline %d)",
		final.Established, final.Pending, final.AgentOpen, final.ServerFDs, base.ServerFDs, final.AgentFDs, base.AgentFDs)
	record(col, rowLeaks, time.Since(start), note, err)
	t.Logf("%s: %s", rowLeaks, note)
	if err != nil {
		t.Error(err)
	}
	if err := api.Stop(); err != nil {
		t.Log(err)
	}
	tun.Stop()
}

// --- helpers ---

// newRequests returns what the node network's server received since
// `before` requests, filtered by server and kind.
func newRequests(r *runCtx, before int, server, kind string) ([]cluster.NodeRequest, error) {
	all, err := r.s.node.Requests()
	if err != nil {
		return nil, err
	}
	var out []cluster.NodeRequest
	for _, q := range all[min(before, len(all)):] {
		if q.Server == server && (kind == "" || q.Kind == kind) {
			out = append(out, q)
		}
	}
	return out, nil
}

func requestCount(r *runCtx) int {
	all, err := r.s.node.Requests()
	if err != nil {
		return 0
	}
	return len(all)
}

// checkUpgrade finds the kubelet's request of kind and checks its Upgrade
// header; it returns a note naming what the kubelet saw.
func checkUpgrade(r *runCtx, before int, kind, want string) (string, error) {
	reqs, err := newRequests(r, before, "kubelet", kind)
	if err != nil {
		return "", err
	}
	if len(reqs) == 0 {
		return "", fmt.Errorf("the kubelet received no %s request", kind)
	}
	q := reqs[len(reqs)-1]
	if !strings.EqualFold(q.Upgrade, want) {
		return "", fmt.Errorf("the kubelet's %s request upgraded to %q, want %q (protocols %q)", kind, q.Upgrade, want, q.Protocol)
	}
	proto := q.Protocol
	if len(proto) > 60 {
		proto = proto[:60] + "…"
	}
	return fmt.Sprintf("kubelet saw Upgrade: %s (%s)", q.Upgrade, proto), nil
}

// --- cases ---

func logsFollow(t *testing.T, r *runCtx) (string, error) {
	key := cluster.LogKey(cluster.PodName)
	if err := r.s.node.LogReset(key); err != nil {
		return "", err
	}
	ls, err := r.api.FollowLogs(2*time.Minute, cluster.PodName)
	if err != nil {
		return "", err
	}
	fail := func(err error) (string, error) {
		ls.Kill()
		return "", err
	}
	if err := ls.Next("log line 0: written before anyone followed", 30*time.Second); err != nil {
		return fail(err)
	}
	var slowest time.Duration
	for i := 1; i <= 5; i++ {
		line := fmt.Sprintf("log line %d: appended while kubectl follows", i)
		t0 := time.Now()
		if err := r.s.node.LogLine(key, line); err != nil {
			return fail(err)
		}
		// Line i must arrive before line i+1 is even written.
		if err := ls.Next(line, 10*time.Second); err != nil {
			return fail(err)
		}
		slowest = max(slowest, time.Since(t0))
	}
	if err := r.s.node.LogEnd(key); err != nil {
		return fail(err)
	}
	if err := ls.Wait(20 * time.Second); err != nil {
		return "", err
	}
	return fmt.Sprintf("each appended line reached kubectl within %.1f ms; kubectl exited when the log ended", float64(slowest.Microseconds())/1000), nil
}

func execCase(pod string, env []string, size int, upgrade string) caseFn {
	return func(t *testing.T, r *runCtx) (string, error) {
		in := cluster.Payload(size, uint64(size))
		before := requestCount(r)
		t0 := time.Now()
		got, n, err := r.api.KubectlStdin(3*time.Minute, env, in, "exec", "-i", "-n", cluster.Namespace, pod, "-c", cluster.Container, "--", "cat")
		if err != nil {
			return "", err
		}
		d := time.Since(t0)
		if n != size || got != cluster.Sum(in) {
			return "", fmt.Errorf("stdout: %d bytes, SHA-256 %s…; sent %d bytes, SHA-256 %s…", n, got, size, cluster.Sum(in))
		}
		note, err := checkUpgrade(r, before, "exec", upgrade)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s round trip in %.1f s, SHA-256 equal; %s", mib(size), d.Seconds(), note), nil
	}
}

func execExit(t *testing.T, r *runCtx) (string, error) {
	_, err := r.api.Kubectl(time.Minute, nil, "exec", "-n", cluster.Namespace, cluster.PodName, "-c", cluster.Container, "--", "exit", "3")
	var ke *cluster.KubectlError
	if !errors.As(err, &ke) {
		return "", fmt.Errorf("kubectl exec -- exit 3 succeeded; want exit status 3")
	}
	var ee *exec.ExitError
	if !errors.As(ke.Err, &ee) || ee.ExitCode() != 3 {
		return "", fmt.Errorf("kubectl exec -- exit 3: %v, want exit status 3", err)
	}
	out, err := r.api.Kubectl(time.Minute, nil, "exec", "-n", cluster.Namespace, cluster.PodName, "-c", cluster.Container, "--", "echo", "through", "the", "tunnel")
	if err != nil {
		return "", err
	}
	if out != "through the tunnel\n" {
		return "", fmt.Errorf("kubectl exec -- echo: %q", out)
	}
	return "exit status 3, then `echo` output intact", nil
}

func attach(pod, upgrade string) caseFn {
	return func(t *testing.T, r *runCtx) (string, error) {
		in := cluster.Payload(smallBytes, 7)
		before := requestCount(r)
		got, n, err := r.api.KubectlStdin(2*time.Minute, nil, in, "attach", "-i", "-q", "-n", cluster.Namespace, pod, "-c", cluster.Container)
		if err != nil {
			return "", err
		}
		if n != len(in) || got != cluster.Sum(in) {
			return "", fmt.Errorf("stdout: %d bytes, SHA-256 %s…; sent %d bytes, SHA-256 %s…", n, got, len(in), cluster.Sum(in))
		}
		note, err := checkUpgrade(r, before, "attach", upgrade)
		if err != nil {
			return "", err
		}
		return "SHA-256 equal; " + note, nil
	}
}

func portForward(pod string, env []string, bulk, parallel, each int, upgrade string) caseFn {
	return func(t *testing.T, r *runCtx) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		before := requestCount(r)
		port, stop, err := r.api.PortForward(ctx, pod, r.s.node.Ports.Echo, env)
		if err != nil {
			return "", err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		cp := r.s.env.Topo.CP
		t0 := time.Now()
		if err := cluster.EchoRoundTrip(cp, addr, bulk, 1, 3*time.Minute); err != nil {
			stop()
			return "", fmt.Errorf("%s each way: %v", mib(bulk), err)
		}
		dBulk := time.Since(t0)
		t1 := time.Now()
		var wg sync.WaitGroup
		errs := make([]error, parallel)
		for i := range parallel {
			wg.Go(func() { errs[i] = cluster.EchoRoundTrip(cp, addr, each, uint64(100+i), 2*time.Minute) })
		}
		wg.Wait()
		dPar := time.Since(t1)
		if err := errors.Join(errs...); err != nil {
			stop()
			return "", fmt.Errorf("%d parallel connections: %v", parallel, err)
		}
		if err := stop(); err != nil {
			return "", err
		}
		note, err := checkUpgrade(r, before, "portForward", upgrade)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s each way in %.1f s (%.0f MiB/s each way); %d × %s each way in %.1f s; %s",
			mib(bulk), dBulk.Seconds(), float64(bulk)/(1<<20)/dBulk.Seconds(), parallel, mib(each), dPar.Seconds(), note), nil
	}
}

func nodeProxy(t *testing.T, r *runCtx) (string, error) {
	before := requestCount(r)
	out, err := r.api.Kubectl(time.Minute, nil, "get", "--raw", "/api/v1/nodes/"+cluster.NodeName+"/proxy/metrics")
	if err != nil {
		return "", err
	}
	if !strings.Contains(out, "konn_e2e_kubelet_up 1") {
		return "", fmt.Errorf("node proxy /metrics: no konn_e2e_kubelet_up in %q", firstLine(out))
	}
	out, err = r.api.Kubectl(time.Minute, nil, "get", "--raw", "/api/v1/nodes/"+cluster.NodeName+"/proxy/healthz")
	if err != nil {
		return "", err
	}
	if out != "ok" {
		return "", fmt.Errorf("node proxy /healthz: %q", out)
	}
	reqs, err := newRequests(r, before, "kubelet", "metrics")
	if err != nil {
		return "", err
	}
	if len(reqs) != 1 || reqs[0].User != "kube-apiserver-kubelet-client" {
		return "", fmt.Errorf("the kubelet's /metrics requests: %+v", reqs)
	}
	return "kubelet authenticated kube-apiserver as " + reqs[0].User, nil
}

func serviceProxy(t *testing.T, r *runCtx) (string, error) {
	base := "/api/v1/namespaces/" + cluster.Namespace + "/services/http:web:80/proxy"
	out, err := r.api.Kubectl(time.Minute, nil, "get", "--raw", base+"/hello")
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(out, "hello from the node network: pod "+r.s.env.Topo.PodIP) {
		return "", fmt.Errorf("service proxy /hello: %q", out)
	}
	const n = 4 << 20
	out, err = r.api.Kubectl(time.Minute, nil, "get", "--raw", fmt.Sprintf("%s/bytes/%d", base, n))
	if err != nil {
		return "", err
	}
	want := make([]byte, n)
	for i := range want {
		want[i] = byte((i * 7) % 251)
	}
	if out != string(want) {
		return "", fmt.Errorf("service proxy /bytes: %d bytes, not the %d expected", len(out), n)
	}
	return "/hello answered by the pod; 4 MiB body intact", nil
}

func admissionWebhook(t *testing.T, r *runCtx) (string, error) {
	before := requestCount(r)
	cm := func(name, verdict string) string {
		return fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s\n  namespace: %s\n  labels: {%s: %s}\ndata: {k: v}\n",
			name, cluster.Namespace, cluster.WebhookLabel, verdict)
	}
	if _, err := r.api.Kubectl(time.Minute, []byte(cm("admitted", "allow")), "create", "-f", "-"); err != nil {
		return "", err
	}
	_, err := r.api.Kubectl(time.Minute, []byte(cm("refused", "deny")), "create", "-f", "-")
	var ke *cluster.KubectlError
	if !errors.As(err, &ke) {
		return "", fmt.Errorf("a ConfigMap labelled deny was created: %v", err)
	}
	if !strings.Contains(ke.Stderr, cluster.WebhookDenial) {
		return "", fmt.Errorf("refusal without the webhook's message: %s", strings.TrimSpace(ke.Stderr))
	}
	if _, err := r.api.Kubectl(time.Minute, nil, "get", "configmap", "admitted", "-n", cluster.Namespace); err != nil {
		return "", err
	}
	reqs, err := newRequests(r, before, "webhook", "validate")
	if err != nil {
		return "", err
	}
	if len(reqs) != 2 {
		return "", fmt.Errorf("the webhook received %d requests, want 2", len(reqs))
	}
	return "allowed one, refused one (\"" + cluster.WebhookDenial + "\")", nil
}

func aggregatedAPI(t *testing.T, r *runCtx) (string, error) {
	out, err := r.api.Kubectl(time.Minute, nil, "get", "widgets.konn.test", "-o", "json")
	if err != nil {
		return "", err
	}
	var list struct {
		Kind  string `json:"kind"`
		Items []struct {
			Metadata struct{ Name string } `json:"metadata"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return "", fmt.Errorf("kubectl get widgets -o json: %v: %q", err, firstLine(out))
	}
	if len(list.Items) != 1 || list.Items[0].Metadata.Name != "tunnelled" {
		return "", fmt.Errorf("kubectl get widgets: %s", firstLine(out))
	}
	out, err = r.api.Kubectl(time.Minute, nil, "get", "widget", "tunnelled", "-o", "jsonpath={.spec.servedBy}")
	if err != nil {
		return "", err
	}
	if !strings.Contains(out, r.s.env.Topo.PodIP) {
		return "", fmt.Errorf("widget tunnelled: servedBy %q", out)
	}
	return "served by " + out, nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
