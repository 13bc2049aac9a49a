package config

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"
)

// Defaults of TLS, HTTP2 and UpstreamTLS.
const (
	DefaultTLSMinVersion        = "1.2"
	DefaultTicketRotation       = time.Hour
	DefaultMaxConcurrentStreams = 250
	DefaultMaxFrameBytes        = 16 << 10
	DefaultMaxResetsPerSecond   = 100
)

// TLS terminates TLS on the API listener (and, if asked, on the admin
// listener). With no certificates the listener speaks plain HTTP.
type TLS struct {
	// Certificates are the listener's certificate chains, PEM files. The
	// first is served to a client whose server name (SNI) matches none;
	// the others are chosen by the names they hold. Reloaded on SIGHUP
	// and when a file changes, and the list may change on reload (not to
	// or from none); connections and streams stay open.
	Certificates []CertFiles `yaml:"certificates"`
	// MinVersion is the lowest TLS version accepted: "1.2" (default) or
	// "1.3".
	MinVersion string `yaml:"min_version"`
	// TicketRotation is how often the session-ticket key changes (default
	// 1h); a ticket is accepted for three rotations.
	TicketRotation time.Duration `yaml:"ticket_rotation"`
	// Admin serves the admin listener over TLS too (default false), with
	// AdminCertificates or, when none are given, Certificates.
	Admin             bool        `yaml:"admin"`
	AdminCertificates []CertFiles `yaml:"admin_certificates"`
}

// CertFiles is a certificate chain (leaf first) and its private key, PEM
// files.
type CertFiles struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// Enabled reports whether the API listener speaks TLS.
func (t TLS) Enabled() bool { return len(t.Certificates) > 0 }

// Version is MinVersion as crypto/tls spells it.
func (t TLS) Version() uint16 {
	if t.MinVersion == "1.3" {
		return tls.VersionTLS13
	}
	return tls.VersionTLS12
}

// AdminFiles are the admin listener's certificates; nil when it speaks
// plain HTTP.
func (t TLS) AdminFiles() []CertFiles {
	switch {
	case !t.Admin:
		return nil
	case len(t.AdminCertificates) > 0:
		return t.AdminCertificates
	}
	return t.Certificates
}

// Validate checks the files exist and the fields are in range; whether the
// files hold a usable key pair is checked when they are loaded.
func (t TLS) Validate() error {
	if err := checkCertFiles("tls.certificates", t.Certificates); err != nil {
		return err
	}
	if err := checkCertFiles("tls.admin_certificates", t.AdminCertificates); err != nil {
		return err
	}
	switch t.MinVersion {
	case "1.2", "1.3":
	default:
		return invalid("tls.min_version", t.MinVersion, `must be "1.2" or "1.3" (default `+DefaultTLSMinVersion+`)`)
	}
	if t.TicketRotation <= 0 {
		// A ticket key that never changes decrypts every session it
		// resumed once stolen: there is no "off".
		return invalid("tls.ticket_rotation", t.TicketRotation, "must be positive: the ticket key must change (default "+DefaultTicketRotation.String()+")")
	}
	if t.Admin && !t.Enabled() && len(t.AdminCertificates) == 0 {
		return invalid("tls.admin", t.Admin, "needs tls.certificates or tls.admin_certificates")
	}
	return nil
}

func checkCertFiles(field string, files []CertFiles) error {
	for i, f := range files {
		for _, p := range []struct{ name, path string }{{"cert_file", f.CertFile}, {"key_file", f.KeyFile}} {
			name := fmt.Sprintf("%s[%d].%s", field, i, p.name)
			if p.path == "" {
				return invalid(name, p.path, "must name a PEM file")
			}
			if _, err := os.Stat(p.path); err != nil {
				return invalid(name, p.path, "must be a readable file ("+err.Error()+")")
			}
		}
	}
	return nil
}

