// Package discovery finds the gateway's pods besides the static ones of the
// config file: DNS names resolved periodically, and pods watched through
// the Kubernetes API by label selector, read with AIBrix's labels and
// annotations so a deployment made for that router is found unchanged.
// Every Source reports the full current list of pods whenever it changes;
// the gateway rebuilds its pool snapshot from each list.
package discovery

import (
	"cmp"
	"context"
	"log/slog"
	"net"
	"slices"
	"strconv"

	"pdlb/lb/config"
	"pdlb/lb/discovery/spec"
)

// Pod is one discovered pod: the fields a static pod has, and those only
// discovery finds out.
type Pod struct {
	// config.Pod is all the gateway takes (lb.Server): a field the pod
	// needs at run time (an SGLang pod's BootstrapPort) belongs in it.
	config.Pod
	// ModelConfig is the pod's model.aibrix.ai/config annotation; nil when
	// it has none, and always from DNS. The pod's BucketMin, BucketMax
	// follow its default profile; a request that names another profile
	// reads that profile's routingConfig here. Pods with the same
	// annotation text share one value: treat it as read-only.
	ModelConfig *spec.ModelConfig
}

// Source discovers pods.
type Source interface {
	// Run reports the full current list of pods, sorted by name, through
	// report: first once the source has a complete view (a synced cache,
	// a first answer), even an empty one, then whenever the list changes.
	// It returns when ctx is done, with ctx.Err(), or earlier only for an
	// error that ends discovery for good. One Run never calls report
	// concurrently, and never touches a slice after passing it on.
	Run(ctx context.Context, report func([]Pod)) error
}

// New makes one Source of everything d configures: each DNS name, and
// Kubernetes (the config file's own pods are the server's to add, as a
// reload replaces them). d must have passed Validate.
func New(d spec.Discovery, log *slog.Logger) (Source, error) {
	var sources []Source
	for _, s := range d.DNS {
		sources = append(sources, NewDNS(s, nil, log))
	}
	if d.Kubernetes != nil {
		pods, err := KubernetesPods(*d.Kubernetes)
		if err != nil {
			return nil, err
		}
		k, err := NewKubernetes(pods, *d.Kubernetes, log)
		if err != nil {
			return nil, err
		}
		sources = append(sources, k)
	}
	return Union(log, sources...), nil
}

// Union returns a Source that runs every source and reports the union of
// their latest lists each time one of them reports, from the first report
// of any (a source that has not reported yet adds nothing). Names must be
// unique across sources: of two pods with one name, the earlier source's
// is kept and the other logged. Run returns the first error that ends a
// source early, after stopping the others.
func Union(log *slog.Logger, sources ...Source) Source {
	return &union{sources: sources, log: log}
}

type union struct {
	sources []Source
	log     *slog.Logger
}

type sourceReport struct {
	i    int
	pods []Pod
}

func (u *union) Run(ctx context.Context, report func([]Pod)) error {
	if len(u.sources) == 0 {
		report(nil)
		<-ctx.Done()
		return ctx.Err()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reports := make(chan sourceReport)
	errs := make(chan error, len(u.sources))
	for i, s := range u.sources {
		go func() {
			errs <- s.Run(ctx, func(pods []Pod) {
				select {
				case reports <- sourceReport{i, pods}:
				case <-ctx.Done():
				}
			})
		}()
	}
	latest := make([][]Pod, len(u.sources))
	running := len(u.sources)
	var firstErr error
	for running > 0 {
		select {
		case r := <-reports:
			latest[r.i] = r.pods
			report(u.merge(latest))
		case err := <-errs:
			running--
			if err != nil && firstErr == nil && ctx.Err() == nil {
				firstErr = err
				cancel()
			}
		}
	}
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

func (u *union) merge(lists [][]Pod) []Pod {
	var all []Pod
	seen := map[string]bool{}
	for _, l := range lists {
		for _, p := range l {
			if seen[p.Name] {
				u.log.Warn("discovery: pod name found twice, the first kept", "pod", p.Name, "address", p.Address)
				continue
			}
			seen[p.Name] = true
			all = append(all, p)
		}
	}
	sortByName(all)
	return all
}

func sortByName(pods []Pod) {
	slices.SortFunc(pods, func(a, b Pod) int { return cmp.Compare(a.Name, b.Name) })
}

// hostPort joins a host and a port, bracketing IPv6 addresses.
func hostPort(host string, port int) string {
	return net.JoinHostPort(host, strconv.Itoa(port))
}
