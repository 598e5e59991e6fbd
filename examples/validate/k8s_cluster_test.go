package validate

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// theServer returns the DaemonSet shardload-serve and its container that runs serve.
func theServer(t *testing.T, m manifests) (*appsv1.DaemonSet, *corev1.Container) {
	t.Helper()
	ds, ok := m.daemonSets["shardload-serve"]
	if !ok {
		t.Fatalf("no DaemonSet shardload-serve (have %v)", m.daemonSets)
	}
	for i := range ds.Spec.Template.Spec.Containers {
		if c := &ds.Spec.Template.Spec.Containers[i]; len(c.Args) > 0 && c.Args[0] == "serve" {
			return ds, c
		}
	}
	t.Fatal("DaemonSet: no container runs serve")
	return nil, nil
}

// probeWindow is how long a probe fails before the kubelet acts: failureThreshold x
// periodSeconds, with Kubernetes' defaults (3, 10 s) for fields left out.
func probeWindow(p *corev1.Probe) int32 {
	period, failures := p.PeriodSeconds, p.FailureThreshold
	if period == 0 {
		period = 10
	}
	if failures == 0 {
		failures = 3
	}
	return period * failures
}

// The probes: readiness asks serve's /readyz (the socket and the store), liveness
// and start-up another endpoint (/livez, the process alone), so that an unreachable
// or slow store never restarts the server, which would end every trainer session of
// the node; liveness acts only after minutes of silence, each try given seconds.
// Both endpoints are ones serve has, on the port of --metrics.
func TestK8sProbes(t *testing.T) {
	m := loadManifests(t)
	_, serve := theServer(t, m)
	port, ok := metricsPort(serve)
	if !ok {
		t.Fatal("DaemonSet: serve has no container port named metrics")
	}
	served := ""
	files, _ := filepath.Glob(filepath.Join(root, "cmd/shardload/*.go"))
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			served += string(b)
		}
	}
	const readyz, livez = "/readyz", "/livez"
	for _, p := range []string{readyz, livez} {
		if !strings.Contains(served, `"`+p+`"`) {
			t.Errorf("cmd/shardload serves no %s: the probes below would fail", p)
		}
	}
	check := func(what string, p *corev1.Probe, path string) {
		t.Helper()
		if p == nil || p.HTTPGet == nil {
			t.Errorf("DaemonSet: serve's %s probe %+v: want an HTTP GET of %s", what, p, path)
			return
		}
		if p.HTTPGet.Path != path {
			t.Errorf("DaemonSet: serve's %s probe asks %s: want %s", what, p.HTTPGet.Path, path)
		}
		if pp := p.HTTPGet.Port; !(pp.Type == intstr.String && pp.StrVal == port.Name) && !(pp.Type == intstr.Int && pp.IntVal == port.ContainerPort) {
			t.Errorf("DaemonSet: serve's %s probe on port %s: want the metrics port", what, pp.String())
		}
	}
	check("readiness", serve.ReadinessProbe, readyz)
	check("liveness", serve.LivenessProbe, livez)
	if p := serve.LivenessProbe; p != nil {
		if w := probeWindow(p); w < 120 {
			t.Errorf("DaemonSet: liveness restarts serve after %d s of failures (failureThreshold x periodSeconds): want 120 s or more", w)
		}
		if p.TimeoutSeconds < 5 {
			t.Errorf("DaemonSet: liveness timeoutSeconds %d: a busy node's answer may take longer; want 5 or more", p.TimeoutSeconds)
		}
	}
	if p := serve.StartupProbe; p != nil {
		check("start-up", p, livez)
	}
}

// The server's pod has a priority of its own, defined here, above its trainers'
// and outside the reserved system classes, with its preemption policy stated.
func TestK8sPriority(t *testing.T) {
	m := loadManifests(t)
	ds, _ := theServer(t, m)
	name := ds.Spec.Template.Spec.PriorityClassName
	if name == "" {
		t.Fatal("DaemonSet: no priorityClassName: the loader its trainers depend on is scheduled and evicted like any pod")
	}
	if strings.HasPrefix(name, "system-") {
		t.Errorf("DaemonSet: priorityClassName %s is reserved for kube-system", name)
	}
	pc, ok := m.priorityClasses[name]
	if !ok {
		t.Fatalf("DaemonSet: PriorityClass %s is not defined here (have %v)", name, m.priorityClasses)
	}
	if pc.Value <= 0 || pc.Value > 1_000_000_000 {
		t.Errorf("PriorityClass %s: value %d: want above the default 0 and at most 10^9 (the most a user-defined class may have)", name, pc.Value)
	}
	if pc.GlobalDefault {
		t.Errorf("PriorityClass %s is the global default: every pod would get the loader's priority", name)
	}
	if pc.PreemptionPolicy == nil {
		t.Errorf("PriorityClass %s: preemptionPolicy not stated", name)
	}
	for _, job := range m.jobs {
		if n := job.Spec.Template.Spec.PriorityClassName; n != "" {
			if jpc, ok := m.priorityClasses[n]; !ok || jpc.Value >= pc.Value {
				t.Errorf("Job %s: priority class %s: want one defined here below the loader's %s", job.Name, n, name)
			}
		}
	}
}

