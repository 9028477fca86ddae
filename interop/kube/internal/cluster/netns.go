package cluster

import (
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// NS is a network namespace: one the harness created (Name set), or the
// namespace the harness itself runs in (Host).
type NS struct {
	Name string
}

// Host is the harness's own network namespace.
var Host = &NS{}

func (n *NS) isHost() bool { return n == nil || n.Name == "" }

func (n *NS) String() string {
	if n.isHost() {
		return "host namespace"
	}
	return "netns " + n.Name
}

// Command runs bin inside n (through `ip netns exec`, which execs bin in
// place: the process id is bin's own).
func (n *NS) Command(bin string, args ...string) *exec.Cmd {
	if n.isHost() {
		return exec.Command(bin, args...)
	}
	return exec.Command("ip", append([]string{"netns", "exec", n.Name, bin}, args...)...)
}

// hostNetns is the harness's own network namespace (opened once, at
// start, while every thread is still in it).
var hostNetns = func() int {
	fd, err := unix.Open("/proc/self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	return fd
}()

// Do runs f on an OS thread switched into n. Sockets f creates stay in n
// after f returns. The thread is then switched back and released. It must
// not simply end: a child started with PDEATHSIG from that thread earlier
// would be killed when it does (the signal follows the forking thread, not
// the process).
func (n *NS) Do(f func() error) error {
	if n.isHost() {
		return f()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open(filepath.Join("/run/netns", n.Name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("opening %s: %w", n, err)
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("entering %s: %w", n, err)
			return
		}
		err = f()
		// Back home; if that fails the thread stays locked and ends with
		// this goroutine rather than run other goroutines in n.
		if hostNetns >= 0 && unix.Setns(hostNetns, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// DialContext dials from inside n.
func (n *NS) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen listens inside n.
func (n *NS) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := n.Do(func() error {
		var err error
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// HTTPClient is an HTTP client whose connections are made inside n. No
// keep-alive: probes must not hold connections open between polls.
func (n *NS) HTTPClient(tlsConfig *tls.Config, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext:       n.DialContext,
			TLSClientConfig:   tlsConfig,
			DisableKeepAlives: true,
			Proxy:             nil,
		},
	}
}

var (
	portsMu   sync.Mutex
	portsUsed = map[string]bool{}
)

// FreePort picks a port on ip inside n that nothing listens on. Ports come
// from [20000, 49152): upstream's proxy-server and proxy-agent refuse ports
// above 49151, and staying below the kernel's ephemeral range keeps
// outgoing connections from taking them meanwhile. A port is never handed
// out twice in one process.
func (n *NS) FreePort(ip string) (int, error) {
	lo, hi := 20000, ephemeralLow()
	if hi > 49152 {
		hi = 49152
	}
	if hi-lo < 1000 {
		lo = hi - 1000
	}
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 200 {
		p := lo + rand.IntN(hi-lo)
		key := n.String() + "/" + ip + ":" + strconv.Itoa(p)
		if portsUsed[key] {
			continue
		}
		ln, err := n.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(p)))
		if err != nil {
			continue
		}
		ln.Close()
		portsUsed[key] = true
		return p, nil
	}
	return 0, fmt.Errorf("no free port on %s in %s", ip, n)
}

func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 21000 {
				return v
			}
		}
	}
	return 32768
}

// Topology is where everything runs.
//
// Isolated (network namespaces): the control plane namespace holds etcd,
// kube-apiserver and proxy-server; the node namespace holds proxy-agent and
// every destination. One veth pair joins them (LinkCP/LinkNode, a /30);
// the destinations listen on NodeIP and PodIP, which are addresses of the
// node namespace's loopback device outside the /30, and the control plane
// has no route to them. In the control plane only the agent port listens
// on LinkCP; everything else binds 127.0.0.1.
//
// Fallback (no network namespaces): everything in the harness's namespace;
// the destinations listen on a non-loopback address of this host
// (kube-apiserver refuses loopback for node proxy and endpoints), which
// kube-apiserver could dial directly, so the suite proves the tunnel was
// used from konn's dial metrics instead.
type Topology struct {
	Isolated bool
	Reason   string // why the fallback was used
	CP, Node *NS
	// ServerAddr is the control plane address the agent port binds to and
	// the agent dials.
	ServerAddr string
	// NodeIP is the Node's InternalIP (the fake kubelet); PodIP the pod's
	// (service backend, webhook, aggregated API, port-forward targets).
	NodeIP, PodIP string
	// LinkNode is the node end of the veth pair (Isolated only).
	LinkNode string

	names []string
}

const (
	linkCP   = "10.200.0.1"
	linkNode = "10.200.0.2"
	nodeIP   = "172.30.0.10"
	podIP    = "172.30.0.20"
	nsPrefix = "konn-kube-"
)

// NewTopology creates the two namespaces, or picks the fallback when they
// cannot be created (or when KONN_KUBE_NETNS=0). Names carry this
// process's id and a random part, so parallel runs do not collide;
// namespaces left by runs whose process is gone are removed first.
func NewTopology() (*Topology, error) {
	if os.Getenv("KONN_KUBE_NETNS") == "0" {
		return fallback("KONN_KUBE_NETNS=0")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fallback("the ip command (iproute2) is missing")
	}
	removeStale()
	var rnd [3]byte
	if _, err := cryptoRead(rnd[:]); err != nil {
		return nil, err
	}
	id := fmt.Sprintf("%s%d-%s", nsPrefix, os.Getpid(), hex.EncodeToString(rnd[:]))
	t := &Topology{Isolated: true, CP: &NS{Name: id + "-cp"}, Node: &NS{Name: id + "-node"},
		ServerAddr: linkCP, NodeIP: nodeIP, PodIP: podIP, LinkNode: linkNode}
	if err := ipCmd("netns", "add", t.CP.Name); err != nil {
		return fallback("cannot create network namespaces: " + err.Error())
	}
	t.names = append(t.names, t.CP.Name)
	steps := [][]string{
		{"netns", "add", t.Node.Name},
		{"link", "add", "name", "kcp", "netns", t.CP.Name, "type", "veth", "peer", "name", "knode", "netns", t.Node.Name},
		{"-n", t.CP.Name, "link", "set", "lo", "up"},
		{"-n", t.CP.Name, "addr", "add", linkCP + "/30", "dev", "kcp"},
		{"-n", t.CP.Name, "link", "set", "kcp", "up"},
		{"-n", t.Node.Name, "link", "set", "lo", "up"},
		{"-n", t.Node.Name, "addr", "add", linkNode + "/30", "dev", "knode"},
		{"-n", t.Node.Name, "link", "set", "knode", "up"},
		{"-n", t.Node.Name, "addr", "add", nodeIP + "/32", "dev", "lo"},
		{"-n", t.Node.Name, "addr", "add", podIP + "/32", "dev", "lo"},
	}
	for i, s := range steps {
		if err := ipCmd(s...); err != nil {
			t.Close()
			return nil, err
		}
		if i == 0 {
			t.names = append(t.names, t.Node.Name)
		}
	}
	// Processes start through `ip netns exec`, which also needs to mount
	// /sys: where that is not allowed, fall back rather than fail later.
	if err := ipCmd("netns", "exec", t.CP.Name, "true"); err != nil {
		t.Close()
		return fallback("cannot run programs in a network namespace: " + err.Error())
	}
	// The link must carry traffic before anyone relies on it: poll until
	// the agent's side can reach a listener on the control plane side.
	if err := t.waitLink(); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

func (t *Topology) waitLink() error {
	ln, err := t.CP.Listen("tcp", net.JoinHostPort(linkCP, "0"))
	if err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return Poll(10*time.Second, "veth link between the namespaces", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c, err := t.Node.DialContext(ctx, "tcp", ln.Addr().String())
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// Close deletes the namespaces (the veth pair goes with them). Processes
// must have been stopped before.
func (t *Topology) Close() {
	for i := len(t.names) - 1; i >= 0; i-- {
		if err := ipCmd("netns", "del", t.names[i]); err != nil {
			fmt.Fprintln(os.Stderr, "cluster:", err)
		}
	}
	t.names = nil
}

// Describe says in one line where things run.
func (t *Topology) Describe() string {
	if t.Isolated {
		return fmt.Sprintf("isolated: the control plane and the node network in two network namespaces (konn-kube-<pid>-<random>-cp and -node), "+
			"joined by one veth pair 10.200.0.0/30 (%s ↔ %s); destinations on %s (node) and %s (pod), which the control plane cannot route to",
			linkCP, linkNode, t.NodeIP, t.PodIP)
	}
	return fmt.Sprintf("FALLBACK (no network namespaces: %s): everything in one namespace, destinations on %s; "+
		"kube-apiserver could reach them directly, so every case asserts from the proxies' dial metrics that its traffic crossed the tunnel",
		t.Reason, t.NodeIP)
}

func fallback(reason string) (*Topology, error) {
	ip, err := hostAddress()
	if err != nil {
		return nil, fmt.Errorf("no network namespaces (%s) and no fallback: %v", reason, err)
	}
	return &Topology{Reason: reason, CP: Host, Node: Host, ServerAddr: "127.0.0.1", NodeIP: ip, PodIP: ip}, nil
}

// hostAddress is a non-loopback, global unicast IPv4 address of this host.
func hostAddress() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		if ip4 := ipn.IP.To4(); ip4 != nil && ip4.IsGlobalUnicast() && !ip4.IsLoopback() {
			return ip4.String(), nil
		}
	}
	return "", errors.New("this host has no non-loopback IPv4 address (kube-apiserver refuses loopback destinations)")
}

// removeStale deletes namespaces of earlier runs whose process is gone
// (a run killed with SIGKILL cannot clean up after itself).
func removeStale() {
	entries, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), nsPrefix)
		if !ok {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue
		}
		ipCmd("netns", "del", e.Name())
	}
}

func ipCmd(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func cryptoRead(b []byte) (int, error) { return crand.Read(b) }
