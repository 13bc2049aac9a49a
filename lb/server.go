// Package lb assembles the gateway: the front end, the admin listener and
// the request path, started and stopped as one Server.
package lb

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"pdlb/lb/config"
	"pdlb/lb/discovery"
	"pdlb/lb/frontend"
	"pdlb/lb/gateway"
	"pdlb/lb/limits"
)

// abortWait is how long streams cut at the end of a shutdown have to send
// their error event and close.
const abortWait = 2 * time.Second

// Server is a running gateway.
type Server struct {
	Gateway *gateway.Gateway
	front   frontend.Server
	admin   *http.Server
	adminLn net.Listener
	// metrics serves metricsLn, when cfg.Metrics is set.
	metrics   *http.Server
	metricsLn net.Listener
	done      chan error
	stopped   chan struct{}

	shutdown    sync.Once
	shutdownErr error
	// discovery, when configured, runs until Shutdown cancels it.
	stopDiscovery context.CancelFunc
	discovered    chan struct{}
	// fleetMu orders the fleet's two sources while discovery runs: the
	// configuration's own pods (static, replaced by a reload) and
	// discovery's last list (found, nil before its first), each fleet
	// update made of both; log says which found pods that leaves out.
	fleetMu       sync.Mutex
	static, found []config.Pod
	log           *slog.Logger
	tls           *listenerTLS
}

// Start validates cfg, binds its listeners and serves until Shutdown.
func Start(cfg config.Config, log *slog.Logger) (*Server, error) {
	cfg.Provision()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	warnShared(log, "listen", cfg.Listen)
	warnShared(log, "admin", cfg.Admin)
	warnShared(log, "metrics", cfg.Metrics)
	var lns httpListeners
	err := lns.listen(cfg)
	if err == nil {
		var lt *listenerTLS
		if lt, err = loadTLS(cfg.TLS, log); err == nil {
			var g *gateway.Gateway
			if g, err = gateway.New(cfg, log); err == nil {
				return start(cfg, log, g, lns, lt)
			}
			lt.close()
		}
	}
	lns.close()
	return nil, err
}

// httpListeners are the admin and metrics listeners' sockets, nil when off.
type httpListeners struct{ admin, metrics net.Listener }

func (l *httpListeners) listen(cfg config.Config) error {
	var err error
	if cfg.Admin != "" {
		if l.admin, err = frontend.Listen(cfg.Admin); err != nil {
			return fmt.Errorf("admin: %w", err)
		}
	}
	if cfg.Metrics != "" {
		if l.metrics, err = frontend.Listen(cfg.Metrics); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
	}
	return nil
}

func (l httpListeners) close() {
	for _, ln := range []net.Listener{l.admin, l.metrics} {
		if ln != nil {
			ln.Close()
		}
	}
}

// loopTimeout is the shortest deadline u gives an exchange on gnet's
// loops: a response, stream-idle or keep-alive timeout, or a first-byte
// deadline, which is at least its floor (k × a prediction past it, which
// may be next to nothing when the floor is 0).
func loopTimeout(u config.Upstream) time.Duration {
	d := min(u.ResponseTimeout, u.WholeResponseTimeout, u.StreamIdleTimeout, u.KeepaliveTimeout)
	if fb := u.Retry.FirstByte; fb.Factor > 0 {
		d = min(d, max(fb.Floor, time.Nanosecond))
	}
	return d
}

// start serves g on cfg's listeners, with lt's certificates.
func start(cfg config.Config, log *slog.Logger, g *gateway.Gateway, lns httpListeners, lt *listenerTLS) (*Server, error) {
	front, err := frontend.Start(cfg.Frontend, cfg.Listen, frontend.Handler{Serve: g.Handler, Error: g.ErrorHandler, OnLoop: true}, frontend.Options{
		MaxBodyBytes:   cfg.MaxBodyBytes,
		MaxHeaderBytes: cfg.MaxHeaderBytes,
		ReadTimeout:    cfg.ClientReadTimeout,
		IdleTimeout:    cfg.ClientIdleTimeout,
		Conns:          g.Conns(),
		FDs:            g.FDs(),
		Log:            log,
		TLS:            lt.frontendTLS(cfg.TLS),
		HTTP2:          http2Options(cfg.HTTP2),
		// A reload's shorter ones are swept for from their first Send.
		UpstreamTimeout: loopTimeout(cfg.Upstream),
		NoRing:          !cfg.IOURing,
	})
	if err != nil {
		lt.close()
		g.Close()
		lns.close()
		return nil, fmt.Errorf("listen: %w", err)
	}
	lt.noteReloads(g.NoteCertReload)
	s := &Server{Gateway: g, front: front, adminLn: lns.admin, metricsLn: lns.metrics, done: make(chan error, 3), stopped: make(chan struct{}), tls: lt}
	go func() {
		select {
		case err := <-front.Done():
			if err != nil {
				s.done <- err
			}
		case <-s.stopped:
		}
	}()
	if cfg.Discovery.Enabled() {
		if err := s.startDiscovery(cfg, log); err != nil {
			s.Shutdown(context.Background())
			// Not served yet, so Shutdown has no server to close them.
			lns.close()
			return nil, err
		}
	}
	if lns.admin != nil {
		s.admin = &http.Server{Handler: limits.AdminGuard(cfg.Access.AdminToken, g.Admin()), ReadHeaderTimeout: 10 * time.Second}
		ln := lns.admin
		if tc := lt.adminConfig(cfg.TLS); tc != nil {
			// Not ServeTLS: it handshakes with a clone of tc, whose
			// session-ticket keys would never rotate.
			ln = tls.NewListener(ln, tc)
		}
		go s.serveHTTP(s.admin, ln)
	}
	if lns.metrics != nil {
		s.metrics = &http.Server{Handler: g.Metrics(), ReadHeaderTimeout: 10 * time.Second}
		go s.serveHTTP(s.metrics, lns.metrics)
	}
	return s, nil
}

