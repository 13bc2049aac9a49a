package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"pdlb/lb"
	"pdlb/lb/config"
	"pdlb/lb/limits"
)

// podFlags collects repeated --pod flags.
type podFlags []config.Pod

func (p *podFlags) String() string { return fmt.Sprint(len(*p), " pods") }

func (p *podFlags) Set(s string) error {
	pod, err := config.ParsePodFlag(s)
	if err != nil {
		return err
	}
	*p = append(*p, pod)
	return nil
}

// gatewayFlags are the flags serve and demo share.
type gatewayFlags struct {
	listen, admin, metrics, frontend, accessLog string
	shutdown, delay                             time.Duration
	tlsCert, tlsKey                             string
	ioURing                                     bool
	// fs says which flags were given: an empty --admin, --metrics or
	// --access-log turns off what the config file turned on.
	fs *flag.FlagSet
}

// register adds the flags to fs; withConfig says the command also reads a
// config file, whose settings are then the defaults the flags override.
func (f *gatewayFlags) register(fs *flag.FlagSet, withConfig bool) {
	orFile, ifFile := "", ""
	if withConfig {
		orFile, ifFile = ", or the config file's", " (unset: the config file's io_uring)"
	}
	fs.StringVar(&f.listen, "listen", "", "address of the OpenAI API (default "+config.DefaultListen+orFile+")")
	f.fs = fs
	fs.StringVar(&f.admin, "admin", "", "address of /metrics, /debug/pprof and /admin, \"\" for none (default "+config.DefaultAdmin+orFile+")")
	fs.StringVar(&f.metrics, "metrics", "", "address of a listener with /metrics only, for anyone: for scrapers that cannot send admin_token, with --admin kept on loopback, \"\" for none (default none"+orFile+")")
	fs.StringVar(&f.frontend, "frontend", "", "client-facing server: fasthttp or gnet (default "+config.DefaultFrontend+orFile+")")
	fs.BoolVar(&f.ioURing, "io-uring", true, "on gnet, batch the event loops' sends and receives with io_uring where the kernel allows; --io-uring=false makes a system call each"+ifFile)
	fs.StringVar(&f.accessLog, "access-log", "", "one JSON line per request to this file (\"-\": standard output, \"\": none; reopened on SIGUSR1; default none"+orFile+")")
	fs.DurationVar(&f.shutdown, "shutdown-timeout", 30*time.Second, "on SIGINT/SIGTERM, how long streams in flight may run on before they are cut")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "serve the API over TLS with this PEM certificate chain (with --tls-key; reloaded on SIGHUP and when it changes)")
	fs.StringVar(&f.tlsKey, "tls-key", "", "the PEM private key of --tls-cert")
	fs.DurationVar(&f.delay, "shutdown-delay", 0, "on SIGINT/SIGTERM, how long to go on serving first with /ready answering 503 and each answer closing its connection, so balancers and Kubernetes endpoints move clients away (default 0s: none; a second signal ends it)")
}

// check refuses what the flags cannot mean: a negative wait would pass
// for none, and a typo would go unnoticed until the first deploy.
func (f *gatewayFlags) check() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"shutdown-timeout", f.shutdown}, {"shutdown-delay", f.delay}} {
		if d.v < 0 {
			return fmt.Errorf("--%s %v: must not be negative", d.name, d.v)
		}
	}
	return nil
}

func (f *gatewayFlags) apply(cfg *config.Config) {
	if f.listen != "" {
		cfg.Listen = f.listen
	}
	if f.given("admin") {
		cfg.Admin = f.admin
	}
	if f.given("metrics") {
		cfg.Metrics = f.metrics
	}
	if f.frontend != "" {
		cfg.Frontend = f.frontend
	}
	if f.given("io-uring") {
		cfg.IOURing = f.ioURing
	}
	if f.given("access-log") {
		cfg.AccessLog = f.accessLog
	}
	if f.tlsCert != "" || f.tlsKey != "" {
		cfg.TLS.Certificates = []config.CertFiles{{CertFile: f.tlsCert, KeyFile: f.tlsKey}}
	}
}

// given says the command line set the flag called name, "" included.
func (f *gatewayFlags) given(name string) (set bool) {
	f.fs.Visit(func(fl *flag.Flag) { set = set || fl.Name == name })
	return set
}

