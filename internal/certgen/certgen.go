// Package certgen makes throwaway certificates, for tests and pdlb demo
// --tls: a CA and leaf certificates it signs, written as PEM files into a
// directory.
package certgen

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA signs leaf certificates.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// File is the CA certificate's PEM file; Pool holds it.
	File string
	Pool *x509.CertPool
	dir  string
	n    int64
}

// NewCA makes a CA whose files live in dir.
func NewCA(dir string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pdlb test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &CA{cert: cert, key: key, Pool: x509.NewCertPool(), dir: dir, n: 1}
	ca.Pool.AddCert(cert)
	ca.File = filepath.Join(dir, "ca.pem")
	return ca, os.WriteFile(ca.File, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
}

// Leaf is a certificate the CA signed: its chain (leaf, CA) and key files.
type Leaf struct {
	CertFile, KeyFile string
	Cert              tls.Certificate
}

// Issue signs a certificate for names (DNS names or IP addresses) valid
// from notBefore to notAfter; zero times mean from an hour ago for a day.
func (ca *CA) Issue(names []string, notBefore, notAfter time.Time) (Leaf, error) {
	if notBefore.IsZero() {
		notBefore, notAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Leaf{}, err
	}
	ca.n++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(ca.n), Subject: pkix.Name{CommonName: names[0]},
		NotBefore: notBefore, NotAfter: notAfter, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return Leaf{}, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Leaf{}, err
	}
	chain := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})...)
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
	l := Leaf{CertFile: filepath.Join(ca.dir, names[0]+"-"+big.NewInt(ca.n).String()+".pem")}
	l.KeyFile = l.CertFile + ".key"
	if err := os.WriteFile(l.CertFile, chain, 0o600); err != nil {
		return Leaf{}, err
	}
	if err := os.WriteFile(l.KeyFile, keyPEM, 0o600); err != nil {
		return Leaf{}, err
	}
	l.Cert, err = tls.X509KeyPair(chain, keyPEM)
	return l, err
}
