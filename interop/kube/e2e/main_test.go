// Package e2e runs a real kube-apiserver (with etcd) behind an
// EgressSelectorConfiguration, konn's and upstream's proxy-server and
// proxy-agent in every transport kube-apiserver supports, and the node
// network of cmd/nodesim, in two network namespaces; kubectl drives it.
// See docs/KUBERNETES.md.
package e2e

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"konn.local/interop/kube/internal/cluster"
)

var reportPath = flag.String("kube.report", os.Getenv("KUBE_REPORT"),
	"write the result table into this Markdown file (between its generated-section markers); also $KUBE_REPORT")

// suite is what the tests share.
type suite struct {
	env      *cluster.Env
	repo     string
	etcd     *cluster.Etcd
	node     *cluster.Node
	versions []string
}

var theSuite *suite

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// Short: Unix socket paths live under it.
	work, err := os.MkdirTemp("", "konn-kube-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "kube e2e:", err)
		return 1
	}
	if os.Getenv("KONN_KUBE_KEEP") == "" {
		defer os.RemoveAll(work)
	} else {
		defer fmt.Fprintln(os.Stderr, "kube e2e: logs and certificates kept in", work)
	}
	var stack cluster.Stack
	defer stack.Run()
	s, err := setup(&stack, work)
	if err != nil {
		// Not a skip: the suite cannot run, so the run fails.
		fmt.Fprintln(os.Stderr, "kube e2e: set-up failed:", err)
		return 1
	}
	theSuite = s
	fmt.Fprintln(os.Stderr, "kube e2e: topology:", s.env.Topo.Describe())
	if s.env.Topo.Isolated {
		fmt.Fprintf(os.Stderr, "kube e2e: namespaces %s and %s\n", s.env.Topo.CP.Name, s.env.Topo.Node.Name)
	}
	code := m.Run()
	if *reportPath != "" && ranKube {
		if err := writeReport(*reportPath, s); err != nil {
			fmt.Fprintln(os.Stderr, "kube e2e: writing the report:", err)
			return 1
		}
		fmt.Fprintln(os.Stderr, "kube e2e: report written to", *reportPath)
	}
	return code
}

func setup(stack *cluster.Stack, work string) (*suite, error) {
	repo, err := cluster.RepoRoot()
	if err != nil {
		return nil, err
	}
	s := &suite{repo: repo}
	e := &cluster.Env{Work: work}
	e.KubeBin, e.KonnBin, e.UpstreamBin = cluster.Dirs(repo)
	for _, b := range []string{"kube-apiserver", "kubectl", "etcd"} {
		if _, err := e.Bin("kube", b); err != nil {
			return nil, err
		}
	}
	if _, err := e.Bin(cluster.Upstream, "proxy-server"); err != nil && os.Getenv("UPSTREAM_BIN_DIR") == "" {
		e.UpstreamBin = filepath.Join(work, "upstream-bin")
		fmt.Fprintln(os.Stderr, "kube e2e: building upstream's proxy-server and proxy-agent from interop/go.mod")
		if err := cluster.BuildUpstream(repo, e.UpstreamBin); err != nil {
			return nil, err
		}
	}
	if e.NodesimBin, err = cluster.BuildNodesim(repo, work); err != nil {
		return nil, err
	}
	if e.Topo, err = cluster.NewTopology(); err != nil {
		return nil, err
	}
	stack.Cleanup(e.Topo.Close)
	if e.PKI, err = cluster.NewPKI(filepath.Join(work, "pki"), e.Topo); err != nil {
		return nil, fmt.Errorf("certificates: %v", err)
	}
	s.env = e
	if s.etcd, err = cluster.StartEtcd(stack, e, work); err != nil {
		return nil, err
	}
	if s.node, err = cluster.StartNode(stack, e, filepath.Join(work, "node")); err != nil {
		return nil, err
	}
	s.versions = e.Versions(repo)
	return s, nil
}