func cmdServe(args []string, stdout io.Writer) error {
	fs := newFlagSet("serve", "[--config FILE] [--pod SPEC]... [--listen ADDR] [--admin ADDR]",
		`Runs the gateway in front of the pods of a config file and/or --pod flags.

A pod spec is comma-separated key=value pairs, with these keys of a pod in
the config file: model, address, engine, role, roleset, name, bucket_min,
bucket_max, weight, bootstrap_port (KV events and the rest: the file), e.g.
  --pod model=llama,address=10.0.0.5:8000,engine=vllm
  --pod model=llama,address=10.0.0.6:8000,engine=sglang,weight=2`, stdout)
	var (
		path string
		pods podFlags
		gf   gatewayFlags
	)
	fs.StringVar(&path, "config", "", "YAML config file (see README: Configuration)")
	fs.Var(&pods, "pod", "a pod to route to, as key=value pairs (repeatable)")
	gf.register(fs.FlagSet, true)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fs.usageError(fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " ")))
	}
	if err := gf.check(); err != nil {
		return err
	}
	load := func() (config.Config, error) {
		cfg := config.Default()
		// AIBrix's AIBRIX_* variables, as aliases of the pd knobs; Load
		// applies them itself, under the file.
		if err := cfg.ApplyEnv(os.LookupEnv); err != nil {
			return cfg, err
		}
		if path != "" {
			var err error
			if cfg, err = config.Load(path); err != nil {
				return cfg, err
			}
		}
		cfg.Pods = append(cfg.Pods, pods...)
		gf.apply(&cfg)
		return cfg, nil
	}
	cfg, err := load()
	if err != nil {
		return err
	}
	if path == "" {
		load = nil
	}
	return serveUntilSignal(cfg, gf.stopping(), stdout, nil, load, path)
}

// drain waits out delay while the gateway drains. A second SIGINT or
// SIGTERM cuts it short; SIGUSR1 still reopens the access log and a
// SIGHUP is ignored (the gateway is on its way out). done reports the
// gateway stopping on its own, with its error.
func drain(delay time.Duration, sig <-chan os.Signal, srv *lb.Server, log *slog.Logger) (stopped bool, err error) {
	end := time.After(delay)
	for {
		select {
		case <-end:
			return false, nil
		case s := <-sig:
			switch s {
			case syscall.SIGUSR1:
				reopenLogs(srv, log)
			case syscall.SIGHUP:
				log.Warn("not reloading: the gateway is draining for its shutdown")
			default:
				log.Info("drain cut short", "signal", s.String())
				return false, nil
			}
		case err := <-srv.Done():
			return true, err
		}
	}
}

// reopenLogs is SIGUSR1, logrotate's postrotate: the access log moved away.
func reopenLogs(srv *lb.Server, log *slog.Logger) {
	if err := srv.ReopenLogs(); err != nil {
		log.Error("reopening the access log failed; it goes on where it was", "err", err)
	}
}

// stopping is how serve stops on SIGINT or SIGTERM: it drains for delay,
// then shuts down, letting requests in flight finish within grace.
type stopping struct{ delay, grace time.Duration }

func (f *gatewayFlags) stopping() stopping { return stopping{delay: f.delay, grace: f.shutdown} }

// serveUntilSignal runs the gateway until SIGINT or SIGTERM, then shuts it
// down gracefully (stop). started, if set, runs once the gateway listens.
// reload, if set, reads the configuration again on SIGHUP and when the
// file at path changes, and applies its fleet without dropping
// connections; unset, SIGHUP applies the running configuration again,
// which reads its certificate files anew.
func serveUntilSignal(cfg config.Config, stop stopping, stdout io.Writer, started func(*lb.Server),
	reload func() (config.Config, error), path string) error {
	// Caught from before the gateway starts: a SIGHUP or logrotate's
	// SIGUSR1 (by default each terminates) sent while it starts must not
	// kill it, and a SIGTERM then stops it once it has started.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1)
	defer signal.Stop(sig)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	defer limits.HeapFloor(limits.HeapHeadroom)()
	// Watched from before the start, so an edit made while it starts is
	// applied once it has (changed holds one).
	changed := make(chan struct{}, 1)
	if reload != nil {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		lb.WatchFile(ctx, path, 2*time.Second, func() {
			select {
			case changed <- struct{}{}:
			default:
			}
		})
	}
	srv, err := lb.Start(cfg, log)
	if err != nil {
		return err
	}
	log.Info("pdlb serving", "listen", srv.Addr(), "admin", srv.AdminAddr(), "metrics", srv.MetricsAddr(), "pods", len(cfg.Pods))
	if started != nil {
		started(srv)
	}
	apply := func(why string) {
		var next config.Config
		var err error
		if reload != nil {
			next, err = reload()
		} else {
			// The running configuration again: its certificate files
			// are read anew.
			next = srv.Gateway.Config()
		}
		if err == nil {
			err = srv.Reload(next)
		}
		srv.Gateway.NoteReload(err)
		if err != nil {
			log.Error("reload failed; the running configuration stays", "trigger", why, "err", err)
		}
	}
	for {
		select {
		case s := <-sig:
			switch s {
			case syscall.SIGHUP:
				apply("SIGHUP")
				continue
			case syscall.SIGUSR1:
				reopenLogs(srv, log)
				continue
			}
			if stop.delay > 0 {
				log.Info("draining before the shutdown: /ready answers 503, answers close their connections", "signal", s.String(), "for", stop.delay)
				srv.Drain()
				if stopped, err := drain(stop.delay, sig, srv, log); stopped {
					return err
				}
			}
			log.Info("shutting down", "signal", s.String(), "grace", stop.grace)
		case <-changed:
			apply("file changed")
			continue
		case err := <-srv.Done():
			return err
		}
		break
	}
	ctx, cancel := context.WithTimeout(context.Background(), stop.grace)
	defer cancel()
	return srv.Shutdown(ctx)
}
