package validate

import (
	"path"
	"regexp"
	"strconv"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

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
