package validate

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// decoder decodes manifests strictly into the typed objects of k8s.io/api: an unknown
// or duplicated field, a value of the wrong type and a kind the scheme does not know
// are errors.
var decoder = func() runtime.Decoder {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme, networkingv1.AddToScheme, schedulingv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}()

// decodeAll decodes every document of a YAML stream.
func decodeAll(data []byte) ([]runtime.Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []runtime.Object
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, _, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		objs = append(objs, obj)
	}
}

func stripComments(doc []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			out = append(append(out, l...), '\n')
		}
	}
	return out
}

func TestK8sDecodingIsStrict(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndatas: {a: b}\n",
		"nested field":  "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      containers:\n        - name: a\n          image: b\n          volumeMount: []\n",
		"wrong type":    "apiVersion: batch/v1\nkind: Job\nmetadata: {name: x}\nspec: {completions: two}\n",
		"unknown kind":  "apiVersion: v1\nkind: ConfigMapp\nmetadata: {name: x}\n",
		"unknown group": "apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nmetadata: {name: x}\n",
		"duplicate":     "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\ndata: {c: d}\n",
	} {
		if _, err := decodeAll([]byte(doc)); err == nil {
			t.Errorf("%s: decoded %q", name, doc)
		}
	}
	if objs, err := decodeAll([]byte("# c\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")); err != nil || len(objs) != 1 {
		t.Errorf("a valid stream: %d objects, %v", len(objs), err)
	}
}

// manifests are the objects of examples/k8s, by kind and name.
type manifests struct {
	daemonSets map[string]*appsv1.DaemonSet
	jobs       map[string]*batchv1.Job
	services   map[string]*corev1.Service
	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
	pvcs       map[string]*corev1.PersistentVolumeClaim

	namespaces      map[string]*corev1.Namespace
	priorityClasses map[string]*schedulingv1.PriorityClass
	networkPolicies map[string]*networkingv1.NetworkPolicy
}

func loadManifests(t *testing.T) manifests {
	t.Helper()
	m := manifests{map[string]*appsv1.DaemonSet{}, map[string]*batchv1.Job{}, map[string]*corev1.Service{},
		map[string]*corev1.ConfigMap{}, map[string]*corev1.Secret{}, map[string]*corev1.PersistentVolumeClaim{},
		map[string]*corev1.Namespace{}, map[string]*schedulingv1.PriorityClass{}, map[string]*networkingv1.NetworkPolicy{}}
	files, err := filepath.Glob(filepath.Join(root, "examples/k8s/*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in examples/k8s: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := decodeAll(data)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(f), err)
		}
		for _, o := range objs {
			switch o := o.(type) {
			case *appsv1.DaemonSet:
				m.daemonSets[o.Name] = o
			case *batchv1.Job:
				m.jobs[o.Name] = o
			case *corev1.Service:
				m.services[o.Name] = o
			case *corev1.ConfigMap:
				m.configMaps[o.Name] = o
			case *corev1.Secret:
				m.secrets[o.Name] = o
			case *corev1.PersistentVolumeClaim:
				m.pvcs[o.Name] = o
			case *corev1.Namespace:
				m.namespaces[o.Name] = o
			case *schedulingv1.PriorityClass:
				m.priorityClasses[o.Name] = o
			case *networkingv1.NetworkPolicy:
				m.networkPolicies[o.Name] = o
			default:
				t.Errorf("%s: a %T this test does not check", filepath.Base(f), o)
			}
		}
	}
	return m
}

