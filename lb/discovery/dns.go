package discovery

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"pdlb/lb/config"
	"pdlb/lb/discovery/spec"
)

// DNS is a Source of the pods behind one name: its A or AAAA records (as
// its Family says) with a fixed port, or its SRV records, resolved every
// Interval.
type DNS struct {
	spec     spec.DNS
	resolver *net.Resolver
	log      *slog.Logger
}

// NewDNS makes the source of s, which must have been provisioned and have
// passed Validate. Its lookups go to the name servers of /etc/resolv.conf,
// or to the one that dial connects to where it is not nil (tests point it
// at a server on loopback).
func NewDNS(s spec.DNS, dial func(ctx context.Context, network, address string) (net.Conn, error), log *slog.Logger) *DNS {
	// StrictErrors: an A or AAAA query (or a name of the search list) that
	// fails fails the lookup, which keeps the last pods; otherwise the
	// other query's answer (family all asks both at once), or its "no
	// such host", would stand for the name's records and shrink or empty
	// the pool. It is a setting of the Go resolver, hence PreferGo.
	r := &net.Resolver{PreferGo: true, StrictErrors: true, Dial: dial}
	return &DNS{spec: s, resolver: r, log: log}
}

// Run resolves the name at once and then every Interval. A failed lookup
// keeps the last list, since a resolver that hiccups must not empty the
// pool; a name that does not exist (NXDOMAIN, or no records) has no pods.
func (d *DNS) Run(ctx context.Context, report func([]Pod)) error {
	tick := time.NewTicker(d.spec.Interval)
	defer tick.Stop()
	var last []Pod
	reported := false
	var lastErr string
	for {
		pods, err := d.resolve(ctx)
		if err != nil {
			// Logged once per outage and distinct error, not once per
			// interval.
			if msg := err.Error(); msg != lastErr && ctx.Err() == nil {
				// Before any lookup succeeded there is no list to keep.
				what := "discovery: DNS lookup failed, keeping the last pods"
				if !reported {
					what = "discovery: DNS lookup failed, no pods from this name until one succeeds"
				}
				d.log.Warn(what, "name", d.spec.Name, "pods", len(last), "err", err)
				lastErr = msg
			}
		} else {
			lastErr = ""
			if !reported || !slices.Equal(pods, last) {
				report(pods)
				last, reported = pods, true
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// resolve looks the name up once, bounded by the interval so a hung
// resolver cannot stall the next round.
func (d *DNS) resolve(ctx context.Context) ([]Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, d.spec.Interval)
	defer cancel()
	var hosts []string
	var ports []int
	if d.spec.Type == spec.DNSTypeSRV {
		_, srvs, err := d.resolver.LookupSRV(ctx, "", "", d.spec.Name)
		if notFound(err) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		for _, s := range srvs {
			if s.Target == "." {
				continue // the service is not available there (RFC 2782)
			}
			hosts = append(hosts, strings.TrimSuffix(s.Target, "."))
			ports = append(ports, int(s.Port))
		}
	} else {
		ips, err := d.lookupFamily(ctx)
		if noAddress(err) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		for _, ip := range ips {
			hosts = append(hosts, ip.String())
			ports = append(ports, d.spec.Port)
		}
	}
	pods := make([]Pod, 0, len(hosts))
	for i, host := range hosts {
		addr := hostPort(host, ports[i])
		p := Pod{
			Pod: config.Pod{
				Name:          addr,
				Model:         d.spec.Model,
				Address:       addr,
				Engine:        d.spec.Engine,
				Role:          d.spec.Role,
				Roleset:       d.spec.Roleset,
				Weight:        1,
				BootstrapPort: d.spec.BootstrapPort,
			},
		}
		if d.spec.KVEventsPort != 0 {
			p.KVEvents = "tcp://" + hostPort(host, d.spec.KVEventsPort)
			p.DataParallelSize = d.spec.DataParallelSize
			p.DataParallelRouting = d.spec.DataParallelRouting
		}
		if d.spec.KVReplayPort != 0 {
			p.KVReplay = "tcp://" + hostPort(host, d.spec.KVReplayPort)
		}
		pods = append(pods, p)
	}
	sortByName(pods)
	// A name may list one address twice (A records, or SRV records that
	// differ only in priority or weight): one pod each.
	return slices.CompactFunc(pods, func(a, b Pod) bool { return a.Name == b.Name }), nil
}

// lookupFamily resolves the name in the networks of its family in turn
// and returns the addresses of the first that has any; a lookup that
// fails ends it, so a failed A query never falls back to AAAA records.
func (d *DNS) lookupFamily(ctx context.Context) ([]net.IP, error) {
	var err error
	for _, network := range d.spec.Networks() {
		var ips []net.IP
		ips, err = d.resolver.LookupIP(ctx, network, d.spec.Name)
		if !noAddress(err) {
			return ips, err
		}
	}
	return nil, err
}

// noAddress reports whether err says the name has no address: no such
// name or records, or, as an AddrError, none of the family asked for
// (the name is a literal of the other family, or /etc/hosts lists it only
// with one).
func noAddress(err error) bool {
	var ae *net.AddrError
	return notFound(err) || errors.As(err, &ae)
}

func notFound(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de) && de.IsNotFound
}
