package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"pdlb/internal/testlog"
	"pdlb/internal/testwait"
	"pdlb/lb/discovery/spec"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// fakePods is the fake clientset's pods client of one namespace; like the
// clientset, it tells the reflector that it cannot stream a list's initial
// events.
type fakePods struct{ corev1client.PodInterface }

func (fakePods) IsWatchListSemanticsUnSupported() bool { return true }

// kpod makes a Running, Ready pod with an IP and AIBrix's labels.
func kpod(name, ip string, labels map[string]string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "inference", Name: name, UID: types.UID("uid-" + name), Labels: labels, Annotations: annotations},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			PodIP:      ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
}

func pdLabels(role, roleset string) map[string]string {
	return map[string]string{
		spec.LabelModel: "my-model", spec.LabelPort: "8000", spec.LabelEngine: "vllm",
		spec.LabelRole: role, spec.LabelRoleset: roleset,
	}
}

// watcher runs a source and hands out its reports.
type watcher struct {
	t       *testing.T
	reports chan []Pod
	done    chan error
}

func follow(t *testing.T, s Source) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{t: t, reports: make(chan []Pod, 64), done: make(chan error, 1)}
	go func() { w.done <- s.Run(ctx, func(p []Pod) { w.reports <- p }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-w.done; err != context.Canceled {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
	})
	return w
}

// next waits for the next report (the deadline only keeps a broken source
// from hanging the test; nothing is timed).
func (w *watcher) next() []Pod {
	w.t.Helper()
	select {
	case p := <-w.reports:
		return p
	case err := <-w.done:
		w.t.Fatalf("Run ended: %v", err)
	case <-time.After(30 * time.Second):
		w.t.Fatal("no report")
	}
	return nil
}

// expect waits for a report equal to want, in "name role roleset address"
// lines; reports on the way (e.g. one per step of a multi-step change) are
// skipped.
func (w *watcher) expect(want ...string) []Pod {
	w.t.Helper()
	for {
		pods := w.next()
		if got := describe(pods); got == strings.Join(want, "\n") {
			return pods
		}
	}
}

func describe(pods []Pod) string {
	var lines []string
	for _, p := range pods {
		lines = append(lines, strings.Join([]string{p.Name, p.Model, p.Engine, p.Role, p.Roleset, p.Address}, " "))
	}
	return strings.Join(lines, "\n")
}

