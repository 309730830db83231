package broker

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// Issuer is a run's CA, in the memory of the gateway that made it, and
// signs the certificates the gateway shows the sandbox for the hosts whose
// TLS it terminates: one per host, made on first use and kept, all with one
// key of the issuer's. Nothing gives its CA's key out.
type Issuer struct {
	ca     *x509.Certificate
	caKey  crypto.Signer
	key    *ecdsa.PrivateKey
	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// NewIssuer makes a run's CA for hosts (names, *.names, addresses: what
// the gateway terminates TLS for, which the CA is constrained to) and is its
// issuer.
func NewIssuer(hosts []string, now time.Time) (*Issuer, error) {
	ca, caKey, err := newCA(hosts, now)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("making the gateway's certificate key: %w", err)
	}
	return &Issuer{ca: ca, caKey: caKey, key: key, leaves: map[string]*tls.Certificate{}}, nil
}

// CA is the run's CA certificate.
func (i *Issuer) CA() *x509.Certificate { return i.ca }

// CAPEM is the run's CA certificate, PEM-encoded: what the sandbox trusts.
func (i *Issuer) CAPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: i.ca.Raw})
}

// maxLeaves bounds the certificates kept: a sandbox that names many hosts
// makes the issuer sign again, not grow.
const maxLeaves = 4096

// Certificate is the certificate, with the CA's, for host: a name or an
// address (an IPv6 one with or without brackets).
func (i *Issuer) Certificate(host string) (*tls.Certificate, error) {
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	i.mu.Lock()
	defer i.mu.Unlock()
	if c, ok := i.leaves[host]; ok {
		return c, nil
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: host},
		NotBefore:    i.ca.NotBefore,
		NotAfter:     i.ca.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if a, err := netip.ParseAddr(host); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, a.AsSlice())
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, i.ca, &i.key.PublicKey, i.caKey)
	if err != nil {
		return nil, fmt.Errorf("signing a certificate for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("signing a certificate for %s: %w", host, err)
	}
	c := &tls.Certificate{Certificate: [][]byte{der, i.ca.Raw}, PrivateKey: i.key, Leaf: leaf}
	if len(i.leaves) >= maxLeaves {
		clear(i.leaves)
	}
	i.leaves[host] = c
	return c, nil
}
