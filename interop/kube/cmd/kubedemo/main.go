// Command kubedemo is `scripts/demo --kube`: the demo story driven by the
// real kubectl through a real kube-apiserver whose cluster traffic goes
// through konn's proxy-server and proxy-agent.
//
//  1. two network namespaces: the control plane (etcd, kube-apiserver,
//     proxy-server) and the node network (proxy-agent, a kubelet and a
//     pod's servers); a direct dial from the control plane fails;
//  2. konn's proxy-server (--mode=grpc on a Unix socket) and proxy-agent;
//  3. kube-apiserver with an EgressSelectorConfiguration pointing at the
//     socket, a Node, a Pod, a Service, a webhook and an APIService;
//  4. kubectl: logs -f, exec, port-forward, node and service proxy, the
//     webhook, the aggregated API — each line says what kubectl did and
//     what crossed the tunnel (konn's metrics before and after);
//  5. konn's metrics, and shutdown.
//
// It prints, for every kubectl command, the command, its outcome and the
// change in konn's metrics; never the payloads. Exit status 0 only if
// every step worked.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"konn.local/interop/kube/internal/cluster"
)

const steps = 5

func step(n int, text string) { fmt.Printf("\n[%d/%d] %s\n", n, steps, text) }

func say(format string, a ...any) { fmt.Printf("      "+format+"\n", a...) }

