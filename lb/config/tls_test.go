package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTLSValidate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "x.pem")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	f := func(edit func(c *Config), want string) {
		t.Helper()
		c := Default()
		c.Pods = []Pod{{Model: "m", Address: "https://10.0.0.1:8443"}}
		edit(&c)
		c.Provision()
		err := c.Validate()
		if want == "" {
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			return
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("got %v, want an error with %q", err, want)
		}
	}
	f(func(c *Config) {}, "")
	f(func(c *Config) { c.TLS.Certificates = []CertFiles{{CertFile: file, KeyFile: file}} }, "")
	f(func(c *Config) { c.TLS.Certificates = []CertFiles{{CertFile: file}} }, "tls.certificates[0].key_file")
	f(func(c *Config) { c.TLS.Certificates = []CertFiles{{CertFile: missing, KeyFile: file}} }, `tls.certificates[0].cert_file = "`+missing)
	f(func(c *Config) { c.TLS.MinVersion = "1.1" }, `tls.min_version = "1.1"`)
	f(func(c *Config) { c.TLS.Admin = true }, "tls.admin")
	f(func(c *Config) { c.HTTP2.MaxFrameBytes = 100 }, "http2.max_frame_bytes = 100")
	f(func(c *Config) { c.HTTP2.MaxResetsPerSecond = -1 }, "http2.max_resets_per_second")
	f(func(c *Config) { c.HTTP2.MaxBodyBytesPerConnection = -1 }, "http2.max_body_bytes_per_connection = -1")
	f(func(c *Config) { c.HTTP2.MaxBodyBytesPerConnection = 1000 }, "http2.max_body_bytes_per_connection = 1000 must be at least max_body_bytes (8388608)")
	f(func(c *Config) { c.HTTP2.MaxBodyBytesPerConnection = 64 << 20 }, "")
	f(func(c *Config) { c.Upstream.TLS.CertFile = file }, "upstream.tls.key_file")
	f(func(c *Config) { c.Upstream.TLS.CAFile = missing }, "upstream.tls.ca_file")
}

func TestPodScheme(t *testing.T) {
	f := func(addr, wantAddr string, wantTLS bool) {
		t.Helper()
		p := Pod{Model: "m", Address: addr}
		p.Provision()
		p.Provision()
		if p.Address != wantAddr || p.TLS != wantTLS || p.Name != wantAddr {
			t.Fatalf("%q: got %q tls=%v name %q", addr, p.Address, p.TLS, p.Name)
		}
	}
	f("10.0.0.1:8000", "10.0.0.1:8000", false)
	f("http://10.0.0.1:8000", "10.0.0.1:8000", false)
	f("https://10.0.0.1:8443", "10.0.0.1:8443", true)
}