// serveHTTP serves srv on ln until Shutdown, reporting any other end.
func (s *Server) serveHTTP(srv *http.Server, ln net.Listener) {
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		s.done <- err
	}
}

// warnShared warns when another process already listens on addr: the
// listeners bind with SO_REUSEPORT (for upgrades in place), so the bind
// succeeds and the kernel splits new connections between the two, which
// nobody notices unless told.
func warnShared(log *slog.Logger, listener, addr string) {
	if addr == "" {
		return
	}
	if owners := frontend.SharedWith(addr); len(owners) > 0 {
		log.Warn("another process already listens on this address: new connections will be split between it and this gateway (SO_REUSEPORT); expected during an upgrade in place, otherwise stop the other one",
			"listener", listener, "address", addr, "with", strings.Join(owners, ", "))
	}
}

// Addr is the address the API listens on.
func (s *Server) Addr() string { return s.front.Addr() }

// AdminAddr is the admin listener's address, empty when it is off.
func (s *Server) AdminAddr() string {
	if s.adminLn == nil {
		return ""
	}
	return s.adminLn.Addr().String()
}

// MetricsAddr is the metrics listener's address, empty when it is off.
func (s *Server) MetricsAddr() string {
	if s.metricsLn == nil {
		return ""
	}
	return s.metricsLn.Addr().String()
}

// Done reports a listener that stopped on its own with an error.
func (s *Server) Done() <-chan error { return s.done }

// Shutdown stops accepting connections, lets requests in flight (streams
// included) finish until ctx ends, then closes what is left.
//
// Only the first call shuts down; later ones return its error.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdown.Do(func() {
		// Every answer from here closes its connection (HTTP/2: GOAWAY),
		// whichever front end keeps serving it meanwhile.
		s.Gateway.Drain()
		close(s.stopped)
		if s.stopDiscovery != nil {
			s.stopDiscovery()
			<-s.discovered
		}
		s.shutdownErr = s.front.ShutdownWithContext(ctx)
		if s.shutdownErr != nil {
			// The grace is over and streams still run: end them with an
			// error event, then give them a moment to go out.
			s.Gateway.AbortStreams()
			if a, ok := s.front.(interface{ AbortRelays() }); ok {
				a.AbortRelays()
			}
			wait, cancel := context.WithTimeout(context.Background(), abortWait)
			_ = s.front.ShutdownWithContext(wait)
			cancel()
		}
		for _, srv := range []*http.Server{s.admin, s.metrics} {
			if srv != nil {
				_ = srv.Shutdown(ctx)
			}
		}
		s.Gateway.Close()
		s.tls.close()
	})
	return s.shutdownErr
}

// startDiscovery follows the configured sources, together with the static
// pods, and hands every complete list to the gateway. A discovered pod that
// fails validation is left out with a log line; the rest are served.
func (s *Server) startDiscovery(cfg config.Config, log *slog.Logger) error {
	// The configuration's pods are not a source of discovery's: a reload
	// replaces them, and discovery reports only when its own list changes.
	src, err := discovery.New(cfg.Discovery, log)
	if err != nil {
		return err // it says "discovery:" already
	}
	s.static, s.log = cfg.Pods, log
	ctx, cancel := context.WithCancel(context.Background())
	s.stopDiscovery, s.discovered = cancel, make(chan struct{})
	go func() {
		defer close(s.discovered)
		err := src.Run(ctx, func(found []discovery.Pod) {
			pods := make([]config.Pod, 0, len(found))
			for i := range found {
				p := found[i].Pod
				p.Provision()
				if err := p.Validate("discovered pod " + p.Name); err != nil {
					log.Warn("discovered pod left out", "err", err)
					continue
				}
				pods = append(pods, p)
			}
			s.fleetMu.Lock()
			defer s.fleetMu.Unlock()
			s.found = pods
			cfg := s.Gateway.Config()
			cfg.Pods = s.static
			if err := s.Gateway.SetPods(withFound(cfg, pods, log)); err != nil {
				log.Error("discovered fleet not applied", "err", err)
			}
		})
		if err != nil && ctx.Err() == nil {
			log.Error("discovery stopped", "err", err)
		}
	}()
	return nil
}