// The server's pod is reachable over the network on its metrics port alone, and
// only from selected namespaces: every NetworkPolicy that selects it admits no other
// port, no source without a selector, and no address block of everything.
func TestK8sNetworkPolicy(t *testing.T) {
	m := loadManifests(t)
	ds, serve := theServer(t, m)
	port, ok := metricsPort(serve)
	if !ok {
		t.Fatal("DaemonSet: serve has no container port named metrics")
	}
	podLabels := labels.Set(ds.Spec.Template.Labels)
	isolated := false
	for _, np := range m.networkPolicies {
		where := "NetworkPolicy " + np.Name
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		if !sel.Matches(podLabels) {
			continue
		}
		if !slicesContains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			continue
		}
		isolated = true
		for i, rule := range np.Spec.Ingress {
			if len(rule.From) == 0 {
				t.Errorf("%s: ingress rule %d admits every source", where, i)
			}
			if len(rule.Ports) == 0 {
				t.Errorf("%s: ingress rule %d admits every port", where, i)
			}
			for _, p := range rule.Ports {
				metrics := p.Port != nil && ((p.Port.Type == intstr.String && p.Port.StrVal == port.Name) || (p.Port.Type == intstr.Int && p.Port.IntVal == port.ContainerPort))
				if !metrics || p.EndPort != nil {
					t.Errorf("%s: ingress rule %d admits port %v: want the metrics port (%s, %d) alone", where, i, p.Port, port.Name, port.ContainerPort)
				}
			}
			for _, peer := range rule.From {
				switch {
				case peer.IPBlock != nil:
					if c := peer.IPBlock.CIDR; strings.HasSuffix(c, "/0") {
						t.Errorf("%s: ingress rule %d admits %s", where, i, c)
					}
				case peer.NamespaceSelector == nil:
					t.Errorf("%s: ingress rule %d admits pods of the server's own namespace (the trainers, anything else there): want the monitoring namespace", where, i)
				case len(peer.NamespaceSelector.MatchLabels) == 0 && len(peer.NamespaceSelector.MatchExpressions) == 0:
					t.Errorf("%s: ingress rule %d admits every namespace", where, i)
				}
			}
		}
	}
	if !isolated {
		t.Errorf("no NetworkPolicy of Ingress selects the server's pods (%v): its metrics port (%s, %d) is open to every pod of the cluster", podLabels, port.Name, port.ContainerPort)
	}
}

// The namespace is defined with its Pod Security level: privileged where the pods
// mount hostPath directories (which baseline and restricted forbid), and the README
// applies the manifests to it.
func TestK8sNamespace(t *testing.T) {
	m := loadManifests(t)
	if len(m.namespaces) != 1 {
		t.Fatalf("%d Namespaces: want the one the manifests are applied to", len(m.namespaces))
	}
	var ns *corev1.Namespace
	for _, ns = range m.namespaces {
	}
	hostPath := []string{}
	specs := map[string]*corev1.PodSpec{}
	for _, ds := range m.daemonSets {
		specs["DaemonSet "+ds.Name] = &ds.Spec.Template.Spec
	}
	for _, job := range m.jobs {
		specs["Job "+job.Name] = &job.Spec.Template.Spec
	}
	for where, spec := range specs {
		for _, v := range spec.Volumes {
			if v.HostPath != nil {
				hostPath = append(hostPath, where)
				break
			}
		}
	}
	level, ok := ns.Labels["pod-security.kubernetes.io/enforce"]
	switch {
	case !ok:
		t.Errorf("Namespace %s: no pod-security.kubernetes.io/enforce label: the cluster's default level applies, and %v mount hostPath", ns.Name, hostPath)
	case len(hostPath) > 0 && level != "privileged":
		t.Errorf("Namespace %s: Pod Security level %q, but %v mount hostPath: only privileged admits them", ns.Name, level, hostPath)
	}
	readme := string(read(t, "examples/k8s/README.md"))
	uses := regexp.MustCompile(`kubectl apply -n (\S+)`).FindAllStringSubmatch(readme, -1)
	if len(uses) == 0 {
		t.Errorf("examples/k8s/README.md applies nothing with -n %s", ns.Name)
	}
	for _, u := range uses {
		if u[1] != ns.Name {
			t.Errorf("examples/k8s/README.md applies to namespace %s; the Namespace defined is %s", u[1], ns.Name)
		}
	}
	if !strings.Contains(readme, "pod-security.kubernetes.io/enforce") || !strings.Contains(readme, "hostPath") {
		t.Errorf("examples/k8s/README.md does not say which Pod Security level the namespace needs, and why (hostPath)")
	}
}

// RLIMIT_MEMLOCK is the node's (the container runtime's): no annotation pretends
// that the pod sets it, and the README says how to raise it on the node and what
// serve does when it is too low.
func TestK8sMemlock(t *testing.T) {
	m := loadManifests(t)
	ds, _ := theServer(t, m)
	for _, a := range []map[string]string{ds.Annotations, ds.Spec.Template.Annotations} {
		for k, v := range a {
			if strings.Contains(strings.ToLower(k), "memlock") || strings.Contains(strings.ToLower(k), "ulimit") {
				t.Errorf("DaemonSet: annotation %s: %s: nothing enforces it (a pod spec cannot set RLIMIT_MEMLOCK); say it in a comment and the README", k, v)
			}
		}
	}
	readme := string(read(t, "examples/k8s/README.md"))
	for _, want := range []string{"LimitMEMLOCK=infinity", "default_ulimits", "shardload doctor", "unlocked"} {
		if !strings.Contains(readme, want) {
			t.Errorf("examples/k8s/README.md, page-locked memory: no %q", want)
		}
	}
	if strings.Contains(readme, "shardload.io/memlock") {
		t.Error("examples/k8s/README.md still speaks of the shardload.io/memlock annotation")
	}
}
