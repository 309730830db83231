package e2e

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
	"testing"
	"time"
)

// makeTestCA writes a throwaway CA (dir/ca.pem) and a server certificate for
// names signed by it (dir/server.pem, dir/server.key), valid for an hour, and
// returns the CA's path. Names may be wildcards (*.wild.test) or IP
// addresses. The files are 0644 and dir 0755, so that a container running
// as another uid can read them where dir is mounted (the probe's "serve"
// looks in /certs).
func makeTestCA(t *testing.T, dir string, names ...string) (caFile string) {
	t.Helper()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "propio-sandbox e2e test CA"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "propio-sandbox e2e test server"},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}

	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		name, typ string
		der       []byte
	}{
		{"ca.pem", "CERTIFICATE", caDER},
		{"server.pem", "CERTIFICATE", der},
		{"server.key", "PRIVATE KEY", keyDER},
	} {
		path := filepath.Join(dir, f.name)
		data := pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der})
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, 0o644); err != nil { // whatever the umask
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "ca.pem")
}

// TestMakeTestCA needs neither an engine nor a network: the server
// certificate must chain to the CA for every name it was made for, and for
// no other.
func TestMakeTestCA(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "certs")
	caFile := makeTestCA(t, dir, "allowed.test", "*.wild.test", "10.0.0.2")

	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("no certificate in ca.pem")
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server.key"))
	if err != nil {
		t.Fatalf("server.pem and server.key do not make a key pair: %v", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}

	tests := map[string]bool{
		"allowed.test":      true,
		"a.wild.test":       true,
		"10.0.0.2":          true,
		"denied.test":       false,
		"wild.test":         false,
		"a.b.wild.test":     false,
		"allowed.test.evil": false,
	}
	for name, ok := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots})
			if ok && err != nil {
				t.Errorf("want the certificate valid for %s: %v", name, err)
			}
			if !ok && err == nil {
				t.Errorf("want the certificate invalid for %s", name)
			}
		})
	}

	for _, f := range []string{"ca.pem", "server.pem", "server.key"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o644 {
			t.Errorf("%s: mode %v, want 0644 (a container user must read it)", f, fi.Mode().Perm())
		}
	}
	if want := filepath.Join(dir, "ca.pem"); caFile != want {
		t.Errorf("makeTestCA returned %s, want %s", caFile, want)
	}
}
