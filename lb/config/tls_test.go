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

// TestTLSHTTP2ZeroRefused: a 0 written in the tls or http2 section stays 0
// and is refused with the default to leave it out for, as every other
// section's; Provision used to turn it into the default silently, so
// max_concurrent_streams 0, meant to stop h2 streams, allowed 250.
func TestTLSHTTP2ZeroRefused(t *testing.T) {
	pod := "pods: [{model: m, address: 'h:1'}]\n"
	f := func(yml, want string) { t.Helper(); loadRefuses(t, yml+pod, want) }
	f("tls: {ticket_rotation: 0s}\n", `tls.ticket_rotation = "0s" must be positive`)
	f("tls: {min_version: ''}\n", `tls.min_version = "" must be "1.2" or "1.3"`)
	f("http2: {max_concurrent_streams: 0}\n", "http2.max_concurrent_streams = 0 must be positive")
	f("http2: {max_frame_bytes: 0}\n", "http2.max_frame_bytes = 0 must be 16384 to 16777215")
	f("http2: {max_resets_per_second: 0}\n", "http2.max_resets_per_second = 0 must be positive")
	c := Default()
	if c.TLS.TicketRotation != DefaultTicketRotation || c.TLS.MinVersion != DefaultTLSMinVersion || c.HTTP2.MaxConcurrentStreams != DefaultMaxConcurrentStreams ||
		c.HTTP2.MaxFrameBytes != DefaultMaxFrameBytes || c.HTTP2.MaxResetsPerSecond != DefaultMaxResetsPerSecond {
		t.Fatalf("Default: %+v %+v", c.TLS, c.HTTP2)
	}
}
