package e2e

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/server/egressselector"
	"sigs.k8s.io/yaml"

	"konn.local/interop/kube/internal/cluster"
)

type deployResult struct {
	file string
	note string
	err  error
}

var deployResults []deployResult

// TestDeployManifests checks deploy/: every EgressSelectorConfiguration
// passes kube-apiserver's own reader and validation
// (k8s.io/apiserver/pkg/server/egressselector), kube-apiserver starts with
// the kubernetes.io shape's file, and every Kubernetes manifest is
// accepted by that kube-apiserver with `kubectl apply --dry-run=server`.
func TestDeployManifests(t *testing.T) {
	s := theSuite
	root := filepath.Join(s.repo, "deploy")
	var manifests, egress []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if ext := filepath.Ext(p); ext != ".yaml" && ext != ".yml" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if isEgressConfig(b) {
			egress = append(egress, p)
		} else {
			manifests = append(manifests, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(manifests)
	sort.Strings(egress)
	if len(manifests) == 0 || len(egress) == 0 {
		t.Fatalf("deploy/: %d manifests, %d EgressSelectorConfiguration files; want both", len(manifests), len(egress))
	}
	rel := func(p string) string {
		r, _ := filepath.Rel(s.repo, p)
		return r
	}
	add := func(file, note string, err error) {
		deployResults = append(deployResults, deployResult{file: rel(file), note: note, err: err})
		t.Logf("%s: %s", rel(file), note)
		if err != nil {
			t.Errorf("%s: %v", rel(file), err)
		}
	}

	var startWith string
	for _, p := range egress {
		cfg, err := egressselector.ReadEgressSelectorConfiguration(p)
		// Validation opens the TLS files of a TCP transport: point them at
		// this suite's certificates (they are paths on a control plane
		// node).
		substituted := false
		if err == nil {
			for _, sel := range cfg.EgressSelections {
				if tr := sel.Connection.Transport; tr != nil && tr.TCP != nil && tr.TCP.TLSConfig != nil {
					tr.TCP.TLSConfig.CABundle = s.env.PKI.CA
					tr.TCP.TLSConfig.ClientCert = s.env.PKI.KonnClient.Cert
					tr.TCP.TLSConfig.ClientKey = s.env.PKI.KonnClient.Key
					substituted = true
				}
			}
		}
		if err == nil {
			if errs := egressselector.ValidateEgressSelectorConfiguration(cfg); len(errs) > 0 {
				err = errs.ToAggregate()
			}
		}
		if err != nil {
			add(p, "", err)
			continue
		}
		var parts []string
		for _, sel := range cfg.EgressSelections {
			c := sel.Connection
			tr := "-"
			switch {
			case c.Transport != nil && c.Transport.UDS != nil:
				tr = "UDS"
			case c.Transport != nil && c.Transport.TCP != nil:
				tr = "TCP"
			}
			parts = append(parts, fmt.Sprintf("%s: %s/%s", sel.Name, c.ProxyProtocol, tr))
		}
		note := "kube-apiserver's reader and validation accept it (" + strings.Join(parts, ", ") + ")"
		if substituted {
			note += ", with the TLS file paths pointed at existing files"
		}
		if filepath.Base(filepath.Dir(p)) == "kubernetes-io" && filepath.Base(p) == "egress-selector-configuration.yaml" {
			startWith = p
			note += "; the kube-apiserver below was started with it"
		}
		add(p, note, nil)
	}
	if startWith == "" {
		t.Fatal("no usable EgressSelectorConfiguration under deploy/kubernetes-io")
	}

	dir := filepath.Join(s.env.Work, "deploy")
	api, err := cluster.StartAPIServer(t, s.env, dir, s.etcd, cluster.APIServerOptions{EtcdPrefix: "/registry-deploy", EgressConfig: startWith})
	if err != nil {
		t.Fatal(err)
	}
	defer api.Stop()
	// What kube-controller-manager would have created: the default
	// ServiceAccount (Pods are admitted only when it exists).
	if err := api.Apply("apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: default, namespace: kube-system}\n"); err != nil {
		t.Fatal(err)
	}
	// Namespaces the manifests live in are created for real first (a
	// dry-run creates nothing, so objects in a new namespace would be
	// refused).
	var rest []string
	for _, p := range manifests {
		if filepath.Base(p) != "namespace.yaml" {
			rest = append(rest, p)
			continue
		}
		out, err := api.Kubectl(time.Minute, nil, "apply", "-f", p)
		add(p, "applied for real (the namespace of the dry-runs below): "+strings.TrimSpace(out), err)
	}
	flagsKnown := knownFlags(t)
	for _, p := range rest {
		if err := checkFlags(p, flagsKnown); err != nil {
			add(p, "", err)
			continue
		}
		out, err := api.Kubectl(time.Minute, nil, "apply", "--dry-run=server", "-f", p)
		if err != nil {
			var ke *cluster.KubectlError
			if errors.As(err, &ke) {
				err = fmt.Errorf("%s", strings.TrimSpace(ke.Stderr))
			}
			add(p, "", err)
			continue
		}
		var objs []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(l); len(f) > 0 {
				objs = append(objs, "`"+f[0]+"`")
			}
		}
		add(p, "accepted: "+strings.Join(objs, ", ")+flagNote(p), nil)
	}
}

// isEgressConfig: a top-level `kind: EgressSelectorConfiguration` (not one
// embedded in a ConfigMap).
func isEgressConfig(b []byte) bool {
	for _, l := range strings.Split(string(b), "\n") {
		if strings.TrimRight(l, " \r") == "kind: EgressSelectorConfiguration" {
			return true
		}
	}
	return false
}

// knownFlags are the flag names konn's and upstream's proxy-server and
// proxy-agent list in --help: flags[impl+" "+binary][name].
func knownFlags(t *testing.T) map[string]map[string]bool {
	s := theSuite
	out := map[string]map[string]bool{}
	re := regexp.MustCompile(`(?m)^\s+(?:-[a-z], )?--([a-z0-9-]+)`)
	for _, impl := range []string{cluster.Konn, cluster.Upstream} {
		for _, b := range []string{"proxy-server", "proxy-agent"} {
			bin, err := s.env.Bin(impl, b)
			if err != nil {
				t.Fatal(err)
			}
			help, _ := exec.Command(bin, "--help").CombinedOutput()
			m := map[string]bool{}
			for _, g := range re.FindAllStringSubmatch(string(help), -1) {
				m[g[1]] = true
			}
			if len(m) < 20 {
				t.Fatalf("%s %s --help lists %d flags", impl, b, len(m))
			}
			out[impl+" "+b] = m
		}
	}
	return out
}

var flagCounts = map[string]int{}

// konnOnly are konn's own flags the manifests may pass: an operator who
// runs upstream's image drops them (docs/FLAGS.md, konn sections); every
// other flag must be one upstream knows too.
var konnOnly = map[string]bool{"drain-timeout": true, "clusters-config": true}

var konnOnlyUsed = map[string][]string{}

// checkFlags finds every container of the manifest that runs
// /proxy-server or /proxy-agent and checks that each --flag in its args is
// one konn's binary knows and, unless it is one of konn's own (konnOnly),
// upstream's too (a manifest must work with either image).
func checkFlags(path string, known map[string]map[string]bool) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	n := 0
	for _, doc := range strings.Split(string(b), "\n---") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			return fmt.Errorf("YAML: %v", err)
		}
		var walk func(v any) error
		walk = func(v any) error {
			switch x := v.(type) {
			case map[string]any:
				if cmd, ok := x["command"].([]any); ok && len(cmd) > 0 {
					bin := fmt.Sprint(cmd[0])
					if bin == "/proxy-server" || bin == "/proxy-agent" {
						args, _ := x["args"].([]any)
						for _, a := range args {
							name, _, _ := strings.Cut(strings.TrimPrefix(fmt.Sprint(a), "--"), "=")
							if !known[cluster.Konn+" "+bin[1:]][name] {
								return fmt.Errorf("%s: %s does not know --%s", bin, cluster.Konn, name)
							}
							if !known[cluster.Upstream+" "+bin[1:]][name] {
								if !konnOnly[name] {
									return fmt.Errorf("%s: %s does not know --%s", bin, cluster.Upstream, name)
								}
								konnOnlyUsed[path] = append(konnOnlyUsed[path], "--"+name)
							}
							n++
						}
					}
				}
				for _, vv := range x {
					if err := walk(vv); err != nil {
						return err
					}
				}
			case []any:
				for _, vv := range x {
					if err := walk(vv); err != nil {
						return err
					}
				}
			}
			return nil
		}
		if err := walk(obj); err != nil {
			return err
		}
	}
	flagCounts[path] = n
	return nil
}

func flagNote(path string) string {
	if n := flagCounts[path]; n > 0 {
		if only := konnOnlyUsed[path]; len(only) > 0 {
			return fmt.Sprintf("; its %d proxy-server/proxy-agent flags are known to konn's binaries, all but konn's own %s to upstream's too", n, strings.Join(only, ", "))
		}
		return fmt.Sprintf("; its %d proxy-server/proxy-agent flags are all known to konn's and upstream's binaries", n)
	}
	return ""
}
