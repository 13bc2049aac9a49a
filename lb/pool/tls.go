package pool

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"time"

	"pdlb/lb/config"
)

// upstreamTLS is the client configuration for pods dialed with TLS:
// verification on, against u's CA bundle or the system's roots, with u's
// client certificate when given (mutual TLS). The server name checked
// and sent (SNI) is u's, or each pod's host (set per dial).
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

// pinned is implemented by connections that can move to a new socket
// (upstream.Conn's redial); a TLS session cannot, so the dial pins them.
type pinned interface{ Pin() }

// dialTLS is dial with a TLS handshake on the connection, within timeout
// overall. The handshake happens here, not in fasthttp's client, so the
// client sees a plain connection and the requests keep their http URIs;
// the relay's deadlines and cuts still reach the socket under TLS
// (upstream.ConnOf).
func dialTLS(dial func(string) (net.Conn, error), cfg *tls.Config, timeout time.Duration) func(string) (net.Conn, error) {
	// One pod gets many connections: resuming skips the key exchange. A
	// cache of its own, as crypto/tls keys sessions by server name, which
	// pods on one host, or under upstream.tls.server_name, share: each
	// would be offered the ticket of the pod dialed last, which it cannot
	// open.
	cfg = cfg.Clone()
	cfg.ClientSessionCache = tls.NewLRUClientSessionCache(1)
	return func(addr string) (net.Conn, error) {
		c, err := dial(addr)
		if err != nil {
			return nil, err
		}
		if p, ok := c.(pinned); ok {
			p.Pin()
		}
		conf := cfg
		if conf.ServerName == "" {
			host, _, _ := net.SplitHostPort(addr)
			conf = cfg.Clone()
			conf.ServerName = host
		}
		tc := tls.Client(c, conf)
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = c.Close()
			// A dial error: nothing was sent, another pod may be tried.
			return nil, &net.OpError{Op: "dial", Net: "tcp", Addr: c.RemoteAddr(), Err: fmt.Errorf("TLS handshake with the pod failed: %w", err)}
		}
		return tc, nil
	}
}
