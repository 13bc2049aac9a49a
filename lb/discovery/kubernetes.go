package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"pdlb/engines"
	"pdlb/lb/config"
	"pdlb/lb/discovery/spec"
)

// Kubernetes is a Source of the pods an informer watches by label selector,
// read with AIBrix's labels and annotations (spec.Label*, spec.Annotation*).
// Only pods that are Running, Ready, not terminating and have an IP count,
// so a pod joins when its readiness probe passes and leaves as soon as it
// fails or the pod is being deleted.
type Kubernetes struct {
	pods      PodClient
	namespace string
	selector  labels.Selector
	log       *slog.Logger
}

// PodClient lists and watches the pods of one namespace, or of all for
// "". client-go's typed PodInterface has this shape, so its fake serves
// the tests.
type PodClient interface {
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// KubernetesPods connects with s.Kubeconfig, or with the pod's service
// account when it is empty, and returns the pods client of s.Namespace. It
// is a REST client that knows core/v1 alone: client-go's typed clients
// register every API group, which adds some 20 MB to the binary for types
// pdlb never reads.
func KubernetesPods(s spec.Kubernetes) (PodClient, error) {
	var cfg *rest.Config
	var err error
	if s.Kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("discovery: kubernetes: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	metav1.AddToGroupVersion(scheme, corev1.SchemeGroupVersion)
	cfg.UserAgent = "pdlb"
	cfg.APIPath = "/api"
	cfg.GroupVersion = &corev1.SchemeGroupVersion
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("discovery: kubernetes: %w", err)
	}
	return &restPods{rc: rc, namespace: s.Namespace}, nil
}

type restPods struct {
	rc        *rest.RESTClient
	namespace string
}

func (p *restPods) List(ctx context.Context, o metav1.ListOptions) (*corev1.PodList, error) {
	list := &corev1.PodList{}
	err := p.rc.Get().Namespace(p.namespace).Resource("pods").VersionedParams(&o, metav1.ParameterCodec).Do(ctx).Into(list)
	return list, err
}

func (p *restPods) Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	o.Watch = true
	return p.rc.Get().Namespace(p.namespace).Resource("pods").VersionedParams(&o, metav1.ParameterCodec).Watch(ctx)
}

// NewKubernetes makes the source of s, which must have passed Validate; it
// rejects a selector that does not parse, naming the field.
func NewKubernetes(pods PodClient, s spec.Kubernetes, log *slog.Logger) (*Kubernetes, error) {
	sel, err := labels.Parse(s.Selector)
	if err != nil {
		return nil, fmt.Errorf("%w: discovery.kubernetes.selector = %q: %v", spec.ErrInvalid, s.Selector, err)
	}
	return &Kubernetes{pods: pods, namespace: s.Namespace, selector: sel, log: log}, nil
}

