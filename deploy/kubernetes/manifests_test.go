// Package kubernetes_test checks the example manifests: each decodes
// strictly into client-go's types, and they agree with each other (names,
// namespaces, ports, the config file's path) and with pdlb's config.
package kubernetes_test

import (
	"bufio"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"pdlb/lb/config"
	"pdlb/lb/discovery/spec"
)

// decodeAll decodes every document of every manifest under the folder,
// strictly: an unknown or duplicated field fails, as a typo would be
// silently dropped by kubectl's lenient decoding otherwise.
func decodeAll(t *testing.T) []runtime.Object {
	t.Helper()
	paths, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	more, err := filepath.Glob("*/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	paths = append(paths, more...)
	decoder := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	var objs []runtime.Object
	for _, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		r := k8syaml.NewYAMLReader(bufio.NewReader(f))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if strings.TrimSpace(string(doc)) == "" {
				continue
			}
			obj, _, err := decoder.Decode(doc, nil, nil)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			objs = append(objs, obj)
		}
		f.Close()
	}
	return objs
}

func TestManifests(t *testing.T) {
	var (
		dep     *appsv1.Deployment
		svc     *corev1.Service
		sa      *corev1.ServiceAccount
		cm      *corev1.ConfigMap
		role    *rbacv1.Role
		rb      *rbacv1.RoleBinding
		crole   *rbacv1.ClusterRole
		crb     *rbacv1.ClusterRoleBinding
		unknown []string
	)
	for _, obj := range decodeAll(t) {
		switch o := obj.(type) {
		case *appsv1.Deployment:
			dep = o
		case *corev1.Service:
			svc = o
		case *corev1.ServiceAccount:
			sa = o
		case *corev1.ConfigMap:
			cm = o
		case *rbacv1.Role:
			role = o
		case *rbacv1.RoleBinding:
			rb = o
		case *rbacv1.ClusterRole:
			crole = o
		case *rbacv1.ClusterRoleBinding:
			crb = o
		default:
			unknown = append(unknown, obj.GetObjectKind().GroupVersionKind().Kind)
		}
	}
	if dep == nil || svc == nil || sa == nil || cm == nil || role == nil || rb == nil || crole == nil || crb == nil || unknown != nil {
		t.Fatalf("want one of each kind: deployment %v service %v sa %v configmap %v role %v binding %v clusterrole %v clusterbinding %v; unexpected %v",
			dep != nil, svc != nil, sa != nil, cm != nil, role != nil, rb != nil, crole != nil, crb != nil, unknown)
	}
	ns := dep.Namespace

	// The gateway runs as the account the bindings name.
	pod := dep.Spec.Template
	if pod.Spec.ServiceAccountName != sa.Name || sa.Namespace != ns {
		t.Errorf("serviceAccountName %q, account %s/%s", pod.Spec.ServiceAccountName, sa.Namespace, sa.Name)
	}
	for _, subjects := range [][]rbacv1.Subject{rb.Subjects, crb.Subjects} {
		if len(subjects) != 1 || subjects[0].Kind != "ServiceAccount" || subjects[0].Name != sa.Name || subjects[0].Namespace != ns {
			t.Errorf("binding subjects %+v do not name the service account", subjects)
		}
	}
	if rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != role.Name || role.Namespace != ns || rb.Namespace != ns {
		t.Errorf("role binding %+v does not bind role %s/%s", rb.RoleRef, role.Namespace, role.Name)
	}
	if crb.RoleRef.Kind != "ClusterRole" || crb.RoleRef.Name != crole.Name {
		t.Errorf("cluster role binding %+v does not bind %s", crb.RoleRef, crole.Name)
	}
	// The informer lists and watches pods.
	for _, rules := range [][]rbacv1.PolicyRule{role.Rules, crole.Rules} {
		ok := false
		for _, r := range rules {
			ok = ok || (slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, "pods") &&
				slices.Contains(r.Verbs, "list") && slices.Contains(r.Verbs, "watch"))
		}
		if !ok {
			t.Errorf("rules %+v do not allow list and watch on pods", rules)
		}
	}

	// serve reads the ConfigMap's file where the volume puts it.
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("containers: %d", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if len(c.Args) != 5 || c.Args[0] != "serve" || c.Args[1] != "--config" || c.Args[3] != "--shutdown-delay" {
		t.Fatalf("args %q, want serve --config FILE --shutdown-delay D", c.Args)
	}
	// The grace period covers the drain and the default shutdown timeout
	// (30 s) after it, or the kubelet kills streams pdlb still finishes.
	delay, err := time.ParseDuration(c.Args[4])
	if err != nil {
		t.Fatalf("--shutdown-delay %q: %v", c.Args[4], err)
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < delay+30*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v is shorter than --shutdown-delay %v plus the 30 s shutdown timeout", g, delay)
	}
	dir, file := filepath.Split(c.Args[2])
	mounted := false
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Spec.Volumes {
			mounted = mounted || (v.Name == m.Name && filepath.Clean(m.MountPath) == filepath.Clean(dir) &&
				v.ConfigMap != nil && v.ConfigMap.Name == cm.Name)
		}
	}
	if !mounted || cm.Namespace != ns {
		t.Errorf("%s is not the ConfigMap %s/%s mounted", c.Args[2], cm.Namespace, cm.Name)
	}
	text, ok := cm.Data[file]
	if !ok {
		t.Fatalf("ConfigMap has no %s", file)
	}

	// pdlb serve takes the config as it is, and it listens where the ports
	// and probes say, and discovers the pods of the namespace the Role
	// covers.
	cfg := config.Default()
	if err := cfg.UnmarshalYAML([]byte(text)); err != nil {
		t.Fatal(err)
	}
	cfg.Provision()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("pdlb serve refuses the ConfigMap's %s: %v", file, err)
	}
	if k := cfg.Discovery.Kubernetes; k == nil || k.Namespace != role.Namespace || k.Selector != spec.LabelModel {
		t.Errorf("discovery.kubernetes = %+v, want namespace %q and AIBrix's model label", k, role.Namespace)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if !strings.HasSuffix(cfg.Listen, ":8080") || ports["http"] != 8080 || !strings.HasSuffix(cfg.Metrics, ":9100") || ports["metrics"] != 9100 {
		t.Errorf("listen %q metrics %q vs container ports %v", cfg.Listen, cfg.Metrics, ports)
	}
	for _, probe := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Port.StrVal != "http" {
			t.Errorf("probe %+v must GET the API port", probe)
		}
	}
	if pod.Annotations["prometheus.io/port"] != "9100" || pod.Annotations["prometheus.io/path"] != "/metrics" {
		t.Errorf("scrape annotations %v", pod.Annotations)
	}

	// The Service reaches the gateway's API port.
	for k, v := range svc.Spec.Selector {
		if pod.Labels[k] != v || dep.Spec.Selector.MatchLabels[k] != v {
			t.Errorf("service selector %s=%s does not match the pods", k, v)
		}
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.StrVal != "http" || svc.Namespace != ns {
		t.Errorf("service ports %+v", svc.Spec.Ports)
	}
}
