package pool

import (
	"crypto/tls"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"pdlb/internal/certgen"
	"pdlb/internal/testnet"
	"pdlb/lb/config"
)

// TestPodSessionsResume: pods that share a server name (pods on one
// host, or all of them under upstream.tls.server_name) each resume their
// own TLS sessions: a ticket one pod issued is no use to another, and
// must not take the place of the ticket of the pod dialed next.
func TestPodSessionsResume(t *testing.T) {
	ca, err := certgen.NewCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue([]string{"pods.example", "127.0.0.1"}, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	// Two pods, each with session-ticket keys of its own (crypto/tls's
	// defaults), counting the handshakes that resumed. TLS 1.2 hands the
	// ticket over within the handshake.
	var resumed [2]atomic.Int32
	addrs := make([]string, 2)
	for i := range addrs {
		ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{leaf.Cert}, MaxVersion: tls.VersionTLS12,
			VerifyConnection: func(cs tls.ConnectionState) error {
				if cs.DidResume {
					resumed[i].Add(1)
				}
				return nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		addrs[i] = testnet.Serve(t, ln, func(c net.Conn) {
			_ = c.(*tls.Conn).Handshake()
			_, _ = c.Read(make([]byte, 1))
		})
	}
	for _, name := range []string{"", "pods.example"} {
		cfg, err := upstreamTLS(config.UpstreamTLS{CAFile: ca.File, ServerName: name})
		if err != nil {
			t.Fatal(err)
		}
		confs := make([]*tls.Config, 2)
		for i, addr := range addrs {
			confs[i] = podTLS(cfg, addr)
			resumed[i].Store(0)
		}
		for range 3 {
			for i, addr := range addrs {
				c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, confs[i])
				if err != nil {
					t.Fatal(err)
				}
				c.Close()
			}
		}
		for i := range resumed {
			if n := resumed[i].Load(); n != 2 {
				t.Errorf("server name %q: pod %d resumed %d of its 3 sessions, want the 2 after the first", name, i, n)
			}
		}
	}
}
