// Package matrix runs konn's and upstream's proxy-server and proxy-agent in
// every pairing, with every kind of client kube-apiserver (or an operator)
// uses, and checks the same scenarios in every cell. See README.md in the
// module root and docs/INTEROP.md.
package matrix

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

var reportPath = flag.String("interop.report", os.Getenv("INTEROP_REPORT"),
	"write the result table into this Markdown file (between its generated-section markers); also $INTEROP_REPORT")

// env is what every cell shares: binaries, certificates, destinations.
type env struct {
	work     string // short base directory (Unix socket paths must stay short)
	konnBin  string // directory with konn's proxy-server and proxy-agent
	upBin    string // directory with upstream's proxy-server and proxy-agent
	pki      *pki
	dest     *destinations
	versions []string // for the report
}

var theEnv *env

func TestMain(m *testing.M) {
	flag.Parse()
	code := run(m)
	os.Exit(code)
}

func run(m *testing.M) int {
	work, err := os.MkdirTemp("", "konn-interop-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		return 1
	}
	if os.Getenv("INTEROP_KEEP") == "" {
		defer os.RemoveAll(work)
	} else {
		defer fmt.Fprintln(os.Stderr, "interop: logs and certificates kept in", work)
	}

	e, err := setup(work)
	if err != nil {
		// Not a skip: the matrix cannot run, so the run fails.
		fmt.Fprintln(os.Stderr, "interop: set-up failed:", err)
		return 1
	}
	defer e.dest.close()
	theEnv = e

	code := m.Run()
	if *reportPath != "" && matrixRan {
		if err := writeReport(*reportPath, e); err != nil {
			fmt.Fprintln(os.Stderr, "interop: writing the report:", err)
			return 1
		}
		fmt.Fprintln(os.Stderr, "interop: report written to", *reportPath)
	}
	return code
}

func setup(work string) (*env, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	e := &env{work: work}

	e.konnBin = os.Getenv("KONN_BIN_DIR")
	if e.konnBin == "" {
		e.konnBin = filepath.Join(root, "..", "target", "debug")
	}
	if e.konnBin, err = filepath.Abs(e.konnBin); err != nil {
		return nil, err
	}

	e.upBin = os.Getenv("UPSTREAM_BIN_DIR")
	if e.upBin == "" {
		e.upBin = filepath.Join(work, "upstream-bin")
		if err := buildUpstream(root, e.upBin); err != nil {
			return nil, err
		}
	}
	for _, b := range []string{"proxy-server", "proxy-agent"} {
		if _, err := os.Stat(filepath.Join(e.upBin, b)); err != nil {
			return nil, fmt.Errorf("upstream %s missing in %s (UPSTREAM_BIN_DIR): %v", b, e.upBin, err)
		}
	}

	if e.pki, err = newPKI(filepath.Join(work, "pki")); err != nil {
		return nil, fmt.Errorf("certificates: %v", err)
	}
	if e.dest, err = startDestinations(); err != nil {
		return nil, fmt.Errorf("destinations: %v", err)
	}
	e.versions = versions(root)
	return e, nil
}

// konnBinary returns the path of a konn binary, or an error that says how
// to build it. A missing konn binary fails the konn cells; it is never a
// skip.
func (e *env) binary(impl, name string) (string, error) {
	dir := e.upBin
	if impl == konn {
		dir = e.konnBin
	}
	p := filepath.Join(dir, name)
	if st, err := os.Stat(p); err != nil || st.IsDir() {
		if impl == konn {
			return "", fmt.Errorf("konn %s not found at %s: build it with `cargo build --bins` or point KONN_BIN_DIR at its directory", name, p)
		}
		return "", fmt.Errorf("upstream %s not found at %s", name, p)
	}
	return p, nil
}

// moduleRoot is the directory holding this module's go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod above %s", dir)
		}
	}
}

// goCommand is the go tool that runs this test (so the upstream binaries
// are built by the same toolchain and module cache).
func goCommand() string {
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return "go"
}

// buildUpstream builds upstream's proxy-server and proxy-agent from the
// module graph of go.mod (the `tool` directives pin them).
func buildUpstream(root, out string) error {
	for _, b := range []struct{ pkg, name string }{
		{"sigs.k8s.io/apiserver-network-proxy/cmd/server", "proxy-server"},
		{"sigs.k8s.io/apiserver-network-proxy/cmd/agent", "proxy-agent"},
	} {
		cmd := exec.Command(goCommand(), "build", "-o", filepath.Join(out, b.name), b.pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOTOOLCHAIN=local")
		if outb, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", b.pkg, err, outb)
		}
	}
	return nil
}

// versions lists what the report names: the Go toolchain, the upstream
// modules in this build, konn's commit and curl.
func versions(root string) []string {
	v := []string{"Go " + strings.TrimPrefix(runtime.Version(), "go")}
	v = append(v, moduleVersions(root)...)
	if out, err := exec.Command("git", "-C", root, "rev-parse", "--short=12", "HEAD").Output(); err == nil {
		rev := strings.TrimSpace(string(out))
		if st, err := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
			rev += " (with uncommitted changes)"
		}
		v = append(v, "konn "+rev)
	}
	if out, err := exec.Command("curl", "--version").Output(); err == nil {
		line, _, _ := strings.Cut(string(out), "\n")
		f := strings.Fields(line)
		if len(f) >= 2 {
			v = append(v, "curl "+f[1])
		}
	}
	return v
}

// deadline is the bound on waits that have no better one.
const deadline = 20 * time.Second
