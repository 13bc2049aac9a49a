package lb

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"pdlb/lb/config"
	"pdlb/lb/frontend"
)

// listenerTLS holds the certificates of the API listener and the admin
// listener (nil: plain HTTP), which SIGHUP and changes to their files
// reload; a reload may also change which files they are.
type listenerTLS struct {
	api, admin *frontend.Certs
	stop       chan struct{} // ends ticket rotation and the file watch
	log        *slog.Logger

	// mu serializes reloads; under it, unwatch ends the watch of the
	// files in use, and noted, when set, hears how a changed file's
	// reload ended (the gateway's reload gauges).
	mu      sync.Mutex
	unwatch context.CancelFunc
	noted   func(error)
	// failed holds, per listener's certificates, why the last reload of
	// one of its changed files failed; reported whole, so that one
	// listener's good rotation does not hide the other's failure.
	failed map[*frontend.Certs]error
}

// noteReloads has the reloads of changed files reported to f.
func (t *listenerTLS) noteReloads(f func(error)) {
	t.mu.Lock()
	t.noted = f
	t.mu.Unlock()
}

// certWatchInterval is how often the certificate files are looked at.
const certWatchInterval = 2 * time.Second

func loadTLS(cfg config.TLS, log *slog.Logger) (*listenerTLS, error) {
	t := &listenerTLS{stop: make(chan struct{}), log: log, failed: map[*frontend.Certs]error{}}
	var err error
	if cfg.Enabled() {
		if t.api, err = frontend.LoadCerts(keyPairs(cfg.Certificates)); err != nil {
			return nil, err
		}
	}
	if files := cfg.AdminFiles(); files != nil {
		if t.admin, err = frontend.LoadCerts(keyPairs(files)); err != nil {
			return nil, err
		}
	}
	t.watch()
	go func() {
		<-t.stop
		t.mu.Lock()
		t.unwatch()
		t.mu.Unlock()
	}()
	return t, nil
}

// watch starts the watch of the files in use, ending the one before;
// mu is held, or t is not shared yet. Once stop is closed nothing is
// watched. A changed file's reload takes mu, as apply's does.
func (t *listenerTLS) watch() {
	if t.unwatch != nil {
		t.unwatch()
	}
	select {
	case <-t.stop:
		return
	default:
	}
	var ctx context.Context
	ctx, t.unwatch = context.WithCancel(context.Background())
	for _, c := range []*frontend.Certs{t.api, t.admin} {
		if c == nil {
			continue
		}
		for _, f := range c.Files() {
			WatchFile(ctx, f, certWatchInterval, func() {
				t.mu.Lock()
				err := c.Reload()
				if err != nil {
					t.failed[c] = err
				} else {
					delete(t.failed, c)
				}
				if t.noted != nil {
					var all []error
					for _, e := range t.failed {
						all = append(all, e)
					}
					t.noted(errors.Join(all...))
				}
				t.mu.Unlock()
				if err != nil {
					t.log.Error("certificate not reloaded; the one in use stays", "file", f, "err", err)
					return
				}
				t.log.Info("certificate reloaded", "file", f)
			})
		}
	}
}

func keyPairs(files []config.CertFiles) []frontend.KeyPair {
	pairs := make([]frontend.KeyPair, len(files))
	for i, f := range files {
		pairs[i] = frontend.KeyPair{CertFile: f.CertFile, KeyFile: f.KeyFile}
	}
	return pairs
}

// apply reads cfg's certificate lists, then calls fleet (the gateway's
// reload), and when both succeed serves the lists read; otherwise nothing
// changes, neither certificates nor fleet. mu is held throughout so a file
// watch's reload cannot land between the read and the swap, which would
// put the older read back.
func (t *listenerTLS) apply(cfg config.TLS, fleet func() error) error {
	if err := t.check(cfg); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	lists := []struct {
		c    *frontend.Certs
		want []config.CertFiles
	}{{t.api, cfg.Certificates}, {t.admin, cfg.AdminFiles()}}
	sets := make([]*frontend.CertSet, len(lists))
	for i, l := range lists {
		if l.c == nil {
			continue
		}
		var err error
		if sets[i], err = frontend.ReadCerts(keyPairs(l.want)); err != nil {
			return err
		}
	}
	if err := fleet(); err != nil {
		return err
	}
	// Every file was read anew and loaded.
	clear(t.failed)
	moved := false
	for i, l := range lists {
		if l.c != nil && l.c.Serve(sets[i]) {
			moved = true
		}
	}
	if moved {
		t.watch()
	}
	return nil
}

// check refuses a configuration that would switch a listener between
// plain HTTP and TLS, which only a restart does.
func (t *listenerTLS) check(cfg config.TLS) error {
	if cfg.Enabled() != (t.api != nil) {
		return fmt.Errorf("%w: tls.certificates: the API listener cannot switch between plain HTTP and TLS on reload; restart pdlb", config.ErrInvalid)
	}
	if (cfg.AdminFiles() != nil) != (t.admin != nil) {
		return fmt.Errorf("%w: tls.admin: the admin listener cannot switch between plain HTTP and TLS on reload; restart pdlb", config.ErrInvalid)
	}
	return nil
}

func (t *listenerTLS) close() { close(t.stop) }

// frontendTLS is the API listener's TLS, nil when it speaks plain HTTP.
func (t *listenerTLS) frontendTLS(cfg config.TLS) *frontend.TLS {
	if t.api == nil {
		return nil
	}
	return &frontend.TLS{Certs: t.api, MinVersion: cfg.Version(), TicketRotation: cfg.TicketRotation}
}

// adminConfig is the admin listener's crypto/tls configuration, nil when
// it speaks plain HTTP.
func (t *listenerTLS) adminConfig(cfg config.TLS) *tls.Config {
	if t.admin == nil {
		return nil
	}
	ft := frontend.TLS{Certs: t.admin, MinVersion: cfg.Version(), TicketRotation: cfg.TicketRotation}
	return ft.Config([]string{"h2", "http/1.1"}, t.stop)
}

func http2Options(c config.HTTP2) frontend.HTTP2 {
	return frontend.HTTP2{Disabled: c.Disabled, MaxConcurrentStreams: c.MaxConcurrentStreams,
		MaxFrameBytes: c.MaxFrameBytes, MaxResetsPerSecond: c.MaxResetsPerSecond, MaxBodyBytesPerConnection: c.MaxBodyBytesPerConnection}
}
