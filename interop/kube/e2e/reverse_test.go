package e2e

import (
	"context"
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

// reverseLines are TestNodeToControlPlane's results, for the report.
var reverseLines []string

const (
	// reverseBind is the agent's --bind-address: in the CGNAT range, as
	// KEP-2025 suggests, so it collides with no node or pod network.
	reverseBind = "100.64.0.1"
	// reversePort is where kubelets would look for kube-apiserver.
	reversePort = 6443
	// reverseEtcdPort is a second --target towards a destination the
	// server does not allow (etcd).
	reverseEtcdPort = 2379
	// reverseGets is how many `kubectl get namespaces` run from the node.
	reverseGets = 8
)

// TestNodeToControlPlane is KEP-2025 with a real kube-apiserver (konn
// only: upstream has no reverse direction). The konn proxy-agent in the
// node namespace listens on 100.64.0.1:6443 (adding the address to the
// namespace's loopback itself) and forwards to kube-apiserver through its
// tunnel; the konn proxy-server allows exactly kube-apiserver's address.
// kubectl in the node namespace lists namespaces through it while
// `kubectl exec` and `kubectl logs` cross the same tunnel the other way;
// no direct route from the node namespace to kube-apiserver exists, and
// a second listener towards etcd (not allowed) gets nothing.
func TestNodeToControlPlane(t *testing.T) {
	s := theSuite
	topo := s.env.Topo
	note := func(format string, a ...any) {
		line := fmt.Sprintf(format, a...)
		reverseLines = append(reverseLines, line)
		t.Log(line)
	}
	if !topo.Isolated {
		note("not run: no network namespaces (%s); the agent would add %s to this host's loopback", topo.Reason, reverseBind)
		t.Skip("needs network namespaces")
	}
	if v := os.Getenv("KONN_KUBE_IMPLS"); v != "" && !strings.Contains(v, cluster.Konn) {
		t.Skip("konn not selected (KONN_KUBE_IMPLS)")
	}
	apiPort, err := topo.CP.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	api := "127.0.0.1:" + strconv.Itoa(apiPort)
	etcd := "127.0.0.1:" + strconv.Itoa(s.etcd.Port)
	dir := filepath.Join(s.env.Work, "reverse-konn")
	tr := cluster.Transports[0]
	tun, err := cluster.StartTunnel(t, s.env, dir, cluster.Konn, tr, cluster.TunnelExtra{
		ServerArgs: []string{"--allowed-destination=" + api},
		AgentArgs: []string{
			fmt.Sprintf("--target=%d:%s", reversePort, api),
			fmt.Sprintf("--target=%d:%s", reverseEtcdPort, etcd),
			"--bind-address=" + reverseBind,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Stop()
	base, err := tun.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	egress, err := tun.EgressConfig()
	if err != nil {
		t.Fatal(err)
	}
	apiserver, err := cluster.StartAPIServer(t, s.env, dir, s.etcd, cluster.APIServerOptions{
		EtcdPrefix: "/registry-reverse", EgressConfig: egress, Port: apiPort})
	if err != nil {
		t.Fatal(err)
	}
	defer apiserver.Stop()
	if err := cluster.Setup(apiserver, s.env, s.node); err != nil {
		t.Fatalf("%v\n%s", err, apiserver.Proc.Tail(20))
	}
	r := &runCtx{s: s, api: apiserver, tun: tun, tr: tr, impl: cluster.Konn}

	// No way around the tunnel: from the node namespace kube-apiserver is
	// not reachable at the control plane's address, nor on the node's own
	// loopback; only the agent's listener answers.
	dial := func(addr string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		c, err := topo.Node.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
		}
		return err
	}
	for _, addr := range []string{net.JoinHostPort(topo.ServerAddr, strconv.Itoa(apiPort)), api} {
		if err := dial(addr); err == nil {
			t.Fatalf("kube-apiserver's port is reachable from the node namespace at %s: the test proves nothing", addr)
		} else {
			note("direct route from the node namespace to kube-apiserver at `%s`: `%v` (none, as required)", addr, errText(err))
		}
	}

	kubeconfig, err := apiserver.NodeKubeconfig(fmt.Sprintf("https://%s:%d", reverseBind, reversePort), "kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	// Both directions at once: the node lists namespaces while kubectl
	// exec and logs cross the tunnel towards the node.
	var wg sync.WaitGroup
	var execNote, logsNote string
	var execErr, logsErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		execNote, execErr = execCase(cluster.PodName, nil, smallBytes, "SPDY/3.1")(t, r)
	}()
	go func() {
		defer wg.Done()
		logsNote, logsErr = logsFollow(t, r)
	}()
	t0 := time.Now()
	var getErr error
	for i := 0; i < reverseGets && getErr == nil; i++ {
		var out string
		out, getErr = apiserver.KubectlIn(topo.Node, kubeconfig, time.Minute, "get", "namespaces", "-o", "name")
		if getErr == nil && !strings.Contains(out, "namespace/kube-system") {
			getErr = fmt.Errorf("kubectl get namespaces from the node: %q lacks namespace/kube-system", out)
		}
	}
	getDur := time.Since(t0)
	wg.Wait()
	if getErr != nil {
		t.Fatalf("from the node namespace through %s:%d: %v\n%s\n%s", reverseBind, reversePort, getErr, tun.Agent.Tail(10), tun.Server.Tail(10))
	}
	note("node namespace → `https://%s:%d` (kubectl, tls-server-name `kubernetes`): %d × `kubectl get namespaces` listed kube-system in %.1f s", reverseBind, reversePort, reverseGets, getDur.Seconds())
	if execErr != nil {
		t.Fatalf("kubectl exec at the same time: %v", execErr)
	}
	note("at the same time, control plane → node: `kubectl exec -i` %s", execNote)
	if logsErr != nil {
		t.Fatalf("kubectl logs -f at the same time: %v", logsErr)
	}
	note("at the same time, control plane → node: `kubectl logs -f`: %s", logsNote)

	// The metrics of both sides saw the reverse connections.
	agentOK, err := tun.Metric(false, "konn_reverse_dials_total", `result="ok"`)
	if err != nil {
		t.Fatal(err)
	}
	serverOK, err := tun.Metric(true, "konn_reverse_dials_total", `result="ok"`)
	if err != nil {
		t.Fatal(err)
	}
	up, err := tun.Metric(true, "konn_reverse_bytes_total", `direction="to_control_plane"`)
	if err != nil {
		t.Fatal(err)
	}
	down, err := tun.Metric(true, "konn_reverse_bytes_total", `direction="to_node"`)
	if err != nil {
		t.Fatal(err)
	}
	if agentOK < reverseGets || serverOK < reverseGets || up == 0 || down == 0 {
		t.Fatalf("reverse metrics: agent dials ok %v, server dials ok %v, bytes to control plane %v, to node %v; want ≥ %d dials and bytes both ways",
			agentOK, serverOK, up, down, reverseGets)
	}
	note("metrics: `konn_reverse_dials_total{result=\"ok\"}` agent %v, server %v; server `konn_reverse_bytes_total` %v to the control plane, %v to the node", agentOK, serverOK, up, down)

	// Default deny: the agent listens for etcd too, but the server does not
	// allow it; the connection ends without a byte of etcd's.
	if err := deniedTarget(topo.Node, net.JoinHostPort(reverseBind, strconv.Itoa(reverseEtcdPort))); err != nil {
		t.Fatal(err)
	}
	notAllowed, err := tun.Metric(true, "konn_reverse_refusals_total", `reason="not_allowed"`)
	if err != nil {
		t.Fatal(err)
	}
	if notAllowed < 1 {
		t.Fatalf("konn_reverse_refusals_total{reason=\"not_allowed\"} = %v after a dial towards etcd", notAllowed)
	}
	note("a second `--target` towards etcd (`%s`, not in `--allowed-destination`): the connection closed with no byte; server `konn_reverse_refusals_total{reason=\"not_allowed\"}` = %v", etcd, notAllowed)

	if err := cluster.Teardown(apiserver); err != nil {
		t.Error(err)
	}
	if err := apiserver.Stop(); err != nil {
		t.Log(err)
	}
	final, err := tun.WaitIdle(base, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	open, err := tun.Metric(true, "konn_reverse_connections")
	if err != nil {
		t.Fatal(err)
	}
	if open != 0 {
		t.Fatalf("konn_reverse_connections = %v on the server after kube-apiserver stopped", open)
	}
	note("after kube-apiserver stopped: no connection left (reverse connections 0), fds server %d (baseline %d), agent %d (baseline %d)",
		final.ServerFDs, base.ServerFDs, final.AgentFDs, base.AgentFDs)

	// The agent added --bind-address to the node's loopback; it removes it
	// when it exits.
	before, err := loAddrs(topo.Node)
	if err != nil {
		t.Fatal(err)
	}
	tun.Stop()
	after, err := loAddrs(topo.Node)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(before, reverseBind+"/32 scope host") || strings.Contains(after, reverseBind+"/") {
		t.Fatalf("%s on the node's lo: while the agent ran %q, after it exited %q", reverseBind, before, after)
	}
	note("`%s/32` was on the node namespace's `lo` (scope host) while the agent ran and is gone after it exited", reverseBind)
}

// loAddrs lists the addresses of ns's loopback device (`ip -o addr`).
func loAddrs(ns *cluster.NS) (string, error) {
	out, err := exec.Command("ip", "-n", ns.Name, "-o", "addr", "show", "dev", "lo").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("ip -n %s addr show dev lo: %v: %s", ns.Name, err, out)
	}
	return string(out), nil
}

// deniedTarget connects to a listener whose destination is not allowed:
// it must accept, then close without sending anything.
func deniedTarget(ns *cluster.NS, addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ns.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("the agent's listener %s: %v", addr, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	var b [1]byte
	n, err := c.Read(b[:])
	if n != 0 || err == nil {
		return fmt.Errorf("a connection towards a destination the server does not allow got %d bytes", n)
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return fmt.Errorf("a connection towards a destination the server does not allow stayed open")
	}
	return nil
}
