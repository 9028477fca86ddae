package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"konn.local/interop/kube/internal/cluster"
)

// webhook is a validating admission webhook (AdmissionReview v1): objects
// labelled cluster.WebhookLabel=allow are admitted, others refused with
// cluster.WebhookDenial.
func webhook() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/validate", func(w http.ResponseWriter, r *http.Request) {
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(io.LimitReader(r.Body, 4<<20)).Decode(&review); err != nil || review.Request == nil {
			http.Error(w, fmt.Sprintf("bad AdmissionReview: %v", err), http.StatusBadRequest)
			return
		}
		var obj struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		json.Unmarshal(review.Request.Object.Raw, &obj)
		resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: obj.Metadata.Labels[cluster.WebhookLabel] == "allow"}
		if !resp.Allowed {
			resp.Result = &metav1.Status{Code: http.StatusForbidden, Message: cluster.WebhookDenial}
		}
		review.Response = resp
		review.Request = nil
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(&review)
	})
	return mux
}

// apiext is an aggregated API server for konn.test/v1alpha1: discovery and
// a read-only, cluster-scoped "widgets" resource with one object.
func apiext(podIP string) http.Handler {
	const gv = "konn.test/v1alpha1"
	widget := func() map[string]any {
		return map[string]any{
			"apiVersion": gv, "kind": "Widget",
			"metadata": map[string]any{"name": "tunnelled", "uid": "5f1e8c1e-0000-4000-8000-00000000c0de", "resourceVersion": "1", "creationTimestamp": "2026-01-01T00:00:00Z"},
			"spec":     map[string]any{"servedBy": "aggregated API server at " + podIP + " in the node network"},
		}
	}
	reply := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/apis", func(w http.ResponseWriter, r *http.Request) {
		reply(w, map[string]any{"kind": "APIGroupList", "apiVersion": "v1", "groups": []any{map[string]any{
			"name":             "konn.test",
			"versions":         []any{map[string]any{"groupVersion": gv, "version": "v1alpha1"}},
			"preferredVersion": map[string]any{"groupVersion": gv, "version": "v1alpha1"},
		}}})
	})
	mux.HandleFunc("/apis/konn.test/v1alpha1", func(w http.ResponseWriter, r *http.Request) {
		reply(w, map[string]any{"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": []any{map[string]any{
			"name": "widgets", "singularName": "widget", "namespaced": false, "kind": "Widget", "verbs": []string{"get", "list"},
		}}})
	})
	mux.HandleFunc("/apis/konn.test/v1alpha1/widgets", func(w http.ResponseWriter, r *http.Request) {
		reply(w, map[string]any{"apiVersion": gv, "kind": "WidgetList", "metadata": map[string]any{"resourceVersion": "1"}, "items": []any{widget()}})
	})
	mux.HandleFunc("/apis/konn.test/v1alpha1/widgets/", func(w http.ResponseWriter, r *http.Request) {
		if strings.TrimPrefix(r.URL.Path, "/apis/konn.test/v1alpha1/widgets/") != "tunnelled" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
				"message": "widgets.konn.test not found"})
			return
		}
		reply(w, widget())
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	return mux
}
