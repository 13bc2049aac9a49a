package frontend

import (
	"bytes"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"pdlb/internal/certgen"
)

// BenchmarkTLSPull: the loop decrypts a 1 KB request as it arrived
// (pull), a record a client sealed over a TLS 1.3 connection handshaken
// first; the baseline, "seal", is the client's sealing alone (after, as
// the records it seals are never decrypted).
func BenchmarkTLSPull(b *testing.B) {
	ca, err := certgen.NewCA(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	leaf, err := ca.Issue([]string{"localhost"}, time.Time{}, time.Time{})
	if err != nil {
		b.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(leaf.CertFile, leaf.KeyFile)
	if err != nil {
		b.Fatal(err)
	}
	cs, ss := net.Pipe()
	w := &loopWire{nc: ss}
	t := &loopTLS{tc: tls.Server(w, &tls.Config{Certificates: []tls.Certificate{cert}}), w: w}
	client := &sealed{Conn: cs}
	tc := tls.Client(client, &tls.Config{RootCAs: ca.Pool, ServerName: "localhost"})
	done := make(chan error, 1)
	go func() { done <- t.tc.Handshake() }()
	if err := tc.Handshake(); err != nil {
		b.Fatal(err)
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	// From now on the client's records are kept, and the server's wire is
	// the loop's.
	client.keep, w.nc, w.enrolled = true, nil, true
	req := bytes.Repeat([]byte("x"), 1024)
	for _, pull := range []bool{true, false} {
		b.Run(map[bool]string{false: "seal", true: "seal+pull"}[pull], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				client.out = client.out[:0]
				if _, err := tc.Write(req); err != nil {
					b.Fatal(err)
				}
				if !pull {
					continue
				}
				if err := t.pull(client.out); err != nil {
					b.Fatal(err)
				}
				if got := len(t.plain) - t.off; got != len(req) {
					b.Fatalf("%d bytes decrypted, want %d", got, len(req))
				}
				t.off = len(t.plain)
				t.settle()
			}
		})
	}
}

// sealed is a client's connection that keeps what it writes once keep is
// set.
type sealed struct {
	net.Conn
	keep bool
	out  []byte
}

func (s *sealed) Write(p []byte) (int, error) {
	if !s.keep {
		return s.Conn.Write(p)
	}
	s.out = append(s.out, p...)
	return len(p), nil
}
