package main

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"

	"pdlb/lb/config"
)

// TestDemoCertificate: the demo's certificate loads and verifies for
// localhost and 127.0.0.1 against the CA it prints.
func TestDemoCertificate(t *testing.T) {
	var cfg config.Config
	ca, err := demoCertificate(t.TempDir(), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := cfg.TLS.Certificates[0]
	cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	pem, _ := os.ReadFile(ca)
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatalf("%s holds no certificate", ca)
	}
	for _, name := range []string{"localhost", "127.0.0.1"} {
		if _, err := cert.Leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if got, want := demoTLSBase(ca, "[::]:8080"), "--cacert "+ca+" https://localhost:8080"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