// envOf returns the value of a container's env var (value only) and whether it is set.
func envOf(c *corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// flag returns the value of --name=V or --name V in args.
func flag(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

// hostPathOf returns the host path a container path maps to through a hostPath
// volume mount, and the volume's type.
func hostPathOf(spec *corev1.PodSpec, c *corev1.Container, p string) (string, corev1.HostPathType, bool) {
	for _, vm := range c.VolumeMounts {
		if p != vm.MountPath && !strings.HasPrefix(p, vm.MountPath+"/") {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == vm.Name && v.HostPath != nil {
				typ := corev1.HostPathUnset
				if v.HostPath.Type != nil {
					typ = *v.HostPath.Type
				}
				return path.Join(v.HostPath.Path, strings.TrimPrefix(p, vm.MountPath)), typ, true
			}
		}
	}
	return "", "", false
}

// mounted reports whether a container path lies on a volume.
func mounted(c *corev1.Container, p string) bool {
	for _, vm := range c.VolumeMounts {
		if p == vm.MountPath || strings.HasPrefix(p, vm.MountPath+"/") {
			return !vm.ReadOnly
		}
	}
	return false
}

// uid is the effective runAsUser of a container, or -1.
func uid(spec *corev1.PodSpec, c *corev1.Container) int64 {
	if c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil {
		return *c.SecurityContext.RunAsUser
	}
	if spec.SecurityContext != nil && spec.SecurityContext.RunAsUser != nil {
		return *spec.SecurityContext.RunAsUser
	}
	return -1
}

// checkContainer checks what every container of the examples must have: requests
// and limits of CPU and memory, no privilege escalation, no capabilities but those
// allowed, and (unless root is allowed) a non-root user that Kubernetes enforces.
func checkContainer(t *testing.T, where string, spec *corev1.PodSpec, c *corev1.Container, rootOK bool, caps ...corev1.Capability) {
	t.Helper()
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[r]; !ok {
			t.Errorf("%s: container %s requests no %s", where, c.Name, r)
		}
		if _, ok := c.Resources.Limits[r]; !ok {
			t.Errorf("%s: container %s has no %s limit", where, c.Name, r)
		}
	}
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: container %s may escalate privileges", where, c.Name)
	}
	if sc == nil || sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("%s: container %s does not drop ALL capabilities", where, c.Name)
	} else {
		for _, a := range sc.Capabilities.Add {
			if !slicesContains(caps, a) {
				t.Errorf("%s: container %s adds capability %s", where, c.Name, a)
			}
		}
	}
	if sc != nil && sc.Privileged != nil && *sc.Privileged {
		t.Errorf("%s: container %s is privileged", where, c.Name)
	}
	if rootOK {
		return
	}
	nonRoot := spec.SecurityContext != nil && spec.SecurityContext.RunAsNonRoot != nil && *spec.SecurityContext.RunAsNonRoot
	if sc != nil && sc.RunAsNonRoot != nil {
		nonRoot = *sc.RunAsNonRoot
	}
	if u := uid(spec, c); !nonRoot || u <= 0 {
		t.Errorf("%s: container %s: runAsNonRoot %v, runAsUser %d: want a non-root uid, enforced", where, c.Name, nonRoot, u)
	}
}

func slicesContains[T comparable](s []T, v T) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// parseSize reads shardload's sizes: 2GiB, 512MiB, 1024.
func parseSize(t *testing.T, s string) int64 {
	t.Helper()
	m := regexp.MustCompile(`^(\d+)(KiB|MiB|GiB|TiB)?$`).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("size %q", s)
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n << map[string]int{"": 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40}[m[2]]
}

// processOverhead is shardload.MemoryOverhead: what the serve process holds beyond
// the sessions' budgets.
const processOverhead = 160 << 20

