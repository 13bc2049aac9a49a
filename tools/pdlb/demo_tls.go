package main

import (
	"net"
	"strings"
	"time"

	"pdlb/internal/certgen"
	"pdlb/lb/config"
)

// demoCertificate makes a CA in dir and a certificate it signs for
// localhost and the loopback addresses, valid a week, and has cfg serve
// it; it returns the CA's file, for clients to trust.
func demoCertificate(dir string, cfg *config.Config) (string, error) {
	ca, err := certgen.NewCA(dir)
	if err != nil {
		return "", err
	}
	leaf, err := ca.Issue([]string{"localhost", "127.0.0.1", "::1"}, time.Now().Add(-time.Hour), time.Now().Add(7*24*time.Hour))
	if err != nil {
		return "", err
	}
	cfg.TLS.Certificates = []config.CertFiles{{CertFile: leaf.CertFile, KeyFile: leaf.KeyFile}}
	return ca.File, nil
}

// demoTLSBase is what curl takes to reach the TLS gateway at host:port:
// the CA to trust and the https URL, by the name the certificate holds.
func demoTLSBase(ca, hostport string) string {
	_, port, _ := net.SplitHostPort(hostport)
	host := "localhost:" + port
	if strings.ContainsAny(ca, " '") {
		ca = "'" + strings.ReplaceAll(ca, "'", `'\''`) + "'"
	}
	return "--cacert " + ca + " https://" + host
}
