// Package cluster runs a real control plane (etcd, kube-apiserver), a
// konnectivity proxy-server and proxy-agent (konn's or upstream's), and the
// node network (cmd/nodesim) in the two-network topology of netns.go, and
// drives it with kubectl. The end-to-end suite (e2e/) and the demo
// (cmd/kubedemo) are built on it.
package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Implementations of proxy-server and proxy-agent.
const (
	Konn     = "konn"
	Upstream = "upstream"
)

// Env is what every run shares.
type Env struct {
	Work        string // short base directory (Unix socket paths stay short)
	Topo        *Topology
	PKI         *PKI
	KubeBin     string // kube-apiserver, kubectl, etcd
	KonnBin     string // konn's proxy-server, proxy-agent
	UpstreamBin string // upstream's proxy-server, proxy-agent
	NodesimBin  string
}

// Bin is the path of impl's binary name, or an error saying how to get it.
func (e *Env) Bin(impl, name string) (string, error) {
	dir, how := e.UpstreamBin, "scripts/test builds them (UPSTREAM_BIN_DIR)"
	switch impl {
	case Konn:
		dir, how = e.KonnBin, "build them with `cargo build --bins` (KONN_BIN_DIR)"
	case "kube":
		dir, how = e.KubeBin, "build them with scripts/kube-build (KUBE_BIN_DIR)"
	}
	p := filepath.Join(dir, name)
	if st, err := os.Stat(p); err != nil || st.IsDir() {
		return "", fmt.Errorf("%s %s not found at %s: %s", impl, name, p, how)
	}
	return p, nil
}

// Dirs finds the binaries: KUBE_BIN_DIR, KONN_BIN_DIR and UPSTREAM_BIN_DIR,
// by default under the repository's target directory (CARGO_TARGET_DIR or
// <repo>/target): kube/, debug/ and interop/upstream/.
func Dirs(repo string) (kube, konn, upstream string) {
	target := os.Getenv("CARGO_TARGET_DIR")
	if target == "" {
		target = filepath.Join(repo, "target")
	}
	get := func(env, def string) string {
		if v := os.Getenv(env); v != "" {
			if a, err := filepath.Abs(v); err == nil {
				return a
			}
			return v
		}
		return def
	}
	return get("KUBE_BIN_DIR", filepath.Join(target, "kube")),
		get("KONN_BIN_DIR", filepath.Join(target, "debug")),
		get("UPSTREAM_BIN_DIR", filepath.Join(target, "interop", "upstream"))
}

// RepoRoot is the repository root: the directory above interop/kube.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "interop", "kube", "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no interop/kube/go.mod above %s", dir)
		}
	}
}

// GoCommand is the go tool of this toolchain.
func GoCommand() string {
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return "go"
}

// BuildNodesim builds cmd/nodesim into dir.
func BuildNodesim(repo, dir string) (string, error) {
	out := filepath.Join(dir, "nodesim")
	cmd := exec.Command(GoCommand(), "build", "-o", out, "./cmd/nodesim")
	cmd.Dir = filepath.Join(repo, "interop", "kube")
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly -buildvcs=false", "GOTOOLCHAIN=local")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/nodesim: %v\n%s", err, b)
	}
	return out, nil
}

// BuildUpstream builds upstream's proxy-server and proxy-agent from
// interop/go.mod (the interop matrix's module, which pins v0.36.0) into
// dir, as scripts/test does.
func BuildUpstream(repo, dir string) error {
	for _, b := range []struct{ pkg, name string }{
		{"sigs.k8s.io/apiserver-network-proxy/cmd/server", "proxy-server"},
		{"sigs.k8s.io/apiserver-network-proxy/cmd/agent", "proxy-agent"},
	} {
		cmd := exec.Command(GoCommand(), "build", "-o", filepath.Join(dir, b.name), b.pkg)
		cmd.Dir = filepath.Join(repo, "interop")
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly -buildvcs=false", "GOTOOLCHAIN=local")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return nil
}

// Versions names what ran, for reports.
func (e *Env) Versions(repo string) []string {
	var v []string
	if out, err := exec.Command(filepath.Join(e.KubeBin, "kube-apiserver"), "--version").Output(); err == nil {
		v = append(v, strings.TrimSpace(string(out)))
	}
	if out, err := exec.Command(filepath.Join(e.KubeBin, "kubectl"), "version", "--client", "-o", "json").Output(); err == nil {
		var kv struct {
			ClientVersion struct{ GitVersion string } `json:"clientVersion"`
		}
		if json.Unmarshal(out, &kv) == nil {
			v = append(v, "kubectl "+kv.ClientVersion.GitVersion)
		}
	}
	if out, err := exec.Command(filepath.Join(e.KubeBin, "etcd"), "--version").Output(); err == nil {
		line, _, _ := strings.Cut(string(out), "\n")
		v = append(v, strings.TrimSpace(line))
	}
	cmd := exec.Command(GoCommand(), "list", "-m", "-f", "{{.Path}} {{.Version}}", "sigs.k8s.io/apiserver-network-proxy")
	cmd.Dir = filepath.Join(repo, "interop")
	if out, err := cmd.Output(); err == nil {
		v = append(v, "upstream "+strings.TrimSpace(string(out)))
	}
	if out, err := exec.Command("git", "-C", repo, "rev-parse", "--short=12", "HEAD").Output(); err == nil {
		rev := strings.TrimSpace(string(out))
		if st, err := exec.Command("git", "-C", repo, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
			rev += " (with uncommitted changes)"
		}
		v = append(v, "konn "+rev)
	}
	v = append(v, "Go "+strings.TrimPrefix(runtime.Version(), "go"))
	return v
}

// Deadline bounds waits that have no better bound.
const Deadline = 30 * time.Second