func main() {
	konnBin := flag.String("konn-bin", "", "directory with konn's proxy-server and proxy-agent (default: $KONN_BIN_DIR or <target>/release)")
	kubeBin := flag.String("kube-bin", "", "directory with kube-apiserver, kubectl, etcd (default: $KUBE_BIN_DIR or <target>/kube)")
	keep := flag.Bool("keep", false, "keep the work directory (certificates, logs)")
	transport := flag.String("transport", "grpc-uds", "egress transport: grpc-uds, connect-uds or connect-tcp")
	flag.Parse()

	work, err := os.MkdirTemp("", "konn-kubedemo-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("konn demo --kube: kubectl → kube-apiserver → konn proxy-server → proxy-agent → kubelet and pods")
	fmt.Println("  work dir (certificates, sockets, logs):", work)
	var stack cluster.Stack
	err = run(&stack, work, *konnBin, *kubeBin, *transport)
	stack.Run()
	if err != nil {
		fmt.Printf("\ndemo FAILED: %v\n  logs are in %s\n", err, work)
		os.Exit(1)
	}
	fmt.Println("\ndemo finished: every step worked")
	if *keep {
		fmt.Println("  kept:", work)
	} else {
		os.RemoveAll(work)
	}
}

func run(stack *cluster.Stack, work, konnBin, kubeBin, transport string) error {
	repo, err := cluster.RepoRoot()
	if err != nil {
		return err
	}
	e := &cluster.Env{Work: work}
	var up string
	e.KubeBin, _, up = cluster.Dirs(repo)
	e.UpstreamBin = up
	if kubeBin != "" {
		e.KubeBin = kubeBin
	}
	e.KonnBin = konnBin
	if e.KonnBin == "" {
		if e.KonnBin = os.Getenv("KONN_BIN_DIR"); e.KonnBin == "" {
			target := os.Getenv("CARGO_TARGET_DIR")
			if target == "" {
				target = filepath.Join(repo, "target")
			}
			e.KonnBin = filepath.Join(target, "release")
		}
	}
	var tr cluster.Transport
	for _, t := range cluster.Transports {
		if t.Name == transport {
			tr = t
		}
	}
	if tr.Name == "" {
		return fmt.Errorf("unknown --transport %q", transport)
	}
	if e.NodesimBin, err = cluster.BuildNodesim(repo, work); err != nil {
		return err
	}

	step(1, "two networks: the control plane, and the node network behind the tunnel")
	if e.Topo, err = cluster.NewTopology(); err != nil {
		return err
	}
	stack.Cleanup(e.Topo.Close)
	say("%s", e.Topo.Describe())
	if e.PKI, err = cluster.NewPKI(filepath.Join(work, "pki"), e.Topo); err != nil {
		return err
	}
	etcd, err := cluster.StartEtcd(stack, e, work)
	if err != nil {
		return err
	}
	say("etcd on 127.0.0.1:%d of the control plane", etcd.Port)
	node, err := cluster.StartNode(stack, e, filepath.Join(work, "node"))
	if err != nil {
		return err
	}
	say("node network: kubelet on %s:%d, pod %s (HTTP %d, webhook %d, aggregated API %d, echo %d)",
		e.Topo.NodeIP, node.Ports.Kubelet, e.Topo.PodIP, node.Ports.HTTP, node.Ports.Webhook, node.Ports.APIExt, node.Ports.Echo)
	kubelet := node.Destinations()["kubelet"]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	c, derr := e.Topo.CP.DialContext(ctx, "tcp", kubelet)
	cancel()
	switch {
	case derr != nil:
		say("direct dial from the control plane to the kubelet %s: %v (only the tunnel gets there)", kubelet, derr)
	case e.Topo.Isolated:
		c.Close()
		return fmt.Errorf("the control plane reaches the kubelet %s directly", kubelet)
	default:
		c.Close()
		say("fallback topology: the kubelet is reachable directly; the metrics below show the traffic used the tunnel")
	}

	step(2, fmt.Sprintf("konn's proxy-server (%s) and proxy-agent", tr.Label))
	tun, err := cluster.StartTunnel(stack, e, filepath.Join(work, "tunnel"), cluster.Konn, tr)
	if err != nil {
		return err
	}
	defer tun.Stop()
	if tun.UDS != "" {
		say("proxy-server: --mode=%s --uds-name=%s, agent port %s:%d (mTLS)", tr.Mode, tun.UDS, e.Topo.ServerAddr, tun.AgentPort)
	} else {
		say("proxy-server: --mode=%s on 127.0.0.1:%d (mTLS), agent port %s:%d (mTLS)", tr.Mode, tun.FrontPort, e.Topo.ServerAddr, tun.AgentPort)
	}
	say("proxy-agent in the node network: connected (both /readyz ok)")
	base, err := tun.Snapshot()
	if err != nil {
		return err
	}

	step(3, "kube-apiserver with an EgressSelectorConfiguration, and the cluster's objects")
	egress, err := tun.EgressConfig()
	if err != nil {
		return err
	}
	b, _ := os.ReadFile(egress)
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.HasPrefix(l, "- name: controlplane") {
			say("  …   (controlplane and etcd: Direct)")
			break
		}
		say("  %s", l)
	}
	t0 := time.Now()
	api, err := cluster.StartAPIServer(stack, e, filepath.Join(work, "apiserver"), etcd, cluster.APIServerOptions{EtcdPrefix: "/registry", EgressConfig: egress})
	if err != nil {
		return err
	}
	defer api.Stop()
	say("kube-apiserver ready in %.1f s", time.Since(t0).Seconds())
	if err := cluster.Setup(api, e, node); err != nil {
		return err
	}
	for _, args := range [][]string{{"get", "nodes,pods,services", "-o", "wide"}, {"get", "apiservice", cluster.APIService}} {
		out, err := api.Kubectl(cluster.Deadline, nil, args...)
		if err != nil {
			return err
		}
		say("$ kubectl %s", strings.Join(args, " "))
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			say("  %s", l)
		}
	}

	step(4, "kubectl through the tunnel")
	d := &driver{tun: tun}
	if err := d.do("kubectl get --raw /api/v1/nodes/konn-node/proxy/healthz", func() (string, error) {
		out, err := api.Kubectl(time.Minute, nil, "get", "--raw", "/api/v1/nodes/"+cluster.NodeName+"/proxy/healthz")
		return fmt.Sprintf("the kubelet answered %q", out), err
	}); err != nil {
		return err
	}
	if err := d.do("kubectl logs -f app (the kubelet appends 3 lines while kubectl follows)", func() (string, error) {
		key := cluster.LogKey(cluster.PodName)
		ls, err := api.FollowLogs(time.Minute, cluster.PodName)
		if err != nil {
			return "", err
		}
		if err := ls.Next("log line 0: written before anyone followed", 30*time.Second); err != nil {
			ls.Kill()
			return "", err
		}
		var lat []string
		for i := 1; i <= 3; i++ {
			line := fmt.Sprintf("log line %d: appended while kubectl follows", i)
			t := time.Now()
			if err := node.LogLine(key, line); err != nil {
				ls.Kill()
				return "", err
			}
			if err := ls.Next(line, 10*time.Second); err != nil {
				ls.Kill()
				return "", err
			}
			lat = append(lat, fmt.Sprintf("%.1f ms", float64(time.Since(t).Microseconds())/1000))
		}
		if err := node.LogEnd(key); err != nil {
			ls.Kill()
			return "", err
		}
		return "each line reached kubectl as it was written (" + strings.Join(lat, ", ") + "); kubectl exited when the log ended", ls.Wait(20 * time.Second)
	}); err != nil {
		return err
	}
	if err := d.do("kubectl exec app -- echo hello from the node network", func() (string, error) {
		out, err := api.Kubectl(time.Minute, nil, "exec", "-n", cluster.Namespace, cluster.PodName, "--", "echo", "hello", "from", "the", "node", "network")
		return fmt.Sprintf("printed %q", strings.TrimSpace(out)), err
	}); err != nil {
		return err
	}
	const execBytes = 16 << 20
	if err := d.do("kubectl exec -i app -- cat   (16 MiB on stdin)", func() (string, error) {
		in := cluster.Payload(execBytes, 16)
		t := time.Now()
		got, n, err := api.KubectlStdin(2*time.Minute, nil, in, "exec", "-i", "-n", cluster.Namespace, cluster.PodName, "--", "cat")
		if err != nil {
			return "", err
		}
		if n != len(in) || got != cluster.Sum(in) {
			return "", fmt.Errorf("stdout: %d bytes, SHA-256 %s…; stdin %d bytes, SHA-256 %s…", n, got, len(in), cluster.Sum(in))
		}
		return fmt.Sprintf("16 MiB back on stdout in %.1f s, SHA-256 %s… equal", time.Since(t).Seconds(), got), nil
	}); err != nil {
		return err
	}
	const pfBytes, parallel, each = 64 << 20, 20, 1 << 20
	if err := d.do(fmt.Sprintf("kubectl port-forward pod/app :%d   (64 MiB each way, then 20 parallel connections)", node.Ports.Echo), func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		port, stop, err := api.PortForward(ctx, cluster.PodName, node.Ports.Echo, nil)
		if err != nil {
			return "", err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		t := time.Now()
		if err := cluster.EchoRoundTrip(e.Topo.CP, addr, pfBytes, 64, 3*time.Minute); err != nil {
			stop()
			return "", err
		}
		bulk := time.Since(t)
		t = time.Now()
		var wg sync.WaitGroup
		errs := make([]error, parallel)
		for i := range parallel {
			wg.Go(func() { errs[i] = cluster.EchoRoundTrip(e.Topo.CP, addr, each, uint64(i), 2*time.Minute) })
		}
		wg.Wait()
		par := time.Since(t)
		if err := errors.Join(errs...); err != nil {
			stop()
			return "", err
		}
		return fmt.Sprintf("64 MiB each way in %.1f s (%.0f MiB/s), SHA-256 equal; %d × 1 MiB each way in %.1f s, all equal",
			bulk.Seconds(), 64/bulk.Seconds(), parallel, par.Seconds()), stop()
	}); err != nil {
		return err
	}
	if err := d.do("kubectl get --raw /api/v1/namespaces/konn-e2e/services/http:web:80/proxy/hello", func() (string, error) {
		out, err := api.Kubectl(time.Minute, nil, "get", "--raw", "/api/v1/namespaces/"+cluster.Namespace+"/services/http:web:80/proxy/hello")
		return fmt.Sprintf("%q", strings.TrimSpace(out)), err
	}); err != nil {
		return err
	}
	if err := d.do("kubectl create -f -   (two ConfigMaps; the admission webhook in the node network allows one, refuses the other)", func() (string, error) {
		cm := func(name, verdict string) []byte {
			return []byte(fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s\n  namespace: %s\n  labels: {%s: %s}\n", name, cluster.Namespace, cluster.WebhookLabel, verdict))
		}
		if _, err := api.Kubectl(time.Minute, cm("demo-allowed", "allow"), "create", "-f", "-"); err != nil {
			return "", err
		}
		_, err := api.Kubectl(time.Minute, cm("demo-refused", "deny"), "create", "-f", "-")
		var ke *cluster.KubectlError
		if !errors.As(err, &ke) || !strings.Contains(ke.Stderr, cluster.WebhookDenial) {
			return "", fmt.Errorf("the deny ConfigMap: %v", err)
		}
		return fmt.Sprintf("demo-allowed created; demo-refused refused: %q", cluster.WebhookDenial), nil
	}); err != nil {
		return err
	}
	if err := d.do("kubectl get widgets.konn.test   (aggregated API server in the node network)", func() (string, error) {
		out, err := api.Kubectl(time.Minute, nil, "get", "widgets.konn.test")
		return strings.Join(strings.Fields(strings.ReplaceAll(strings.TrimSpace(out), "\n", " | ")), " "), err
	}); err != nil {
		return err
	}

	step(5, "konn's metrics, and shutdown")
	if err := cluster.Teardown(api); err != nil {
		return err
	}
	final, err := tun.WaitIdle(base, time.Minute)
	if err != nil {
		return err
	}
	tot := final.Sub(base)
	say("proxy-agent dialled %v destinations for kube-apiserver; %v DATA packets went server→agent, %v agent→server",
		tot.AgentDials, tot.DataToAgent, tot.DataFromAgent)
	say("now: established_connections %v, pending_backend_dials %v, open_endpoint_connections %v; fds server %d, agent %d (as before kube-apiserver started)",
		final.Established, final.Pending, final.AgentOpen, final.ServerFDs, final.AgentFDs)
	ed, err := api.Egress(map[string]string{"grpc": "grpc", "http-connect": "http_connect"}[tr.Mode], map[bool]string{true: "tcp", false: "uds"}[tr.TCP])
	if err == nil {
		say("kube-apiserver's own count (apiserver_egress_dialer): %v dials through the tunnel, %v failed", ed.Succeeded, ed.Failed)
	}
	if err := api.Stop(); err != nil {
		return err
	}
	say("kube-apiserver: SIGTERM → exited")
	tun.Stop()
	say("proxy-agent and proxy-server: SIGTERM → exited")
	return nil
}

// driver runs one kubectl step and prints the tunnel's share of it.
type driver struct {
	tun *cluster.Tunnel
	n   int
}

func (d *driver) do(what string, f func() (string, error)) error {
	d.n++
	fmt.Printf("\n  %c) $ %s\n", 'a'+d.n-1, what)
	before, err := d.tun.Snapshot()
	if err != nil {
		return err
	}
	t := time.Now()
	res, err := f()
	if err != nil {
		return fmt.Errorf("%s: %v", what, err)
	}
	after, err := d.tun.Snapshot()
	if err != nil {
		return err
	}
	delta := after.Sub(before)
	say("%s", res)
	say("tunnel: +%v agent dials, +%v DATA server→agent, +%v DATA agent→server (%.1f s)",
		delta.AgentDials, delta.DataToAgent, delta.DataFromAgent, time.Since(t).Seconds())
	return nil
}
