package cluster

import (
	"fmt"
	"strings"
	"time"
)

// Objects of the suite, all in Namespace:
//
//   - Node NodeName (kubelet at the node IP) and Node NodeNameWS, the same
//     kubelet, which declares ExtendWebSocketsToKubelet: kube-apiserver
//     then forwards WebSocket exec/attach/port-forward to the kubelet
//     instead of translating them to SPDY itself;
//   - Pod PodName on NodeName and Pod PodNameWS on NodeNameWS, Running,
//     with the pod IP;
//   - Service "web" (port 80 → the pod's HTTP server), with Endpoints
//     (service proxy reads them) and an EndpointSlice;
//   - Services WebhookService and APIExtService (port 443), each with an
//     EndpointSlice (the webhook and aggregator resolvers read slices) and
//     Endpoints;
//   - a ValidatingWebhookConfiguration for ConfigMaps labelled
//     konn.test/webhook, and the APIService v1alpha1.konn.test.
const (
	NodeName   = "konn-node"
	NodeNameWS = "konn-node-ws"
	PodName    = "app"
	PodNameWS  = "app-ws"
	Container  = "app"
	WebhookCfg = "konn-e2e"
	APIService = "v1alpha1.konn.test"

	WebhookLabel  = "konn.test/webhook"
	WebhookDenial = "refused by the konn-e2e webhook in the node network"
)

// LogKey is nodesim's key for a container's log.
func LogKey(pod string) string { return Namespace + "/" + pod + "/" + Container }

// Setup creates every object and waits until the APIService is Available
// (its availability check goes through the tunnel too).
func Setup(a *APIServer, e *Env, n *Node) error {
	ca, err := e.PKI.CAPEM()
	if err != nil {
		return err
	}
	caB64 := B64(ca)
	pod, podIP, nodeIP := PodName, e.Topo.PodIP, e.Topo.NodeIP
	endpoints := func(svc, port string, p int) string {
		return fmt.Sprintf(`---
apiVersion: v1
kind: Endpoints
metadata: {name: %[1]s, namespace: %[5]s}
subsets:
- addresses:
  - ip: %[2]s
    targetRef: {kind: Pod, namespace: %[5]s, name: %[3]s}
  ports:
  - {name: %[4]s, port: %[6]d, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %[1]s-1
  namespace: %[5]s
  labels: {kubernetes.io/service-name: %[1]s, endpointslice.kubernetes.io/managed-by: konn-e2e}
addressType: IPv4
endpoints:
- addresses: [%[2]s]
  conditions: {ready: true, serving: true, terminating: false}
  nodeName: %[7]s
  targetRef: {kind: Pod, namespace: %[5]s, name: %[3]s}
ports:
- {name: %[4]s, port: %[6]d, protocol: TCP}
`, svc, podIP, pod, port, Namespace, p, NodeName)
	}
	service := func(name, portName string, port, target int) string {
		return fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: %s, namespace: %s}
spec:
  ports:
  - {name: %s, port: %d, targetPort: %d, protocol: TCP}
`, name, Namespace, portName, port, target)
	}
	podYAML := func(name, node string) string {
		return fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s, labels: {app: konn-e2e}}
spec:
  nodeName: %s
  automountServiceAccountToken: false
  containers:
  - name: %s
    image: konn.test/app:e2e
    stdin: true
    ports:
    - {name: http, containerPort: %d}
    - {name: echo, containerPort: %d}
`, name, Namespace, node, Container, n.Ports.HTTP, n.Ports.Echo)
	}
	nodeYAML := func(name string) string {
		return fmt.Sprintf(`---
apiVersion: v1
kind: Node
metadata:
  name: %s
  labels: {kubernetes.io/hostname: %s, kubernetes.io/os: linux}
`, name, name)
	}

	base := fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: %[1]s}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: default, namespace: %[1]s}