// Reload applies a new fleet (see gateway.Gateway.Reload) and the
// listeners' certificate lists, read from their files again, or nothing
// of cfg when any of it is refused: the running configuration stays, as
// nginx's does when its reload fails.
//
// cfg.Pods are the configuration's own pods: while discovery runs, the
// pods it found last stay beside them.
func (s *Server) Reload(cfg config.Config) error {
	// As Start: pdlb serve's --pod pods come as parsed, after the file's
	// were provisioned.
	cfg.Provision()
	if s.stopDiscovery == nil {
		return s.tls.apply(cfg.TLS, func() error { return s.Gateway.Reload(cfg) })
	}
	// As Start, on its own pods: a name that only discovered pods serve
	// (a fallback's model) would get every fleet refused once they leave.
	if err := cfg.Validate(); err != nil {
		return err
	}
	s.fleetMu.Lock()
	defer s.fleetMu.Unlock()
	static := cfg.Pods
	cfg.Pods = withFound(cfg, s.found, s.log)
	err := s.tls.apply(cfg.TLS, func() error { return s.Gateway.Reload(cfg) })
	if err == nil {
		s.static = static
	}
	return err
}

// withFound is the configuration's pods (cfg.Pods), then the discovered
// ones whose names no configured pod has (as discovery.Union keeps the
// first of two pods with one name), whose engine no pod before them has (a
// Kubernetes pod that a DNS name or the file lists too, under another
// name: counted twice it would get twice its share), that run their
// model's prefill and decode engine where they play either role
// (config.PDEngines) and whose model and adapters take no name of cfg's
// models, adapters and aliases, nor of the pods before them
// (config.Config.ValidateNames): each pod left out is logged, and the rest
// serve. It runs again for each reload, whose pods may change the engine
// a discovered pod must run, and whose models the names it may take. cfg
// is valid on its own pods (Start and Reload check that), so only a
// discovered pod's claim on a name can fail ValidateNames.
func withFound(cfg config.Config, found []config.Pod, log *slog.Logger) []config.Pod {
	static := cfg.Pods
	names := map[string]bool{}
	endpoints := map[string]string{} // endpoint → the name of its pod
	pd := config.PDEngines{}
	for _, p := range static {
		names[cmp.Or(p.Name, p.Address)] = true
		endpoints[p.Endpoint()] = cmp.Or(p.Name, p.Address)
		// Where the configuration's own pods mix engines, Validate
		// refuses the whole configuration.
		_ = pd.Check("", p)
	}
	out := slices.Clone(static)
	for _, p := range found {
		if names[cmp.Or(p.Name, p.Address)] {
			log.Warn("discovered pod named as a configured one left out", "pod", p.Name, "address", p.Address)
			continue
		}
		if other, ok := endpoints[p.Endpoint()]; ok {
			log.Warn("discovered pod at another pod's address left out", "pod", p.Name, "address", p.Address, "other", other)
			continue
		}
		if err := pd.Check("discovered pod "+p.Name, p); err != nil {
			log.Warn("discovered pod left out", "err", err)
			continue
		}
		endpoints[p.Endpoint()] = p.Name
		out = append(out, p)
	}
	// One pod's clash would get the whole fleet refused, for as long as
	// the pod runs. The fleet's names are checked whole, and pod by pod
	// only where that fails.
	cfg.Pods = out
	if cfg.ValidateNames() == nil {
		return out
	}
	kept := slices.Clone(static)
	for _, p := range out[len(static):] {
		cfg.Pods = append(kept, p)
		if err := cfg.ValidateNames(); err != nil {
			log.Warn("discovered pod left out", "pod", p.Name, "address", p.Address, "err", err)
			continue
		}
		kept = cfg.Pods
	}
	return kept
}

// ReopenLogs opens the access log's file anew, after rotation moved it.
func (s *Server) ReopenLogs() error { return s.Gateway.ReopenLogs() }

// Drain announces the shutdown to come (gateway.Gateway.Drain) while it
// serves on.
func (s *Server) Drain() { s.Gateway.Drain() }

// WatchFile calls changed whenever the file at path changes (its size or
// modification time), checking every interval until ctx ends. Editors that
// replace the file rather than write it are seen too. It reads the file's
// stamp before it returns, so a change right after it, the file having
// been read just before, is not missed; the checks run on a goroutine of
// their own.
func WatchFile(ctx context.Context, path string, interval time.Duration, changed func()) {
	stamp := func() (time.Time, int64) {
		fi, err := os.Stat(path)
		if err != nil {
			return time.Time{}, -1
		}
		return fi.ModTime(), fi.Size()
	}
	mod, size := stamp()
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if m, sz := stamp(); !m.Equal(mod) || sz != size {
					mod, size = m, sz
					changed()
				}
			}
		}
	}()
}
