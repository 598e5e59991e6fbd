package validate

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
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