func TestKubernetesPodsComeAndGo(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(
		kpod("p0", "10.0.0.1", pdLabels("prefill", "group-0"), nil),
		kpod("unrelated", "10.0.0.9", map[string]string{"app": "redis"}, nil),
	)
	k, err := NewKubernetes(fakePods{client.CoreV1().Pods("inference")}, spec.Kubernetes{Namespace: "inference", Selector: spec.DefaultSelector}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	w := follow(t, k)
	// The UID is the pod's identity across reloads (pool.Build).
	if p := w.expect("inference/p0 my-model vllm prefill group-0 10.0.0.1:8000"); p[0].UID != "uid-p0" {
		t.Fatalf("UID %q, want uid-p0", p[0].UID)
	}

	pods := client.CoreV1().Pods("inference")
	// Added: a decode pod, and a pod that is not ready yet.
	if _, err := pods.Create(ctx, kpod("d0", "10.0.0.2", pdLabels("decode", "group-0"), nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	starting := kpod("c0", "", map[string]string{spec.LabelModel: "my-model", spec.LabelEngine: "sglang"}, nil)
	starting.Status.Phase = corev1.PodPending
	if _, err := pods.Create(ctx, starting, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.expect(
		"inference/d0 my-model vllm decode group-0 10.0.0.2:8000",
		"inference/p0 my-model vllm prefill group-0 10.0.0.1:8000",
	)
	// The pending pod starts: a combined SGLang pod on the default port.
	starting.Status = kpod("", "10.0.0.3", nil, nil).Status
	if _, err := pods.UpdateStatus(ctx, starting, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got := w.expect(
		"inference/c0 my-model sglang combined  10.0.0.3:8000",
		"inference/d0 my-model vllm decode group-0 10.0.0.2:8000",
		"inference/p0 my-model vllm prefill group-0 10.0.0.1:8000",
	)
	if got[0].BootstrapPort != spec.DefaultBootstrapPort || got[1].BootstrapPort != 0 {
		t.Fatalf("bootstrap ports: %+v", got)
	}
	// Relabelled: the prefill pod moves to another roleset and port.
	p0, err := pods.Get(ctx, "p0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p0.Labels[spec.LabelRoleset] = "group-1"
	p0.Labels[spec.LabelPort] = "8100"
	if _, err := pods.Update(ctx, p0, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.expect(
		"inference/c0 my-model sglang combined  10.0.0.3:8000",
		"inference/d0 my-model vllm decode group-0 10.0.0.2:8000",
		"inference/p0 my-model vllm prefill group-1 10.0.0.1:8100",
	)
	// Relabelled out of the selector: the pod leaves.
	delete(p0.Labels, spec.LabelModel)
	if _, err := pods.Update(ctx, p0, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.expect(
		"inference/c0 my-model sglang combined  10.0.0.3:8000",
		"inference/d0 my-model vllm decode group-0 10.0.0.2:8000",
	)
	// Not ready any more: its readiness probe fails.
	d0, err := pods.Get(ctx, "d0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d0.Status.Conditions[0].Status = corev1.ConditionFalse
	if _, err := pods.UpdateStatus(ctx, d0, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.expect("inference/c0 my-model sglang combined  10.0.0.3:8000")
	// Terminating: it leaves before it is gone.
	c0, err := pods.Get(ctx, "c0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c0.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	if _, err := pods.Update(ctx, c0, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.expect()
	// Deleted, and a new ready pod: only the new one.
	if err := pods.Delete(ctx, "c0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, kpod("c1", "fd00::5", map[string]string{spec.LabelModel: "other"}, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.expect("inference/c1 other vllm combined  [fd00::5]:8000")
}

func TestKubernetesAnnotations(t *testing.T) {
	short := `{"defaultProfile": "pd", "profiles": {
		"default": {"routingStrategy": "random", "routingConfig": {"promptLenBucketMaxLength": 4096}},
		"pd": {"routingStrategy": "pd", "routingConfig": {"promptLenBucketMinLength": 0, "promptLenBucketMaxLength": 2048}}}}`
	long := `{"profiles": {"default": {"routingStrategy": "pd", "routingConfig": {"combined": true, "promptLenBucketMinLength": 2048}}}}`
	sgl := pdLabels("prefill", "g0")
	sgl[spec.LabelEngine] = "sglang"
	client := fake.NewClientset(
		kpod("p0", "10.0.0.1", pdLabels("prefill", "g0"), map[string]string{spec.AnnotationConfig: short, spec.AnnotationKVEventsPort: "5557"}),
		kpod("d0", "10.0.0.2", pdLabels("decode", "g0"), map[string]string{spec.AnnotationConfig: short, spec.AnnotationLoRAAdapters: "sql, fin=/loras/fin"}),
		kpod("c0", "10.0.0.3", map[string]string{spec.LabelModel: "my-model", spec.LabelRole: "all"}, map[string]string{spec.AnnotationConfig: long}),
		kpod("s0", "10.0.0.4", sgl, map[string]string{spec.AnnotationBootstrapPort: "9001"}),
		// Left out, each for a reason that is logged.
		kpod("bad-json", "10.0.0.5", pdLabels("decode", "g0"), map[string]string{spec.AnnotationConfig: `{"profiles": `}),
		kpod("bad-port", "10.0.0.6", map[string]string{spec.LabelModel: "m", spec.LabelPort: "http"}, nil),
		kpod("bad-engine", "10.0.0.7", map[string]string{spec.LabelModel: "m", spec.LabelEngine: "tgi"}, nil),
		kpod("no-roleset", "10.0.0.8", map[string]string{spec.LabelModel: "m", spec.LabelRole: "decode"}, nil),
		kpod("bad-bootstrap", "10.0.0.9", sgl, map[string]string{spec.AnnotationBootstrapPort: "0"}),
		kpod("bad-kv", "10.0.0.10", map[string]string{spec.LabelModel: "m"}, map[string]string{spec.AnnotationKVEventsPort: "x"}),
		kpod("bad-lora", "10.0.0.11", map[string]string{spec.LabelModel: "m"}, map[string]string{spec.AnnotationLoRAAdapters: "sql,sql"}),
		kpod("dp", "10.0.0.12", map[string]string{spec.LabelModel: "my-model"},
			map[string]string{spec.AnnotationKVEventsPort: "5557", spec.AnnotationKVReplayPort: "5600", spec.AnnotationDataParallelSize: "4"}),
		kpod("bad-dp", "10.0.0.13", map[string]string{spec.LabelModel: "m"}, map[string]string{spec.AnnotationDataParallelSize: "0"}),
		kpod("dp-no-replay", "10.0.0.14", map[string]string{spec.LabelModel: "m"},
			map[string]string{spec.AnnotationKVEventsPort: "5557", spec.AnnotationDataParallelSize: "2"}),
		kpod("replay-alone", "10.0.0.15", map[string]string{spec.LabelModel: "m"}, map[string]string{spec.AnnotationKVReplayPort: "5600"}),
	)
	var logged testlog.Buffer
	k, err := NewKubernetes(fakePods{client.CoreV1().Pods("")}, spec.Kubernetes{Selector: spec.DefaultSelector}, slog.New(slog.NewTextHandler(&logged, nil)))
	if err != nil {
		t.Fatal(err)
	}
	w := follow(t, k)
	pods := w.expect(
		"inference/c0 my-model vllm combined  10.0.0.3:8000",
		"inference/d0 my-model vllm decode g0 10.0.0.2:8000",
		"inference/dp my-model vllm combined  10.0.0.12:8000",
		"inference/p0 my-model vllm prefill g0 10.0.0.1:8000",
		"inference/s0 my-model sglang prefill g0 10.0.0.4:8000",
	)
	c0, d0, dp, p0, s0 := pods[0], pods[1], pods[2], pods[3], pods[4]
	if dp.KVEvents != "tcp://10.0.0.12:5557" || dp.KVReplay != "tcp://10.0.0.12:5600" || dp.DataParallelSize != 4 || p0.DataParallelSize != 0 {
		t.Errorf("data-parallel pod: %+v", dp)
	}
	if c0.BucketMin != 2048 || c0.BucketMax != 0 || !c0.ModelConfig.Profiles["default"].RoutingConfig.Combined {
		t.Errorf("combined pod: %+v", c0)
	}
	// The default profile is "pd": its bounds, not those of "default".
	if p0.BucketMin != 0 || p0.BucketMax != 2048 || p0.KVEvents != "tcp://10.0.0.1:5557" || d0.KVEvents != "" {
		t.Errorf("prefill pod: %+v", p0)
	}
	if d0.Adapters != "sql, fin=/loras/fin" || p0.Adapters != "" {
		t.Errorf("adapters: decode pod %q, prefill pod %q", d0.Adapters, p0.Adapters)
	}
	if p0.ModelConfig != d0.ModelConfig {
		t.Error("one annotation text must be parsed once and shared")
	}
	if s0.BootstrapPort != 9001 || s0.ModelConfig != nil {
		t.Errorf("sglang pod: %+v", s0)
	}
	for _, want := range []string{
		`pod=inference/bad-json err="discovery: invalid: model.aibrix.ai/config`,
		`pod=inference/bad-port err="label model.aibrix.ai/port = \"http\" is not a port"`,
		`pod=inference/bad-engine err="label model.aibrix.ai/engine = \"tgi\" is not an engine`,
		`pod=inference/no-roleset err="label roleset-name is missing on a decode pod"`,
		`pod=inference/bad-bootstrap err="model.aibrix.ai/sglang-bootstrap-port = \"0\" is not a port"`,
		`pod=inference/bad-kv err="annotation pdlb/kv-events-port = \"x\" is not a port"`,
		`pod=inference/bad-lora err="annotation pdlb/lora-adapters = \"sql,sql\": adapter \"sql\" is listed twice"`,
		`pod=inference/bad-dp err="annotation pdlb/data-parallel-size = \"0\" is not a number of ranks, 1 or more"`,
		`pod=inference/dp-no-replay err="annotations pdlb/kv-events-port, pdlb/kv-replay-port and pdlb/data-parallel-size: config: invalid: pod.kv_replay = \"\" puts the replay sockets of ranks 0 to 1 on ports 5558 to 5559`,
		`pod=inference/replay-alone err="annotation pdlb/kv-replay-port = \"5600\" needs annotation pdlb/kv-events-port beside it"`,
	} {
		if !strings.Contains(logged.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, logged.String())
		}
	}
}

func TestNewKubernetesRejectsSelector(t *testing.T) {
	_, err := NewKubernetes(fakePods{fake.NewClientset().CoreV1().Pods("")}, spec.Kubernetes{Selector: "a in (b"}, quiet)
	if err == nil || !strings.Contains(err.Error(), `discovery.kubernetes.selector = "a in (b"`) {
		t.Fatalf("err = %v", err)
	}
}

// TestKubernetesPodsOverHTTP runs the production client (kubeconfig, the
// core/v1-only REST client, list then watch) against a fake API server on
// loopback.
func TestKubernetesPodsOverHTTP(t *testing.T) {
	events := make(chan *corev1.Pod)
	withKind := func(p *corev1.Pod) *corev1.Pod {
		p.TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
		return p
	}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if r.URL.Path != "/api/v1/namespaces/inference/pods" || q.Get("labelSelector") != spec.DefaultSelector {
			http.Error(w, "unexpected "+r.URL.String(), http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch {
		case q.Get("watch") == "" || q.Get("watch") == "false":
			json.NewEncoder(w).Encode(&corev1.PodList{
				TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"},
				ListMeta: metav1.ListMeta{ResourceVersion: "1"},
				Items:    []corev1.Pod{*withKind(kpod("p0", "10.0.0.1", pdLabels("prefill", "g0"), nil))},
			})
		case q.Get("sendInitialEvents") == "true":
			// An API server without streaming lists: the reflector lists.
			http.Error(w, "sendInitialEvents is not supported", http.StatusBadRequest)
		default:
			w.(http.Flusher).Flush()
			for {
				select {
				case <-r.Context().Done():
					return
				case p := <-events:
					json.NewEncoder(w).Encode(map[string]any{"type": "ADDED", "object": p})
					w.(http.Flusher).Flush()
				}
			}
		}
	}))
	t.Cleanup(api.Close)
	w := follow(t, overHTTP(t, api.URL, quiet))
	w.expect("inference/p0 my-model vllm prefill g0 10.0.0.1:8000")
	d0 := withKind(kpod("d0", "10.0.0.2", pdLabels("decode", "g0"), nil))
	d0.ResourceVersion = "2"
	events <- d0
	w.expect(
		"inference/d0 my-model vllm decode g0 10.0.0.2:8000",
		"inference/p0 my-model vllm prefill g0 10.0.0.1:8000",
	)
}

// overHTTP is the source of the pods of namespace "inference" that the
// default selector picks, through the production client, from the API
// server at url.
func overHTTP(t *testing.T, url string, log *slog.Logger) *Kubernetes {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: %q}}]
users: [{name: test, user: {}}]
contexts: [{name: test, context: {cluster: test, user: test}}]
current-context: test
`, url), 0o600); err != nil {
		t.Fatal(err)
	}
	s := spec.Kubernetes{Namespace: "inference", Selector: spec.DefaultSelector, Kubeconfig: kubeconfig}
	pods, err := KubernetesPods(s)
	if err != nil {
		t.Fatal(err)
	}
	k, err := NewKubernetes(pods, s, log)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestKubernetesErrorsInTheLog: an API server that refuses the list (RBAC
// without list on pods) is named in the gateway's log, where an operator
// looks, not only on klog's stderr.
func TestKubernetesErrorsInTheLog(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		json.NewEncoder(w).Encode(&metav1.Status{
			TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Reason: metav1.StatusReasonForbidden, Code: http.StatusForbidden,
			Message: `pods is forbidden: User "system:serviceaccount:inference:pdlb" cannot list resource "pods" in API group "" in the namespace "inference"`,
		})
	}))
	t.Cleanup(api.Close)
	var logged testlog.Buffer
	follow(t, overHTTP(t, api.URL, slog.New(slog.NewTextHandler(&logged, nil))))
	testwait.For(t, "the refusal in the log", func() bool {
		return strings.Contains(logged.String(), `cannot list resource \"pods\"`)
	})
}

// TestKubernetesNoPodLogged: a source with no pod to route to says so,
// with how many pods its namespace and selector pick, so a mistyped
// namespace or selector (none picked) tells itself from pods not ready
// yet; once when it starts so, and again each time its last pod leaves.
func TestKubernetesNoPodLogged(t *testing.T) {
	ctx := context.Background()
	starting := kpod("c0", "", map[string]string{spec.LabelModel: "my-model"}, nil)
	starting.Status.Phase = corev1.PodPending
	client := fake.NewClientset(starting)
	var logged testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	k, err := NewKubernetes(fakePods{client.CoreV1().Pods("inference")}, spec.Kubernetes{Namespace: "inference", Selector: spec.DefaultSelector}, log)
	if err != nil {
		t.Fatal(err)
	}
	noPod := func(want int, selected string) {
		t.Helper()
		line := `msg="discovery: no Kubernetes pod to route to" namespace=inference selector=model.aibrix.ai/name selected=` + selected
		if n := strings.Count(logged.String(), "no Kubernetes pod"); n != want || !strings.Contains(logged.String(), line) {
			t.Fatalf("want %d lines, the last with %s:\n%s", want, line, logged.String())
		}
	}
	w := follow(t, k)
	w.expect()
	noPod(1, "1")
	pods := client.CoreV1().Pods("inference")
	if _, err := pods.Create(ctx, kpod("p0", "10.0.0.1", pdLabels("prefill", "g0"), nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.expect("inference/p0 my-model vllm prefill g0 10.0.0.1:8000")
	// c0 first: the cache that lacks p0 lacks it too.
	for _, name := range []string{"c0", "p0"} {
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	w.expect()
	noPod(2, "0")
}
