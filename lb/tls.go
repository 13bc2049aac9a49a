package lb

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"time"

	"pdlb/lb/config"
	"pdlb/lb/frontend"
)

// listenerTLS holds the certificates of the API listener and the admin
// listener (nil: plain HTTP), which SIGHUP and changes to their files
// reload.
type listenerTLS struct {
	api, admin *frontend.Certs
	stop       chan struct{} // ends ticket rotation and the file watch
}

// certWatchInterval is how often the certificate files are looked at.
const certWatchInterval = 2 * time.Second

func loadTLS(cfg config.TLS, log *slog.Logger) (*listenerTLS, error) {
	t := &listenerTLS{stop: make(chan struct{})}
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
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-t.stop
		cancel()
	}()
	for _, c := range []*frontend.Certs{t.api, t.admin} {
		if c == nil {
			continue
		}
		for _, f := range c.Files() {
			go WatchFile(ctx, f, certWatchInterval, func() {
				if err := c.Reload(); err != nil {
					log.Error("certificate not reloaded; the one in use stays", "file", f, "err", err)
					return
				}
				log.Info("certificate reloaded", "file", f)
			})
		}
	}
	return t, nil
}

func keyPairs(files []config.CertFiles) []frontend.KeyPair {
	pairs := make([]frontend.KeyPair, len(files))
	for i, f := range files {
		pairs[i] = frontend.KeyPair{CertFile: f.CertFile, KeyFile: f.KeyFile}
	}
	return pairs
}

// reload reads every certificate again; one that fails keeps the old.
func (t *listenerTLS) reload() error {
	var errs []error
	for _, c := range []*frontend.Certs{t.api, t.admin} {
		if c != nil {
			errs = append(errs, c.Reload())
		}
	}
	return errors.Join(errs...)
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
		MaxFrameBytes: c.MaxFrameBytes, MaxResetsPerSecond: c.MaxResetsPerSecond}
}