func TestK8s(t *testing.T) {
	m := loadManifests(t)

	// The server: one per node.
	ds, ok := m.daemonSets["shardload-serve"]
	if !ok {
		t.Fatalf("no DaemonSet shardload-serve (have %v)", m.daemonSets)
	}
	sel, err := metav1LabelSelector(ds.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("DaemonSet: selector %v does not match the template's labels %v (%v)", ds.Spec.Selector, ds.Spec.Template.Labels, err)
	}
	sspec := &ds.Spec.Template.Spec
	var serve *corev1.Container
	for i := range sspec.Containers {
		c := &sspec.Containers[i]
		checkContainer(t, "DaemonSet", sspec, c, false)
		if len(c.Args) > 0 && c.Args[0] == "serve" {
			serve = c
		}
	}
	for i := range sspec.InitContainers {
		c := &sspec.InitContainers[i]
		checkContainer(t, "DaemonSet init", sspec, c, true, "CHOWN", "FOWNER")
	}
	if serve == nil {
		t.Fatal("DaemonSet: no container runs serve")
	}
	if img := serve.Image; !strings.Contains(img, "/shardload:") || strings.HasSuffix(img, ":latest") {
		t.Errorf("DaemonSet: image %q: want the shardload image of the Dockerfile, with a pinned tag", img)
	}
	if sc := serve.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("DaemonSet: serve's root file system is writable")
	}
	sock, ok := envOf(serve, "SHARDLOAD_SOCKET")
	if v, given := flag(serve.Args, "socket"); given {
		sock, ok = v, true
	}
	if !ok || !path.IsAbs(sock) {
		t.Fatalf("DaemonSet: socket %q: set SHARDLOAD_SOCKET or --socket", sock)
	}
	hostSock, _, ok := hostPathOf(sspec, serve, sock)
	if !ok {
		t.Fatalf("DaemonSet: the socket %s is on no hostPath volume: trainers could not reach it", sock)
	}
	// Everything the server writes is on a volume (its root file system is read-only).
	cacheDir, ok := flag(serve.Args, "cache-dir")
	if !ok {
		t.Error("DaemonSet: serve has no --cache-dir")
	} else if _, _, ok := hostPathOf(sspec, serve, cacheDir); !ok {
		t.Errorf("DaemonSet: --cache-dir %s is not on a hostPath volume (the node's disk)", cacheDir)
	}
	indexDir, _ := envOf(serve, "SHARDLOAD_INDEX_DIR")
	for what, p := range map[string]string{"socket directory": path.Dir(sock), "index store": indexDir} {
		if !mounted(serve, p) {
			t.Errorf("DaemonSet: the %s %q is not on a writable volume", what, p)
		}
	}
	// Its memory limit holds every session's budget plus the process.
	mem, _ := flag(serve.Args, "memory")
	sessions, _ := flag(serve.Args, "max-sessions")
	nSessions, err := strconv.Atoi(sessions)
	if mem == "" || err != nil {
		t.Errorf("DaemonSet: --memory %q --max-sessions %q: set both, to size the pod", mem, sessions)
	} else {
		need := int64(nSessions)*parseSize(t, mem) + processOverhead
		limit := serve.Resources.Limits[corev1.ResourceMemory]
		if limit.Value() < need {
			t.Errorf("DaemonSet: memory limit %s under %d sessions x %s + %d MiB = %d MiB", limit.String(), nSessions, mem, processOverhead>>20, need>>20)
		}
		if req := serve.Resources.Requests[corev1.ResourceMemory]; req.Cmp(limit) != 0 {
			t.Errorf("DaemonSet: memory request %s != limit %s: want Guaranteed QoS", req.String(), limit.String())
		}
	}
	// Its configuration and credentials come from objects defined here, and every
	// $(VAR) of its arguments is defined (Kubernetes leaves an undefined one as is).
	defined := map[string]bool{}
	for _, e := range serve.Env {
		defined[e.Name] = true
	}
	for _, ef := range serve.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			cm, ok := m.configMaps[ef.ConfigMapRef.Name]
			if !ok {
				t.Errorf("DaemonSet: ConfigMap %s not defined", ef.ConfigMapRef.Name)
				continue
			}
			for k := range cm.Data {
				defined[k] = true
			}
		case ef.SecretRef != nil:
			s, ok := m.secrets[ef.SecretRef.Name]
			if !ok {
				t.Errorf("DaemonSet: Secret %s not defined", ef.SecretRef.Name)
				continue
			}
			for k := range s.StringData {
				defined[k] = true
			}
			if s.StringData["AWS_SECRET_ACCESS_KEY"] == "" {
				t.Errorf("Secret %s has no AWS_SECRET_ACCESS_KEY", s.Name)
			}
		}
	}
	for _, a := range serve.Args {
		for _, ref := range regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).FindAllStringSubmatch(a, -1) {
			if !defined[ref[1]] {
				t.Errorf("DaemonSet: argument %q refers to $(%s), which nothing defines", a, ref[1])
			}
		}
	}
	if !defined["AWS_ACCESS_KEY_ID"] || !defined["AWS_SECRET_ACCESS_KEY"] {
		t.Errorf("DaemonSet: no S3 credentials in serve's environment")
	}
	if port, ok := metricsPort(serve); !ok {
		t.Errorf("DaemonSet: serve has no container port named metrics")
	} else if addr, _ := flag(serve.Args, "metrics"); !strings.HasSuffix(addr, ":"+strconv.Itoa(int(port.ContainerPort))) {
		t.Errorf("DaemonSet: --metrics %q, container port %d", addr, port.ContainerPort)
	}

	// Page-locked memory: every session's slab ring (what RLIMIT_MEMLOCK must allow,
	// set on the node: see TestK8sMemlock) fits the memory limit (locked pages count
	// there), and a session's ring its --memory.
	slabs, slabSize := flagOf(serve.Args, "slabs"), flagOf(serve.Args, "slab-size")
	if slabs == "" || slabSize == "" {
		t.Errorf("DaemonSet: --slabs %q, --slab-size %q: set both, so that the node's memlock limit can be sized", slabs, slabSize)
	} else {
		ns, _ := strconv.Atoi(slabs)
		ring := int64(nSessions) * int64(ns) * parseSize(t, slabSize)
		if limit := serve.Resources.Limits[corev1.ResourceMemory]; ring > limit.Value() {
			t.Errorf("DaemonSet: %d sessions x %d slabs x %s = %d MiB of locked slabs exceed the %s limit", nSessions, ns, slabSize, ring>>20, limit.String())
		}
		if ns*int(parseSize(t, slabSize)) > int(parseSize(t, mem)) {
			t.Errorf("DaemonSet: a session's slabs (%d x %s) exceed its --memory %s: serve refuses it", ns, slabSize, mem)
		}
	}
	allowed := map[int64]bool{uid(sspec, serve): true}
	for i, a := range serve.Args {
		v, ok := strings.CutPrefix(a, "--allow-uid=")
		if !ok && a == "--allow-uid" && i+1 < len(serve.Args) {
			v, ok = serve.Args[i+1], true
		}
		if ok {
			for _, u := range strings.Split(v, ",") {
				n, _ := strconv.ParseInt(u, 10, 64)
				allowed[n] = true
			}
		}
	}

	// The trainers: Indexed Jobs, one pod per node, a CPU example and a GPU example.
	if len(m.jobs) == 0 {
		t.Fatal("no Job")
	}
	var cpu, gpu int
	for _, job := range m.jobs {
		where := "Job " + job.Name
		jspec := &job.Spec.Template.Spec
		if job.Spec.CompletionMode == nil || *job.Spec.CompletionMode != batchv1.IndexedCompletion ||
			job.Spec.Completions == nil || job.Spec.Parallelism == nil || *job.Spec.Completions != *job.Spec.Parallelism {
			t.Fatalf("%s: want an Indexed Job with completions = parallelism", where)
		}
		if len(jspec.Containers) != 1 {
			t.Fatalf("%s: %d containers", where, len(jspec.Containers))
		}
		tr := &jspec.Containers[0]
		checkContainer(t, where, jspec, tr, false)
		if jspec.Affinity == nil || jspec.Affinity.PodAntiAffinity == nil {
			t.Errorf("%s: no pod anti-affinity: two pods on one node would share its server's sessions", where)
		}
		// The trainer finds the node's socket: same host path, same user as the server
		// (or a uid the server allows and whose client trusts the server's).
		tsock, ok := envOf(tr, "SHARDLOAD_SOCKET")
		if !ok {
			t.Fatalf("%s: the trainer has no SHARDLOAD_SOCKET", where)
		}
		thost, typ, ok := hostPathOf(jspec, tr, tsock)
		if !ok || thost != hostSock {
			t.Errorf("%s: the trainer's socket %s is host path %q, the server's is %q", where, tsock, thost, hostSock)
		}
		if typ != corev1.HostPathDirectory {
			t.Errorf("%s: the socket's hostPath has type %q: want Directory (the server's, never created empty)", where, typ)
		}
		if su, tu := uid(sspec, serve), uid(jspec, tr); su != tu {
			trust, _ := envOf(tr, "SHARDLOAD_TRUST_UIDS")
			if !allowed[tu] || !slicesContains(strings.Split(trust, ","), strconv.FormatInt(su, 10)) {
				t.Errorf("%s: the trainer runs as uid %d, the server as %d: want the same uid, or --allow-uid=%d on the server and SHARDLOAD_TRUST_UIDS=%d in the trainer", where, tu, su, tu, su)
			}
		}
		if q := tr.Resources.Limits[corev1.ResourceMemory]; q.Cmp(resource.MustParse("512Mi")) < 0 {
			t.Errorf("%s: memory limit %s", where, q.String())
		}

		// The image matches the resources: GPUs only with an image of CUDA and
		// PyTorch, the CPU trainer image (numpy, no PyTorch) only without.
		gpus := tr.Resources.Limits["nvidia.com/gpu"]
		cpuImage := strings.Contains(tr.Image, "/shardload-trainer:")
		torchrun := len(tr.Command) > 0 && tr.Command[0] == "torchrun"
		switch {
		case gpus.Value() > 0:
			gpu++
			if cpuImage || !strings.Contains(tr.Image, "cuda") {
				t.Errorf("%s asks for %s GPUs with image %q: want a CUDA image (not the CPU trainer image)", where, gpus.String(), tr.Image)
			}
			if !torchrun {
				t.Errorf("%s: GPUs without torchrun: command %q", where, tr.Command)
			}
		default:
			cpu++
			if !cpuImage || strings.Contains(tr.Image, "cuda") {
				t.Errorf("%s asks for no GPU: want the CPU trainer image of scripts/images.sh, not %q", where, tr.Image)
			}
			if torchrun || !slicesContains(tr.Command, "/opt/shardload/rank.py") {
				t.Errorf("%s: the CPU trainer image has no PyTorch: command %q, want rank.py", where, tr.Command)
			}
			world, _ := envOf(tr, "WORLD_SIZE")
			if world != strconv.Itoa(int(*job.Spec.Completions)) {
				t.Errorf("%s: WORLD_SIZE %q for %d pods of one rank", where, world, *job.Spec.Completions)
			}
			rankFromIndex := false
			for _, e := range tr.Env {
				rankFromIndex = rankFromIndex || (e.Name == "RANK" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil &&
					e.ValueFrom.FieldRef.FieldPath == "metadata.annotations['batch.kubernetes.io/job-completion-index']")
			}
			if !rankFromIndex {
				t.Errorf("%s: RANK is not the pod's completion index", where)
			}
		}
		if torchrun {
			checkTorchrun(t, m, job, tr, nSessions)
		}
	}
	if cpu == 0 || gpu == 0 {
		t.Errorf("%d CPU jobs and %d GPU jobs: want an example of each", cpu, gpu)
	}
}