`, Namespace) + nodeYAML(NodeName) + nodeYAML(NodeNameWS)
	if err := a.Apply(base); err != nil {
		return err
	}
	now := time.Now().UTC().Format(time.RFC3339)
	for _, nd := range []struct {
		name     string
		features string
	}{{NodeName, ""}, {NodeNameWS, `,"declaredFeatures":["ExtendWebSocketsToKubelet"]`}} {
		patch := fmt.Sprintf(`{"status":{"addresses":[{"type":"InternalIP","address":%q},{"type":"Hostname","address":%q}],`+
			`"daemonEndpoints":{"kubeletEndpoint":{"Port":%d}},`+
			`"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"konn e2e kubelet","lastHeartbeatTime":%q,"lastTransitionTime":%q}]%s}}`,
			nodeIP, nd.name, n.Ports.Kubelet, now, now, nd.features)
		if _, err := a.Kubectl(Deadline, nil, "patch", "node", nd.name, "--subresource=status", "--type=merge", "-p", patch); err != nil {
			return err
		}
	}

	objs := podYAML(PodName, NodeName) + podYAML(PodNameWS, NodeNameWS) +
		service("web", "http", 80, n.Ports.HTTP) + endpoints("web", "http", n.Ports.HTTP) +
		service(WebhookService, "https", 443, n.Ports.Webhook) + endpoints(WebhookService, "https", n.Ports.Webhook) +
		service(APIExtService, "https", 443, n.Ports.APIExt) + endpoints(APIExtService, "https", n.Ports.APIExt)
	if err := a.Apply(objs); err != nil {
		return err
	}
	for _, p := range []string{PodName, PodNameWS} {
		patch := fmt.Sprintf(`{"status":{"phase":"Running","hostIP":%[1]q,"hostIPs":[{"ip":%[1]q}],"podIP":%[2]q,"podIPs":[{"ip":%[2]q}],`+
			`"startTime":%[3]q,"conditions":[{"type":"Ready","status":"True","lastTransitionTime":%[3]q}],`+
			`"containerStatuses":[{"name":%[4]q,"ready":true,"started":true,"restartCount":0,"image":"konn.test/app:e2e","imageID":"konn.test/app:e2e","containerID":"konn://%[5]s","state":{"running":{"startedAt":%[3]q}}}]}}`,
			nodeIP, podIP, now, Container, p)
		if _, err := a.Kubectl(Deadline, nil, "patch", "pod", p, "-n", Namespace, "--subresource=status", "--type=merge", "-p", patch); err != nil {
			return err
		}
	}

	ext := fmt.Sprintf(`apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: %[1]s}
webhooks:
- name: configmaps.konn.test
  clientConfig:
    service: {namespace: %[2]s, name: %[3]s, path: /validate, port: 443}
    caBundle: %[4]s
  rules:
  - {operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: [configmaps]}
  objectSelector:
    matchExpressions: [{key: %[6]s, operator: Exists}]
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  timeoutSeconds: 10
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: %[7]s}
spec:
  group: konn.test
  version: v1alpha1
  service: {namespace: %[2]s, name: %[5]s, port: 443}
  caBundle: %[4]s
  groupPriorityMinimum: 1000
  versionPriority: 15
`, WebhookCfg, Namespace, WebhookService, caB64, APIExtService, WebhookLabel, APIService)
	if err := a.Apply(ext); err != nil {
		return err
	}
	return Poll(60*time.Second, "APIService "+APIService+" Available", func() error {
		out, err := a.Kubectl(Deadline, nil, "get", "apiservice", APIService, "-o",
			`jsonpath={.status.conditions[?(@.type=="Available")].status} {.status.conditions[?(@.type=="Available")].message}`)
		if err != nil {
			return err
		}
		if !strings.HasPrefix(out, "True") {
			return fmt.Errorf("Available: %q", out)
		}
		return nil
	})
}

// Teardown deletes what makes kube-apiserver dial the node network by
// itself (the APIService's availability checks, discovery), so that the
// tunnel can go idle.
func Teardown(a *APIServer) error {
	_, err := a.Kubectl(Deadline, nil, "delete", "--ignore-not-found", "--wait=true",
		"apiservice/"+APIService, "validatingwebhookconfiguration/"+WebhookCfg)
	return err
}
