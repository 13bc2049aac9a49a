package pool

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"

	"pdlb/lb/config"
)

// upstreamTLS is the client configuration for pods dialed with TLS:
// verification on, against u's CA bundle or the system's roots, with u's
// client certificate when given (mutual TLS). The server name checked
// and sent (SNI) is u's, or each pod's host (podTLS).
func upstreamTLS(u config.UpstreamTLS) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: u.ServerName,
		// The pods speak HTTP/1.1, which fasthttp's client writes.
		NextProtos: []string{"http/1.1"}}
	if u.CAFile != "" {
		pem, err := os.ReadFile(u.CAFile)
		if err != nil {
			return nil, fmt.Errorf("upstream.tls.ca_file: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("upstream.tls.ca_file: %q holds no PEM certificate", u.CAFile)
		}
	}
	if u.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(u.CertFile, u.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("upstream.tls.cert_file: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// podTLS is cfg for the pod at addr: the server name checked and sent is
// cfg's, or else addr's host.
//
// One pod gets many connections: resuming skips the key exchange. A cache
// of its own, as crypto/tls keys sessions by server name, which pods on
// one host, or under upstream.tls.server_name, share: each would be
// offered the ticket of the pod dialed last, which it cannot open.
func podTLS(cfg *tls.Config, addr string) *tls.Config {
	cfg = cfg.Clone()
	cfg.ClientSessionCache = tls.NewLRUClientSessionCache(1)
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
	}
	return cfg
}