// checkTorchrun checks a Job whose pods run torchrun: as many ranks as GPUs, within
// the server's sessions; rendezvous at pod 0 through a headless Service; /dev/shm in
// memory and sized within the memory limit; checkpoints on a shared volume.
func checkTorchrun(t *testing.T, m manifests, job *batchv1.Job, tr *corev1.Container, nSessions int) {
	t.Helper()
	where := "Job " + job.Name
	jspec := &job.Spec.Template.Spec
	if n, _ := flag(tr.Args, "nnodes"); n != strconv.Itoa(int(*job.Spec.Completions)) {
		t.Errorf("%s: --nnodes %q for %d pods", where, n, *job.Spec.Completions)
	}
	nproc, _ := flag(tr.Args, "nproc-per-node")
	gpus := tr.Resources.Limits["nvidia.com/gpu"]
	if np, err := strconv.Atoi(nproc); err != nil || int64(np) != gpus.Value() || np > nSessions {
		t.Errorf("%s: --nproc-per-node %q, %s GPUs a pod, the server serves %d sessions: want equal GPUs and ranks, within the sessions", where, nproc, gpus.String(), nSessions)
	}
	// Rendezvous at pod 0 through the headless Service.
	endpoint, _ := flag(tr.Args, "rdzv-endpoint")
	host, port, _ := strings.Cut(endpoint, ":")
	svc, ok := m.services[jspec.Subdomain]
	if !ok {
		t.Fatalf("%s: subdomain %q names no Service", where, jspec.Subdomain)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service %s is not headless", svc.Name)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set{"job-name": job.Name}) {
		t.Errorf("Service %s selects %v, not the pods of Job %s", svc.Name, svc.Spec.Selector, job.Name)
	}
	if want := job.Name + "-0." + svc.Name; host != want {
		t.Errorf("%s: rendezvous host %q, want pod 0: %s", where, host, want)
	}
	servicePort := false
	for _, p := range svc.Spec.Ports {
		servicePort = servicePort || strconv.Itoa(int(p.Port)) == port
	}
	if !servicePort {
		t.Errorf("%s: rendezvous port %q is not a port of Service %s", where, port, svc.Name)
	}
	// /dev/shm for torch.distributed, in memory, sized, within the memory limit.
	var shm *corev1.EmptyDirVolumeSource
	for _, vm := range tr.VolumeMounts {
		if vm.MountPath != "/dev/shm" {
			continue
		}
		for _, v := range jspec.Volumes {
			if v.Name == vm.Name && v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory {
				shm = v.EmptyDir
			}
		}
	}
	limit := tr.Resources.Limits[corev1.ResourceMemory]
	if shm == nil || shm.SizeLimit == nil || shm.SizeLimit.Cmp(resource.MustParse("256Mi")) < 0 || shm.SizeLimit.Cmp(limit) > 0 {
		t.Errorf("%s: /dev/shm %+v: want a memory emptyDir with a sizeLimit of 256Mi or more within the memory limit %s", where, shm, limit.String())
	}
	// Checkpoints on a volume every pod mounts.
	ckpt, _ := flag(tr.Args, "checkpoint")
	onPVC := false
	for _, vm := range tr.VolumeMounts {
		if strings.HasPrefix(ckpt, vm.MountPath+"/") {
			for _, v := range jspec.Volumes {
				if v.Name == vm.Name && v.PersistentVolumeClaim != nil {
					pvc, ok := m.pvcs[v.PersistentVolumeClaim.ClaimName]
					onPVC = ok && slicesContains(pvc.Spec.AccessModes, corev1.ReadWriteMany)
				}
			}
		}
	}
	if !onPVC {
		t.Errorf("%s: --checkpoint %q is not on a ReadWriteMany volume defined here", where, ckpt)
	}
}

func metav1LabelSelector(s *metav1.LabelSelector) (labels.Selector, error) {
	return metav1.LabelSelectorAsSelector(s)
}

// metricsPort returns serve's container port named metrics.
func metricsPort(c *corev1.Container) (corev1.ContainerPort, bool) {
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			return p, true
		}
	}
	return corev1.ContainerPort{}, false
}

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
