package e2e

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strconv"
	"testing"
	"time"
)

// topologyLines are the reachability results, for the report.
var topologyLines []string

// TestTopology proves the isolation every other test relies on: from the
// control plane namespace (where kube-apiserver runs) no destination can
// be dialled, while from the node namespace each one answers; and from the
// node namespace nothing of the control plane is reachable but the agent
// port (etcd, bound to the control plane's loopback, is not).
func TestTopology(t *testing.T) {
	s := theSuite
	topo := s.env.Topo
	if !topo.Isolated {
		topologyLines = append(topologyLines, "FALLBACK, no network namespaces: "+topo.Reason+
			". kube-apiserver could dial the destinations directly; every case instead requires the proxy-agent's dial count to grow.")
		t.Log("no network namespaces (" + topo.Reason + "): fallback topology; every case asserts the agent's dial metrics")
		return
	}
	dial := func(ns interface {
		DialContext(context.Context, string, string) (net.Conn, error)
	}, addr string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		c, err := ns.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
		}
		return err
	}
	dests := s.node.Destinations()
	names := make([]string, 0, len(dests))
	for n := range dests {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		addr := dests[name]
		if err := dial(topo.Node, addr); err != nil {
			t.Errorf("%s at %s does not answer inside the node network: %v", name, addr, err)
			continue
		}
		err := dial(topo.CP, addr)
		if err == nil {
			t.Errorf("%s at %s is reachable from the control plane namespace: the tunnel would not be needed", name, addr)
			topologyLines = append(topologyLines, fmt.Sprintf("%s `%s`: **reachable from the control plane (FAIL)**", name, addr))
			continue
		}
		host, _, _ := net.SplitHostPort(addr)
		topologyLines = append(topologyLines, fmt.Sprintf("%s on %s: answers in the node network; from the control plane: `%v`", name, host, errText(err)))
	}
	etcd := net.JoinHostPort(topo.ServerAddr, strconv.Itoa(s.etcd.Port))
	if err := dial(topo.Node, etcd); err == nil {
		t.Errorf("etcd's port at %s is reachable from the node network", etcd)
	} else {
		topologyLines = append(topologyLines, fmt.Sprintf("the other way: etcd's port on %s (the control plane's end of the veth pair) from the node network: `%v`", topo.ServerAddr, errText(err)))
	}
}

func errText(err error) string {
	var op *net.OpError
	if e, ok := err.(*net.OpError); ok {
		op = e
	}
	if op != nil && op.Err != nil {
		return op.Op + ": " + op.Err.Error()
	}
	return err.Error()
}