// HTTP2 is HTTP/2 from clients: h2 by ALPN on a TLS listener, h2c with
// prior knowledge on a plain one.
type HTTP2 struct {
	// Disabled turns HTTP/2 off (default false: on); clients then speak
	// HTTP/1.1 only.
	Disabled bool `yaml:"disabled"`
	// MaxConcurrentStreams caps a connection's open streams (default 250).
	MaxConcurrentStreams uint32 `yaml:"max_concurrent_streams"`
	// MaxFrameBytes is the largest frame a client may send (default 16384,
	// the protocol's least; at most 16 MiB).
	MaxFrameBytes uint32 `yaml:"max_frame_bytes"`
	// MaxResetsPerSecond is how many streams a client may cancel per
	// second, averaged over ten seconds, before its connection is slowed
	// and then closed (default 100): the rapid-reset attack
	// (CVE-2023-44487) opens and cancels streams in a loop.
	MaxResetsPerSecond int `yaml:"max_resets_per_second"`
	// MaxBodyBytesPerConnection bounds the request bodies one connection
	// holds at once, those still coming and those whose answer has not
	// ended (default 0: four times max_body_bytes); a stream past it is
	// refused with REFUSED_STREAM, which its client may send again.
	MaxBodyBytesPerConnection int64 `yaml:"max_body_bytes_per_connection"`
}

// Validate checks the bounds RFC 9113 sets.
func (h HTTP2) Validate() error {
	if h.MaxConcurrentStreams == 0 {
		return invalid("http2.max_concurrent_streams", h.MaxConcurrentStreams, fmt.Sprintf("must be positive: 0 lets a client open no stream; to turn HTTP/2 off, set disabled (default %d)", DefaultMaxConcurrentStreams))
	}
	if h.MaxFrameBytes < 16<<10 || h.MaxFrameBytes > 1<<24-1 {
		return invalid("http2.max_frame_bytes", h.MaxFrameBytes, fmt.Sprintf("must be 16384 to 16777215 (default %d)", DefaultMaxFrameBytes))
	}
	if h.MaxResetsPerSecond <= 0 {
		return invalid("http2.max_resets_per_second", h.MaxResetsPerSecond, fmt.Sprintf("must be positive: the rapid-reset guard has no off (default %d)", DefaultMaxResetsPerSecond))
	}
	if h.MaxBodyBytesPerConnection < 0 {
		return invalid("http2.max_body_bytes_per_connection", h.MaxBodyBytesPerConnection, "must be positive (0 means four times max_body_bytes)")
	}
	return nil
}

// UpstreamTLS is how the gateway speaks TLS to pods whose address starts
// with https://. Verification is on: a pod's certificate must chain to
// CAFile (default: the system's roots) and name the pod's host.
type UpstreamTLS struct {
	// CAFile is a PEM bundle of the CAs pods' certificates chain to
	// (default: the system's roots).
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the gateway's client certificate, for pods
	// that ask for one (mutual TLS); default none.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name checked in every pod's certificate and sent
	// as SNI (default: the host of the pod's address).
	ServerName string `yaml:"server_name"`
}

// Validate checks the files exist and come in pairs.
func (u UpstreamTLS) Validate() error {
	for _, p := range []struct{ name, path string }{{"upstream.tls.ca_file", u.CAFile}, {"upstream.tls.cert_file", u.CertFile}, {"upstream.tls.key_file", u.KeyFile}} {
		if p.path == "" {
			continue
		}
		if _, err := os.Stat(p.path); err != nil {
			return invalid(p.name, p.path, "must be a readable file ("+err.Error()+")")
		}
	}
	if (u.CertFile == "") != (u.KeyFile == "") {
		return invalid("upstream.tls.key_file", u.KeyFile, "comes with cert_file, both or neither")
	}
	return nil
}

// HTTPSPrefix marks a pod address the gateway dials with TLS.
const HTTPSPrefix = "https://"

// provisionScheme moves an address's https:// into TLS, so Address stays
// host:port everywhere it is used (Host header, dials, names).
func (p *Pod) provisionScheme() {
	if a, ok := strings.CutPrefix(p.Address, HTTPSPrefix); ok {
		p.Address, p.TLS = a, true
	}
	p.Address = strings.TrimPrefix(p.Address, "http://")
}

// Endpoint is the engine behind the pod's address: host:port without the
// scheme, a name in lower case as DNS compares names, an IP and the port
// as Go dials them (IPv6's shortest form, an IPv4-mapped address as IPv4,
// no leading zeros). Two pods with one are one engine, whatever their
// names. A name is not resolved: it may be a balanced service, and
// localhost may be ::1 as well as 127.0.0.1.
func (p Pod) Endpoint() string {
	p.provisionScheme()
	host, port, err := net.SplitHostPort(p.Address)
	if err != nil {
		return strings.ToLower(p.Address)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		host = ip.Unmap().String()
	} else {
		host = strings.ToLower(host)
	}
	if n, err := strconv.Atoi(port); err == nil {
		port = strconv.Itoa(n)
	}
	return net.JoinHostPort(host, port)
}