// Run watches the pods until ctx is done. Events only wake the loop, which
// rebuilds the whole list from the informer's cache: a burst of events (a
// rollout) costs one rebuild, and the list cannot drift from the cache.
func (k *Kubernetes) Run(ctx context.Context, report func([]Pod)) error {
	// client-go logs through ctx's logger: the reflector's errors (an API
	// server down, RBAC refusing the list) go to the gateway's log rather
	// than klog's stderr.
	ctx = logr.NewContext(ctx, logr.FromSlogHandler(k.log.Handler()).WithName("discovery"))
	selector := k.selector.String()
	// The wrapper lets a client that cannot stream a list's initial events
	// (client-go's fake) say so; the reflector then lists and watches.
	informer := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return k.pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return k.pods.Watch(ctx, o)
		},
	}, k.pods), &corev1.Pod{}, 0, cache.Indexers{})
	// The cache holds every watched pod; managed fields are most of a pod's
	// size and nothing here reads them.
	if err := informer.SetTransform(func(obj any) (any, error) {
		if p, ok := obj.(*corev1.Pod); ok {
			p.ManagedFields = nil
		}
		return obj, nil
	}); err != nil {
		return err
	}
	changed := make(chan struct{}, 1)
	wake := func() {
		select {
		case changed <- struct{}{}:
		default: // a rebuild is already due
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { wake() },
		UpdateFunc: func(any, any) { wake() },
		DeleteFunc: func(any) { wake() },
	}); err != nil {
		return err
	}
	var stopped sync.WaitGroup
	defer stopped.Wait()
	stopped.Go(func() { informer.RunWithContext(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return ctx.Err()
	}
	var r rebuilder
	var last []Pod
	reported := false
	for {
		objs := informer.GetStore().List()
		pods := r.rebuild(objs, k.selector, k.log)
		if len(pods) == 0 && (!reported || len(last) > 0) {
			// Pods selected tell a mistyped namespace or selector (none)
			// from pods not ready yet.
			k.log.Warn("discovery: no Kubernetes pod to route to", "namespace", k.namespace, "selector", selector, "selected", len(objs))
		}
		if !reported || !slices.Equal(pods, last) {
			report(pods)
			last, reported = pods, true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// rebuilder turns the cached pods into the list, keeping what makes the
// next rebuild cheap and quiet.
type rebuilder struct {
	// configs maps annotation text to its parse, so the pods of one
	// deployment share one ModelConfig, parsed once, and an unchanged pod
	// compares equal from one rebuild to the next.
	configs map[string]*spec.ModelConfig
	// skipped maps a pod to why it was left out, so each reason is logged
	// once rather than on every rebuild.
	skipped map[string]string
}

func (r *rebuilder) rebuild(objs []any, sel labels.Selector, log *slog.Logger) []Pod {
	configs := make(map[string]*spec.ModelConfig, len(r.configs))
	skipped := make(map[string]string, len(r.skipped))
	pods := make([]Pod, 0, len(objs))
	for _, obj := range objs {
		kp, ok := obj.(*corev1.Pod)
		// The API server filters by the selector already; matching again
		// keeps the list right whatever a watch delivers.
		if !ok || !ready(kp) || !sel.Matches(labels.Set(kp.Labels)) {
			continue
		}
		p, err := r.podFrom(kp, configs)
		if err != nil {
			name := kp.Namespace + "/" + kp.Name
			skipped[name] = err.Error()
			if r.skipped[name] != err.Error() {
				log.Warn("discovery: pod left out", "pod", name, "err", err)
			}
			continue
		}
		pods = append(pods, p)
	}
	r.configs, r.skipped = configs, skipped
	sortByName(pods)
	return pods
}

func ready(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" || p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podFrom reads one pod as AIBrix's gateway plugin does. Errors name the label
// or annotation and quote its value.
func (r *rebuilder) podFrom(kp *corev1.Pod, configs map[string]*spec.ModelConfig) (Pod, error) {
	lbl, ann := kp.Labels, kp.Annotations
	p := Pod{Pod: config.Pod{
		Name:    kp.Namespace + "/" + kp.Name,
		UID:     string(kp.UID),
		Model:   lbl[spec.LabelModel],
		Roleset: lbl[spec.LabelRoleset],
		Weight:  1,
	}}
	if p.Model == "" {
		return p, fmt.Errorf("label %s is missing", spec.LabelModel)
	}
	port := spec.DefaultPodPort
	if v, ok := lbl[spec.LabelPort]; ok {
		var err error
		if port, err = parsePort("label "+spec.LabelPort, v); err != nil {
			return p, err
		}
	}
	p.Address = hostPort(kp.Status.PodIP, port)
	kind, err := engines.ParseKind(lbl[spec.LabelEngine])
	if err != nil {
		return p, fmt.Errorf("label %s = %q is not an engine (known: vllm, sglang, trtllm)", spec.LabelEngine, lbl[spec.LabelEngine])
	}
	p.Engine = string(kind)
	switch role := lbl[spec.LabelRole]; role {
	case spec.RolePrefill, spec.RoleDecode:
		p.Role = role
		if p.Roleset == "" {
			return p, fmt.Errorf("label %s is missing on a %s pod", spec.LabelRoleset, role)
		}
	default:
		// AIBrix: any other role-name, or none, is a standard inference
		// pod that runs both phases.
		p.Role = spec.RoleCombined
	}
	if kind == engines.SGLang {
		p.BootstrapPort = spec.DefaultBootstrapPort
		v, ok := ann[spec.AnnotationBootstrapPort]
		if !ok {
			v, ok = lbl[spec.AnnotationBootstrapPort]
		}
		if ok {
			if p.BootstrapPort, err = parsePort(spec.AnnotationBootstrapPort, v); err != nil {
				return p, err
			}
		}
	}
	if v, ok := ann[spec.AnnotationKVEventsPort]; ok {
		kv, err := parsePort("annotation "+spec.AnnotationKVEventsPort, v)
		if err != nil {
			return p, err
		}
		p.KVEvents = "tcp://" + hostPort(kp.Status.PodIP, kv)
	}
	if v, ok := ann[spec.AnnotationKVReplayPort]; ok {
		rp, err := parsePort("annotation "+spec.AnnotationKVReplayPort, v)
		if err != nil {
			return p, err
		}
		if p.KVEvents == "" {
			return p, fmt.Errorf("annotation %s = %q needs annotation %s beside it", spec.AnnotationKVReplayPort, v, spec.AnnotationKVEventsPort)
		}
		p.KVReplay = "tcp://" + hostPort(kp.Status.PodIP, rp)
	}
	if v, ok := ann[spec.AnnotationDataParallelSize]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return p, fmt.Errorf("annotation %s = %q is not a number of ranks, 1 or more", spec.AnnotationDataParallelSize, v)
		}
		p.DataParallelSize = n
		// The ranks' ports, as a configured pod's are checked.
		if err := p.Pod.Validate("pod"); err != nil {
			return p, fmt.Errorf("annotations %s, %s and %s: %w", spec.AnnotationKVEventsPort, spec.AnnotationKVReplayPort, spec.AnnotationDataParallelSize, err)
		}
	}
	if v, ok := ann[spec.AnnotationDataParallelRouting]; ok {
		if why := spec.DataParallelRoutingProblem(v); why != "" {
			return p, fmt.Errorf("annotation %s = %q %s", spec.AnnotationDataParallelRouting, v, why)
		}
		p.DataParallelRouting = v
	}
	if v, ok := ann[spec.AnnotationLoRAAdapters]; ok {
		if _, err := config.ParseAdapters(v); err != nil {
			return p, fmt.Errorf("annotation %s = %q: %v", spec.AnnotationLoRAAdapters, v, err)
		}
		p.Adapters = v
	}
	if text, ok := ann[spec.AnnotationConfig]; ok {
		mc, err := r.modelConfig(text, configs)
		if err != nil {
			return p, err
		}
		p.ModelConfig = mc
		if prof, ok := mc.Profile(""); ok {
			p.BucketMin = prof.RoutingConfig.PromptLenBucketMinLength
			p.BucketMax = prof.RoutingConfig.PromptLenBucketMaxLength
		}
	}
	return p, nil
}

// modelConfig parses an annotation once per distinct text and carries the
// parse over to the next rebuild.
func (r *rebuilder) modelConfig(text string, configs map[string]*spec.ModelConfig) (*spec.ModelConfig, error) {
	if mc, ok := configs[text]; ok {
		return mc, nil
	}
	mc, ok := r.configs[text]
	if !ok {
		var err error
		if mc, err = spec.ParseModelConfig([]byte(text)); err != nil {
			return nil, err
		}
	}
	configs[text] = mc
	return mc, nil
}

func parsePort(what, v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("%s = %q is not a port", what, v)
	}
	return n, nil
}
