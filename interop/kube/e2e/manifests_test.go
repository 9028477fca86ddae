package e2e

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/server/egressselector"

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
		if strings.Contains(string(b), "kind: EgressSelectorConfiguration") {
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
		if err != nil {
			t.Errorf("%s: %v", rel(file), err)
		}
	}

	var startWith string
	for _, p := range egress {
		cfg, err := egressselector.ReadEgressSelectorConfiguration(p)
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
		if startWith == "" && strings.Contains(p, "kubernetes-io") {
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
	for _, p := range manifests {
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
		add(p, "accepted: "+strings.Join(objs, ", "), nil)
	}
}
