package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// NodePorts are the ports cmd/nodesim listens on (its --ready-file).
type NodePorts struct {
	Kubelet int `json:"kubelet"`
	HTTP    int `json:"http"`
	Webhook int `json:"webhook"`
	APIExt  int `json:"apiext"`
	Echo    int `json:"echo"`
}

// Node is the running node network (cmd/nodesim in the node namespace).
type Node struct {
	Proc    *Proc
	Ports   NodePorts
	control string
	ctl     *http.Client
	topo    *Topology
}

// NodeRequest is one request nodesim's servers received.
type NodeRequest struct {
	Server   string `json:"server"`
	Kind     string `json:"kind"`
	Path     string `json:"path"`
	Upgrade  string `json:"upgrade"`
	Protocol string `json:"protocol"`
	User     string `json:"user"`
}

// StartNode starts nodesim in the node namespace and waits for its ports.
func StartNode(c Cleaner, e *Env, dir string) (*Node, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	n := &Node{control: filepath.Join(dir, "control.sock"), topo: e.Topo}
	ready := filepath.Join(dir, "ports.json")
	args := []string{"--node-ip=" + e.Topo.NodeIP, "--pod-ip=" + e.Topo.PodIP, "--pki=" + e.PKI.Dir,
		"--control=" + n.control, "--ready-file=" + ready}
	var err error
	if n.Proc, err = Start(c, e.Topo.Node, "nodesim", e.NodesimBin, args, filepath.Join(dir, "nodesim.log")); err != nil {
		return nil, err
	}
	err = PollProc(Deadline, "nodesim ports", n.Proc, func() error {
		b, err := os.ReadFile(ready)
		if err != nil {
			return err
		}
		return json.Unmarshal(b, &n.Ports)
	})
	if err != nil {
		return nil, fmt.Errorf("%v\n%s", err, n.Proc.Tail(20))
	}
	n.ctl = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", n.control)
		},
		DisableKeepAlives: true,
	}}
	return n, nil
}

func (n *Node) post(path, body string) error {
	resp, err := n.ctl.Post("http://nodesim"+path, "text/plain", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != 200 {
		return fmt.Errorf("nodesim %s: status %d: %s", path, resp.StatusCode, b)
	}
	return nil
}

// LogLine appends a line to the container's log (key ns/pod/container).
func (n *Node) LogLine(key, line string) error {
	return n.post("/log?key="+url.QueryEscape(key), line)
}

// LogEnd ends the container's log: followers' streams end.
func (n *Node) LogEnd(key string) error { return n.post("/log-end?key="+url.QueryEscape(key), "") }

// LogReset forgets the container's log.
func (n *Node) LogReset(key string) error { return n.post("/log-reset?key="+url.QueryEscape(key), "") }

// Requests lists what nodesim's servers received so far.
func (n *Node) Requests() ([]NodeRequest, error) {
	resp, err := n.ctl.Get("http://nodesim/requests")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out []NodeRequest
	return out, json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&out)
}

// Destinations are the node network's listening addresses, for the
// reachability checks.
func (n *Node) Destinations() map[string]string {
	hp := func(ip string, p int) string { return net.JoinHostPort(ip, strconv.Itoa(p)) }
	return map[string]string{
		"kubelet":        hp(n.topo.NodeIP, n.Ports.Kubelet),
		"service HTTP":   hp(n.topo.PodIP, n.Ports.HTTP),
		"webhook":        hp(n.topo.PodIP, n.Ports.Webhook),
		"aggregated API": hp(n.topo.PodIP, n.Ports.APIExt),
		"echo":           hp(n.topo.PodIP, n.Ports.Echo),
	}
}
